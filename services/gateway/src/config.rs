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
    /// gRPC URL of message-svc; empty: no message-svc behind the gateway (its routes answer 501).
    pub message_url: String,
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
            message_url: "http://127.0.0.1:50054".into(),
            channels: 4,
            connect_timeout_ms: 2_000,
        }
    }
}

/// Most requests in flight `http.concurrency_limit` may allow.
pub const MAX_CONCURRENCY: usize = 1 << 20;
/// Most connections per service `upstream.channels` may keep.
pub const MAX_CHANNELS: usize = 64;

/// An upstream URL: `http://host[:port]` and nothing else.
fn check_upstream(key: &str, value: &str) -> anyhow::Result<()> {
    let url = url::Url::parse(value).map_err(|e| anyhow::anyhow!("{key}: {value:?} is not a URL: {e}"))?;
    anyhow::ensure!(
        url.scheme() == "http",
        "{key}: {value:?}: only http:// is supported (the services speak plaintext gRPC; TLS between them belongs to the network or a sidecar)"
    );
    anyhow::ensure!(url.host_str().is_some_and(|h| !h.is_empty()), "{key}: {value:?} names no host");
    anyhow::ensure!(url.username().is_empty() && url.password().is_none(), "{key}: {value:?}: credentials in the URL are not used");
    anyhow::ensure!(
        url.path() == "/" && url.query().is_none() && url.fragment().is_none(),
        "{key}: {value:?}: give scheme, host and port only (no path, query or fragment)"
    );
    Ok(())
}

/// A CORS origin exactly as browsers send it: `scheme://host[:port]`, lower case, no path.
fn check_origin(value: &str) -> anyhow::Result<()> {
    let key = "http.cors_allowed_origins";
    let url = url::Url::parse(value).map_err(|e| anyhow::anyhow!("{key}: {value:?} is not an origin (scheme://host[:port]): {e}"))?;
    let origin = url.origin().ascii_serialization();
    anyhow::ensure!(origin == value, "{key}: {value:?} is not an origin as a browser sends it (did you mean {origin:?}?)");
    Ok(())
}

impl Config {
    /// Checks what the types cannot: URLs, origins and upper bounds.
    ///
    /// # Errors
    /// The first bad setting, named by its key.
    pub fn validate(&self) -> anyhow::Result<()> {
        check_upstream("upstream.relation_url", &self.upstream.relation_url)?;
        check_upstream("upstream.projection_url", &self.upstream.projection_url)?;
        check_upstream("upstream.counter_url", &self.upstream.counter_url)?;
        if !self.upstream.message_url.is_empty() {
            check_upstream("upstream.message_url", &self.upstream.message_url)?;
        }
        let origins = &self.http.cors_allowed_origins;
        if origins.iter().any(|o| o == "*") {
            anyhow::ensure!(origins.len() == 1, "http.cors_allowed_origins: \"*\" allows every origin and stands alone");
        } else {
            origins.iter().try_for_each(|o| check_origin(o))?;
        }
        anyhow::ensure!(self.http.concurrency_limit <= MAX_CONCURRENCY, "http.concurrency_limit must be at most {MAX_CONCURRENCY}");
        anyhow::ensure!(self.upstream.channels <= MAX_CHANNELS, "upstream.channels must be at most {MAX_CHANNELS}");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(change: impl FnOnce(&mut Config)) -> String {
        let mut c = Config::default();
        change(&mut c);
        c.validate().map(|()| String::new()).unwrap_or_else(|e| e.to_string())
    }

    #[test]
    fn bad_urls_origins_and_bounds_are_refused_naming_the_key() {
        assert_eq!(refused(|_| {}), "");
        assert_eq!(refused(|c| c.http.cors_allowed_origins = vec!["https://app.example.com".into(), "http://localhost:3000".into()]), "");
        for url in
            ["127.0.0.1:50051", "https://127.0.0.1:50051", "ftp://x:1", "http://127.0.0.1:99999", "http://u:p@x:1", "http://x:1/path", "http://x:1?q"]
        {
            assert!(refused(|c| c.upstream.relation_url = url.into()).starts_with("upstream.relation_url"), "{url}");
        }
        for origin in ["not an origin", "a.example", "http://a.example/", "*.example.com", "", "HTTP://A.EXAMPLE"] {
            assert!(refused(|c| c.http.cors_allowed_origins = vec![origin.into()]).starts_with("http.cors_allowed_origins"), "{origin}");
        }
        assert!(refused(|c| c.http.cors_allowed_origins = vec!["*".into(), "http://a.example".into()]).starts_with("http.cors"));
        assert!(refused(|c| c.http.concurrency_limit = usize::MAX >> 2).starts_with("http.concurrency_limit"));
        assert!(refused(|c| c.upstream.channels = 100_000).starts_with("upstream.channels"));
    }
}
