//! Pre-emptible jobs end to end (`jobs.preempt`, issue 35), in process: jobs take every lane's
//! idle seats; an interactive question that finds no seat makes a job give its seat back (the
//! engine aborts it) and is answered at once; the job resumes as a continuation and its answer
//! is the one an uninterrupted run gives (the simulator's text depends only on the prompt),
//! every token counted once; the metrics say so; every seat and token comes back. The same
//! with the Redis backend, where a job pre-empted on one replica is continued on another.

mod common;
#[allow(unused_macros)]
mod jobs;
mod redis_common;

use common::*;
use jobs::{done, job, job_until, start, submit_ok, Backend};
use serde_json::{json, Value};
use tutor_gateway::lane::Lane;

/// About 2.6 ms a token: a 3,000-token review streams for 8 s, still streaming when a loaded
/// machine's test acts on it (at twice the speed it had 4 s, which a busy machine used up).
const FASTER: &[&str] = &[
    "--speed",
    "2",
    "--profile",
    "tiny-test",
    "--mean-output-tokens",
    "1000000",
    // Usage tells the prefix-cache hits (`cached_tokens`), which the recomputed tokens need.
    "--enable-prompt-tokens-details",
];

const REVIEW_TOKENS: u64 = 3_000;

fn review() -> Value {
    json!({"prompt": "review this repository's error handling", "max_output_tokens": REVIEW_TOKENS})
}

#[tokio::test]
async fn a_question_preempts_a_job_that_resumes_to_the_uninterrupted_answer() {
    let h = preempting(Backend::Local, |_| {}).await;
    let base = h.base();
    let ids = streaming_reviews(&base).await;
    assert_eq!(
        Lane::ALL.map(|l| h.in_flight(l)),
        [1, 1, 1],
        "jobs hold every lane's seat"
    );
    // A question finds no small seat: the job on it gives it back.
    ask(h.url("/answer")).await;
    let answers: Vec<Value> = futures::future::join_all(ids.iter().map(|id| done(&base, id))).await;
    let preempted: Vec<u64> = answers
        .iter()
        .map(|v| v["preempted"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(
        preempted.iter().sum::<u64>(),
        1,
        "one job gave its seat: {preempted:?}"
    );
    let text = |v: &Value| v["answer"]["text"].as_str().unwrap().to_owned();
    for v in &answers {
        let usage = &v["answer"]["usage"];
        assert_eq!(
            usage["output_tokens"], REVIEW_TOKENS,
            "every token once: {v}"
        );
        assert_eq!(v["answer"]["finish_reason"], "length", "{v}");
        assert_eq!(
            text(v),
            text(&answers[0]),
            "the resumed answer is the uninterrupted one"
        );
    }
    // The continuation found the original prompt and the answer so far in the prefix cache
    // (the simulator caches full output blocks, as vLLM does): only its last block is computed
    // again.
    let resumed = answers.iter().find(|v| v["preempted"] == 1).unwrap();
    let recomputed = resumed["answer"]["usage"]["recomputed_tokens"]
        .as_u64()
        .unwrap();
    assert!((1..=16).contains(&recomputed), "{resumed}");
    h.metric_reaches(
        "tutor_gateway_job_recomputed_tokens_total{stage=\"decode\"}",
        recomputed as f64,
    )
    .await;
    h.drained().await;
    assert!(h.sim_aborted() >= 1, "the engine's work was aborted");
    h.metric_reaches(
        "tutor_gateway_job_preemptions_total{lane=\"small\",reason=\"seat\"}",
        1.0,
    )
    .await;
    h.metric_reaches(
        "tutor_gateway_preemption_admit_seconds_count{lane=\"small\"}",
        1.0,
    )
    .await;
    h.metric_reaches(
        "tutor_gateway_preemption_ask_admit_seconds_count{lane=\"small\"}",
        1.0,
    )
    .await;
    h.metric_reaches("tutor_gateway_jobs{status=\"done\"}", 3.0)
        .await;
    // The run that gave its seat back is no client's cancel.
    h.metric_reaches(
        "tutor_gateway_requests_total{lane=\"large\",outcome=\"preempted\",route=\"job\"}",
        1.0,
    )
    .await;
    assert_eq!(
        family_total(&h.metrics_text().await, "tutor_gateway_cancellations_total"),
        0.0
    );
    h.shutdown().await;
}

/// A reasoning model whose chat template leaves no think tag before a continued answer (the
/// simulator's default, as DeepSeek-R1's): vLLM's parser streams the continuation as reasoning.
/// The resumed job's answer is still the whole answer, every token counted once.
#[tokio::test]
async fn a_reasoning_models_continuation_is_read_as_the_rest_of_the_answer() {
    let mut flags = FASTER.to_vec();
    flags.extend(["--reasoning-tokens", "20"]);
    let h = preempting_with(Backend::Local, &flags, |_| {}).await;
    let base = h.base();
    // Streaming: past the reasoning, into the answer.
    let ids = streaming_reviews(&base).await;
    ask(h.url("/answer")).await;
    let answers: Vec<Value> = futures::future::join_all(ids.iter().map(|id| done(&base, id))).await;
    let preempted = answers.iter().filter(|v| v["preempted"] == 1).count();
    assert_eq!(preempted, 1, "one job gave its seat: {answers:?}");
    let text = |v: &Value| v["answer"]["text"].as_str().unwrap().to_owned();
    for v in &answers {
        assert_eq!(v["answer"]["usage"]["output_tokens"], REVIEW_TOKENS, "{v}");
        assert_eq!(v["answer"]["finish_reason"], "length", "{v}");
        // The answer's words: the output less its reasoning.
        assert_eq!(
            text(v).split_whitespace().count() as u64,
            REVIEW_TOKENS - 20,
            "{v}"
        );
        assert_eq!(
            text(v),
            text(&answers[0]),
            "the resumed answer is the uninterrupted one"
        );
    }
    h.drained().await;
    h.shutdown().await;
}

/// vLLM reports `cached_tokens` only in a stream's final usage, never in
/// `continuous_usage_stats` chunks: a continuation cut again before its end never says what it
/// found cached. Its prompt is counted as unreported, not as recomputed (it was nearly all a
/// prefix-cache hit); the run that ends reports its own.
#[tokio::test]
async fn a_continuation_cut_again_counts_its_prompt_as_unreported_not_recomputed() {
    let h = preempting(Backend::Local, |c| {
        c.jobs.preempt_cooldown = std::time::Duration::ZERO;
    })
    .await;
    let base = h.base();
    let ids = streaming_reviews(&base).await;
    // The job with the fewest tokens gives its seat back, then resumes on it.
    ask(h.url("/answer")).await;
    let mut cut = None;
    for id in &ids {
        let v = jobs::job(&base, id).await;
        if v["preempted"] == 1 {
            cut = Some((id.clone(), v["output_pieces"].as_u64().unwrap_or(0)));
        }
    }
    let (id, pieces) = cut.expect("one job gave its seat back");
    job_until(&base, &id, "streaming its continuation", |v| {
        v["status"] == "running" && v["output_pieces"].as_u64().unwrap_or(0) > pieces + 5
    })
    .await;
    // It still has the fewest tokens: the next question cuts its continuation mid-stream.
    ask(h.url("/answer")).await;
    let v = done(&base, &id).await;
    let usage = &v["answer"]["usage"];
    assert_eq!(v["preempted"], 2, "{usage}");
    assert_eq!(usage["output_tokens"], REVIEW_TOKENS, "{usage}");
    let unreported = usage["unreported_prompt_tokens"].as_u64().unwrap_or(0);
    let prompt = usage["input_tokens"].as_u64().unwrap();
    assert!(
        unreported > prompt,
        "the cut continuation's prompt (the original and the text so far): {usage}"
    );
    let recomputed = usage["recomputed_tokens"].as_u64().unwrap();
    assert!(
        recomputed <= 16,
        "only the last run's, as reported: {usage}"
    );
    h.metric_reaches(
        "tutor_gateway_job_unreported_prompt_tokens_total",
        unreported as f64,
    )
    .await;
    h.drained().await;
    h.shutdown().await;
}

/// `jobs.max_preemptions = 0`: no job may be pre-empted, so none borrows (a borrowed seat held
/// to the end would be taken from its lane): jobs keep to the large lane's own seats, and an
/// interactive review waits for a job to end.
#[tokio::test]
async fn jobs_that_may_not_be_preempted_keep_to_their_own_lane() {
    jobs_kept_to_their_own_lane(Backend::Local).await;
}

#[tokio::test]
async fn jobs_that_may_not_be_preempted_keep_to_their_own_lane_across_replicas() {
    jobs_kept_to_their_own_lane(Backend::Redis).await;
}

async fn jobs_kept_to_their_own_lane(backend: Backend) {
    let h = preempting(backend, |c| {
        c.jobs.max_preemptions = 0;
    })
    .await;
    let base = h.base();
    let body = review();
    let first = submit_ok(&base, &body).await;
    job_until(&base, &first, "running", |v| v["status"] == "running").await;
    let second = submit_ok(&base, &body).await;
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert_eq!(jobs::job(&base, &second).await["status"], "queued");
    assert_eq!(
        Lane::ALL.map(|l| h.in_flight(l)),
        [0, 0, 1],
        "no borrowed seat"
    );
    let resp = client()
        .post(h.url("/answer"))
        .json(&json!({"prompt": words(5500, "review"), "max_output_tokens": 5}))
        .send()
        .await
        .unwrap();
    let events = sse(&resp.text().await.unwrap());
    assert_eq!(events.last().unwrap().0, "done");
    assert!(
        json(&events[0].1)["queue_wait_ms"].as_f64().unwrap() > 0.0,
        "it waited for the job to end: {events:?}"
    );
    for id in [&first, &second] {
        let v = done(&base, id).await;
        assert!(v.get("preempted").is_none(), "never pre-empted: {v}");
        assert_eq!(v["answer"]["usage"]["output_tokens"], REVIEW_TOKENS);
    }
    // The engine's own high-water mark, whatever the timing above: one request at a time on
    // the large lane's one seat, none on a borrowed one.
    assert_eq!(h.sim.engine.snapshot().max_running_seen, 1);
    h.drained().await;
    assert_eq!(
        family_total(
            &h.metrics_text().await,
            "tutor_gateway_job_preemptions_total"
        ),
        0.0
    );
    h.shutdown().await;
}

/// Questions of every lane arriving in bursts while jobs run: every job still ends with its
/// whole answer (each token once), no job is pre-empted more than `jobs.max_preemptions`
/// times, and every seat and token comes back.
#[tokio::test]
async fn every_seat_comes_back_after_a_storm_of_preemptions() {
    storm(Backend::Local).await;
}

#[tokio::test]
async fn every_seat_comes_back_after_a_storm_of_preemptions_across_replicas() {
    storm(Backend::Redis).await;
}

async fn storm(backend: Backend) {
    let h = start(backend, FASTER, |c| {
        c.jobs.preempt = true;
        c.jobs.max_preemptions = 2;
        for lane in Lane::ALL {
            set_lane(c, lane, 2);
        }
    })
    .await;
    let base = h.base();
    let body =
        json!({"prompt": "review this repository's error handling", "max_output_tokens": 2_000});
    let ids: Vec<String> = futures::future::join_all((0..8).map(|_| submit_ok(&base, &body))).await;
    eventually("jobs hold every seat", || {
        Lane::ALL.map(|l| h.in_flight(l)) == [2, 2, 2]
    })
    .await;
    let mut answers = Vec::new();
    for round in 0..4 {
        let questions = (0..6).map(|i| {
            let words_in = [10, 10, 600, 10, 600, 2500][i];
            let url = h.url("/answer");
            async move {
                let body = json!({"prompt": words(words_in, &format!("q{round}-{i}")), "max_output_tokens": 20});
                post_text(url, &body).await
            }
        });
        answers.extend(futures::future::join_all(questions).await);
    }
    for a in &answers {
        assert_eq!(sse(a).last().unwrap().0, "done", "{a}");
    }
    let mut texts = Vec::new();
    let mut preempted = 0;
    for id in &ids {
        let v = done(&base, id).await;
        let n = v["preempted"].as_u64().unwrap_or(0);
        assert!(n <= 2, "{v}");
        preempted += n;
        assert_eq!(v["answer"]["usage"]["output_tokens"], 2_000, "{v}");
        texts.push(v["answer"]["text"].as_str().unwrap().to_owned());
    }
    assert!(
        preempted >= 1,
        "the first questions found jobs on every seat"
    );
    for (i, t) in texts.iter().enumerate() {
        if *t != texts[0] {
            let at = t
                .chars()
                .zip(texts[0].chars())
                .take_while(|(a, b)| a == b)
                .count();
            let around = |s: &str| {
                s.chars()
                    .skip(at.saturating_sub(40))
                    .take(120)
                    .collect::<String>()
            };
            panic!(
                "one answer whatever the pre-emptions: job {i} ({}) differs from job 0 ({}) at \
                 char {at} of {} / {}:\n{:?}\nvs\n{:?}",
                preemptions_of(&base, &ids[i]).await,
                preemptions_of(&base, &ids[0]).await,
                t.chars().count(),
                texts[0].chars().count(),
                around(t),
                around(&texts[0]),
            );
        }
    }
    h.drained().await;
    h.shutdown().await;
}

/// A job's `preempted` count, for a failure's message.
async fn preemptions_of(base: &str, id: &str) -> String {
    format!("preempted {}", job(base, id).await["preempted"])
}

/// `jobs.preempt_cooldown_ms`: after a question waited for a seat (and made a job leave), no
/// job takes a seat within the cool-down, although seats are idle again: the pre-empted job
/// stays out, holding nothing, while the others end and every seat comes back.
#[tokio::test]
async fn a_preempted_job_stays_out_for_the_cooldown() {
    cooldown(Backend::Local).await;
}

#[tokio::test]
async fn a_preempted_job_stays_out_for_the_cooldown_across_replicas() {
    cooldown(Backend::Redis).await;
}

async fn cooldown(backend: Backend) {
    let h = preempting(backend, |c| {
        // Longer than the test: whatever the machine's speed, it is still running at the end.
        c.jobs.preempt_cooldown = std::time::Duration::from_secs(600);
    })
    .await;
    let base = h.base();
    // Nobody waited yet: three reviews take large's seat, then medium's, then small's.
    let body = review();
    let ids: Vec<String> = futures::future::join_all((0..3).map(|_| submit_ok(&base, &body))).await;
    eventually("jobs hold every seat", || {
        Lane::ALL.map(|l| h.in_flight(l)) == [1, 1, 1]
    })
    .await;
    ask(h.url("/answer")).await;
    let mut left = preempted_once(&base, &ids).await;
    assert_eq!(left.len(), 1, "the job on small's seat left, and only it");
    let left = left.remove(0);
    // The other two jobs run to their end; the one that left never takes the idle seats.
    for id in ids.iter().filter(|id| **id != left) {
        let v = done(&base, id).await;
        assert!(v.get("preempted").is_none(), "{v}");
    }
    h.drained().await;
    let v = jobs::job(&base, &left).await;
    // Waiting to resume, it is still running (with Redis it waits in the shared queue: it
    // showed `queued`, without its start, as if it had not begun).
    assert_eq!(
        v["status"], "running",
        "it stayed out within the cool-down, still running: {v}"
    );
    assert!(
        v["started_at"].is_f64() && v.get("position").is_none(),
        "{v}"
    );
    assert_eq!(
        Lane::ALL.map(|l| h.in_flight(l)),
        [0, 0, 0],
        "waiting out the cool-down holds no seat"
    );
    h.shutdown().await;
}

/// The Redis backend (`quota.backend = "redis"`): a question arriving on replica B finds no
/// seat, so the acquire script asks the job that borrowed it on replica A to leave; A drops its
/// stream and hands the job back to the shared queue with its text. A then shuts down (handing
/// back its other jobs the same way), and B continues every one of them: each answer is the
/// uninterrupted one, every token counted once, no run started over.
#[tokio::test]
async fn a_job_preempted_on_one_replica_is_continued_on_another() {
    use jobs::{quota_drains, redis_conn};
    let (redis, sim, c) = fleet(|c| c.jobs.preempt = true).await;
    let a = gateway(c.clone()).await;
    let a_url = a.url();
    // Three identical reviews take, on A, large's seat, then medium's, then small's.
    let ids = streaming_reviews(&a_url).await;
    let mut started = Vec::new();
    for id in &ids {
        started.push(jobs::job(&a_url, id).await["started_at"].clone());
    }
    let mut conn = redis_conn(&redis).await;
    // What each job keeps against jobs.max_bytes while it runs: its request.
    let mut requests = Vec::new();
    for id in &ids {
        requests.push(kept_bytes(&mut conn, id).await);
    }
    let seated: Vec<Option<i64>> = redis::cmd("HMGET")
        .arg(jobs::USAGE)
        .arg(&[
            "small:n",
            "medium:n",
            "large:n",
            "small:tokens",
            "medium:tokens",
        ])
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        &seated[..3],
        &[Some(1), Some(1), Some(1)],
        "jobs hold every lane's seat, fleet-wide"
    );
    assert_eq!(
        seated[3..].iter().map(|t| t.unwrap_or(0)).sum::<i64>(),
        0,
        "a borrowed seat's tokens count in the large lane"
    );
    let b = gateway(c).await;
    let b_url = b.url();
    // A question on B: no small seat anywhere, so the job on it (on A) gives it back.
    ask(format!("{}/answer", b.url())).await;
    // Its run on A hands it back as the question streams.
    let preempted = preempted_once(&b_url, &ids).await;
    assert_eq!(
        preempted.len(),
        1,
        "one job gave its seat back: {preempted:?}"
    );
    let preempted = preempted[0].clone();
    let on_a = tutor_testkit::metrics_text(&a.url()).await;
    assert_eq!(
        metric(
            &on_a,
            "tutor_gateway_job_preemptions_total{lane=\"small\",reason=\"seat\"}"
        ),
        1.0
    );
    assert_eq!(
        metric(
            &tutor_testkit::metrics_text(&b.url()).await,
            "tutor_gateway_preemption_admit_seconds_count{lane=\"small\"}"
        ),
        1.0,
        "the question on B is counted as one a pre-emption made room for"
    );
    // A leaves: its running jobs go back with their text; B continues all three.
    a.shutdown().await;
    let answers: Vec<Value> =
        futures::future::join_all(ids.iter().map(|id| done(&b_url, id))).await;
    let text = |v: &Value| v["answer"]["text"].as_str().unwrap().to_owned();
    for (v, started) in answers.iter().zip(&started) {
        assert_eq!(v["runs"], 1, "continued, not started over: {v}");
        // started_at spans the job: its first run's start, not its continuation's.
        assert_eq!(&v["started_at"], started, "{v}");
        let usage = &v["answer"]["usage"];
        assert_eq!(
            usage["output_tokens"], REVIEW_TOKENS,
            "every token once: {v}"
        );
        assert_eq!(v["answer"]["finish_reason"], "length", "{v}");
        assert_eq!(
            text(v),
            text(&answers[0]),
            "a continued answer is the uninterrupted one"
        );
    }
    let resumed = answers
        .iter()
        .find(|v| v["id"] == preempted.as_str())
        .unwrap();
    assert_eq!(resumed["preempted"], 1, "{resumed}");
    // B found the review and its answer so far in the engine's prefix cache.
    let recomputed = resumed["answer"]["usage"]["recomputed_tokens"]
        .as_u64()
        .unwrap();
    assert!(recomputed <= 16, "{resumed}");
    // Each job's whole text counts against jobs.max_bytes once, whichever runs streamed it
    // (A's pre-empted and handed-back runs, B's continuations), and the store's count is
    // theirs.
    let mut total = 0;
    for ((id, request), v) in ids.iter().zip(&requests).zip(&answers) {
        let kept = kept_bytes(&mut conn, id).await;
        let text = text(v).len() as i64;
        assert_eq!(
            kept,
            request + text,
            "job {id}: request {request} + text {text}"
        );
        total += kept;
    }
    let store: i64 = redis::cmd("HGET")
        .arg("tg:v2:{quota}:jobs:meta")
        .arg("bytes")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(store, total);
    let on_b = tutor_testkit::metrics_text(&b.url()).await;
    assert!(
        metric(
            &on_b,
            "tutor_gateway_requests_total{lane=\"large\",outcome=\"ok\",route=\"job\"}"
        ) >= 1.0,
        "B ran the continuations"
    );
    // Each job's wait was counted once, when it first started (on A); a continuation is no
    // new wait from its submission.
    assert_eq!(
        tutor_testkit::metric_or_zero(&on_b, "tutor_gateway_job_wait_seconds_count"),
        0.0
    );
    quota_drains(&redis).await;
    no_borrower_or_ask_left(&mut conn).await;
    b.shutdown().await;
    sim.shutdown().await;
}

/// `jobs.preempt_answers = "marked"`: a large `/answer` marked `x-tutor-preemptible: true`
/// borrows an idle seat (medium's: large's own is taken); a medium question that needs that
/// seat takes it mid-stream, and the answer goes on as a continuation on another idle seat
/// without a break for its client: its token events go on numbered where they stopped, one
/// `meta` event says it was pre-empted (`jobs.preempt_notice`), and its text, usage and
/// record are those of one uninterrupted answer.
#[tokio::test]
async fn a_preemptible_answer_gives_its_seat_back_and_goes_on_without_a_break() {
    preemptible_answer(FASTER, 100).await;
}

/// The same with a reasoning model whose continued answer vLLM's parser streams as reasoning:
/// the client still reads the whole answer.
#[tokio::test]
async fn a_preemptible_answer_of_a_reasoning_model_goes_on_without_a_break() {
    let mut flags = FASTER.to_vec();
    flags.extend(["--reasoning-tokens", "20"]);
    preemptible_answer(&flags, 100).await;
}

/// A job pre-empted while its model still reasons (1,500 reasoning tokens, 4 s): no answer
/// text to continue, so it is sent again as it was; its answer counts every token once.
#[tokio::test]
async fn a_job_preempted_while_it_reasons_counts_each_token_once() {
    let mut flags = FASTER.to_vec();
    flags.extend(["--reasoning-tokens", "1500"]);
    let h = preempting_with(Backend::Local, &flags, |_| {}).await;
    let base = h.base();
    let body = review();
    let ids: Vec<String> = futures::future::join_all((0..3).map(|_| submit_ok(&base, &body))).await;
    eventually("jobs hold every lane's seat", || {
        Lane::ALL.map(|l| h.in_flight(l)) == [1, 1, 1]
    })
    .await;
    // Past the short prompt's prefill, well within the 4 s of reasoning.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    ask(h.url("/answer")).await;
    let answers: Vec<Value> = futures::future::join_all(ids.iter().map(|id| done(&base, id))).await;
    let preempted: u64 = answers
        .iter()
        .map(|v| v["preempted"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(preempted, 1, "{answers:?}");
    for v in &answers {
        assert_eq!(
            v["answer"]["usage"]["output_tokens"], REVIEW_TOKENS,
            "every token once: {v}"
        );
    }
    h.drained().await;
    h.shutdown().await;
}

/// Pre-empted while the model still reasons (1,500 reasoning tokens, 4 s: the question comes
/// a second after the review took its seat, past its 0.1 s prefill, long before its first
/// word): no answer text to continue, so the request is sent
/// again as it was and generates its reasoning again; the answer counts every token once (it
/// counted the discarded reasoning on top, 3,016 of 3,000).
#[tokio::test]
async fn an_answer_preempted_while_it_reasons_counts_each_token_once() {
    let mut flags = FASTER.to_vec();
    flags.extend(["--reasoning-tokens", "1500"]);
    preemptible_answer(&flags, 1_000).await;
}

/// A pre-emptible review with the simulator's `flags`, asked for its seat `settle_ms` after it
/// took it.
async fn preemptible_answer(flags: &[&str], settle_ms: u64) {
    let h = harness(flags, |c| {
        c.jobs.preempt_answers = tutor_gateway::config::PreemptAnswers::Marked;
        c.jobs.preempt_notice = true;
        for lane in Lane::ALL {
            set_lane(c, lane, 1);
        }
    })
    .await;
    let body = json!({"prompt": words(2500, "review"), "max_output_tokens": REVIEW_TOKENS});
    // An unmarked review holds large's seat to its end: it is the uninterrupted answer.
    let plain = {
        let (url, body) = (h.url("/answer"), body.clone());
        tokio::spawn(async move { post_text(url, &body).await })
    };
    eventually("the plain review runs", || h.in_flight(Lane::Large) == 1).await;
    // The marked one borrows medium's idle seat.
    let url = h.url("/answer");
    let marked = spawn_marked(url, body);
    eventually("the marked review borrows medium's seat", || {
        h.in_flight(Lane::Medium) == 1
    })
    .await;
    // Let it stream a little (if it is still prefilling, it is sent again as it was: the
    // assertions below hold either way).
    tokio::time::sleep(std::time::Duration::from_millis(settle_ms)).await;
    let question = post_text(
        h.url("/answer"),
        &json!({"prompt": words(600, "why"), "max_output_tokens": 1000}),
    )
    .await;
    let q = sse(&question);
    assert_eq!(json(&q[0].1)["lane"], "medium", "{q:?}");
    assert_eq!(q.last().unwrap().0, "done", "{q:?}");
    let (plain, marked) = (plain.await.unwrap(), marked.await.unwrap());
    pre_empted_once_without_a_break(&marked, &plain);
    eventually("every seat back", || h.idle()).await;
    let m = h.metrics_text().await;
    assert_eq!(
        metric(
            &m,
            "tutor_gateway_job_preemptions_total{lane=\"medium\",reason=\"seat\"}"
        ),
        1.0
    );
    // One request each: the pre-empted answer is not counted twice, nor as a cancel.
    assert_eq!(
        metric(
            &m,
            "tutor_gateway_requests_total{lane=\"large\",outcome=\"ok\",route=\"answer\"}"
        ),
        2.0
    );
    assert_eq!(family_total(&m, "tutor_gateway_cancellations_total"), 0.0);
    assert!(h.sim_aborted() >= 1, "the engine's work was aborted");
    // A mark that is neither true nor false is a 400 naming the header.
    let resp = client()
        .post(h.url("/answer"))
        .header("x-tutor-preemptible", "yes")
        .json(&json!({"prompt": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let err = json(&resp.text().await.unwrap());
    assert_eq!(err["error"]["param"], "x-tutor-preemptible", "{err}");
    h.shutdown().await;
}

/// `jobs.preempt_answers` across replicas (`quota.backend = "redis"`): a marked review on
/// replica A borrows the fleet's idle medium seat (`quota_borrow_v2.lua`); a question on
/// replica B needs it, asks it back through the quota's scripts, and is answered; the review
/// goes on without a break for its client on A, and its text and usage are an uninterrupted
/// answer's. Every seat comes back, and no borrower or ask is left in Redis.
#[tokio::test]
async fn a_preemptible_answer_on_one_replica_gives_its_seat_to_a_question_on_another() {
    use jobs::{quota_drains, redis_conn};
    let (redis, sim, c) = fleet(|c| {
        c.jobs.preempt_answers = tutor_gateway::config::PreemptAnswers::Marked;
        c.jobs.preempt_notice = true;
    })
    .await;
    let (a, b) = (gateway(c.clone()).await, gateway(c).await);
    let mut conn = redis_conn(&redis).await;
    let seated = |mut conn: redis::aio::MultiplexedConnection| async move {
        let n: Vec<Option<i64>> = redis::cmd("HMGET")
            .arg(jobs::USAGE)
            .arg(&["small:n", "medium:n", "large:n"])
            .query_async(&mut conn)
            .await
            .unwrap();
        n.into_iter().map(|v| v.unwrap_or(0)).collect::<Vec<_>>()
    };
    let body = json!({"prompt": words(2500, "review"), "max_output_tokens": REVIEW_TOKENS});
    // An unmarked review on A holds large's seat to its end: it is the uninterrupted answer.
    let plain = {
        let (url, body) = (format!("{}/answer", a.url()), body.clone());
        tokio::spawn(async move { post_text(url, &body).await })
    };
    // 30 s: a loaded machine can be slow to seat it.
    for _ in 0..3000 {
        if seated(conn.clone()).await[2] == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(
        seated(conn.clone()).await,
        [0, 0, 1],
        "the plain review runs"
    );
    // The marked one, on A too, borrows the fleet's idle medium seat.
    let url = format!("{}/answer", a.url());
    let marked = spawn_marked(url, body);
    // 30 s: a loaded machine can be slow to seat it.
    for _ in 0..3000 {
        if seated(conn.clone()).await[1] == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(
        seated(conn.clone()).await,
        [0, 1, 1],
        "the marked review borrows medium's seat, fleet-wide"
    );
    let borrowers: u32 = redis::cmd("ZCARD")
        .arg("tg:v2:{quota}:borrowers")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(borrowers, 1, "its lease is a pre-emptible one");
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    // A medium question on B: no medium seat in the fleet, so the review on A gives it back.
    let question = post_text(
        format!("{}/answer", b.url()),
        &json!({"prompt": words(600, "why"), "max_output_tokens": 1000}),
    )
    .await;
    let q = sse(&question);
    assert_eq!(json(&q[0].1)["lane"], "medium", "{q:?}");
    assert_eq!(q.last().unwrap().0, "done", "{q:?}");
    let (plain, marked) = (plain.await.unwrap(), marked.await.unwrap());
    pre_empted_once_without_a_break(&marked, &plain);
    assert_eq!(
        metric(
            &tutor_testkit::metrics_text(&a.url()).await,
            "tutor_gateway_job_preemptions_total{lane=\"medium\",reason=\"seat\"}"
        ),
        1.0,
        "A's review left for B's question"
    );
    assert_eq!(
        metric(
            &tutor_testkit::metrics_text(&b.url()).await,
            "tutor_gateway_preemption_admit_seconds_count{lane=\"medium\"}"
        ),
        1.0,
        "the question on B is counted as one a pre-emption made room for"
    );
    quota_drains(&redis).await;
    no_borrower_or_ask_left(&mut conn).await;
    a.shutdown().await;
    b.shutdown().await;
    sim.shutdown().await;
}

/// `jobs.max_preemptions = 0` with `jobs.preempt_answers` across replicas: a marked review may
/// never be asked to leave, so it borrows no seat (the Redis backend's borrow took the idle
/// medium seat anyway, held it to its end and left every later ask counting it as leaving): it
/// queues for a large seat as any review, and the seats of the other lanes stay free.
#[tokio::test]
async fn a_marked_answer_that_may_not_be_preempted_borrows_nothing_across_replicas() {
    use jobs::{quota_drains, redis_conn};
    let (redis, sim, c) = fleet(|c| {
        c.jobs.preempt_answers = tutor_gateway::config::PreemptAnswers::Marked;
        c.jobs.max_preemptions = 0;
    })
    .await;
    let a = gateway(c).await;
    let mut conn = redis_conn(&redis).await;
    let body = json!({"prompt": words(2500, "review"), "max_output_tokens": REVIEW_TOKENS});
    let plain = {
        let (url, body) = (format!("{}/answer", a.url()), body.clone());
        tokio::spawn(async move { post_text(url, &body).await })
    };
    eventually("the plain review holds the large seat", || {
        a.state.admission().snapshot().lane(Lane::Large).in_flight == 1
    })
    .await;
    let marked = spawn_marked(format!("{}/answer", a.url()), body);
    // It queues only after its borrow was refused.
    eventually("the marked review waits for a large seat", || {
        a.state.admission().snapshot().lane(Lane::Large).queue_depth == 1
    })
    .await;
    let seated: Vec<Option<i64>> = redis::cmd("HMGET")
        .arg(jobs::USAGE)
        .arg(&["small:n", "medium:n", "large:n"])
        .query_async(&mut conn)
        .await
        .unwrap();
    let seated: Vec<i64> = seated.into_iter().map(|v| v.unwrap_or(0)).collect();
    assert_eq!(seated, [0, 0, 1], "no seat borrowed from another lane");
    let borrowers: u32 = redis::cmd("ZCARD")
        .arg("tg:v2:{quota}:borrowers")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(borrowers, 0, "no pre-emptible lease");
    let (plain, marked) = (plain.await.unwrap(), marked.await.unwrap());
    for body in [&plain, &marked] {
        let events = sse(body);
        assert_eq!(json(&events[0].1)["lane"], "large", "{body}");
        assert_eq!(events.last().unwrap().0, "done", "{body}");
    }
    quota_drains(&redis).await;
    no_borrower_or_ask_left(&mut conn).await;
    a.shutdown().await;
    sim.shutdown().await;
}

/// A pre-empted `/answer` whose continuation still waits for a seat when the grace period
/// ends (the seat is held on another replica, so nothing this replica ends frees it): the wait
/// ends with the grace, and the client reads an `error` event `shutdown`, instead of a stream
/// held open until the connection is closed under it (the large lane's queue timeout is
/// 60 s). Every seat comes back.
#[tokio::test]
async fn a_continuation_waiting_for_a_seat_ends_with_the_grace() {
    use jobs::{quota_drains, redis_conn};
    let (redis, sim, c) = fleet(|c| {
        c.jobs.preempt_answers = tutor_gateway::config::PreemptAnswers::Marked;
        c.jobs.preempt_notice = true;
        c.server.shutdown_grace = std::time::Duration::ZERO;
    })
    .await;
    let (a, b) = (gateway(c.clone()).await, gateway(c).await);
    let mut conn = redis_conn(&redis).await;
    let body = json!({"prompt": words(2500, "review"), "max_output_tokens": REVIEW_TOKENS});
    // A review on B holds the fleet's large seat (20 s at this speed).
    let plain = {
        let url = format!("{}/answer", b.url());
        let body = json!({"prompt": words(2500, "review"), "max_output_tokens": 8_000});
        tokio::spawn(async move { post_text(url, &body).await })
    };
    eventually("the plain review runs on B", || {
        b.state.admission().snapshot().lane(Lane::Large).in_flight == 1
    })
    .await;
    // The marked one, on A, borrows the fleet's idle medium seat.
    let url = format!("{}/answer", a.url());
    let marked = spawn_marked(url, body);
    eventually("the marked review borrows medium's seat", || {
        a.state.admission().snapshot().lane(Lane::Medium).in_flight == 1
    })
    .await;
    // A medium question on B takes that seat back; the review's continuation on A finds no
    // seat to borrow and queues for large's, which B's review holds.
    let question = {
        let url = format!("{}/answer", b.url());
        tokio::spawn(async move {
            post_text(
                url,
                &json!({"prompt": words(600, "why"), "max_output_tokens": 1000}),
            )
            .await
        })
    };
    eventually("the continuation waits for a large seat", || {
        a.state.admission().snapshot().lane(Lane::Large).queue_depth == 1
    })
    .await;
    assert_eq!(
        metric(
            &tutor_testkit::metrics_text(&a.url()).await,
            "tutor_gateway_job_preemptions_total{lane=\"medium\",reason=\"seat\"}"
        ),
        1.0,
        "A's review left for B's question"
    );
    a.shutdown().await;
    ended_by_shutdown(&marked.await.unwrap());
    assert_eq!(sse(&question.await.unwrap()).last().unwrap().0, "done");
    b.shutdown().await;
    let _ = plain.await;
    quota_drains(&redis).await;
    no_borrower_or_ask_left(&mut conn).await;
    sim.shutdown().await;
}

/// Posts `body` to `url` marked `x-tutor-preemptible: true` in the background; the answer's
/// text.
fn spawn_marked(url: String, body: Value) -> tokio::task::JoinHandle<String> {
    tokio::spawn(async move {
        let resp = client()
            .post(url)
            .header("x-tutor-preemptible", "true")
            .json(&body)
            .send()
            .await
            .unwrap();
        resp.text().await.unwrap()
    })
}

/// `marked`, a large `/answer` stream pre-empted once (`jobs.preempt_notice` on), reads as one
/// unbroken answer: one `meta` notice, token events numbered 1..n without a gap or a repeat,
/// every output token counted once, and the text of `plain` (the same review, never
/// pre-empted).
fn pre_empted_once_without_a_break(marked: &str, plain: &str) {
    let text = |body: &str| -> String {
        sse(body)
            .iter()
            .filter(|(e, _)| e == "token")
            .map(|(_, d)| json(d)["text"].as_str().unwrap().to_owned())
            .collect()
    };
    let events = sse(marked);
    assert_eq!(json(&sse(plain)[0].1)["lane"], "large", "{plain}");
    assert_eq!(json(&events[0].1)["lane"], "large", "{marked}");
    let notices: Vec<&(String, String)> = events
        .iter()
        .filter(|(e, d)| e == "meta" && d.contains("preempted"))
        .collect();
    assert_eq!(notices.len(), 1, "told once: {notices:?}");
    assert_eq!(json(&notices[0].1)["preempted"], 1);
    let done = json(&events.last().unwrap().1);
    assert_eq!(events.last().unwrap().0, "done", "{marked}");
    assert_eq!(
        done["usage"]["output_tokens"], REVIEW_TOKENS,
        "every token once"
    );
    assert_eq!(done["finish_reason"], "length");
    assert_eq!(text(marked), text(plain), "the uninterrupted answer");
    let ids: Vec<u32> = marked
        .lines()
        .filter_map(|l| l.strip_prefix("id: ")?.parse().ok())
        .collect();
    // `meta` is 0, then the tokens from 1 on, without a break.
    assert_eq!(ids, (0..ids.len() as u32).collect::<Vec<_>>());
}

/// A question that outgrows its lane while a job holds the seat it needs in the next one asks
/// that job to leave too, and goes on there, under the default `promotion.when_full = "cut"`:
/// it was cut at its lane's limit (257 tokens of 400) while the job ran on.
#[tokio::test]
async fn an_answer_outgrowing_its_lane_asks_the_job_on_the_next_lanes_seat() {
    outgrowing_answer_asks_a_job(Backend::Local).await;
}

/// The same across the fleet: the quota's move script asks the job to leave.
#[tokio::test]
async fn an_answer_outgrowing_its_lane_asks_the_job_on_the_next_lanes_seat_in_redis() {
    outgrowing_answer_asks_a_job(Backend::Redis).await;
}

async fn outgrowing_answer_asks_a_job(backend: Backend) {
    // Room for a loaded machine to see the job leave (the stream waits for it up to this).
    let h = preempting(backend, |c| {
        c.promotion.wait = std::time::Duration::from_secs(20)
    })
    .await;
    let base = h.base();
    let ids = streaming_reviews(&base).await;
    // A small question (its arrival asks small's job to leave) that goes on past small's 256
    // tokens, to 400: it needs medium's seat, which a job holds.
    let body = json!({"prompt": "explain ownership", "max_output_tokens": 400});
    let events = sse(&post_text(h.url("/answer"), &body).await);
    assert!(events.iter().all(|(e, _)| e != "cut"), "{events:?}");
    let (last, data) = events.last().unwrap();
    assert_eq!(last, "done", "{events:?}");
    assert_eq!(json(data)["usage"]["output_tokens"], 400, "{data}");
    let m = h.metrics_text().await;
    assert_eq!(family_total(&m, "tutor_gateway_stream_cuts_total"), 0.0);
    assert!(
        family_total(&m, "tutor_gateway_job_preemptions_total") >= 2.0,
        "small's job for its arrival, medium's for its growth"
    );
    for id in &ids {
        assert_eq!(done(&base, id).await["status"], "done");
    }
    h.drained().await;
    h.shutdown().await;
}

/// Three identical reviews submitted to the gateway at `base`: with one seat in each lane they
/// take large's seat, then medium's, then small's. Their ids, once each one streams.
async fn streaming_reviews(base: &str) -> Vec<String> {
    let body = review();
    let ids: Vec<String> = futures::future::join_all((0..3).map(|_| submit_ok(base, &body))).await;
    for id in &ids {
        job_until(base, id, "streaming", |v| {
            v["status"] == "running" && v["output_pieces"].as_u64().unwrap_or(0) > 0
        })
        .await;
    }
    ids
}

/// A short question to the `/answer` at `url`, answered to its end.
async fn ask(url: String) {
    let body = json!({"prompt": "why does my loop never end?", "max_output_tokens": 5});
    let events = sse(&post_text(url, &body).await);
    assert_eq!(events.last().unwrap().0, "done", "{events:?}");
}

/// The jobs of `ids` (at `base`) pre-empted once, as soon as there is one (a pre-emption shows
/// as the run hands the job back: shortly after the question that asked for it).
async fn preempted_once(base: &str, ids: &[String]) -> Vec<String> {
    let mut preempted = Vec::new();
    // 30 s: a loaded machine can be slow to hand the job back.
    for _ in 0..3_000 {
        for id in ids {
            if jobs::job(base, id).await["preempted"] == 1 {
                preempted.push(id.clone());
            }
        }
        if !preempted.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    preempted
}

/// The bytes job `id` keeps against `jobs.max_bytes`, as the shared store counts them.
async fn kept_bytes(conn: &mut redis::aio::MultiplexedConnection, id: &str) -> i64 {
    let bytes: Option<i64> = redis::cmd("HGET")
        .arg(format!("tg:v2:{{quota}}:job:{id}"))
        .arg("bytes")
        .query_async(conn)
        .await
        .unwrap();
    bytes.unwrap()
}

/// No pre-emptible lease and no ask for one is left in the quota's Redis.
async fn no_borrower_or_ask_left(conn: &mut redis::aio::MultiplexedConnection) {
    let left: u32 = redis::cmd("EXISTS")
        .arg("tg:v2:{quota}:borrowers")
        .arg("tg:v2:{quota}:asked")
        .query_async(conn)
        .await
        .unwrap();
    assert_eq!(left, 0, "no borrower or ask left behind");
}

/// A Redis and a simulator for a fleet of gateways, and their config: the quota on that Redis,
/// one seat in each lane, `tweak`ed. Start each replica with [`gateway`].
async fn fleet(
    tweak: impl FnOnce(&mut tutor_gateway::config::Config),
) -> (
    redis_common::RedisServer,
    vllm_sim::SimServer,
    tutor_gateway::config::Config,
) {
    let redis = redis_common::RedisServer::start();
    let sim = vllm_sim::start(&vllm_sim::SimArgs::for_test(FASTER))
        .await
        .unwrap();
    let mut c = tutor_gateway::config::Config::default();
    c.upstream.base_url = sim.url();
    c.telemetry.request_log = tutor_gateway::config::RequestLogSink::Off;
    jobs::on_redis(&mut c, &redis);
    for lane in Lane::ALL {
        set_lane(&mut c, lane, 1);
    }
    tweak(&mut c);
    (redis, sim, c)
}

/// A gateway replica with config `c`, once it has its first connection to Redis (a request
/// waits only 2 s for it, which a loaded machine can exceed).
async fn gateway(c: tutor_gateway::config::Config) -> tutor_gateway::server::Gateway {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gw = tutor_gateway::server::start(c, listener).unwrap();
    redis_ready(&gw).await;
    gw
}

/// A gateway and simulator on `backend` with `jobs.preempt` on and one seat in each lane,
/// `tweak`ed.
async fn preempting(
    backend: Backend,
    tweak: impl FnOnce(&mut tutor_gateway::config::Config),
) -> jobs::JobsHarness {
    preempting_with(backend, FASTER, tweak).await
}

/// [`preempting`] with the simulator's `flags`.
async fn preempting_with(
    backend: Backend,
    flags: &[&str],
    tweak: impl FnOnce(&mut tutor_gateway::config::Config),
) -> jobs::JobsHarness {
    start(backend, flags, |c| {
        c.jobs.preempt = true;
        for lane in Lane::ALL {
            set_lane(c, lane, 1);
        }
        tweak(c);
    })
    .await
}
