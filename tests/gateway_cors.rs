//! Browsers (issue 17, CORS): an allowed origin's preflight and requests get the CORS headers;
//! any other origin is refused before it reaches a lane; a cross-origin POST must be JSON;
//! requests without an Origin (SDKs, curl) are untouched, but for another site's iframes and
//! images (Fetch Metadata); an Origin naming the gateway's own host is judged by the list like
//! any other.

mod common;

use common::*;
use serde_json::json;

const FAST: &[&str] = &["--speed", "50", "--profile", "tiny-test"];
const FRONTEND: &str = "https://tutor.example.edu";
const ELSEWHERE: &str = "https://evil.example.com";

async fn gateway() -> Harness {
    harness(FAST, |c| {
        c.server.cors_allow_origins = vec![FRONTEND.to_owned()];
    })
    .await
}

fn header(resp: &reqwest::Response, name: &str) -> Option<String> {
    resp.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
}

#[tokio::test]
async fn an_allowed_origin_gets_its_preflight_and_reads_the_stream() {
    let h = gateway().await;
    let pre = send(
        client()
            .request(reqwest::Method::OPTIONS, h.url("/answer"))
            .header("origin", FRONTEND)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "content-type, last-event-id",
            ),
    )
    .await;
    assert_eq!(pre.status(), 204);
    assert_eq!(
        header(&pre, "access-control-allow-origin").as_deref(),
        Some(FRONTEND)
    );
    assert!(header(&pre, "access-control-allow-methods")
        .unwrap()
        .contains("POST"));
    let allowed = header(&pre, "access-control-allow-headers").unwrap();
    assert!(allowed.contains("content-type") && allowed.contains("last-event-id"));
    assert!(
        allowed.contains("x-tutor-deadline-ms"),
        "a browser may state a deadline: {allowed}"
    );
    assert!(
        allowed.contains("x-tutor-preemptible"),
        "a browser may mark its question pre-emptible: {allowed}"
    );
    assert_eq!(
        header(&pre, "access-control-max-age").as_deref(),
        Some("600")
    );
    // An EventSource on the frontend's page: a cross-origin GET with its Origin.
    let resp = send(
        client()
            .get(h.url("/answer"))
            .query(&[("prompt", "what is a closure?"), ("max_output_tokens", "4")])
            .header("origin", FRONTEND),
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        header(&resp, "access-control-allow-origin").as_deref(),
        Some(FRONTEND)
    );
    assert!(header(&resp, "access-control-expose-headers")
        .unwrap()
        .contains("x-request-id"));
    assert_eq!(header(&resp, "vary").as_deref(), Some("origin"));
    let events = sse(&resp.text().await.unwrap());
    assert_eq!(events.last().unwrap().0, "done");
    h.shutdown().await;
}

#[tokio::test]
async fn another_origin_is_refused_before_it_spends_anything() {
    let h = gateway().await;
    let pre = send(
        client()
            .request(reqwest::Method::OPTIONS, h.url("/answer"))
            .header("origin", ELSEWHERE)
            .header("access-control-request-method", "POST"),
    )
    .await;
    assert_eq!(pre.status(), 403);
    assert!(header(&pre, "access-control-allow-origin").is_none());
    // A drive-by GET and a "simple" text/plain POST from a foreign page.
    let get = send(
        client()
            .get(h.url("/answer"))
            .query(&[("prompt", "spend your GPU")])
            .header("origin", ELSEWHERE),
    )
    .await;
    assert_error(get, 403, "origin_not_allowed").await;
    let post = send(
        client()
            .post(h.url("/answer"))
            .header("origin", ELSEWHERE)
            .header("content-type", "text/plain")
            .body(r#"{"prompt": "spend your GPU"}"#),
    )
    .await;
    assert_eq!(post.status(), 403);
    let m = h.metrics_text().await;
    assert_eq!(
        family_total(&m, "tutor_gateway_requests_total"),
        0.0,
        "nothing reached a lane"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn a_cross_origin_post_must_be_json_and_other_callers_are_untouched() {
    let h = gateway().await;
    let body = r#"{"prompt": "what is a closure?", "max_output_tokens": 3}"#;
    let plain = send(
        client()
            .post(h.url("/answer"))
            .header("origin", FRONTEND)
            .header("content-type", "text/plain;charset=UTF-8")
            .body(body),
    )
    .await;
    assert_eq!(plain.status(), 415);
    assert_eq!(
        header(&plain, "access-control-allow-origin").as_deref(),
        Some(FRONTEND),
        "the page can read why"
    );
    assert_eq!(
        read_json(plain).await["error"]["code"],
        "unsupported_media_type"
    );
    let as_json = send(
        client()
            .post(h.url("/answer"))
            .header("origin", FRONTEND)
            .json(&json!({"prompt": "what is a closure?", "max_output_tokens": 3})),
    )
    .await;
    assert_eq!(as_json.status(), 200);
    // No Origin (an SDK, curl): as before, whatever the content type.
    let sdk = send(
        client()
            .post(h.url("/answer"))
            .header("content-type", "text/plain")
            .body(body),
    )
    .await;
    assert_eq!(sdk.status(), 200);
    assert!(header(&sdk, "access-control-allow-origin").is_none());
    // The gateway's own host is not trusted for naming itself (a rebound DNS name would):
    // only the list decides.
    let own = format!("http://{}", h.gw.addr);
    let same = send(client().get(h.url("/healthz")).header("origin", own)).await;
    assert_eq!(same.status(), 403);
    h.shutdown().await;
}

/// Browsers send no `Origin` on the GETs of an `<iframe>`, `<img>` or `no-cors` fetch: another
/// site's page could make its visitors ask `/answer` for it. Fetch Metadata says where such a
/// request comes from: another site's is refused before it spends anything, unless it is a tab
/// following a link; SDKs (no `Sec-Fetch-*`) and the gateway's own pages go on. Every answer
/// says it varies by origin and must not be sniffed; streams and tokens are never stored.
#[tokio::test]
async fn another_sites_iframe_cannot_spend_gpu_time_without_an_origin() {
    let h = gateway().await;
    let ask = |site: Option<&str>, mode: &str, dest: &str| {
        let mut req = client().get(h.url("/answer?prompt=why&max_output_tokens=3"));
        if let Some(site) = site {
            req = req
                .header("sec-fetch-site", site)
                .header("sec-fetch-mode", mode)
                .header("sec-fetch-dest", dest);
        }
        send(req)
    };
    for (site, mode, dest) in [
        ("cross-site", "navigate", "iframe"),
        ("cross-site", "no-cors", "image"),
        ("same-site", "no-cors", "empty"),
    ] {
        let resp = ask(Some(site), mode, dest).await;
        assert_eq!(resp.status(), 403, "{site} {dest}");
        assert_eq!(header(&resp, "vary").as_deref(), Some("origin"));
        let v = read_json(resp).await;
        assert_eq!(v["error"]["code"], "origin_not_allowed", "{v}");
    }
    assert!(h.sim_requests().await.is_empty(), "the engine saw nothing");
    // A link followed in a tab, the gateway's own page, an SDK: served.
    for (site, mode, dest) in [
        (Some("cross-site"), "navigate", "document"),
        (Some("same-origin"), "cors", "empty"),
        (Some("none"), "navigate", "document"),
        (None, "", ""),
    ] {
        let resp = ask(site, mode, dest).await;
        assert_eq!(resp.status(), 200, "{site:?} {dest}");
        assert_eq!(header(&resp, "vary").as_deref(), Some("origin"));
        assert_eq!(
            header(&resp, "x-content-type-options").as_deref(),
            Some("nosniff")
        );
        assert_eq!(header(&resp, "cache-control").as_deref(), Some("no-store"));
        let _ = resp.text().await;
    }
    h.shutdown().await;
}
