use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::models::TrainerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::Tokenizer;

use super::bounds::ByteBounds;
use super::*;
use crate::config::Config;
use crate::lane::Lane;

/// Code and prose in the style of tutoring traffic, varied so no two lines repeat exactly.
fn tutoring_text(lines: usize) -> String {
    const LINES: &[&str] = &[
        "fn total_{i}(items: &[Item]) -> u64 {{ items.iter().map(|it| it.price * {i}).sum() }}",
        "    if let Err(e) = parse_config_{i}(&path) {{ eprintln!(\"bad config {i}: {{e}}\"); }}",
        "Why does the TypeScript compiler say that type 'string' is not assignable to 'number' on line {i}?",
        "Traceback (most recent call last): File \"main.py\", line {i}, in <module> KeyError: 'user_{i}'",
        "The loop returns early because the index {i} is checked before the list is sorted.",
        "    const result{i} = await fetch(`/api/items/${{id}}`).then(r => r.json());",
    ];
    (0..lines)
        .map(|i| LINES[i % LINES.len()].replace("{i}", &i.to_string()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A tiny byte-level BPE trained here and saved to a temp dir (never committed), loaded once.
fn trained_tokenizer_path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let mut tokenizer = Tokenizer::new(BPE::default());
        tokenizer.with_pre_tokenizer(Some(ByteLevel::default()));
        tokenizer.with_decoder(Some(ByteLevel::default()));
        let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
            .show_progress(false)
            .vocab_size(1000)
            .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
            .build()
            .into();
        let corpus = tutoring_text(600);
        tokenizer
            .train(&mut trainer, corpus.lines())
            .expect("training a tiny BPE");
        let dir = std::env::temp_dir().join(format!("tutor-gateway-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tokenizer.json");
        tokenizer.save(&path, false).unwrap();
        path
    })
}

fn real_counter() -> TokenCounter {
    TokenCounter::from_file(trained_tokenizer_path()).unwrap()
}

fn classifier(counter: TokenCounter) -> Classifier {
    Classifier::with_counter(&Config::default(), counter)
}

/// The shortest `tutoring_text` with at least `tokens` tokens under `counter`.
fn text_with_tokens(counter: &TokenCounter, tokens: u32) -> String {
    let enough = |lines: usize| counter.count_text(&tutoring_text(lines)) >= tokens;
    let mut high = 1;
    while !enough(high) {
        high *= 2;
    }
    // high / 2: not enough (or 0).
    tutoring_text(tutor_testkit::bench::smallest_enough(
        high / 2,
        high,
        enough,
    ))
}

fn prompt(text: String) -> Arc<PromptInput> {
    Arc::new(PromptInput::Prompt(text))
}

fn chat(system: &str, user: String) -> Arc<PromptInput> {
    let messages = serde_json::json!([
        {"role": "system", "content": system},
        {"role": "user", "content": [{"type": "text", "text": user}]},
    ]);
    Arc::new(PromptInput::chat(
        serde_json::from_value(messages).unwrap(),
        None,
        16_384,
    ))
}

#[tokio::test]
async fn seed_request_kinds_land_in_small_medium_large_with_a_real_tokenizer() {
    let counter = real_counter();
    let c = classifier(counter.clone());
    // 70%: code explanation, 300 input / 120 output tokens.
    let small = c
        .classify(prompt(text_with_tokens(&counter, 300)), Some(120))
        .await
        .unwrap();
    assert_eq!(small.lane, Lane::Small, "{small:?}");
    // 25%: debugging with ~2000 tokens of context.
    let medium = c
        .classify(
            chat("You are a tutor.", text_with_tokens(&counter, 2000)),
            Some(400),
        )
        .await
        .unwrap();
    assert_eq!(medium.lane, Lane::Medium, "{medium:?}");
    // 5%: project review with ~8000 tokens.
    let large = c
        .classify(
            chat("Review this project.", text_with_tokens(&counter, 8000)),
            Some(1000),
        )
        .await
        .unwrap();
    assert_eq!(large.lane, Lane::Large, "{large:?}");
    for k in [small, medium, large] {
        assert_eq!(k.work, k.input_tokens_estimate + k.output_budget);
    }
}

#[tokio::test]
async fn seed_request_kinds_land_in_their_lanes_with_the_heuristic() {
    let c = classifier(TokenCounter::Heuristic);
    // " abcd" is exactly one heuristic token.
    let words = |n: usize| " abcd".repeat(n);
    let small = c.classify(prompt(words(300)), Some(120)).await.unwrap();
    assert_eq!(
        (small.lane, small.input_tokens_estimate, small.exact()),
        (Lane::Small, 301, true)
    );
    assert_eq!(small.work, 421);
    let medium = c.classify(prompt(words(2000)), Some(500)).await.unwrap();
    assert_eq!(medium.lane, Lane::Medium);
    let large = c.classify(prompt(words(8000)), Some(1000)).await.unwrap();
    assert_eq!(large.lane, Lane::Large);
}

#[tokio::test]
async fn exact_counts_are_the_tokenizer_count_plus_template_overhead() {
    let counter = real_counter();
    let c = classifier(counter.clone());
    let user = text_with_tokens(&counter, 1500);
    // The roles are text the template renders too.
    let content = counter.count_text("system")
        + counter.count_text("Be brief.")
        + counter.count_text("user")
        + counter.count_text(&user);
    let got = c
        .classify(chat("Be brief.", user), Some(100))
        .await
        .unwrap();
    assert!(got.exact());
    // Two messages + the assistant turn, 5 tokens each, + 1 BOS.
    assert_eq!(got.input_tokens_estimate, content + 3 * 5 + 1);
}

#[tokio::test]
async fn short_questions_with_a_fast_count_are_counted_on_the_spot() {
    // The heuristic is a pass over the bytes (as the hand-written pre-tokenizer of a real
    // tokenizer is, for ASCII text: `byte_level_tests.rs`).
    let counter = TokenCounter::Heuristic;
    let c = classifier(counter.clone());
    let question = "why does this TypeScript error happen? Type 'string' is not assignable.";
    let got = c
        .classify(chat("You are a tutor.", question.to_owned()), Some(120))
        .await
        .unwrap();
    assert_eq!(got.lane, Lane::Small);
    let text = ["system", "You are a tutor.", "user", question]
        .map(|t| counter.count_text(t))
        .iter()
        .sum::<u32>();
    assert_eq!(got.input_tokens_estimate, text + 3 * 5 + 1, "{got:?}");
    assert!(got.exact());
}

#[tokio::test]
async fn short_questions_without_a_fast_count_skip_tokenizing_and_reserve_the_upper_bound() {
    let c = classifier(real_counter());
    // Not ASCII: the hand-written pre-tokenizer does not apply.
    let question =
        "why does this TypeScript error happen? Type \u{2018}string\u{2019} is not assignable.";
    let got = c
        .classify(chat("You are a tutor.", question.to_owned()), Some(120))
        .await
        .unwrap();
    assert_eq!(got.lane, Lane::Small);
    assert!(!got.exact(), "byte length alone decides a short question");
    // Four pieces: each role and its text; one token a byte, one more per piece.
    let bytes = ("system".len() + "You are a tutor.".len() + "user".len() + question.len()) as u32;
    assert_eq!(got.input_tokens_estimate, bytes + 4 + 3 * 5 + 1);
}

#[tokio::test]
async fn long_prompts_are_counted_and_reserve_their_count() {
    let counter = real_counter();
    let c = classifier(counter.clone());
    let text = tutoring_text(400); // ~28 KB: even 6 bytes a token is over medium
    let count = counter.count_text(&text);
    let got = c.classify(prompt(text), Some(1000)).await.unwrap();
    assert_eq!(got.lane, Lane::Large);
    assert!(got.exact());
    assert_eq!(got.input_tokens_estimate, count + 1);
}

#[tokio::test]
async fn byte_decisions_agree_with_exact_counts() {
    let counter = real_counter();
    let c = classifier(counter.clone());
    for lines in [1, 2, 5, 20, 60, 200, 400] {
        let text = tutoring_text(lines);
        let fast = c.classify(prompt(text.clone()), Some(200)).await.unwrap();
        let exact_tokens = counter.count_text(&text) + 1;
        let exact = c.lane_for(exact_tokens + 200);
        assert_eq!(
            fast.lane, exact,
            "{lines} lines: {fast:?} vs exact {exact_tokens}"
        );
        let b = ByteBounds::new(text.len() as u64, 1, 1);
        assert!(
            b.lower <= exact_tokens && exact_tokens <= b.upper,
            "{b:?} {exact_tokens}"
        );
    }
}

#[tokio::test]
async fn requests_over_max_model_len_are_a_distinct_error() {
    let c = classifier(TokenCounter::Heuristic);
    // An output limit above the whole context: refused whatever the prompt, decided from
    // byte length (the reported input is the lower bound: 5000 bytes / 6, + BOS).
    let err = c
        .classify(prompt(" abcd".repeat(1000)), Some(16_385))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        ClassifyError::ExceedsModelLen {
            input_tokens: 835,
            output_tokens: 16_385,
            max_model_len: 16_384
        }
    );
    // A limit that does not fit beside the prompt (1001 exact tokens + 15_400 > 16_384) is
    // lowered to the room the prompt leaves, as vLLM lowers it: reserved up to the context.
    let fits = c
        .classify(prompt(" abcd".repeat(1000)), Some(15_400))
        .await
        .unwrap();
    assert_eq!(fits.input_tokens_estimate, 1001);
    assert_eq!(fits.output_budget, 16_384 - 1001);
    assert_eq!(fits.work, 16_384);
    assert_eq!(fits.lane, Lane::Large);
    // 200 KB: over the limit even at 6 bytes a token, rejected without tokenizing.
    let err = c
        .classify(prompt("x".repeat(200_000)), None)
        .await
        .unwrap_err();
    assert!(
        matches!(err, ClassifyError::ExceedsModelLen { .. }),
        "{err}"
    );
}

#[tokio::test]
async fn a_guess_over_max_model_len_is_checked_by_counting() {
    let c = classifier(TokenCounter::Heuristic);
    // 60 KB: bytes/3 = 20000 > 16384 but bytes/6 = 10000 is not, so it is counted: 12000 tokens.
    let got = c
        .classify(prompt(" abcd".repeat(12_000)), Some(1000))
        .await
        .unwrap();
    assert!(got.exact());
    assert_eq!((got.lane, got.input_tokens_estimate), (Lane::Large, 12_001));
}

#[tokio::test]
async fn default_output_budget_applies_and_is_capped_to_fit_the_model() {
    let c = classifier(TokenCounter::Heuristic);
    let got = c.classify(prompt(" abcd".repeat(300)), None).await.unwrap();
    assert_eq!(got.output_budget, 512);
    let got = c
        .classify(prompt(" abcd".repeat(16_000)), None)
        .await
        .unwrap();
    assert_eq!(got.output_budget, 16_384 - 16_001);
    assert_eq!(got.work, 16_384);
}

#[test]
fn a_missing_tokenizer_file_is_a_load_error() {
    let err =
        TokenCounter::from_file(std::path::Path::new("/nonexistent/tokenizer.json")).unwrap_err();
    assert!(matches!(err, ClassifyError::TokenizerLoad { .. }), "{err}");
}

#[test]
fn thresholds_are_inclusive() {
    let c = classifier(TokenCounter::Heuristic);
    assert_eq!(c.lane_for(1200), Lane::Small);
    assert_eq!(c.lane_for(1201), Lane::Medium);
    assert_eq!(c.lane_for(5000), Lane::Medium);
    assert_eq!(c.lane_for(5001), Lane::Large);
    assert_eq!(Lane::ALL.map(Lane::as_str), ["small", "medium", "large"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_one_prompt_per_cpu_is_tokenized_at_once() {
    let counter = real_counter();
    let classifier = classifier(counter.clone());
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    // Medium prompts: tokenized, never decided from bytes.
    let text = text_with_tokens(&counter, 2_000);
    let input = Arc::new(PromptInput::Prompt(text));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (c, stop) = (classifier.clone(), Arc::clone(&stop));
        tokio::spawn(async move {
            let mut most = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                most = most.max(c.tokenizing());
                tokio::task::yield_now().await;
            }
            most
        })
    };
    let calls: Vec<_> = (0..8 * cpus)
        .map(|_| {
            let (c, input) = (classifier.clone(), Arc::clone(&input));
            tokio::spawn(async move { c.classify(input, Some(300)).await.unwrap() })
        })
        .collect();
    for call in calls {
        let class = call.await.unwrap();
        assert!(class.exact(), "medium prompts are tokenized: {class:?}");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let most = watcher.await.unwrap();
    assert!(most <= cpus, "{most} tokenizing at once on {cpus} CPUs");
    assert_eq!(classifier.tokenizing(), 0, "every permit came back");
}

#[test]
fn every_rendered_string_is_counted_and_media_by_its_kind() {
    let messages: Vec<ChatMessage> = serde_json::from_value(serde_json::json!([
        {"role": "teacher", "content": [
            {"type": "image_url", "image_url": {"url": "a"}},
            {"type": "input_audio", "input_audio": {"data": "b"}},
            {"type": "video_url", "video_url": {"url": "c"}},
        ]},
        {"role": "assistant", "content": "ok", "reasoning": "think", "reasoning_content": "more"},
    ]))
    .unwrap();
    let kwargs = serde_json::json!({"custom_tools": "described here"});
    let input =
        PromptInput::chat(messages, None, 16_384).with_template_kwargs(Some(&kwargs), 16_384);
    let mut texts = Vec::new();
    input.for_each_text(|t| texts.push(t.to_owned()));
    assert_eq!(texts[0], "{\n    \"custom_tools\": \"described here\"\n}");
    for expected in [
        "teacher",
        "assistant",
        "think",
        "more",
        "ok",
        "{\"video_url\":{\"url\":\"c\"}}",
    ] {
        assert!(texts.iter().any(|t| t == expected), "{expected}: {texts:?}");
    }
    let costs = TemplateCosts {
        per_message: 5,
        image_part: 1000,
        image_token_pixels: 0,
        image_min_tokens: 4,
        audio_part: 200,
        video_part: 30_000,
    };
    // Three turns of 5, BOS, one charge per kind, and a newline between two pieces after the
    // role: two in the first message, two in the second.
    assert_eq!(
        input.template_overhead(costs),
        3 * 5 + 1 + 1000 + 200 + 30_000 + 2 + 2
    );
}

/// A tool result is the text a tool returned, rendered whole: corrected as code or prose, never
/// at the tools' ratio (which compact schemas, and tool-call fields a template leaves out,
/// teach down to a quarter): a review sent back as a tool result counted at that ratio went to
/// the small lane. The tools and the calls stay tools.
#[test]
fn a_tool_result_is_corrected_as_the_text_it_is() {
    use crate::classify::calibration::ContentKind;
    let code =
        "fn main() {\n    let x = vec![1, 2, 3];\n    println!(\"{:?}\", x);\n}\n".repeat(20);
    let messages: Vec<ChatMessage> = serde_json::from_value(serde_json::json!([
        {"role": "user", "content": "run my tests"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "run", "arguments": "{}"}}
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": code},
    ]))
    .unwrap();
    let input = PromptInput::chat(messages, None, 16_384);
    let mut kinds = Vec::new();
    input.for_each_kind_text(|kind, _, text| kinds.push((kind, text.len())));
    let result = kinds.iter().max_by_key(|(_, len)| *len).unwrap();
    assert_eq!(result.0, ContentKind::Code, "{kinds:?}");
    assert!(
        kinds.iter().any(|(kind, _)| *kind == ContentKind::Tools),
        "the call stays tools: {kinds:?}"
    );
}

/// A reload's classifier ([`Classifier::inherit`]): counting the same way, it keeps the
/// correction in force, so what the requests still running teach reaches it; with as many
/// tokenizations allowed at once, the prompts the old one is still tokenizing count against
/// the new one's limit. Counting another way, it starts its own correction.
#[test]
fn a_reloaded_classifier_keeps_the_correction_in_force_and_the_tokenizations_running() {
    let old = classifier(TokenCounter::Heuristic);
    let mut new = classifier(TokenCounter::Heuristic);
    new.inherit(&old, true);
    assert!(Arc::ptr_eq(new.calibration(), old.calibration()));
    let running = Arc::clone(&old.tokenizing).try_acquire_owned().unwrap();
    assert_eq!(
        new.tokenizing(),
        1,
        "the old classifier's tokenization counts"
    );
    drop(running);
    assert_eq!(new.tokenizing(), 0);

    let mut recounted = classifier(TokenCounter::Heuristic);
    recounted.inherit(&old, false);
    assert!(!Arc::ptr_eq(recounted.calibration(), old.calibration()));
}

/// `tools` of arrays nested 120 deep: their pretty rendering (two spaces a level on every
/// line) would be a hundred times the body; it is cut past what the model's context could hold
/// and the request refused as too long, without rendering the rest.
#[test]
fn deeply_nested_tools_are_refused_without_rendering_them_whole() {
    let mut tools = serde_json::json!(vec![0; 20_000]);
    for _ in 0..120 {
        tools = serde_json::json!([tools]);
    }
    let compact = tools.to_string().len();
    let messages: Vec<ChatMessage> =
        serde_json::from_value(serde_json::json!([{"role": "user", "content": "hi"}])).unwrap();
    let input = PromptInput::chat(messages, Some(&tools), 16_384);
    let (bytes, _) = input.text_bytes_and_pieces();
    // Whole, the rendering is about 4.9 MB (20,000 lines of 240 spaces); at most one byte past
    // 6 bytes a token of the context is rendered, plus the message and its role.
    assert!(compact < 50_000, "{compact}");
    assert!(bytes <= 16_384 * 6 + 1 + 16, "{bytes} bytes rendered");
    let classifier = Classifier::with_counter(&Config::default(), TokenCounter::Heuristic);
    match classifier.classify_blocking(&input, Some(10)) {
        Err(ClassifyError::ExceedsModelLen { max_model_len, .. }) => {
            assert_eq!(max_model_len, 16_384)
        }
        other => panic!("expected too long, got {other:?}"),
    }
}

/// Tools whose pretty rendering dwarfs their compact one (arrays nested deep), sent to an
/// engine whose template writes them compact, taught the tools' line its floor, a quarter.
/// Tools of long descriptions, as long compact as pretty, were then counted at a quarter of
/// what any template renders: 12,000 tokens of them rode the medium lane on 3,000. Such tools
/// now teach nothing; honest ones (nested properties, arrays of objects) still do.
#[test]
fn tools_counted_far_past_their_compact_rendering_teach_nothing() {
    let counter = TokenCounter::Heuristic;
    let classifier = Classifier::with_counter(&Config::default(), counter.clone());
    // The counts a request of `tools` is classified with (template costs included).
    let counts_of = |tools: &serde_json::Value| {
        let messages: Vec<ChatMessage> =
            serde_json::from_value(serde_json::json!([{"role": "user", "content": "hi"}])).unwrap();
        let input = PromptInput::chat(messages, Some(tools), 16_384);
        classifier
            .classify_blocking(&input, Some(10))
            .unwrap()
            .counts
            .unwrap()
    };
    let lesson = |counts: &KindCounts| {
        let engine = counts.total() / 2;
        classifier.calibration().observe("m", counts, engine)
    };
    // Arrays nested 100 deep, which an engine writing them compact counts at a few hundred.
    let mut nested = serde_json::json!([0]);
    for _ in 0..100 {
        nested = serde_json::json!([nested]);
    }
    let poison = serde_json::json!([{"type": "function", "function": {"name": "p",
        "parameters": {"type": "object", "default": nested}}}]);
    let counts = counts_of(&poison);
    assert!(counts.tools_inflated, "{counts:?}");
    for _ in 0..40 {
        assert!(lesson(&counts).is_none(), "taught");
    }
    assert_eq!(
        classifier
            .calibration()
            .expect(None, ContentKind::Tools, 1_000),
        1_000.0
    );
    // Honest schemas teach.
    let weather = serde_json::json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Get the current weather in a given location",
        "parameters": {"type": "object", "properties": {
            "location": {"type": "string", "description": "City and state, e.g. 'San Francisco, CA'"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["location", "unit"]}}}]);
    let edit = serde_json::json!([{"type": "function", "function": {"name": "edit",
        "description": "Apply edits to a file",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string"},
            "edits": {"type": "array", "items": {"type": "object", "properties": {
                "line": {"type": "integer"}, "text": {"type": "string"}},
                "required": ["line", "text"]}}},
            "required": ["path", "edits"]}}}]);
    for honest in [&weather, &edit] {
        let counts = counts_of(honest);
        assert!(!counts.tools_inflated, "{honest}: {counts:?}");
        assert!(lesson(&counts).is_some(), "{honest}");
    }
}

/// Text some templates leave out (a message's `name`, which Llama 3.1's and Qwen 2.5's
/// templates drop; earlier turns' reasoning; tool call ids) is counted but teaches nothing when
/// it is much of a request: a tenant whose questions carried 600-word names, answered by an
/// engine that rendered the questions alone, taught its own prose line its floor (0.4), and
/// its 12,000-token review was then estimated at 4,800.
#[test]
fn text_a_template_may_leave_out_teaches_nothing() {
    use crate::classify::calibration::ContentKind;
    let c = classifier(TokenCounter::Heuristic);
    let counter = TokenCounter::Heuristic;
    let message = |name: &str, content: &str| -> PromptInput {
        let messages = serde_json::json!([{"role": "user", "name": name, "content": content}]);
        PromptInput::chat(serde_json::from_value(messages).unwrap(), None, 16_384)
    };
    let question = "why does my loop never end when the list is empty?";
    let long_name = "student of the evening course ".repeat(100);
    for _ in 0..40 {
        let input = message(&long_name, question);
        let counts = c
            .classify_blocking(&input, Some(100))
            .unwrap()
            .counts
            .unwrap();
        assert!(counts.optional >= counter.count_text(&long_name));
        // The engine's template renders the question and its markers, not the name.
        let engine = counts.overhead + counter.count_text(question);
        c.calibration()
            .observe_for("m", Some("mallory"), &counts, engine);
    }
    let review = "please review how this repository handles its errors and tests ".repeat(700);
    let counted = counter.count_text(&review);
    let expected =
        c.calibration()
            .expect_for(Some("m"), Some("mallory"), ContentKind::Prose, counted);
    assert!(
        expected >= f64::from(counted) * 0.99,
        "the review is estimated at {expected} of {counted} counted"
    );

    // A name that is a small part of its request is no reason to learn nothing: such a
    // request teaches (here, the engine counting 0.7 of the text).
    let input = message("ann", &review);
    let counts = c
        .classify_blocking(&input, Some(100))
        .unwrap()
        .counts
        .unwrap();
    assert!(counts.optional > 0);
    let engine = counts.overhead + counted * 7 / 10;
    let lesson = c
        .calibration()
        .observe_for("m", Some("ann"), &counts, engine)
        .expect("a request mostly rendered for sure teaches");
    assert_eq!(lesson.kind, ContentKind::Prose);
}

use crate::classify::calibration::ContentKind as Kind;

/// The classifier of a vision model counted as Qwen2.5-VL's are: a token per 28 x 28 pixels, at
/// most 16,384 a picture, in a context of 32,768.
fn vision_classifier() -> Classifier {
    let mut config = Config::default();
    config.upstream.max_model_len = std::num::NonZeroU32::new(32_768).unwrap();
    config.classify.image_part_tokens = 16_384;
    config.classify.image_token_pixels = 28;
    Classifier::with_counter(&config, TokenCounter::Heuristic)
}

/// A question with one picture of `width` x `height` pixels.
fn picture_question(width: u32, height: u32) -> PromptInput {
    text_and_picture("what does this picture show?", width, height)
}

/// `text` and a picture of `width` x `height` pixels, in one user message.
fn text_and_picture(text: &str, width: u32, height: u32) -> PromptInput {
    let url = tutor_testkit::picture::png_data_url(width, height, 64);
    let messages = serde_json::json!([{"role": "user", "content": [
        {"type": "text", "text": text},
        {"type": "image_url", "image_url": {"url": url}}]}]);
    PromptInput::chat(serde_json::from_value(messages).unwrap(), None, 32_768)
}

/// A picture's charge is the most it can cost, so pictures that cost less (a model that counts
/// an 800 x 600 photo at 300 tokens, charged 638 by its size) teach the media line nothing
/// below its count: the largest picture, 3,584 x 3,584 pixels in a few hundred bytes of PNG, is
/// still counted whole. The line learned down to a quarter before, and such a picture was a
/// small question.
#[test]
fn pictures_that_cost_less_than_their_charge_never_count_the_largest_short() {
    let c = vision_classifier();
    let photo = picture_question(800, 600);
    for _ in 0..40 {
        let counts = c
            .classify_blocking(&photo, Some(100))
            .unwrap()
            .counts
            .unwrap();
        assert_eq!(counts.of(Kind::Media) - counts_of_json(&photo), 29 * 22);
        let engine = counts.total() - 638 + 300;
        c.calibration().observe("m", &counts, engine);
    }
    let largest = c
        .classify_blocking(&picture_question(3584, 3584), Some(100))
        .unwrap();
    assert!(largest.input_tokens_estimate >= 16_384, "{largest:?}");
    assert_eq!(largest.lane, Lane::Large);
}

/// The heuristic's count of `input`'s media parts' JSON (their payloads' digests in place of
/// the payloads).
fn counts_of_json(input: &PromptInput) -> u32 {
    let mut n = 0;
    input.for_each_kind_text(|kind, _, text| {
        if kind == Kind::Media {
            n += TokenCounter::Heuristic.count_text(text);
        }
    });
    n
}

/// A media charge is a bound, so a request that is not mostly media but more than an eighth of
/// it teaches nothing: what the picture cost less than its charge would go to the text's
/// lesson (here, 3,000 tokens of prose and a picture the engine counted at 100 of its 1,024
/// would teach prose 0.7 of its count).
#[test]
fn a_request_partly_made_of_pictures_teaches_its_text_nothing() {
    let c = vision_classifier();
    let prose = text_with_tokens(&TokenCounter::Heuristic, 3_000);
    let input = text_and_picture(&prose, 896, 896);
    let counts = c
        .classify_blocking(&input, Some(100))
        .unwrap()
        .counts
        .unwrap();
    let media = counts.of(Kind::Media);
    assert!(media >= 1_024 && media * 2 < counts.total(), "{counts:?}");
    let engine = counts.total() - 1_024 + 100;
    assert_eq!(c.calibration().observe("m", &counts, engine), None);
    // The same text with a picture under an eighth of it teaches.
    let input = text_and_picture(&prose, 56, 56);
    let counts = c
        .classify_blocking(&input, Some(100))
        .unwrap()
        .counts
        .unwrap();
    assert!(c
        .calibration()
        .observe("m", &counts, counts.total())
        .is_some());
}

/// A picture with fewer pixels than the model's `min_pixels` is scaled up to them
/// (`smart_resize`), each side rounded up: an 82 x 1 strip costs Qwen2.5-VL 19 tokens, not
/// the 3 its squares would say; with `min_pixels` of 256 squares (a common vLLM setting,
/// `image_min_tokens = 256`), a 1 x 1 picture costs 256.
#[test]
fn a_picture_below_the_models_least_is_charged_as_scaled_up() {
    let charge = |min: u32, w: u32, h: u32| {
        let costs = TemplateCosts {
            per_message: 0,
            image_part: 16_384,
            image_token_pixels: 28,
            image_min_tokens: min,
            audio_part: 0,
            video_part: 0,
        };
        let url = tutor_testkit::picture::png_data_url(w, h, 8);
        let part: crate::classify::ContentPart = serde_json::from_value(serde_json::json!(
            {"type": "image_url", "image_url": {"url": url}}))
        .unwrap();
        costs.part_charge(&part)
    };
    assert_eq!(charge(4, 82, 1), 19);
    assert_eq!(charge(256, 1, 1), 256);
    assert_eq!(charge(4, 10, 10), 4);
    // Above the least, the squares it covers; past the most, the most.
    assert_eq!(charge(4, 640, 480), 23 * 18);
    assert_eq!(charge(4, 8000, 8000), 16_384);
}
