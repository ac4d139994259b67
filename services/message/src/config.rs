//! message-svc configuration: defaults < `--config` TOML file < `SG_<SECTION>__<KEY>`
//! environment variables (e.g. `SG_DATABASE__URL`, `SG_MESSAGES__MAX_BODY_BYTES`).

use serde::{Deserialize, Serialize};
pub use socialgraph_events::consumer::ConsumerSettings;
pub use socialgraph_server::{AuthSettings, DatabaseSettings, KafkaSettings, ServerSettings};

/// Everything message-svc reads.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Listen addresses, timeouts and limits of the gRPC and admin servers.
    pub server: ServerSettings,
    /// The SQL database holding `conversation`, `conversation_member`, `message` and `outbox`.
    pub database: DatabaseSettings,
    /// Kafka for the outbox relay (topic `kafka.message_topic`) and the account events it
    /// consumes (`kafka.account_topic`).
    pub kafka: KafkaSettings,
    /// Which partitions of `kafka.account_topic` this replica consumes, and how it polls.
    pub consumer: ConsumerSettings,
    /// Sizes and caps.
    pub messages: MessageLimits,
    /// Page-token signing.
    pub auth: AuthSettings,
    /// Deprecated and ignored: blocks come from relation-svc's account events now.
    pub relation: RelationSettings,
    /// Live delivery (Subscribe).
    pub subscribe: SubscribeSettings,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            server: ServerSettings::with_ports(50054, 9105),
            database: DatabaseSettings { consumer_name: "message".into(), ..DatabaseSettings::with_pool(32) },
            kafka: KafkaSettings::default(),
            consumer: ConsumerSettings::default(),
            messages: MessageLimits::default(),
            auth: AuthSettings::default(),
            relation: RelationSettings::default(),
            subscribe: SubscribeSettings::default(),
        }
    }
}

/// `[messages]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MessageLimits {
    /// Largest message body, bytes (SendMessage beyond it: INVALID_ARGUMENT).
    pub max_body_bytes: usize,
    /// Most active members of one group, its creator included (beyond it:
    /// FAILED_PRECONDITION, reason GROUP_MEMBER_LIMIT).
    pub max_group_members: i32,
}

impl Default for MessageLimits {
    fn default() -> Self {
        Self { max_body_bytes: 16 * 1024, max_group_members: 1000 }
    }
}

/// `[relation]`: deprecated, read by no code. message-svc asked relation-svc about blocks up to
/// 0.1.0; it keeps its own copy from the account events now. Accepted for one more release.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RelationSettings {
    /// Was relation-svc's gRPC URL; ignored (a warning at start when set).
    pub url: String,
}

impl RelationSettings {
    /// Logs a deprecation warning when `relation.url` is set.
    pub fn warn_if_set(&self) {
        if !self.url.is_empty() {
            tracing::warn!(
                key = "relation.url",
                "relation.url (SG_RELATION__URL) is deprecated and ignored: message-svc keeps its own copy of blocks from the account events; remove it"
            );
        }
    }
}

/// `[subscribe]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SubscribeSettings {
    /// Longest sleep, ms, between empty fetches of a message-topic partition that had records in
    /// the last 10 s: the delivery delay of a message sent through another replica.
    pub idle_poll_ms: u64,
    /// Sleep, ms, between empty fetches of a partition quiet for 10 s: the delay of the first
    /// message after a quiet time (and what an idle instance costs the broker).
    pub quiet_poll_ms: u64,
    /// Records buffered per stream; a stream further behind catches up from the log.
    pub buffer: usize,
    /// Most records of the topic a resume may have to read behind its token
    /// (FAILED_PRECONDITION, reason CATCH_UP_TOO_LONG, beyond).
    pub max_catch_up_records: u64,
}

impl Default for SubscribeSettings {
    fn default() -> Self {
        Self { idle_poll_ms: 20, quiet_poll_ms: 200, buffer: 4096, max_catch_up_records: 200_000 }
    }
}

impl SubscribeSettings {
    /// The hub's part.
    pub fn hub(&self) -> crate::live::HubSettings {
        crate::live::HubSettings { idle_poll_ms: self.idle_poll_ms.max(1), quiet_poll_ms: self.quiet_poll_ms.max(1), buffer: self.buffer }
    }
}

impl socialgraph_server::cli::ServiceConfig for Config {
    fn server(&self) -> &ServerSettings {
        &self.server
    }
}
