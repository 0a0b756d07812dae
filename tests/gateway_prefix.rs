//! Prefix-cache discipline against the simulator (issue 8, M17-M20): canonical tool schemas
//! make shuffled schemas hit vLLM's prefix cache; the gateway's token counters agree with the
//! engine's; course prompts put the stable prefix first; per-fingerprint series stay bounded.

mod common;

use common::{client, family_total, flags, gateway, get_text, harness, send, words, Harness};
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde_json::{json, Value};
use tutor_gateway::config::{Config, CourseConfig};
use tutor_gateway::prompt::Course;
use tutor_testkit::bench::shuffled;

const SIM: &str =
    "--speed 20 --profile tiny-test --enable-prompt-tokens-details --enable-prefix-caching";

/// Sum of every sample of `name` (any labels) in a Prometheus exposition.
fn tool_schemas() -> Value {
    let param = |d: &str| json!({"type": "string", "description": d, "minLength": 1});
    let tool = |name: &str, d: &str| {
        json!({"type": "function", "function": {"name": name, "description": d, "strict": true,
            "parameters": {"type": "object", "additionalProperties": false,
                "required": ["path", "args"],
                "properties": {"path": param("file to use"), "args": param("arguments"),
                    "timeout": {"type": "integer", "minimum": 1, "maximum": 60}}}}})
    };
    json!([
        tool("run_tests", "Run the student's unit tests."),
        tool("lint", "Run the linter on a file."),
        tool("explain_error", "Explain a Python error message.")
    ])
}

struct Run {
    ratio_after_first: f64,
    fingerprints: Vec<String>,
    gateway: (f64, f64),
    sim: (f64, f64),
}

/// 50 sequential requests for one course whose tool schemas arrive with keys in random order.
async fn fifty_shuffled(canonicalize: bool) -> Run {
    let h = harness(&flags(SIM), |c| {
        c.prefix_cache.canonicalize_tools = canonicalize
    })
    .await;
    let before = get_text(format!("{}/metrics", h.sim.url())).await;
    let mut rng = StdRng::seed_from_u64(8);
    let system = words(
        300,
        "You are the py101 tutor. Give hints, never full solutions.",
    );
    for i in 0..50 {
        let body = json!({
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": words(20, &format!("question {i}:"))}],
            "tools": shuffled(&tool_schemas(), &mut rng),
            "max_tokens": 4,
        });
        let r = send(client().post(h.url("/v1/chat/completions")).json(&body)).await;
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    }
    let gw = get_text(h.url("/metrics")).await;
    let after = get_text(format!("{}/metrics", h.sim.url())).await;
    let lines: Vec<Value> = h.log.lock().unwrap().clone();
    assert_eq!(lines.len(), 50);
    let (mut input, mut cached) = (0.0, 0.0);
    for l in &lines[1..] {
        input += l["input_tokens"].as_f64().unwrap();
        cached += l["cached_tokens"].as_f64().unwrap();
    }
    let q = "vllm:prefix_cache_queries_total";
    let hits = "vllm:prefix_cache_hits_total";
    let run = Run {
        ratio_after_first: cached / input,
        fingerprints: lines
            .iter()
            .map(|l| l["fingerprint"].as_str().unwrap().to_owned())
            .collect(),
        gateway: (
            family_total(&gw, "tutor_gateway_prefix_cache_queries_total"),
            family_total(&gw, "tutor_gateway_prefix_cache_hits_total"),
        ),
        sim: (
            family_total(&after, q) - family_total(&before, q),
            family_total(&after, hits) - family_total(&before, hits),
        ),
    };
    h.shutdown().await;
    run
}

#[tokio::test]
async fn canonical_tools_make_shuffled_schemas_hit_and_counters_agree_with_the_engine() {
    let on = fifty_shuffled(true).await;
    let off = fifty_shuffled(false).await;
    eprintln!(
        "cached-token ratio after the first request: canonical {:.3}, as sent {:.3}",
        on.ratio_after_first, off.ratio_after_first
    );
    assert!(on.ratio_after_first > 0.9, "{}", on.ratio_after_first);
    assert!(off.ratio_after_first < 0.15, "{}", off.ratio_after_first);
    // One fingerprint for the course: it never depended on key order (M18), so with
    // canonicalization off the same fingerprint shows the lost hits (M19).
    for run in [&on, &off] {
        assert!(run.fingerprints.iter().all(|f| *f == run.fingerprints[0]));
    }
    assert_eq!(on.fingerprints[0], off.fingerprints[0]);
    // Sequential requests, no preemption: the engine counts each prompt once, at its first
    // scheduling, and reports the same hit in usage, so the counters agree exactly.
    for run in [&on, &off] {
        assert_eq!(
            run.gateway, run.sim,
            "gateway (queries, hits) vs sim deltas"
        );
    }
}

fn py101(tools: Option<Value>) -> CourseConfig {
    CourseConfig::new(
        "py101",
        "2026.1",
        &words(200, "You are a patient Python tutor."),
        "Correctness first, then readability.",
        "Never write the whole solution.",
        tools,
    )
}

async fn answer(h: &Harness, body: Value) -> (u16, String) {
    let r = send(client().post(h.url("/answer")).json(&body)).await;
    (r.status().as_u16(), r.text().await.unwrap())
}

#[tokio::test]
async fn answer_with_a_course_puts_the_stable_prefix_first_and_it_hits() {
    let course = py101(Some(tool_schemas()));
    let fp = Course::from_config(&course).fingerprint;
    let h = harness(&flags(SIM), |c| {
        c.courses.insert("py101".into(), course);
    })
    .await;
    for (i, student) in ["alice", "bob"].iter().enumerate() {
        let (status, body) = answer(
            &h,
            json!({"course_id": "py101", "prompt": format!("Why does my loop fail, {student}?"),
                   "code": format!("for i in range({i}): print(x)"),
                   "stack_trace": "NameError: name 'x' is not defined",
                   "turns": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
                   "max_output_tokens": 4}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }
    let lines: Vec<Value> = h.log.lock().unwrap().clone();
    assert_eq!(lines.len(), 2);
    for l in &lines {
        assert_eq!(l["fingerprint"], fp.as_str());
    }
    // The second student's request reuses the whole course prefix (system + tools).
    let cached = lines[1]["cached_tokens"].as_u64().unwrap();
    let input = lines[1]["input_tokens"].as_u64().unwrap();
    assert!(
        cached >= 1200 && input - cached < 150,
        "{cached} of {input}"
    );

    // GET /answer takes course_id too: same prefix, same fingerprint.
    let r =
        send(client().get(h.url("/answer?prompt=why&max_output_tokens=2&course_id=py101"))).await;
    assert_eq!(r.status(), 200);
    let _ = r.text().await.unwrap();
    let get = h.log.lock().unwrap().last().cloned().unwrap();
    assert_eq!(get["fingerprint"], fp.as_str());
    assert!(get["cached_tokens"].as_u64().unwrap() >= 1200, "{get}");

    let (status, body) = answer(&h, json!({"course_id": "nope", "prompt": "hi"})).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("course_id"), "{body}");
    let (status, body) = answer(&h, json!({"prompt": "hi", "code": "x = 1"})).await;
    assert_eq!(status, 400, "{body}");
    // The course's system message is the only instruction: no turn may speak with its weight.
    for role in ["system", "developer", "function"] {
        let (status, body) = answer(
            &h,
            json!({"course_id": "py101", "messages": [{"role": role, "content": "override"}], "prompt": "hi"}),
        )
        .await;
        assert_eq!(status, 400, "{role}: {body}");
        assert!(body.contains("\"param\":\"turns\""), "{role}: {body}");
    }
    h.shutdown().await;
}

#[test]
fn a_course_with_template_variables_is_refused_with_its_dotted_path() {
    let base = "[classify]\ntokenizer = \"heuristic\"\n";
    let ok = format!(
        "{base}[courses.py101]\nversion = \"1\"\ninstructions = \"Be a tutor.\"\n\
         tools = '[{{\"type\": \"function\", \"function\": {{\"name\": \"t\"}}}}]'\n"
    );
    let c = Config::from_toml_str(&ok).unwrap();
    assert_eq!(
        c.courses["py101"].tools.as_ref().unwrap()[0]["type"],
        "function"
    );
    for (key, value) in [
        ("instructions", "Hello {{student_name}}"),
        ("rubric", "Grade {student} fairly"),
        ("safety", "Updated 2026-11-29"),
        ("instructions", "You talk to <STUDENT_NAME>"),
        ("rubric", "Due ${deadline}"),
    ] {
        let src = format!(
            "{base}[courses.py101]\nversion = \"1\"\ninstructions = \"Be a tutor.\"\n{key} = \"{value}\"\n"
        );
        let src = src.replacen(
            "instructions = \"Be a tutor.\"\ninstructions",
            "instructions",
            1,
        );
        let err = Config::from_toml_str(&src).unwrap_err().to_string();
        assert!(err.contains(&format!("courses.py101.{key}")), "{err}");
        assert!(!err.contains(value), "values are not echoed: {err}");
    }
    let err = Config::from_toml_str(&format!("{base}[courses.py101]\nversion = \"1\"\n"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("courses.py101.instructions"), "{err}");
}

#[tokio::test]
async fn per_fingerprint_series_never_exceed_n_plus_one() {
    let h = harness(&flags(SIM), |c| {
        c.prefix_cache.fingerprint_labels = 2;
        c.prefix_cache.label_after_requests = 1;
    })
    .await;
    for i in 0..6 {
        let body = json!({"messages": [{"role": "system", "content": format!("Course {i}.")},
                                       {"role": "user", "content": "hi"}], "max_tokens": 2});
        let r = send(client().post(h.url("/v1/chat/completions")).json(&body)).await;
        assert_eq!(r.status(), 200);
    }
    let text = get_text(h.url("/metrics")).await;
    for family in [
        "tutor_gateway_prefix_cache_fingerprint_queries_total",
        "tutor_gateway_prefix_cache_fingerprint_hits_total",
        "tutor_gateway_prefix_cache_drift_total",
    ] {
        let series = text
            .lines()
            .filter(|l| l.starts_with(&format!("{family}{{")))
            .count();
        assert!(series <= 3, "{family}: {series} series\n{text}");
    }
    let labelled: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("tutor_gateway_prefix_cache_fingerprint_queries_total{"))
        .collect();
    assert_eq!(labelled.len(), 3, "{labelled:?}");
    assert!(labelled.iter().any(|l| l.contains("fingerprint=\"other\"")));
    assert!(
        family_total(
            &text,
            "tutor_gateway_prefix_cache_fingerprint_queries_total"
        ) > 0.0
    );
    h.shutdown().await;
}

/// Eight sequential requests of one course (a 600-word system prompt, a short question each):
/// per request, (estimated input, cached tokens vLLM reported, prefill reservation taken).
async fn course_requests(discount: bool) -> Vec<(u64, u64, u64)> {
    let h = harness(&flags(SIM), |c| {
        c.admission.prefill_discount_cached = discount
    })
    .await;
    let system = words(600, "You are the algo201 tutor. Review the student's code.");
    for i in 0..8 {
        let body = json!({
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": words(20, &format!("question {i}:"))}],
            "max_tokens": 8
        });
        let r = send(client().post(h.url("/v1/chat/completions")).json(&body)).await;
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
    }
    let lines: Vec<Value> = h.log.lock().unwrap().clone();
    h.shutdown().await;
    lines
        .iter()
        .map(|l| {
            let n = |k: &str| l[k].as_u64().unwrap_or_else(|| panic!("{k} in {l}"));
            (
                n("input_tokens_estimated"),
                n("cached_tokens"),
                n("prefill_tokens_reserved"),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_cached_course_prefix_is_left_out_of_the_prefill_reservation() {
    let on = course_requests(true).await;
    assert_eq!(on.len(), 8);
    // Nothing is discounted before three requests of the fingerprint were measured.
    for &(estimate, _, reserved) in &on[..3] {
        assert_eq!(reserved, estimate, "{on:?}");
    }
    // Then the prefix the engine reported cached is left out, never more than it reported.
    let most_cached = on.iter().map(|r| r.1).max().unwrap();
    assert!(most_cached > 300, "the course prefix hits: {on:?}");
    let &(estimate, _, reserved) = on.last().unwrap();
    assert!(
        reserved < estimate && reserved + most_cached >= estimate,
        "{on:?}"
    );
    // Off: the whole estimate, always.
    let off = course_requests(false).await;
    assert!(off.iter().all(|&(e, _, r)| r == e), "{off:?}");
}

#[tokio::test]
async fn a_request_that_differs_where_vllms_cache_looks_is_not_discounted() {
    // The course prefix hits and is discounted; the same system text with something else vLLM
    // caches by (a system message's reasoning, a cache salt, template values) misses the
    // cache, and used to get the same discount (its fingerprint is the same): the whole prompt
    // prefilled against a reservation of a few tokens.
    let h = harness(&flags(SIM), |c| c.admission.prefill_discount_cached = true).await;
    let system = words(600, "You are the algo201 tutor. Review the student's code.");
    let ask = |i: usize, extra: Value| {
        let mut sys = json!({"role": "system", "content": system});
        let mut body = json!({"max_tokens": 8});
        for (k, v) in extra.as_object().unwrap() {
            if k == "reasoning" {
                sys[k] = v.clone();
            } else {
                body[k] = v.clone();
            }
        }
        body["messages"] =
            json!([sys, {"role": "user", "content": words(20, &format!("question {i}:"))}]);
        body
    };
    let variants = [
        json!({}),
        json!({"reasoning": "the syllabus changed"}),
        json!({"cache_salt": "tenant-b"}),
        json!({"chat_template_kwargs": {"date_string": "7 Sep 2026"}}),
    ];
    for i in 0..6 {
        let r = send(
            client()
                .post(h.url("/v1/chat/completions"))
                .json(&ask(i, json!({}))),
        )
        .await;
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
    }
    for (i, v) in variants.iter().enumerate() {
        let r = send(
            client()
                .post(h.url("/v1/chat/completions"))
                .json(&ask(10 + i, v.clone())),
        )
        .await;
        assert_eq!(r.status(), 200, "{v}");
        r.bytes().await.unwrap();
    }
    let lines: Vec<Value> = h.log.lock().unwrap().clone();
    h.shutdown().await;
    let n = |l: &Value, k: &str| l[k].as_u64().unwrap_or_else(|| panic!("{k} in {l}"));
    let plain = &lines[6];
    assert!(
        n(plain, "prefill_tokens_reserved") < n(plain, "input_tokens_estimated"),
        "the warm course prefix is discounted: {plain}"
    );
    for (line, v) in lines[7..].iter().zip(&variants[1..]) {
        assert_eq!(
            n(line, "prefill_tokens_reserved"),
            n(line, "input_tokens_estimated"),
            "{v}: {line}"
        );
    }
}

/// The discount learns what a prefix finds cached, not what a request's own long message
/// finds: a client that sends the same system prompt and the same long message again and
/// again (each finding nearly its whole prompt cached), then a new long message, has that
/// new message reserved. The discount used to learn the whole cached count: the new long
/// prompts reserved next to no prefill and went past the prefill budget.
#[tokio::test]
async fn the_discount_learns_the_prefix_not_a_message_sent_again() {
    let h = harness(&flags(SIM), |c| c.admission.prefill_discount_cached = true).await;
    let system = words(100, "You are the algo201 tutor. Review the student's code.");
    let ask = |message: String| {
        json!({"max_tokens": 4,
               "messages": [{"role": "system", "content": system},
                            {"role": "user", "content": message}]})
    };
    let again = words(1_500, "the same long submission:");
    for _ in 0..6 {
        let r = send(
            client()
                .post(h.url("/v1/chat/completions"))
                .json(&ask(again.clone())),
        )
        .await;
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
    }
    let r = send(
        client()
            .post(h.url("/v1/chat/completions"))
            .json(&ask(words(1_500, "a new long submission:"))),
    )
    .await;
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
    let lines: Vec<Value> = h.log.lock().unwrap().clone();
    h.shutdown().await;
    let n = |l: &Value, k: &str| l[k].as_u64().unwrap_or_else(|| panic!("{k} in {l}"));
    let warm = &lines[5];
    assert!(
        n(warm, "cached_tokens") > n(warm, "input_tokens_estimated") / 2,
        "the repeated message was found cached: {warm}"
    );
    let new = &lines[6];
    assert!(
        n(new, "prefill_tokens_reserved") > n(new, "input_tokens_estimated") * 3 / 4,
        "the new message is reserved: {new}"
    );
}

/// An engine that failed may come back with an empty prefix cache (a restart): the discount a
/// prefix learnt before would admit its cold prefills as cached ones until a request of that
/// prefix finished again. A request the engine failed (here: unreachable) makes every prefix
/// learn again from nothing.
#[tokio::test]
async fn an_engine_failure_forgets_what_prefixes_found_cached() {
    let sim = vllm_sim::start(&vllm_sim::SimArgs::for_test(&flags(SIM)))
        .await
        .unwrap();
    let engine = tutor_testkit::Outage::new(sim.addr.port()).await;
    let mut config = Config::default();
    config.upstream.base_url = format!("http://127.0.0.1:{}", engine.port());
    config.admission.prefill_discount_cached = true;
    let (gw, log) = gateway(config).await;
    let system = words(600, "You are the algo201 tutor. Review the student's code.");
    let ask = |i: usize| {
        json!({"max_tokens": 8, "messages": [{"role": "system", "content": system},
            {"role": "user", "content": words(20, &format!("question {i}:"))}]})
    };
    let url = format!("{}/v1/chat/completions", gw.url());
    let status = |i: usize| {
        let (url, body) = (url.clone(), ask(i));
        async move {
            let r = send(client().post(url).json(&body)).await;
            let s = r.status().as_u16();
            r.bytes().await.unwrap();
            s
        }
    };
    for i in 0..6 {
        assert_eq!(status(i).await, 200);
    }
    engine.cut();
    // The connection closes at once: an upstream error (502).
    assert_eq!(status(6).await, 502, "the engine went away");
    engine.restore();
    assert_eq!(status(7).await, 200);
    let lines: Vec<Value> = log.lock().unwrap().clone();
    drop(gw);
    sim.shutdown().await;
    let n = |l: &Value, k: &str| l[k].as_u64().unwrap_or_else(|| panic!("{k} in {l}"));
    let warm = &lines[5];
    assert!(
        n(warm, "prefill_tokens_reserved") < n(warm, "input_tokens_estimated"),
        "the warm prefix is discounted: {warm}"
    );
    let after = &lines[7];
    assert_eq!(
        n(after, "prefill_tokens_reserved"),
        n(after, "input_tokens_estimated"),
        "nothing is discounted after the engine failed: {after}"
    );
}
