//! The languages focusing knows: their names, file extensions, tree-sitter grammars, and the
//! node kinds that make up functions, classes, imports and calls in each grammar.

use std::sync::OnceLock;

/// A language whose code can be focused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lang {
    /// Python 3.
    Python,
    /// JavaScript (JSX included).
    JavaScript,
    /// TypeScript (`.ts`).
    TypeScript,
    /// TypeScript with JSX (`.tsx`).
    Tsx,
    /// Java.
    Java,
    /// Rust.
    Rust,
    /// Go.
    Go,
    /// C.
    C,
    /// C++.
    Cpp,
}

/// The names `language` accepts (case-insensitive), for error messages.
pub const LANGUAGE_NAMES: &str =
    "python, javascript, typescript, tsx, java, rust, go, c, cpp (aliases: py, js, node, ts, rs, \
     golang, c++, cxx)";

impl Lang {
    /// The language a request's `language` names; `None` when it names none of
    /// [`LANGUAGE_NAMES`].
    pub fn from_name(name: &str) -> Option<Lang> {
        Some(match name.trim().to_ascii_lowercase().as_str() {
            "python" | "py" | "python3" => Lang::Python,
            "javascript" | "js" | "node" | "nodejs" | "jsx" => Lang::JavaScript,
            "typescript" | "ts" => Lang::TypeScript,
            "tsx" => Lang::Tsx,
            "java" => Lang::Java,
            "rust" | "rs" => Lang::Rust,
            "go" | "golang" => Lang::Go,
            "c" => Lang::C,
            "cpp" | "c++" | "cxx" | "cc" => Lang::Cpp,
            _ => return None,
        })
    }

    /// The language of a file by its extension.
    pub fn from_path(path: &str) -> Option<Lang> {
        let ext = path.rsplit_once('.')?.1.to_ascii_lowercase();
        Some(match ext.as_str() {
            "py" | "pyw" => Lang::Python,
            "js" | "mjs" | "cjs" | "jsx" => Lang::JavaScript,
            "ts" | "mts" | "cts" => Lang::TypeScript,
            "tsx" => Lang::Tsx,
            "java" => Lang::Java,
            "rs" => Lang::Rust,
            "go" => Lang::Go,
            "c" | "h" => Lang::C,
            "cpp" | "cc" | "cxx" | "c++" | "hpp" | "hh" | "hxx" | "h++" | "ipp" => Lang::Cpp,
            _ => return None,
        })
    }

    /// `code` with its lines ended as this language's runtime counts them, each by a `\n`
    /// (parsing and selection count `\n` only, and a trace's line numbers are the runtime's):
    /// JavaScript and TypeScript (V8) end lines at a lone `\r`, U+2028 and U+2029 too;
    /// Python and Java at a lone `\r`; Rust, Go, C and C++ at `\n` only. Borrowed when
    /// nothing changes.
    pub fn with_its_line_ends(self, code: &str) -> std::borrow::Cow<'_, str> {
        let (lone_cr, separators) = match self {
            Lang::JavaScript | Lang::TypeScript | Lang::Tsx => (true, true),
            Lang::Python | Lang::Java => (true, false),
            Lang::Rust | Lang::Go | Lang::C | Lang::Cpp => (false, false),
        };
        let bytes = code.as_bytes();
        let lone = |i: usize| bytes[i] == b'\r' && bytes.get(i + 1) != Some(&b'\n');
        let needed = (lone_cr && (0..bytes.len()).any(lone))
            || (separators && code.contains(['\u{2028}', '\u{2029}']));
        if !needed {
            return std::borrow::Cow::Borrowed(code);
        }
        let mut out = String::with_capacity(code.len());
        let mut chars = code.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\r' if lone_cr && chars.peek() != Some(&'\n') => out.push('\n'),
                '\u{2028}' | '\u{2029}' if separators => out.push('\n'),
                c => out.push(c),
            }
        }
        std::borrow::Cow::Owned(out)
    }

    /// The name used in reports and code fences.
    pub fn as_str(self) -> &'static str {
        match self {
            Lang::Python => "python",
            Lang::JavaScript => "javascript",
            Lang::TypeScript => "typescript",
            Lang::Tsx => "tsx",
            Lang::Java => "java",
            Lang::Rust => "rust",
            Lang::Go => "go",
            Lang::C => "c",
            Lang::Cpp => "cpp",
        }
    }

    /// Whether a frame's file (by extension) may be a file in this language. Compiled
    /// JavaScript frames can point at TypeScript sources and the other way round; C and C++
    /// share headers.
    pub fn accepts_file(self, file: &str) -> bool {
        match Lang::from_path(file) {
            None => false,
            Some(other) => self.family() == other.family(),
        }
    }

    fn family(self) -> u8 {
        match self {
            Lang::Python => 0,
            Lang::JavaScript | Lang::TypeScript | Lang::Tsx => 1,
            Lang::Java => 2,
            Lang::Rust => 3,
            Lang::Go => 4,
            Lang::C | Lang::Cpp => 5,
        }
    }

    /// The tree-sitter grammar.
    pub fn grammar(self) -> tree_sitter::Language {
        match self {
            Lang::Python => tree_sitter_python::LANGUAGE.into(),
            Lang::JavaScript => tree_sitter_javascript::LANGUAGE.into(),
            Lang::TypeScript => tree_sitter_typescript::LANGUAGE_TYPESCRIPT.into(),
            Lang::Tsx => tree_sitter_typescript::LANGUAGE_TSX.into(),
            Lang::Java => tree_sitter_java::LANGUAGE.into(),
            Lang::Rust => tree_sitter_rust::LANGUAGE.into(),
            Lang::Go => tree_sitter_go::LANGUAGE.into(),
            Lang::C => tree_sitter_c::LANGUAGE.into(),
            Lang::Cpp => tree_sitter_cpp::LANGUAGE.into(),
        }
    }

    /// Whether type names are their own kind of node (`type_identifier`): a function's types
    /// can be told from its other names.
    pub fn typed(self) -> bool {
        !matches!(self, Lang::Python | Lang::JavaScript)
    }

    /// What each node kind of the grammar is to focusing ([`role`] bits), by kind id: a
    /// lookup per node instead of string comparisons.
    pub fn roles(self) -> &'static [u8] {
        static TABLES: [OnceLock<Vec<u8>>; 9] = [const { OnceLock::new() }; 9];
        TABLES[self as usize].get_or_init(|| {
            let grammar = self.grammar();
            let k = self.kinds();
            (0..grammar.node_kind_count())
                .map(|id| {
                    let Some(name) = u16::try_from(id)
                        .ok()
                        .and_then(|id| grammar.node_kind_for_id(id))
                    else {
                        return 0;
                    };
                    let mut r = 0;
                    for (list, bit) in [
                        (k.functions, role::FUNCTION),
                        (k.containers, role::CONTAINER),
                        (k.types, role::TYPE),
                        (k.wrappers, role::WRAPPER),
                        (k.attributes, role::ATTRIBUTE),
                    ] {
                        if list.contains(&name) {
                            r |= bit;
                        }
                    }
                    if name.contains("comment") {
                        r |= role::COMMENT;
                    }
                    if BINDINGS.contains(&name) && self.binds_functions() {
                        r |= role::BINDING;
                    }
                    r
                })
                .collect()
        })
    }

    /// Whether a declaration may bind a function to a name (`const f = () => {}`).
    fn binds_functions(self) -> bool {
        matches!(self, Lang::JavaScript | Lang::TypeScript | Lang::Tsx)
    }

    /// The grammar's node kinds that matter for focusing.
    pub fn kinds(self) -> &'static Kinds {
        match self {
            Lang::Python => &PYTHON,
            Lang::JavaScript => &JAVASCRIPT,
            Lang::TypeScript | Lang::Tsx => &TYPESCRIPT,
            Lang::Java => &JAVA,
            Lang::Rust => &RUST,
            Lang::Go => &GO,
            Lang::C => &C,
            Lang::Cpp => &CPP,
        }
    }
}

/// Role bits of [`Lang::roles`].
pub mod role {
    /// A function kind.
    pub const FUNCTION: u8 = 1;
    /// A container kind.
    pub const CONTAINER: u8 = 2;
    /// A type definition kind.
    pub const TYPE: u8 = 4;
    /// A wrapper kind.
    pub const WRAPPER: u8 = 8;
    /// An attribute / decorator kind.
    pub const ATTRIBUTE: u8 = 16;
    /// A comment.
    pub const COMMENT: u8 = 32;
    /// A statement that may bind a function to a name (JavaScript, TypeScript).
    pub const BINDING: u8 = 64;
    /// Any kind a unit may be made of.
    pub const UNIT: u8 = FUNCTION | CONTAINER | TYPE | BINDING;
}

/// Statements that may bind a function to a name in JavaScript and TypeScript.
const BINDINGS: &[&str] = &[
    "lexical_declaration",
    "variable_declaration",
    "pair",
    "expression_statement",
];

/// Node kinds of one grammar.
#[derive(Debug)]
pub struct Kinds {
    /// Named functions and methods: the units a frame's line selects.
    pub functions: &'static [&'static str],
    /// Classes and the like: their header goes with a selected method.
    pub containers: &'static [&'static str],
    /// Nodes that wrap a definition and belong to it (decorators, `export`, `template<>`).
    pub wrappers: &'static [&'static str],
    /// Siblings just before a definition that belong to it (attributes, decorators).
    pub attributes: &'static [&'static str],
    /// Top-level import / use / include lists (and C / C++ macro definitions).
    pub imports: &'static [&'static str],
    /// Calls: the name called is found under their `function`, `name`, `constructor` or
    /// `type` field.
    pub calls: &'static [&'static str],
    /// Class members sent with the class header (field declarations).
    pub fields: &'static [&'static str],
    /// Type definitions a method's receiver may name (Go, Rust): sent with its methods.
    pub types: &'static [&'static str],
    /// The constructor's name inside a class, when it is not the class's own name.
    pub constructor: Option<&'static str>,
}

static PYTHON: Kinds = Kinds {
    functions: &["function_definition"],
    containers: &["class_definition"],
    wrappers: &["decorated_definition"],
    attributes: &[],
    imports: &[
        "import_statement",
        "import_from_statement",
        "future_import_statement",
    ],
    calls: &["call"],
    fields: &["expression_statement"],
    types: &[],
    constructor: Some("__init__"),
};

static JAVASCRIPT: Kinds = Kinds {
    functions: &[
        "function_declaration",
        "generator_function_declaration",
        "method_definition",
    ],
    containers: &["class_declaration", "class"],
    wrappers: &["export_statement"],
    attributes: &["decorator"],
    imports: &["import_statement"],
    calls: &["call_expression", "new_expression"],
    fields: &["field_definition"],
    types: &[],
    constructor: Some("constructor"),
};

static TYPESCRIPT: Kinds = Kinds {
    functions: &[
        "function_declaration",
        "generator_function_declaration",
        "method_definition",
    ],
    containers: &["class_declaration", "abstract_class_declaration", "class"],
    wrappers: &["export_statement"],
    attributes: &["decorator"],
    imports: &["import_statement", "import_alias"],
    calls: &["call_expression", "new_expression"],
    fields: &["public_field_definition"],
    types: &["interface_declaration", "type_alias_declaration"],
    constructor: Some("constructor"),
};

static JAVA: Kinds = Kinds {
    functions: &[
        "method_declaration",
        "constructor_declaration",
        "compact_constructor_declaration",
    ],
    containers: &[
        "class_declaration",
        "interface_declaration",
        "enum_declaration",
        "record_declaration",
    ],
    wrappers: &[],
    attributes: &[],
    imports: &["package_declaration", "import_declaration"],
    calls: &["method_invocation", "object_creation_expression"],
    fields: &["field_declaration"],
    types: &[],
    constructor: None,
};

static RUST: Kinds = Kinds {
    functions: &["function_item"],
    containers: &["impl_item", "trait_item", "mod_item"],
    wrappers: &[],
    attributes: &["attribute_item"],
    imports: &["use_declaration", "extern_crate_declaration"],
    calls: &["call_expression"],
    fields: &[],
    types: &["struct_item", "enum_item", "type_item", "union_item"],
    constructor: Some("new"),
};

static GO: Kinds = Kinds {
    functions: &["function_declaration", "method_declaration"],
    containers: &[],
    wrappers: &[],
    attributes: &[],
    imports: &["package_clause", "import_declaration"],
    calls: &["call_expression"],
    fields: &[],
    types: &["type_declaration"],
    constructor: None,
};

static C: Kinds = Kinds {
    functions: &["function_definition"],
    containers: &[],
    wrappers: &[],
    attributes: &[],
    imports: &["preproc_include", "preproc_def", "preproc_function_def"],
    calls: &["call_expression"],
    fields: &[],
    types: &[
        "struct_specifier",
        "type_definition",
        "enum_specifier",
        "union_specifier",
    ],
    constructor: None,
};

static CPP: Kinds = Kinds {
    functions: &["function_definition"],
    containers: &[
        "class_specifier",
        "struct_specifier",
        "namespace_definition",
    ],
    wrappers: &["template_declaration"],
    attributes: &[],
    imports: &[
        "preproc_include",
        "preproc_def",
        "preproc_function_def",
        "using_declaration",
        "alias_declaration",
    ],
    calls: &["call_expression"],
    fields: &["field_declaration"],
    types: &[],
    constructor: None,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_extensions() {
        assert_eq!(Lang::from_name("C++"), Some(Lang::Cpp));
        assert_eq!(Lang::from_name(" Python "), Some(Lang::Python));
        assert_eq!(Lang::from_name("cobol"), None);
        assert_eq!(Lang::from_path("src/app/cart.test.tsx"), Some(Lang::Tsx));
        assert_eq!(Lang::from_path("Makefile"), None);
        assert!(Lang::TypeScript.accepts_file("dist/cart.js"));
        assert!(!Lang::Python.accepts_file("cart.js"));
    }
}
