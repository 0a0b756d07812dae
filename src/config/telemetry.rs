//! `[telemetry]`: the request log and OTLP tracing.
//!
//! Owns [`RawTelemetry`], [`TelemetryConfig`], [`RequestLogSink`] and [`OtlpProtocol`], their
//! defaults and validation.

use serde::Deserialize;

use super::check::Checker;

/// `[telemetry]` as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTelemetry {
    /// `stdout` or `off`.
    pub request_log: Option<String>,
    /// Export `llm.generate` spans over OTLP.
    pub tracing: Option<bool>,
    /// OTLP endpoint; empty: `OTEL_EXPORTER_OTLP_ENDPOINT` or the protocol's default.
    pub otlp_endpoint: Option<String>,
    /// `grpc` or `http/protobuf`; empty: `OTEL_EXPORTER_OTLP_PROTOCOL` or `grpc`.
    pub otlp_protocol: Option<String>,
    /// `service.name`; empty: `OTEL_SERVICE_NAME` or `tutor-gateway`.
    pub service_name: Option<String>,
    /// PEM CA certificate(s) an `https://` collector's certificate is checked against.
    pub otlp_ca_file: Option<String>,
}

/// Where the request log goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestLogSink {
    /// One JSON line per finished request on stdout.
    Stdout,
    /// No request log.
    Off,
}

/// OTLP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// OTLP over gRPC (port 4317).
    Grpc,
    /// OTLP over HTTP with protobuf bodies (port 4318).
    HttpProtobuf,
}

/// Request log and tracing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TelemetryConfig {
    /// Request log sink.
    pub request_log: RequestLogSink,
    /// Export spans over OTLP (also turned on by `OTEL_EXPORTER_OTLP_ENDPOINT`).
    pub tracing: bool,
    /// OTLP endpoint, if set in the file.
    pub otlp_endpoint: Option<String>,
    /// OTLP transport, if set in the file.
    pub otlp_protocol: Option<OtlpProtocol>,
    /// `service.name`, if set in the file.
    pub service_name: Option<String>,
    /// With an `https://` endpoint: PEM CA certificates to trust instead of the public web
    /// roots.
    pub otlp_ca_pem: Option<Vec<u8>>,
}

/// Checks `[telemetry]`. Never echoes the endpoint: it may carry credentials.
pub(super) fn validate(c: &mut Checker, raw: RawTelemetry) -> TelemetryConfig {
    let request_log = match raw.request_log.as_deref().unwrap_or("stdout") {
        "stdout" => RequestLogSink::Stdout,
        "off" => RequestLogSink::Off,
        _ => {
            c.fail("telemetry.request_log", "must be \"stdout\" or \"off\"");
            RequestLogSink::Off
        }
    };
    let otlp_protocol = match raw.otlp_protocol.as_deref().unwrap_or("") {
        "" => None,
        "grpc" => Some(OtlpProtocol::Grpc),
        "http/protobuf" | "http" => Some(OtlpProtocol::HttpProtobuf),
        _ => {
            c.fail(
                "telemetry.otlp_protocol",
                "must be \"grpc\" or \"http/protobuf\"",
            );
            None
        }
    };
    let endpoint = raw.otlp_endpoint.filter(|e| !e.is_empty());
    if let Some(e) = &endpoint {
        if !e.starts_with("http://") && !e.starts_with("https://") {
            c.fail(
                "telemetry.otlp_endpoint",
                "must start with http:// or https://",
            );
        }
    }
    let otlp_ca_pem = super::upstream::ca_pem(c, "telemetry.otlp_ca_file", raw.otlp_ca_file);
    if otlp_ca_pem.is_some()
        && endpoint
            .as_deref()
            .is_some_and(|e| !e.starts_with("https://"))
    {
        c.fail(
            "telemetry.otlp_ca_file",
            "needs an https:// telemetry.otlp_endpoint",
        );
    }
    TelemetryConfig {
        request_log,
        tracing: raw.tracing.unwrap_or(false),
        otlp_endpoint: endpoint,
        otlp_protocol,
        service_name: raw.service_name.filter(|s| !s.is_empty()),
        otlp_ca_pem,
    }
}
