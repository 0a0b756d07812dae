//! Media URLs in messages. vLLM fetches an `image_url`, `video_url` or `audio_url` itself (and
//! reads `file://` URLs from its own disk when allowed), so a URL naming loopback, a link-local
//! metadata service or the cluster's own services would make the engine a proxy into the
//! network it runs in. A media URL must be a `data:` URL, or an `http`/`https` URL whose host is
//! on `fields.media_hosts` (compared as the URL parser normalizes it: lower case, IPv4 in
//! dotted decimal, so `0x7f.1` is `127.0.0.1`) on its scheme's own port, or on a port listed
//! with it (`media.example.edu:8443`); else 400 naming `messages`. No DNS is asked:
//! the list names hosts, and the operator who lists a host vouches for where it resolves.
//!
//! What is refused outright, so that no other URL parser can read it differently: user
//! information (`user@host`), backslashes, whitespace and control characters anywhere.

use serde_json::Value;

use crate::error::GatewayError;

/// The keys of a content part that carry a URL vLLM fetches (as a string, or an object's
/// `url`), and the part kinds that could (`file`'s `file_url`).
const MEDIA_KEYS: &[&str] = &[
    "image_url",
    "video_url",
    "audio_url",
    "input_image",
    "file",
    "input_audio",
];

/// Fields of a media object that hold a URL.
const URL_FIELDS: &[&str] = &["url", "file_url", "image_url"];

/// Checks every media URL in `messages` (a chat body's `messages`, as sent) against `hosts`.
pub fn check(messages: Option<&Value>, hosts: &[String]) -> Result<(), GatewayError> {
    let Some(Value::Array(messages)) = messages else {
        return Ok(());
    };
    for (i, message) in messages.iter().enumerate() {
        let Some(Value::Array(parts)) = message.get("content") else {
            continue;
        };
        for (j, part) in parts.iter().enumerate() {
            let Value::Object(part) = part else {
                continue;
            };
            for key in MEDIA_KEYS {
                for url in urls(part.get(*key)) {
                    if let Err(why) = allowed(url, hosts) {
                        return Err(GatewayError::bad_request(
                            format!("messages[{i}].content[{j}].{key}: {why}"),
                            Some("messages"),
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

/// The URLs in one media value: itself when a string, its URL fields when an object.
fn urls(v: Option<&Value>) -> Vec<&str> {
    match v {
        Some(Value::String(s)) => vec![s.as_str()],
        Some(Value::Object(o)) => URL_FIELDS
            .iter()
            .filter_map(|f| o.get(*f).and_then(Value::as_str))
            .collect(),
        _ => Vec::new(),
    }
}

/// Whether vLLM may fetch `url`: `Err` with the reason when not.
pub fn allowed(url: &str, hosts: &[String]) -> Result<(), String> {
    const LIST: &str = "media URLs must be data: URLs or name a host on this gateway's \
                        allow-list (fields.media_hosts)";
    if url
        .chars()
        .any(|c| c.is_control() || c.is_whitespace() || c == '\\')
    {
        return Err(format!(
            "the URL holds whitespace, control characters or a backslash; {LIST}"
        ));
    }
    let scheme_end = url.find(':').unwrap_or(0);
    if url[..scheme_end].eq_ignore_ascii_case("data") {
        return Ok(());
    }
    let Ok(parsed) = url::Url::parse(url) else {
        return Err(format!("not a URL; {LIST}"));
    };
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!(
            "the {} scheme is not fetched; {LIST}",
            parsed.scheme()
        ));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(format!("URLs with user information are refused; {LIST}"));
    }
    // A listed host alone allows its scheme's own port (80 for http, 443 for https: the URL
    // parser leaves `port()` empty there); an entry with a port allows that port, whatever the
    // scheme. So a listed host's other services (an admin port, a Redis) are not the engine's
    // to reach.
    let allowed = parsed.host_str().is_some_and(|host| {
        let on_port = parsed
            .port_or_known_default()
            .is_some_and(|port| hosts.iter().any(|h| *h == format!("{host}:{port}")));
        on_port || (parsed.port().is_none() && hosts.iter().any(|h| h == host))
    });
    if allowed {
        Ok(())
    } else {
        // The host is not echoed: it may be long, or name an internal service.
        Err(format!("the URL's host and port are not allowed; {LIST}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn hosts() -> Vec<String> {
        vec![
            "media.example.edu".into(),
            "10.1.2.3".into(),
            "media.example.edu:8443".into(),
            "plain.example.edu:443".into(),
        ]
    }

    #[test]
    fn only_data_urls_and_listed_hosts_are_fetched() {
        for ok in [
            "data:image/png;base64,iVBORw0KGgo=",
            "DATA:image/png;base64,AAAA",
            "https://media.example.edu/cat.png",
            "http://MEDIA.example.edu/cat.png",
            "http://media.example.edu:80/cat.png",
            "https://media.example.edu:443/cat.png",
            "https://media.example.edu:8443/cat.png",
            // Listed with 443: https on its own port, and http on 443.
            "https://plain.example.edu/x.png",
            "http://plain.example.edu:443/x.png",
            "http://10.1.2.3/x.wav",
        ] {
            assert_eq!(allowed(ok, &hosts()), Ok(()), "{ok}");
        }
        for bad in [
            "http://127.0.0.1/x.png",
            "http://169.254.169.254/latest/meta-data/",
            "http://[::1]/x",
            "http://0x7f.1/x",
            "http://2130706433/x",
            "http://localhost:8000/metrics",
            "file:///etc/passwd",
            "ftp://media.example.edu/x",
            "https://media.example.edu@127.0.0.1/x",
            "https://user@media.example.edu/x",
            "https://127.0.0.1\\@media.example.edu/x",
            " https://127.0.0.1/x",
            "https://media.example.edu.evil.test/x",
            // A listed host's other ports: only those listed with it.
            "http://media.example.edu:8080/cat.png",
            "https://media.example.edu:80/x",
            "http://10.1.2.3:6379/",
            "http://plain.example.edu/x.png",
            "not a url",
            "",
        ] {
            assert!(allowed(bad, &hosts()).is_err(), "{bad}");
        }
        assert!(allowed("https://media.example.edu/x", &[]).is_err());
    }

    #[test]
    fn every_media_part_of_every_message_is_checked() {
        let no = |messages: Value| check(Some(&messages), &hosts()).is_err();
        let image = |url: &str| {
            json!([{"role": "user", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": url}}]}])
        };
        assert!(no(image("http://169.254.169.254/")));
        assert!(!no(image("data:image/png;base64,AAAA")));
        assert!(no(json!([{"role": "user", "content": [
            {"type": "video_url", "video_url": "http://127.0.0.1/v.mp4"}]}])));
        assert!(no(
            json!([{"role": "system", "content": "hi"}, {"role": "user", "content": [
            {"type": "audio_url", "audio_url": {"url": "http://127.0.0.1/a.wav"}}]}])
        ));
        assert!(no(json!([{"role": "user", "content": [
            {"type": "file", "file": {"file_url": "http://127.0.0.1/a.pdf"}}]}])));
        assert!(!no(json!([{"role": "user", "content": [
            {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]}])));
        assert!(!no(
            json!([{"role": "user", "content": "http://127.0.0.1/ in text is text"}])
        ));
    }
}
