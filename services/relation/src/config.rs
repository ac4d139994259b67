//! relation-svc configuration: defaults < `--config` TOML file < `SG_<SECTION>__<KEY>`
//! environment variables (e.g. `SG_DATABASE__URL`, `SG_LIMITS__FOLLOWING_CAP`).

use serde::{Deserialize, Serialize};
pub use socialgraph_server::{AuthSettings, CacheSettings, DatabaseSettings, KafkaSettings, RedisSettings, ServerSettings};

/// Everything relation-svc reads.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Listen addresses, timeouts and limits of the gRPC and admin servers.
    pub server: ServerSettings,
    /// The SQL database holding `following` and `outbox`.
    pub database: DatabaseSettings,
    /// Redis for the follow rate limit.
    pub redis: RedisSettings,
    /// Kafka for the outbox relay.
    pub kafka: KafkaSettings,
    /// Business limits.
    pub limits: Limits,
    /// Admin RPC credentials and page-token signing.
    pub auth: AuthSettings,
    /// The cache Redis: following lists (read, filled, and written through after each change).
    pub cache: CacheSettings,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            server: ServerSettings::with_ports(50051, 9101),
            database: DatabaseSettings::with_pool(32),
            redis: RedisSettings::with_pool(16, 250),
            kafka: KafkaSettings::default(),
            limits: Limits::default(),
            auth: AuthSettings::default(),
            cache: CacheSettings::default(),
        }
    }
}

/// What a follow does when Redis, which holds the rate limit, cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnRedisError {
    /// Allow the follow unlimited (the following cap still applies); counted in
    /// `sg_rate_limit_bypassed_total` and logged.
    Open,
    /// Refuse the follow with UNAVAILABLE (reason RATE_LIMITER_UNAVAILABLE).
    Closed,
}

/// `[limits]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Most accounts one user may follow (Follow beyond it: FAILED_PRECONDITION).
    pub following_cap: i64,
    /// Follow token bucket: capacity.
    pub follow_burst: u32,
    /// Follow token bucket: tokens added per day.
    pub follow_refill_per_day: u32,
    /// Behaviour when Redis is unreachable: `open` or `closed`.
    pub on_redis_error: OnRedisError,
    /// Edges written per transaction by ImportFollows.
    pub import_batch_size: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self { following_cap: 5000, follow_burst: 100, follow_refill_per_day: 400, on_redis_error: OnRedisError::Open, import_batch_size: 1000 }
    }
}

impl socialgraph_server::cli::ServiceConfig for Config {
    fn server(&self) -> &ServerSettings {
        &self.server
    }
}
