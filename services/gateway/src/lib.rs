//! gateway: HTTP/JSON routes for every public RPC of relation-svc, projection-svc and
//! counter-svc, read at start-up from the `google.api.http` annotations of the proto (no route
//! is written by hand), with the OpenAPI document generated from the same annotations at build
//! time and served at `/openapi.json`. JSON follows the proto3 JSON mapping, errors are
//! google.rpc.Status JSON under the standard HTTP mapping of gRPC codes.

pub mod config;
pub mod convert;
pub mod errors;
pub mod handler;
pub mod serve;
pub mod upstream;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use http::{HeaderName, HeaderValue, Method, header};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower_http::cors::{AllowOrigin, CorsLayer};

pub use config::Config;

/// The OpenAPI 3.0 document of every route, generated from the proto when the gateway is built
/// (`build.rs`); `services/gateway/openapi.json` is the checked-in copy.
pub const OPENAPI_JSON: &str = include_str!(concat!(env!("OUT_DIR"), "/openapi.json"));

/// The CORS layer for `origins` (`*` = any), or none when the list is empty.
fn cors(origins: &[String], max_age_secs: u64) -> anyhow::Result<Option<CorsLayer>> {
    if origins.is_empty() {
        return Ok(None);
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        let list: Result<Vec<HeaderValue>, _> = origins.iter().map(|o| HeaderValue::from_str(o)).collect();
        AllowOrigin::list(list.map_err(|e| anyhow::anyhow!("http.cors_allowed_origins: {e}"))?)
    };
    Ok(Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST, Method::PUT, Method::DELETE, Method::PATCH])
            .allow_headers([
                header::CONTENT_TYPE,
                header::AUTHORIZATION,
                HeaderName::from_static("traceparent"),
                HeaderName::from_static("tracestate"),
            ])
            .expose_headers([header::RETRY_AFTER, HeaderName::from_static("traceresponse")])
            .max_age(Duration::from_secs(max_age_secs)),
    ))
}

/// The HTTP application: `/openapi.json` and every route, behind CORS when configured.
/// Checks the configuration first ([`Config::validate`]).
///
/// # Errors
/// The route table or a setting is invalid.
pub fn app(config: &Config, registry: &prometheus::Registry) -> anyhow::Result<Router> {
    config.validate()?;
    let pool = socialgraph_httpapi::pool()?;
    let upstreams = upstream::Upstreams::new(&config.upstream)?;
    let metrics = handler::Metrics::register(registry)?;
    let gateway = Arc::new(handler::Gateway::new(&pool, upstreams, &config.http, metrics)?);
    let mut router = Router::new().fallback(handler::handle).with_state(gateway);
    if let Some(cors) = cors(&config.http.cors_allowed_origins, config.http.cors_max_age_secs)? {
        router = router.layer(cors);
    }
    Ok(router)
}

/// Serves the gateway on `http` and its admin endpoints on `admin` until `shutdown` fires, then
/// stops accepting, clears readiness and lets in-flight requests finish for at most
/// `http.drain_timeout_ms`.
///
/// # Errors
/// A bad setting or route table, or a listener failure.
pub async fn run(config: Config, http: TcpListener, admin: TcpListener, shutdown: CancellationToken) -> anyhow::Result<()> {
    let registry = prometheus::Registry::new();
    let readiness = socialgraph_server::Readiness::default();
    let admin_task = tokio::spawn(socialgraph_server::serve_admin(admin, registry.clone(), readiness.clone(), shutdown.clone()));
    serve_http(&config, http, &registry, readiness, shutdown).await?;
    let limit = Duration::from_millis(config.http.drain_timeout_ms);
    if let Some(served) = socialgraph_server::stop::join_within("admin server", limit, admin_task).await {
        served?;
    }
    Ok(())
}

/// Serves the HTTP/JSON routes alone on `http` (metrics into `registry`; `readiness` set while
/// serving) until `shutdown` fires, then drains as [`run`] does. `socialgraph dev` serves its
/// gateway this way, beside its own admin port.
///
/// # Errors
/// A bad setting or route table, or a listener failure.
pub async fn serve_http(
    config: &Config,
    http: TcpListener,
    registry: &prometheus::Registry,
    readiness: socialgraph_server::Readiness,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let app = app(config, registry)?;
    readiness.set(true);
    let limits = serve::ConnLimits {
        header_read_timeout: Duration::from_millis(config.http.request_timeout_ms),
        max_header_bytes: config.http.max_header_bytes,
        drain: Duration::from_millis(config.http.drain_timeout_ms),
    };
    let cleared = shutdown.clone();
    tokio::spawn(async move {
        cleared.cancelled().await;
        readiness.set(false);
    });
    serve::serve(http, app, limits, shutdown).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_checked_in_openapi_document_matches_the_proto() {
        let checked_in = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.json")).unwrap_or_default();
        assert!(
            checked_in == super::OPENAPI_JSON,
            "services/gateway/openapi.json differs from the document generated from proto/: run `make openapi` and commit it"
        );
    }
}
