//! rskafka client set-up, topic creation, [`KafkaLog`] (the mesh's [`EventLog`]) and
//! [`KafkaSink`], the relay's Kafka publisher.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use rskafka::BackoffConfig;
use rskafka::client::partition::{Compression, PartitionClient, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder, error::Error as RsError, error::ProtocolError};
use rskafka::record::Record;
use socialgraph_storage::outbox::OutboxRow;
use tokio::sync::Mutex;

use crate::consumer::BoxError;
use crate::log::{EventLog, FetchLimits, Fetched};
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
    let backoff =
        BackoffConfig { init_backoff: Duration::from_millis(50), max_backoff: Duration::from_secs(1), base: 2.0, deadline: Some(request_deadline) };
    ClientBuilder::new(brokers.to_vec()).client_id("socialgraph").backoff_config(backoff).build().await.map_err(kerr("connect"))
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

/// Kafka as the event log. Produces keyed records: partition by Kafka's default partitioner
/// on the key bytes, one Lz4-compressed request per partition (order kept within a
/// partition), partitions in parallel; fetches through one client per partition. Topics are
/// created on first use with `default_partitions` partitions.
pub struct KafkaLog {
    /// Set at construction, or connected on first use ([`KafkaLog::connect_on_first_use`]).
    client: tokio::sync::OnceCell<Client>,
    /// Bootstrap brokers and request deadline of a connection on first use.
    connect: (Vec<String>, Duration),
    default_partitions: i32,
    /// Partition count per topic, learnt on first use.
    topics: Mutex<HashMap<String, i32>>,
    /// One client per (topic, partition); rskafka reconnects them itself.
    partitions: Mutex<HashMap<(String, i32), Arc<PartitionClient>>>,
}

/// What [`KafkaLog::produce`] did with a batch of records.
#[derive(Debug)]
pub struct Produced {
    /// For each input record, in input order: whether the broker acknowledged it.
    pub acked: Vec<bool>,
    /// An error met, if any: when several partitions failed, the last of them in (topic,
    /// partition) order. Records of other partitions may still be acknowledged.
    pub error: Option<KafkaError>,
}

/// A record to produce.
#[derive(Debug, Clone)]
pub struct KeyedRecord {
    /// Topic.
    pub topic: String,
    /// Key bytes (they choose the partition).
    pub key: Vec<u8>,
    /// Value bytes.
    pub value: Vec<u8>,
    /// Headers.
    pub headers: BTreeMap<String, Vec<u8>>,
    /// Record timestamp, ms since the epoch.
    pub timestamp_ms: i64,
}

impl KafkaLog {
    /// The log of `client`; topics it creates get `default_partitions` partitions.
    pub fn new(client: Client, default_partitions: i32) -> Self {
        let client = tokio::sync::OnceCell::new_with(Some(client));
        Self { client, connect: (Vec::new(), Duration::ZERO), default_partitions, topics: Mutex::default(), partitions: Mutex::default() }
    }

    /// The log of `brokers`, connected on first use and again after a failed attempt: for a
    /// service that starts while the broker is down and fails only the calls that need it.
    pub fn connect_on_first_use(brokers: Vec<String>, request_deadline: Duration, default_partitions: i32) -> Self {
        let connect = (brokers, request_deadline);
        Self { client: tokio::sync::OnceCell::new(), connect, default_partitions, topics: Mutex::default(), partitions: Mutex::default() }
    }

    async fn client(&self) -> Result<&Client, KafkaError> {
        self.client.get_or_try_init(|| connect(&self.connect.0, self.connect.1)).await
    }

    /// Partition count of `topic`, creating it if missing.
    ///
    /// # Errors
    /// The broker could not be reached.
    pub async fn topic_partitions(&self, topic: &str) -> Result<i32, KafkaError> {
        if let Some(n) = self.topics.lock().await.get(topic) {
            return Ok(*n);
        }
        let n = ensure_topic(self.client().await?, topic, self.default_partitions).await?;
        self.topics.lock().await.insert(topic.to_owned(), n);
        Ok(n)
    }

    /// The last `count` records of `topic`/`partition` (fewer when the partition holds fewer),
    /// in offset order.
    ///
    /// # Errors
    /// The broker could not be reached.
    pub async fn tail(&self, topic: &str, partition: i32, count: usize) -> Result<Vec<rskafka::record::Record>, KafkaError> {
        use rskafka::client::partition::OffsetAt;
        let pc = self.partition_client(topic, partition).await?;
        let earliest = pc.get_offset(OffsetAt::Earliest).await.map_err(kerr(format!("offsets of {topic}/{partition}")))?;
        let end = pc.get_offset(OffsetAt::Latest).await.map_err(kerr(format!("offsets of {topic}/{partition}")))?;
        let mut next = (end - i64::try_from(count).unwrap_or(i64::MAX)).max(earliest);
        let mut out = Vec::new();
        while next < end {
            let (records, _) = pc.fetch_records(next, 1..4_000_000, 0).await.map_err(kerr(format!("fetch {topic}/{partition}")))?;
            let before = next;
            for r in records.into_iter().filter(|r| r.offset >= before && r.offset < end) {
                next = r.offset + 1;
                out.push(r.record);
            }
            if next == before {
                break;
            }
        }
        Ok(out)
    }

    async fn partition_client(&self, topic: &str, partition: i32) -> Result<Arc<PartitionClient>, KafkaError> {
        let key = (topic.to_owned(), partition);
        if let Some(c) = self.partitions.lock().await.get(&key) {
            return Ok(Arc::clone(c));
        }
        let c = Arc::new(
            self.client()
                .await?
                .partition_client(topic, partition, UnknownTopicHandling::Retry)
                .await
                .map_err(kerr(format!("open {topic}/{partition}")))?,
        );
        self.partitions.lock().await.insert(key, Arc::clone(&c));
        Ok(c)
    }

    /// Produces `records` (grouped by partition, order kept within each); returns which the
    /// broker acknowledged, and an error if any partition failed.
    pub async fn produce(&self, records: Vec<KeyedRecord>) -> Produced {
        let mut acked = vec![false; records.len()];
        let mut groups: BTreeMap<(String, i32), Vec<(usize, Record)>> = BTreeMap::new();
        for (i, r) in records.into_iter().enumerate() {
            let n = match self.topic_partitions(&r.topic).await {
                Ok(n) => n,
                Err(e) => return Produced { acked, error: Some(e) },
            };
            let p = crate::kafka_partition(&r.key, n);
            let record = Record {
                key: Some(r.key),
                value: Some(r.value),
                headers: r.headers,
                timestamp: rskafka::chrono::DateTime::from_timestamp_millis(r.timestamp_ms).unwrap_or_default(),
            };
            groups.entry((r.topic, p)).or_default().push((i, record));
        }
        let results = futures::future::join_all(groups.into_iter().map(|((topic, p), items)| async move {
            let (idx, recs): (Vec<usize>, Vec<Record>) = items.into_iter().unzip();
            let result = match self.partition_client(&topic, p).await {
                Ok(c) => c.produce(recs, Compression::Lz4).await.map(|_| ()).map_err(kerr(format!("produce {topic}/{p}"))),
                Err(e) => Err(e),
            };
            (idx, result)
        }))
        .await;
        let mut error = None;
        for (idx, result) in results {
            match result {
                Ok(()) => idx.into_iter().for_each(|i| acked[i] = true),
                Err(e) => error = Some(e),
            }
        }
        Produced { acked, error }
    }
}

impl EventLog for KafkaLog {
    async fn append(&self, records: Vec<KeyedRecord>) -> Result<(), BoxError> {
        let Produced { acked, error } = self.produce(records).await;
        match error {
            Some(e) => Err(e.into()),
            None if acked.iter().all(|a| *a) => Ok(()),
            None => Err("kafka acknowledged only some records".into()),
        }
    }

    async fn partitions(&self, topic: &str) -> Result<i32, BoxError> {
        Ok(self.topic_partitions(topic).await?)
    }

    async fn earliest(&self, topic: &str, partition: i32) -> Result<i64, BoxError> {
        let pc = self.partition_client(topic, partition).await?;
        Ok(pc.get_offset(rskafka::client::partition::OffsetAt::Earliest).await.map_err(kerr(format!("offsets of {topic}/{partition}")))?)
    }

    async fn high_watermark(&self, topic: &str, partition: i32) -> Result<i64, BoxError> {
        let pc = self.partition_client(topic, partition).await?;
        Ok(pc.get_offset(rskafka::client::partition::OffsetAt::Latest).await.map_err(kerr(format!("offsets of {topic}/{partition}")))?)
    }

    async fn fetch(&self, topic: &str, partition: i32, from: i64, limits: FetchLimits) -> Result<Fetched, BoxError> {
        let pc = self.partition_client(topic, partition).await?;
        let (records, high_watermark) =
            pc.fetch_records(from, 1..limits.max_bytes, limits.max_wait_ms).await.map_err(kerr(format!("fetch {topic}/{partition}")))?;
        Ok(Fetched { records, high_watermark })
    }
}

/// Publishes outbox rows through a [`KafkaLog`]: key = `partition_key` as 8 bytes big-endian.
pub struct KafkaSink {
    producer: KafkaLog,
}

impl KafkaSink {
    /// A sink over `client`; topics it creates get `default_partitions` partitions.
    pub fn new(client: Client, default_partitions: i32) -> Self {
        Self { producer: KafkaLog::new(client, default_partitions) }
    }
}

impl EventSink for KafkaSink {
    type Error = KafkaError;

    async fn publish(&self, rows: &[OutboxRow]) -> PublishOutcome<KafkaError> {
        let records = rows
            .iter()
            .map(|r| KeyedRecord {
                topic: r.row.topic.clone(),
                key: r.row.partition_key.to_be_bytes().to_vec(),
                value: r.row.payload.clone(),
                headers: {
                    let mut h = crate::headers::decode(&r.row.headers);
                    h.insert(crate::headers::OUTBOX_ID.to_owned(), r.id.to_string().into_bytes());
                    h
                },
                timestamp_ms: r.row.created_at_ms,
            })
            .collect();
        let Produced { acked, error } = self.producer.produce(records).await;
        PublishOutcome { acked: rows.iter().zip(acked).filter(|(_, a)| *a).map(|(r, _)| r.id).collect(), error }
    }

    /// Reads the last `rows.len()` records of each partition the rows map to and returns the
    /// rows found there as they were published: same `outbox-id` header, key and value. The
    /// rows a dead leader published and did not delete are the tail of its last batch, so a
    /// window of one batch finds them; a row missed is merely published again.
    ///
    /// Membership, not order: outbox ids are taken when a transaction inserts its row, not when
    /// it commits, so a row with a lower id can become visible after higher ids were published
    /// (two writers committing out of id order). Treating every row at or below the last
    /// published id as published deleted such a row unpublished: the edge changed and its
    /// event was lost, and every view under it drifted for good. Comparing key and value as
    /// well keeps an outbox that restarted its ids (a restored database) from matching old
    /// records.
    async fn already_published(&self, rows: &[OutboxRow]) -> Result<Vec<i64>, KafkaError> {
        let mut placed = Vec::with_capacity(rows.len());
        let mut tails: BTreeMap<(String, i32), Vec<rskafka::record::Record>> = BTreeMap::new();
        for r in rows {
            let n = self.producer.topic_partitions(&r.row.topic).await?;
            let key = (r.row.topic.clone(), crate::kafka_partition(&r.row.partition_key.to_be_bytes(), n));
            if !tails.contains_key(&key) {
                let tail = self.producer.tail(&key.0, key.1, rows.len()).await?;
                tails.insert(key.clone(), tail);
            }
            placed.push((r, key));
        }
        let published = |r: &OutboxRow, key: &(String, i32)| {
            let (id, record_key) = (r.id.to_string(), r.row.partition_key.to_be_bytes());
            tails[key].iter().any(|record| {
                record.headers.get(crate::headers::OUTBOX_ID).is_some_and(|h| h == id.as_bytes())
                    && record.key.as_deref() == Some(&record_key[..])
                    && record.value.as_deref() == Some(&r.row.payload[..])
            })
        };
        Ok(placed.into_iter().filter(|(r, key)| published(r, key)).map(|(r, _)| r.id).collect())
    }
}

/// Connects to `brokers` and makes sure each of `topics` exists (created with `partitions`),
/// retrying every second while the broker is unreachable. Returns the client and each topic's
/// partition count, or `None` when `cancel` fires first.
pub async fn connect_until_ready(
    brokers: &[String],
    request_deadline: Duration,
    topics: &[&str],
    partitions: i32,
    cancel: &tokio_util::sync::CancellationToken,
) -> Option<(Client, Vec<i32>)> {
    loop {
        let attempt = async {
            let client = connect(brokers, request_deadline).await?;
            let mut counts = Vec::with_capacity(topics.len());
            for t in topics {
                counts.push(ensure_topic(&client, t, partitions).await?);
            }
            Ok::<_, KafkaError>((client, counts))
        };
        tokio::select! {
            r = attempt => match r {
                Ok(v) => return Some(v),
                Err(e) => tracing::warn!(error = %e, "kafka unavailable, retrying in 1 s"),
            },
            _ = cancel.cancelled() => return None,
        }
        tokio::select! { _ = tokio::time::sleep(Duration::from_secs(1)) => {}, _ = cancel.cancelled() => return None }
    }
}
