//! `GET /demo`: a one-file page for trying the gateway in a browser (`web/demo.html`, built into
//! the binary), served only while `server.demo = true` (404 otherwise; read at each request, so
//! a reload turns it on or off).
//!
//! The page is on the public listener, so it is served as a page that can do nothing but what
//! it says: a Content-Security-Policy that allows its one inline script and its one inline style
//! by their SHA-256 (computed here from the file, so they cannot drift) and nothing else but
//! `fetch` to its own origin (`/answer`); no framing, no forms to elsewhere, no plugins;
//! `X-Content-Type-Options: nosniff` and `Referrer-Policy: no-referrer`. The page shows what it
//! receives with `textContent` only. It needs no key (it holds no data; see
//! [`super::auth`]'s open routes); the `/answer` calls it makes go through auth and CORS like any.

use std::sync::LazyLock;

use axum::extract::State;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use crate::pipeline::AppState;

/// The page.
pub const PAGE: &str = include_str!("../../web/demo.html");

/// The page's Content-Security-Policy.
static CSP: LazyLock<String> = LazyLock::new(|| csp(PAGE));

/// `GET /demo`.
pub async fn page(State(state): State<AppState>) -> Response {
    if !state.config().server.demo {
        // As any path the gateway does not serve: the OpenAI-shaped 404.
        return crate::error::GatewayError::NotFound.into_response();
    }
    let mut resp = ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], PAGE).into_response();
    let h = resp.headers_mut();
    if let Ok(csp) = HeaderValue::from_str(&CSP) {
        h.insert(header::CONTENT_SECURITY_POLICY, csp);
    }
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

/// The policy for `page`: its inline `<script>` and `<style>` blocks allowed by hash.
pub fn csp(page: &str) -> String {
    let hashes = |tag: &str| -> String {
        inline_blocks(page, tag)
            .map(|body| format!(" 'sha256-{}'", base64(&Sha256::digest(body.as_bytes()))))
            .collect()
    };
    format!(
        "default-src 'none'; script-src{}; style-src{}; connect-src 'self'; img-src 'self'; \
         base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        hashes("script"),
        hashes("style"),
    )
}

/// The text inside each `<tag>…</tag>` of `page` (the page's own tags carry no attributes).
fn inline_blocks<'a>(page: &'a str, tag: &str) -> impl Iterator<Item = &'a str> + 'a {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    let mut rest = page;
    std::iter::from_fn(move || {
        let start = rest.find(&open)? + open.len();
        let len = rest[start..].find(&close)?;
        let body = &rest[start..start + len];
        rest = &rest[start + len + close.len()..];
        Some(body)
    })
}

/// Standard base64 with padding, as CSP hashes are written.
fn base64(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(DIGITS[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_is_the_standard_alphabet_with_padding() {
        // RFC 4648's test vectors.
        for (plain, coded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(plain.as_bytes()), coded);
        }
    }

    #[test]
    fn the_policy_names_the_pages_one_script_and_one_style_and_nothing_else() {
        let policy = csp(PAGE);
        let scripts: Vec<&str> = inline_blocks(PAGE, "script").collect();
        let styles: Vec<&str> = inline_blocks(PAGE, "style").collect();
        assert_eq!((scripts.len(), styles.len()), (1, 1), "{policy}");
        assert!(policy.starts_with("default-src 'none'; script-src 'sha256-"));
        assert!(!policy.contains("unsafe"), "{policy}");
        // The page loads nothing from elsewhere, sets no inline handler or style attribute
        // (a hash cannot allow them), and never parses text as HTML.
        for banned in [
            "http://",
            "https://",
            " src=",
            "style=",
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
        ] {
            assert!(!PAGE.contains(banned), "web/demo.html contains {banned:?}");
        }
        assert!(
            !has_inline_handler(PAGE),
            "web/demo.html has an on… attribute"
        );
    }

    /// An attribute like ` onclick=` in a tag of the markup (before the script).
    fn has_inline_handler(page: &str) -> bool {
        let markup = page.split("<script>").next().unwrap_or_default();
        markup.split('<').skip(1).any(|tag| {
            let tag = tag.split('>').next().unwrap_or_default();
            tag.split_whitespace()
                .skip(1)
                .any(|attr| attr.to_ascii_lowercase().starts_with("on") && attr.contains('='))
        })
    }
}
