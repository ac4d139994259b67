//! rskafka client set-up, topic creation, and [`KafkaSink`], the relay's Kafka publisher.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use rskafka::client::partition::{Compression, PartitionClient, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder, error::Error as RsError, error::ProtocolError};
use rskafka::record::Record;
use rskafka::BackoffConfig;
use socialgraph_storage::outbox::OutboxRow;
use tokio::sync::Mutex;

use crate::relay::{EventSink, PublishOutcome};

/// A Kafka failure, with the operation that failed.
#[derive(Debug, thiserror::Error)]
#[error("kafka {op} failed: {source}")]
pub struct KafkaError {
    /// What was attempted.
    pub op: String,
    /// rskafka's error.
    #[source]
    pub source: RsError,
}

fn kerr(op: impl Into<String>) -> impl FnOnce(RsError) -> KafkaError {
    let op = op.into();
    move |source| KafkaError { op, source }
}

/// Connects to the bootstrap `brokers` (`host:port`). rskafka retries each request with
/// backoff for at most `request_deadline`, then reports the error to the caller.
///
/// # Errors
/// The broker cannot be reached.
pub async fn connect(brokers: &[String], request_deadline: Duration) -> Result<Client, KafkaError> {
    let backoff = BackoffConfig {
        init_backoff: Duration::from_millis(50),
        max_backoff: Duration::from_secs(1),
        base: 2.0,
        deadline: Some(request_deadline),
    };
    ClientBuilder::new(brokers.to_vec())
        .client_id("socialgraph")
        .backoff_config(backoff)
        .build()
        .await
        .map_err(kerr("connect"))
}

/// Creates `topic` with `partitions` partitions unless it exists, and returns its actual
/// partition count. Never deletes or alters a topic.
///
/// # Errors
/// The broker refused or could not be reached.
pub async fn ensure_topic(client: &Client, topic: &str, partitions: i32) -> Result<i32, KafkaError> {
    if let Some(n) = partition_count(client, topic).await? {
        return Ok(n);
    }
    match client.controller_client().map_err(kerr("controller"))?.create_topic(topic, partitions, 1, 5_000).await {
        Ok(()) => {}
        Err(RsError::ServerError { protocol_error: ProtocolError::TopicAlreadyExists, .. }) => {}
        Err(e) => return Err(kerr(format!("create topic {topic}"))(e)),
    }
    Ok(partition_count(client, topic).await?.unwrap_or(partitions))
}

/// The partition count of `topic`, `None` when it does not exist.
///
/// # Errors
/// The broker could not be reached.
pub async fn partition_count(client: &Client, topic: &str) -> Result<Option<i32>, KafkaError> {
    let topics = client.list_topics().await.map_err(kerr("list topics"))?;
    Ok(topics.into_iter().find(|t| t.name == topic).map(|t| t.partitions.len() as i32))
}

/// Publishes outbox rows to Kafka: partition by Kafka's default partitioner on the 8-byte
/// big-endian `partition_key`, one Lz4-compressed produce request per partition (so order is
/// kept within a partition), partitions in parallel. Topics are created on first use with the
/// configured partition count.
pub struct KafkaSink {
    client: Client,
    default_partitions: i32,
    /// Partition count per topic, learnt on first use.
    topics: Mutex<HashMap<String, i32>>,
    /// One client per (topic, partition); rskafka reconnects them itself.
    partitions: Mutex<HashMap<(String, i32), Arc<PartitionClient>>>,
}

impl KafkaSink {
    /// A sink over `client`; topics it creates get `default_partitions` partitions.
    pub fn new(client: Client, default_partitions: i32) -> Self {
        Self { client, default_partitions, topics: Mutex::default(), partitions: Mutex::default() }
    }

    async fn topic_partitions(&self, topic: &str) -> Result<i32, KafkaError> {
        if let Some(n) = self.topics.lock().await.get(topic) {
            return Ok(*n);
        }
        let n = ensure_topic(&self.client, topic, self.default_partitions).await?;
        self.topics.lock().await.insert(topic.to_owned(), n);
        Ok(n)
    }

    async fn partition_client(&self, topic: &str, partition: i32) -> Result<Arc<PartitionClient>, KafkaError> {
        let key = (topic.to_owned(), partition);
        if let Some(c) = self.partitions.lock().await.get(&key) {
            return Ok(Arc::clone(c));
        }
        let c = Arc::new(
            self.client
                .partition_client(topic, partition, UnknownTopicHandling::Retry)
                .await
                .map_err(kerr(format!("open {topic}/{partition}")))?,
        );
        self.partitions.lock().await.insert(key, Arc::clone(&c));
        Ok(c)
    }

    async fn produce_group(&self, topic: &str, partition: i32, rows: &[&OutboxRow]) -> Result<(), KafkaError> {
        let client = self.partition_client(topic, partition).await?;
        let records = rows.iter().map(|r| to_record(r)).collect();
        client.produce(records, Compression::Lz4).await.map_err(kerr(format!("produce {topic}/{partition}")))?;
        Ok(())
    }
}

fn to_record(row: &OutboxRow) -> Record {
    Record {
        key: Some(row.row.partition_key.to_be_bytes().to_vec()),
        value: Some(row.row.payload.clone()),
        headers: crate::headers::decode(&row.row.headers),
        timestamp: rskafka::chrono::DateTime::from_timestamp_millis(row.row.created_at_ms).unwrap_or_default(),
    }
}

impl EventSink for KafkaSink {
    type Error = KafkaError;

    async fn publish(&self, rows: &[OutboxRow]) -> PublishOutcome<KafkaError> {
        let mut groups: BTreeMap<(String, i32), Vec<&OutboxRow>> = BTreeMap::new();
        for row in rows {
            let n = match self.topic_partitions(&row.row.topic).await {
                Ok(n) => n,
                Err(e) => return PublishOutcome { acked: Vec::new(), error: Some(e) },
            };
            let p = crate::kafka_partition(&row.row.partition_key.to_be_bytes(), n);
            groups.entry((row.row.topic.clone(), p)).or_default().push(row);
        }
        let results = futures::future::join_all(
            groups.iter().map(|((topic, p), rows)| async move { (rows, self.produce_group(topic, *p, rows).await) }),
        )
        .await;
        let mut outcome = PublishOutcome { acked: Vec::new(), error: None };
        for (rows, result) in results {
            match result {
                Ok(()) => outcome.acked.extend(rows.iter().map(|r| r.id)),
                Err(e) => outcome.error = Some(e),
            }
        }
        outcome
    }
}
