//! Which definitions a call reaches, without types: by name, narrowed by what it is called on
//! (`self`, a type path, a local of a known type), and a class's constructor.

use super::calls::{Call, Receiver};
use super::index::UnitKind;
use super::selector::Selector;

/// Method names of the standard libraries: a call of one on a value of unknown type is not
/// taken for the student's method of that name.
const COMMON_METHODS: &[&str] = &[
    "add",
    "append",
    "apply",
    "at",
    "back",
    "begin",
    "call",
    "catch",
    "clear",
    "close",
    "contains",
    "count",
    "empty",
    "end",
    "entry",
    "equals",
    "extend",
    "filter",
    "find",
    "forEach",
    "format",
    "front",
    "get",
    "has",
    "hashCode",
    "insert",
    "items",
    "iter",
    "join",
    "keys",
    "len",
    "length",
    "lower",
    "map",
    "next",
    "pop",
    "pop_back",
    "push",
    "push_back",
    "put",
    "read",
    "reduce",
    "remove",
    "replace",
    "reserve",
    "set",
    "size",
    "sort",
    "split",
    "strip",
    "then",
    "toString",
    "trim",
    "unwrap",
    "update",
    "upper",
    "values",
    "write",
];

/// Most definitions one called name brings in (overloads, same-named methods).
const PER_NAME: usize = 4;

impl Selector<'_, '_> {
    /// The definitions a call may reach (across files): for a plain call every function of
    /// that name (overloads); on `self` / `this`, those of the caller's own class when there
    /// are any; on a type path, that type's; on another value (its type unknown), only a name
    /// defined once. A class name stands for its constructor.
    pub(super) fn resolve(&self, fi: usize, from: usize, call: &Call) -> Vec<(usize, usize)> {
        let name = call.name.as_str();
        let mut found: Vec<(usize, usize)> = Vec::new();
        for (fj, f) in self.files.iter().enumerate() {
            let ctor = f.index.lang.kinds().constructor;
            for (i, u) in f.index.units.iter().enumerate() {
                if u.kind != UnitKind::Function || (fj, i) == (fi, from) {
                    continue;
                }
                let direct = u.simple == name;
                let constructor = ctor.is_some_and(|c| u.simple == c)
                    && u.parent.is_some_and(|p| f.index.units[p].name == name);
                if direct || constructor {
                    found.push((fj, i));
                }
            }
        }
        let of_class = |class: Option<&str>| -> Vec<(usize, usize)> {
            found
                .iter()
                .copied()
                .filter(|&(fj, i)| class.is_some() && self.class_of(fj, i).as_deref() == class)
                .collect()
        };
        // One definition, or overloads of one class: what a call on an unknown value reaches,
        // unless the name is one every standard library has (`items.size()` is a vector's).
        let unique = || -> Vec<(usize, usize)> {
            if COMMON_METHODS.contains(&name) {
                return Vec::new();
            }
            let first = found.first().map(|&(fj, i)| (fj, self.class_of(fj, i)));
            let same = found
                .iter()
                .all(|&(fj, i)| Some((fj, self.class_of(fj, i))) == first);
            if same {
                found.clone()
            } else {
                Vec::new()
            }
        };
        let mut out = match &call.receiver {
            Receiver::None => found.clone(),
            Receiver::Own => {
                let own = of_class(self.class_of(fi, from).as_deref());
                if own.is_empty() {
                    found.clone()
                } else {
                    own
                }
            }
            Receiver::Type(t) => {
                let own = of_class(Some(t));
                if own.is_empty() {
                    unique()
                } else {
                    own
                }
            }
            Receiver::Other => unique(),
        };
        out.truncate(PER_NAME);
        out
    }

    /// The class (container or owner type name) a unit belongs to.
    pub(super) fn class_of(&self, fi: usize, u: usize) -> Option<String> {
        let idx = &self.files[fi].index;
        let unit = &idx.units[u];
        if let Some(o) = &unit.owner {
            return Some(o.clone());
        }
        let mut p = unit.parent;
        while let Some(i) = p {
            if idx.units[i].kind == UnitKind::Container {
                return Some(idx.units[i].name.clone());
            }
            p = idx.units[i].parent;
        }
        None
    }

    /// The constructor of the class a method belongs to.
    pub(super) fn constructor_of(&self, fi: usize, u: usize) -> Vec<(usize, usize)> {
        let idx = &self.files[fi].index;
        let Some(class) = self.class_of(fi, u) else {
            return Vec::new();
        };
        let ctor = idx.lang.kinds().constructor;
        idx.units
            .iter()
            .enumerate()
            .filter(|&(i, c)| {
                i != u
                    && c.kind == UnitKind::Function
                    && self.class_of(fi, i).as_deref() == Some(class.as_str())
                    && (c.simple == class || ctor.is_some_and(|k| c.simple == k))
            })
            .map(|(i, _)| (fi, i))
            .take(PER_NAME)
            .collect()
    }
}
