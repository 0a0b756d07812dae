//! Focusing through `/answer` (issue 20, M11): a course request with a long file and its
//! traceback reaches the engine (the simulator, behind a tap that keeps what it received) as
//! course prefix, turns, question, focused code, trace; the lane and the `meta` event come
//! from the focused size; metrics and the span count it; bad `files` / `language` are 400s
//! naming the field.

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use common::{client, metric, send, sse, Harness};
use serde_json::{json, Value};
use tutor_gateway::classify::TokenCounter;
use tutor_gateway::config::{Config, CourseConfig};
use tutor_gateway::prompt::focus::{self, Focus, FocusMode, FocusSettings, SourceFile};
use tutor_gateway::prompt::Course;

const SIM: &[&str] = &["--speed", "50", "--profile", "tiny-test"];

/// A proxy in front of the simulator that keeps the body of every chat completion it forwards.
struct Tap {
    url: String,
    bodies: Arc<Mutex<Vec<Value>>>,
}

async fn tap(upstream: String) -> Tap {
    let bodies: Arc<Mutex<Vec<Value>>> = Arc::default();
    let kept = Arc::clone(&bodies);
    let app = axum::Router::new().fallback(move |req: Request| {
        let (upstream, kept) = (upstream.clone(), Arc::clone(&kept));
        async move { forward(req, &upstream, &kept).await }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Tap { url, bodies }
}

async fn forward(req: Request, upstream: &str, kept: &Mutex<Vec<Value>>) -> Response {
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    if parts.uri.path() == "/v1/chat/completions" {
        kept.lock()
            .unwrap()
            .push(serde_json::from_slice(&bytes).unwrap());
    }
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut out = reqwest::Client::new()
        .request(parts.method, format!("{upstream}{path}"))
        .body(bytes);
    for (k, v) in &parts.headers {
        if k != "host" && k != "content-length" {
            out = out.header(k, v);
        }
    }
    let resp = send(out).await;
    let mut back = Response::builder().status(resp.status());
    for (k, v) in resp.headers() {
        if k != "content-length" && k != "transfer-encoding" {
            back = back.header(k, v);
        }
    }
    back.body(Body::from_stream(resp.bytes_stream())).unwrap()
}

/// The corpus case the end-to-end test sends: a 378-line library system and its traceback.
struct Fixture {
    code: String,
    trace: String,
}

fn library_case() -> Fixture {
    let dir =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/focus/py_long_library_fines");
    let case: toml::Value =
        toml::from_str(&std::fs::read_to_string(dir.join("case.toml")).unwrap()).unwrap();
    Fixture {
        code: std::fs::read_to_string(dir.join("library.py")).unwrap(),
        trace: case["trace"].as_str().unwrap().to_owned(),
    }
}

/// Focusing as the tests configure it: the defaults, with a parse time limit a debug build on
/// a busy machine never reaches (tests do not depend on timing).
fn settings(mode: FocusMode) -> FocusSettings {
    FocusSettings {
        mode,
        timeout: Duration::from_secs(30),
        ..FocusSettings::default()
    }
}

fn course(id: &str, mode: FocusMode) -> CourseConfig {
    CourseConfig::new(
        id,
        "2026.1",
        "You are a patient Python tutor. Give hints before answers.",
        "Correctness first, then readability.",
        "",
        None,
    )
    .with_focus(settings(mode))
}

/// The simulator, the tap in front of it, and a gateway (shipped configuration, two courses:
/// `py101` focusing, `py101-off` not) in front of the tap.
async fn gateway() -> (Harness, Tap) {
    let sim = vllm_sim::start(&vllm_sim::SimArgs::for_test(SIM))
        .await
        .expect("sim starts");
    let tap = tap(sim.url()).await;
    let mut config = Config::default();
    config.upstream.base_url = tap.url.clone();
    // The focused request (its trace's line numbers count a token a digit) is some 1,200
    // tokens: room for it in the small lane, and the whole file still far above.
    config.classify.small_max_work = std::num::NonZeroU32::new(1_500).unwrap();
    config
        .courses
        .insert("py101".into(), course("py101", FocusMode::Auto));
    config
        .courses
        .insert("py101-off".into(), course("py101-off", FocusMode::Off));
    let (gw, log) = common::gateway(config).await;
    (Harness { sim, gw, log }, tap)
}

/// A subscriber for the test's thread. Every test of this file has one: a test without would
/// leave the `llm.generate` callsite's interest cached as "never" for the span test running
/// beside it.
fn subscriber() -> tracing::subscriber::DefaultGuard {
    tracing::subscriber::set_default(tracing_subscriber::registry())
}

async fn answer(h: &Harness, body: &Value) -> (u16, String) {
    let r = send(client().post(h.url("/answer")).json(body)).await;
    (r.status().as_u16(), r.text().await.unwrap())
}

fn meta(body: &str) -> Value {
    let (_, data) = sse(body)
        .into_iter()
        .find(|(name, _)| name == "meta")
        .unwrap_or_else(|| panic!("no meta event in {body}"));
    serde_json::from_str(&data).unwrap()
}

const QUESTION: &str = "Why does printing the fines crash?";

fn request(course_id: &str, f: &Fixture) -> Value {
    json!({
        "course_id": course_id,
        "turns": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello! What are you working on?"}],
        "prompt": QUESTION,
        "code": f.code,
        "path": "library.py",
        "stack_trace": f.trace,
        "max_output_tokens": 4,
    })
}

/// What the gateway must make of the fixture: the same library call, the same counter (the
/// shipped configuration's heuristic).
fn expected_focus(f: &Fixture) -> Focus {
    focus::focus(
        &[SourceFile {
            path: Some("library.py".into()),
            code: f.code.clone(),
        }],
        None,
        Some(&f.trace),
        Some(QUESTION),
        &settings(FocusMode::Auto),
        &|t| TokenCounter::Heuristic.count_text(t),
    )
}

#[tokio::test]
async fn the_engine_gets_prefix_turns_question_focused_code_then_trace() {
    let _subscriber = subscriber();
    let (h, tap) = gateway().await;
    let f = library_case();
    let want = expected_focus(&f);
    assert_eq!(want.outcome.as_str(), "focused");
    let focused_text = want.text.clone().unwrap();

    let (status, body) = answer(&h, &request("py101", &f)).await;
    assert_eq!(status, 200, "{body}");
    let m = meta(&body);
    assert_eq!(
        m["focus"],
        json!({
            "outcome": "focused",
            "original_tokens": want.original_tokens,
            "sent_tokens": want.sent_tokens,
            "functions": ["days_between", "LoanService.overdue_fines", "main"],
        }),
        "{m}"
    );

    let sent = tap.bodies.lock().unwrap().last().cloned().unwrap();
    let messages = sent["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 4, "{messages:?}");
    assert_eq!(messages[0]["role"], "system");
    assert_eq!(
        messages[0]["content"],
        Course::from_config(&h.gw.state.config().courses["py101"])
            .system_prompt
            .as_str()
    );
    assert_eq!(messages[1]["content"], "hi");
    assert_eq!(messages[2]["role"], "assistant");
    let user = messages[3]["content"].as_str().unwrap();
    assert_eq!(
        user,
        format!(
            "{QUESTION}\n\n{focused_text}\n\nStack trace:\n```\n{}\n```",
            f.trace
        )
    );
    // The model can cite the failing line by its number in the file.
    assert!(
        user.contains("167 |     return (end - start).days\n"),
        "{user}"
    );
    assert!(!user.contains("class ReservationQueue"));

    // The same request with focusing off: the whole file, a bigger lane.
    let (status, body) = answer(&h, &request("py101-off", &f)).await;
    assert_eq!(status, 200, "{body}");
    let off = meta(&body);
    assert_eq!(off["focus"]["outcome"], "off");
    let sent = tap.bodies.lock().unwrap().last().cloned().unwrap();
    let user_off = sent["messages"][3]["content"].as_str().unwrap().to_owned();
    assert!(
        user_off.contains(&format!("My code (`library.py`):\n```\n{}\n```", f.code)),
        "the whole file as sent before focusing existed"
    );
    // Classification sees what is sent: the focused request is small, the whole file goes to
    // a bigger lane.
    assert_eq!(m["lane"], "small", "{m}");
    assert!(
        matches!(off["lane"].as_str(), Some("medium" | "large")),
        "{off}"
    );
    let saved = want.saved();

    let text = h.metrics_text().await;
    assert_eq!(
        metric(
            &text,
            r#"tutor_gateway_focus_outcome_total{outcome="focused"}"#
        ),
        1.0
    );
    assert_eq!(
        metric(&text, r#"tutor_gateway_focus_outcome_total{outcome="off"}"#),
        1.0
    );
    assert_eq!(
        metric(
            &text,
            r#"tutor_gateway_focus_outcome_total{outcome="fallback_parse"}"#
        ),
        0.0
    );
    assert_eq!(
        metric(&text, "tutor_gateway_focus_tokens_saved_total"),
        saved as f64
    );
    assert_eq!(metric(&text, "tutor_gateway_focus_seconds_count"), 1.0);
    h.shutdown().await;
}

#[tokio::test]
async fn fallbacks_send_the_whole_code_and_say_why() {
    let _subscriber = subscriber();
    let (h, tap) = gateway().await;
    let code = "def area(r)\n    return 3.14 * r * r\n";
    let cases = [
        // Does not parse.
        (
            json!({"course_id": "py101", "prompt": "why?", "code": code, "path": "geo.py",
                "stack_trace": "  File \"geo.py\", line 1\n    def area(r)\n               ^\nSyntaxError: expected ':'"}),
            "fallback_parse",
        ),
        // No frame in the given code.
        (
            json!({"course_id": "py101", "prompt": "why?", "code": "x = 1\n", "language": "python",
                "stack_trace": "  File \"/usr/lib/python3/dist-packages/numpy/core.py\", line 4, in f\nValueError"}),
            "fallback_nomatch",
        ),
        // No trace at all.
        (
            json!({"course_id": "py101", "prompt": "Is this idiomatic?", "code": "print('hi')\n"}),
            "fallback_nomatch",
        ),
    ];
    for (req, outcome) in cases {
        let (status, body) = answer(&h, &req).await;
        assert_eq!(status, 200, "{body}");
        let m = meta(&body);
        assert_eq!(m["focus"]["outcome"], outcome, "{m}");
        assert_eq!(m["focus"]["original_tokens"], m["focus"]["sent_tokens"]);
        let sent = tap.bodies.lock().unwrap().last().cloned().unwrap();
        let user = sent["messages"][1]["content"].as_str().unwrap().to_owned();
        let code = req["code"].as_str().unwrap();
        assert!(user.contains(&format!("```\n{code}\n```")), "{user}");
    }
    // A request without code has no `focus` in its meta.
    let (_, body) = answer(
        &h,
        &json!({"course_id": "py101", "prompt": "What is a closure?", "max_output_tokens": 2}),
    )
    .await;
    assert!(meta(&body).get("focus").is_none());
    h.shutdown().await;
}

#[tokio::test]
async fn files_are_focused_together_and_bad_code_fields_are_400s() {
    let _subscriber = subscriber();
    let (h, tap) = gateway().await;
    let files = json!([
        {"path": "shop/main.py", "code": "from shop.pricing import apply_discount\n\n\ndef checkout(total, code):\n    return apply_discount(total, code)\n\n\ndef unrelated():\n    return [i * i for i in range(100)]\n\n\ndef also_unrelated():\n    return {i: str(i) for i in range(100)}\n\n\nprint(checkout(10, 'SPRING'))\n"},
        {"path": "shop/pricing.py", "code": "DISCOUNTS = {'SPRING': 0.1}\n\n\ndef apply_discount(total, code):\n    return total * (1 - DISCOUNTS[code.lower()])\n\n\ndef tax(total):\n    return total * 0.2\n\n\ndef shipping(weight):\n    return 5 if weight < 2 else 9\n"},
        {"path": "README.md", "code": "# shop\n"}
    ]);
    let trace = "Traceback (most recent call last):\n  File \"/app/shop/main.py\", line 16, in <module>\n  File \"/app/shop/main.py\", line 5, in checkout\n  File \"/app/shop/pricing.py\", line 5, in apply_discount\nKeyError: 'spring'";
    // README.md has no grammar: nothing can be focused.
    let (status, body) = answer(
        &h,
        &json!({"course_id": "py101", "prompt": "why?", "files": files, "stack_trace": trace}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(meta(&body)["focus"]["outcome"], "fallback_parse");
    let sent = tap.bodies.lock().unwrap().last().cloned().unwrap();
    let user = sent["messages"][1]["content"].as_str().unwrap().to_owned();
    assert!(
        user.contains("File `README.md`:\n```\n# shop\n\n```"),
        "{user}"
    );

    let two = json!([files[0].clone(), files[1].clone()]);
    let (status, body) = answer(
        &h,
        &json!({"course_id": "py101", "prompt": "why?", "files": two, "stack_trace": trace}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let m = meta(&body);
    assert_eq!(m["focus"]["outcome"], "focused", "{m}");
    assert_eq!(
        m["focus"]["functions"],
        json!(["shop/main.py:checkout", "shop/pricing.py:apply_discount"])
    );
    let sent = tap.bodies.lock().unwrap().last().cloned().unwrap();
    let user = sent["messages"][1]["content"].as_str().unwrap().to_owned();
    assert!(
        user.contains("File `shop/pricing.py`:\n```python\n1 | DISCOUNTS = {'SPRING': 0.1}\n"),
        "{user}"
    );
    assert!(!user.contains("def shipping"), "{user}");

    for (req, field, says) in [
        (
            json!({"course_id": "py101", "code": "x", "files": two}),
            "files",
            "not both",
        ),
        (
            json!({"course_id": "py101", "files": []}),
            "files",
            "1 to 64",
        ),
        (
            json!({"course_id": "py101", "files": [{"path": " ", "code": "x"}]}),
            "files",
            "files[0].path",
        ),
        (
            json!({"course_id": "py101", "files": [{"path": "a.py", "code": "x"}, {"path": "a.py", "code": "y"}]}),
            "files",
            "files[1].path",
        ),
        (
            json!({"course_id": "py101", "files": [{"path": "a.py"}]}),
            "",
            "files[0]: missing field `code`",
        ),
        (
            json!({"course_id": "py101", "code": "x", "language": "cobol"}),
            "language",
            "python, javascript",
        ),
        (
            json!({"course_id": "py101", "prompt": "hi", "language": "python"}),
            "language",
            "describes",
        ),
        (
            json!({"course_id": "py101", "prompt": "hi", "path": "a.py"}),
            "path",
            "`path`",
        ),
        (
            json!({"prompt": "hi", "files": two}),
            "course_id",
            "need a `course_id`",
        ),
    ] {
        let (status, body) = answer(&h, &req).await;
        assert_eq!(status, 400, "{req}: {body}");
        let err: Value = serde_json::from_str(&body).unwrap();
        if !field.is_empty() {
            assert_eq!(err["error"]["param"], field, "{body}");
        }
        assert!(
            err["error"]["message"].as_str().unwrap().contains(says),
            "{body}"
        );
    }
    h.shutdown().await;
}

#[tokio::test]
async fn the_span_carries_the_outcome_and_the_tokens_saved() {
    let traces = common::traces::traces();

    let (h, _tap) = gateway().await;
    let f = library_case();
    let want = expected_focus(&f);
    let (status, body) = answer(&h, &request("py101", &f)).await;
    assert_eq!(status, 200, "{body}");
    let generate = || traces.generate_spans();
    // The span closes when the handler is done, which may be just after the last byte.
    common::eventually("the span ended", || !generate().is_empty()).await;
    let spans = generate();
    assert_eq!(spans.len(), 1);
    let attr =
        |k: &str| common::traces::attr(&spans[0], k).unwrap_or_else(|| panic!("{k} missing"));
    assert_eq!(attr("llm.focus.outcome").as_str(), "focused");
    assert_eq!(
        attr("llm.focus.tokens_saved"),
        opentelemetry::Value::I64(i64::from(want.saved()))
    );
    h.shutdown().await;
}

#[test]
fn a_course_sets_its_focusing_and_bad_values_name_their_key() {
    let base = "[classify]\ntokenizer = \"heuristic\"\n[courses.py101]\nversion = \"1\"\ninstructions = \"Be a tutor.\"\n";
    let c = Config::from_toml_str(base).unwrap();
    assert_eq!(c.courses["py101"].focus, FocusSettings::default());
    let c = Config::from_toml_str(&format!(
        "{base}focus = \"off\"\nfocus_token_target = 900\nfocus_depth = 2\nfocus_max_bytes = 4096\nfocus_timeout_ms = 20\n"
    ))
    .unwrap();
    assert_eq!(
        c.courses["py101"].focus,
        FocusSettings {
            mode: FocusMode::Off,
            token_target: 900,
            depth: 2,
            max_bytes: 4096,
            timeout: Duration::from_millis(20),
            whole_parse: false,
        }
    );
    for (key, value) in [
        ("focus", "\"sometimes\""),
        ("focus_token_target", "0"),
        ("focus_depth", "9"),
        ("focus_max_bytes", "0"),
        ("focus_timeout_ms", "0"),
        ("focus_timeout_ms", "60000"),
    ] {
        let err = Config::from_toml_str(&format!("{base}{key} = {value}\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains(&format!("courses.py101.{key}")), "{err}");
    }
}
