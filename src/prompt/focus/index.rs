//! One parsed file's definitions: functions and methods (with their classes and enclosing
//! functions), type definitions, the import list, and what each function calls.

use tree_sitter::{Node, Point, Tree, TreeCursor};

use super::lang::{role, Kinds, Lang};

/// Tree levels below the root the index walks (multi-line nodes only: a one-line node holds
/// no unit worth a frame).
pub const MAX_TREE_DEPTH: usize = 512;

/// What a unit is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnitKind {
    /// A named function or method (arrow functions bound to a name included).
    Function,
    /// A class, impl block, namespace...: its header goes with the methods sent.
    Container,
    /// A type definition a method's receiver names (Go, Rust, C, TypeScript).
    Type,
}

/// A definition in the file.
#[derive(Debug, Clone)]
pub struct Unit<'t> {
    /// What it is.
    pub kind: UnitKind,
    /// The definition node.
    pub node: Node<'t>,
    /// Its name as written (`total`, `Stack::pop`).
    pub name: String,
    /// The last segment of the name (`pop`): what calls name.
    pub simple: String,
    /// Qualified by the enclosing classes and functions: `Cart.total`, `outer.inner`.
    pub qual: String,
    /// First row, decorators, attributes, `export` and `template<>` included (0-based).
    pub start: usize,
    /// Last row.
    pub end: usize,
    /// Last row of the header: the signature or class line, up to where the body opens.
    pub header_end: usize,
    /// The enclosing unit, if any.
    pub parent: Option<usize>,
    /// The type a method belongs to when not by nesting: a Go receiver, a Rust impl's type,
    /// a C++ `Type::method` scope.
    pub owner: Option<String>,
}

/// Every unit of a file, its imports and its source.
pub struct Index<'t> {
    /// The language.
    pub lang: Lang,
    /// The source text.
    pub src: &'t str,
    /// The tree.
    pub tree: &'t Tree,
    /// Units in source order (parents before children).
    pub units: Vec<Unit<'t>>,
    /// Row ranges of the top-level import / use / include / package lines.
    pub imports: Vec<(usize, usize)>,
    /// Top-level constants and variables: the names each statement defines, its rows.
    pub values: Vec<(Vec<String>, (usize, usize))>,
}

impl<'t> Index<'t> {
    /// Reads the units of `tree`.
    pub fn build(lang: Lang, src: &'t str, tree: &'t Tree) -> Self {
        let mut idx = Index {
            lang,
            src,
            tree,
            units: Vec::new(),
            imports: Vec::new(),
            values: Vec::new(),
        };
        let root = tree.root_node();
        idx.collect_imports(root);
        idx.collect_values(root);
        idx.visit(&mut root.walk(), None, None, 0);
        idx
    }

    fn kinds(&self) -> &'static Kinds {
        self.lang.kinds()
    }

    /// The text of `n`.
    pub fn text(&self, n: Node<'_>) -> &'t str {
        self.src.get(n.byte_range()).unwrap_or_default()
    }

    fn collect_imports(&mut self, root: Node<'t>) {
        let k = self.kinds();
        let mut stack: Vec<Node<'t>> = named_children(root);
        stack.reverse();
        while let Some(n) = stack.pop() {
            let kind = n.kind();
            let require = matches!(kind, "lexical_declaration" | "variable_declaration")
                && self.text(n).contains("require(")
                && n.end_position().row - n.start_position().row < 4;
            if k.imports.contains(&kind) || require {
                self.imports
                    .push((n.start_position().row, n.end_position().row));
            } else if kind.starts_with("preproc_if") || kind == "preproc_else" {
                let mut inner = named_children(n);
                inner.reverse();
                stack.extend(inner);
            }
        }
    }

    fn collect_values(&mut self, root: Node<'t>) {
        for n in named_children(root) {
            if self.bound_function(n).is_some()
                || self
                    .imports
                    .contains(&(n.start_position().row, n.end_position().row))
            {
                continue;
            }
            let names = self.defined_names(n);
            if !names.is_empty() {
                self.values
                    .push((names, (n.start_position().row, n.end_position().row)));
            }
        }
    }

    /// The names a top-level statement defines as a value: `X = 1` (Python), `const x = ..`
    /// (JS, TS), `const` / `var` (Go), `const` / `static` (Rust), a global (C, C++).
    fn defined_names(&self, n: Node<'t>) -> Vec<String> {
        let name_of = |d: Node<'t>| -> Option<String> {
            let mut cur = d;
            for _ in 0..6 {
                if cur.kind() == "identifier" {
                    return Some(self.text(cur).to_owned());
                }
                cur = cur
                    .child_by_field_name("name")
                    .or_else(|| cur.child_by_field_name("left"))
                    .or_else(|| cur.child_by_field_name("declarator"))?;
            }
            None
        };
        let kids = named_children(n);
        match n.kind() {
            "expression_statement" => kids
                .first()
                .filter(|a| a.kind() == "assignment")
                .and_then(|a| name_of(*a))
                .into_iter()
                .collect(),
            "lexical_declaration" | "variable_declaration" => kids
                .iter()
                .filter(|d| d.kind() == "variable_declarator")
                .filter_map(|d| name_of(*d))
                .collect(),
            "const_declaration" | "var_declaration" => kids
                .iter()
                .flat_map(|spec| {
                    let mut c = spec.walk();
                    spec.children_by_field_name("name", &mut c)
                        .map(|x| self.text(x).to_owned())
                        .collect::<Vec<_>>()
                })
                .collect(),
            "const_item" | "static_item" => name_of(n).into_iter().collect(),
            "declaration" => {
                let mut c = n.walk();
                n.children_by_field_name("declarator", &mut c)
                    .filter(|d| d.kind() == "init_declarator")
                    .filter_map(name_of)
                    .collect()
            }
            _ => Vec::new(),
        }
    }

    /// Walks the tree once with one cursor, recording units. `wrap_start` is the first row
    /// of the wrapper (`export`, decorators, `template<>`) whose children are being visited.
    /// Walks the children of the cursor's node, `depth` nodes below the root: past
    /// [`MAX_TREE_DEPTH`] nothing more is indexed (a hundred thousand lines of one nested
    /// expression would overflow the stack; no definition worth sending is that deep).
    fn visit(
        &mut self,
        cursor: &mut TreeCursor<'t>,
        parent: Option<usize>,
        wrap_start: Option<usize>,
        depth: usize,
    ) {
        if depth >= MAX_TREE_DEPTH || !cursor.goto_first_child() {
            return;
        }
        let roles = self.lang.roles();
        // The first row of the attributes / decorators just before the current child.
        let mut attr_start: Option<usize> = None;
        loop {
            let child = cursor.node();
            if child.is_named() {
                let r = roles
                    .get(usize::from(child.kind_id()))
                    .copied()
                    .unwrap_or(0);
                let row = child.start_position().row;
                if r & role::ATTRIBUTE != 0 {
                    attr_start.get_or_insert(row);
                } else if r & role::COMMENT != 0 {
                    // Transparent between attributes and what they annotate.
                } else {
                    let own = attr_start.take().map_or(row, |a| a.min(row));
                    let start = wrap_start.map_or(own, |w| w.min(own));
                    if r & role::WRAPPER != 0 {
                        self.visit(cursor, parent, Some(start), depth + 1);
                    } else {
                        let here = if r & role::UNIT != 0 {
                            self.unit_for(child, parent, start).unwrap_or(parent)
                        } else {
                            parent
                        };
                        // Nothing worth a unit hides inside one line that is not one itself
                        // (checked above): most of the tree is never walked.
                        if child.end_position().row > row {
                            self.visit(cursor, here, None, depth + 1);
                        }
                    }
                }
            }
            if !cursor.goto_next_sibling() {
                break;
            }
        }
        cursor.goto_parent();
    }

    /// Records `n` (whose rows start at `start`) as a unit when it is one; the index to recurse
    /// under.
    fn unit_for(
        &mut self,
        n: Node<'t>,
        parent: Option<usize>,
        start: usize,
    ) -> Option<Option<usize>> {
        let k = self.kinds();
        let kind = n.kind();
        let (unit_kind, name, span) = if k.functions.contains(&kind) {
            (UnitKind::Function, self.function_name(n)?, n)
        } else if k.containers.contains(&kind) && n.child_by_field_name("body").is_some() {
            (UnitKind::Container, self.container_name(n), n)
        } else if k.types.contains(&kind)
            && parent.is_none_or(|p| self.units[p].kind == UnitKind::Container)
            && (!kind.ends_with("_specifier") || n.child_by_field_name("body").is_some())
        {
            let name = self.type_name(n)?;
            self.push(UnitKind::Type, n, n, name, parent, start);
            return Some(parent);
        } else if let Some((name, span)) = self.bound_function(n) {
            (UnitKind::Function, name, span)
        } else {
            return None;
        };
        Some(Some(self.push(unit_kind, n, span, name, parent, start)))
    }

    fn push(
        &mut self,
        kind: UnitKind,
        n: Node<'t>,
        span: Node<'t>,
        name: String,
        parent: Option<usize>,
        start: usize,
    ) -> usize {
        let owner = self.owner_of(n, &name, parent);
        let simple = name.rsplit("::").next().unwrap_or(&name).to_owned();
        let qual = match parent {
            Some(p) if !name.contains("::") && !self.units[p].qual.is_empty() => {
                format!("{}.{}", self.units[p].qual, name)
            }
            _ => match (&owner, self.lang) {
                (Some(o), Lang::Go | Lang::Rust) if kind == UnitKind::Function => {
                    format!("{o}.{name}")
                }
                _ => name.clone(),
            },
        };
        self.units.push(Unit {
            kind,
            node: n,
            header_end: self.header_end(n, start),
            name,
            simple,
            qual,
            start,
            end: span.end_position().row,
            parent,
            owner,
        });
        self.units.len() - 1
    }

    /// The row where the body of `n` opens (a `{` line), or the row before a Python block.
    fn header_end(&self, n: Node<'t>, start: usize) -> usize {
        let body = n
            .child_by_field_name("body")
            .or_else(|| {
                n.child_by_field_name("value")
                    .and_then(|v| v.child_by_field_name("body"))
            })
            .or_else(|| self.value_of(n).and_then(|v| v.child_by_field_name("body")));
        match body {
            None => n.start_position().row.max(start),
            Some(b) => {
                let row = b.start_position().row;
                if self.text(b).starts_with('{') || row <= n.start_position().row {
                    row.max(start)
                } else {
                    // A Python block: the header ends with its `:` (the first statement may
                    // be further down, past comments or members the parse left out).
                    let colon = b.prev_sibling().map_or(row - 1, |c| c.end_position().row);
                    colon.min(row - 1).max(n.start_position().row).max(start)
                }
            }
        }
    }

    /// The function value of a declaration statement that binds one (`const f = () => {}`).
    fn value_of(&self, n: Node<'t>) -> Option<Node<'t>> {
        let decl = named_children(n)
            .into_iter()
            .find(|c| c.kind() == "variable_declarator")?;
        decl.child_by_field_name("value")
    }

    fn function_name(&self, n: Node<'t>) -> Option<String> {
        if let Some(name) = n.child_by_field_name("name") {
            return Some(self.text(name).to_owned());
        }
        // C and C++: the declarator chain down to the function declarator's name.
        let mut d = n.child_by_field_name("declarator")?;
        for _ in 0..8 {
            if d.kind() == "function_declarator" {
                let inner = d.child_by_field_name("declarator")?;
                return Some(self.text(inner).to_owned());
            }
            // `pointer_declarator` names its inner declarator; `reference_declarator` does not.
            d = d
                .child_by_field_name("declarator")
                .or_else(|| named_children(d).into_iter().last())?;
        }
        None
    }

    fn container_name(&self, n: Node<'t>) -> String {
        let name = n
            .child_by_field_name("name")
            .or_else(|| n.child_by_field_name("type"))
            .map(|c| self.text(c))
            .unwrap_or_default();
        name.split('<').next().unwrap_or(name).trim().to_owned()
    }

    fn type_name(&self, n: Node<'t>) -> Option<String> {
        if let Some(name) = n.child_by_field_name("name") {
            return Some(self.text(name).to_owned());
        }
        // Go `type X struct {...}` (the name is in its type_spec); C `typedef struct {..} X;`.
        let spec = named_children(n)
            .into_iter()
            .find(|c| matches!(c.kind(), "type_spec" | "type_alias"))
            .and_then(|s| s.child_by_field_name("name"))
            .or_else(|| n.child_by_field_name("declarator"))?;
        Some(self.text(spec).to_owned())
    }

    /// JS/TS functions bound to a name: `const f = () => {}`, `f: function () {}`,
    /// `Cart.prototype.total = function () {}`; the node whose rows they span.
    fn bound_function(&self, n: Node<'t>) -> Option<(String, Node<'t>)> {
        if !matches!(self.lang, Lang::JavaScript | Lang::TypeScript | Lang::Tsx) {
            return None;
        }
        let is_fn = |v: Node<'_>| {
            matches!(
                v.kind(),
                "arrow_function" | "function_expression" | "function" | "generator_function"
            )
        };
        match n.kind() {
            "lexical_declaration" | "variable_declaration" => {
                let decls: Vec<Node<'t>> = named_children(n)
                    .into_iter()
                    .filter(|c| c.kind() == "variable_declarator")
                    .collect();
                let [d] = decls.as_slice() else { return None };
                d.child_by_field_name("value").filter(|v| is_fn(*v))?;
                Some((self.text(d.child_by_field_name("name")?).to_owned(), n))
            }
            "pair" => {
                n.child_by_field_name("value").filter(|v| is_fn(*v))?;
                Some((self.text(n.child_by_field_name("key")?).to_owned(), n))
            }
            "expression_statement" => {
                let a = named_children(n).into_iter().next()?;
                if a.kind() != "assignment_expression" {
                    return None;
                }
                a.child_by_field_name("right").filter(|v| is_fn(*v))?;
                let left = a.child_by_field_name("left")?;
                let name = left
                    .child_by_field_name("property")
                    .map_or_else(|| self.text(left), |p| self.text(p));
                Some((name.to_owned(), n))
            }
            _ => None,
        }
    }

    fn owner_of(&self, n: Node<'t>, name: &str, parent: Option<usize>) -> Option<String> {
        if let Some((scope, _)) = name.rsplit_once("::") {
            return Some(scope.rsplit("::").next().unwrap_or(scope).to_owned());
        }
        if let Some(recv) = n.child_by_field_name("receiver") {
            let mut stack = vec![recv];
            while let Some(x) = stack.pop() {
                if x.kind() == "type_identifier" {
                    return Some(self.text(x).to_owned());
                }
                let mut kids = named_children(x);
                kids.reverse();
                stack.extend(kids);
            }
        }
        let p = &self.units[parent?];
        (p.node.kind() == "impl_item").then(|| p.name.clone())
    }

    /// The innermost function unit whose rows hold `row`.
    pub fn function_at(&self, row: usize) -> Option<usize> {
        self.units
            .iter()
            .enumerate()
            .filter(|(_, u)| u.kind == UnitKind::Function && u.start <= row && row <= u.end)
            .min_by_key(|(_, u)| u.end - u.start)
            .map(|(i, _)| i)
    }

    /// The statement holding `row` that sits at the top level or directly in a class body,
    /// and the unit it is in: for frames outside any function (`<module>`, a field
    /// initializer).
    pub fn statement_at(&self, row: usize) -> Option<((usize, usize), Option<usize>)> {
        let root = self.tree.root_node();
        let line = self.src.lines().nth(row)?;
        let col = line.len() - line.trim_start().len();
        let point = Point { row, column: col };
        let mut n = root.descendant_for_point_range(point, point)?;
        loop {
            let parent = n.parent()?;
            let grand = parent.parent();
            let in_container = self
                .container_of(parent)
                .or_else(|| grand.and_then(|g| self.container_of(g)));
            if parent.id() == root.id() || in_container.is_some() {
                let container = if parent.id() == root.id() {
                    None
                } else {
                    in_container
                };
                if n.id() == root.id() {
                    return None;
                }
                return Some(((n.start_position().row, n.end_position().row), container));
            }
            n = parent;
        }
    }

    fn container_of(&self, n: Node<'t>) -> Option<usize> {
        self.units
            .iter()
            .position(|u| u.kind == UnitKind::Container && u.node.id() == n.id())
    }
}

/// The named children of `n`, in order.
pub fn named_children(n: Node<'_>) -> Vec<Node<'_>> {
    let mut cursor = n.walk();
    n.named_children(&mut cursor).collect()
}
