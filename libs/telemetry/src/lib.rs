//! Tracing and OpenTelemetry set-up shared by every binary, and W3C trace-context propagation
//! across gRPC metadata and Kafka record headers.
//!
//! - `RUST_LOG` filters logs (default `info`); `SG_LOG_FORMAT=json` switches to JSON lines.
//! - The OpenTelemetry layer is always installed so that spans carry W3C trace ids, which
//!   travel to consumers in the `traceparent` header; spans are exported over OTLP/gRPC only
//!   when `OTEL_EXPORTER_OTLP_ENDPOINT` is set. It has its own filter, `SG_TRACE_FILTER`
//!   (`EnvFilter` syntax, default `info`): the services' request and batch spans are `info`,
//!   so trace context survives `RUST_LOG=warn`, while the debug and trace spans of the
//!   libraries underneath (HTTP/2, SQL, Redis) cost nothing.

use std::collections::HashMap;

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Keeps the tracer provider alive; [`Telemetry::shutdown`] flushes pending spans.
pub struct Telemetry {
    provider: SdkTracerProvider,
}

impl Telemetry {
    /// Flushes and stops span export (call last at shutdown).
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown() {
            eprintln!("telemetry shutdown: {e}");
        }
    }
}

/// Installs the global subscriber for binary `service_name` (the OTLP `service.name`).
///
/// # Errors
/// The OTLP exporter cannot be built, or a global subscriber is already set.
pub fn init(service_name: &'static str) -> anyhow::Result<Telemetry> {
    init_with(service_name, false, Export::from_env())
}

/// [`init`] for in-process tests: logs go through the test harness's capture (default level
/// `warn`), and a second call is a no-op.
pub fn init_for_tests() {
    static ONCE: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        // Leaked on purpose: the provider lives as long as the test process.
        if let Ok(t) = init_with("socialgraph-tests", true, Export::from_env()) {
            std::mem::forget(t);
        }
    });
}

/// [`init_for_tests`] exporting every span to the OTLP/gRPC receiver at `endpoint` (e.g.
/// `http://127.0.0.1:4317`) in batches at most 100 ms apart, sampled like a deployment with
/// `OTEL_TRACES_SAMPLER=parentbased_traceidratio` and `OTEL_TRACES_SAMPLER_ARG=root_ratio`: a
/// span with a parent follows its parent's decision, a root is kept with probability
/// `root_ratio` (0.0..=1.0). Call it once per process, before anything else of it traces (a
/// test file of its own: nextest runs each test in a process of its own).
///
/// # Errors
/// The exporter cannot be built, or a global subscriber is already set.
pub fn init_for_tests_exporting(endpoint: &str, root_ratio: f64) -> anyhow::Result<Telemetry> {
    let export =
        Export { endpoint: Some(endpoint.to_owned()), root_ratio: Some(root_ratio), flush_every: Some(std::time::Duration::from_millis(100)) };
    init_with("socialgraph-tests", true, export)
}

/// Where spans go and which are kept. The sampler and the batch delay, when `None`, are the
/// OpenTelemetry SDK's, which reads the standard variables (`OTEL_TRACES_SAMPLER`,
/// `OTEL_TRACES_SAMPLER_ARG`, `OTEL_BSP_SCHEDULE_DELAY`).
struct Export {
    /// Export over OTLP/gRPC to this endpoint (empty: the SDK's, from
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`); `None`: no export.
    endpoint: Option<String>,
    /// Parent-based sampling with this ratio for roots.
    root_ratio: Option<f64>,
    /// The batch exporter's schedule delay.
    flush_every: Option<std::time::Duration>,
}

impl Export {
    /// A deployment's: export only when `OTEL_EXPORTER_OTLP_ENDPOINT` is set, the rest as the
    /// SDK reads it from the environment.
    fn from_env() -> Self {
        let endpoint = std::env::var_os("OTEL_EXPORTER_OTLP_ENDPOINT").map(|_| String::new());
        Self { endpoint, root_ratio: None, flush_every: None }
    }
}

fn init_with(service_name: &'static str, for_tests: bool, export: Export) -> anyhow::Result<Telemetry> {
    use opentelemetry_otlp::WithExportConfig;
    use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, Sampler};
    let mut builder = SdkTracerProvider::builder().with_resource(opentelemetry_sdk::Resource::builder().with_service_name(service_name).build());
    if let Some(endpoint) = export.endpoint {
        let mut exporter = opentelemetry_otlp::SpanExporter::builder().with_tonic();
        if !endpoint.is_empty() {
            exporter = exporter.with_endpoint(endpoint);
        }
        let mut batch = BatchConfigBuilder::default();
        if let Some(every) = export.flush_every {
            batch = batch.with_scheduled_delay(every);
        }
        builder = builder.with_span_processor(BatchSpanProcessor::builder(exporter.build()?).with_batch_config(batch.build()).build());
    }
    if let Some(ratio) = export.root_ratio {
        builder = builder.with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(ratio))));
    }
    let provider = builder.build();
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let span_filter = std::env::var("SG_TRACE_FILTER").ok().and_then(|f| EnvFilter::try_new(f).ok()).unwrap_or_else(|| EnvFilter::new("info"));
    let otel = tracing_opentelemetry::layer().with_tracer(provider.tracer(service_name)).with_filter(span_filter);
    let default_level = if for_tests { "warn" } else { "info" };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    let fmt = if for_tests {
        tracing_subscriber::fmt::layer().with_test_writer().boxed()
    } else if std::env::var("SG_LOG_FORMAT").is_ok_and(|v| v == "json") {
        tracing_subscriber::fmt::layer().json().with_current_span(true).boxed()
    } else {
        tracing_subscriber::fmt::layer().boxed()
    };
    // Logs and spans are filtered apart: spans must exist at `info` whatever RUST_LOG says so
    // that trace context (and the `traceparent` record header) survives RUST_LOG=warn.
    tracing_subscriber::registry().with(fmt.with_filter(filter)).with(otel).try_init()?;
    Ok(Telemetry { provider })
}

struct MetadataExtractor<'a>(&'a tonic::metadata::MetadataMap);

impl Extractor for MetadataExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|k| match k {
                tonic::metadata::KeyRef::Ascii(k) => Some(k.as_str()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

/// Makes `span` a child of the trace context in gRPC request metadata (`traceparent`), if any.
pub fn set_parent_from_metadata(span: &tracing::Span, metadata: &tonic::metadata::MetadataMap) {
    let cx = TraceContextPropagator::new().extract(&MetadataExtractor(metadata));
    let _ = span.set_parent(cx);
}

/// Puts `span` (a batch's: a relay's publish round, a consumer's apply) in the traces of the
/// records it carries, given their Kafka headers in log order. Its parent is the first record
/// whose `traceparent` is sampled (else the first valid one), so it joins that trace and its
/// sampling decision: one event, one trace, from the RPC to the last consumer, and a sampled
/// trace is never dropped for an unsampled record ahead of it in the batch. Every other traced
/// record is a link. A batch of untraced records stays a root.
pub fn adopt_records<'a>(span: &tracing::Span, headers: impl IntoIterator<Item = &'a std::collections::BTreeMap<String, Vec<u8>>>) {
    use opentelemetry::trace::TraceContextExt;
    let mut contexts: Vec<opentelemetry::Context> = headers
        .into_iter()
        .map(|h| {
            let map: HashMap<String, String> = h.iter().filter_map(|(k, v)| std::str::from_utf8(v).ok().map(|v| (k.clone(), v.to_owned()))).collect();
            TraceContextPropagator::new().extract(&map)
        })
        .filter(|cx| cx.span().span_context().is_valid())
        .collect();
    let Some(first) = contexts.iter().position(|cx| cx.span().span_context().is_sampled()).or((!contexts.is_empty()).then_some(0)) else {
        return;
    };
    let parent = contexts.remove(first);
    let _ = span.set_parent(parent);
    for cx in contexts {
        span.add_link(cx.span().span_context().clone());
    }
}

/// A span for one consumed batch, named `name` (e.g. `counter.apply`), in the traces of its
/// records ([`adopt_records`]).
pub fn batch_span<'a>(
    name: &'static str,
    topic: &str,
    partition: i32,
    headers: impl IntoIterator<Item = &'a std::collections::BTreeMap<String, Vec<u8>>>,
) -> tracing::Span {
    let span = tracing::info_span!("batch", otel.name = name, messaging.destination.name = topic, messaging.destination.partition.id = partition);
    adopt_records(&span, headers);
    span
}

/// Sets integer attributes (the ids a trace is searched by, e.g. `socialgraph.follower_id`)
/// on the current span: inside a handler, the RPC's.
pub fn annotate(attributes: &[(&'static str, i64)]) {
    let span = tracing::Span::current();
    for (k, v) in attributes {
        span.set_attribute(*k, *v);
    }
}

/// Writes the propagator's fields into a header map, leaving out empty ones: the propagator
/// sets `tracestate` even when the trace state is empty, which W3C Trace Context reads the same
/// as no `tracestate` and which would cost every record one more stored header on the broker.
struct MapInjector<'a>(&'a mut std::collections::BTreeMap<String, String>);

impl Injector for MapInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if !value.is_empty() {
            self.0.insert(key.to_owned(), value);
        }
    }
}

/// The W3C headers of `span`'s context, to put on records and requests: `traceparent`, and
/// `tracestate` only when the trace state holds an entry. Nothing when the span has no valid
/// context.
pub fn inject_headers(span: &tracing::Span, headers: &mut std::collections::BTreeMap<String, String>) {
    TraceContextPropagator::new().inject_context(&span.context(), &mut MapInjector(headers));
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use opentelemetry::Context;
    use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};

    use super::*;

    fn headers_of(state: TraceState) -> BTreeMap<String, String> {
        let span = SpanContext::new(
            TraceId::from(0x0af7_6519_16cd_43dd_8448_eb21_1c80_319c),
            SpanId::from(0xb7ad_6b71_6920_3331),
            TraceFlags::SAMPLED,
            true,
            state,
        );
        let mut headers = BTreeMap::new();
        TraceContextPropagator::new().inject_context(&Context::new().with_remote_span_context(span), &mut MapInjector(&mut headers));
        headers
    }

    #[test]
    fn an_empty_trace_state_puts_no_tracestate_header() {
        let headers = headers_of(TraceState::default());
        assert_eq!(headers.keys().collect::<Vec<_>>(), ["traceparent"]);
        assert_eq!(headers["traceparent"], "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
        let back = TraceContextPropagator::new().extract(&headers.into_iter().collect::<HashMap<_, _>>());
        assert_eq!(back.span().span_context().trace_state().header(), "");
        assert!(back.span().span_context().is_valid());
    }

    #[test]
    fn a_trace_state_with_entries_travels() {
        let state = TraceState::from_key_value([("vendor", "x")]).expect("a valid trace state");
        assert_eq!(headers_of(state)["tracestate"], "vendor=x");
    }
}
