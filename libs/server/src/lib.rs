//! Shared tonic server assembly for every socialgraph service: tower layers (per-request
//! timeout, concurrency limit, load shedding), gRPC-Web, `grpc.health.v1`, server reflection, the admin
//! HTTP port (`/metrics` in Prometheus text, `/ready`, `/live`), layered configuration, and
//! graceful shutdown on SIGTERM.

mod admin;
pub mod auth;
pub mod cache_drain;
mod cache_fill;
pub mod cli;
mod config;
mod error;
pub mod paging;
pub mod red;
pub mod relay;
pub mod stop;
pub mod timeout;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

pub use admin::serve_admin;
pub use cache_fill::spawn_fill;
pub use config::{
    AuthSettings, CacheSettings, DEFAULT_FILL_ROWS_PER_SEC, DatabaseSettings, KafkaSettings, RedisSettings, ServerSettings, load_config,
};
pub use error::{
    ApiError, ApiResult, DOMAIN, REASON_BROKER, REASON_DATABASE, REASON_PEER, REASON_RATE_LIMITER, REASON_REDIS, db_error, reason_of, shared_db_error,
};
pub use red::RpcMetrics;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::service::Routes;
use tonic_health::ServingStatus;

/// The global allocator of every process that links this crate (each service, the embedded
/// mode, the CLI, the gateway, the tests and the bench): mimalloc. Under BatchGetUserCounters(100)
/// glibc's malloc, free and realloc took 19 % of counter-svc's CPU, mimalloc's 9 % (README,
/// *Performance*).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The cache metrics relation-svc and projection-svc both export ([`cache_counters`]).
#[derive(Clone)]
pub struct CacheCounters {
    /// `sg_cache_requests_total{cache,rpc,result}`: reads by result (local, hit, miss,
    /// past_window, partial, uncached (a restriction summary being filled elsewhere or too
    /// long), fallback).
    pub requests: prometheus::IntCounterVec,
    /// `sg_cache_fills_total{cache,result}`: fills by result (cached, raced, too_long, behind,
    /// skipped, failed; for a miss that started none: deferred, busy).
    pub fills: prometheus::IntCounterVec,
    /// `sg_cache_fills_pending{cache}`: following-list and follower-window fills running or
    /// waiting for a slot in this instance (0 when a warm-up is over).
    pub pending: prometheus::IntGaugeVec,
}

/// The cache metrics relation-svc and projection-svc both export ([`CacheCounters`]),
/// registered in `registry`.
///
/// # Errors
/// A metric of the same name is already registered.
pub fn cache_counters(registry: &prometheus::Registry) -> prometheus::Result<CacheCounters> {
    let requests = prometheus::IntCounterVec::new(
        prometheus::Opts::new(
            "sg_cache_requests_total",
            "Cache reads by cache, RPC and result (local, hit, miss, past_window, partial, uncached, fallback)",
        ),
        &["cache", "rpc", "result"],
    )?;
    let fills = prometheus::IntCounterVec::new(
        prometheus::Opts::new(
            "sg_cache_fills_total",
            "List-cache fills from the database by cache and result (cached, raced, too_long, behind, skipped, failed)",
        ),
        &["cache", "result"],
    )?;
    let pending = prometheus::IntGaugeVec::new(
        prometheus::Opts::new("sg_cache_fills_pending", "List-cache fills running or waiting for a slot in this instance, by cache"),
        &["cache"],
    )?;
    registry.register(Box::new(requests.clone()))?;
    registry.register(Box::new(fills.clone()))?;
    registry.register(Box::new(pending.clone()))?;
    Ok(CacheCounters { requests, fills, pending })
}

/// Whether the service should receive traffic (`/ready` answers 200 only while set). Shared by
/// the server (cleared at shutdown) and the background loops (set once they run).
#[derive(Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// Marks ready or not.
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::SeqCst);
    }
    /// True when ready.
    pub fn get(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// A cancellation token that fires on SIGTERM or Ctrl-C.
pub fn shutdown_on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut term) => tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} },
                Err(_) => {
                    let _ = ctrl_c.await;
                }
            }
        }
        #[cfg(not(unix))]
        let _ = ctrl_c.await;
        tracing::info!("shutdown signal received");
        t.cancel();
    });
    token
}

/// Binds a TCP listener on `addr` (port 0 picks a free port).
///
/// # Errors
/// The address is in use or not local; the error names the address.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await.map_err(|e| std::io::Error::new(e.kind(), format!("binding {addr}: {e}")))
}

/// The accepted connections of `listener` with TCP_NODELAY set: without it a response larger
/// than one segment waits for the client's delayed ACK (~40 ms on Linux) before its tail is
/// sent (Nagle's algorithm). A socket whose option cannot be set is served as it is.
fn nodelay(listener: TcpListener) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    use tokio_stream::StreamExt;
    TcpListenerStream::new(listener).map(|accepted| {
        accepted.inspect(|tcp| {
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!(error = %e, "TCP_NODELAY not set");
            }
        })
    })
}

/// The span of one RPC, around the handler: named `<Service>.<Method>` (e.g.
/// `RelationService.Follow`) with OpenTelemetry's `rpc.system`, `rpc.service` and `rpc.method`,
/// and the caller's W3C `traceparent` as its parent. Handlers, and the events they write, run
/// inside it.
pub fn rpc_span(req: &http::Request<()>) -> tracing::Span {
    let path = req.uri().path().trim_start_matches('/');
    let (service, method) = path.split_once('/').unwrap_or((path, ""));
    let short = service.rsplit('.').next().unwrap_or(service);
    let span = tracing::info_span!(
        "rpc",
        otel.name = format!("{short}.{method}"),
        otel.kind = "server",
        rpc.system = "grpc",
        rpc.service = service,
        rpc.method = method,
    );
    let metadata = tonic::metadata::MetadataMap::from_headers(req.headers().clone());
    socialgraph_telemetry::set_parent_from_metadata(&span, &metadata);
    span
}

/// How one gRPC server is served.
pub struct GrpcServing<'a> {
    /// Full gRPC names reported SERVING by the health service (and NOT_SERVING at shutdown).
    pub service_names: &'a [&'a str],
    /// Method paths (`/package.Service/Method`) exempt from the request timeout (bulk imports,
    /// scans, rebuilds).
    pub long_running: &'a [&'a str],
    /// Limits and timeouts.
    pub settings: &'a ServerSettings,
    /// Cleared when shutdown starts.
    pub readiness: Readiness,
    /// Where every RPC is counted ([`red`]).
    pub metrics: RpcMetrics,
}

impl<'a> GrpcServing<'a> {
    /// The serving of a process's one gRPC server, its RPC metrics registered in `registry`.
    ///
    /// # Errors
    /// The RPC metrics are already registered there.
    pub fn new(
        service_names: &'a [&'a str],
        long_running: &'a [&'a str],
        settings: &'a ServerSettings,
        readiness: Readiness,
        registry: &prometheus::Registry,
    ) -> prometheus::Result<Self> {
        Ok(Self { service_names, long_running, settings, readiness, metrics: RpcMetrics::register(registry)? })
    }
}

/// Serves `routes` (the service's gRPC servers) plus health and reflection on `listener` until
/// `shutdown` fires, then: health NOT_SERVING and readiness cleared, no new connections,
/// in-flight RPCs drained for at most `settings.drain_timeout_ms`. Every RPC is counted in
/// `serving.metrics`.
///
/// # Errors
/// The transport failed or the reflection descriptors are invalid.
pub async fn serve_grpc(routes: Routes, listener: TcpListener, serving: GrpcServing<'_>, shutdown: CancellationToken) -> anyhow::Result<()> {
    let GrpcServing { service_names, long_running, settings, readiness, metrics } = serving;
    let (reporter, health) = tonic_health::server::health_reporter();
    for name in service_names.iter().chain(std::iter::once(&"")) {
        reporter.set_service_status(*name, ServingStatus::Serving).await;
    }
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(socialgraph_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(socialgraph_proto::ERROR_DETAILS_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(socialgraph_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(socialgraph_proto::ERROR_DETAILS_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;
    let routes = routes.add_service(health).add_service(reflection_v1).add_service(reflection_v1alpha);

    let names: Vec<String> = service_names.iter().map(|s| (*s).to_owned()).collect();
    let drain_started = CancellationToken::new();
    let signal = {
        let (shutdown, drain_started) = (shutdown.clone(), drain_started.clone());
        async move {
            shutdown.cancelled().await;
            readiness.set(false);
            for name in names.iter().map(String::as_str).chain(std::iter::once("")) {
                reporter.set_service_status(name, ServingStatus::NotServing).await;
            }
            drain_started.cancel();
        }
    };
    // gRPC-Web (HTTP/1.1 and HTTP/2, `application/grpc-web[+proto]` and `-text`) beside gRPC,
    // so a browser client can call the services directly; outermost, so that every answer,
    // the limit and timeout layers' too, is translated back for a gRPC-Web caller.
    let server = tonic::transport::Server::builder()
        .accept_http1(true)
        .layer(tonic_web::GrpcWebLayer::new())
        .layer(red::RpcMetricsLayer(metrics))
        .trace_fn(rpc_span)
        .load_shed(true)
        .concurrency_limit_per_connection(settings.concurrency_limit_per_connection)
        .layer(tower::limit::GlobalConcurrencyLimitLayer::new(settings.concurrency_limit))
        .layer(timeout::RequestTimeoutLayer::new(Duration::from_millis(settings.request_timeout_ms), long_running))
        .add_routes(routes)
        .serve_with_incoming_shutdown(nodelay(listener), signal);
    let drain = Duration::from_millis(settings.drain_timeout_ms);
    tokio::select! {
        r = server => r.map_err(Into::into),
        _ = async { drain_started.cancelled().await; tokio::time::sleep(drain).await } => {
            tracing::warn!(drain_ms = settings.drain_timeout_ms, "drain timed out; closing remaining RPCs");
            Ok(())
        }
    }
}
