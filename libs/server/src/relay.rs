//! The outbox relay task of the services that own an outbox (relation-svc, message-svc).

use std::sync::Arc;
use std::time::Duration;

use socialgraph_events::{KafkaSink, RelayConfig, RelayMetrics, run_relay};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::KafkaSettings;

/// Connects to Kafka (retrying while the broker is down, creating `topics` with
/// `kafka.partitions` partitions when missing) and runs the relay over `db`'s outbox until
/// `cancel`. Rows of any topic are published: replicas of several services on one database
/// share one leader.
pub async fn relay_task(
    db: sea_orm::DatabaseConnection,
    kafka: KafkaSettings,
    topics: Vec<String>,
    wake: Arc<Notify>,
    metrics: RelayMetrics,
    cancel: CancellationToken,
) {
    let deadline = Duration::from_millis(kafka.request_deadline_ms);
    let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
    let Some((client, _)) = socialgraph_events::kafka::connect_until_ready(&kafka.brokers, deadline, &topics, kafka.partitions, &cancel).await else {
        return;
    };
    let sink = Arc::new(KafkaSink::new(client, kafka.partitions));
    let config = RelayConfig {
        batch_size: kafka.relay_batch_size.max(1),
        idle_poll: Duration::from_millis(kafka.relay_idle_poll_ms),
        ..RelayConfig::default()
    };
    run_relay(db, sink, wake, config, metrics, cancel).await;
}
