//! The admin HTTP port: `/metrics` (Prometheus text format 0.0.4, with `sg_ready`), `/ready`
//! (200 when ready, else 503) and `/live` (always 200).

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus::{Encoder, Registry, TextEncoder};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::Readiness;

#[derive(Clone)]
struct AdminState {
    registry: Registry,
    readiness: Readiness,
    /// `sg_ready`: 1 while `/ready` answers 200, read at each scrape (what readiness-flapping
    /// alerts count changes of).
    ready: prometheus::IntGauge,
}

async fn metrics(State(s): State<AdminState>) -> impl IntoResponse {
    s.ready.set(i64::from(s.readiness.get()));
    let mut buf = Vec::new();
    let encoder = TextEncoder::new();
    match encoder.encode(&s.registry.gather(), &mut buf) {
        Ok(()) => (StatusCode::OK, [(header::CONTENT_TYPE, encoder.format_type().to_owned())], buf),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, [(header::CONTENT_TYPE, "text/plain".to_owned())], e.to_string().into_bytes()),
    }
}

async fn ready(State(s): State<AdminState>) -> StatusCode {
    if s.readiness.get() { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE }
}

/// Serves the admin endpoints on `listener` until `shutdown` fires.
///
/// # Errors
/// The listener failed, or `registry` already holds `sg_ready`.
pub async fn serve_admin(listener: TcpListener, registry: Registry, readiness: Readiness, shutdown: CancellationToken) -> std::io::Result<()> {
    let ready_gauge =
        prometheus::IntGauge::new("sg_ready", "1 while the service reports ready (/ready answers 200), else 0").map_err(std::io::Error::other)?;
    registry.register(Box::new(ready_gauge.clone())).map_err(std::io::Error::other)?;
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/ready", get(ready))
        .route("/live", get(|| async { StatusCode::OK }))
        .with_state(AdminState { registry, readiness, ready: ready_gauge });
    // TCP_NODELAY on every accepted connection, as on the gRPC port (see `nodelay` there).
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp: &mut tokio::net::TcpStream| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, app).with_graceful_shutdown(async move { shutdown.cancelled().await }).await
}
