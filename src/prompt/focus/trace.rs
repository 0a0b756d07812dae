//! Stack traces and compiler errors read into frames: file, line, function, innermost first.
//!
//! Formats: Python tracebacks (`File "x.py", line 3, in f`), Node/V8 (`at f (x.js:3:7)`) and
//! Firefox (`f@x.js:3:7`), the JVM (`at pkg.Cls.m(Cls.java:3)`), Rust panics
//! (`panicked at src/x.rs:3:7`) with backtraces (`4: krate::f` / `at ./src/x.rs:3:7`), Go panics
//! (`main.(*T).M(...)` / `\t/home/x/t.go:3 +0x1d`), gdb, AddressSanitizer and Valgrind
//! backtraces, and compiler errors with `file:line` (rustc `--> x.rs:3:7`, tsc `x.ts(3,7)` and
//! `x.ts:3:7 - error`, javac `X.java:3: error`, gcc/clang and go `x.c:3:7: error`).

use std::collections::HashMap;
use std::sync::OnceLock;

use regex::Regex;

/// One place in a trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The file as the trace names it (normalized: `/` separators, no `file://` or `./`).
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// The function's simple name, when the trace gives a real one (not a closure or
    /// `<module>`).
    pub function: Option<String>,
    /// A library or runtime file (site-packages, node_modules, the standard library...).
    pub library: bool,
    /// One frame of a call stack (not a compiler error's or a panic's own location): only the
    /// innermost such frame in the given code has its calls followed.
    pub stack: bool,
}

struct Patterns {
    python: Regex,
    v8: Regex,
    firefox: Regex,
    jvm: Regex,
    rust_panic: Regex,
    rust_frame: Regex,
    rust_at: Regex,
    rustc: Regex,
    go_at: Regex,
    gdb: Regex,
    asan: Regex,
    valgrind: Regex,
    compiler: Regex,
}

fn patterns() -> &'static Patterns {
    static P: OnceLock<Patterns> = OnceLock::new();
    P.get_or_init(|| {
        let re = |s: &str| Regex::new(s).expect("valid trace pattern");
        Patterns {
            python: re(r#"File "(?P<file>[^"]+)", line (?P<line>\d+)(?:, in (?P<func>\S+))?"#),
            v8: re(
                r"^\s*at (?:(?P<func>[^()]+?) \()?(?P<file>[^\s()]+?):(?P<line>\d+):\d+\)?\s*$",
            ),
            firefox: re(r"^\s*(?P<func>[\w$.<>/]*)@(?P<file>\S+?):(?P<line>\d+):\d+\s*$"),
            jvm: re(r"^\s*at (?:\S+/)?(?P<qual>[\w$.<>]+)\((?P<file>[\w$.-]+\.(?:java|kt|scala|groovy)):(?P<line>\d+)\)"),
            rust_panic: re(
                r"panicked at (?:'.*', )?(?P<file>[^\s:']+\.rs):(?P<line>\d+):\d+",
            ),
            rust_frame: re(r"^\s*\d+:\s+(?:0x[0-9a-f]+ - )?(?P<func>\S+)\s*$"),
            rust_at: re(r"^\s+at (?P<file>\S+\.rs):(?P<line>\d+)(?::\d+)?\s*$"),
            rustc: re(r"^\s*--> (?P<file>[^\s:]+):(?P<line>\d+):\d+"),
            go_at: re(r"^\s+(?P<file>\S+\.go):(?P<line>\d+)(?: \+0x[0-9a-f]+)?\s*$"),
            gdb: re(r"^#\d+\s+(?:0x[0-9a-f]+ in )?(?P<func>[\w:~<>]+) \(.*\) at (?P<file>\S+?):(?P<line>\d+)"),
            asan: re(r"^\s*#\d+ 0x[0-9a-f]+ in (?P<func>.+?) (?P<file>[^\s:()]+):(?P<line>\d+)(?::\d+)?\s*$"),
            valgrind: re(r"(?:at|by) 0x[0-9A-Fa-f]+: (?P<func>\S+) \((?P<file>[^:()]+):(?P<line>\d+)\)"),
            compiler: re(r"^(?P<file>[^\s:()'][^\s:()']*?\.(?:ts|tsx|mts|cts|js|jsx|mjs|cjs|rs|java|go|c|h|cc|cpp|cxx|hpp|hh|hxx|py))(?::(?P<line>\d+)(?::\d+)?:?|\((?P<line2>\d+),\d+\):?)(?:\s|$)"),
        }
    })
}

/// Most frames read from one trace (each place once, innermost first): a real trace's places
/// are far fewer, and each frame costs the selection a pass over the code's definitions.
pub const MAX_FRAMES: usize = 256;

/// The frames of `trace`, innermost first, each place once, at most [`MAX_FRAMES`].
pub fn frames(trace: &str) -> Vec<Frame> {
    let p = patterns();
    let python_traceback = trace.contains("Traceback (most recent call last)");
    let mut python: Vec<Frame> = Vec::new();
    let mut out: Vec<Frame> = Vec::new();
    let mut prev = "";
    for line in trace.lines() {
        let line = line.trim_end_matches('\r');
        if let Some(f) = read_line(p, line, prev) {
            if p.python.is_match(line) {
                python.push(f);
            } else {
                out.push(f);
            }
        }
        prev = line;
    }
    if python_traceback {
        // Tracebacks list the outermost call first.
        python.reverse();
    }
    python.extend(out);
    // Each place once, first seen first; a place that is also a stack frame is one (Node
    // prints the throwing line as `file:line` above the stack).
    // Places are looked up in a map: a search of the frames kept so far made a trace of
    // 120,000 distinct frames cost 33 s of CPU.
    let mut kept: Vec<Frame> = Vec::new();
    let mut at: HashMap<(String, usize), usize> = HashMap::new();
    for f in python.into_iter().filter(|f| f.line > 0) {
        match at.get(&(f.file.clone(), f.line)) {
            Some(&i) => {
                let k = &mut kept[i];
                k.stack |= f.stack;
                if k.function.is_none() {
                    k.function = f.function;
                }
            }
            None if kept.len() < MAX_FRAMES => {
                at.insert((f.file.clone(), f.line), kept.len());
                kept.push(f);
            }
            None => {}
        }
    }
    kept
}

/// The frame on `line` (`prev` is the line before it: Rust and Go name the function there).
fn read_line(p: &Patterns, line: &str, prev: &str) -> Option<Frame> {
    if let Some(c) = p.python.captures(line) {
        return Some(frame(
            &c["file"],
            &c["line"],
            c.name("func").map(|m| m.as_str()),
        ));
    }
    if let Some(c) = p.rust_at.captures(line) {
        let func = p.rust_frame.captures(prev).map(|f| rust_name(&f["func"]));
        return Some(frame(&c["file"], &c["line"], func.as_deref()));
    }
    if let Some(c) = p.go_at.captures(line) {
        let func = go_func_line(prev).map(go_name);
        return Some(frame(&c["file"], &c["line"], func.as_deref()));
    }
    if let Some(c) = p.jvm.captures(line) {
        return Some(frame(&c["file"], &c["line"], Some(&jvm_name(&c["qual"]))));
    }
    if let Some(c) = p.v8.captures(line) {
        let func = c.name("func").map(|m| v8_name(m.as_str()));
        return Some(frame(&c["file"], &c["line"], func.as_deref()));
    }
    if let Some(c) = p
        .gdb
        .captures(line)
        .or_else(|| p.asan.captures(line))
        .or_else(|| p.valgrind.captures(line))
    {
        return Some(frame(&c["file"], &c["line"], Some(&cxx_name(&c["func"]))));
    }
    if let Some(c) = p
        .rust_panic
        .captures(line)
        .or_else(|| p.rustc.captures(line))
    {
        return Some(located(frame(&c["file"], &c["line"], None)));
    }
    if let Some(c) = p.compiler.captures(line) {
        let n = c
            .name("line")
            .or_else(|| c.name("line2"))
            .map_or("", |m| m.as_str());
        return Some(located(frame(&c["file"], n, None)));
    }
    if let Some(c) = p.firefox.captures(line) {
        return Some(frame(&c["file"], &c["line"], Some(&v8_name(&c["func"]))));
    }
    None
}

/// The function of a Go frame's first line: `main.(*Stack).Pop(...)`, `main.main()`, `created
/// by main.start in goroutine 1` -> the name without its arguments.
fn go_func_line(line: &str) -> Option<&str> {
    if line.is_empty() || line.starts_with(char::is_whitespace) {
        return None;
    }
    let l = line.trim_end();
    let l = l.strip_prefix("created by ").unwrap_or(l);
    let l = l.split(" in goroutine ").next().unwrap_or(l);
    let l = match l.strip_suffix(')') {
        // The arguments: from the `(` that closes at the end.
        Some(_) => {
            let mut depth = 0i32;
            let mut cut = None;
            for (i, ch) in l.char_indices().rev() {
                match ch {
                    ')' => depth += 1,
                    '(' => {
                        depth -= 1;
                        if depth == 0 {
                            cut = Some(i);
                            break;
                        }
                    }
                    _ => {}
                }
            }
            &l[..cut?]
        }
        None => l,
    };
    (l.contains('.') && !l.contains(' ')).then_some(l)
}

fn frame(file: &str, line: &str, function: Option<&str>) -> Frame {
    let file = normalize(file);
    let function = function.map(str::to_owned).filter(|f| {
        !f.is_empty()
            && !f.starts_with('<')
            && f.chars()
                .all(|c| c.is_alphanumeric() || c == '_' || c == '$' || c == '~')
    });
    Frame {
        library: is_library(&file),
        file,
        line: line.parse().unwrap_or(0),
        function,
        stack: true,
    }
}

/// A compiler error's or a panic's own location, not a frame of a call stack.
fn located(f: Frame) -> Frame {
    Frame { stack: false, ..f }
}

/// `/` separators, no `file://`, no leading `./`.
pub fn normalize(path: &str) -> String {
    let p = path.trim().replace('\\', "/");
    let p = p.strip_prefix("file://").unwrap_or(&p);
    let mut p = p.to_owned();
    while let Some(rest) = p.strip_prefix("./") {
        p = rest.to_owned();
    }
    p
}

/// Files of installed packages, runtimes and standard libraries: never the student's.
fn is_library(file: &str) -> bool {
    const MARKS: &[&str] = &[
        "site-packages/",
        "dist-packages/",
        "node_modules/",
        "node:",
        "internal/",
        "/lib/python",
        "<frozen",
        "/rustc/",
        "/.cargo/registry/",
        "/.rustup/",
        "library/std/",
        "library/core/",
        "library/alloc/",
        "/usr/local/go/",
        "/usr/lib/go",
        "/go/pkg/mod/",
        "/usr/include/",
        "/usr/lib/",
        "libc-start",
        "/jdk/",
        "webpack:",
    ];
    MARKS.iter().any(|m| file.contains(m)) || file.starts_with("runtime/")
}

/// `Cart.total` -> `total`, `async renderList` -> `renderList`, `new Cart` -> `Cart`,
/// `Object.<anonymous>` -> none (an empty name is dropped).
fn v8_name(raw: &str) -> String {
    let raw = raw.trim();
    let raw = raw.strip_prefix("async ").unwrap_or(raw);
    let raw = raw.strip_prefix("new ").unwrap_or(raw);
    let raw = raw.split(" [as ").next().unwrap_or(raw);
    last_segment(raw, '.').to_owned()
}

/// `com.x.Cart.total` -> `total`; `com.x.Cart.<init>` -> `Cart`; `lambda$main$0` -> dropped.
fn jvm_name(qual: &str) -> String {
    let mut parts = qual.rsplit('.');
    let method = parts.next().unwrap_or_default();
    match method {
        "<init>" => parts.next().unwrap_or_default().to_owned(),
        m if m.starts_with("lambda$") || m.starts_with("access$") => String::new(),
        m => m.to_owned(),
    }
}

/// `inventory::Inventory::remove::h1a2b` -> `remove`; `{{closure}}` -> dropped.
fn rust_name(raw: &str) -> String {
    let mut segs: Vec<&str> = raw.split("::").collect();
    if segs
        .last()
        .is_some_and(|s| s.len() == 17 && s.starts_with('h'))
    {
        segs.pop();
    }
    let last = segs.last().copied().unwrap_or_default();
    let last = last.split('<').next().unwrap_or(last);
    if last.contains('{') {
        String::new()
    } else {
        last.to_owned()
    }
}

/// `main.(*Stack).Pop` -> `Pop`; `main.main.func1` -> dropped (a closure).
fn go_name(raw: &str) -> String {
    let raw = raw.split('[').next().unwrap_or(raw);
    let last = last_segment(raw, '.');
    let closure = last
        .strip_prefix("func")
        .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit() || c == '.'));
    if closure || last.chars().all(|c| c.is_ascii_digit()) {
        String::new()
    } else {
        last.to_owned()
    }
}

/// `Stack::push` -> `push`; `_start` stays.
fn cxx_name(raw: &str) -> String {
    let raw = raw.split('(').next().unwrap_or(raw);
    raw.rsplit("::").next().unwrap_or(raw).to_owned()
}

fn last_segment(s: &str, sep: char) -> &str {
    s.rsplit(sep).next().unwrap_or(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A trace of thousands of places gives the innermost `MAX_FRAMES`, each once.
    #[test]
    fn a_trace_of_thousands_of_places_keeps_the_innermost_few_hundred() {
        let mut t = String::from("Traceback (most recent call last):\n");
        for i in 1..=5000 {
            t.push_str(&format!("  File \"a.py\", line {i}, in f{i}\n"));
            // Every place twice: the second is the same frame.
            t.push_str(&format!("  File \"a.py\", line {i}, in f{i}\n"));
        }
        t.push_str("ValueError: x\n");
        let f = frames(&t);
        assert_eq!(f.len(), MAX_FRAMES);
        // Innermost first: the traceback's last lines.
        assert_eq!((f[0].line, f[0].function.as_deref()), (5000, Some("f5000")));
        assert_eq!(f[MAX_FRAMES - 1].line, 5000 - MAX_FRAMES + 1);
        let mut lines: Vec<usize> = f.iter().map(|f| f.line).collect();
        lines.dedup();
        assert_eq!(lines.len(), MAX_FRAMES, "each place once");
    }

    fn places(trace: &str) -> Vec<(String, usize, Option<String>, bool)> {
        frames(trace)
            .into_iter()
            .map(|f| (f.file, f.line, f.function, f.library))
            .collect()
    }

    fn p(
        file: &str,
        line: usize,
        f: Option<&str>,
        lib: bool,
    ) -> (String, usize, Option<String>, bool) {
        (file.to_owned(), line, f.map(str::to_owned), lib)
    }

    #[test]
    fn python_traceback_is_read_innermost_first() {
        let t = "Traceback (most recent call last):\n  File \"/home/s/main.py\", line 42, in <module>\n    main()\n  File \"/home/s/cart.py\", line 17, in total\n    return x\n  File \"/usr/lib/python3.12/site-packages/req/api.py\", line 5, in get\nTypeError: boom";
        assert_eq!(
            places(t),
            vec![
                p(
                    "/usr/lib/python3.12/site-packages/req/api.py",
                    5,
                    Some("get"),
                    true
                ),
                p("/home/s/cart.py", 17, Some("total"), false),
                p("/home/s/main.py", 42, None, false),
            ]
        );
    }

    #[test]
    fn node_jvm_rust_go_and_compilers() {
        let node = "TypeError: x\n    at renderList (/app/src/list.js:12:15)\n    at Object.<anonymous> (/app/src/index.js:5:1)\n    at Module._compile (node:internal/modules/cjs/loader:1256:14)\n    at /app/src/index.js:9:3";
        assert_eq!(
            places(node),
            vec![
                p("/app/src/list.js", 12, Some("renderList"), false),
                p("/app/src/index.js", 5, None, false),
                p(
                    "node:internal/modules/cjs/loader",
                    1256,
                    Some("_compile"),
                    true
                ),
                p("/app/src/index.js", 9, None, false),
            ]
        );
        let jvm = "Exception in thread \"main\" java.lang.NullPointerException\n\tat com.x.Cart.total(Cart.java:27)\n\tat com.x.Cart.<init>(Cart.java:9)\n\tat java.base/java.util.ArrayList.forEach(ArrayList.java:1596)\n\tat com.x.Main.lambda$main$0(Main.java:10)";
        let got = places(jvm);
        assert_eq!(got[0], p("Cart.java", 27, Some("total"), false));
        assert_eq!(got[1], p("Cart.java", 9, Some("Cart"), false));
        assert_eq!(got[3], p("Main.java", 10, None, false));
        let rust = "thread 'main' panicked at src/main.rs:14:22:\ncalled `Option::unwrap()` on a `None` value\nstack backtrace:\n   0: rust_begin_unwind\n             at /rustc/abc/library/std/src/panicking.rs:645:5\n   3: inv::Inventory::remove\n             at ./src/inventory.rs:42:9\n   4: inv::main::{{closure}}\n             at ./src/main.rs:10:5";
        assert_eq!(
            places(rust),
            vec![
                p("src/main.rs", 14, None, false),
                p(
                    "/rustc/abc/library/std/src/panicking.rs",
                    645,
                    Some("rust_begin_unwind"),
                    true
                ),
                p("src/inventory.rs", 42, Some("remove"), false),
                p("src/main.rs", 10, None, false),
            ]
        );
        let go = "panic: runtime error: index out of range [5] with length 3\n\ngoroutine 1 [running]:\nmain.(*Stack).Pop(...)\n\t/home/s/stack.go:21\nmain.main.func1()\n\t/home/s/main.go:12 +0x1d\nexit status 2";
        assert_eq!(
            places(go),
            vec![
                p("/home/s/stack.go", 21, Some("Pop"), false),
                p("/home/s/main.go", 12, None, false),
            ]
        );
        let compilers = "src/cart.ts(12,5): error TS2322: Type 'string'\nsrc/list.ts:7:3 - error TS2339: nope\nCart.java:27: error: cannot find symbol\nmain.c:12:5: error: expected ';'\nerror[E0308]: mismatched types\n  --> src/lib.rs:3:7\n./main.go:8:2: undefined: x";
        let got: Vec<(String, usize)> = frames(compilers)
            .into_iter()
            .map(|f| (f.file, f.line))
            .collect();
        assert_eq!(
            got,
            [
                ("src/cart.ts", 12),
                ("src/list.ts", 7),
                ("Cart.java", 27),
                ("main.c", 12),
                ("src/lib.rs", 3),
                ("main.go", 8)
            ]
            .map(|(f, l)| (f.to_owned(), l))
        );
        let asan = "==1==ERROR: AddressSanitizer: heap-buffer-overflow\n    #0 0x4f5a in push /home/s/stack.c:14:5\n    #1 0x4f9b in main /home/s/main.c:20:3";
        assert_eq!(
            places(asan)[0],
            p("/home/s/stack.c", 14, Some("push"), false)
        );
    }
}
