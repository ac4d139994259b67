//! counter-svc configuration: defaults < `--config` TOML file < `SG_<SECTION>__<KEY>`
//! environment variables.

use serde::{Deserialize, Serialize};
use socialgraph_events::consumer::ConsumerSettings;
pub use socialgraph_server::{AuthSettings, KafkaSettings, RedisSettings, ServerSettings};

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
    /// message-svc, whose membership states the unread counters copy.
    pub message: MessageSettings,
    /// Self-healing.
    pub counters: CounterSettings,
    /// Admin credentials.
    pub auth: AuthSettings,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            server: ServerSettings::with_ports(50053, 9103),
            redis: RedisSettings::with_pool(32, 1000),
            kafka: KafkaSettings::default(),
            consumer: ConsumerSettings::default(),
            projection: ProjectionSettings::default(),
            message: MessageSettings::default(),
            counters: CounterSettings::default(),
            auth: AuthSettings::default(),
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

/// `[message]`
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MessageSettings {
    /// gRPC URL of message-svc; empty (the default) turns the unread counters off: topic
    /// `kafka.message_topic` is not consumed and GetUnreadCounts answers zero.
    pub url: String,
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

impl socialgraph_server::cli::ServiceConfig for Config {
    fn server(&self) -> &ServerSettings {
        &self.server
    }
}
