//! Text the chat template renders outside `content`: a message's `role`, an assistant's
//! `reasoning` in the history, the values of `chat_template_kwargs`. Each once rode the small
//! lane with a tiny estimate while the engine prefilled all of it (a 12k-token role: estimate
//! 14, the engine counted 12,012). Now a role vLLM does not know is refused, a configured one is
//! counted, reasoning is classified by its size, and template kwargs are short listed switches.

use serde_json::{json, Value};

use crate::common::*;

/// About `n` heuristic tokens of plain words.
fn text_of(n: usize) -> String {
    words(n, "w")
}

/// Posts a chat body; the status and the JSON answer.
async fn post(h: &Harness, path: &str, body: &Value) -> (u16, Value) {
    let resp = send(client().post(h.url(path)).json(body)).await;
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// The request log's entry for the one request sent so far.
fn only_entry(h: &Harness) -> Value {
    let log = h.log.lock().unwrap().clone();
    assert_eq!(log.len(), 1, "{log:?}");
    log[0].clone()
}

async fn sim() -> Harness {
    harness(&["--speed", "100", "--profile", "tiny-test"], |_| {}).await
}

#[tokio::test]
async fn a_12k_token_role_is_refused_as_no_role_vllm_knows() {
    let h = sim().await;
    let role = text_of(12_000);
    let body = json!({"messages": [{"role": role, "content": "hi"}], "max_tokens": 5});
    let (status, answer) = post(&h, "/v1/chat/completions", &body).await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["error"]["param"], "messages[0].role", "{answer}");
    assert_eq!(answer["error"]["type"], "invalid_request_error");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains("not an accepted role"), "{message}");
    assert!(
        message.len() < 400,
        "the role is not echoed whole: {message}"
    );
    assert_eq!(only_entry(&h)["outcome"], "bad_request");
    // Nothing reached the engine; nothing is held.
    assert!(h.idle());
    assert!(h.sim_requests().await.is_empty());

    // The same through `POST /answer`.
    let body = json!({"messages": [{"role": text_of(12_000), "content": "hi"}]});
    let (status, answer) = post(&h, "/answer", &body).await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["error"]["param"], "messages[0].role", "{answer}");
    assert!(h.idle());
    h.shutdown().await;
}

#[tokio::test]
async fn a_12k_token_role_configured_as_allowed_is_classified_large() {
    let role = text_of(12_000);
    let allowed = role.clone();
    let h = harness(&["--speed", "100", "--profile", "tiny-test"], move |c| {
        c.classify.extra_roles = vec![allowed];
    })
    .await;
    let body = json!({"messages": [{"role": role, "content": "hi"}], "max_tokens": 5});
    let (status, answer) = post(&h, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{answer}");
    let entry = only_entry(&h);
    assert_eq!(entry["lane"], "large", "{entry}");
    let estimate = entry["input_tokens_estimated"].as_u64().unwrap();
    let engine = entry["input_tokens"].as_u64().unwrap();
    assert!(engine > 12_000, "the engine prefilled the role: {entry}");
    assert!(
        estimate >= engine,
        "estimated {estimate}, the engine counted {engine}"
    );
    eventually("the lanes are idle", || h.idle()).await;
    h.shutdown().await;
}

/// A chat body carrying `n` tokens of text in an assistant's `reasoning` in the history.
fn hidden_text(n: usize) -> Value {
    json!({
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "ok", "reasoning": text_of(n)},
            {"role": "user", "content": "and?"},
        ],
        "max_tokens": 5,
    })
}

/// Text in `chat_template_kwargs` is refused before any lane: Llama 3.1's template loops over
/// `custom_tools` (over a string's characters, each with markup: about three tokens a
/// letter, where the gateway would count the string once), and a listed switch takes a short
/// value only.
#[tokio::test]
async fn text_in_template_kwargs_is_refused_before_any_lane() {
    let h = sim().await;
    let bodies = [
        (
            json!({"custom_tools": text_of(3_000)}),
            "chat_template_kwargs",
        ),
        (json!({"bos_token": "x"}), "chat_template_kwargs"),
        (
            json!({"date_string": text_of(8_000), "enable_thinking": false}),
            "chat_template_kwargs.date_string",
        ),
    ];
    for (kwargs, param) in bodies {
        let body = json!({
            "messages": [{"role": "user", "content": "hi"}],
            "chat_template_kwargs": kwargs,
            "max_tokens": 5,
        });
        let (status, answer) = post(&h, "/v1/chat/completions", &body).await;
        assert_eq!(status, 400, "{answer}");
        assert_eq!(answer["error"]["param"], param, "{answer}");
    }
    eventually("every request is logged", || {
        h.log.lock().unwrap().len() == 3
    })
    .await;
    for entry in h.log.lock().unwrap().iter() {
        assert!(entry["lane"].is_null(), "no lane held it: {entry}");
        assert_eq!(entry["input_tokens"], Value::Null, "never sent: {entry}");
    }
    // A listed switch with a short value goes through.
    let body = json!({
        "messages": [{"role": "user", "content": "hi"}],
        "chat_template_kwargs": {"enable_thinking": false, "date_string": "26 Jul 2024"},
        "max_tokens": 5,
    });
    let (status, answer) = post(&h, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{answer}");
    eventually("the lanes are idle", || h.idle()).await;
    h.shutdown().await;
}

#[tokio::test]
async fn text_in_reasoning_history_is_classified_by_its_size() {
    let h = sim().await;
    // 8,000 tokens: large, and counted at least as the engine counts it.
    let (status, answer) = post(&h, "/v1/chat/completions", &hidden_text(8_000)).await;
    assert_eq!(status, 200, "{answer}");
    eventually("the request is logged", || {
        !h.log.lock().unwrap().is_empty()
    })
    .await;
    let entry = h.log.lock().unwrap()[0].clone();
    assert_eq!(entry["lane"], "large", "{entry}");
    let estimate = entry["input_tokens_estimated"].as_u64().unwrap();
    let engine = entry["input_tokens"].as_u64().unwrap();
    assert!(engine > 8_000, "the engine prefilled it: {entry}");
    assert!(estimate >= engine, "{entry}");

    // 3 MB (within server.max_body_bytes): more than the model takes, refused by the
    // gateway itself before any lane, not relayed from the engine.
    let body = hidden_text(850_000);
    assert!(body.to_string().len() > 3_000_000);
    let (status, answer) = post(&h, "/v1/chat/completions", &body).await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["error"]["code"], "too_long", "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("maximum length"),
        "{answer}"
    );
    eventually("the request is logged", || h.log.lock().unwrap().len() > 1).await;
    let entry = h.log.lock().unwrap()[1].clone();
    assert!(entry["lane"].is_null(), "no lane held it: {entry}");
    eventually("the lanes are idle", || h.idle()).await;
    h.shutdown().await;
}

/// Llama 3.1's template writes a tool result as `message.content | tojson`: a control character
/// is six bytes there (`\u0001`, three tokens), a newline or quote two. The same text costs
/// more as a tool result than as a question, and is counted so.
#[tokio::test]
async fn a_tool_result_is_counted_as_the_json_the_template_writes() {
    let h = sim().await;
    let text = "\u{1}".repeat(2_000);
    let asked = |role: &str| {
        let mut messages = vec![json!({"role": "user", "content": "q"})];
        if role == "tool" {
            messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}));
        }
        messages.push(json!({"role": role, "content": text, "tool_call_id": "a"}));
        json!({"messages": messages, "max_tokens": 5})
    };
    let mut estimates = Vec::new();
    for (i, role) in ["user", "tool"].into_iter().enumerate() {
        let (status, answer) = post(&h, "/v1/chat/completions", &asked(role)).await;
        assert_eq!(status, 200, "{role}: {answer}");
        eventually("the request is logged", || h.log.lock().unwrap().len() > i).await;
        let entry = h.log.lock().unwrap()[i].clone();
        let estimate = entry["input_tokens_estimated"].as_u64().unwrap();
        let engine = entry["input_tokens"].as_u64().unwrap();
        assert!(estimate >= engine, "{role}: {entry}");
        estimates.push(estimate);
    }
    assert!(
        estimates[1] > 2 * estimates[0],
        "as a tool result, the text is counted as its JSON: {estimates:?}"
    );
    eventually("the lanes are idle", || h.idle()).await;
    h.shutdown().await;
}
