use super::*;

fn chunk(json: &str) -> Chunk {
    match parse_payload(Bytes::copy_from_slice(json.as_bytes())).unwrap() {
        Payload::Chunk(c) => c,
        other => panic!("not a chunk: {other:?}"),
    }
}

fn engine_error(json: &str) -> EngineError {
    match parse_payload(Bytes::copy_from_slice(json.as_bytes())).unwrap() {
        Payload::Error(e) => *e,
        other => panic!("not an error: {other:?}"),
    }
}

#[test]
fn done_marker() {
    assert_eq!(
        parse_payload(Bytes::from_static(b"[DONE]")).unwrap(),
        Payload::Done
    );
}

#[test]
fn chat_role_chunk_is_not_content() {
    let c = chunk(
        r#"{"id":"chatcmpl-r1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}"#,
    );
    assert!(!c.has_content);
    assert_eq!(c.text, "");
    assert_eq!(c.finish_reason, None);
}

#[test]
fn chat_content_chunk_keeps_raw_bytes() {
    let json = r#"{"id":"chatcmpl-r1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" fn main"},"logprobs":null,"finish_reason":null}]}"#;
    let c = chunk(json);
    assert!(c.has_content);
    assert_eq!(c.text, " fn main");
    assert_eq!(c.raw.as_ref(), json.as_bytes());
}

#[test]
fn chat_last_token_carries_finish_reason() {
    let c = chunk(
        r#"{"choices":[{"index":0,"delta":{"content":" end"},"logprobs":null,"finish_reason":"length"}]}"#,
    );
    assert!(c.has_content);
    assert_eq!(c.finish_reason.as_deref(), Some("length"));
}

#[test]
fn completions_chunk_reads_text() {
    let c = chunk(
        r#"{"id":"cmpl-r1","object":"text_completion","choices":[{"index":0,"text":" let x","logprobs":null,"finish_reason":null,"stop_reason":null}]}"#,
    );
    assert!(c.has_content);
    assert_eq!(c.text, " let x");
    let empty =
        chunk(r#"{"choices":[{"index":0,"text":"","finish_reason":"stop","stop_reason":null}]}"#);
    assert!(!empty.has_content);
    assert_eq!(empty.finish_reason.as_deref(), Some("stop"));
}

#[test]
fn tool_call_and_reasoning_deltas_are_content() {
    assert!(chunk(r#"{"choices":[{"delta":{"tool_calls":[{"index":0}]}}]}"#).has_content);
    assert!(chunk(r#"{"choices":[{"delta":{"reasoning_content":"hmm"}}]}"#).has_content);
    assert!(!chunk(r#"{"choices":[{"delta":{"tool_calls":[]}}]}"#).has_content);
}

#[test]
fn reasoning_under_either_name_is_output_but_not_answer() {
    // Current vLLM sends `reasoning`; older versions `reasoning_content`.
    for json in [
        r#"{"choices":[{"index":0,"delta":{"reasoning":" let me think"},"logprobs":null,"finish_reason":null}]}"#,
        r#"{"choices":[{"index":0,"delta":{"reasoning_content":" let me think"},"logprobs":null,"finish_reason":null}]}"#,
    ] {
        let c = chunk(json);
        assert!(c.has_content, "reasoning is generated output: {json}");
        assert!(!c.has_answer, "reasoning is not the answer: {json}");
        assert_eq!(c.text, "", "reasoning is not the answer's text: {json}");
    }
    assert!(!chunk(r#"{"choices":[{"delta":{"reasoning":""}}]}"#).has_content);
    let answer = chunk(r#"{"choices":[{"delta":{"content":" so"}}]}"#);
    assert!(answer.has_content && answer.has_answer);
    assert!(chunk(r#"{"choices":[{"delta":{"tool_calls":[{"index":0}]}}]}"#).has_answer);
    assert!(chunk(r#"{"choices":[{"text":" x"}]}"#).has_answer);
}

#[test]
fn usage_chunk_with_cached_tokens_and_metrics() {
    let c = chunk(
        r#"{"choices":[],"usage":{"prompt_tokens":120,"completion_tokens":37,"total_tokens":157,"prompt_tokens_details":{"cached_tokens":96}},"metrics":{"time_to_first_token_ms":41.5,"generation_time_ms":300.0,"queue_time_ms":null,"mean_itl_ms":8.1,"tokens_per_second":120.0}}"#,
    );
    assert!(!c.has_content);
    assert_eq!(
        c.usage,
        Some(Usage {
            prompt_tokens: 120,
            completion_tokens: 37,
            cached_tokens: Some(96)
        })
    );
    let m = c.metrics.unwrap();
    assert_eq!(m.time_to_first_token_ms, Some(41.5));
    assert_eq!(m.queue_time_ms, None);
    assert_eq!(m.tokens_per_second, Some(120.0));
}

/// A lying engine's timings (negative, beyond a day) are dropped, not logged and measured.
#[test]
fn implausible_engine_timings_are_dropped() {
    let c = chunk(
        r#"{"choices":[],"metrics":{"time_to_first_token_ms":-1e308,"generation_time_ms":1e300,"queue_time_ms":2.5,"mean_itl_ms":-3,"tokens_per_second":-1}}"#,
    );
    let m = c.metrics.unwrap();
    assert_eq!(
        (
            m.time_to_first_token_ms,
            m.generation_time_ms,
            m.mean_itl_ms,
            m.tokens_per_second
        ),
        (None, None, None, None)
    );
    assert_eq!(m.queue_time_ms, Some(2.5));
}

#[test]
fn usage_without_details_and_metrics_with_missing_fields() {
    let c = chunk(
        r#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8},"metrics":{"mean_itl_ms":2}}"#,
    );
    assert_eq!(c.usage.unwrap().cached_tokens, None);
    assert_eq!(c.usage.unwrap().completion_tokens, 3);
    assert_eq!(c.metrics.unwrap().mean_itl_ms, Some(2.0));
    assert_eq!(c.metrics.unwrap().generation_time_ms, None);
}

#[test]
fn current_error_shape() {
    let e = engine_error(
        r#"{"error":{"message":"injected engine error","type":"InternalServerError","param":null,"code":500}}"#,
    );
    assert_eq!(e.message, "injected engine error");
    assert_eq!(e.kind.as_deref(), Some("InternalServerError"));
    assert_eq!(e.param, None);
    assert_eq!(e.code.as_deref(), Some("500"));
}

#[test]
fn flat_pre_0_10_1_error_shape() {
    let e = engine_error(
        r#"{"object":"error","message":"too long","type":"BadRequestError","param":"input_tokens","code":400}"#,
    );
    assert_eq!(e.message, "too long");
    assert_eq!(e.param.as_deref(), Some("input_tokens"));
    assert_eq!(e.code.as_deref(), Some("400"));
}

#[test]
fn non_json_is_a_protocol_error_without_the_payload_text() {
    let err = parse_payload(Bytes::from_static(b"{\"truncated\": tru")).unwrap_err();
    assert!(matches!(err, UpstreamError::Protocol(_)), "{err:?}");
    let err = parse_payload(Bytes::from_static(b"secret words here")).unwrap_err();
    assert!(!err.to_string().contains("secret"), "{err}");
}

#[test]
fn wrong_shape_is_a_protocol_error_without_the_payload_text() {
    let err = parse_payload(Bytes::from_static(br#"{"choices":"private prompt"}"#)).unwrap_err();
    assert!(matches!(err, UpstreamError::Protocol(_)));
    assert!(!err.to_string().contains("private"), "{err}");
}

#[test]
fn invalid_utf8_is_a_protocol_error() {
    let err =
        parse_payload(Bytes::from_static(b"{\"choices\":[{\"text\":\"\xff\"}]}")).unwrap_err();
    assert!(matches!(err, UpstreamError::Protocol(_)));
}

#[test]
fn in_a_continuation_reasoning_text_is_the_answers() {
    // vLLM's deepseek_r1 parser takes a continued answer for reasoning.
    let mut c = chunk(
        r#"{"choices":[{"index":0,"delta":{"reasoning":" and so on"},"finish_reason":null}]}"#,
    );
    assert_eq!((c.text.as_str(), c.reasoning.as_str()), ("", " and so on"));
    assert!(c.has_content && !c.has_answer);
    c.reasoning_as_answer();
    assert_eq!((c.text.as_str(), c.reasoning.as_str()), (" and so on", ""));
    assert!(c.has_content && c.has_answer);
    // The older field name too; content already there stays after it.
    let mut both = chunk(r#"{"choices":[{"delta":{"reasoning_content":"a","content":"b"}}]}"#);
    both.reasoning_as_answer();
    assert_eq!(both.text, "ab");
    // Nothing to move: unchanged.
    let mut plain = chunk(r#"{"choices":[{"delta":{"content":"x"}}]}"#);
    plain.reasoning_as_answer();
    assert_eq!((plain.text.as_str(), plain.has_answer), ("x", true));
}

#[test]
fn a_token_that_decodes_to_no_text_is_a_token_but_not_content() {
    // A special token skipped by vLLM's detokenizer: `delta.content` (chat) or `text`
    // (completions) is empty, and the chunk still stands for one generated token.
    for json in [
        r#"{"choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":null}]}"#,
        r#"{"choices":[{"index":0,"text":"","logprobs":null,"finish_reason":null,"stop_reason":null}]}"#,
    ] {
        let c = chunk(json);
        assert!(c.has_token && !c.has_content && c.counts_output(), "{json}");
    }
    // Not tokens: the role chunk that opens a chat message, a chunk that only carries the
    // finish reason, the usage chunk (which counts the output itself).
    let role = chunk(r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#);
    assert!(!role.has_token && !role.counts_output());
    let finish =
        chunk(r#"{"choices":[{"index":0,"delta":{"content":""},"finish_reason":"stop"}]}"#);
    assert!(!finish.has_token);
    let usage = chunk(r#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}"#);
    assert!(!usage.has_token && usage.counts_output());
    assert!(chunk(r#"{"choices":[{"delta":{"content":" so"}}]}"#).has_token);
}

/// An event split over `data:` lines is relayed as one line: the newlines SSE joined it with
/// would end the client's `data:` line in the middle of the JSON.
#[test]
fn a_payload_of_several_data_lines_is_kept_on_one_line() {
    let c = chunk("{\"id\":\"x\",\n\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\\nb\"},\"finish_reason\":null}]}");
    assert_eq!(c.text, "a\nb", "an escaped newline in a string is text");
    assert!(!c.raw.contains(&b'\n'), "{:?}", c.raw);
    let again: serde_json::Value = serde_json::from_slice(&c.raw).unwrap();
    assert_eq!(again["choices"][0]["delta"]["content"], "a\nb");
}
