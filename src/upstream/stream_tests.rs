//! End-of-stream rules, timeouts and counting, on scripted bodies with paused time.

use std::sync::Arc;

use futures::stream;
use tokio_util::task::TaskTracker;

use super::*;
use crate::config::Config;

const ROLE: &str = r#"data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#;

fn token(text: &str) -> String {
    format!(
        r#"data: {{"choices":[{{"index":0,"delta":{{"content":"{text}"}},"finish_reason":null}}]}}"#
    )
}

fn last(text: &str, reason: &str) -> String {
    format!(
        r#"data: {{"choices":[{{"index":0,"delta":{{"content":"{text}"}},"finish_reason":"{reason}"}}]}}"#
    )
}

fn usage(completion: u32) -> String {
    format!(
        r#"data: {{"choices":[],"usage":{{"prompt_tokens":9,"completion_tokens":{completion},"total_tokens":{}}},"metrics":{{"queue_time_ms":1.5}}}}"#,
        9 + completion
    )
}

const DONE: &str = "data: [DONE]";

fn limits() -> StreamLimits {
    StreamLimits {
        first_token: Duration::from_millis(500),
        idle: Duration::from_millis(100),
        total: Duration::from_secs(10),
        max_len: 16_384,
    }
}

/// A stream over `reads` (each an SSE read, already framed); then EOF, or silence if `hang`.
fn scripted(reads: Vec<String>, hang: bool, limits: StreamLimits) -> UpstreamStream {
    let items = stream::iter(reads.into_iter().map(|r| Ok(Bytes::from(r))));
    let body: Body = if hang {
        items.chain(stream::pending()).boxed()
    } else {
        items.boxed()
    };
    let mut config = Config::default().upstream;
    config.abort.enabled = false; // no network here: state only
    let abort = AbortGuard::new(
        reqwest::Client::new(),
        Arc::new(config),
        "r1".into(),
        TaskTracker::new(),
    );
    let now = Instant::now();
    UpstreamStream::new("r1".into(), HeaderMap::new(), body, abort, limits, now, now)
}

fn ev(lines: &[&str]) -> String {
    lines.iter().map(|l| format!("{l}\n\n")).collect()
}

/// Reads to the end: the chunks' texts and the final error, if any.
async fn drain(s: &mut UpstreamStream) -> (Vec<String>, Option<UpstreamError>) {
    let mut texts = Vec::new();
    while let Some(item) = s.next_event().await {
        match item {
            Ok(c) => texts.push(c.text),
            Err(e) => {
                assert!(s.next_event().await.is_none(), "nothing after an error");
                return (texts, Some(e));
            }
        }
    }
    (texts, None)
}

#[tokio::test(start_paused = true)]
async fn clean_stream_counts_exactly_from_usage_and_disarms() {
    let body = ev(&[ROLE, &token(" a b"), &last(" c", "length"), &usage(3), DONE]);
    // Deliver it split into 7-byte reads.
    let reads = body
        .as_bytes()
        .chunks(7)
        .map(|c| String::from_utf8_lossy(c).into_owned());
    let mut s = scripted(reads.collect(), true, limits());
    let (texts, err) = drain(&mut s).await;
    assert!(err.is_none(), "{err:?}");
    assert_eq!(texts.concat(), " a b c");
    assert_eq!(
        s.output_tokens(),
        OutputTokens {
            count: 3,
            exact: true
        }
    );
    assert_eq!(s.finish_reason(), Some("length"));
    assert_eq!(s.engine_metrics().unwrap().queue_time_ms, Some(1.5));
    assert!(!s.missing_done());
    assert_eq!(s.abort_state(), AbortState::Disarmed);
    let t = s.timings();
    assert!(t.first_content_at.is_some() && t.ended_at.is_some());
}

#[tokio::test(start_paused = true)]
async fn without_usage_token_chunks_are_a_lower_bound() {
    // The empty one is a token that decodes to no text (a skipped special token).
    let body = ev(&[ROLE, &token(" a b"), &token(""), &last(" c", "stop"), DONE]);
    let mut s = scripted(vec![body], false, limits());
    assert!(drain(&mut s).await.1.is_none());
    assert_eq!(
        s.output_tokens(),
        OutputTokens {
            count: 3,
            exact: false
        }
    );
}

#[tokio::test(start_paused = true)]
async fn eof_after_finish_without_done_is_clean_but_flagged() {
    let body = ev(&[ROLE, &last(" a", "stop"), &usage(1)]);
    let mut s = scripted(vec![body], false, limits());
    assert!(drain(&mut s).await.1.is_none());
    assert!(s.missing_done());
    assert_eq!(s.abort_state(), AbortState::Disarmed);
}

/// vLLM sends an exception raised after its generation loop (building the final usage) as an
/// error event, then `[DONE]`: the answer before it is whole and ends cleanly. The same error
/// before the finish reason fails the stream.
#[tokio::test(start_paused = true)]
async fn an_error_after_the_finish_keeps_the_answer_and_one_before_fails_it() {
    let error = r#"data: {"error":{"message":"boom","type":"InternalServerError","code":500}}"#;
    let body = ev(&[ROLE, &token(" a"), &last(" b", "stop"), error, DONE]);
    let mut s = scripted(vec![body], true, limits());
    let (texts, err) = drain(&mut s).await;
    assert!(err.is_none(), "{err:?}");
    assert_eq!(texts.concat(), " a b");
    assert_eq!(s.finish_reason(), Some("stop"));
    assert_eq!(s.abort_state(), AbortState::Disarmed);
    // A broken event there too.
    let body = ev(&[ROLE, &last(" a", "stop"), "data: {not json", DONE]);
    let mut s = scripted(vec![body], true, limits());
    assert!(drain(&mut s).await.1.is_none());
    // Before the finish reason it is the engine's error.
    let body = ev(&[ROLE, &token(" a"), error, DONE]);
    let mut s = scripted(vec![body], true, limits());
    let (_, err) = drain(&mut s).await;
    assert!(matches!(err, Some(UpstreamError::Engine(_))), "{err:?}");
}

#[tokio::test(start_paused = true)]
async fn silence_after_finish_ends_cleanly_at_the_idle_timeout() {
    let body = ev(&[ROLE, &last(" a", "stop")]);
    let mut s = scripted(vec![body], true, limits());
    let started = Instant::now();
    assert!(drain(&mut s).await.1.is_none());
    assert!(s.missing_done());
    assert_eq!(started.elapsed(), limits().idle);
}

#[tokio::test(start_paused = true)]
async fn eof_before_finish_is_closed_early_and_aborts() {
    let mut s = scripted(vec![ev(&[ROLE, &token(" a")])], false, limits());
    let (texts, err) = drain(&mut s).await;
    assert_eq!(texts.len(), 2);
    assert!(matches!(err, Some(UpstreamError::ClosedEarly)), "{err:?}");
    assert_eq!(err.unwrap().to_string(), "upstream closed the stream early");
    assert!(s.abort_state().fired());
}

#[tokio::test(start_paused = true)]
async fn midstream_error_payload_is_an_engine_error() {
    let err = r#"data: {"error":{"message":"boom","type":"InternalServerError","param":null,"code":500}}"#;
    let mut s = scripted(vec![ev(&[ROLE, &token(" a"), err, DONE])], false, limits());
    let (texts, e) = drain(&mut s).await;
    assert_eq!(texts.len(), 2);
    match e {
        Some(UpstreamError::Engine(e)) => assert_eq!(e.message, "boom"),
        other => panic!("{other:?}"),
    }
    assert!(s.abort_state().fired());
}

#[tokio::test(start_paused = true)]
async fn garbage_is_a_protocol_error_after_the_good_chunks_of_the_same_read() {
    let body = ev(&[
        ROLE,
        &token(" a"),
        "data: {\"truncated\": tru",
        &last(" b", "stop"),
        DONE,
    ]);
    let mut s = scripted(vec![body], false, limits());
    let (texts, e) = drain(&mut s).await;
    assert_eq!(texts, ["", " a"]);
    assert!(matches!(e, Some(UpstreamError::Protocol(_))), "{e:?}");
    assert!(s.abort_state().fired());
}

#[tokio::test(start_paused = true)]
async fn done_before_any_finish_reason_is_a_protocol_error() {
    let mut s = scripted(vec![ev(&[ROLE, &token(" a"), DONE])], false, limits());
    assert!(matches!(
        drain(&mut s).await.1,
        Some(UpstreamError::Protocol(_))
    ));
    assert!(s.abort_state().fired());
}

#[tokio::test(start_paused = true)]
async fn oversized_event_is_a_protocol_error() {
    let huge = format!(
        "data: {}",
        "x".repeat(crate::upstream::sse::DEFAULT_MAX_EVENT_BYTES)
    );
    let mut s = scripted(vec![ev(&[ROLE]), huge], true, limits());
    let (texts, e) = drain(&mut s).await;
    assert_eq!(texts.len(), 1);
    assert!(matches!(e, Some(UpstreamError::Protocol(_))), "{e:?}");
}

#[tokio::test(start_paused = true)]
async fn role_chunk_alone_does_not_stop_the_first_token_timeout() {
    let mut s = scripted(vec![ev(&[ROLE])], true, limits());
    let started = Instant::now();
    let (texts, e) = drain(&mut s).await;
    assert_eq!(texts.len(), 1);
    assert!(
        matches!(e, Some(UpstreamError::FirstTokenTimeout(_))),
        "{e:?}"
    );
    assert_eq!(started.elapsed(), limits().first_token);
    assert!(s.timings().first_content_at.is_none());
    assert!(s.abort_state().fired());
}

#[tokio::test(start_paused = true)]
async fn stall_after_tokens_is_an_idle_timeout() {
    let mut s = scripted(vec![ev(&[ROLE, &token(" a")])], true, limits());
    let started = Instant::now();
    let (_, e) = drain(&mut s).await;
    assert!(matches!(e, Some(UpstreamError::IdleTimeout(_))), "{e:?}");
    assert_eq!(started.elapsed(), limits().idle);
}

#[tokio::test(start_paused = true)]
async fn trickling_bytes_do_not_reset_the_idle_timer() {
    let (tx, rx) = tokio::sync::mpsc::channel::<String>(4);
    let body: Body = stream::unfold(rx, |mut rx| async move {
        let r = rx.recv().await?;
        Some((Ok(Bytes::from(r)), rx))
    })
    .boxed();
    let mut config = Config::default().upstream;
    config.abort.enabled = false;
    let abort = AbortGuard::new(
        reqwest::Client::new(),
        Arc::new(config),
        "r".into(),
        TaskTracker::new(),
    );
    let now = Instant::now();
    let mut s = UpstreamStream::new(
        "r".into(),
        HeaderMap::new(),
        body,
        abort,
        limits(),
        now,
        now,
    );
    tx.send(ev(&[&token(" a")])).await.unwrap();
    assert!(s.next_event().await.unwrap().is_ok());
    let feeder = tokio::spawn(async move {
        for b in "data: {\"choices\":[]".bytes() {
            tokio::time::sleep(Duration::from_millis(30)).await;
            if tx.send((b as char).to_string()).await.is_err() {
                return;
            }
        }
    });
    let started = Instant::now();
    assert!(matches!(
        s.next_event().await,
        Some(Err(UpstreamError::IdleTimeout(_)))
    ));
    assert_eq!(started.elapsed(), limits().idle);
    feeder.abort();
}

#[tokio::test(start_paused = true)]
async fn steady_tokens_still_hit_the_total_timeout() {
    let limits = StreamLimits {
        first_token: Duration::from_secs(1),
        idle: Duration::from_secs(1),
        total: Duration::from_millis(2750),
        max_len: 16_384,
    };
    let body: Body = stream::unfold(0u32, |n| async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        Some((Ok(Bytes::from(ev(&[&token(&format!(" t{n}"))]))), n + 1))
    })
    .boxed();
    let mut config = Config::default().upstream;
    config.abort.enabled = false;
    let abort = AbortGuard::new(
        reqwest::Client::new(),
        Arc::new(config),
        "r".into(),
        TaskTracker::new(),
    );
    let now = Instant::now();
    let mut s = UpstreamStream::new("r".into(), HeaderMap::new(), body, abort, limits, now, now);
    let (texts, e) = drain(&mut s).await;
    assert!(matches!(e, Some(UpstreamError::TotalTimeout(_))), "{e:?}");
    assert_eq!(texts.len(), 5);
    assert_eq!(now.elapsed(), limits.total);
}

#[tokio::test(start_paused = true)]
async fn read_error_before_finish_is_a_transport_error() {
    let body: Body = stream::iter(vec![
        Ok(Bytes::from(ev(&[&token(" a")]))),
        Err("connection reset".to_owned()),
    ])
    .boxed();
    let mut config = Config::default().upstream;
    config.abort.enabled = false;
    let abort = AbortGuard::new(
        reqwest::Client::new(),
        Arc::new(config),
        "r".into(),
        TaskTracker::new(),
    );
    let now = Instant::now();
    let mut s = UpstreamStream::new(
        "r".into(),
        HeaderMap::new(),
        body,
        abort,
        limits(),
        now,
        now,
    );
    assert!(matches!(
        drain(&mut s).await.1,
        Some(UpstreamError::Transport(_))
    ));
}

#[tokio::test(start_paused = true)]
async fn abort_now_ends_the_stream_and_drop_fires_when_unfinished() {
    let mut s = scripted(vec![ev(&[ROLE, &token(" a")])], true, limits());
    assert!(s.next_event().await.unwrap().is_ok());
    s.abort_now();
    assert!(s.next_event().await.is_none());
    assert_eq!(s.abort_state(), AbortState::ConnectionOnly);
    assert!(s.timings().ended_at.is_some());

    let mut s = scripted(vec![ev(&[ROLE, &token(" a")])], true, limits());
    assert!(s.next_event().await.unwrap().is_ok());
    let watch = s.abort_watch();
    drop(s);
    assert!(watch.state().fired());
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_next_event_keeps_its_deadline() {
    let mut s = scripted(vec![ev(&[ROLE, &token(" a")])], true, limits());
    s.next_event().await.unwrap().unwrap();
    s.next_event().await.unwrap().unwrap();
    let started = Instant::now();
    // Poll in slices shorter than the idle timeout, as a select! beside a disconnect would.
    loop {
        match tokio::time::timeout(Duration::from_millis(30), s.next_event()).await {
            Err(_) => continue,
            Ok(r) => {
                assert!(matches!(r, Some(Err(UpstreamError::IdleTimeout(_)))));
                break;
            }
        }
    }
    assert_eq!(started.elapsed(), Duration::from_millis(100));
}

/// After the finish reason vLLM sends the usage chunk and `[DONE]`, nothing else: an engine
/// that goes on sending (text, or a second usage chunk) does not extend the answer, whose
/// guards were given back at the finish; the stream ends cleanly there.
#[tokio::test(start_paused = true)]
async fn nothing_after_the_finish_reason_but_the_usage_chunk() {
    let more: Vec<String> = (0..500).map(|_| token(" more")).collect();
    for after in [vec![], vec![usage(1)]] {
        let mut lines: Vec<String> = vec![ROLE.into(), last(" a", "stop")];
        lines.extend(after.iter().cloned());
        lines.extend(more.iter().cloned());
        lines.push(usage(501));
        let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
        let mut s = scripted(vec![ev(&refs)], true, limits());
        let (texts, err) = drain(&mut s).await;
        assert!(err.is_none(), "{err:?}");
        assert_eq!(texts.concat(), " a", "after {after:?}");
        assert_eq!(s.output_tokens().count, 1);
        assert_eq!(s.finish_reason(), Some("stop"));
    }
}

/// A usage the engine could not have counted (more than the model holds, a negative or
/// fractional count) is not believed and breaks nothing: the answer ends as it finished, its
/// output counted from the chunks; no tenant is billed four billion tokens for it.
#[tokio::test(start_paused = true)]
async fn a_usage_no_engine_could_count_is_not_believed() {
    let absurd = r#"data: {"choices":[],"usage":{"prompt_tokens":4000000000,"completion_tokens":2,"total_tokens":4000000002}}"#;
    let negative = r#"data: {"choices":[],"usage":{"prompt_tokens":-5,"completion_tokens":2.5}}"#;
    let fewer = r#"data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":0,"total_tokens":9}}"#;
    for (final_usage, count) in [(absurd, 2), (negative, 2), (fewer, 2)] {
        let body = ev(&[ROLE, &token(" a"), &last(" b", "stop"), final_usage, DONE]);
        let mut s = scripted(vec![body], false, limits());
        let (texts, err) = drain(&mut s).await;
        assert!(err.is_none(), "{final_usage}: {err:?}");
        assert_eq!(texts.concat(), " a b");
        let believed = s.usage().is_some();
        assert_eq!(believed, final_usage == fewer, "{final_usage}");
        assert_eq!(s.output_tokens().count, count, "{final_usage}");
    }
}

/// vLLM's first chunk carries the prompt's ids with `return_token_ids`: at a 262,144-token
/// context a 200,000-token prompt's are about 1.4 MB in one event, which a fixed 1 MiB cap
/// refused as a protocol error after the whole prefill. The cap follows the context.
#[tokio::test(start_paused = true)]
async fn a_first_chunk_with_a_long_prompts_ids_is_read_at_a_long_context() {
    let ids: Vec<String> = (0..200_000).map(|i| (100_000 + i).to_string()).collect();
    let first = format!(
        r#"data: {{"choices":[{{"index":0,"delta":{{"role":"assistant","content":""}},"finish_reason":null}}],"prompt_token_ids":[{}]}}"#,
        ids.join(",")
    );
    assert!(first.len() > 1 << 20, "{} bytes", first.len());
    let reads = || vec![ev(&[&first, &last("hi", "stop"), DONE])];
    let long = StreamLimits {
        max_len: 262_144,
        ..limits()
    };
    let (texts, err) = drain(&mut scripted(reads(), false, long)).await;
    assert!(err.is_none(), "{err:?}");
    assert_eq!(texts.concat(), "hi");
    // At a 16,384-token context no prompt has that many ids: such an event is still refused.
    let (_, err) = drain(&mut scripted(reads(), false, limits())).await;
    assert!(err.is_some());
}
