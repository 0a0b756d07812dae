//! Entry points for the fuzz targets (`fuzz/`, cargo-fuzz) and for the replay of their corpus
//! on the stable toolchain (`tests/fuzz_corpus.rs`). Each runs one parser the gateway exposes to
//! the outside on arbitrary bytes and panics when the outcome is not one the operations guide
//! documents: no panic inside, and every bad input a 400 with a message.

use axum::extract::Query;
use axum::http::{StatusCode, Uri};

use crate::classify::PromptInput;
use crate::config::{FieldsConfig, UnknownFields};
use crate::error::GatewayError;
use crate::pipeline::parse::{self, AnswerQuery, AnswerRequest, FieldRules};
use crate::upstream::{parse_payload, UpstreamError};
use tutor_wire::sse::SseParser;

/// A bad request must be a 400 with a message of bounded size (no input echoed in full).
fn documented(e: &GatewayError) {
    assert_eq!(e.status(), StatusCode::BAD_REQUEST, "{e}");
    let message = e.message();
    assert!(!message.is_empty());
    assert!(
        message.len() <= 4096,
        "an error message of {} bytes",
        message.len()
    );
}

/// `GET /answer?{data}`.
pub fn answer_query(data: &[u8]) {
    let Ok(query) = std::str::from_utf8(data) else {
        return;
    };
    // What the HTTP server would never hand over is not the parser's concern.
    let Ok(uri) = format!("/answer?{query}").parse::<Uri>() else {
        return;
    };
    match Query::<AnswerQuery>::try_from_uri(&uri) {
        Err(e) => documented(&GatewayError::from(e)),
        Ok(Query(q)) => {
            if let Err(e) = AnswerRequest::from_query(q) {
                documented(&e);
            }
        }
    }
}

/// The role configured besides vLLM's in the fuzz targets (`classify.extra_roles`).
const EXTRA_ROLE: &str = "tutor";

/// The one host media URLs may name in the fuzz targets (`fields.media_hosts`).
const MEDIA_HOST: &str = "media.example";

/// `POST /answer` with `data` as the body, its messages then checked as the prompt step does
/// before counting: their media URLs (`data:` or [`MEDIA_HOST`]), then as the template renders
/// them.
pub fn answer_body(data: &[u8]) {
    match AnswerRequest::from_body(data) {
        Err(e) => documented(&e),
        Ok(req) => {
            let checked = parse::media::check(Some(&req.messages_json), &[MEDIA_HOST.to_owned()])
                .and_then(|()| {
                    parse::template::chat_messages(&req.messages_json, &[EXTRA_ROLE.to_owned()])
                        .map(drop)
                });
            if let Err(e) = checked {
                documented(&e);
            }
        }
    }
}

/// Every role of an accepted chat request is vLLM's or the configured one.
fn roles_accepted(input: &PromptInput) {
    if let PromptInput::Chat { messages, .. } = input {
        for m in messages {
            assert!(
                parse::template::VLLM_ROLES.contains(&m.role.as_str()) || m.role == EXTRA_ROLE,
                "a role no rule accepts went through"
            );
        }
    }
}

/// The shipped `[fields]` bounds, with media URLs on [`MEDIA_HOST`] allowed besides `data:`.
static BOUNDS: std::sync::LazyLock<FieldsConfig> = std::sync::LazyLock::new(|| FieldsConfig {
    media_hosts: vec![MEDIA_HOST.to_owned()],
    ..FieldsConfig::default()
});

/// `POST /v1/chat/completions`, `POST /v1/completions` and `POST /tokenize` with `data` as the
/// body, under both settings of `server.unknown_fields` (one role configured besides vLLM's).
/// Whatever is accepted has only accepted roles and is forwarded with the numbers and booleans
/// the gateway judged as vLLM reads them (a plain integer or boolean).
pub fn openai_body(data: &[u8]) {
    let extra_roles = [EXTRA_ROLE.to_owned()];
    for unknown in [UnknownFields::Forward, UnknownFields::Reject] {
        let rules = FieldRules {
            unknown,
            max_logprobs: 5,
            extra_roles: &extra_roles,
            bounds: &BOUNDS,
            max_model_len: 16_384,
        };
        for parsed in [parse::chat(data, rules), parse::completion(data, rules)] {
            match parsed {
                Ok(req) => {
                    roles_accepted(&req.input);
                    forwarded_as_judged(&req.body);
                }
                Err(e) => documented(&e),
            }
        }
        match parse::tokenize(data, rules) {
            Ok(body) => forwarded_as_judged(&body),
            Err(e) => documented(&e),
        }
    }
}

/// No `priority`, and the judged numbers and booleans go out plain.
fn forwarded_as_judged(body: &serde_json::Map<String, serde_json::Value>) {
    assert!(!body.contains_key("priority"));
    for field in ["best_of", "min_tokens", "top_logprobs", "prompt_logprobs"] {
        let v = body.get(field).unwrap_or(&serde_json::Value::Null);
        assert!(v.is_null() || v.is_i64(), "{field} forwarded as {v}");
    }
    for field in ["use_beam_search", "echo", "stream"] {
        let v = body.get(field).unwrap_or(&serde_json::Value::Null);
        assert!(v.is_null() || v.is_boolean(), "{field} forwarded as {v}");
    }
}

/// The webhook destinations allowed in [`request_fields`].
const NOTIFY_ALLOW: [&str; 2] = [
    "https://hooks.example.edu/tutor/*",
    "https://*.school.example:8443/results",
];

/// What clients send besides a body: `x-tutor-deadline-ms`, a job's `Last-Event-ID`, a job's
/// `notify` URL, the `Host` header and the `Authorization` header, each `data` as text. Accepted, each is within its documented bounds (a
/// deadline of 1 ms to an hour; a run of 1 to 1,000 and a piece to 1,000,000; a URL on an
/// allowed host, path and port, with no user information and nothing encoded that a receiver
/// could decode out of the allowed path); refused, a documented 400.
pub fn request_fields(data: &[u8]) {
    use crate::jobs::{events, webhook};
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(value) = axum::http::HeaderValue::from_str(text) {
        let mut headers = axum::http::HeaderMap::new();
        headers.insert("x-tutor-deadline-ms", value);
        match crate::pipeline::prompt::deadline_from(&headers) {
            Ok(Some(d)) => {
                let max = crate::pipeline::prompt::MAX_DEADLINE_MS;
                assert!((1..=max).contains(&(d.as_millis() as u64)), "{d:?}");
            }
            Ok(None) => panic!("a deadline header read as none"),
            Err(e) => documented(&e),
        }
    }
    if let Some((run, piece)) = events::parse_piece_id(text) {
        assert!((1..=events::MAX_RUN).contains(&run) && piece <= events::MAX_PIECE_ID);
        assert!(
            text.bytes().all(|b| b.is_ascii_digit() || b == b'.'),
            "{text:?}"
        );
    }
    let allow: Vec<_> = NOTIFY_ALLOW
        .iter()
        .map(|p| crate::config::WebhookPattern::parse(p).expect("a valid pattern"))
        .collect();
    match webhook::check_notify(&serde_json::Value::String(text.to_owned()), &allow) {
        Ok(url) => {
            assert!(
                url.username().is_empty() && url.password().is_none(),
                "{url}"
            );
            assert_eq!(url.scheme(), "https", "{url}");
            let host = url.host_str().unwrap_or_default().to_ascii_lowercase();
            let path = url.path().to_ascii_lowercase();
            assert!(
                !["%2f", "%5c", "%2e", "%25", ";"]
                    .iter()
                    .any(|e| path.contains(e)),
                "{url}"
            );
            let on_hooks = host == "hooks.example.edu"
                && url.port_or_known_default() == Some(443)
                && path.starts_with("/tutor/");
            let on_school = host.ends_with(".school.example")
                && url.port_or_known_default() == Some(8443)
                && path == "/results";
            assert!(on_hooks || on_school, "{url} is on no allowed destination");
        }
        Err(e) => documented(&e),
    }
    host(text);
    bearer(text);
}

/// `data` as a `Host` header: answered on a loopback listener only for `localhost`, a name
/// under `.localhost` or an address; with names listed, only for those names or an address.
fn host(text: &str) {
    use crate::api::hosts::Hosts;
    let loopback = Hosts::new(&[], ([127, 0, 0, 1], 8080).into());
    let listed = [
        "tutor.example.edu".to_owned(),
        "*.school.example".to_owned(),
    ];
    let listed = Hosts::new(&listed, ([0, 0, 0, 0], 8080).into());
    let (on_loopback, on_listed) = (loopback.allows(text), listed.allows(text));
    if !(on_loopback || on_listed) {
        return;
    }
    // The name as the check should have read it: trimmed, without a port of at most five
    // digits, its brackets or a final dot, in lower case.
    let t = text.trim().to_ascii_lowercase();
    let name = match t.strip_prefix('[') {
        Some(rest) => rest.split_once(']').map_or("", |(inside, _)| inside),
        None => t.rsplit_once(':').map_or(t.as_str(), |(n, _)| n),
    };
    let name = name.strip_suffix('.').unwrap_or(name);
    assert!(
        !name.is_empty() && !name.contains(['@', '/', '\\', '%', '?', '#', ' ', '\t']),
        "{text:?} answered"
    );
    let address = name.parse::<std::net::IpAddr>().is_ok();
    let under = |suffix: &str| {
        name.strip_suffix(suffix)
            .is_some_and(|head| head.len() > 1 && head.ends_with('.'))
    };
    if on_loopback {
        assert!(
            address || name == "localhost" || under("localhost"),
            "{text:?} answered on a loopback listener"
        );
    }
    if on_listed {
        assert!(
            address || name == "tutor.example.edu" || under("school.example"),
            "{text:?} answered for names it does not list"
        );
    }
}

/// `data` as an `Authorization` header: read as a key only in the form `Bearer <key>`
/// (the scheme in any case), the key without its surrounding blanks; otherwise a short reason.
fn bearer(text: &str) {
    let Ok(value) = axum::http::HeaderValue::from_str(text) else {
        return;
    };
    let mut headers = axum::http::HeaderMap::new();
    headers.insert(axum::http::header::AUTHORIZATION, value);
    match crate::api::auth::bearer(&headers) {
        Ok(Some(key)) => {
            let t = text.trim();
            assert!(
                !key.is_empty() && key == key.trim(),
                "{text:?} gave {key:?}"
            );
            assert!(
                t.get(..7)
                    .is_some_and(|s| s.eq_ignore_ascii_case("bearer "))
                    && t.ends_with(key),
                "{text:?} read as a bearer key"
            );
        }
        Ok(None) => panic!("an Authorization header read as none"),
        Err(reason) => assert!(!reason.is_empty() && reason.len() <= 200),
    }
}

/// vLLM's stream: `data` fed whole and fed in pieces (cut where the first byte says) gives the
/// same events; every payload is a chunk, `[DONE]`, an engine error or a protocol error.
pub fn upstream_sse(data: &[u8]) {
    let whole = events(data, &[data.len()]);
    let step = usize::from(data.first().copied().unwrap_or(1)).max(1);
    let cuts: Vec<usize> = (step..data.len()).step_by(step).collect();
    assert_eq!(whole, events(data, &cuts), "split reads change the events");
    for payload in whole.into_iter().flatten() {
        match parse_payload(payload.into()) {
            Ok(_) | Err(UpstreamError::Protocol(_)) => {}
            Err(other) => panic!("an SSE payload gave {other:?}"),
        }
    }
}

/// The payloads of `data` fed in reads ending at `cuts`; `None` once the parser failed.
fn events(data: &[u8], cuts: &[usize]) -> Vec<Option<Vec<u8>>> {
    let mut parser = SseParser::default();
    let mut out = Vec::new();
    let mut start = 0;
    for &end in cuts.iter().chain(std::iter::once(&data.len())) {
        let end = end.min(data.len());
        if end < start {
            continue;
        }
        let fed = parser.feed(&data[start..end]);
        while let Some(p) = parser.pop() {
            out.push(Some(p.to_vec()));
        }
        if fed.is_err() {
            out.push(None);
            return out;
        }
        start = end;
    }
    out
}

/// Focusing (the one place the gateway parses a client's text with native code, tree-sitter):
/// `data` is `<path>\n<trace>\0<code>`. It returns, with a documented outcome; a focused
/// selection is text smaller than the code, and anything else sends the code whole.
pub fn focus_code(data: &[u8]) {
    use crate::prompt::focus::{self, FocusSettings, Outcome, SourceFile};
    let (head, code) = match data.iter().position(|b| *b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let head = String::from_utf8_lossy(head);
    let (path, trace) = head.split_once('\n').unwrap_or((&head, ""));
    let files = [SourceFile {
        path: Some(path.to_owned()),
        code: String::from_utf8_lossy(code).into_owned(),
    }];
    let settings = FocusSettings {
        timeout: std::time::Duration::from_secs(2),
        ..FocusSettings::default()
    };
    let count = |t: &str| crate::classify::TokenCounter::Heuristic.count_text(t);
    let f = focus::focus(&files, None, Some(trace), None, &settings, &count);
    match f.outcome {
        Outcome::Focused => {
            assert!(f.sent_tokens < f.original_tokens, "{:?}", f.meta());
            let text = f.text.expect("a focused selection has text");
            assert!(!text.is_empty());
        }
        _ => assert!(f.text.is_none(), "{:?} with text", f.outcome),
    }
}
