//! The shared test broker and reading topics back.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use rskafka::client::partition::{OffsetAt, PartitionClient, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder};
use rskafka::record::RecordAndOffset;
use tokio::sync::Mutex;

/// Bootstrap address of the shared test broker.
pub fn brokers() -> Vec<String> {
    vec![std::env::var("SG_TEST_KAFKA").unwrap_or_else(|_| "127.0.0.1:9092".into())]
}

/// Connects to `brokers`, failing fast with how to start the broker.
///
/// # Errors
/// The broker is not reachable within 10 s.
pub async fn connect(brokers: &[String]) -> anyhow::Result<Client> {
    let backoff = rskafka::BackoffConfig { deadline: Some(Duration::from_secs(10)), ..Default::default() };
    ClientBuilder::new(brokers.to_vec())
        .backoff_config(backoff)
        .build()
        .await
        .with_context(|| format!("the Kafka broker is not reachable at {brokers:?}: run `make deps` to start it"))
}

/// Every record of every partition of `topic` up to the high watermark, as
/// (partition, record) in partition then offset order.
///
/// # Errors
/// Broker failures.
pub async fn read_all(client: &Client, topic: &str) -> anyhow::Result<Vec<(i32, RecordAndOffset)>> {
    let Some(t) = client.list_topics().await?.into_iter().find(|t| t.name == topic) else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for p in t.partitions {
        let pc = client.partition_client(topic, p, UnknownTopicHandling::Error).await?;
        let mut offset = pc.get_offset(OffsetAt::Earliest).await?;
        loop {
            let (records, high_watermark) = pc.fetch_records(offset, 1..4_000_000, 0).await?;
            for r in records {
                offset = r.offset + 1;
                out.push((p, r));
            }
            if offset >= high_watermark {
                break;
            }
        }
    }
    Ok(out)
}

/// The high watermark of every partition of `topic` (partition → offset of the next record),
/// read once; see [`Watermarks`] for a loop that reads them again and again.
///
/// # Errors
/// Broker failures.
pub async fn high_watermarks(client: &Client, topic: &str) -> anyhow::Result<BTreeMap<i32, i64>> {
    Watermarks::new(client, topic).read().await
}

/// Reads the high watermarks of one topic repeatedly, as a test's wait loop does: the topic's
/// partitions and their partition clients are looked up on the first read that finds the topic,
/// so every later read is one ListOffsets request per partition (a fresh lookup per poll was a
/// Metadata request plus one per partition, every 20 ms, from every waiting test).
pub struct Watermarks<'a> {
    client: &'a Client,
    topic: String,
    partitions: Mutex<Vec<(i32, PartitionClient)>>,
}

impl<'a> Watermarks<'a> {
    /// Watermarks of `topic` on `client`; nothing is asked of the broker until [`Self::read`].
    pub fn new(client: &'a Client, topic: &str) -> Self {
        Self { client, topic: topic.to_owned(), partitions: Mutex::new(Vec::new()) }
    }

    /// Partition → high watermark (offset of the next record); empty while the topic does not
    /// exist yet.
    ///
    /// # Errors
    /// Broker failures.
    pub async fn read(&self) -> anyhow::Result<BTreeMap<i32, i64>> {
        let mut partitions = self.partitions.lock().await;
        if partitions.is_empty() {
            let Some(t) = self.client.list_topics().await?.into_iter().find(|t| t.name == self.topic) else {
                return Ok(BTreeMap::new());
            };
            let mut found = Vec::new();
            for p in t.partitions {
                found.push((p, self.client.partition_client(&self.topic, p, UnknownTopicHandling::Error).await?));
            }
            *partitions = found;
        }
        let mut out = BTreeMap::new();
        for (p, pc) in partitions.iter() {
            out.insert(*p, pc.get_offset(OffsetAt::Latest).await?);
        }
        Ok(out)
    }
}
