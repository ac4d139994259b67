//! relation-svc configuration: defaults < `--config` TOML file < `SG_<SECTION>__<KEY>`
//! environment variables (e.g. `SG_DATABASE__URL`, `SG_LIMITS__FOLLOWING_CAP`).

use secrecy::SecretString;
use serde::{Deserialize, Serialize};
use socialgraph_server::ServerSettings;

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
}

impl Default for Config {
    fn default() -> Self {
        Self {
            server: ServerSettings::with_ports(50051, 9101),
            database: DatabaseSettings::default(),
            redis: RedisSettings::default(),
            kafka: KafkaSettings::default(),
            limits: Limits::default(),
            auth: AuthSettings::default(),
        }
    }
}

/// `[database]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseSettings {
    /// `postgres://…`, `mysql://…` or `sqlite://file?mode=rwc`.
    pub url: String,
    /// Pool size.
    pub max_connections: u32,
    /// Run pending migrations at start.
    pub migrate_on_start: bool,
}

impl Default for DatabaseSettings {
    fn default() -> Self {
        Self { url: "postgres://postgres@127.0.0.1:5432/socialgraph".into(), max_connections: 32, migrate_on_start: false }
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

/// `[redis]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RedisSettings {
    /// `redis://host:port/db`.
    pub url: String,
    /// Prefix of every key (empty in production).
    pub key_prefix: String,
    /// Pool size.
    pub pool_size: u32,
    /// Longest wait for a connection or a script.
    pub timeout_ms: u64,
}

impl Default for RedisSettings {
    fn default() -> Self {
        Self { url: "redis://127.0.0.1:6379".into(), key_prefix: String::new(), pool_size: 16, timeout_ms: 250 }
    }
}

/// `[kafka]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaSettings {
    /// Bootstrap brokers, `host:port`.
    pub brokers: Vec<String>,
    /// Topic of relation events.
    pub relation_topic: String,
    /// Partitions of topics the relay creates.
    pub partitions: i32,
    /// How long one Kafka request is retried before the relay backs off.
    pub request_deadline_ms: u64,
    /// Outbox rows per relay round.
    pub relay_batch_size: usize,
    /// How often an idle relay looks for rows committed by other replicas.
    pub relay_idle_poll_ms: u64,
    /// Run the outbox relay in this process.
    pub relay_enabled: bool,
}

impl Default for KafkaSettings {
    fn default() -> Self {
        Self {
            brokers: vec!["127.0.0.1:9092".into()],
            relation_topic: socialgraph_events::RELATION_TOPIC.into(),
            partitions: 12,
            request_deadline_ms: 5_000,
            relay_batch_size: 1000,
            relay_idle_poll_ms: 100,
            relay_enabled: true,
        }
    }
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

/// `[auth]`
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct AuthSettings {
    /// Bearer token of the admin RPCs (ImportFollows, ScanEdges); unset refuses them.
    #[serde(skip_serializing)]
    pub admin_token: Option<SecretString>,
    /// HMAC key of page tokens; all replicas must share it. Unset: a fixed development key
    /// (a warning is logged), fine for one replica, forgeable by anyone who reads the source.
    #[serde(skip_serializing)]
    pub page_token_secret: Option<SecretString>,
}

impl socialgraph_server::cli::ServiceConfig for Config {
    fn server(&self) -> &ServerSettings {
        &self.server
    }
}
