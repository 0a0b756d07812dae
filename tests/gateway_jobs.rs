//! Background jobs end to end (issue 16), in process: submit, run out of idle large-lane
//! capacity, read the result, follow the events (late, and resuming with `Last-Event-ID`),
//! cancel while queued and while running (the engine aborts, every counter returns to zero),
//! signed webhooks with retries, the webhook allow-list, and result expiry. Those behaviours
//! are written once in `tests/jobs/cases.rs` and run here on the in-process store, and in
//! `gateway_jobs_shared.rs` on the shared store in Redis; what only the in-process store does
//! is below.

mod common;
mod jobs;
mod redis_common;

use common::*;
use std::time::Duration;

use jobs::{done, question, spawn_post, start, submit_ok, Backend, SLOW};
use serde_json::json;
use tutor_gateway::lane::Lane;

jobs::backend_cases!(Backend::Local);

/// (In process only: the store's room is known at once, while a Redis replica knows it as of
/// its last beat.)
#[tokio::test]
async fn a_large_answer_keeps_its_place_when_no_job_can_be_taken() {
    let h = start(Backend::Local, SLOW, |c| {
        set_lane(c, Lane::Large, 1);
        c.jobs.divert_large_after = Some(Duration::from_millis(100));
        c.jobs.max_jobs = 1;
    })
    .await;
    let big = |salt: &str| json!({"prompt": words(5500, salt), "max_output_tokens": 300});
    let first = spawn_post(h.url("/answer"), big("first"));
    eventually("the first holds the seat", || h.in_flight(Lane::Large) == 1).await;
    // The job store is full (one queued job), so the next large answer cannot become a job:
    // it keeps waiting in the queue and is answered there.
    let queued = submit_ok(&h.base(), &question(5)).await;
    let resp = client()
        .post(h.url("/answer"))
        .json(&big("second"))
        .send()
        .await
        .unwrap();
    let events = sse(&resp.text().await.unwrap());
    assert_eq!(events[0].0, "meta", "answered, not diverted");
    assert!(json(&events[0].1)["queue_wait_ms"].as_f64().unwrap() > 100.0);
    assert_eq!(events.last().unwrap().0, "done");
    assert_eq!(sse(&first.await.unwrap()).last().unwrap().0, "done");
    done(&h.base(), &queued).await;
    h.drained().await;
    h.shutdown().await;
}
