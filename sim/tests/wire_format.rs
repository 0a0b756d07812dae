//! The simulator speaks vLLM's wire format: SSE framing, chunk shapes, usage, errors, ids.

mod common;

use common::*;
use serde_json::Value;

#[tokio::test]
async fn chat_stream_has_vllm_framing_and_chunk_shapes() {
    let s = sim(&["--speed", "50", "--profile", "tiny-test"]).await;
    let resp = send(
        client()
            .post(format!("{}/v1/chat/completions", s.url()))
            .header("x-request-id", "req-42")
            .json(&chat_body(
                "why does this TypeScript error happen?",
                12,
                true,
            )),
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["content-type"],
        "text/event-stream; charset=utf-8"
    );
    let events = sse_events(&resp.text().await.unwrap());
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    for c in &chunks {
        assert_eq!(c["id"], "chatcmpl-req-42");
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(c["model"], MODEL);
        assert!(c["created"].as_u64().unwrap() > 1_600_000_000);
    }
    // Role chunk first, exactly as vLLM writes it.
    let first = &chunks[0]["choices"][0];
    assert_eq!(
        first,
        &serde_json::json!({"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null})
    );
    // Token chunks: text in delta.content, finish reason only on the last.
    let token_chunks = &chunks[1..chunks.len() - 1];
    let mut words = 0;
    for (i, c) in token_chunks.iter().enumerate() {
        let ch = &c["choices"][0];
        words += ch["delta"]["content"]
            .as_str()
            .unwrap()
            .split_whitespace()
            .count();
        let last = i == token_chunks.len() - 1;
        assert_eq!(ch["finish_reason"] == "length", last, "{c}");
        assert!(c.get("usage").is_none(), "no usage on token chunks: {c}");
    }
    // Final usage chunk: no choices, exact counts.
    let usage_chunk = chunks.last().unwrap();
    assert_eq!(usage_chunk["choices"], serde_json::json!([]));
    let usage = &usage_chunk["usage"];
    assert_eq!(usage["completion_tokens"], 12);
    assert_eq!(words, 12, "one filler word per token");
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        usage["prompt_tokens"].as_u64().unwrap() + 12
    );
    assert!(usage.get("prompt_tokens_details").is_none());
    s.shutdown().await;
}

#[tokio::test]
async fn completions_stream_has_every_field_including_nulls() {
    let s = sim(&["--speed", "50", "--profile", "tiny-test"]).await;
    let body = post_text(format!("{}/v1/completions", s.url()), &serde_json::json!({"model": MODEL, "prompt": "def f(x):", "max_tokens": 5, "stream": true})).await;
    let events = sse_events(&body);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let mut text = String::new();
    for c in &chunks {
        assert!(c["id"].as_str().unwrap().starts_with("cmpl-"));
        assert_eq!(c["object"], "text_completion");
        let ch = c["choices"][0].as_object().unwrap();
        let keys: Vec<&str> = ch.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            ["index", "text", "logprobs", "finish_reason", "stop_reason"]
        );
        text.push_str(ch["text"].as_str().unwrap());
    }
    assert_eq!(text.split_whitespace().count(), 5);
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
    s.shutdown().await;
}

/// vLLM's `CompletionRequest.max_tokens: int | None = 16`: left out, 16 tokens; an explicit
/// `null`, up to the model's length (its `get_max_tokens`).
#[tokio::test]
async fn a_completion_without_max_tokens_writes_16_and_with_null_the_models_length() {
    let s = sim(&[
        "--speed",
        "50",
        "--profile",
        "tiny-test",
        "--max-model-len",
        "200",
    ])
    .await;
    let ask = |body: Value| {
        send_json(
            client()
                .post(format!("{}/v1/completions", s.url()))
                .json(&body),
        )
    };
    let absent: Value = ask(serde_json::json!({"model": MODEL, "prompt": "def f(x):",
                                               "ignore_eos": true}))
    .await;
    assert_eq!(absent["usage"]["completion_tokens"], 16, "{absent}");
    let null: Value = ask(serde_json::json!({"model": MODEL, "prompt": "def f(x):",
                                             "max_tokens": null, "ignore_eos": true}))
    .await;
    let used = |v: &Value, k: &str| v["usage"][k].as_u64().unwrap();
    assert_eq!(
        used(&null, "prompt_tokens") + used(&null, "completion_tokens"),
        200,
        "{null}"
    );
    s.shutdown().await;
}

#[tokio::test]
async fn non_streaming_responses_have_vllm_shapes() {
    let s = sim(&["--speed", "50", "--profile", "tiny-test"]).await;
    let chat: Value = send_json(
        client()
            .post(format!("{}/v1/chat/completions", s.url()))
            .json(&chat_body("hello", 7, false)),
    )
    .await;
    assert_eq!(chat["object"], "chat.completion");
    assert_eq!(chat["choices"][0]["message"]["role"], "assistant");
    assert_eq!(message_words(&chat), 7);
    assert_eq!(chat["choices"][0]["finish_reason"], "length");
    assert_eq!(chat["usage"]["completion_tokens"], 7);
    let keys: Vec<&str> = chat
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        ["id", "object", "created", "model", "choices", "usage"]
    );
    s.shutdown().await;
}

#[tokio::test]
async fn repeated_prefix_reports_cached_tokens() {
    let s = sim(&flags(
        "--speed 50 --profile tiny-test --enable-prompt-tokens-details",
    ))
    .await;
    let system = words(300, "You are a patient programming tutor.");
    let ask = |question: &str| {
        serde_json::json!({
            "model": MODEL,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
            "max_tokens": 4,
            "stream": true,
            "stream_options": {"include_usage": true},
        })
    };
    let usage = |body: String| -> Value {
        let events = sse_events(&body);
        let last: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
        last["usage"].clone()
    };
    let url = format!("{}/v1/chat/completions", s.url());
    let first = usage(post_text(&url, &ask("what is a closure?")).await);
    assert!(
        first.get("prompt_tokens_details").is_none(),
        "cold cache: {first}"
    );
    let second = usage(post_text(&url, &ask("what is a trait?")).await);
    let cached = second["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(
        cached >= 288 && cached % 16 == 0,
        "the shared system prompt hits: {second}"
    );
    assert!(cached < second["prompt_tokens"].as_u64().unwrap());
    assert!(
        metric(&s, &format!("vllm:prefix_cache_hits_total{}", labels())).await >= cached as f64
    );
    s.shutdown().await;
}

#[tokio::test]
async fn prompt_too_long_unknown_model_and_bad_json_get_vllm_errors() {
    let s = sim(&["--max-model-len", "1024", "--profile", "tiny-test"]).await;
    let url = format!("{}/v1/chat/completions", s.url());
    let resp = send(
        client()
            .post(&url)
            .json(&chat_body(&words(2000, "x"), 10, true)),
    )
    .await;
    assert_eq!(resp.status(), 400);
    let err: Value = resp.json().await.unwrap();
    assert_eq!(err["error"]["type"], "BadRequestError");
    assert_eq!(err["error"]["param"], "input_tokens");
    assert_eq!(err["error"]["code"], 400);
    assert!(err["error"]["message"]
        .as_str()
        .unwrap()
        .contains("maximum context length is 1024"));

    // vLLM 0.34: an output limit above the context is refused; one that does not fit beside
    // the prompt is lowered to the room left (`get_max_tokens`).
    let resp = send(client().post(&url).json(&chat_body("hi", 2000, false))).await;
    assert_eq!(resp.status(), 400, "max_tokens over the context");
    let err: Value = resp.json().await.unwrap();
    assert_eq!(err["error"]["param"], "max_tokens");
    let resp = send(
        client()
            .post(&url)
            .json(&chat_body(&words(500, "x"), 1000, false)),
    )
    .await;
    assert_eq!(resp.status(), 200, "prompt + max_tokens over the context");
    let answer: Value = resp.json().await.unwrap();
    let usage = &answer["usage"];
    assert_eq!(
        usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap(),
        1024,
        "{answer}"
    );
    assert_eq!(answer["choices"][0]["finish_reason"], "length");

    let mut body = chat_body("hi", 5, false);
    body["model"] = "gpt-unknown".into();
    let resp = send(client().post(&url).json(&body)).await;
    assert_eq!(resp.status(), 404);
    assert_eq!(
        resp.json::<Value>().await.unwrap()["error"]["type"],
        "NotFoundError"
    );

    let resp = send(client().post(&url).body("{not json")).await;
    assert_eq!(resp.status(), 400);
    s.shutdown().await;
}

#[tokio::test]
async fn request_ids_follow_vllm_rules() {
    let s = sim(&flags(
        "--speed 50 --profile tiny-test --enable-request-id-headers",
    ))
    .await;
    let url = format!("{}/v1/chat/completions", s.url());
    let resp = send(
        client()
            .post(&url)
            .header("x-request-id", "from-header")
            .json(&chat_body("hi", 2, false)),
    )
    .await;
    assert_eq!(resp.headers()["x-request-id"], "from-header");
    assert_eq!(
        resp.json::<Value>().await.unwrap()["id"],
        "chatcmpl-from-header"
    );

    let mut body = chat_body("hi", 2, false);
    body["request_id"] = "from-body".into();
    let v: Value = send_json(client().post(&url).json(&body)).await;
    assert_eq!(v["id"], "chatcmpl-from-body");

    let v: Value = send_json(client().post(&url).json(&chat_body("hi", 2, false))).await;
    let id = v["id"].as_str().unwrap().strip_prefix("chatcmpl-").unwrap();
    assert_eq!(id.len(), 32, "uuid4 hex: {id}");
    assert!(id.chars().all(|c| c.is_ascii_hexdigit()));
    s.shutdown().await;
}

#[tokio::test]
async fn side_endpoints_answer_like_vllm() {
    let s = sim(&["--max-model-len", "4096"]).await;
    let models = get_json(format!("{}/v1/models", s.url())).await;
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], MODEL);
    assert_eq!(models["data"][0]["owned_by"], "vllm");
    assert_eq!(models["data"][0]["max_model_len"], 4096);
    let health = send(client().get(format!("{}/health", s.url()))).await;
    assert_eq!(health.status(), 200);
    assert!(health.text().await.unwrap().is_empty());
    let version = get_json(format!("{}/version", s.url())).await;
    assert!(version["version"].is_string());
    let tok: Value = send_json(
        client()
            .post(format!("{}/tokenize", s.url()))
            .json(&serde_json::json!({"prompt": "why does this TypeScript error?\n"})),
    )
    .await;
    // BOS + 10 heuristic tokens (see the tokenizer module docs).
    assert_eq!(tok["count"], 11);
    assert_eq!(tok["tokens"].as_array().unwrap().len(), 11);
    assert_eq!(tok["max_model_len"], 4096);
    s.shutdown().await;
}

#[tokio::test]
async fn metrics_expose_vllm_series_with_types() {
    let s = sim(&flags(
        "--speed 50 --profile tiny-test --num-gpu-blocks 1500",
    ))
    .await;
    send(
        client()
            .post(format!("{}/v1/chat/completions", s.url()))
            .json(&chat_body("hi", 3, false)),
    )
    .await;
    let text = metrics_text(&s.url()).await;
    for (name, kind) in [
        ("vllm:num_requests_running", "gauge"),
        ("vllm:num_requests_waiting", "gauge"),
        ("vllm:kv_cache_usage_perc", "gauge"),
        ("vllm:cache_config_info", "gauge"),
        ("vllm:prompt_tokens_total", "counter"),
        ("vllm:generation_tokens_total", "counter"),
        ("vllm:num_preemptions_total", "counter"),
        ("vllm:request_success_total", "counter"),
        ("vllm:prefix_cache_queries_total", "counter"),
        ("vllm:prefix_cache_hits_total", "counter"),
        ("vllm:time_to_first_token_seconds", "histogram"),
        ("vllm:inter_token_latency_seconds", "histogram"),
        ("vllm:e2e_request_latency_seconds", "histogram"),
        ("vllm:request_queue_time_seconds", "histogram"),
        ("vllm:request_prefill_time_seconds", "histogram"),
        ("vllm:request_decode_time_seconds", "histogram"),
    ] {
        assert!(
            text.contains(&format!("# TYPE {name} {kind}\n")),
            "{name} {kind}"
        );
    }
    assert!(text.contains("num_gpu_blocks=\"1500\""));
    assert!(text.contains("block_size=\"16\""));
    assert_eq!(
        metric(&s, &format!("vllm:generation_tokens_total{}", labels())).await,
        3.0
    );
    assert_eq!(
        metric(
            &s,
            &format!("vllm:request_success_total{{engine=\"0\",model_name=\"{MODEL}\",finished_reason=\"length\"}}")
        )
        .await,
        1.0
    );
    assert!(text.contains(&format!(
        "vllm:time_to_first_token_seconds_count{} 1\n",
        labels()
    )));
    s.shutdown().await;
}

#[tokio::test]
async fn per_request_metrics_split_queue_and_prefill() {
    let s = sim(&flags(
        "--speed 20 --profile tiny-test --enable-per-request-metrics",
    ))
    .await;
    let body = post_text(
        format!("{}/v1/chat/completions", s.url()),
        &chat_body(&words(500, "q"), 20, true),
    )
    .await;
    let events = sse_events(&body);
    let last: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    let m = &last["metrics"];
    let ttft = m["time_to_first_token_ms"].as_f64().unwrap();
    let queue = m["queue_time_ms"].as_f64().unwrap();
    assert!(ttft > 0.0 && queue >= 0.0 && queue <= ttft, "{m}");
    assert!(m["tokens_per_second"].as_f64().unwrap() > 0.0);
    assert!(m["mean_itl_ms"].as_f64().unwrap() > 0.0);
    assert!(m["generation_time_ms"].as_f64().unwrap() > 0.0);
    s.shutdown().await;
}

#[tokio::test]
async fn reasoning_streams_as_delta_reasoning_before_the_content_and_counts_as_output() {
    let s = sim(&flags(
        "--speed 50 --profile tiny-test --reasoning-tokens 7",
    ))
    .await;
    let url = format!("{}/v1/chat/completions", s.url());
    let text = post_text(url.clone(), &chat_body("why?", 10, true)).await;
    let events = sse_events(&text);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let (mut reasoning, mut content, mut answering) = (0, 0, false);
    for c in &chunks[1..chunks.len() - 1] {
        let delta = &c["choices"][0]["delta"];
        if let Some(r) = delta.get("reasoning") {
            assert!(!answering, "reasoning comes before the answer: {c}");
            assert!(delta.get("content").is_none(), "only the field set: {c}");
            reasoning += r.as_str().unwrap().split_whitespace().count();
        } else {
            answering = true;
            content += delta["content"]
                .as_str()
                .unwrap()
                .split_whitespace()
                .count();
        }
    }
    assert_eq!((reasoning, content), (7, 3));
    assert_eq!(
        chunks.last().unwrap()["usage"]["completion_tokens"],
        10,
        "reasoning counted in the output"
    );

    // Not streaming: the reasoning in `message.reasoning`.
    let whole: Value =
        serde_json::from_str(&post_text(url, &chat_body("why?", 10, false)).await).unwrap();
    let message = &whole["choices"][0]["message"];
    assert_eq!(
        message["reasoning"]
            .as_str()
            .unwrap()
            .split_whitespace()
            .count(),
        7
    );
    assert_eq!(
        message["content"]
            .as_str()
            .unwrap()
            .split_whitespace()
            .count(),
        3
    );
    assert_eq!(whole["usage"]["completion_tokens"], 10);
    s.shutdown().await;
}

/// A named tool choice (`tool_choice: {"type": "function", ...}`) as vLLM answers it: streamed
/// as `delta.tool_calls`, the first with the call's id, type and name, the arguments in pieces
/// that join to the call's JSON; not streaming, `message.tool_calls` with the same call.
#[tokio::test]
async fn a_named_tool_choice_answers_with_a_call_of_that_tool() {
    let s = sim(&["--speed", "50", "--profile", "tiny-test"]).await;
    let url = format!("{}/v1/chat/completions", s.url());
    let ask = |stream: bool| {
        let mut body = chat_body("look up my grade", 12, stream);
        body["tools"] = serde_json::json!([{"type": "function", "function": {
            "name": "lookup", "parameters": {"type": "object"}}}]);
        body["tool_choice"] =
            serde_json::json!({"type": "function", "function": {"name": "lookup"}});
        body
    };
    let events = sse_events(&post_text(url.clone(), &ask(true)).await);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let (mut arguments, mut heads, mut finish) = (String::new(), Vec::new(), None);
    for e in &events[..events.len() - 1] {
        let c: Value = serde_json::from_str(e).unwrap();
        if let Some(f) = c["choices"][0]["finish_reason"].as_str() {
            finish = Some(f.to_owned());
        }
        let Some(calls) = c["choices"][0]["delta"]["tool_calls"].as_array() else {
            continue;
        };
        assert!(c["choices"][0]["delta"].get("content").is_none(), "{c}");
        let call = &calls[0];
        assert_eq!(call["index"], 0);
        if call.get("id").is_some() {
            heads.push(call.clone());
        }
        arguments.push_str(call["function"]["arguments"].as_str().unwrap());
    }
    assert_eq!(heads.len(), 1, "one call opened: {heads:?}");
    assert_eq!(heads[0]["type"], "function");
    assert_eq!(heads[0]["function"]["name"], "lookup");
    let parsed: Value = serde_json::from_str(&arguments).expect("the arguments are JSON");
    assert_eq!(
        parsed["text"].as_str().unwrap().split_whitespace().count(),
        12
    );
    assert_eq!(finish.as_deref(), Some("length"));

    let whole: Value = serde_json::from_str(&post_text(url, &ask(false)).await).unwrap();
    let message = &whole["choices"][0]["message"];
    assert_eq!(message["content"], "");
    assert_eq!(message["tool_calls"][0]["function"]["name"], "lookup");
    assert_eq!(message["tool_calls"][0]["function"]["arguments"], arguments);
    assert_eq!(whole["usage"]["completion_tokens"], 12);
    s.shutdown().await;
}

/// Log-probabilities as vLLM writes them: chat `logprobs.content`, one entry a token with its
/// alternatives; completions' lists (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`
/// into the whole answer). Streamed, the chunks' lists join to the non-streaming answer's.
#[tokio::test]
async fn logprobs_stream_in_pieces_that_join_to_the_whole_answers() {
    let s = sim(&["--speed", "50", "--profile", "tiny-test"]).await;
    for (path, extra) in [
        (
            "chat/completions",
            serde_json::json!({"logprobs": true, "top_logprobs": 2}),
        ),
        ("completions", serde_json::json!({"logprobs": 2})),
    ] {
        let url = format!("{}/v1/{path}", s.url());
        let ask = |stream: bool| {
            let mut body = if path == "completions" {
                serde_json::json!({"model": MODEL, "prompt": "def fib(n):", "max_tokens": 9,
                    "ignore_eos": true, "stream": stream})
            } else {
                chat_body("why?", 9, stream)
            };
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            body
        };
        let mut joined = serde_json::Map::new();
        let mut text = String::new();
        let events = sse_events(&post_text(url.clone(), &ask(true)).await);
        for e in events.iter().filter(|e| *e != "[DONE]") {
            let c: Value = serde_json::from_str(e).unwrap();
            let choice = &c["choices"][0];
            text.push_str(
                choice["text"]
                    .as_str()
                    .or(choice["delta"]["content"].as_str())
                    .unwrap_or_default(),
            );
            if let Some(lp) = choice["logprobs"].as_object() {
                for (k, v) in lp {
                    let into = joined.entry(k.clone()).or_insert(Value::Array(Vec::new()));
                    into.as_array_mut()
                        .unwrap()
                        .extend(v.as_array().unwrap().iter().cloned());
                }
            }
        }
        let whole: Value = serde_json::from_str(&post_text(url, &ask(false)).await).unwrap();
        let want = &whole["choices"][0]["logprobs"];
        assert_eq!(Value::Object(joined.clone()), *want, "{path}");
        if path == "completions" {
            assert_eq!(want["tokens"].as_array().unwrap().len(), 9);
            let tokens: String = want["tokens"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_str().unwrap())
                .collect();
            assert_eq!(tokens, text, "the tokens spell the answer");
            let last = want["text_offset"][8].as_u64().unwrap() as usize;
            assert!(text[last..] == *want["tokens"][8].as_str().unwrap());
        } else {
            let content = want["content"].as_array().unwrap();
            assert_eq!(content.len(), 9);
            assert_eq!(content[0]["top_logprobs"].as_array().unwrap().len(), 2);
            let tokens: String = content
                .iter()
                .map(|t| t["token"].as_str().unwrap())
                .collect();
            assert_eq!(tokens, text, "the tokens spell the answer");
        }
    }
    s.shutdown().await;
}

#[tokio::test]
async fn usage_only_when_asked_as_vllm_does() {
    // vLLM 0.33+ `StreamOptions`: `include_usage` defaults to false, and running usage
    // (`continuous_usage_stats`) comes only together with it (`should_include_usage`).
    let s = sim(&flags("--speed 50 --profile tiny-test")).await;
    let url = format!("{}/v1/chat/completions", s.url());
    let with = |options: Value| {
        let mut body = chat_body("what is a closure?", 4, true);
        body["stream_options"] = options;
        body
    };
    let chunks = |text: String| -> Vec<Value> {
        sse_events(&text)
            .iter()
            .filter(|e| *e != "[DONE]")
            .map(|e| serde_json::from_str(e).unwrap())
            .collect()
    };
    let with_usage = |cs: &[Value]| cs.iter().filter(|c| !c["usage"].is_null()).count();
    for options in [
        serde_json::json!({}),
        serde_json::json!({"continuous_usage_stats": true}),
        serde_json::json!({"include_usage": false, "continuous_usage_stats": true}),
    ] {
        let cs = chunks(post_text(&url, &with(options.clone())).await);
        assert_eq!(with_usage(&cs), 0, "{options}: {cs:?}");
    }
    let cs = chunks(post_text(&url, &with(serde_json::json!({"include_usage": true}))).await);
    assert_eq!(with_usage(&cs), 1, "the last chunk only: {cs:?}");
    let both = serde_json::json!({"include_usage": true, "continuous_usage_stats": true});
    let cs = chunks(post_text(&url, &with(both)).await);
    assert_eq!(with_usage(&cs), cs.len(), "every chunk: {cs:?}");
    s.shutdown().await;
}

#[tokio::test]
async fn sampling_values_vllm_refuses_are_refused_and_priority_under_fcfs_is_ignored() {
    let s = sim(&flags("--speed 50 --profile tiny-test")).await;
    let url = format!("{}/v1/chat/completions", s.url());
    let with = |field: &str, value: Value| {
        let mut body = chat_body("hi", 2, false);
        body[field] = value;
        body
    };
    // A wrong type, and values out of vLLM's ranges (`SamplingParams._verify_args`).
    for (field, value) in [
        ("temperature", serde_json::json!("hot")),
        ("temperature", serde_json::json!(-1)),
        ("temperature", serde_json::json!(2.5)),
        ("top_p", serde_json::json!(0)),
        ("top_k", serde_json::json!(-2)),
        ("min_p", serde_json::json!(1.5)),
        ("presence_penalty", serde_json::json!(3)),
        ("frequency_penalty", serde_json::json!(-3)),
        ("repetition_penalty", serde_json::json!(0)),
    ] {
        let resp = send(client().post(&url).json(&with(field, value.clone()))).await;
        assert_eq!(resp.status(), 400, "{field} = {value}");
        let err: Value = resp.json().await.unwrap();
        let message = err["error"]["message"].as_str().unwrap();
        // A range names the field; a type error is the body's parse error.
        assert!(
            message.contains(field) || message.contains("invalid type"),
            "{field} = {value}: {err}"
        );
    }
    // In range, as pydantic reads numbers (a string that spells one, a whole float for an
    // integer): answered.
    for (field, value) in [
        ("temperature", serde_json::json!(0)),
        ("temperature", serde_json::json!("0.7")),
        ("top_p", serde_json::json!(1)),
        ("top_k", serde_json::json!(-1)),
        ("top_k", serde_json::json!(5.0)),
        ("presence_penalty", serde_json::json!(-2)),
    ] {
        let resp = send(client().post(&url).json(&with(field, value.clone()))).await;
        assert_eq!(resp.status(), 200, "{field} = {value}");
    }
    // vLLM 0.33+ takes a priority without `--scheduling-policy priority`, and ignores it.
    let resp = send(
        client()
            .post(&url)
            .json(&with("priority", serde_json::json!(2))),
    )
    .await;
    assert_eq!(resp.status(), 200);
    s.shutdown().await;
}
