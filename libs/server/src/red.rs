//! RED metrics of every RPC (rate, errors, duration) under the names of the grpc-ecosystem
//! Prometheus middleware (go-grpc-prometheus, also used by java-grpc-prometheus), so existing
//! dashboards and alerts read them unchanged:
//! - `grpc_server_started_total{grpc_type,grpc_service,grpc_method}`: RPCs started;
//! - `grpc_server_handled_total{grpc_type,grpc_service,grpc_method,grpc_code}`: RPCs finished, by
//!   status code name (`OK`, `InvalidArgument`, `ResourceExhausted`, …);
//! - `grpc_server_handling_seconds{grpc_type,grpc_service,grpc_method}`: histogram of the time
//!   from the request to the status, buckets 0.25 ms to 10 s.
//!
//! `grpc_type` is `unary`, `client_stream`, `server_stream` or `bidi_stream`. A status travels
//! in the response headers (an error before any message) or in the trailers; a response that
//! ends without either (the client went away) counts as `Canceled`.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use http_body::{Body, Frame};
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

/// Buckets of `grpc_server_handling_seconds`: sub-millisecond reads to multi-second bulk calls.
const BUCKETS: &[f64] = &[0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// The three RPC metrics, registered once per process and shared by its servers.
#[derive(Clone)]
pub struct RpcMetrics {
    started: IntCounterVec,
    handled: IntCounterVec,
    seconds: HistogramVec,
    /// `grpc_type` of every RPC of the socialgraph, health and reflection services, by path.
    types: Arc<HashMap<String, &'static str>>,
}

fn grpc_type(client_streaming: bool, server_streaming: bool) -> &'static str {
    match (client_streaming, server_streaming) {
        (false, false) => "unary",
        (true, false) => "client_stream",
        (false, true) => "server_stream",
        (true, true) => "bidi_stream",
    }
}

impl RpcMetrics {
    /// Registers the metrics in `registry`.
    ///
    /// # Errors
    /// A metric of the same name is already registered there.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let labels = ["grpc_type", "grpc_service", "grpc_method"];
        let started = IntCounterVec::new(Opts::new("grpc_server_started_total", "Total number of RPCs started on the server."), &labels)?;
        let handled = IntCounterVec::new(
            Opts::new("grpc_server_handled_total", "Total number of RPCs completed on the server, regardless of success or failure."),
            &["grpc_type", "grpc_service", "grpc_method", "grpc_code"],
        )?;
        let seconds = HistogramVec::new(
            HistogramOpts::new(
                "grpc_server_handling_seconds",
                "Histogram of response latency (seconds) of gRPC that had been application-level handled by the server.",
            )
            .buckets(BUCKETS.to_vec()),
            &labels,
        )?;
        registry.register(Box::new(started.clone()))?;
        registry.register(Box::new(handled.clone()))?;
        registry.register(Box::new(seconds.clone()))?;
        let mut types = HashMap::new();
        if let Ok(pool) = prost_reflect::DescriptorPool::decode(socialgraph_proto::FILE_DESCRIPTOR_SET) {
            for service in pool.services() {
                for m in service.methods() {
                    types.insert(format!("/{}/{}", service.full_name(), m.name()), grpc_type(m.is_client_streaming(), m.is_server_streaming()));
                }
            }
        }
        types.insert("/grpc.health.v1.Health/Watch".into(), "server_stream");
        for version in ["v1", "v1alpha"] {
            types.insert(format!("/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo"), "bidi_stream");
        }
        Ok(Self { started, handled, seconds, types: Arc::new(types) })
    }

    /// Starts the count of one RPC at `path` (`/package.Service/Method`).
    fn start(&self, path: &str) -> Call {
        let (service, method) = path.trim_start_matches('/').split_once('/').unwrap_or((path, ""));
        let kind = self.types.get(path).copied().unwrap_or("unary");
        let labels = [kind.to_owned(), service.to_owned(), method.to_owned()];
        self.started.with_label_values(&labels).inc();
        Call { metrics: self.clone(), labels, started: Instant::now(), done: false }
    }
}

/// The gRPC status code's name as go-grpc-prometheus writes it (Go's `codes.Code` names: tonic's
/// but for `OK` and `Canceled`).
fn code_name(code: tonic::Code) -> String {
    match code {
        tonic::Code::Ok => "OK".into(),
        tonic::Code::Cancelled => "Canceled".into(),
        other => format!("{other:?}"),
    }
}

fn status_of(headers: &http::HeaderMap) -> Option<tonic::Code> {
    headers.get("grpc-status").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<i32>().ok()).map(tonic::Code::from_i32)
}

/// One RPC being counted; counts `Canceled` if dropped before its status was seen.
struct Call {
    metrics: RpcMetrics,
    labels: [String; 3],
    started: Instant,
    done: bool,
}

impl Call {
    fn finish(&mut self, code: tonic::Code) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        let [kind, service, method] = &self.labels;
        self.metrics.handled.with_label_values(&[kind.as_str(), service.as_str(), method.as_str(), code_name(code).as_str()]).inc();
        self.metrics.seconds.with_label_values(&[kind.as_str(), service.as_str(), method.as_str()]).observe(self.started.elapsed().as_secs_f64());
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        self.finish(tonic::Code::Cancelled);
    }
}

/// A response body that records the RPC when its trailers (or its end) go by.
struct Metered {
    inner: tonic::body::Body,
    call: Call,
}

impl Body for Metered {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(code) = frame.trailers_ref().and_then(status_of) {
                    self.call.finish(code);
                }
            }
            Poll::Ready(Some(Err(_))) => self.call.finish(tonic::Code::Internal),
            Poll::Ready(None) => self.call.finish(tonic::Code::Unknown),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The tower layer that counts every RPC of a server into [`RpcMetrics`].
#[derive(Clone)]
pub struct RpcMetricsLayer(pub RpcMetrics);

impl<S> tower::Layer<S> for RpcMetricsLayer {
    type Service = RpcMetricsService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        RpcMetricsService { inner, metrics: self.0.clone() }
    }
}

/// See [`RpcMetricsLayer`].
#[derive(Clone)]
pub struct RpcMetricsService<S> {
    inner: S,
    metrics: RpcMetrics,
}

impl<S, B> tower::Service<http::Request<B>> for RpcMetricsService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let mut call = self.metrics.start(req.uri().path());
        let future = self.inner.call(req);
        Box::pin(async move {
            let response = future.await?;
            // An error before any message comes as a trailers-only response: status in headers.
            if let Some(code) = status_of(response.headers()) {
                call.finish(code);
            }
            Ok(response.map(|inner| tonic::body::Body::new(Metered { inner, call })))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_named_as_the_grpc_ecosystem_names_them_and_types_come_from_the_descriptors() {
        assert_eq!(code_name(tonic::Code::Ok), "OK");
        assert_eq!(code_name(tonic::Code::InvalidArgument), "InvalidArgument");
        assert_eq!(code_name(tonic::Code::ResourceExhausted), "ResourceExhausted");
        assert_eq!(code_name(tonic::Code::Cancelled), "Canceled");
        let m = RpcMetrics::register(&Registry::new()).expect("registers");
        assert_eq!(m.types.get("/socialgraph.relation.v1.RelationService/Follow"), Some(&"unary"));
        assert_eq!(m.types.get("/socialgraph.relation.v1.RelationService/ImportFollows"), Some(&"client_stream"));
        assert_eq!(m.types.get("/socialgraph.relation.v1.RelationService/ScanEdges"), Some(&"server_stream"));
        let mut call = m.start("/socialgraph.relation.v1.RelationService/Follow");
        call.finish(tonic::Code::InvalidArgument);
        drop(call);
        let handled = m.handled.with_label_values(&["unary", "socialgraph.relation.v1.RelationService", "Follow", "InvalidArgument"]).get();
        let cancelled = m.handled.with_label_values(&["unary", "socialgraph.relation.v1.RelationService", "Follow", "Canceled"]).get();
        assert_eq!((handled, cancelled), (1, 0), "a finished call is counted once, not again when dropped");
    }
}
