//! Partition consumers: each owned partition is read by one task that fetches a batch from an
//! [`EventLog`] (Kafka in the mesh, the outbox table in the embedded mode), hands it to a
//! [`BatchHandler`] (which applies it and stores the next offset with its effects), and moves
//! on. rskafka has no consumer groups, so ownership comes from config ([`Assignment`]) and
//! positions from the handler's own store.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rskafka::record::RecordAndOffset;
use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, RwLock};
use tokio_util::sync::CancellationToken;

use crate::log::{EventLog, FetchLimits, Fetched};

/// Boxed error of a handler.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Which partitions of a topic this replica consumes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
#[derive(Default)]
pub enum Assignment {
    /// Every partition.
    #[default]
    All,
    /// These partitions.
    List(Vec<i32>),
    /// Replica `ordinal` of `count` (e.g. a StatefulSet's pod ordinal): partitions p with
    /// `p % count == ordinal`.
    Replica {
        /// This replica's index, 0-based.
        ordinal: u32,
        /// Number of replicas.
        count: u32,
    },
}

impl Assignment {
    /// The owned partitions of a topic with `total` partitions, ascending.
    pub fn partitions(&self, total: i32) -> Vec<i32> {
        match self {
            Self::All => (0..total).collect(),
            Self::List(list) => {
                let mut v: Vec<i32> = list.iter().copied().filter(|p| (0..total).contains(p)).collect();
                v.sort_unstable();
                v.dedup();
                v
            }
            Self::Replica { ordinal, count } => (0..total).filter(|p| (*p as u32) % (*count).max(1) == *ordinal).collect(),
        }
    }
}

/// Applies fetched records. Implementations store `next_offset` in the same transaction (or
/// atomic script) as the effects of `records`, so that replays change nothing.
pub trait BatchHandler: Send + Sync + 'static {
    /// The stored next offset of `topic`/`partition`, `None` when never consumed.
    fn load_offset(&self, topic: &str, partition: i32) -> impl std::future::Future<Output = Result<Option<i64>, BoxError>> + Send;
    /// Applies `records` (offset order, one partition) and stores `next_offset`.
    fn apply(
        &self,
        topic: &str,
        partition: i32,
        records: &[RecordAndOffset],
        next_offset: i64,
    ) -> impl std::future::Future<Output = Result<(), BoxError>> + Send;
    /// Called when a fetch of `topic`/`partition` came back empty, at most every
    /// [`IDLE_EVERY`] (the first time at once), never while a batch is being applied:
    /// `next_offset` is the partition's position, every record before it applied and stored
    /// (0 when nothing ever was). For work that must go on while no records come, such as
    /// writing the position where others read it again. Does nothing by default.
    fn idle(&self, topic: &str, partition: i32, next_offset: i64) -> impl std::future::Future<Output = ()> + Send {
        let _ = (topic, partition, next_offset);
        async {}
    }
}

/// Shortest time between two [`BatchHandler::idle`] calls of one partition.
pub const IDLE_EVERY: Duration = Duration::from_millis(500);

/// Progress of one partition, for status RPCs and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PartitionProgress {
    /// Next offset to apply.
    pub next_offset: i64,
    /// High watermark at the last fetch.
    pub high_watermark: i64,
    /// Timestamp (ms) of the last applied record, if any.
    pub last_event_ms: Option<i64>,
    /// True once the consumer loop runs.
    pub running: bool,
}

impl PartitionProgress {
    /// Records not yet applied: high watermark − next offset, never negative.
    pub fn lag(&self) -> i64 {
        (self.high_watermark - self.next_offset).max(0)
    }
}

/// Progress of every owned partition by (topic, partition); shared by consumers and readers.
pub type Progress = Arc<RwLock<BTreeMap<(String, i32), PartitionProgress>>>;

/// Fetch settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConsumerSettings {
    /// Which partitions to consume.
    pub partitions: Assignment,
    /// Longest time a fetch waits on the broker for data, in milliseconds. The default, 0, asks
    /// for whatever is there and lets the idle backoff below do the waiting: the development
    /// broker (tansu 0.6) never answers a fetch early, holds it for the whole wait even when it
    /// found records, and runs its fetch queries twice for any wait above 0. Apache Kafka
    /// answers as soon as records arrive, so 100–500 suits it and saves empty round trips.
    /// The outbox log of the embedded mode returns as soon as a row commits.
    pub max_wait_ms: i32,
    /// Most bytes per fetch.
    pub max_bytes: i32,
    /// Longest idle sleep between empty fetches while the consumer is in use (some partition
    /// of it fetched records within `deep_idle_after_ms`).
    pub idle_max_ms: u64,
    /// Quiet time after which a partition sleeps `deep_idle_ms` between empty fetches.
    pub deep_idle_after_ms: u64,
    /// Sleep between empty fetches of a consumer quiet for `deep_idle_after_ms`: what an idle
    /// mesh costs the broker (one fetch per partition per this period). The first records
    /// after a quiet time wait up to this long; every sibling partition then wakes at once.
    pub deep_idle_ms: u64,
}

impl Default for ConsumerSettings {
    fn default() -> Self {
        Self {
            partitions: Assignment::All,
            max_wait_ms: 0,
            max_bytes: 4 * 1024 * 1024,
            idle_max_ms: 50,
            deep_idle_after_ms: 10_000,
            deep_idle_ms: 1_000,
        }
    }
}

/// Consumes `topic`/`partition` into `handler` until `cancel` fires; stops at a batch
/// boundary. Handler failures retry the same batch from the stored offset after a backoff.
///
/// While no records come, the partition backs off between empty fetches (1 ms doubling to
/// `idle_max_ms`, then `deep_idle_ms` once quiet for `deep_idle_after_ms`). `activity` is
/// shared by the sibling partitions of one consumer: a partition that fetched records wakes
/// every sleeping sibling when it comes out of a quiet time; they fetch at once and count as
/// in use again. An empty fetch also calls [`BatchHandler::idle`] (at most every
/// [`IDLE_EVERY`]).
#[allow(clippy::too_many_arguments)]
pub async fn run_partition<L: EventLog, H: BatchHandler>(
    log: Arc<L>,
    topic: String,
    partition: i32,
    handler: Arc<H>,
    progress: Progress,
    settings: ConsumerSettings,
    activity: Arc<Notify>,
    cancel: CancellationToken,
) {
    let key = (topic.clone(), partition);
    let mut failures = 0u32;
    while !cancel.is_cancelled() {
        let result = consume(log.as_ref(), &topic, partition, handler.as_ref(), &progress, &settings, &activity, &cancel).await;
        if let Err(e) = result {
            failures += 1;
            let wait = Duration::from_millis((50u64 << failures.min(6)).min(5_000));
            tracing::warn!(topic, partition, error = %e, retry_in_ms = wait.as_millis() as u64, "consumer failed; restarting from the stored offset");
            tokio::select! { _ = tokio::time::sleep(wait) => {}, _ = cancel.cancelled() => {} }
        }
    }
    if let Some(p) = progress.write().await.get_mut(&key) {
        p.running = false;
    }
}

#[allow(clippy::too_many_arguments)]
async fn consume<L: EventLog, H: BatchHandler>(
    log: &L,
    topic: &str,
    partition: i32,
    handler: &H,
    progress: &Progress,
    settings: &ConsumerSettings,
    activity: &Notify,
    cancel: &CancellationToken,
) -> Result<(), BoxError> {
    let stored = handler.load_offset(topic, partition).await?;
    let mut offset = match stored {
        Some(o) => o,
        None => log.earliest(topic, partition).await?,
    };
    let limits = FetchLimits { max_bytes: settings.max_bytes, max_wait_ms: settings.max_wait_ms };
    // What `idle` reports: the stored position (0 while nothing was ever stored).
    let mut done = stored.unwrap_or(0);
    let mut idle_called: Option<Instant> = None;
    let key = (topic.to_owned(), partition);
    progress.write().await.entry(key.clone()).or_default().next_offset = offset;
    let mut idle = Duration::from_millis(1);
    let mut last_busy = Instant::now();
    let deep_idle_after = Duration::from_millis(settings.deep_idle_after_ms);
    loop {
        let fetched = tokio::select! {
            r = log.fetch(topic, partition, offset, limits) => r?,
            _ = cancel.cancelled() => return Ok(()),
        };
        let Fetched { records, high_watermark } = fetched;
        let records: Vec<RecordAndOffset> = records.into_iter().filter(|r| r.offset >= offset).collect();
        {
            let mut map = progress.write().await;
            let p = map.entry(key.clone()).or_default();
            p.high_watermark = high_watermark;
            p.running = true;
        }
        let Some(last) = records.last() else {
            if idle_called.is_none_or(|t| t.elapsed() >= IDLE_EVERY) {
                handler.idle(topic, partition, done).await;
                idle_called = Some(Instant::now());
            }
            let sleep = if last_busy.elapsed() >= deep_idle_after { Duration::from_millis(settings.deep_idle_ms) } else { idle };
            tokio::select! {
                _ = tokio::time::sleep(sleep) => {},
                _ = activity.notified() => last_busy = Instant::now(),
                _ = cancel.cancelled() => return Ok(()),
            }
            idle = (idle * 2).min(Duration::from_millis(settings.idle_max_ms));
            continue;
        };
        idle = Duration::from_millis(1);
        // Out of a quiet time: the siblings are likely to get records too; wake them.
        if last_busy.elapsed() >= deep_idle_after {
            activity.notify_waiters();
        }
        last_busy = Instant::now();
        let next = last.offset + 1;
        let last_ms = last.record.timestamp.timestamp_millis();
        handler.apply(topic, partition, &records, next).await?;
        offset = next;
        done = next;
        let mut map = progress.write().await;
        let p = map.entry(key.clone()).or_default();
        p.next_offset = next;
        p.last_event_ms = Some(last_ms);
        if cancel.is_cancelled() {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assignments_split_partitions_without_overlap() {
        assert_eq!(Assignment::All.partitions(4), [0, 1, 2, 3]);
        assert_eq!(Assignment::List(vec![3, 1, 9, 1]).partitions(4), [1, 3]);
        let mut all: Vec<i32> = (0..3).flat_map(|o| Assignment::Replica { ordinal: o, count: 3 }.partitions(12)).collect();
        all.sort_unstable();
        assert_eq!(all, (0..12).collect::<Vec<_>>());
        assert_eq!(Assignment::Replica { ordinal: 1, count: 3 }.partitions(12), [1, 4, 7, 10]);
    }
}
