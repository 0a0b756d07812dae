//! Classification benchmark (issue 3): the seed's three request kinds with a real tokenizer.
//!
//! At start this trains a byte-level BPE tokenizer (vocab 8,000) on ~400 KB of generated
//! tutoring text (Rust, Python and TypeScript code, tracebacks, compiler errors, English
//! questions) into a temp dir, loads it with `TokenCounter::from_file`, and builds three chat
//! requests sized with that tokenizer:
//!
//! - small: code explanation, ~300 input tokens + 120 max output tokens, twice: mostly code
//!   (dense, ~2.8 bytes a token: byte length settles it) and a short snippet with a longer
//!   question in prose, sized to 1,100 bytes so the upper bound no longer settles it and it is
//!   tokenized (the worst case for a seed-sized small request);
//! - medium: debugging with ~2,000 tokens of context + 300 output;
//! - large: project review with ~8,000 tokens + 500 output.
//!
//! Then, per kind, criterion benchmarks `Classifier::classify_blocking` and the async
//! `Classifier::classify` (on a multi-thread tokio runtime, as the gateway runs it), and a manual
//! loop prints p50/p99 in a Markdown table, with the lane, whether it was decided by tokenizing
//! (`exact`) or from byte length, and the reservation (`work`) against the exact token count.
//!
//! Run: `cargo bench -p tutor-gateway --bench classify`; `TOKENIZER=path/tokenizer.json` uses a
//! real vocabulary instead of the trained one. Under `cargo test --benches` (no
//! `--bench` flag) it trains a smaller tokenizer and runs a few iterations only.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{black_box, BenchmarkId, Criterion};
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::models::TrainerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::Tokenizer;
use tutor_gateway::classify::{
    bounds, Classification, Classifier, PromptInput, TemplateCosts, TokenCounter,
};
use tutor_gateway::config::Config;
use tutor_gateway::lane::Lane;
use tutor_testkit::bench::smallest_enough;
use tutor_wire::stats::nearest_rank;
use tutor_wire::stats::SplitMix as Rng;

// ---------------------------------------------------------------------------------------------
// Generated tutoring text
// ---------------------------------------------------------------------------------------------

const WORDS: &[&str] = &[
    "user", "item", "order", "count", "total", "price", "config", "path", "file", "index", "list",
    "node", "tree", "cache", "request", "response", "token", "buffer", "value", "result", "error",
    "state", "queue", "score", "name", "data", "record", "event", "session", "student", "lesson",
    "grade", "answer", "question", "course", "matrix", "graph", "edge", "vertex", "string",
    "number", "key", "entry", "table", "column", "row", "message", "channel", "task", "worker",
    "timer", "limit", "offset", "page", "batch", "input", "output", "line", "word",
];

/// An identifier of 1-3 words in the given style.
fn ident(rng: &mut Rng, style: char) -> String {
    let n = 1 + rng.below(3);
    let parts: Vec<&str> = (0..n).map(|_| rng.pick(WORDS)).collect();
    let cap = |w: &str| {
        let mut c = w.chars();
        c.next()
            .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
            .unwrap_or_default()
    };
    match style {
        's' => parts.join("_"),
        'c' => {
            let mut s = parts[0].to_string();
            parts[1..].iter().for_each(|p| s.push_str(&cap(p)));
            s
        }
        _ => parts.iter().map(|p| cap(p)).collect(),
    }
}

/// Fills `{s1}`..`{s3}` (snake_case), `{c1}`..`{c3}` (camelCase), `{T}` (a type), `{w}`/`{W}`
/// (nouns) and `{n}`/`{n2}` (numbers); each placeholder has one value per instance.
fn fill(rng: &mut Rng, template: &str) -> String {
    let mut out = template.to_string();
    for (key, style) in [
        ("{s1}", 's'),
        ("{s2}", 's'),
        ("{s3}", 's'),
        ("{c1}", 'c'),
        ("{c2}", 'c'),
        ("{c3}", 'c'),
        ("{T}", 'T'),
    ] {
        if out.contains(key) {
            out = out.replace(key, &ident(rng, style));
        }
    }
    for key in ["{w}", "{W}"] {
        if out.contains(key) {
            out = out.replace(key, rng.pick(WORDS));
        }
    }
    for key in ["{n}", "{n2}"] {
        if out.contains(key) {
            let n = match rng.below(3) {
                0 => rng.below(10),
                1 => rng.below(200),
                _ => rng.below(100_000),
            };
            out = out.replace(key, &n.to_string());
        }
    }
    out
}

const CODE: &[&str] = &[
    "pub fn {s1}(&self, {s2}: &[{T}]) -> Result<u64, {T}Error> {
    let mut total = 0u64;
    for item in {s2}.iter().filter(|x| x.{s3} > {n}) {
        total += item.{s3} as u64;
    }
    Ok(total)
}",
    "#[derive(Debug, Clone, PartialEq)]
pub struct {T} {
    pub {s1}: String,
    pub {s2}: Vec<u32>,
    {s3}: Option<usize>,
}",
    "impl {T} {
    pub fn new({s1}: &str) -> Self {
        Self { {s1}: {s1}.to_string(), {s2}: Vec::with_capacity({n}), {s3}: None }
    }
}",
    "    let {s1} = match self.{s2}.get(&{s3}) {
        Some(v) if v.len() > {n} => return Err(anyhow!(\"{w} too long: {}\", v.len())),
        Some(v) => v.clone(),
        None => Default::default(),
    };",
    "def {s1}({s2}, {s3}={n}):
    \"\"\"Return the {w} of each {W} in {s2}.\"\"\"
    result = []
    for i, item in enumerate({s2}):
        if item.{s3} is None:
            continue
        result.append(item.{s3} * i)
    return result",
    "class {T}:
    def __init__(self, {s1}, {s2}=None):
        self.{s1} = {s1}
        self.{s2} = {s2} or []

    def __repr__(self):
        return f\"{T}({self.{s1}!r}, {len(self.{s2})})\"",
    "export async function {c1}({c2}: {T}[]): Promise<number> {
  const res = await fetch(`/api/{w}/${{c2}.length}`);
  if (!res.ok) throw new Error(`{w} failed: ${res.status}`);
  const data = await res.json();
  return data.{c3} ?? {n};
}",
    "const {c1} = {c2}.filter((x) => x.{c3} > {n}).map((x) => ({ ...x, {c3}: x.{c3} * 2 }));
console.log(\"{w}\", {c1}.length);",
    "for (let i = 0; i < {c1}.length; i++) {
  if ({c1}[i].{c2} === undefined) {
    {c3}.push(i);
  }
}",
];

const DIAGNOSTICS: &[&str] = &[
    "Traceback (most recent call last):
  File \"/home/student/{s1}/main.py\", line {n}, in <module>
    {s2} = {s1}(data[\"{w}\"])
  File \"/home/student/{s1}/{s3}.py\", line {n2}, in {s1}
    return total / len({s2})
ZeroDivisionError: division by zero",
    "error[E0502]: cannot borrow `{s1}` as mutable because it is also borrowed as immutable
  --> src/{s2}.rs:{n}:9
   |
   |     let first = &{s1}[0];
   |                  ---- immutable borrow occurs here
   |     {s1}.push({n2});
   |     ^^^^^^^^^^^^^^^ mutable borrow occurs here",
    "src/{c1}.ts:{n}:{n2} - error TS2322: Type 'string' is not assignable to type 'number'.
    {c2}.{c3} = input.value;",
    "thread 'main' panicked at src/{s1}.rs:{n}:{n2}:
index out of bounds: the len is {n2} but the index is {n}",
];

const PROSE: &[&str] = &[
    "Why does my {w} loop stop after {n} iterations when the list has more {W}s?",
    "I think the problem is that `{s1}` is called before `{s2}` is initialized, so the {w} is still empty.",
    "Can you explain the difference between a {w} and a {W} in this context?",
    "The function `{c1}` should return the total {w}, but it returns zero whenever the input has more than {n} entries.",
    "In my course we learned that recursion uses the call stack, but I don't understand why this version runs out of memory.",
    "My teacher said I should avoid global state. How would I refactor `{s1}` to pass the {w} as a parameter instead?",
    "When I run the tests, {n} of them fail with the same message about the {w} being out of range.",
    "This works on my laptop but not on the school server, which runs an older version of Python.",
    "Here is what I tried so far: I added a print statement before the return and the {w} looks correct there.",
    "Is it better to use a hash map or a sorted vector for looking up {W}s by name?",
    "The assignment asks us to implement a {w} cache with a fixed capacity of {n} items and least-recently-used eviction.",
    "I'm not sure whether the bug is in `{T}::new` or in the way I call it from the main function.",
    "Could you walk me through what happens step by step when `{c1}` is awaited inside the loop?",
    "We are supposed to explain the time complexity, and I think it is O(n log n) because of the sort, but I'm not confident.",
    "The output should be sorted by {w}, then by {W}, but ties are printed in a random order.",
    "After I changed the type of `{s1}` from an integer to a string, the comparison no longer works as expected.",
    "Please point out any other problems you see, including style issues and missing error handling.",
    "What does the question mark operator do at the end of this line, and why does the compiler require it here?",
    "The {w} module reads every {W} from disk on each request, which is why the page takes {n} milliseconds to load.",
    "I renamed `{s1}` to `{s2}` everywhere, but the old name still shows up in the error message.",
];

/// One block: a paragraph of prose, a fenced code snippet or a diagnostic.
fn block(rng: &mut Rng, code_only: bool) -> String {
    let kind = if code_only { 4 } else { rng.below(10) };
    match kind {
        0..=3 => {
            let sentences = 2 + rng.below(4);
            (0..sentences)
                .map(|_| {
                    let t = rng.pick(PROSE);
                    fill(rng, t)
                })
                .collect::<Vec<_>>()
                .join(" ")
        }
        4..=8 => {
            let t = rng.pick(CODE);
            fill(rng, t)
        }
        _ => {
            let t = rng.pick(DIAGNOSTICS);
            fill(rng, t)
        }
    }
}

/// At least `bytes` bytes of generated blocks separated by blank lines.
fn generated_text(seed: u64, bytes: usize, code_only: bool) -> String {
    let mut rng = Rng::new(seed);
    let mut out = String::with_capacity(bytes + 1024);
    while out.len() < bytes {
        out.push_str(&block(&mut rng, code_only));
        out.push_str("\n\n");
    }
    out
}

/// `n` prose sentences, one per line.
fn prose_lines(seed: u64, n: usize) -> String {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|_| {
            let t = rng.pick(PROSE);
            fill(&mut rng, t)
        })
        .collect::<Vec<_>>()
        .join("\n")
}

// ---------------------------------------------------------------------------------------------
// Tokenizer
// ---------------------------------------------------------------------------------------------

/// Trains a byte-level BPE on generated text and saves it as `dir/tokenizer.json`.
fn train_tokenizer(dir: &Path, corpus_bytes: usize, vocab: usize) -> PathBuf {
    let mut tokenizer = Tokenizer::new(BPE::default());
    tokenizer.with_pre_tokenizer(Some(ByteLevel::default()));
    tokenizer.with_decoder(Some(ByteLevel::default()));
    let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
        .show_progress(false)
        .vocab_size(vocab)
        .min_frequency(2)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build()
        .into();
    let corpus = generated_text(1, corpus_bytes, false);
    tokenizer
        .train(&mut trainer, corpus.lines())
        .expect("training the benchmark BPE");
    std::fs::create_dir_all(dir).expect("creating the tokenizer temp dir");
    let path = dir.join("tokenizer.json");
    tokenizer.save(&path, false).expect("saving tokenizer.json");
    path
}

// ---------------------------------------------------------------------------------------------
// Request kinds
// ---------------------------------------------------------------------------------------------

struct Kind {
    name: &'static str,
    input: Arc<PromptInput>,
    max_output: u32,
    /// Input tokens counted with the tokenizer, template overhead included.
    exact_input_tokens: u32,
    bytes: u64,
    messages: usize,
}

fn chat(system: &str, user: &str) -> PromptInput {
    let messages = serde_json::json!([
        {"role": "system", "content": system},
        {"role": "user", "content": user},
    ]);
    PromptInput::chat(
        serde_json::from_value(messages).expect("chat messages"),
        None,
        16_384,
    )
}

fn exact_tokens(counter: &TokenCounter, overhead: TemplateCosts, input: &PromptInput) -> u32 {
    counter.count_input(input) + input.template_overhead(overhead)
}

/// How far [`sized_kind`] grows a request.
#[derive(Clone, Copy)]
enum Target {
    /// At least this many input tokens (template overhead included).
    Tokens(u32),
    /// At least this many text bytes.
    Bytes(u64),
}

/// A chat request whose user message is `head` + the fewest lines of `body` (+ `tail`) that
/// reach `target`.
#[allow(clippy::too_many_arguments)]
fn sized_kind(
    name: &'static str,
    counter: &TokenCounter,
    overhead: TemplateCosts,
    system: &str,
    head: &str,
    body: &str,
    tail: &str,
    target: Target,
    max_output: u32,
) -> Kind {
    let lines: Vec<&str> = body.lines().collect();
    let build = |n: usize| chat(system, &format!("{head}{}{tail}", lines[..n].join("\n")));
    let enough = |n: usize| {
        let input = build(n);
        match target {
            Target::Tokens(t) => exact_tokens(counter, overhead, &input) >= t,
            Target::Bytes(b) => input.text_bytes_and_pieces().0 >= b,
        }
    };
    assert!(enough(lines.len()), "{name}: body too short");
    let high = smallest_enough(0, lines.len(), enough);
    let input = build(high);
    Kind {
        name,
        exact_input_tokens: exact_tokens(counter, overhead, &input),
        bytes: input.text_bytes_and_pieces().0,
        messages: 2,
        input: Arc::new(input),
        max_output,
    }
}

fn kinds(counter: &TokenCounter, overhead: TemplateCosts) -> Vec<Kind> {
    let tutor = "You are a patient programming tutor. Explain what the student's code does in \
                 plain language, step by step, and keep the answer short.";
    // Mostly code (short, indented lines: ~2.8 bytes a token).
    let small_code = sized_kind(
        "small (code)",
        counter,
        overhead,
        tutor,
        "Can you explain what this code does? I found it in our course repository.\n\n```\n",
        &generated_text(11, 8_000, true),
        "\n```",
        Target::Tokens(300),
        120,
    );
    // A short snippet and a longer question in prose, sized by bytes so that it gets tokenized.
    let small_prose = sized_kind(
        "small (prose+code)",
        counter,
        overhead,
        tutor,
        &format!(
            "I don't understand this function from my course:\n\n```\n{}\n```\n\n",
            generated_text(14, 1, true).trim_end()
        ),
        &prose_lines(15, 60),
        "\n\nPlease explain it like I'm a beginner.",
        // Just over the bytes at which the upper bound (1 token a byte) stops settling the
        // small lane for 120 output tokens: the smallest seed-sized request that is tokenized.
        Target::Bytes(1_100),
        120,
    );
    let medium = sized_kind(
        "medium",
        counter,
        overhead,
        "You are a programming tutor helping a student debug. Find the cause of the error, \
         explain it, and suggest a minimal fix without rewriting the whole program.",
        "I'm stuck on this bug for two days. Here is my code, the error and what I tried:\n\n",
        &generated_text(12, 40_000, false),
        "\n\nWhat is wrong, and how do I fix it?",
        Target::Tokens(2_000),
        300,
    );
    let large = sized_kind(
        "large",
        counter,
        overhead,
        "You are a senior engineer reviewing a student's final project. Comment on structure, \
         correctness, error handling, tests and style, file by file, and end with a summary.",
        "Please review my whole project. All files follow.\n\n",
        &generated_text(13, 120_000, false),
        "\n\nThanks for reviewing!",
        Target::Tokens(8_000),
        500,
    );
    vec![small_code, small_prose, medium, large]
}

// ---------------------------------------------------------------------------------------------
// Measurement
// ---------------------------------------------------------------------------------------------

/// p50 and p99 of `samples` in microseconds.
fn percentiles(mut samples: Vec<Duration>) -> (f64, f64) {
    samples.sort_unstable();
    let at = |q: f64| nearest_rank(&samples, q).expect("samples").as_secs_f64() * 1e6;
    (at(0.50), at(0.99))
}

fn time_blocking(c: &Classifier, k: &Kind, warmup: usize, iters: usize) -> (f64, f64) {
    for _ in 0..warmup {
        black_box(c.classify_blocking(&k.input, Some(k.max_output)).unwrap());
    }
    let samples = (0..iters)
        .map(|_| {
            let start = Instant::now();
            black_box(c.classify_blocking(&k.input, Some(k.max_output)).unwrap());
            start.elapsed()
        })
        .collect();
    percentiles(samples)
}

/// Times `classify().await` from a task on a runtime worker, as a gateway handler calls it.
fn time_async(
    rt: &tokio::runtime::Runtime,
    c: &Classifier,
    k: &Kind,
    warmup: usize,
    iters: usize,
) -> (f64, f64) {
    let (c, input, out) = (c.clone(), k.input.clone(), k.max_output);
    let samples = rt
        .block_on(rt.spawn(async move {
            for _ in 0..warmup {
                black_box(c.classify(input.clone(), Some(out)).await.unwrap());
            }
            let mut samples = Vec::with_capacity(iters);
            for _ in 0..iters {
                let start = Instant::now();
                black_box(c.classify(input.clone(), Some(out)).await.unwrap());
                samples.push(start.elapsed());
            }
            samples
        }))
        .expect("timing task");
    percentiles(samples)
}

/// The tokenizer's own `encode` of every text piece (its regular-expression pre-tokenizer).
fn time_encode(tok: &Tokenizer, k: &Kind, warmup: usize, iters: usize) -> (f64, f64) {
    let run = || {
        k.input.for_each_text(|t| {
            black_box(tok.encode_fast(t, false).expect("encode"));
        })
    };
    for _ in 0..warmup {
        run();
    }
    let samples = (0..iters)
        .map(|_| {
            let start = Instant::now();
            run();
            start.elapsed()
        })
        .collect();
    percentiles(samples)
}

fn time_tokenize(counter: &TokenCounter, k: &Kind, warmup: usize, iters: usize) -> (f64, f64) {
    for _ in 0..warmup {
        black_box(counter.count_input(&k.input));
    }
    let samples = (0..iters)
        .map(|_| {
            let start = Instant::now();
            black_box(counter.count_input(&k.input));
            start.elapsed()
        })
        .collect();
    percentiles(samples)
}

fn criterion_benches(
    criterion: &mut Criterion,
    rt: &tokio::runtime::Runtime,
    c: &Classifier,
    kinds: &[Kind],
) {
    for k in kinds {
        // "small (prose+code)" -> "small_prose_code"
        let id: String = k
            .name
            .chars()
            .filter_map(|ch| match ch {
                'a'..='z' => Some(ch),
                ' ' | '+' => Some('_'),
                _ => None,
            })
            .collect();
        let mut group = criterion.benchmark_group(format!("classify/{id}"));
        let out = Some(k.max_output);
        group.bench_function(BenchmarkId::from_parameter("blocking"), |b| {
            b.iter(|| c.classify_blocking(black_box(&k.input), out).unwrap())
        });
        group.bench_function(BenchmarkId::from_parameter("async"), |b| {
            b.iter_custom(|iters| {
                let (c, input) = (c.clone(), k.input.clone());
                rt.block_on(rt.spawn(async move {
                    let start = Instant::now();
                    for _ in 0..iters {
                        black_box(c.classify(input.clone(), out).await.unwrap());
                    }
                    start.elapsed()
                }))
                .expect("bench task")
            })
        });
        group.finish();
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let bench_mode = args.iter().any(|a| a == "--bench") && !args.iter().any(|a| a == "--test");
    let (corpus_bytes, vocab, warmup, iters) = if bench_mode {
        (400_000, 8_000, 200, 2_000)
    } else {
        (60_000, 2_000, 2, 20)
    };

    // TOKENIZER=/path/to/tokenizer.json: a real vocabulary instead of the trained one.
    let given = std::env::var_os("TOKENIZER").map(PathBuf::from);
    let dir = std::env::temp_dir().join(format!("tutor-gateway-bench-{}", std::process::id()));
    let started = Instant::now();
    let path = match &given {
        Some(path) => path.clone(),
        None => train_tokenizer(&dir, corpus_bytes, vocab),
    };
    let counter = TokenCounter::from_file(&path).expect("loading the tokenizer");
    let direct = Tokenizer::from_file(&path).expect("loading the tokenizer");
    let trained_in = started.elapsed();
    let _ = std::fs::remove_dir_all(&dir);

    let config = Config::default();
    let overhead = TemplateCosts {
        per_message: config.classify.per_message_overhead,
        image_part: config.classify.image_part_tokens,
        image_token_pixels: config.classify.image_token_pixels,
        image_min_tokens: config.classify.image_min_tokens,
        audio_part: config.classify.audio_part_tokens,
        video_part: config.classify.video_part_tokens,
    };
    let classifier = Classifier::with_counter(&config, counter.clone());
    let kinds = kinds(&counter, overhead);

    let source = match &given {
        Some(path) => format!(
            "{} (loaded in {:.1} s)",
            path.display(),
            trained_in.as_secs_f64()
        ),
        None => format!(
            "byte-level BPE, vocab {vocab}, trained on {} KB of generated code+English in {:.1} s",
            corpus_bytes / 1000,
            trained_in.as_secs_f64()
        ),
    };
    println!(
        "tokenizer: {source}; thresholds small <= {}, medium <= {} work tokens; max_model_len {}",
        config.classify.small_max_work,
        config.classify.medium_max_work,
        config.upstream.max_model_len,
    );
    for k in &kinds {
        println!(
            "{}: {} messages, {} bytes, {} input tokens (exact, overhead incl.), {:.2} bytes/token, max output {}",
            k.name,
            k.messages,
            k.bytes,
            k.exact_input_tokens,
            k.bytes as f64 / f64::from(k.exact_input_tokens),
            k.max_output
        );
    }

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");

    let mut criterion = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .configure_from_args();
    criterion_benches(&mut criterion, &rt, &classifier, &kinds);

    // Manual p50/p99 loop and the table.
    let expected = [Lane::Small, Lane::Small, Lane::Medium, Lane::Large];
    let mut decisions = Vec::new();
    let mut timings = Vec::new();
    for (k, want) in kinds.iter().zip(expected) {
        let got: Classification = classifier
            .classify_blocking(&k.input, Some(k.max_output))
            .unwrap();
        assert_eq!(got.lane, want, "{}: {got:?}", k.name);
        let blocking = time_blocking(&classifier, k, warmup, iters);
        let asynchronous = time_async(&rt, &classifier, k, warmup, iters);
        let tokenize = time_tokenize(&counter, k, warmup.min(20), iters.min(200));
        let encoded = time_encode(&direct, k, warmup.min(20), iters.min(200));
        decisions.push((k, got));
        timings.push((k, blocking, asynchronous, tokenize, encoded));
    }
    assert!(
        decisions[3].1.exact(),
        "the large kind is counted: it reserves what it holds"
    );

    // The merges' bound never undercounts: on each kind and on 2,000 slices of generated text.
    let overhead_of = |k: &Kind| k.input.template_overhead(overhead);
    for k in &kinds {
        if let Some(bound) = counter.pair_bound(&k.input) {
            let text_tokens = u64::from(k.exact_input_tokens - overhead_of(k));
            assert!(
                bound >= text_tokens,
                "{}: bound {bound} < {text_tokens}",
                k.name
            );
            println!(
                "{}: pair bound {bound} tokens for {text_tokens} real ({:.2} a byte)",
                k.name,
                bound as f64 / k.bytes as f64
            );
        }
    }
    // ...and the hand-written pre-tokenizer counts exactly what `encode` counts.
    let encode = |text: &str| direct.encode_fast(text, false).expect("encode").len() as u64;
    let text = generated_text(21, 200_000, false);
    let mut rng = Rng::new(22);
    for _ in 0..2_000 {
        let start = rng.below(text.len() - 4_000);
        let end = start + 1 + rng.below(4_000);
        let Some(slice) = text.get(start..end) else {
            continue;
        };
        let input = PromptInput::Prompt(slice.to_string());
        let real = encode(slice);
        assert_eq!(u64::from(counter.count_input(&input)), real, "{slice:?}");
        if let Some(bound) = counter.pair_bound(&input) {
            assert!(bound >= real, "bound {bound} < {real} for {slice:?}");
        }
    }

    println!();
    println!(
        "| kind | input tokens (exact) | max output | bytes | lane | decided by | reservation (`work`) | exact work | reservation error |"
    );
    println!("|---|---:|---:|---:|---|---|---:|---:|---:|");
    for (k, got) in &decisions {
        let exact_work = k.exact_input_tokens + k.max_output;
        let by = match got.exact() {
            true => "tokenizing (exact)",
            // small_by_bytes settles small with an upper bound.
            false
                if got.input_tokens_estimate
                    == bounds::ByteBounds::new(k.bytes, k.messages as u32, overhead_of(k))
                        .upper =>
            {
                "byte length (upper bound: 1 token/byte)"
            }
            false => "byte length (upper bound from the merges)",
        };
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {:+.1}% |",
            k.name,
            k.exact_input_tokens,
            k.max_output,
            k.bytes,
            got.lane,
            by,
            got.work,
            exact_work,
            (f64::from(got.work) / f64::from(exact_work) - 1.0) * 100.0
        );
    }
    println!();
    println!(
        "| kind | `classify_blocking` p50 / p99 (us) | `classify().await` p50 / p99 (us) | full count p50 / p99 (us) | `encode` p50 / p99 (us) |"
    );
    println!("|---|---:|---:|---:|---:|");
    for (k, b, a, t, e) in &timings {
        println!(
            "| {} | {:.1} / {:.1} | {:.1} / {:.1} | {:.1} / {:.1} | {:.1} / {:.1} |",
            k.name, b.0, b.1, a.0, a.1, t.0, t.1, e.0, e.1
        );
    }
    println!(
        "\n({iters} iterations per kind after {warmup} warm-up; async on a 2-worker tokio runtime; \
         full count = `TokenCounter::count_input` alone (the hand-written pre-tokenizer where it \
         applies), `encode` = the tokenizer's own, {} iterations each)",
        iters.min(200)
    );

    criterion.final_summary();
}
