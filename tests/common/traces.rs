//! Spans in memory: an OpenTelemetry exporter installed as the thread's subscriber (a
//! `#[tokio::test]` runs the gateway and the simulator on that same thread, so every span lands
//! there).

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::Value;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tracing_subscriber::layer::SubscriberExt;

pub struct Traces {
    exporter: InMemorySpanExporter,
    provider: SdkTracerProvider,
    _guard: tracing::subscriber::DefaultGuard,
}

/// Installs the in-memory exporter for this thread until the value is dropped.
pub fn traces() -> Traces {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    // The gateway's own export layer: only `llm.generate` spans get through it.
    let subscriber = tracing_subscriber::registry().with(
        tutor_gateway::telemetry::otel::export_layer(provider.tracer("test")),
    );
    let guard = tracing::subscriber::set_default(subscriber);
    Traces {
        exporter,
        provider,
        _guard: guard,
    }
}

impl Traces {
    /// Every finished span so far, by name.
    pub fn span_names(&self) -> Vec<String> {
        let _ = self.provider.force_flush();
        let spans = self.exporter.get_finished_spans().unwrap();
        spans.into_iter().map(|s| s.name.into_owned()).collect()
    }

    /// The finished `llm.generate` spans so far.
    pub fn generate_spans(&self) -> Vec<SpanData> {
        let _ = self.provider.force_flush();
        self.exporter
            .get_finished_spans()
            .unwrap()
            .into_iter()
            .filter(|s| s.name == "llm.generate")
            .collect()
    }
}

/// The attribute `key` of `span`, when set.
pub fn attr(span: &SpanData, key: &str) -> Option<Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.clone())
}
