//! counter-svc configuration: defaults < `--config` TOML file < `SG_<SECTION>__<KEY>`
//! environment variables.

use secrecy::SecretString;
use serde::{Deserialize, Serialize};
use socialgraph_events::consumer::ConsumerSettings;
use socialgraph_server::ServerSettings;

/// Everything counter-svc reads.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Listen addresses, timeouts and limits of the gRPC and admin servers.
    pub server: ServerSettings,
    /// Redis holding counters, bitmaps, guards and consumer offsets.
    pub redis: RedisSettings,
    /// Kafka topics and brokers.
    pub kafka: KafkaSettings,
    /// Which partitions this replica consumes and how it fetches.
    pub consumer: ConsumerSettings,
    /// projection-svc, whose edge counts and offsets rebuild the follow counters.
    pub projection: ProjectionSettings,
    /// Self-healing.
    pub counters: CounterSettings,
    /// Admin credentials.
    pub auth: AuthSettings,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            server: ServerSettings::with_ports(50053, 9103),
            redis: RedisSettings::default(),
            kafka: KafkaSettings::default(),
            consumer: ConsumerSettings::default(),
            projection: ProjectionSettings::default(),
            counters: CounterSettings::default(),
            auth: AuthSettings::default(),
        }
    }
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
    /// Longest wait for a connection or a command.
    pub timeout_ms: u64,
}

impl Default for RedisSettings {
    fn default() -> Self {
        Self { url: "redis://127.0.0.1:6379".into(), key_prefix: String::new(), pool_size: 32, timeout_ms: 1000 }
    }
}

/// `[kafka]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaSettings {
    /// Bootstrap brokers, `host:port`.
    pub brokers: Vec<String>,
    /// Topic of relation events (followings/followers).
    pub relation_topic: String,
    /// Topic of content events (posts, entity owners).
    pub content_topic: String,
    /// Topic of like/fav events, produced by this service and consumed by it.
    pub counter_topic: String,
    /// Partitions to create topics with when they do not exist yet.
    pub partitions: i32,
    /// How long one Kafka request is retried before the consumer backs off.
    pub request_deadline_ms: u64,
}

impl Default for KafkaSettings {
    fn default() -> Self {
        Self {
            brokers: vec!["127.0.0.1:9092".into()],
            relation_topic: socialgraph_events::RELATION_TOPIC.into(),
            content_topic: socialgraph_events::CONTENT_TOPIC.into(),
            counter_topic: socialgraph_events::COUNTER_TOPIC.into(),
            partitions: 12,
            request_deadline_ms: 5_000,
        }
    }
}

/// `[projection]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProjectionSettings {
    /// gRPC URL of projection-svc.
    pub url: String,
}

impl Default for ProjectionSettings {
    fn default() -> Self {
        Self { url: "http://127.0.0.1:50052".into() }
    }
}

/// `[counters]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CounterSettings {
    /// A user's counters are compared with the facts at most once per this many seconds, on
    /// read; 0 turns the sampled check off.
    pub check_interval_secs: u64,
    /// How long the relation consumer waits for projection-svc to apply a batch before it
    /// retries the batch (its counts are copied from the projection).
    pub rebuild_wait_ms: u64,
    /// An entity leaves the like/fav relay's index once its outbox is empty and its last
    /// toggle is at least this old.
    pub verify_after_ms: u64,
}

impl Default for CounterSettings {
    fn default() -> Self {
        Self { check_interval_secs: 300, rebuild_wait_ms: 5_000, verify_after_ms: 2_000 }
    }
}

/// `[auth]`
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct AuthSettings {
    /// Bearer token of the admin RPCs (rebuilds); unset refuses them.
    #[serde(skip_serializing)]
    pub admin_token: Option<SecretString>,
}

impl socialgraph_server::cli::ServiceConfig for Config {
    fn server(&self) -> &ServerSettings {
        &self.server
    }
}
