//! OTLP over TLS (issue 17, item 6): a gateway process exports its spans to an `https://`
//! collector whose certificate a private CA signed (`telemetry.otlp_ca_file`), over
//! HTTP/protobuf and over gRPC; without the CA the collector's certificate is refused and
//! nothing is exported.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, Method, Uri};
use axum::response::IntoResponse;
use common::process::GatewayProcess;
use common::{client, send};
use vllm_sim::{SimArgs, SimServer};

const FAST: &[&str] = &["--speed", "50", "--profile", "tiny-test"];

fn fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tls")
        .join(name)
}

/// A stand-in OTLP collector behind TLS (the test CA's certificate for 127.0.0.1, ALPN h2 and
/// http/1.1): it keeps `(method, path, content-type)` of every request, and counts the TLS
/// handshakes that failed.
struct Collector {
    url: String,
    got: Arc<Mutex<Vec<(String, String, String)>>>,
    refused: Arc<AtomicUsize>,
}

async fn collector() -> Collector {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    use tokio_rustls::rustls;
    let got: Arc<Mutex<Vec<(String, String, String)>>> = Arc::default();
    let seen = got.clone();
    let app = axum::Router::new().fallback(move |method: Method, uri: Uri, headers: HeaderMap| {
        let seen = seen.clone();
        async move {
            let ct = headers
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            seen.lock()
                .unwrap()
                .push((method.to_string(), uri.path().to_owned(), ct.clone()));
            if ct.starts_with("application/grpc") {
                // A trailers-only gRPC answer: OK, no message.
                (
                    [("content-type", "application/grpc"), ("grpc-status", "0")],
                    "",
                )
                    .into_response()
            } else {
                ([("content-type", "application/x-protobuf")], "").into_response()
            }
        }
    });
    let plain = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend = plain.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(plain, app).await.unwrap() });
    let certs = CertificateDer::pem_file_iter(fixture("server.pem"))
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(fixture("server.key")).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let front = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://127.0.0.1:{}", front.local_addr().unwrap().port());
    let refused = Arc::new(AtomicUsize::new(0));
    let failures = refused.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = front.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            let failures = failures.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    failures.fetch_add(1, Ordering::SeqCst);
                    return;
                };
                let Ok(mut plain) = tokio::net::TcpStream::connect(backend).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
    Collector { url, got, refused }
}

/// A gateway process exporting to `endpoint` over `protocol`, trusting `ca` when given.
async fn gateway(sim: &SimServer, endpoint: &str, protocol: &str, ca: bool) -> GatewayProcess {
    let ca_line = if ca {
        format!("otlp_ca_file = \"{}\"\n", fixture("ca.pem").display())
    } else {
        String::new()
    };
    let rest = format!(
        "[telemetry]\nrequest_log = \"off\"\ntracing = true\notlp_endpoint = \"{endpoint}\"\n\
             otlp_protocol = \"{protocol}\"\n{ca_line}\
             [classify]\ntokenizer = \"heuristic\"\n\
             [upstream]\nbase_url = \"{}\"\n",
        sim.url()
    );
    // Export each batch at once instead of every 5 s.
    let env = [("OTEL_BSP_SCHEDULE_DELAY", "50")];
    GatewayProcess::start("otlp-tls", &rest, &env).await
}

/// Sends one chat request through `gw`; it must succeed whatever happens to its span.
async fn one_request(gw: &GatewayProcess) {
    let resp = send(
        client()
            .post(format!("{}/v1/chat/completions", gw.url))
            .json(
                &serde_json::json!({"messages": [{"role": "user", "content": "what is a closure?"}],
                                  "max_tokens": 4}),
            ),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let _ = resp.text().await;
}

async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..1500 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{what} did not happen within 30 s");
}

#[tokio::test]
async fn spans_reach_an_https_collector_over_http_protobuf_and_grpc() {
    let sim = vllm_sim::start(&SimArgs::for_test(FAST)).await.unwrap();
    for (protocol, path, content_type) in [
        ("http/protobuf", "/v1/traces", "application/x-protobuf"),
        (
            "grpc",
            "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
            "application/grpc",
        ),
    ] {
        let c = collector().await;
        let gw = gateway(&sim, &c.url, protocol, true).await;
        one_request(&gw).await;
        wait_for(&format!("a {protocol} export over TLS"), || {
            c.got
                .lock()
                .unwrap()
                .iter()
                .any(|(m, p, ct)| m == "POST" && p == path && ct.starts_with(content_type))
        })
        .await;
        assert_eq!(c.refused.load(Ordering::SeqCst), 0, "{protocol}");
    }
    sim.shutdown().await;
}

#[tokio::test]
async fn a_collector_certificate_outside_the_trusted_roots_is_refused() {
    let sim = vllm_sim::start(&SimArgs::for_test(FAST)).await.unwrap();
    let c = collector().await;
    // No otlp_ca_file: the public web roots do not include the test CA.
    let gw = gateway(&sim, &c.url, "http/protobuf", false).await;
    one_request(&gw).await;
    wait_for("a refused TLS handshake", || {
        c.refused.load(Ordering::SeqCst) > 0
    })
    .await;
    assert!(
        c.got.lock().unwrap().is_empty(),
        "nothing reached the collector"
    );
    sim.shutdown().await;
}
