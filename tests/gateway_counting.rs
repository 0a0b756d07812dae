//! Classification counts everything the engine prefills (issue 15, issue 29): every role,
//! reasoning in the history, content part, name, tool call and tool call id, the request's
//! tools and its `chat_template_kwargs`. For generated chat requests the gateway's own count
//! (`input_tokens_counted`, before the learned correction) is never below the simulator's
//! prompt count by more than the documented margin (none: docs/operations.md, "What the
//! estimate counts"; `classify.per_message_overhead` in `config/config.toml`). What the
//! correction makes of it is `tests/estimate.rs`'s.

mod common;

use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tutor_testkit::picture::png_data_url;

/// The documented margin per message: the estimate is never below the simulator's count.
const MARGIN_PER_MESSAGE: u64 = 0;

const WORDS: &[&str] = &[
    "fn",
    "main",
    "let",
    "x",
    "=",
    "vec![1, 2];",
    "why",
    "does",
    "borrow",
    "checker",
    "fail?",
    "\n",
    "    ",
    "{",
    "}",
    "error[E0502]:",
    "ü",
    "'a",
    "println!(\"{x}\");",
    "<|im_end|>",
];

fn text(rng: &mut StdRng, max_words: usize) -> String {
    let n = rng.random_range(0..=max_words);
    let mut out = String::new();
    for _ in 0..n {
        out.push_str(WORDS[rng.random_range(0..WORDS.len())]);
        if rng.random_bool(0.7) {
            out.push(' ');
        }
    }
    out
}

fn tool_schema(rng: &mut StdRng, i: usize) -> Value {
    let props: serde_json::Map<String, Value> = (0..rng.random_range(1..6))
        .map(|k| {
            (
                format!("arg_{k}"),
                json!({"type": "string", "description": text(rng, 12)}),
            )
        })
        .collect();
    json!({"type": "function", "function": {
        "name": format!("tool_{i}"),
        "description": text(rng, 20),
        "parameters": {"type": "object", "properties": props, "required": ["arg_0"]}
    }})
}

fn content(rng: &mut StdRng) -> Value {
    if rng.random_bool(0.5) {
        return json!(text(rng, 40));
    }
    let parts: Vec<Value> = (0..rng.random_range(1..4))
        .map(|_| match rng.random_range(0..4) {
            0 => json!({"type": "image_url", "image_url": {"url": format!("https://img.example/{}.png", text(rng, 2).len())}}),
            _ => json!({"type": "text", "text": text(rng, 30)}),
        })
        .collect();
    json!(parts)
}

/// A conversation with every kind of piece a template renders, and maybe tools.
fn random_chat(rng: &mut StdRng) -> (Vec<Value>, Option<Value>) {
    let mut messages = Vec::new();
    if rng.random_bool(0.5) {
        messages.push(json!({"role": "system", "content": text(rng, 30)}));
    }
    for turn in 0..rng.random_range(1..5) {
        let mut user = json!({"role": "user", "content": content(rng)});
        if rng.random_bool(0.3) {
            user["name"] = json!(format!("student_{turn}"));
        }
        messages.push(user);
        if rng.random_bool(0.5) {
            let id = format!("call_{turn}");
            let args = json!({"path": text(rng, 3), "line": rng.random_range(1..500)}).to_string();
            messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": id, "type": "function", "function": {"name": "read_file", "arguments": args}}
            ]}));
            messages.push(json!({"role": "tool", "tool_call_id": id, "content": text(rng, 60)}));
        }
        messages.push(json!({"role": "assistant", "content": text(rng, 30)}));
    }
    messages.push(json!({"role": "user", "content": content(rng)}));
    let tools = rng.random_bool(0.5).then(|| {
        json!((0..rng.random_range(1..4))
            .map(|i| tool_schema(rng, i))
            .collect::<Vec<_>>())
    });
    (messages, tools)
}

#[tokio::test]
async fn the_estimate_covers_everything_the_template_renders() {
    // The random image parts name img.example: a media host the gateway lets vLLM fetch from.
    let h = harness(&["--speed", "100", "--profile", "tiny-test"], |c| {
        c.fields.media_hosts = vec!["img.example".into()]
    })
    .await;
    let mut rng = StdRng::seed_from_u64(15);
    let mut sizes = Vec::new();
    for _ in 0..150 {
        let (messages, tools) = random_chat(&mut rng);
        let mut body = json!({"messages": messages, "max_tokens": 1});
        if let Some(t) = tools {
            body["tools"] = t;
        }
        let resp = send(client().post(h.url("/v1/chat/completions")).json(&body)).await;
        assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
        let _ = resp.text().await;
        sizes.push(messages.len() as u64);
    }
    let log = h.log.lock().unwrap().clone();
    assert_eq!(log.len(), sizes.len());
    for (entry, messages) in log.iter().zip(sizes) {
        let estimate = entry["input_tokens_counted"].as_u64().unwrap();
        let engine = entry["input_tokens"].as_u64().unwrap();
        assert!(
            estimate + MARGIN_PER_MESSAGE * messages >= engine,
            "{messages} messages: estimated {estimate}, the engine counted {engine}"
        );
    }
    h.shutdown().await;
}

#[tokio::test]
async fn a_tools_heavy_question_is_classified_by_its_real_size() {
    let h = harness(&["--speed", "100", "--profile", "tiny-test"], |_| {}).await;
    let mut rng = StdRng::seed_from_u64(7);
    // About 30 KB of tool schemas behind a two-letter question.
    let tools: Vec<Value> = (0..60).map(|i| tool_schema(&mut rng, i)).collect();
    let schema_bytes = serde_json::to_string(&tools).unwrap().len();
    assert!(schema_bytes > 20_000, "{schema_bytes}");
    let body =
        json!({"messages": [{"role": "user", "content": "hi"}], "tools": tools, "max_tokens": 5});
    for _ in 0..2 {
        let resp = send(client().post(h.url("/v1/chat/completions")).json(&body)).await;
        assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
        let _ = resp.text().await;
    }
    let log = h.log.lock().unwrap().clone();
    let engine = log[0]["input_tokens"].as_f64().unwrap();
    for entry in &log {
        // About 13,900 tokens: large, not the small lane a two-letter question would get.
        assert_eq!(entry["lane"], "large", "{entry}");
        assert_eq!(entry["input_tokens"].as_f64().unwrap(), engine);
    }
    // The first: counted pretty-printed, over max_model_len with 5 out; the compact rendering
    // fits, so it is sent, reserving at most what the model holds (never fewer than the
    // engine's count).
    let first = log[0]["input_tokens_estimated"].as_f64().unwrap();
    assert!(first >= engine && first <= 16_384.0 - 5.0, "{}", log[0]);
    // The second: the first response taught the tools' ratio.
    let second = log[1]["input_tokens_estimated"].as_f64().unwrap();
    assert!((second - engine).abs() <= 0.05 * engine, "{}", log[1]);
    h.shutdown().await;
}

/// Roles configured besides vLLM's for [`random_conversation`]: a short one and a long one.
fn extra_roles() -> Vec<String> {
    vec![
        "ipython".to_owned(),
        "teaching assistant of the week, ".repeat(12),
    ]
}

/// A conversation with random roles (vLLM's and the configured ones), long names, reasoning in
/// the history, text and media parts, tool calls, and maybe tools and template values.
fn random_conversation(rng: &mut StdRng) -> Value {
    use tutor_gateway::pipeline::parse::template::VLLM_ROLES;
    let mut roles: Vec<String> = VLLM_ROLES.iter().map(|r| (*r).to_owned()).collect();
    roles.extend(extra_roles());
    let mut messages = Vec::new();
    for turn in 0..rng.random_range(1..7) {
        let role = roles[rng.random_range(0..roles.len())].clone();
        let mut m = json!({"role": role});
        m["content"] = match rng.random_range(0..4) {
            0 => Value::Null,
            1 => json!(text(rng, 40)),
            _ => json!((0..rng.random_range(1..4))
                .map(|k| match rng.random_range(0..10) {
                    0 => json!({"type": "image_url", "image_url": {"url": format!("https://img.example/{k}.png")}}),
                    1 => json!({"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}),
                    2 => json!({"type": "video_url", "video_url": {"url": format!("https://v.example/{k}.mp4")}}),
                    // The part types vLLM renders as text, each from its own field.
                    3 => json!({"type": "input_text", "text": text(rng, 30)}),
                    4 => json!({"type": "output_text", "text": text(rng, 30)}),
                    5 => json!({"type": "refusal", "refusal": text(rng, 30)}),
                    6 => json!({"type": "thinking", "thinking": text(rng, 30)}),
                    _ => json!({"type": "text", "text": text(rng, 30)}),
                })
                .collect::<Vec<_>>()),
        };
        if rng.random_bool(0.3) {
            m["name"] = json!(format!(
                "student_{turn}_{}",
                text(rng, 80).replace(' ', "_")
            ));
        }
        if rng.random_bool(0.4) {
            m["reasoning"] = json!(text(rng, 120));
        }
        if rng.random_bool(0.2) {
            m["reasoning_content"] = json!(text(rng, 60));
        }
        if rng.random_bool(0.2) {
            let args = json!({"path": text(rng, 3)}).to_string();
            m["tool_calls"] = json!([{"id": format!("call_{turn}"), "type": "function",
                "function": {"name": "read_file", "arguments": args}}]);
        }
        if rng.random_bool(0.2) {
            m["tool_call_id"] = json!(format!("call_{turn}"));
        }
        messages.push(m);
    }
    let mut body = json!({"messages": messages, "max_tokens": 1});
    if rng.random_bool(0.4) {
        body["tools"] = json!((0..rng.random_range(1..3))
            .map(|i| tool_schema(rng, i))
            .collect::<Vec<_>>());
    }
    if rng.random_bool(0.5) {
        let kwargs: serde_json::Map<String, Value> = (0..rng.random_range(0..4))
            .map(|k| {
                // What `fields.template_kwargs` accepts: a short string, a number, a boolean.
                let value = match rng.random_range(0..3) {
                    0 => {
                        let mut t = text(rng, 60);
                        while t.len() > tutor_gateway::config::MAX_TEMPLATE_KWARG_BYTES {
                            t.pop();
                        }
                        json!(t)
                    }
                    1 => json!(rng.random_range(-1_000_000..1_000_000)),
                    _ => json!(rng.random_bool(0.5)),
                };
                (format!("value_{k}"), value)
            })
            .collect();
        body["chat_template_kwargs"] = Value::Object(kwargs);
    }
    body
}

/// The property of "What the estimate counts", over random conversations: the estimate is never
/// below the engine's `prompt_tokens` (less the documented margin). Not counting the role fails
/// it (tried by hand: a configured long role, and `assistant`, cost more than the margin).
#[tokio::test]
async fn the_estimate_covers_every_string_the_template_renders() {
    let h = harness(&["--speed", "100", "--profile", "tiny-test"], |c| {
        c.classify.extra_roles = extra_roles();
        // Media charges small enough that no conversation outgrows the model.
        c.classify.image_part_tokens = 64;
        c.classify.audio_part_tokens = 96;
        c.classify.video_part_tokens = 128;
        // The random media parts name these hosts: ones the gateway lets vLLM fetch from.
        c.fields.media_hosts = vec!["img.example".into(), "v.example".into()];
        // The random template switches.
        c.fields.template_kwargs = (0..4).map(|k| format!("value_{k}")).collect();
    })
    .await;
    let mut rng = StdRng::seed_from_u64(29);
    let mut sent = Vec::new();
    for _ in 0..200 {
        let body = random_conversation(&mut rng);
        let resp = send(client().post(h.url("/v1/chat/completions")).json(&body)).await;
        assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
        let _ = resp.text().await;
        sent.push(body["messages"].as_array().unwrap().len() as u64);
    }
    let log = h.log.lock().unwrap().clone();
    assert_eq!(log.len(), sent.len());
    let mut tightest = i64::MAX;
    for (entry, messages) in log.iter().zip(sent) {
        let estimate = entry["input_tokens_counted"].as_u64().unwrap();
        let engine = entry["input_tokens"].as_u64().unwrap();
        assert!(
            estimate + MARGIN_PER_MESSAGE * messages >= engine,
            "{messages} messages: estimated {estimate}, the engine counted {engine}: {entry}"
        );
        tightest = tightest.min(estimate as i64 - engine as i64);
    }
    eprintln!("tightest estimate - engine count: {tightest}");
    h.shutdown().await;
}

/// vLLM 0.34 renders an `input_text`, `output_text`, `refusal` or `thinking` part exactly as a
/// `text` part with the same text (`TEXT_PART_TYPES`, `vllm/renderers/chat_utils/
/// chat_message.py`): a client resending Responses-API or reasoning history is taken, and its
/// text is counted in full, however long (a 6,000-word answer in a `refusal` part is a large
/// request, as the same text in a `text` part is).
#[tokio::test]
async fn every_part_vllm_renders_as_text_is_taken_and_counted_as_text() {
    let h = harness(&["--speed", "100", "--profile", "tiny-test"], |_| {}).await;
    let long = "explain the borrow checker to me again please ".repeat(1000);
    let mut sent = Vec::new();
    for (kind, field) in [
        ("text", "text"),
        ("input_text", "text"),
        ("output_text", "text"),
        ("refusal", "refusal"),
        ("thinking", "thinking"),
    ] {
        for t in ["why does this loop never end?", long.as_str()] {
            let body = json!({"max_tokens": 1, "messages": [
                {"role": "assistant", "content": [{"type": kind, field: t}]},
                {"role": "user", "content": "and now?"}]});
            let resp = send(client().post(h.url("/v1/chat/completions")).json(&body)).await;
            assert_eq!(resp.status(), 200, "{kind}: {}", resp.text().await.unwrap());
            let _ = resp.text().await;
            sent.push((kind, t.len()));
        }
    }
    let log = h.log.lock().unwrap().clone();
    assert_eq!(log.len(), sent.len());
    let counted = |i: usize| log[i]["input_tokens_counted"].as_u64().unwrap();
    let lane = |i: usize| log[i]["lane"].as_str().unwrap().to_owned();
    for (i, (kind, _)) in sent.iter().enumerate() {
        // The same count as the same text in a `text` part (entries 0 and 1), short and long.
        assert_eq!(counted(i), counted(i % 2), "{kind}: {}", log[i]);
        assert_eq!(lane(i), lane(i % 2), "{kind}: {}", log[i]);
        let engine = log[i]["input_tokens"].as_u64().unwrap();
        assert!(counted(i) >= engine, "{kind}: {}", log[i]);
    }
    assert_eq!(lane(1), "large", "{}", log[1]);
    assert_eq!(lane(0), "small", "{}", log[0]);
    // Another field than the one its type names is not counted, so not taken.
    for part in [
        json!({"type": "refusal", "text": "x"}),
        json!({"type": "thinking", "thinking": "x", "closed": true}),
        json!({"type": "input_text", "text": 5}),
    ] {
        let body = json!({"messages": [{"role": "user", "content": [part]}]});
        let resp = send(client().post(h.url("/v1/chat/completions")).json(&body)).await;
        assert_eq!(resp.status(), 400, "{part}");
        let v: Value = resp.json().await.unwrap();
        assert!(
            v["error"]["param"]
                .as_str()
                .unwrap()
                .starts_with("messages[0].content[0]"),
            "{v}"
        );
    }
    h.shutdown().await;
}

/// vLLM parses an assistant's tool-call `arguments` and the template writes them back with
/// Python's `json.dumps`: `1e15` comes out as `1000000000000000.0`, and a compact list gains a
/// space after every comma. 250 of them sent as 1,500 bytes are some 4,750 tokens rendered (a
/// digit a token): the count is of what the template renders, not of what was sent.
#[tokio::test]
async fn tool_call_arguments_are_counted_as_the_template_writes_them() {
    let h = harness(&["--speed", "100", "--profile", "tiny-test"], |_| {}).await;
    let args = format!("{{\"x\":[{}]}}", vec!["1e15"; 250].join(","));
    assert!(args.len() < 1_300);
    let body = json!({"messages": [
        {"role": "user", "content": "sum these"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "sum", "arguments": args}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "done"},
        {"role": "user", "content": "and now?"}
    ], "max_tokens": 1});
    let resp = send(client().post(h.url("/v1/chat/completions")).json(&body)).await;
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
    let _ = resp.text().await;
    let log = h.log.lock().unwrap().clone();
    let counted = log[0]["input_tokens_counted"].as_u64().unwrap();
    // Each number alone: 16 digits, a point and a zero, and the space before it.
    assert!(counted >= 250 * 19, "the arguments as rendered: {}", log[0]);
    assert_ne!(log[0]["lane"], "small", "{}", log[0]);
    h.shutdown().await;
}

/// A vision model's tokens follow a picture's resolution, not its bytes (Qwen2.5-VL: a token
/// per 28 x 28 pixels, up to 16,384). With `classify.image_token_pixels` the gateway reads the
/// size from a `data:` URL's header: a few hundred bytes of PNG at 3,584 x 3,584 pixels (the
/// largest picture, which the gateway counted as its JSON plus `image_part_tokens`, a small
/// question once the media line had learned down) is a large request, and a 300 KB photo of
/// 800 x 600 a small one (its payload was counted as text: past the large lane). Against the
/// simulator run as such a vision model, the count is never below the engine's.
#[tokio::test]
async fn a_picture_is_counted_by_its_resolution_not_its_bytes() {
    let flags = [
        "--speed",
        "100",
        "--profile",
        "tiny-test",
        "--max-model-len",
        "32768",
        "--image-token-pixels",
        "28",
        "--image-max-tokens",
        "16384",
    ];
    let h = harness(&flags, |c| {
        c.upstream.max_model_len = std::num::NonZeroU32::new(32_768).unwrap();
        c.classify.image_part_tokens = 16_384;
        c.classify.image_token_pixels = 28;
    })
    .await;
    let question = "what does this picture show?";
    let cases = [
        (
            "a 3,584 x 3,584 PNG of 600 bytes",
            png_data_url(3584, 3584, 520),
            "large",
        ),
        (
            "an 8,000 x 8,000 PNG",
            png_data_url(8000, 8000, 16),
            "large",
        ),
        ("a 640 x 480 PNG", png_data_url(640, 480, 2_000), "small"),
        (
            "an 800 x 600 PNG of 300 KB",
            png_data_url(800, 600, 300_000),
            "small",
        ),
    ];
    for (name, url, lane) in &cases {
        for part in [
            json!({"type": "image_url", "image_url": {"url": url}}),
            json!({"type": "input_image", "image_url": url}),
        ] {
            let body = json!({"max_tokens": 8, "messages": [{"role": "user", "content": [
                {"type": "text", "text": question}, part]}]});
            let resp = send(client().post(h.url("/v1/chat/completions")).json(&body)).await;
            assert_eq!(resp.status(), 200, "{name}: {}", resp.text().await.unwrap());
            let _ = resp.text().await;
            let entry = h.log.lock().unwrap().last().cloned().unwrap();
            let (estimate, engine) = (
                entry["input_tokens_estimated"].as_u64().unwrap(),
                entry["input_tokens"].as_u64().unwrap(),
            );
            assert_eq!(entry["lane"], *lane, "{name}: {entry}");
            assert!(
                estimate >= engine,
                "{name}: estimated {estimate}, the engine counted {engine}"
            );
            // Over by the part's JSON (its payload's digest in place of the payload) and the
            // squares a side rounded up rather than to the nearest: within a tenth.
            assert!(
                estimate <= engine + engine / 10 + 64,
                "{name}: estimated {estimate}, the engine counted {engine}"
            );
        }
    }
    h.shutdown().await;
}
