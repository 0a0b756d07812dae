//! Attack 10: one school reads another's prompts through vLLM's shared prefix cache. It sends
//! a prompt it guesses another school sent (a grade, a name changed at a time) and watches the
//! `cached_tokens` the gateway relays (or its time to first token): the right guess comes back
//! cached. With tenants, every request now carries its tenant's `cache_salt`, so one tenant's
//! requests never find another's blocks, whatever salt a client sends.

use serde_json::{json, Value};

use crate::common::*;

const FLAGS: &[&str] = &[
    "--speed",
    "50",
    "--profile",
    "tiny-test",
    "--enable-prompt-tokens-details",
];
const A: &str = "sk-attack-school-a-0123456789";
const B: &str = "sk-attack-school-b-abcdefghij";

/// B's question: long enough for many full KV blocks.
fn question() -> String {
    let mut q = String::from("Student 4711 of school B, final grade 73. ");
    for i in 0..60 {
        q.push_str(&format!(
            "Line {i} of the essay about closures and iterators. "
        ));
    }
    q
}

/// Sends `q` as `key` (with the client's own `cache_salt`, if any); the prompt tokens vLLM
/// found cached, as the gateway relays them (0 when left out).
async fn cached(h: &Harness, key: &str, q: &str, salt: Option<&str>) -> u64 {
    let mut body = json!({"messages": [{"role": "user", "content": q}], "max_tokens": 2});
    if let Some(s) = salt {
        body["cache_salt"] = json!(s);
    }
    let resp = send(
        client()
            .post(h.url("/v1/chat/completions"))
            .bearer_auth(key)
            .json(&body),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0)
}

/// The `cache_salt` of every request the engine saw.
async fn engine_salts(h: &Harness) -> Vec<Value> {
    h.sim_requests()
        .await
        .iter()
        .map(|r| r["cache_salt"].clone())
        .collect()
}

#[tokio::test]
async fn another_tenants_prompt_is_never_found_in_the_cache() {
    let h = harness(FLAGS, |c| {
        with_keys(c, &[(B, "school-b"), (A, "school-a")]);
    })
    .await;
    let q = question();
    assert_eq!(cached(&h, B, &q, None).await, 0, "B's first request");
    // B's own next request finds its prompt: the cache still works within a tenant.
    assert!(cached(&h, B, &q, None).await > 100);
    // A's guess, right to the byte, finds nothing; nor does A with B's salt, or B's name.
    assert_eq!(cached(&h, A, &q, None).await, 0);
    let b_salt = engine_salts(&h).await[0].as_str().unwrap().to_owned();
    assert_eq!(cached(&h, A, &q, Some(&b_salt)).await, 0);
    assert_eq!(cached(&h, A, &q, Some("school-b")).await, 0);
    // Every request carried a salt, and none the client's own.
    let salts = engine_salts(&h).await;
    assert_eq!(salts.len(), 5);
    assert!(salts
        .iter()
        .all(|s| s.as_str().is_some_and(|s| s.len() == 32)));
    assert!(!salts.contains(&json!("school-b")));
    assert_eq!(salts.iter().filter(|s| **s == json!(b_salt)).count(), 2);
    h.shutdown().await;
}

/// With `auth.share_prefix_cache`, the tenants share the cache (what the attack read).
#[tokio::test]
async fn tenants_that_share_the_cache_find_each_others_prompts() {
    let h = harness(FLAGS, |c| {
        with_keys(c, &[(B, "school-b"), (A, "school-a")]);
        c.auth.share_prefix_cache = true;
    })
    .await;
    let q = question();
    assert_eq!(cached(&h, B, &q, None).await, 0);
    assert!(cached(&h, A, &q, None).await > 100);
    assert_eq!(engine_salts(&h).await, vec![Value::Null, Value::Null]);
    h.shutdown().await;
}

/// One tenant's prompts found cached again and again make a drift profile; another tenant's
/// first requests of the same prefix find nothing cached (its salt is its own), which is not
/// the first tenant's prefix lost: no drift is counted.
#[tokio::test]
async fn another_tenants_cold_cache_is_not_drift() {
    let h = harness(FLAGS, |c| {
        with_keys(c, &[(B, "school-b"), (A, "school-a")]);
    })
    .await;
    let q = question();
    for _ in 0..8 {
        cached(&h, B, &q, None).await;
    }
    assert!(cached(&h, B, &q, None).await > 100);
    assert_eq!(cached(&h, A, &q, None).await, 0);
    let m = h.metrics_text().await;
    let drift: f64 = m
        .lines()
        .filter(|l| l.starts_with("tutor_gateway_prefix_cache_drift_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(drift, 0.0, "{m}");
    h.shutdown().await;
}
