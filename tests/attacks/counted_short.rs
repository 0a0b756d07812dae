//! A prompt the estimate counts short. The estimate's correction is a line learned from what
//! clients' prompts cost the engine, shared by every client: text a template drops
//! (`chat_template_kwargs` keys it never reads) taught it to count a later rendered value four
//! times short, and a question the engine prefilled at 3,950 tokens rode the small lane on an
//! estimate of 975, its reservation never grown: the relay judged it by the estimate, not by
//! the exact prompt count vLLM sends on every chunk. Now a request with `chat_template_kwargs`
//! teaches nothing, and from the first token the engine's count decides: the request is moved
//! out of a lane it does not fit, and in the large lane its reservation grows to what it holds.

use serde_json::json;
use tutor_gateway::classify::{ContentKind, KindCounts};
use tutor_gateway::lane::Lane;

use crate::common::*;

/// Every stream stalls after two tokens with the connection open: the request stays held.
const STALLS: &[&str] = &[
    "--speed",
    "50",
    "--profile",
    "tiny-test",
    "--stall-after-tokens",
    "2",
];

/// Teaches the shared prose line what a client could: the engine counts a quarter of what the
/// gateway counted (held to the heuristic's floor, 0.4).
fn taught_short(h: &Harness) {
    let calibration = h.gw.state.calibration();
    let mut counts = KindCounts::default();
    counts.add(ContentKind::Prose, 4_000);
    for _ in 0..40 {
        calibration.observe("any-model", &counts, 1_000);
    }
}

/// The request log's entry of the `i`th request, once written.
async fn entry(h: &Harness, i: usize) -> serde_json::Value {
    eventually("the request is logged", || h.log.lock().unwrap().len() > i).await;
    h.log.lock().unwrap()[i].clone()
}

#[tokio::test]
async fn a_prompt_the_engine_counts_far_past_its_estimate_is_judged_by_the_count() {
    let h = harness(STALLS, |c| {
        c.upstream.idle_timeout = std::time::Duration::from_secs(120);
    })
    .await;
    taught_short(&h);

    // A question of about 2,000 tokens, estimated at about 800: small by the estimate, medium
    // by what the engine holds. It is moved at its first token.
    let question = words(2_000, "q");
    let ask = json!({"messages": [{"role": "user", "content": question}], "max_tokens": 50,
                     "stream": true});
    let url = h.url("/v1/chat/completions");
    let small = tokio::spawn({
        let url = url.clone();
        async move { post_text(url, &ask).await }
    });
    eventually("the question is held in the medium lane", || {
        h.in_flight(Lane::Medium) == 1
    })
    .await;
    assert_eq!(h.in_flight(Lane::Small), 0);
    small.abort();
    eventually("every seat is back", || h.idle()).await;
    let first = entry(&h, 0).await;
    let estimate = first["input_tokens_estimated"].as_u64().unwrap();
    assert!(estimate < 1_000, "the correction counted it short: {first}");

    // A review of about 12,000 tokens estimated at about 4,800 (large with its output): its
    // reservation grows to the engine's count and its output.
    let review = words(12_000, "r");
    let body = json!({"messages": [{"role": "user", "content": review}], "max_tokens": 1_000,
                      "stream": true});
    let large = tokio::spawn(async move { post_text(url, &body).await });
    eventually(
        "the review's reservation holds what the engine counted",
        || {
            let snapshot = h.gw.state.admission().snapshot();
            snapshot.lane(Lane::Large).in_flight == 1
                && snapshot.lane(Lane::Large).reserved_tokens > 12_000
        },
    )
    .await;
    large.abort();
    eventually("every seat is back", || h.idle()).await;
    h.shutdown().await;
}

/// Text a template never renders (a `chat_template_kwargs` key it does not read) costs the
/// engine nothing: such a request must not teach the correction anything.
#[tokio::test]
async fn template_kwargs_teach_the_estimate_nothing() {
    kwargs_teach_nothing(false).await;
}

/// [`template_kwargs_teach_the_estimate_nothing`] with every request counted by the engine
/// before admission (`classify.exact_count = "near_limits"`, a margin of 100%): that count
/// taught the correction whatever the request (the kwargs included).
#[tokio::test]
async fn template_kwargs_counted_exactly_teach_the_estimate_nothing() {
    kwargs_teach_nothing(true).await;
}

async fn kwargs_teach_nothing(exact: bool) {
    // Ten switches the template never reads, each with as long a value as is accepted.
    let keys: Vec<String> = (0..10).map(|k| format!("unused_{k}")).collect();
    let listed = keys.clone();
    let h = harness(&["--speed", "100", "--profile", "tiny-test"], move |c| {
        c.fields.template_kwargs = listed;
        if exact {
            c.classify.exact_count = tutor_gateway::config::ExactCount::NearLimits;
            c.classify.exact_count_margin_percent = 100;
        }
    })
    .await;
    let lines = || ContentKind::ALL.map(|k| h.gw.state.calibration().expect(None, k, 1_000));
    let before = lines();
    for i in 0..10 {
        let kwargs: serde_json::Map<String, serde_json::Value> = keys
            .iter()
            .map(|k| {
                let mut value = words(60, &format!("{i}{k}"));
                value.truncate(tutor_gateway::config::MAX_TEMPLATE_KWARG_BYTES);
                (k.clone(), json!(value))
            })
            .collect();
        let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                          "chat_template_kwargs": kwargs});
        let resp = send(client().post(h.url("/v1/chat/completions")).json(&body)).await;
        assert_eq!(resp.status(), 200);
        let _ = resp.text().await;
    }
    eventually("every request is logged", || {
        h.log.lock().unwrap().len() == 10
    })
    .await;
    assert_eq!(
        before,
        lines(),
        "the lines learned from text a template may never render"
    );
    if exact {
        let m = h.metrics_text().await;
        assert_eq!(
            metric(&m, "tutor_gateway_exact_counts_total{outcome=\"counted\"}"),
            10.0
        );
    }
    h.shutdown().await;
}

/// A pre-emptible answer on a borrowed seat (`jobs.preempt_answers`) whose prompt the engine
/// counts far past its estimate cannot grow where it is (a borrowed seat leaves when asked):
/// it leaves of its own accord (`counted`) and goes on as a continuation that reserves the
/// engine's count, not cut at its first token. (It went on to its end on the estimate's
/// reservation, holding three times that in the engine.)
#[tokio::test]
async fn a_borrowed_seat_counted_short_goes_on() {
    borrowed_seat_counted_short(3).await;
}

/// The same on a seat that can no longer be asked back (`jobs.max_preemptions = 0`, or a run
/// past its last pre-emption, which borrows its own lane's idle seat): still borrowed, so it
/// cannot grow either (it was cut at its first token).
#[tokio::test]
async fn a_borrowed_seat_no_longer_asked_back_counted_short_goes_on() {
    borrowed_seat_counted_short(0).await;
}

/// With `max_preemptions` 0 the review borrows the large lane's own idle seat (nothing holds
/// it); otherwise another lane's, the large one held.
async fn borrowed_seat_counted_short(max_preemptions: u32) {
    let h = harness(&["--speed", "1", "--profile", "tiny-test"], move |c| {
        c.jobs.max_preemptions = max_preemptions;
        c.jobs.preempt_answers = tutor_gateway::config::PreemptAnswers::Marked;
        for lane in Lane::ALL {
            set_lane(c, lane, 1);
        }
    })
    .await;
    taught_short(&h);
    // A long review holds the large lane's only seat (25 s at real speed).
    let blocker = (max_preemptions > 0).then(|| {
        let url = h.url("/v1/chat/completions");
        let body = json!({"messages": [{"role": "user", "content": words(6_000, "b")}],
                          "max_tokens": 5_000, "ignore_eos": true, "stream": true});
        tokio::spawn(async move { post_text(url, &body).await })
    });
    if blocker.is_some() {
        eventually("the blocker holds large", || h.in_flight(Lane::Large) == 1).await;
    }
    // The marked review, counted short (about 4,800 and its 400 out: large), borrows another
    // lane's idle seat.
    let review = json!({"prompt": words(12_000, "r"), "max_output_tokens": 400});
    let resp = send(
        client()
            .post(h.url("/answer"))
            .header("x-tutor-preemptible", "true")
            .json(&review),
    )
    .await;
    let text = resp.text().await.unwrap();
    let events = sse(&text);
    assert!(events.iter().all(|(e, _)| e != "cut"), "{text}");
    assert_eq!(events.last().unwrap().0, "done", "{text}");
    let done: serde_json::Value = serde_json::from_str(&events.last().unwrap().1).unwrap();
    assert_eq!(done["usage"]["output_tokens"], 400, "{done}");
    // Once, where it may still leave (its continuation reserves the count); never on a seat
    // that can no longer be asked back.
    let m = h.metrics_text().await;
    let series = "tutor_gateway_job_preemptions_total{lane=\"large\",reason=\"counted\"}";
    if max_preemptions > 0 {
        assert_eq!(metric(&m, series), 1.0, "{m}");
    } else {
        assert!(!m.contains(series), "{m}");
    }
    if let Some(blocker) = blocker {
        blocker.abort();
    }
    eventually("every seat is back", || h.idle()).await;
    h.shutdown().await;
}

/// A job (pre-emptible, `jobs.preempt`) whose prompt the engine counts far past its estimate,
/// on a seat it borrowed: it leaves of its own accord (`counted`) and its continuation reserves
/// the engine's count, so it leaves once, and its answer is whole. (It ran to its end on the
/// estimate's reservation, holding three times that in the engine.)
#[tokio::test]
async fn a_job_counted_short_on_a_borrowed_seat_goes_on_reserving_the_count() {
    let h = harness(&["--speed", "1", "--profile", "tiny-test"], |c| {
        for lane in Lane::ALL {
            set_lane(c, lane, 1);
        }
    })
    .await;
    taught_short(&h);
    let resp = send(
        client()
            .post(h.url("/jobs"))
            .json(&json!({"prompt": words(12_000, "job"), "max_output_tokens": 400})),
    )
    .await;
    assert_eq!(resp.status(), 202);
    let id = read_json(resp).await["id"].as_str().unwrap().to_owned();
    let url = h.url(&format!("/jobs/{id}"));
    let mut done = serde_json::Value::Null;
    for _ in 0..3_000 {
        done = read_json(send(client().get(&url)).await).await;
        if done["status"] != "queued" && done["status"] != "running" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(done["status"], "done", "{done}");
    assert_eq!(done["preempted"], 1, "{done}");
    assert_eq!(done["answer"]["finish_reason"], "stop", "{done}");
    let m = h.metrics_text().await;
    assert_eq!(
        metric(
            &m,
            "tutor_gateway_job_preemptions_total{lane=\"large\",reason=\"counted\"}"
        ),
        1.0,
        "{m}"
    );
    eventually("every seat is back", || h.idle()).await;
    h.shutdown().await;
}

/// Every stream stalls before its first token, the connection open.
const NO_FIRST_TOKEN: &[&str] = &[
    "--speed",
    "50",
    "--profile",
    "tiny-test",
    "--stall-after-tokens",
    "0",
];

/// `key` is school A's, with a token budget (so its charges are counted).
fn budgeted(c: &mut tutor_gateway::config::Config, key: &str) {
    with_keys(c, &[(key, "school-a")]);
    c.auth.tenants.insert(
        "school-a".into(),
        tutor_gateway::config::TenantBudget {
            tokens_per_minute: Some(1_000_000),
            ..Default::default()
        },
    );
}

/// What the engine counts for `messages` (its `/tokenize`).
async fn engine_count(h: &Harness, messages: &serde_json::Value) -> u64 {
    let counted: serde_json::Value = send(
        client()
            .post(format!("{}/tokenize", h.sim.url()))
            .json(&json!({ "messages": messages })),
    )
    .await
    .json()
    .await
    .unwrap();
    counted["count"].as_u64().unwrap()
}

/// Waits until `n` prompts the engine never reported were counted.
async fn counted_late(h: &Harness, n: u32) {
    tutor_testkit::eventually("the prompt is counted", || async {
        let m = h.metrics_text().await;
        metric(
            &m,
            "tutor_gateway_unreported_prompt_counts_total{outcome=\"counted\"}",
        ) == f64::from(n)
    })
    .await;
}

/// vLLM reports a prompt's tokens with the first token at the earliest. A client that left
/// just before it used to teach the correction nothing and to be charged its estimate: text
/// the estimate counts short stayed counted short for good, its prefills on everyone's time
/// and not on its tenant's budget. Now the engine counts such a prompt once the request
/// ended: its tenant is charged the count, and the count teaches its line.
#[tokio::test]
async fn a_client_that_leaves_before_its_first_token_is_charged_and_taught_the_engines_count() {
    const KEY: &str = "sk-attack-leaves-early-0123456789";
    let h = harness(NO_FIRST_TOKEN, |c| {
        budgeted(c, KEY);
        c.upstream.idle_timeout = std::time::Duration::from_secs(120);
    })
    .await;
    taught_short(&h);
    let messages = json!([{"role": "user", "content": words(2_000, "early")}]);
    let body = json!({"messages": messages, "max_tokens": 50, "stream": true});
    // Sends the question and leaves once its answer's headers came (the engine has it; no
    // token will come).
    let leaves = || {
        let request = client()
            .post(h.url("/v1/chat/completions"))
            .bearer_auth(KEY)
            .json(&body);
        async move {
            let resp = send(request).await;
            assert_eq!(resp.status(), 200);
            drop(resp);
        }
    };
    leaves().await;
    eventually("every seat is back", || h.idle()).await;
    let estimate = entry(&h, 0).await["input_tokens_estimated"]
        .as_u64()
        .unwrap();

    // What the engine counts for this prompt.
    let count = engine_count(&h, &messages).await;
    assert!(estimate * 2 < count, "counted short: {estimate} of {count}");

    counted_late(&h, 1).await;
    // Charged what the engine counts (no output was streamed), not the estimate.
    let usage: serde_json::Value = send(client().get(h.url("/v1/usage")).bearer_auth(KEY))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        usage["budgets"]["tokens_per_minute"]["used"].as_u64(),
        Some(count),
        "{usage}"
    );
    // The count taught the tenant's line: the same prompt is estimated at about its count.
    leaves().await;
    eventually("every seat is back", || h.idle()).await;
    let again = entry(&h, 1).await["input_tokens_estimated"]
        .as_u64()
        .unwrap();
    assert!(again * 10 >= count * 9, "{again} of {count}");
    h.shutdown().await;
}

/// A long prompt prefilled in pieces (`admission.prefill_piece_tokens`) reaches the engine
/// with its first piece. A client that left meanwhile used to be charged nothing (its budget
/// given back whole and its tenant's fleet service too, as for a request that never reached
/// the engine): now its budget the engine's count of its prompt, its service the estimate.
#[tokio::test]
async fn a_client_that_leaves_while_its_prompt_is_prefilled_in_pieces_is_charged_its_count() {
    leaves_during_pieces(None).await;
}

/// [`a_client_that_leaves_while_its_prompt_is_prefilled_in_pieces_is_charged_its_count`] with
/// the quota and the budgets in Redis, where the tenant's fleet service is counted.
#[tokio::test]
async fn with_redis_a_client_that_leaves_during_its_pieces_is_charged_and_served() {
    let redis = crate::redis_common::RedisServer::start();
    leaves_during_pieces(Some(&redis)).await;
}

async fn leaves_during_pieces(redis: Option<&crate::redis_common::RedisServer>) {
    const KEY: &str = "sk-attack-leaves-in-pieces-0123456789";
    let h = harness(NO_FIRST_TOKEN, |c| {
        budgeted(c, KEY);
        c.admission.prefill_piece_tokens = 256;
        c.upstream.idle_timeout = std::time::Duration::from_secs(120);
        if let Some(redis) = redis {
            c.quota.backend = tutor_gateway::config::QuotaBackend::Redis;
            c.quota.redis_url = tutor_gateway::config::RedisUrl::new(redis.url());
        }
    })
    .await;
    let messages = json!([{"role": "user", "content": words(2_000, "pieces")}]);
    let body = json!({"messages": messages, "max_tokens": 50, "stream": true});
    let request = client()
        .post(h.url("/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(&body);
    let asking = tokio::spawn(async move { send(request).await.text().await });
    // Its first piece stalls at the engine: the client leaves while it is prefilled.
    tutor_testkit::eventually("the first piece is at the engine", || async {
        !h.sim_requests().await.is_empty()
    })
    .await;
    asking.abort();
    eventually("every seat is back", || h.idle()).await;
    let count = engine_count(&h, &messages).await;
    counted_late(&h, 1).await;
    tutor_testkit::eventually("charged the engine's count", || async {
        let usage: serde_json::Value = send(client().get(h.url("/v1/usage")).bearer_auth(KEY))
            .await
            .json()
            .await
            .unwrap();
        usage["budgets"]["tokens_per_minute"]["used"].as_u64() == Some(count)
    })
    .await;
    if redis.is_some() {
        let estimate = entry(&h, 0).await["input_tokens_estimated"]
            .as_f64()
            .unwrap();
        tutor_testkit::eventually("its service is the estimate", || async {
            let series = "tutor_gateway_tenant_service_tokens{tenant=\"school-a\"}";
            let m = h.metrics_text().await;
            m.contains(series) && metric(&m, series) == estimate
        })
        .await;
    }
    h.shutdown().await;
}

/// A prompt kept for its late count goes once the engine reported it (with the first token):
/// a long answer does not hold its copy, nor a share of the bytes every request's copy comes
/// out of, to its end.
#[tokio::test]
async fn a_prompt_kept_for_its_count_goes_once_the_engine_reports_it() {
    let h = harness(STALLS, |c| {
        c.upstream.idle_timeout = std::time::Duration::from_secs(120);
    })
    .await;
    let kept = || h.gw.state.kept_for_counts().available_permits();
    let all = kept();
    let body = json!({"messages": [{"role": "user", "content": words(500, "kept")}],
                      "max_tokens": 50, "stream": true});
    let mut resp = send(client().post(h.url("/v1/chat/completions")).json(&body)).await;
    assert_eq!(resp.status(), 200);
    let mut seen = String::new();
    while !seen.contains("\"content\"") {
        let chunk = resp
            .chunk()
            .await
            .unwrap()
            .expect("the answer's first tokens");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    // The answer stalls with its seat held; its prompt's copy is gone.
    assert_eq!(
        h.gw.state
            .admission()
            .snapshot()
            .lane(Lane::Small)
            .in_flight,
        1
    );
    assert_eq!(kept(), all);
    drop(resp);
    eventually("every seat is back", || h.idle()).await;
    h.shutdown().await;
}
