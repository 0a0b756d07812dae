//! Logging and OpenTelemetry set-up for the binary, and W3C trace-context propagation.
//!
//! Tracing is off by default and then costs nothing beyond the `llm.generate` span that
//! `tracing` already keeps. It is on when `telemetry.tracing = true` or the environment sets
//! `OTEL_EXPORTER_OTLP_ENDPOINT`, unless `OTEL_SDK_DISABLED=true`. Endpoint, protocol and
//! service name come from `[telemetry]`, else from the standard `OTEL_EXPORTER_OTLP_ENDPOINT`,
//! `OTEL_EXPORTER_OTLP_PROTOCOL` and `OTEL_SERVICE_NAME`.
//!
//! Propagation: an incoming `traceparent` becomes the parent of the request's span, and the
//! span's context goes to vLLM as `traceparent`, so vLLM's `llm_request` span joins the trace.
//! With tracing off, the client's `traceparent` is forwarded unchanged.
//!
//! Only `llm.generate` spans are exported ([`export_layer`]), whatever `RUST_LOG` says: it
//! filters the log lines only, so a debug log does not send the HTTP libraries' spans (one
//! event per HTTP/2 frame) to the collector, and a quiet log does not silence the spans.

use std::collections::HashMap;

use anyhow::Context as _;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;

use super::request_log::LineSink;
use crate::config::{OtlpProtocol, TelemetryConfig};

/// Keeps the span exporter alive; flushes it, and the diagnostic log, on drop.
#[derive(Debug)]
pub struct TracingGuard {
    provider: Option<SdkTracerProvider>,
}

/// Longest the exit waits for the batched spans to reach the collector.
pub const SPAN_FLUSH_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Longest the exit waits for a log's queued lines (the request log's, then the diagnostic
/// log's) to be written.
pub const LOG_FLUSH_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

impl Drop for TracingGuard {
    fn drop(&mut self) {
        if let Some(p) = self.provider.take() {
            if let Err(e) = p.shutdown_with_timeout(SPAN_FLUSH_WAIT) {
                eprintln!("tutor-gateway: flushing spans failed: {e}");
            }
        }
        flush_diagnostics();
    }
}

/// Diagnostic log lines that may wait for stderr before new ones are dropped.
pub const DIAGNOSTIC_LINES: usize = 16_384;

/// The diagnostic log's writer ([`init`]): stderr, written by a thread of its own.
static DIAGNOSTIC: std::sync::OnceLock<LineSink> = std::sync::OnceLock::new();

/// Diagnostic log lines dropped so far because stderr was not read fast enough (0 before
/// [`init`], and in tests, which log elsewhere).
pub fn diagnostic_log_dropped() -> u64 {
    DIAGNOSTIC.get().map_or(0, LineSink::dropped)
}

/// Waits up to [`LOG_FLUSH_WAIT`] for the diagnostic log's queued lines to reach stderr (at
/// exit).
pub fn flush_diagnostics() {
    if let Some(sink) = DIAGNOSTIC.get() {
        sink.flush(LOG_FLUSH_WAIT);
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// The exporter's protocol from `OTEL_EXPORTER_OTLP_PROTOCOL` (`value`; unset: gRPC). One it
/// does not speak is refused at start, naming the variable: read as gRPC, `http/json` against a
/// collector's HTTP port exported nothing, silently.
fn protocol_of(value: Option<&str>) -> anyhow::Result<OtlpProtocol> {
    match value.map(str::trim) {
        None | Some("grpc") => Ok(OtlpProtocol::Grpc),
        Some("http/protobuf" | "http") => Ok(OtlpProtocol::HttpProtobuf),
        Some(other) => anyhow::bail!(
            "OTEL_EXPORTER_OTLP_PROTOCOL={other:?} is not one this gateway exports with: \
             \"grpc\" or \"http/protobuf\" (or telemetry.otlp_protocol)"
        ),
    }
}

/// Whether spans are exported, given the config and the environment.
pub fn tracing_enabled(config: &TelemetryConfig) -> bool {
    if env("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return false;
    }
    config.tracing || env("OTEL_EXPORTER_OTLP_ENDPOINT").is_some()
}

/// Colour in the logs only on a terminal (never in a file, a pipe or a journal), and never
/// with `NO_COLOR` set.
fn colour() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal() && env("NO_COLOR").is_none()
}

/// The OpenTelemetry layer for `tracer`: it sees the `llm.generate` spans and nothing else
/// (no other span, no event), whatever the log filter.
pub fn export_layer<S>(tracer: opentelemetry_sdk::trace::Tracer) -> impl Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    let generate = filter_fn(|m| m.is_span() && m.name() == "llm.generate");
    tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(generate)
}

/// Installs the global subscriber: logs on stderr (`RUST_LOG`, default `info`) and, when
/// enabled, the OpenTelemetry layer exporting over OTLP ([`export_layer`]). The log is written
/// by a thread of its own ([`LineSink`]): a request's task never blocks on a stderr pipe read
/// slowly (a log shipper behind, a blocking container log driver); beyond
/// [`DIAGNOSTIC_LINES`] waiting, lines are dropped and counted
/// (`tutor_gateway_log_dropped_total`).
pub fn init(config: &TelemetryConfig) -> anyhow::Result<TracingGuard> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let sink = DIAGNOSTIC
        .get_or_init(|| LineSink::named("diagnostic-log", std::io::stderr(), DIAGNOSTIC_LINES))
        .clone();
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(sink)
        .with_ansi(colour());
    if !tracing_enabled(config) {
        tracing_subscriber::registry()
            .with(fmt.with_filter(filter))
            .try_init()?;
        return Ok(TracingGuard { provider: None });
    }
    let protocol = match config.otlp_protocol {
        Some(p) => p,
        None => protocol_of(env("OTEL_EXPORTER_OTLP_PROTOCOL").as_deref())?,
    };
    let exporter = exporter(config, protocol)?;
    let service = config
        .service_name
        .clone()
        .or_else(|| env("OTEL_SERVICE_NAME"))
        .unwrap_or_else(|| "tutor-gateway".to_owned());
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(Resource::builder().with_service_name(service).build())
        .build();
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let tracer = provider.tracer("tutor-gateway");
    tracing_subscriber::registry()
        .with(fmt.with_filter(filter))
        .with(export_layer(tracer))
        .try_init()?;
    tracing::info!(?protocol, "exporting llm.generate spans over OTLP");
    Ok(TracingGuard {
        provider: Some(provider),
    })
}

/// The span exporter for `protocol`. An `https://` endpoint (in the file, or
/// `OTEL_EXPORTER_OTLP_ENDPOINT`) is TLS through rustls, checked against
/// `telemetry.otlp_ca_file` when given, else the public web roots.
pub fn exporter(
    config: &TelemetryConfig,
    protocol: OtlpProtocol,
) -> anyhow::Result<opentelemetry_otlp::SpanExporter> {
    use opentelemetry_otlp::tonic_types::transport::{Certificate, ClientTlsConfig};
    use opentelemetry_otlp::{WithHttpConfig, WithTonicConfig};
    let endpoint = config
        .otlp_endpoint
        .clone()
        .or_else(|| env("OTEL_EXPORTER_OTLP_ENDPOINT"));
    let tls = endpoint
        .as_deref()
        .is_some_and(|e| e.starts_with("https://"));
    let exporter = match protocol {
        OtlpProtocol::Grpc => {
            let mut b = opentelemetry_otlp::SpanExporter::builder().with_tonic();
            if let Some(ep) = &config.otlp_endpoint {
                b = b.with_endpoint(ep.clone());
            }
            if tls {
                let c = ClientTlsConfig::new();
                b = b.with_tls_config(match &config.otlp_ca_pem {
                    Some(pem) => c.ca_certificate(Certificate::from_pem(pem)),
                    None => c.with_webpki_roots(),
                });
            }
            b.build()
        }
        OtlpProtocol::HttpProtobuf => {
            let mut b = opentelemetry_otlp::SpanExporter::builder().with_http();
            if let Some(ep) = &config.otlp_endpoint {
                b = b.with_endpoint(format!("{}/v1/traces", ep.trim_end_matches('/')));
            }
            // Always our client: its TLS names its crypto provider (ring), so an http://
            // collector works whatever the process default is; an https:// one is checked
            // against telemetry.otlp_ca_file or the web roots.
            let client = reqwest_otlp::blocking::Client::builder()
                .use_preconfigured_tls(rustls_client(config.otlp_ca_pem.as_deref())?)
                .build()
                .context("OTLP HTTP client")?;
            b = b.with_http_client(client);
            b.build()
        }
    };
    exporter.context("OTLP span exporter")
}

/// A rustls client configuration (ring) trusting the certificates in `ca` (PEM), or the
/// public web roots without it.
fn rustls_client(ca: Option<&[u8]>) -> anyhow::Result<rustls::ClientConfig> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::CertificateDer;
    let mut roots = rustls::RootCertStore::empty();
    match ca {
        Some(pem) => {
            for cert in CertificateDer::pem_slice_iter(pem) {
                roots
                    .add(cert.context("telemetry.otlp_ca_file")?)
                    .context("telemetry.otlp_ca_file")?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS versions")?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// The longest client `tracestate` taken, bytes: what W3C Trace Context asks every vendor to
/// pass on (its 32 entries may take about 16 KB, which every exported span would carry).
pub const MAX_TRACESTATE_BYTES: usize = 512;

/// A client's `tracestate` as taken: dropped whole when longer than [`MAX_TRACESTATE_BYTES`]
/// (the spec lets a vendor discard it).
fn bounded_tracestate(tracestate: Option<&str>) -> Option<&str> {
    tracestate.filter(|ts| ts.len() <= MAX_TRACESTATE_BYTES)
}

/// Makes the client's `traceparent` (and `tracestate`, [`bounded_tracestate`]) the parent of
/// `span`.
pub fn set_parent(span: &tracing::Span, traceparent: Option<&str>, tracestate: Option<&str>) {
    let Some(tp) = traceparent else { return };
    let mut carrier = HashMap::new();
    carrier.insert("traceparent".to_owned(), tp.to_owned());
    if let Some(ts) = bounded_tracestate(tracestate) {
        carrier.insert("tracestate".to_owned(), ts.to_owned());
    }
    let cx = TraceContextPropagator::new().extract(&carrier);
    let _ = span.set_parent(cx);
}

/// The `traceparent` to send upstream: `span`'s own context when spans are recorded, else the
/// client's unchanged.
pub fn traceparent_for(span: &tracing::Span, incoming: Option<&str>) -> Option<String> {
    let mut carrier: HashMap<String, String> = HashMap::new();
    TraceContextPropagator::new().inject_context(&span.context(), &mut carrier);
    carrier
        .remove("traceparent")
        .or_else(|| incoming.map(str::to_owned))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client's `tracestate` past 512 bytes is not taken (every exported span would carry
    /// it); one within is.
    #[test]
    fn a_tracestate_past_what_the_spec_asks_vendors_to_pass_is_dropped() {
        let within = format!("v={}", "a".repeat(MAX_TRACESTATE_BYTES - 2));
        assert_eq!(bounded_tracestate(Some(&within)), Some(within.as_str()));
        let past = format!("{within}b");
        assert_eq!(bounded_tracestate(Some(&past)), None);
        assert_eq!(bounded_tracestate(None), None);
    }

    /// The protocols the exporter speaks are read; any other is refused, naming the variable
    /// (`http/json`, a standard value it does not speak, used to mean gRPC, and no span came).
    #[test]
    fn the_protocol_from_the_environment_is_one_it_speaks_or_refused() {
        assert_eq!(protocol_of(None).unwrap(), OtlpProtocol::Grpc);
        assert_eq!(protocol_of(Some("grpc")).unwrap(), OtlpProtocol::Grpc);
        assert_eq!(
            protocol_of(Some("http/protobuf")).unwrap(),
            OtlpProtocol::HttpProtobuf
        );
        for bad in ["http/json", "grpcx", "HTTP"] {
            let e = protocol_of(Some(bad)).unwrap_err().to_string();
            assert!(e.contains("OTEL_EXPORTER_OTLP_PROTOCOL"), "{e}");
        }
    }
}
