//! The event flow of socialgraph: one log interface ([`EventLog`]) over Kafka and over the
//! outbox table, the partition consumer every service and the embedded mode run on it, Kafka's
//! default partitioner, record headers, topic set-up with rskafka, and the outbox relay that
//! publishes committed outbox rows in order.

pub mod consumer;
pub mod headers;
pub mod kafka;
pub mod log;
pub mod outbox_log;
pub mod partition;
pub mod relay;

pub use kafka::{KafkaError, KafkaLog, KafkaSink, KeyedRecord, Produced};
pub use log::{EventLog, FetchLimits, Fetched};
pub use outbox_log::OutboxLog;
pub use partition::{kafka_partition, user_key};
pub use relay::{EventSink, PublishOutcome, RelayConfig, RelayMetrics, run_relay};

/// Topic of follow-edge changes (`RelationEvent`, key = follower_id).
pub const RELATION_TOPIC: &str = "sg.relation.v1";
/// Topic of like/fav changes (`ActionEvent`, key = `entity_type:entity_id`).
pub const COUNTER_TOPIC: &str = "sg.counter.v1";
/// Topic of content lifecycle events (`ContentEvent`, key = author_id).
pub const CONTENT_TOPIC: &str = "sg.content.v1";
/// Topic of conversation events (`MessageEvent`, key = conversation_id), produced by message-svc.
pub const MESSAGE_TOPIC: &str = "sg.message.v1";
/// Topic of account lifecycle changes (`AccountEvent`, key = user_id), produced by relation-svc.
pub const ACCOUNT_TOPIC: &str = "sg.account.v1";
/// Topic of follow counts after each projection batch (`EdgeCountEvent`, key = user_id),
/// produced by projection-svc through its outbox.
pub const EDGE_COUNT_TOPIC: &str = "sg.edge_count.v1";
