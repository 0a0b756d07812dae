use super::*;

fn outline(lang: Lang, src: &str) -> Outline {
    Outline::scan(lang, src).expect("outlined")
}

/// The names of the definitions that may be left out.
fn def_names(o: &Outline) -> Vec<Vec<String>> {
    o.defs
        .iter()
        .filter(|d| !d.pinned)
        .map(|d| d.names.clone())
        .collect()
}

fn kept(lang: Lang, src: &str, rows: &[usize], depth: u32) -> String {
    let o = outline(lang, src);
    let files = [PlanFile {
        outline: Some(&o),
        src,
        rows: rows.to_vec(),
    }];
    match plan(&files, &[], depth).remove(0) {
        None => src.to_owned(),
        Some(ranges) => ranges.iter().map(|r| &src[r.clone()]).collect(),
    }
}

const PY: &str = "import os\n\nclass Cart:\n    \"\"\"A cart.\"\"\"\n    def __init__(self):\n        self.items = []\n\n    def total(self):\n        return sum(price(i) for i in self.items)\n\n    @staticmethod\n    def unused():\n        return 1\n\n\ndef price(item):\n    return item.cost\n\n\ndef other():\n    def inner():\n        pass\n    return inner\n";

#[test]
fn python_definitions_their_names_and_classes() {
    let o = outline(Lang::Python, PY);
    assert_eq!(
        def_names(&o),
        [
            vec!["__init__"],
            vec!["total"],
            vec!["unused"],
            vec!["price"],
            vec!["other", "inner"]
        ]
    );
    assert_eq!(o.containers[0].names, ["Cart"]);
    assert!(o.defs[0].ctor && !o.defs[1].ctor);
    // Decorators belong to the definition they decorate.
    assert_eq!(o.defs[2].rows, (10, 14));
}

#[test]
fn a_frame_keeps_its_function_what_it_calls_and_its_constructor() {
    // A frame in `total` (row 8): `price` is called, `__init__` is Cart's constructor;
    // `unused` and `other` are left out.
    let text = kept(Lang::Python, PY, &[8], 1);
    assert!(text.contains("def total") && text.contains("def price"));
    assert!(text.contains("def __init__") && text.contains("import os"));
    assert!(!text.contains("def unused") && !text.contains("def other"));
    // Depth 0: no callees.
    let text = kept(Lang::Python, PY, &[8], 0);
    assert!(!text.contains("def price"));
}

#[test]
fn a_class_nothing_reaches_is_left_out_and_a_python_class_keeps_one_member() {
    let src = "class A:\n    def f(self):\n        return 1\n\n    def g(self):\n        return 2\n\n\ndef main():\n    return 3\n";
    let text = kept(Lang::Python, src, &[9], 1);
    assert_eq!(text, "def main():\n    return 3\n");
    // Named (not called), the class stays, with one member for its body to parse.
    let src = src.replace("return 3", "return A");
    let text = kept(Lang::Python, &src, &[9], 1);
    assert!(text.contains("class A:") && text.contains("def main"));
    assert_eq!(text.matches("def ").count(), 2, "{text}");
}

#[test]
fn brace_languages_find_methods_functions_and_bound_arrows() {
    let ts = "import { x } from './x';\n\nexport class Cart {\n  private items: number[] = [];\n  constructor(private tax = 0) {}\n\n  total(): number {\n    return this.items.reduce((s, i) => s + price(i), 0);\n  }\n}\n\nexport const price = (i: number): number => {\n  return i * 2;\n};\n\nfunction unused() {\n  return 1;\n}\n";
    let o = outline(Lang::TypeScript, ts);
    assert_eq!(
        def_names(&o),
        [
            vec!["constructor"],
            vec!["total"],
            vec!["price"],
            vec!["unused"]
        ]
    );
    assert!(o.defs.iter().any(|d| d.ctor && d.names == ["constructor"]));
    let text = kept(Lang::TypeScript, ts, &[7], 1);
    assert!(text.contains("total()") && text.contains("const price"));
    assert!(text.contains("constructor") && !text.contains("unused"));

    let cpp = "#include <vector>\n\nclass Stack {\npublic:\n    Stack() : n_(0) {}\n    int pop() {\n        return take(n_);\n    }\nprivate:\n    int n_;\n};\n\nint take(int n) {\n    return n - 1;\n}\n\ntemplate <typename T>\nT max_of(T a, T b) {\n    return a > b ? a : b;\n}\n";
    let o = outline(Lang::Cpp, cpp);
    assert_eq!(
        def_names(&o),
        [
            vec!["Stack", "n_"],
            vec!["pop"],
            vec!["take"],
            vec!["max_of"]
        ]
    );
    let text = kept(Lang::Cpp, cpp, &[6], 1);
    assert!(text.contains("int take") && !text.contains("max_of"));
    assert!(text.contains("int n_;"), "fields stay: {text}");
    // A frame in `take`, which names no class: `Stack` is left out whole.
    let text = kept(Lang::Cpp, cpp, &[13], 1);
    assert!(text.contains("int take") && !text.contains("class Stack") && !text.contains("n_;"));

    let go = "package main\n\ntype Cart struct {\n\titems []int\n}\n\nfunc (c *Cart) Total() int {\n\treturn sum(c.items)\n}\n\nfunc sum(xs []int) int {\n\treturn 0\n}\n\nfunc main() {\n}\n";
    let o = outline(Lang::Go, go);
    assert!(o.defs.iter().any(|d| d.names.contains(&"Total".to_owned())));
    let text = kept(Lang::Go, go, &[7], 1);
    assert!(text.contains("func sum") && !text.contains("func main") && text.contains("type Cart"));

    let rust = "struct Cart { items: Vec<u32> }\n\nimpl Cart {\n    pub fn new() -> Self {\n        Cart { items: vec![] }\n    }\n\n    pub fn total(&self) -> u32 {\n        self.items.iter().map(|i| price(*i)).sum()\n    }\n}\n\nfn price(i: u32) -> u32 {\n    i * 2\n}\n\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn unused() {}\n}\n";
    let o = outline(Lang::Rust, rust);
    assert_eq!(
        def_names(&o),
        [vec!["new"], vec!["total"], vec!["price"], vec!["unused"]]
    );
    let text = kept(Lang::Rust, rust, &[8], 1);
    assert!(text.contains("fn new") && text.contains("fn price") && !text.contains("fn unused"));
    // The receiver's type stays with its impl's method, though the method never names it.
    assert!(text.contains("struct Cart") && !text.contains("mod tests"));
}

#[test]
fn what_the_scan_cannot_read_is_parsed() {
    // A definition sharing its line with other code stays.
    let src =
        "int a(void) { return 1; } int b(void) { return 2; }\nint main(void) {\n    return 0;\n}\n";
    let o = outline(Lang::C, src);
    assert_eq!(def_names(&o), [vec!["main"]]);
    // Still read for what they define and mention.
    let pinned: Vec<_> = o
        .defs
        .iter()
        .filter(|d| d.pinned)
        .map(|d| d.names.clone())
        .collect();
    assert_eq!(pinned, [vec!["a"], vec!["b"]]);
    let text = kept(Lang::C, "int a(void) { return b(); } int z;\nint b(void) {\n    return 2;\n}\nint c(void) {\n    return 3;\n}\n", &[0], 1);
    assert!(
        text.contains("int b(void)") && !text.contains("int c(void)"),
        "{text}"
    );
    // Unbalanced code is not outlined at all.
    assert!(Outline::scan(Lang::C, "int f(void) {\n  return 1;\n").is_none());
    assert!(Outline::scan(Lang::Python, "def f(:\n    return (1\n").is_none());
}

/// Classes nested past [`braces::MAX_NESTING`] are kept whole, not scanned (a file of classes
/// nested thousands deep would otherwise recurse once a level, on a blocking thread's stack),
/// as for the brace languages.
#[test]
fn python_classes_past_the_nesting_bound_are_kept_whole() {
    let depth = braces::MAX_NESTING + 8;
    let mut src = String::new();
    for i in 0..depth {
        src.push_str(&format!("{}class C{i}:\n", " ".repeat(i)));
    }
    src.push_str(&format!(
        "{}def f(self):\n{}pass\n",
        " ".repeat(depth),
        " ".repeat(depth + 1)
    ));
    let o = outline(Lang::Python, &src);
    assert_eq!(o.containers.len(), braces::MAX_NESTING);
    // What lies past the bound is one definition, kept whole.
    assert_eq!(o.defs.len(), 1);
}
