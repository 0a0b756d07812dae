//! A submit whose reply is lost, against a real `redis-server`: Redis slower than the call's
//! timeout (writes paused) runs the submit's script after the gateway gave up on its reply.
//! The gateway answered "store down" while the job was queued all the same: a diverted
//! `/answer` then ran at once and its job again later (charged to its tenant twice), and a
//! client of `POST /jobs` got a 503 and made a second job by retrying. The submit is now asked
//! again under the same id, and succeeds once, whichever of the two calls queued it.

use std::time::Duration;

use serde_json::json;

use super::untake_tests::store;
use crate::admission::redis::tests::redis_common::{pause_writes, paused_script, RedisServer};
use crate::pipeline::Ready;

const QUEUE: &str = "tg:v2:{quota}:jobs:queue";

fn review() -> Ready {
    Ready::from_stored(&json!({
        "endpoint": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": "review this"}], "max_tokens": 50},
        "lane": "large",
        "input_tokens_estimate": 10,
        "output_budget": 50,
        "work": 60,
        "prefill": 10,
        "size": 200,
    }))
    .unwrap()
}

#[tokio::test]
async fn a_submit_whose_reply_is_lost_queues_one_job_and_says_so() {
    let redis = RedisServer::start();
    let store = store(&redis).await;
    let mut conn = redis
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    // Redis takes no write for now: the submit's script waits there past the call's timeout.
    pause_writes(&mut conn).await;
    let submitting = tokio::spawn({
        let store = store.clone();
        async move { store.submit("lost", &review(), None, None, 1.0).await }
    });
    paused_script(&mut conn).await;
    // Past the call's 500 ms timeout: its reply is lost, whatever then runs its script.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let _: () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query_async(&mut conn)
        .await
        .unwrap();
    let submitted = tokio::time::timeout(Duration::from_secs(30), submitting)
        .await
        .expect("the submit ends")
        .unwrap();
    assert!(
        submitted.is_ok(),
        "the job is queued, and the submit says so: {submitted:?}"
    );
    let queued: Vec<String> = redis::cmd("ZRANGE")
        .arg(QUEUE)
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(queued, ["lost"], "one job, queued once");
    // A submit of an id that exists, asked once, is still refused (never two jobs of one id).
    assert!(store
        .submit("lost", &review(), None, None, 1.0)
        .await
        .is_err());
}
