//! What a function calls and uses: call names with what they are called on (the receiver's
//! type when a local declares it), and the names it mentions.

use std::collections::HashSet;

use tree_sitter::Node;

use super::index::{named_children, Index};

/// A call in a function's body.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Call {
    /// The name called.
    pub name: String,
    /// What it is called on.
    pub receiver: Receiver,
}

/// What a call is made on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Receiver {
    /// Nothing: `f(x)`, `new Cart()`.
    None,
    /// `self` / `this` / `Self`.
    Own,
    /// Another value whose type is not known: `items.size()`.
    Other,
    /// A type: a path (`Inventory::new()`) or a local declared with or built as one
    /// (`Library lib = new Library(); lib.find(..)`).
    Type(String),
}

impl<'t> Index<'t> {
    /// Names `unit` uses: identifiers, and type names in languages that have them.
    pub fn names_used(&self, unit: usize) -> HashSet<&'t str> {
        let mut out = HashSet::new();
        let mut stack = vec![self.units[unit].node];
        while let Some(n) = stack.pop() {
            if matches!(n.kind(), "identifier" | "type_identifier") {
                out.insert(self.text(n));
            }
            let mut c = n.walk();
            stack.extend(n.named_children(&mut c));
        }
        out
    }

    /// The names `unit` calls (or passes as a callback), each once, in source order.
    pub fn calls(&self, unit: usize) -> Vec<Call> {
        let k = self.lang.kinds();
        let mut out: Vec<Call> = Vec::new();
        let mut stack = vec![self.units[unit].node];
        while let Some(n) = stack.pop() {
            if k.calls.contains(&n.kind()) {
                out.extend(self.call_at(unit, n));
                if let Some(args) = n.child_by_field_name("arguments") {
                    for a in named_children(args) {
                        if a.kind() == "identifier" {
                            out.push(Call {
                                name: self.text(a).to_owned(),
                                receiver: Receiver::None,
                            });
                        }
                    }
                }
            }
            if n.kind() == "token_tree" {
                out.extend(self.macro_calls(n));
            }
            let mut kids = named_children(n);
            kids.reverse();
            stack.extend(kids);
        }
        let mut seen = HashSet::new();
        out.retain(|c| seen.insert(c.clone()));
        out
    }

    /// The call made by call node `n` in `unit`.
    fn call_at(&self, unit: usize, n: Node<'t>) -> Option<Call> {
        let target = ["function", "name", "constructor", "type"]
            .iter()
            .find_map(|f| n.child_by_field_name(f))?;
        let method = n.kind() == "method_invocation";
        let object = n
            .child_by_field_name("object")
            .filter(|_| method)
            .or_else(|| receiver_node(target));
        let call = self.called_name(target, 0)?;
        Some(match object {
            Some(o) if method || call.receiver == Receiver::Other => {
                let receiver = match self.receiver(o) {
                    Receiver::Other if o.kind() == "identifier" => self
                        .type_of_local(self.units[unit].node, self.text(o))
                        .map_or(Receiver::Other, Receiver::Type),
                    r => r,
                };
                Call { receiver, ..call }
            }
            _ => call,
        })
    }

    /// Calls inside a Rust macro's tokens (`println!("{}", total(&xs))`): a name followed by
    /// a parenthesized group; after a `.`, a method call.
    fn macro_calls(&self, tree: Node<'t>) -> Vec<Call> {
        let mut cursor = tree.walk();
        let kids: Vec<Node<'t>> = tree.children(&mut cursor).collect();
        let mut out = Vec::new();
        for (i, k) in kids.iter().enumerate() {
            let called = kids.get(i + 1).is_some_and(|next| {
                next.kind() == "token_tree" && self.text(*next).starts_with('(')
            });
            if k.kind() == "identifier" && called {
                let after_dot = i > 0 && self.text(kids[i - 1]) == ".";
                let own = i > 1 && after_dot && self.text(kids[i - 2]) == "self";
                out.push(Call {
                    name: self.text(*k).to_owned(),
                    receiver: match (after_dot, own) {
                        (_, true) => Receiver::Own,
                        (true, false) => Receiver::Other,
                        _ => Receiver::None,
                    },
                });
            }
        }
        out
    }

    fn receiver(&self, r: Node<'t>) -> Receiver {
        match self.text(r) {
            "self" | "this" | "Self" => Receiver::Own,
            _ => Receiver::Other,
        }
    }

    fn called_name(&self, t: Node<'t>, depth: u8) -> Option<Call> {
        if depth > 6 {
            return None;
        }
        let kind = t.kind();
        if kind.ends_with("identifier")
            && !kind.starts_with("scoped")
            && kind != "qualified_identifier"
        {
            return Some(Call {
                name: self.text(t).to_owned(),
                receiver: Receiver::None,
            });
        }
        // Member calls (`obj.m()`, `self.m()`), then paths (`Type::f`, `ns::f`).
        for (field, receiver) in [
            ("attribute", "object"),
            ("property", "object"),
            ("field", "value"),
            ("field", "argument"),
            ("field", "operand"),
        ] {
            if let (Some(f), Some(r)) = (
                t.child_by_field_name(field),
                t.child_by_field_name(receiver),
            ) {
                let inner = self.called_name(f, depth + 1)?;
                return Some(Call {
                    receiver: self.receiver(r),
                    ..inner
                });
            }
        }
        for (field, path) in [("name", "path"), ("name", "scope")] {
            if let Some(f) = t.child_by_field_name(field) {
                let inner = self.called_name(f, depth + 1)?;
                let receiver = match t.child_by_field_name(path).map(|p| self.text(p)) {
                    Some("Self" | "self") => Receiver::Own,
                    Some(p) => Receiver::Type(p.rsplit("::").next().unwrap_or(p).to_owned()),
                    None => Receiver::None,
                };
                return Some(Call { receiver, ..inner });
            }
        }
        let kids = named_children(t);
        let next = kids
            .iter()
            .find(|c| c.kind().ends_with("identifier"))
            .or(kids.last())?;
        self.called_name(*next, depth + 1)
    }

    /// The type a local or parameter `name` of `unit` is declared with or built as:
    /// `Library lib = ...`, `lib: Library`, `lib = Library()`, `lib := NewLibrary()`,
    /// `let lib = Library::new()`.
    fn type_of_local(&self, unit: Node<'t>, name: &str) -> Option<String> {
        const DECLS: &[&str] = &[
            "local_variable_declaration",
            "formal_parameter",
            "parameter_declaration",
            "declaration",
            "let_declaration",
            "parameter",
            "required_parameter",
            "optional_parameter",
            "variable_declarator",
            "short_var_declaration",
            "assignment",
            "var_spec",
            "typed_parameter",
        ];
        let mut stack = vec![unit];
        while let Some(n) = stack.pop() {
            if DECLS.contains(&n.kind()) && self.declares(n, name) {
                if let Some(t) = self.declared_type(n) {
                    return Some(t);
                }
            }
            let mut c = n.walk();
            stack.extend(n.named_children(&mut c));
        }
        None
    }

    fn declares(&self, n: Node<'t>, name: &str) -> bool {
        ["name", "declarator", "pattern", "left"].iter().any(|f| {
            n.child_by_field_name(f).is_some_and(|d| {
                let d = d
                    .child_by_field_name("name")
                    .or_else(|| d.child_by_field_name("declarator"))
                    .unwrap_or(d);
                let text = self.text(d).trim_start_matches(['&', '*', ' ']);
                text.strip_prefix("mut ").unwrap_or(text) == name
            })
        })
    }

    /// The declared type's name, or the type a value is built from (`new Library()`,
    /// `Library()`, `&Library{}`, `NewLibrary()`, `Library::new()`).
    fn declared_type(&self, n: Node<'t>) -> Option<String> {
        if let Some(t) = n.child_by_field_name("type") {
            return self.first_type_name(t);
        }
        let value = ["value", "right"]
            .iter()
            .find_map(|f| n.child_by_field_name(f))
            .or_else(|| {
                n.child_by_field_name("declarator")
                    .and_then(|d| d.child_by_field_name("value"))
            })?;
        let mut v = match value.kind() {
            "expression_list" => named_children(value).into_iter().next()?,
            _ => value,
        };
        if v.kind() == "unary_expression" {
            v = v.child_by_field_name("operand").unwrap_or(v);
        }
        let built = ["constructor", "type", "function"]
            .iter()
            .find_map(|f| v.child_by_field_name(f))?;
        let name = match built.child_by_field_name("path") {
            Some(path) => self.text(path),
            None => self.text(built),
        };
        let name = name.rsplit(['.', ':']).next().unwrap_or(name);
        let name = name
            .strip_prefix("New")
            .filter(|n| !n.is_empty())
            .unwrap_or(name);
        name.starts_with(char::is_uppercase)
            .then(|| name.to_owned())
    }

    fn first_type_name(&self, t: Node<'t>) -> Option<String> {
        let mut stack = vec![t];
        while let Some(n) = stack.pop() {
            if n.kind() == "type_identifier" || (n.kind() == "identifier" && n.id() == t.id()) {
                return Some(self.text(n).to_owned());
            }
            let mut kids = named_children(n);
            kids.reverse();
            stack.extend(kids);
        }
        None
    }
}

/// What a member call is made on: `cart` in `cart.total()`.
fn receiver_node(callee: Node<'_>) -> Option<Node<'_>> {
    ["object", "value", "argument", "operand"]
        .iter()
        .find_map(|f| callee.child_by_field_name(f))
}
