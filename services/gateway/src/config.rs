//! gateway configuration: defaults < `--config` TOML file < `SG_<SECTION>__<KEY>` environment
//! variables (e.g. `SG_UPSTREAM__RELATION_URL`, `SG_HTTP__CORS_ALLOWED_ORIGINS='["https://app.example"]'`).

use serde::{Deserialize, Serialize};

/// Everything the gateway reads.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// The HTTP/JSON and admin listeners and their limits.
    pub http: HttpSettings,
    /// The services behind the gateway.
    pub upstream: UpstreamSettings,
}

/// `[http]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpSettings {
    /// HTTP/JSON listen address (routes and `/openapi.json`).
    pub addr: std::net::SocketAddr,
    /// Admin HTTP listen address (`/metrics`, `/ready`, `/live`).
    pub admin_addr: std::net::SocketAddr,
    /// Deadline of one request, passed on as the gRPC deadline; a slower answer is 504.
    pub request_timeout_ms: u64,
    /// Larger request bodies are refused with 413.
    pub max_body_bytes: usize,
    /// Requests whose header names and values add up to more are refused with 431.
    pub max_header_bytes: usize,
    /// Requests in flight; beyond it requests are shed with 503 and `Retry-After: 1`.
    pub concurrency_limit: usize,
    /// How long shutdown waits for in-flight requests.
    pub drain_timeout_ms: u64,
    /// Origins a browser may call the gateway from; `["*"]` allows any; empty sends no CORS
    /// headers (same-origin callers and servers only).
    pub cors_allowed_origins: Vec<String>,
    /// How long a browser may cache a CORS preflight answer.
    pub cors_max_age_secs: u64,
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            addr: ([0, 0, 0, 0], 8080).into(),
            admin_addr: ([0, 0, 0, 0], 9104).into(),
            request_timeout_ms: 10_000,
            max_body_bytes: 1 << 20,
            max_header_bytes: 16 << 10,
            concurrency_limit: 1024,
            drain_timeout_ms: 10_000,
            cors_allowed_origins: Vec::new(),
            cors_max_age_secs: 600,
        }
    }
}

/// `[upstream]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamSettings {
    /// gRPC URL of relation-svc.
    pub relation_url: String,
    /// gRPC URL of projection-svc.
    pub projection_url: String,
    /// gRPC URL of counter-svc.
    pub counter_url: String,
    /// HTTP/2 connections kept to each service, used in turn.
    pub channels: usize,
    /// Longest wait to connect to a service.
    pub connect_timeout_ms: u64,
}

impl Default for UpstreamSettings {
    fn default() -> Self {
        Self {
            relation_url: "http://127.0.0.1:50051".into(),
            projection_url: "http://127.0.0.1:50052".into(),
            counter_url: "http://127.0.0.1:50053".into(),
            channels: 4,
            connect_timeout_ms: 2_000,
        }
    }
}
