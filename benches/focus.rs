//! Focusing benchmark (issue 20, M11).
//!
//! 1. **Corpus figures**: every case of `tests/fixtures/focus/` focused with the counter, its
//!    code's tokens whole and focused, and the lane of its course request both ways (the shipped
//!    configuration's thresholds, output budget and template costs; a 160-word course prefix):
//!    the total and median tokens saved, and how many cases move to a cheaper lane.
//! 2. **Focus time**: p50 / p99 of one request's focusing (parse, select, render, count) for
//!    generated Python, TypeScript and C++ files of 200, 2,000 and 10,000 lines, each with a
//!    three-frame stack trace: as shipped (only the definitions the trace can reach are
//!    parsed; the share of the file parsed is shown) and, side by side, parsing the whole file.
//! 3. **The corpus's long files**: the same two timings for each case over 300 lines.
//!
//! Run: `cargo bench -p tutor-gateway --bench focus`. Counts come from `TOKENIZER=path/to/
//! tokenizer.json` (a real vocabulary, e.g. Qwen 2.5's that `scripts/bench-overhead` fetches
//! into `target/bench-tokenizer-qwen2_5/`), or the shipped configuration's heuristic. Under
//! `cargo test --benches` (no `--bench` flag) it runs a few iterations only.

#[path = "../tests/focus_cases/mod.rs"]
mod focus_cases;

use std::time::{Duration, Instant};

use serde_json::json;
use tutor_gateway::classify::{ChatMessage, Classifier, PromptInput, TokenCounter};
use tutor_gateway::config::Config;
use tutor_gateway::prompt::focus::{self, FocusSettings, Lang, SourceFile};
use tutor_gateway::prompt::{student_messages, Course, StudentMaterial};
use tutor_wire::stats::nearest_rank;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let bench_mode = args.iter().any(|a| a == "--bench") && !args.iter().any(|a| a == "--test");
    let counter = match std::env::var_os("TOKENIZER") {
        Some(path) => {
            TokenCounter::from_file(std::path::Path::new(&path)).expect("TOKENIZER loads")
        }
        None => TokenCounter::Heuristic,
    };
    let source = std::env::var("TOKENIZER").unwrap_or_else(|_| "the heuristic".into());
    println!("# Focusing benchmark\n\nToken counts: {source}.\n");
    corpus(&counter);
    timing(&counter, bench_mode);
    long_cases(&counter, bench_mode);
}

/// Focus time for the corpus's files over 300 lines (student-style code), as shipped and
/// parsing the whole file.
fn long_cases(counter: &TokenCounter, bench_mode: bool) {
    println!("\n## Focus time, the corpus's long files\n");
    println!("| case | lines | outcome | parsed | p50 | p99 | p50 whole parse | p99 whole parse |");
    println!("|---|---:|---|---:|---:|---:|---:|---:|");
    let iters = if bench_mode { 300 } else { 3 };
    for case in focus_cases::load() {
        let lines: usize = case.files.iter().map(|f| f.code.lines().count()).sum();
        if lines <= 300 {
            continue;
        }
        let settings = FocusSettings {
            depth: case.spec.depth.unwrap_or(focus::DEPTH),
            token_target: case.spec.token_target.unwrap_or(focus::TOKEN_TARGET),
            timeout: Duration::from_secs(5),
            ..FocusSettings::default()
        };
        let ((times, f), (whole, _)) = both_ways(iters, &settings, &case.name, &|s| {
            focus::focus(
                &case.files,
                case.lang,
                case.spec.trace.as_deref(),
                case.spec.question.as_deref(),
                s,
                &|t| counter.count_text(t),
            )
        });
        let bytes: usize = case.files.iter().map(|f| f.code.len()).sum();
        println!(
            "| {} | {lines} | {} | {:.0}% | {} | {} | {} | {} |",
            case.name,
            f.outcome.as_str(),
            100.0 * f.parsed_bytes as f64 / bytes as f64,
            ms(percentile(&times, 0.5)),
            ms(percentile(&times, 0.99)),
            ms(percentile(&whole, 0.5)),
            ms(percentile(&whole, 0.99)),
        );
    }
}

fn corpus(counter: &TokenCounter) {
    let config = Config::default();
    let classifier = Classifier::with_counter(&config, counter.clone());
    let course = Course::build(
        "py101",
        "2026.1",
        &"You are a patient programming tutor for first-year students. Give hints before \
          answers, point at the line that fails, and never write the whole solution. "
            .repeat(4),
        "Correctness first, then readability, then style.",
        "Refuse to complete graded exams.",
        None,
    );
    let settings = FocusSettings {
        timeout: Duration::from_secs(5),
        ..FocusSettings::default()
    };
    let count = |t: &str| counter.count_text(t);
    println!("## Corpus\n");
    println!("| case | outcome | code tokens | sent | saved | lane whole | lane focused |");
    println!("|---|---|---:|---:|---:|---|---|");
    let (mut saved_all, mut cheaper, mut focused) = (Vec::new(), 0, 0);
    let cases = focus_cases::load();
    for case in &cases {
        let f = focus::focus(
            &case.files,
            case.lang,
            case.spec.trace.as_deref(),
            case.spec.question.as_deref(),
            &FocusSettings {
                depth: case.spec.depth.unwrap_or(settings.depth),
                token_target: case.spec.token_target.unwrap_or(settings.token_target),
                ..settings.clone()
            },
            &count,
        );
        let mut material = StudentMaterial {
            question: case
                .spec
                .question
                .clone()
                .or(Some("Why does this fail?".into())),
            stack_trace: case.spec.trace.clone(),
            language: case.lang,
            ..StudentMaterial::default()
        };
        match case.files.as_slice() {
            [one] => {
                material.code = Some(one.code.clone());
                material.path = one.path.clone();
            }
            many => material.files = many.to_vec(),
        }
        let lane = |m: &StudentMaterial| {
            let messages: Vec<ChatMessage> =
                serde_json::from_value(json!(course.messages(&student_messages(m)))).unwrap();
            classifier
                .classify_blocking(&PromptInput::chat(messages, None, 16_384), None)
                .map(|c| c.lane)
        };
        let whole = lane(&material);
        material.focused = f.text.clone();
        let after = lane(&material);
        let (Ok(whole), Ok(after)) = (whole, after) else {
            println!(
                "| {} | {} | (too long for the model) | | | | |",
                case.name,
                f.outcome.as_str()
            );
            continue;
        };
        if after.index() < whole.index() {
            cheaper += 1;
        }
        focused += usize::from(f.text.is_some());
        saved_all.push(f.saved());
        println!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            case.name,
            f.outcome.as_str(),
            f.original_tokens.unwrap_or(0),
            f.sent_tokens.unwrap_or(0),
            f.saved(),
            whole.as_str(),
            after.as_str()
        );
    }
    let total: u64 = saved_all.iter().map(|&s| u64::from(s)).sum();
    let mut sorted = saved_all.clone();
    sorted.sort_unstable();
    let median = |v: &[u32]| if v.is_empty() { 0 } else { v[v.len() / 2] };
    let focused_only: Vec<u32> = sorted.iter().copied().filter(|&s| s > 0).collect();
    println!(
        "\n{} cases, {focused} focused: {total} tokens saved in all, median {} per case ({} over the \
         focused cases); {cheaper} cases move to a cheaper lane.\n",
        cases.len(),
        median(&sorted),
        median(&focused_only)
    );
}

/// A generated file of about `lines` lines in `lang`, and a stack trace into it.
fn generated(lang: Lang, lines: usize) -> (SourceFile, String) {
    let mut code = String::new();
    let mut i = 0;
    let block = |lang: Lang, i: usize| -> String {
        match lang {
            Lang::Python => format!(
                "class Record{i}:\n    def __init__(self, key, size=0):\n        self.key = key\n        self.size = size\n        self.tags = []\n\n    def grow(self, by):\n        if by < 0:\n            raise ValueError(\"negative\")\n        self.size += by\n        return self.size\n\n    def label(self):\n        return f\"{{self.key}}-{{self.size}}-{i}\"\n\n\ndef total_{i}(records):\n    return sum(r.size for r in records if r.size > {i})\n\n\n"
            ),
            Lang::TypeScript => format!(
                "export class Record{i} {{\n  private tags: string[] = [];\n  constructor(private key: string, private size = 0) {{}}\n\n  grow(by: number): number {{\n    if (by < 0) {{\n      throw new Error(\"negative\");\n    }}\n    this.size += by;\n    return this.size;\n  }}\n\n  label(): string {{\n    return `${{this.key}}-${{this.size}}-{i}`;\n  }}\n}}\n\nexport function total{i}(records: Record{i}[]): number {{\n  return records.reduce((s, r) => s + r.grow(0), {i});\n}}\n\n"
            ),
            _ => format!(
                "class Record{i} {{\npublic:\n    explicit Record{i}(std::string key, int size = 0) : key_(std::move(key)), size_(size) {{}}\n\n    int grow(int by) {{\n        if (by < 0) {{\n            throw std::invalid_argument(\"negative\");\n        }}\n        size_ += by;\n        return size_;\n    }}\n\n    std::string label() const {{ return key_ + \"-\" + std::to_string(size_); }}\n\nprivate:\n    std::string key_;\n    int size_;\n}};\n\nint total{i}(std::vector<Record{i}>& records) {{\n    int sum = {i};\n    for (auto& r : records) sum += r.grow(0);\n    return sum;\n}}\n\n"
            ),
        }
    };
    while code.lines().count() + 20 < lines {
        code.push_str(&block(lang, i));
        i += 1;
    }
    let (tail, path) = match lang {
        Lang::Python => ("def helper(xs):\n    return xs[len(xs)]\n\n\ndef run(xs):\n    return helper(xs) + total_0([])\n\n\nrun([1, 2])\n", "app.py"),
        Lang::TypeScript => ("export function helper(xs: number[]): number {\n  return xs[xs.length].valueOf();\n}\n\nexport function run(xs: number[]): number {\n  return helper(xs) + total0([]);\n}\n\nrun([1, 2]);\n", "app.ts"),
        _ => ("int helper(std::vector<int>& xs) {\n    return xs.at(xs.size());\n}\n\nint run(std::vector<int>& xs) {\n    std::vector<Record0> none;\n    return helper(xs) + total0(none);\n}\n\nint main() {\n    std::vector<int> xs{1, 2};\n    return run(xs);\n}\n", "app.cpp"),
    };
    if lang == Lang::Cpp {
        code.insert_str(
            0,
            "#include <stdexcept>\n#include <string>\n#include <vector>\n\n",
        );
    }
    code.push_str(tail);
    let line_of = |needle: &str| code.lines().position(|l| l.contains(needle)).unwrap() + 1;
    let trace = match lang {
        Lang::Python => format!(
            "Traceback (most recent call last):\n  File \"/s/app.py\", line {}, in <module>\n  File \"/s/app.py\", line {}, in run\n  File \"/s/app.py\", line {}, in helper\nIndexError: list index out of range",
            line_of("run([1, 2])"), line_of("return helper(xs)"), line_of("return xs[len(xs)]")
        ),
        Lang::TypeScript => format!(
            "TypeError: Cannot read properties of undefined (reading 'valueOf')\n    at helper (/s/app.ts:{}:22)\n    at run (/s/app.ts:{}:10)\n    at Object.<anonymous> (/s/app.ts:{}:1)",
            line_of("xs[xs.length]"), line_of("return helper(xs)"), line_of("run([1, 2]);")
        ),
        _ => format!(
            "terminate called after throwing an instance of 'std::out_of_range'\n(gdb) bt\n#4  0x0000555555555a1e in helper (xs=...) at app.cpp:{}\n#5  0x0000555555555b2e in run (xs=...) at app.cpp:{}\n#6  0x0000555555555c3e in main () at app.cpp:{}",
            line_of("xs.at(xs.size())"), line_of("return helper(xs)"), line_of("return run(xs);")
        ),
    };
    (
        SourceFile {
            path: Some(path.into()),
            code,
        },
        trace,
    )
}

/// `iters` sorted timings of `run` as shipped and, after them, with the whole file parsed,
/// each with its last result; the two must select the same.
fn both_ways(
    iters: usize,
    settings: &FocusSettings,
    what: &str,
    run: &dyn Fn(&FocusSettings) -> focus::Focus,
) -> ((Vec<Duration>, focus::Focus), (Vec<Duration>, focus::Focus)) {
    let timed = |settings: &FocusSettings| {
        let mut times: Vec<Duration> = Vec::with_capacity(iters);
        let mut last = None;
        for _ in 0..iters {
            let started = Instant::now();
            let f = run(settings);
            times.push(started.elapsed());
            last = Some(f);
        }
        times.sort_unstable();
        (times, last.expect("at least one iteration"))
    };
    let shipped = timed(settings);
    let whole = timed(&FocusSettings {
        whole_parse: true,
        ..settings.clone()
    });
    assert_eq!(
        shipped.1.text, whole.1.text,
        "{what}: the same selection either way"
    );
    (shipped, whole)
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    nearest_rank(sorted, p).expect("samples")
}

fn timing(counter: &TokenCounter, bench_mode: bool) {
    println!("## Focus time\n");
    println!("| language | lines | bytes | outcome | code tokens | sent | parsed | p50 | p99 | p50 whole parse | p99 whole parse |");
    println!("|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|");
    let settings = FocusSettings {
        timeout: Duration::from_secs(5),
        ..FocusSettings::default()
    };
    for lang in [Lang::Python, Lang::TypeScript, Lang::Cpp] {
        for lines in [200, 2_000, 10_000] {
            let (file, trace) = generated(lang, lines);
            let files = [file];
            let iters = match (bench_mode, lines) {
                (false, _) => 3,
                (true, 10_000) => 60,
                (true, _) => 300,
            };
            let what = format!("{} {lines}", lang.as_str());
            let ((times, f), (whole, _)) = both_ways(iters, &settings, &what, &|s| {
                focus::focus(&files, None, Some(&trace), None, s, &|t| {
                    counter.count_text(t)
                })
            });
            let bytes = files[0].code.len();
            println!(
                "| {} | {} | {} | {} | {} | {} | {:.0}% | {} | {} | {} | {} |",
                lang.as_str(),
                files[0].code.lines().count(),
                bytes,
                f.outcome.as_str(),
                f.original_tokens.unwrap_or(0),
                f.sent_tokens.unwrap_or(0),
                100.0 * f.parsed_bytes as f64 / bytes as f64,
                ms(percentile(&times, 0.5)),
                ms(percentile(&times, 0.99)),
                ms(percentile(&whole, 0.5)),
                ms(percentile(&whole, 0.99)),
            );
        }
    }
}
