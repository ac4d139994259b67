//! Layered configuration: defaults < TOML file (`--config`) < environment
//! `SG_<SECTION>__<KEY>` (e.g. `SG_DATABASE__URL`). Unknown keys fail start-up, naming the key.

use std::path::Path;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize, de::DeserializeOwned};

/// Loads a `T` from its defaults, the optional TOML `file`, then `SG_*` environment variables.
///
/// # Errors
/// A malformed file, an unknown key, or a value of the wrong type (the message names the key).
pub fn load_config<T: Serialize + DeserializeOwned + Default>(file: Option<&Path>) -> Result<T, Box<figment::Error>> {
    let mut fig = Figment::from(Serialized::defaults(T::default()));
    if let Some(f) = file {
        fig = fig.merge(Toml::file_exact(f));
    }
    // SG_CONFIG names the file, SG_LOG_FORMAT the log format and SG_TRACE_FILTER the span
    // filter: none is a config key.
    fig.merge(Env::prefixed("SG_").split("__").ignore(&["log_format", "config", "trace_filter"])).extract().map_err(Box::new)
}

/// The `[server]` section every service has.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerSettings {
    /// gRPC listen address.
    pub grpc_addr: std::net::SocketAddr,
    /// Admin HTTP listen address (`/metrics`, `/ready`, `/live`).
    pub admin_addr: std::net::SocketAddr,
    /// Per-request deadline; longer RPCs end with CANCELLED.
    pub request_timeout_ms: u64,
    /// RPCs in flight across all connections; beyond it requests are shed with
    /// RESOURCE_EXHAUSTED.
    pub concurrency_limit: usize,
    /// RPCs in flight on one connection.
    pub concurrency_limit_per_connection: usize,
    /// How long shutdown waits for in-flight RPCs.
    pub drain_timeout_ms: u64,
}

impl ServerSettings {
    /// Defaults with the given ports on 0.0.0.0.
    pub fn with_ports(grpc: u16, admin: u16) -> Self {
        Self {
            grpc_addr: ([0, 0, 0, 0], grpc).into(),
            admin_addr: ([0, 0, 0, 0], admin).into(),
            request_timeout_ms: 10_000,
            concurrency_limit: 1024,
            concurrency_limit_per_connection: 256,
            drain_timeout_ms: 10_000,
        }
    }
}

impl Default for ServerSettings {
    fn default() -> Self {
        Self::with_ports(50051, 9101)
    }
}
