//! The focusing corpus (issue 20, M11): `tests/fixtures/focus/<case>/case.toml`, each a
//! student's code (one file, or several as `files`), a stack trace or compiler error, and what
//! focusing must select: the outcome and the functions sent, in file and source order, plus
//! lines that must (or must not) be in the focused code.
//!
//! Counts use the shipped configuration's counter (the heuristic); the figures with a real
//! tokenizer come from `cargo bench --bench focus`. `FOCUS_SHOW=<case>` prints what a case
//! sends.

mod focus_cases;

use std::collections::BTreeMap;
use std::time::Duration;

use focus_cases::{load, Case};
use tutor_gateway::classify::TokenCounter;
use tutor_gateway::prompt::focus::{self, Focus, FocusMode, FocusSettings, Lang};

fn heuristic(text: &str) -> u32 {
    TokenCounter::Heuristic.count_text(text)
}

/// The defaults, but a parse time limit no test machine reaches: a debug build parsing on a
/// busy machine must not turn a case into `fallback_parse`.
fn settings(case: &Case) -> FocusSettings {
    let d = FocusSettings::default();
    FocusSettings {
        depth: case.spec.depth.unwrap_or(d.depth),
        token_target: case.spec.token_target.unwrap_or(d.token_target),
        timeout: Duration::from_secs(60),
        ..d
    }
}

fn run(case: &Case, settings: &FocusSettings) -> Focus {
    focus::focus(
        &case.files,
        case.lang,
        case.spec.trace.as_deref(),
        case.spec.question.as_deref(),
        settings,
        &heuristic,
    )
}

/// The language a case is in: its `language`, else its first file's extension.
fn language_of(case: &Case) -> &'static str {
    let lang = case
        .lang
        .or_else(|| {
            case.files
                .iter()
                .find_map(|f| f.path.as_deref().and_then(Lang::from_path))
        })
        .or_else(|| case.spec.source.as_deref().and_then(Lang::from_path))
        .unwrap_or_else(|| panic!("{}: no language", case.name));
    match lang {
        Lang::Tsx => "typescript",
        l => l.as_str(),
    }
}

#[test]
fn every_case_selects_the_expected_functions_or_falls_back() {
    let cases = load();
    let show = std::env::var("FOCUS_SHOW").ok();
    let mut wrong = Vec::new();
    for case in &cases {
        let f = run(case, &settings(case));
        if show.as_deref() == Some(case.name.as_str()) || show.as_deref() == Some("all") {
            eprintln!(
                "== {} {:?} {:?}/{:?} {:?}\n{}",
                case.name,
                f.outcome,
                f.sent_tokens,
                f.original_tokens,
                f.functions,
                f.text.as_deref().unwrap_or("(whole)")
            );
        }
        let mut problems = Vec::new();
        if f.outcome.as_str() != case.spec.expected_outcome {
            problems.push(format!(
                "outcome {} (expected {})",
                f.outcome.as_str(),
                case.spec.expected_outcome
            ));
        }
        if f.functions != case.spec.expected_functions {
            problems.push(format!(
                "functions {:?} (expected {:?})",
                f.functions, case.spec.expected_functions
            ));
        }
        let text = f.text.as_deref().unwrap_or_default();
        for line in &case.spec.must_include {
            if !text.lines().any(|l| l.contains(line.as_str())) {
                problems.push(format!("missing line {line:?}"));
            }
        }
        for part in &case.spec.must_exclude {
            if text.contains(part.as_str()) {
                problems.push(format!("sends {part:?}"));
            }
        }
        if !problems.is_empty() {
            wrong.push(format!("{}: {}", case.name, problems.join("; ")));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} cases wrong:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

#[test]
fn the_corpus_covers_every_language_outcome_and_long_files() {
    let cases = load();
    assert!(cases.len() >= 40, "{} cases", cases.len());
    let mut per_language: BTreeMap<&str, usize> = BTreeMap::new();
    for c in &cases {
        *per_language.entry(language_of(c)).or_default() += 1;
    }
    for lang in [
        "python",
        "javascript",
        "typescript",
        "java",
        "rust",
        "go",
        "c",
        "cpp",
    ] {
        let n = per_language.get(lang).copied().unwrap_or(0);
        assert!(n >= 4, "{lang}: {n} cases ({per_language:?})");
    }
    let long = cases
        .iter()
        .flat_map(|c| &c.files)
        .filter(|f| f.code.lines().count() > 300)
        .count();
    assert!(long >= 10, "{long} files over 300 lines");
    for outcome in [
        "focused",
        "fallback_parse",
        "fallback_nomatch",
        "fallback_whole",
    ] {
        assert!(
            cases.iter().any(|c| c.spec.expected_outcome == outcome),
            "no case expects {outcome}"
        );
    }
}

/// What a tutor needs to cite lines: every frame line in the given code is sent with its own
/// number, and the focused code is smaller than the whole.
#[test]
fn focused_code_keeps_each_frame_line_with_its_number() {
    for case in load() {
        let f = run(&case, &settings(&case));
        let original = f.original_tokens.expect("counted");
        let sent = f.sent_tokens.expect("counted");
        let Some(text) = f.text.as_deref() else {
            assert_eq!(sent, original, "{}: a fallback sends the whole", case.name);
            continue;
        };
        assert!(sent < original, "{}: {sent} >= {original}", case.name);
        let frames = focus::frames(case.spec.trace.as_deref().unwrap_or_default());
        let mut found = 0;
        for fr in frames.iter().filter(|f| !f.library) {
            let file = case.files.iter().find(|sf| match &sf.path {
                Some(p) => fr.file.ends_with(p.as_str()) || p.ends_with(fr.file.as_str()),
                None => true,
            });
            let Some(line) = file.and_then(|sf| sf.code.lines().nth(fr.line - 1)) else {
                continue;
            };
            if line.trim().is_empty() {
                continue;
            }
            let numbered = format!("{} | {}", fr.line, line.trim_end());
            assert!(
                text.lines().any(|l| l.trim_start() == numbered),
                "{}: frame line {} not sent as {numbered:?}",
                case.name,
                fr.line
            );
            found += 1;
        }
        assert!(found > 0, "{}: focused without a frame line", case.name);
    }
}

/// A long file whose innermost frame calls two helpers.
fn long_case() -> Case {
    load()
        .into_iter()
        .find(|c| c.name == "py_long_pipeline_keyerror")
        .expect("the case is in the corpus")
}

#[test]
fn over_the_size_cap_past_the_time_limit_or_off_the_code_goes_whole() {
    let case = long_case();
    let base = settings(&case);
    assert_eq!(run(&case, &base).outcome.as_str(), "focused");
    let capped = FocusSettings {
        max_bytes: 100,
        ..base.clone()
    };
    let f = run(&case, &capped);
    assert_eq!(f.outcome.as_str(), "fallback_parse");
    assert_eq!(f.original_tokens, None, "not counted over the cap");
    let timed_out = FocusSettings {
        timeout: Duration::ZERO,
        ..base.clone()
    };
    let f = run(&case, &timed_out);
    assert_eq!(f.outcome.as_str(), "fallback_parse");
    assert!(f.text.is_none());
    let off = FocusSettings {
        mode: FocusMode::Off,
        ..base
    };
    assert_eq!(run(&case, &off).outcome.as_str(), "off");
}

#[test]
fn a_lower_depth_or_token_target_sends_less() {
    let case = long_case();
    let base = settings(&case);
    let full = run(&case, &base);
    let none = run(
        &case,
        &FocusSettings {
            depth: 0,
            ..base.clone()
        },
    );
    assert!(
        none.functions.len() < full.functions.len(),
        "{:?} vs {:?}",
        none.functions,
        full.functions
    );
    assert!(none.sent_tokens < full.sent_tokens);
    let tight = run(
        &case,
        &FocusSettings {
            token_target: 1,
            ..base
        },
    );
    assert_eq!(
        tight.functions, none.functions,
        "the frames' functions are always sent"
    );
}

/// `go` with the case's settings at `depth`, parsing only what the trace can reach and then
/// the whole code: the two must select the same (outcome, functions, text).
fn both_ways(
    case: &Case,
    depth: u32,
    what: &str,
    go: &dyn Fn(&FocusSettings) -> Focus,
) -> (Focus, Focus) {
    let part = FocusSettings {
        depth,
        ..settings(case)
    };
    let whole = FocusSettings {
        whole_parse: true,
        ..part.clone()
    };
    let (p, w) = (go(&part), go(&whole));
    assert_eq!(
        (p.outcome, &p.functions, &p.text),
        (w.outcome, &w.functions, &w.text),
        "{what}"
    );
    (p, w)
}

/// Parsing only the definitions the trace can reach selects exactly what parsing the whole
/// code does, at every depth; and in the long files it leaves most of the code unparsed.
#[test]
fn parsing_only_what_the_trace_reaches_selects_the_same() {
    let mut long_saved = 0;
    for case in load() {
        for depth in [0, 1, 2] {
            let (p, w) = both_ways(
                &case,
                depth,
                &format!("{} at depth {depth}", case.name),
                &|s| run(&case, s),
            );
            let bytes: usize = case.files.iter().map(|f| f.code.len()).sum();
            assert!(p.parsed_bytes <= bytes && w.parsed_bytes <= bytes);
            if w.outcome == focus::Outcome::Focused {
                assert_eq!(
                    w.parsed_bytes, bytes,
                    "{}: whole_parse parses all",
                    case.name
                );
            }
            let lines: usize = case.files.iter().map(|f| f.code.lines().count()).sum();
            if depth == 1 && lines > 300 && p.outcome == focus::Outcome::Focused {
                long_saved += usize::from(p.parsed_bytes * 2 < bytes);
            }
        }
    }
    assert!(
        long_saved >= 5,
        "only {long_saved} long focused cases parsed less than half their code"
    );
}

/// The same over many more traces: a compiler error at every seventh line of code of every file
/// of the corpus (in a function, between functions, in a class body, on an import), at depths
/// 1 and 2, selects the same whether only what the error can reach is parsed or everything is.
/// (Blank and comment lines are skipped: what a frame there falls in depends on where the
/// parser ends the block around it. So is code that does not parse: a syntax error the
/// error's line cannot reach is not seen, by design.)
#[test]
fn an_error_at_any_line_selects_the_same_either_way() {
    let mut compared = 0;
    for case in load() {
        if case.spec.expected_outcome == "fallback_parse" {
            continue;
        }
        for file in &case.files {
            let Some(path) = &file.path else { continue };
            let code_lines = file.code.lines().enumerate().filter(|(_, l)| {
                let t = l.trim();
                !(t.is_empty() || ["#", "//", "/*", "*"].iter().any(|c| t.starts_with(c)))
            });
            for line in code_lines.step_by(7).map(|(i, _)| i + 1) {
                let trace = format!("{path}:{line}:1: error: something is wrong here");
                for depth in [1, 2] {
                    let what = format!("{} {path}:{line} at depth {depth}", case.name);
                    both_ways(&case, depth, &what, &|s| {
                        focus::focus(&case.files, case.lang, Some(&trace), None, s, &heuristic)
                    });
                    compared += 1;
                }
            }
        }
    }
    assert!(compared > 1000, "{compared} traces compared");
}

/// A function calling thousands of helpers: at most `MAX_CALLEES` of them are weighed, so a
/// request cannot make focusing's work grow with the square of its calls (a file of 24,500
/// calls once took 16 s of CPU); what is sent is still the frame's function and helpers it
/// calls, within the target.
#[test]
fn a_function_of_thousands_of_calls_has_at_most_a_bounded_number_weighed() {
    let k = 1_000;
    let mut code = String::from("def main():\n");
    for i in 0..k {
        code.push_str(&format!("    h{i}()\n"));
    }
    code.push_str("    raise ValueError('x')\n\n");
    for i in 0..k {
        code.push_str(&format!("def h{i}():\n    return {i}\n\n"));
    }
    let trace = format!(
        "Traceback (most recent call last):\n  File \"app.py\", line {}, in main\nValueError: x\n",
        k + 2
    );
    let files = vec![focus::SourceFile {
        path: Some("app.py".into()),
        code,
    }];
    let settings = FocusSettings {
        // A target every helper would fit in: only the bound stops the weighing.
        token_target: 1_000_000,
        timeout: Duration::from_secs(60),
        ..FocusSettings::default()
    };
    let f = focus::focus(
        &files,
        Some(Lang::Python),
        Some(&trace),
        None,
        &settings,
        &heuristic,
    );
    assert_eq!(f.outcome.as_str(), "focused");
    assert!(f.functions.iter().any(|n| n == "main"), "{:?}", f.functions);
    let helpers = f.functions.iter().filter(|n| n.starts_with('h')).count();
    assert!(
        (1..=focus::MAX_CALLEES).contains(&helpers),
        "{helpers} helpers sent"
    );
}

/// One helper called hundreds of times leaves room for the next one: the bound counts distinct
/// definitions, and each distinct call is resolved once.
#[test]
fn a_helper_called_many_times_leaves_room_for_the_next() {
    let mut code = String::from("def main():\n");
    for _ in 0..300 {
        code.push_str("    check()\n");
    }
    code.push_str("    validate()\n    raise ValueError('x')\n\n");
    code.push_str("def check():\n    return 1\n\ndef validate():\n    return 2\n");
    // Code the trace does not reach, so the selection is smaller than the file.
    for i in 0..40 {
        code.push_str(&format!(
            "\ndef unrelated_{i}(items):\n    total = 0\n    for item in items:\n        \
             total += item * {i}\n    return total\n"
        ));
    }
    let trace =
        "Traceback (most recent call last):\n  File \"app.py\", line 303, in main\nValueError: x\n";
    let files = vec![focus::SourceFile {
        path: Some("app.py".into()),
        code,
    }];
    let settings = FocusSettings {
        timeout: Duration::from_secs(60),
        ..FocusSettings::default()
    };
    let f = focus::focus(
        &files,
        Some(Lang::Python),
        Some(trace),
        None,
        &settings,
        &heuristic,
    );
    assert_eq!(f.outcome.as_str(), "focused");
    for name in ["main", "check", "validate"] {
        assert!(
            f.functions.iter().any(|n| n == name),
            "{name}: {:?}",
            f.functions
        );
    }
}

/// Code nested a hundred thousand levels deep (classes, or one expression over many lines) is
/// focused or sent whole on a thread with the blocking pool's stack (2 MiB): it never overflows
/// the stack, which would abort the whole gateway.
#[test]
fn deep_nesting_never_overflows_the_stack() {
    let n = 100_000;
    let classes = "class A{".repeat(n) + "void f(){ int x = 1; }" + &"}".repeat(n);
    let mut expr = String::from("int f() {\n  return 1 +\n");
    for _ in 0..n {
        expr.push_str("  1 +\n");
    }
    expr.push_str("  1;\n}\n");
    // Python nests by indentation: a level a space deeper each line, as deep as 1 MiB allows.
    let mut py = String::new();
    let mut level = 0;
    while py.len() + level + 16 < 1_000_000 {
        py.push_str(&" ".repeat(level));
        py.push_str("class A:\n");
        level += 1;
    }
    py.push_str(&" ".repeat(level));
    py.push_str("def f(): pass\n");
    for (path, code) in [("A.java", classes), ("a.c", expr), ("a.py", py)] {
        let trace = format!("at f ({path}:3)\n{path}:3:1: error\n");
        let outcome = std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(move || {
                let files = vec![focus::SourceFile {
                    path: Some(path.into()),
                    code,
                }];
                let settings = FocusSettings {
                    timeout: Duration::from_secs(120),
                    ..FocusSettings::default()
                };
                focus::focus(&files, None, Some(&trace), None, &settings, &heuristic)
                    .outcome
                    .as_str()
            })
            .unwrap()
            .join()
            .expect("focusing returns");
        assert!(!outcome.is_empty());
    }
}

/// Lines are numbered as the language's runtime numbers them, since a trace's line numbers are
/// its: V8 ends a line at U+2028 too (an editor that joined comment lines with it put every
/// frame below three lines off, into another function), and Python at a lone `\r` (a file saved
/// with classic Mac line ends was one line).
#[test]
fn frames_are_found_by_the_runtimes_own_line_numbers() {
    let settings = FocusSettings {
        timeout: Duration::from_secs(60),
        ..FocusSettings::default()
    };
    let js = "// list helpers\u{2028}// written for week 3\u{2028}// by the course team\u{2028}\
              // do not edit\nfunction a() {\n  return 1;\n}\nfunction b(items) {\n  \
              return items[0].name;\n}\nfunction main() {\n  console.log(b([]));\n}\nmain();\n"
        .to_owned()
        + &padding("//");
    let trace = "TypeError: Cannot read properties of undefined (reading 'name')\n    \
                 at b (/home/s/list.js:9:19)\n    at main (/home/s/list.js:12:15)\n";
    let files = [focus::SourceFile {
        path: Some("list.js".into()),
        code: js,
    }];
    let f = focus::focus(&files, None, Some(trace), None, &settings, &heuristic);
    assert!(
        f.functions.iter().any(|n| n == "b"),
        "{:?} {:?}",
        f.outcome,
        f.functions
    );
    let text = f.text.expect("focused");
    assert!(text.contains("9 |   return items[0].name;"), "{text}");

    let py = "def helper():\r    return 1\r\rdef fail(d):\r    return d[\"k\"]\r\rfail({})\r"
        .to_owned()
        + &padding("#").replace('\n', "\r");
    let trace = "Traceback (most recent call last):\n  File \"/home/s/m.py\", line 7, in \
                 <module>\n    fail({})\n  File \"/home/s/m.py\", line 5, in fail\n    \
                 return d[\"k\"]\nKeyError: 'k'\n";
    let files = [focus::SourceFile {
        path: Some("m.py".into()),
        code: py,
    }];
    let f = focus::focus(&files, None, Some(trace), None, &settings, &heuristic);
    assert!(
        f.functions.iter().any(|n| n == "fail"),
        "{:?} {:?}",
        f.outcome,
        f.functions
    );
}

/// Comment lines after the code (starting with `marker`), so that the focused selection is
/// smaller than the whole.
fn padding(marker: &str) -> String {
    (0..200)
        .map(|i| format!("{marker} notes for the week, line {i}: loops, lists and maps\n"))
        .collect()
}
