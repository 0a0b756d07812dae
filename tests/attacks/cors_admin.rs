//! Attack 8: browsers cannot be borrowed. A DNS-rebound page (`Host: evil.example` and a
//! matching `Origin`) was served because CORS trusted the Host header; a foreign page's
//! `text/plain` POST to `/admin/reload` was applied. CORS now decides on the Origin and the
//! configured list only; the admin listener refuses any request with an Origin and any
//! non-JSON POST, and asks for `server.admin_token` when one is set. A rebound page's GETs
//! carry no Origin at all: its Host decides (`server.allowed_hosts`; a loopback listener
//! answers to loopback names only).
//!
//! Also (the gateway calling out): a webhook name on the allow-list that resolves to a loopback
//! or link-local address gets nothing unless `jobs.webhook_allow_private`; a double-encoded
//! path (`%252e%252e`) or a path parameter (`..;`) in a `notify` URL is refused.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tutor_gateway::config::{Config, WebhookPattern};

use crate::common::*;

const FAST: &[&str] = &["--speed", "50", "--profile", "tiny-test"];
const FRONTEND: &str = "https://tutor.example.edu";
const ADMIN_TOKEN: &str = "an-admin-token-of-32-bytes-long!";

/// The shipped config with the TOML `text` on top (keys this module sets by name).
fn parsed(text: &str) -> Config {
    Config::from_toml_str(&format!("[classify]\ntokenizer = \"heuristic\"\n{text}"))
        .expect("the keys are known")
}

#[tokio::test]
async fn a_rebound_host_with_its_own_origin_is_refused() {
    let h = harness(FAST, |c| {
        c.server.cors_allow_origins = vec![FRONTEND.to_owned()];
        // Any Host answered: the Origin alone must refuse it (the Host is the next test's).
        c.server.allowed_hosts = vec!["*".to_owned()];
    })
    .await;
    let get = send(
        client()
            .get(h.url("/answer"))
            .query(&[("prompt", "what is a closure?"), ("max_output_tokens", "2")])
            .header("host", "evil.example")
            .header("origin", "http://evil.example"),
    )
    .await;
    assert_error(get, 403, "origin_not_allowed").await;
    let post = send(
        client()
            .post(h.url("/v1/chat/completions"))
            .header("host", "evil.example:8080")
            .header("origin", "http://evil.example:8080")
            .json(&json!({"messages": [{"role": "user", "content": "hi"}],
                      "max_tokens": 2})),
    )
    .await;
    assert_error(post, 403, "origin_not_allowed").await;
    // The listed origin is still served, whatever the Host.
    let ok = send(client().get(h.url("/healthz")).header("origin", FRONTEND)).await;
    assert_eq!(ok.status(), 200);
    let metrics = h.metrics_text().await;
    assert_eq!(
        metric(&metrics, "tutor_gateway_denied_total{reason=\"origin\"}"),
        2.0,
        "operators see both"
    );
    h.shutdown().await;
}

/// DNS rebinding: a page on `evil.example` whose name its attacker points at the gateway's
/// address is, to the browser, the gateway itself (its GETs carry no `Origin`, and Fetch
/// Metadata says `same-origin`), but its `Host` still names `evil.example`. A gateway on a
/// loopback address answers only to loopback names unless `server.allowed_hosts` lists more:
/// anything else is refused before the engine sees it, on the admin listener too.
#[tokio::test]
async fn a_page_on_a_rebound_name_is_refused_by_its_host() {
    let h = harness(FAST, |c| {
        c.server.admin_listen = Some("127.0.0.1:0".parse().unwrap());
    })
    .await;
    let port = h.gw.addr.port();
    let ask = |host: String| {
        send(
            client()
                .get(h.url("/answer?prompt=why&max_output_tokens=3"))
                .header("host", host)
                .header("sec-fetch-site", "same-origin")
                .header("sec-fetch-mode", "cors")
                .header("sec-fetch-dest", "empty"),
        )
    };
    for host in [
        format!("evil.example:{port}"),
        "evil.example".to_owned(),
        format!("127.0.0.1.evil.example:{port}"),
    ] {
        let resp = ask(host.clone()).await;
        let v = assert_error(resp, 403, "host_not_allowed").await;
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("server.allowed_hosts"),
            "{v}"
        );
    }
    let chat = send(
        client()
            .post(h.url("/v1/chat/completions"))
            .header("host", "evil.example")
            .json(&json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})),
    )
    .await;
    assert_error(chat, 403, "host_not_allowed").await;
    let admin = h.gw.admin_addr.expect("an admin listener");
    let scrape = send(
        client()
            .get(format!("http://{admin}/metrics"))
            .header("host", format!("evil.example:{}", admin.port())),
    )
    .await;
    assert_error(scrape, 403, "host_not_allowed").await;
    assert!(h.sim_requests().await.is_empty(), "the engine saw nothing");
    // Operators see the five: three pages and a POST on the public listener, a scrape on the
    // admin one (one registry).
    let metrics = send(client().get(format!("http://{admin}/metrics"))).await;
    let metrics = metrics.text().await.unwrap();
    assert_eq!(
        metric(&metrics, "tutor_gateway_denied_total{reason=\"host\"}"),
        5.0
    );
    // The gateway's own names: served.
    for host in [format!("localhost:{port}"), format!("127.0.0.1:{port}")] {
        let resp = ask(host.clone()).await;
        assert_eq!(resp.status(), 200, "{host}");
        let text = resp.text().await.unwrap();
        assert_eq!(sse(&text).last().unwrap().0, "done", "{text}");
    }
    let scrape = send(client().get(format!("http://{admin}/metrics"))).await;
    assert_eq!(scrape.status(), 200);
    h.shutdown().await;

    // Names listed: those, and no others (the loopback default no longer applies).
    let h = harness(FAST, |c| {
        c.server.allowed_hosts = vec!["tutor.example.edu".to_owned(), "*.campus.edu".to_owned()];
    })
    .await;
    let ask = |host: &str| {
        send(
            client()
                .get(h.url("/healthz"))
                .header("host", host.to_owned()),
        )
    };
    for ok in [
        "tutor.example.edu",
        "Tutor.Example.EDU:443",
        "gw.campus.edu",
        // An address is never a rebound name (a probe by the pod's address).
        "127.0.0.1",
    ] {
        assert_eq!(ask(ok).await.status(), 200, "{ok}");
    }
    for refused in ["campus.edu", "localhost", "evil.example"] {
        assert_error(ask(refused).await, 403, "host_not_allowed").await;
    }
    h.shutdown().await;
}

/// A gateway with an admin listener whose config file (`path`) holds a valid change: small lane
/// to 7 seats. With `token`, `server.admin_token` is set.
async fn admin_gateway(path: &std::path::Path, token: Option<&str>) -> (Harness, String) {
    let server = parsed(&format!(
        "[server]\nadmin_listen = \"127.0.0.1:0\"\n{}",
        token.map_or(String::new(), |t| format!("admin_token = \"{t}\"\n"))
    ))
    .server;
    let h = harness(FAST, |c| c.server = server).await;
    h.gw.state.set_config_path(path.to_owned());
    let upstream = h.gw.state.config().upstream.base_url.clone();
    std::fs::write(
        path,
        format!(
            "[classify]\ntokenizer = \"heuristic\"\n[upstream]\nbase_url = \"{upstream}\"\n\
             [server]\nadmin_listen = \"127.0.0.1:0\"\n\
             [lanes.small]\nmax_concurrency = 7\nceiling = 7\n"
        ),
    )
    .unwrap();
    let admin = format!("http://{}", h.gw.admin_addr.unwrap());
    (h, admin)
}

fn reloads(metrics: &str, outcome: &str) -> f64 {
    metric(
        metrics,
        &format!("tutor_gateway_config_reloads_total{{outcome=\"{outcome}\"}}"),
    )
}

fn temp_config(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("tg-attack-admin-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("config.toml")
}

#[tokio::test]
async fn a_foreign_text_plain_post_to_admin_reload_is_refused_and_not_applied() {
    let path = temp_config("origin");
    let (h, admin) = admin_gateway(&path, None).await;
    let before = h.gw.state.config().lanes.small.max_concurrency.get();
    assert_ne!(before, 7);
    let url = format!("{admin}/admin/reload");
    // A page's "simple" request: no preflight, applied before the browser reads the answer.
    let foreign = send(
        client()
            .post(&url)
            .header("origin", "http://evil.example")
            .header("content-type", "text/plain")
            .body("{}"),
    )
    .await;
    assert_eq!(foreign.status(), 403);
    // Any Origin at all, even with a JSON body.
    let with_origin = send(
        client()
            .post(&url)
            .header("origin", "http://127.0.0.1")
            .json(&json!({})),
    )
    .await;
    assert_eq!(with_origin.status(), 403);
    // No Origin, but not JSON.
    let plain = send(
        client()
            .post(&url)
            .header("content-type", "text/plain")
            .body("{}"),
    )
    .await;
    assert_eq!(plain.status(), 415);
    let metrics = get_text(&format!("{admin}/metrics")).await;
    assert_eq!(reloads(&metrics, "applied"), 0.0, "nothing was reloaded");
    assert_eq!(
        metric(&metrics, "tutor_gateway_denied_total{reason=\"origin\"}"),
        2.0,
        "both pages counted"
    );
    assert_eq!(
        h.gw.state.config().lanes.small.max_concurrency.get(),
        before
    );
    // The operator's own request still works.
    let ok = send(client().post(&url).json(&json!({}))).await;
    assert_eq!(ok.status(), 200);
    assert_eq!(h.gw.state.config().lanes.small.max_concurrency.get(), 7);
    h.shutdown().await;
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

#[tokio::test]
async fn with_an_admin_token_an_admin_request_without_it_gets_401() {
    let path = temp_config("token");
    let (h, admin) = admin_gateway(&path, Some(ADMIN_TOKEN)).await;
    let url = format!("{admin}/admin/reload");
    let none = send(client().post(&url).json(&json!({}))).await;
    assert_error(none, 401, "invalid_api_key").await;
    let wrong = send(
        client()
            .post(&url)
            .bearer_auth("an-admin-token-of-32-bytes-long?")
            .json(&json!({})),
    )
    .await;
    assert_eq!(wrong.status(), 401);
    let metrics = get_text(&format!("{admin}/metrics")).await;
    assert_eq!(reloads(&metrics, "applied"), 0.0);
    assert_eq!(
        metric(&metrics, "tutor_gateway_denied_total{reason=\"auth\"}"),
        2.0,
        "both denials counted"
    );
    let right = send(
        client()
            .post(&url)
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({})),
    )
    .await;
    assert_eq!(right.status(), 200);
    let metrics = get_text(&format!("{admin}/metrics")).await;
    assert_eq!(reloads(&metrics, "applied"), 1.0);
    h.shutdown().await;
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

/// The admin token as an operator may give it (a Secret written by `echo`, with its newline)
/// and sent as HTTP allows (the scheme in any case): taken, where every call got 401.
#[tokio::test]
async fn an_admin_token_with_a_newline_and_a_lower_case_scheme_are_taken() {
    let path = temp_config("token-newline");
    let (h, admin) = admin_gateway(&path, Some(&format!("{ADMIN_TOKEN}\\n"))).await;
    let right = send(
        client()
            .post(format!("{admin}/admin/reload"))
            .header("authorization", format!("bearer {ADMIN_TOKEN}"))
            .json(&json!({})),
    )
    .await;
    assert_eq!(right.status(), 200);
    h.shutdown().await;
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

/// An admin listener reachable from the network with no token: said at start (anyone who
/// reaches it can reload the configuration); on loopback, or with a token, nothing is said.
#[tokio::test]
async fn an_admin_listener_open_to_the_network_without_a_token_is_warned_about() {
    const WARNING: &str = "server.admin_listen is not a loopback address";
    for (listen, token, warned) in [
        ("0.0.0.0:0", None, true),
        ("0.0.0.0:0", Some(ADMIN_TOKEN), false),
        ("127.0.0.1:0", None, false),
    ] {
        let (logs, guard) = tutor_testkit::capture_logs(tracing::Level::WARN);
        let server = parsed(&format!(
            "[server]\nadmin_listen = \"{listen}\"\n{}",
            token.map_or(String::new(), |t| format!("admin_token = \"{t}\"\n"))
        ))
        .server;
        let h = harness(FAST, |c| c.server = server).await;
        drop(guard);
        assert_eq!(
            logs.text().contains(WARNING),
            warned,
            "{listen} {token:?}: {}",
            logs.text()
        );
        h.shutdown().await;
    }
}

/// A webhook receiver on 127.0.0.1 counting what it is sent; its port.
async fn receiver() -> (u16, Arc<Mutex<usize>>) {
    let got = Arc::new(Mutex::new(0usize));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = got.clone();
    let app = axum::Router::new().route(
        "/hooks/tutor",
        axum::routing::post(move || {
            let seen = seen.clone();
            async move {
                *seen.lock().unwrap() += 1;
                "ok"
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (port, got)
}

/// A FAST job notifying `notify`; its final webhook state.
async fn job_webhook(h: &Harness, notify: &str) -> Value {
    let resp = send(client().post(h.url("/jobs")).json(
        &json!({"prompt": "review my repository", "max_output_tokens": 3,
                      "notify": notify}),
    ))
    .await;
    let (status, v) = status_json(resp).await;
    assert_eq!(status, 202, "{v}");
    let id = v["id"].as_str().unwrap().to_owned();
    for _ in 0..3000 {
        let v = json(&send_text(client().get(h.url(&format!("/jobs/{id}")))).await);
        if v["webhook"]["delivered"].is_boolean() {
            return v["webhook"].clone();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the webhook of job {id} never settled");
}

/// `[jobs]` allowing `localhost:port` (a name that resolves to 127.0.0.1), with `extra`.
fn localhost_hooks(port: u16, extra: &str) -> tutor_gateway::config::JobsConfig {
    let mut jobs = parsed(&format!(
        "[jobs]\nwebhook_attempts = 2\nwebhook_backoff_ms = 20\n{extra}"
    ))
    .jobs;
    jobs.webhook_allow =
        vec![WebhookPattern::parse(&format!("http://localhost:{port}/hooks/*")).unwrap()];
    jobs.webhook_secret = Some("a-test-secret-of-32-bytes-length".into());
    jobs
}

#[tokio::test]
async fn a_listed_name_resolving_to_loopback_gets_no_webhook_unless_allowed() {
    let (port, got) = receiver().await;
    let notify = format!("http://localhost:{port}/hooks/tutor");
    let h = harness(FAST, |c| c.jobs = localhost_hooks(port, "")).await;
    let webhook = job_webhook(&h, &notify).await;
    assert_eq!(webhook["delivered"], false, "{webhook}");
    assert_eq!(
        *got.lock().unwrap(),
        0,
        "nothing reached the loopback receiver"
    );
    h.shutdown().await;
    // The documented opt-in delivers to it.
    let h = harness(FAST, |c| {
        c.jobs = localhost_hooks(port, "webhook_allow_private = true\n")
    })
    .await;
    let webhook = job_webhook(&h, &notify).await;
    assert_eq!(webhook["delivered"], true, "{webhook}");
    assert_eq!(*got.lock().unwrap(), 1);
    h.shutdown().await;
}

#[tokio::test]
async fn a_double_encoded_webhook_path_is_refused() {
    let h = harness(FAST, |c| {
        c.jobs.webhook_allow =
            vec![WebhookPattern::parse("https://hooks.example.edu/hooks/*").unwrap()];
        c.jobs.webhook_secret = Some("a-test-secret-of-32-bytes-length".into());
    })
    .await;
    for notify in [
        "https://hooks.example.edu/hooks/%252e%252e/admin",
        "https://hooks.example.edu/hooks/%252E%252E%252Fadmin",
        "https://hooks.example.edu/hooks/%25252e%25252e/admin",
        // Tomcat and Spring drop a segment's `;...` and then resolve the `..`.
        "https://hooks.example.edu/hooks/..;/admin",
        "https://hooks.example.edu/hooks/a;b/..;x/admin",
    ] {
        let resp = send(client().post(h.url("/jobs")).json(
            &json!({"prompt": "review my repository", "max_output_tokens": 3,
                          "notify": notify}),
        ))
        .await;
        let (status, v) = status_json(resp).await;
        assert_eq!(status, 400, "{notify}: {v}");
        assert_eq!(v["error"]["param"], "notify", "{v}");
    }
    h.shutdown().await;
}
