//! Live delivery's source: every message-svc instance tails the message topic (an [`EventLog`]:
//! Kafka topic `kafka.message_topic` in the mesh, the outbox table in the embedded mode) in one
//! [`Hub`], which decodes each record once and broadcasts it to the instance's Subscribe streams
//! ([`crate::subscribe`]).
//!
//! Positions are the log's own: per partition, the offset of the next record. They are a total
//! order that never changes once a record is visible, unlike message ids, which can commit out
//! of order; so a stream's resume token is a vector of offsets (one per partition) and resuming
//! reads the log from there. The hub publishes a record's position *before* broadcasting it: a
//! stream that subscribes meanwhile either receives the broadcast or finds the record behind the
//! position it catches up to, and skips whichever copy comes second by offset.

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use prost::Message as _;
use socialgraph_events::FetchLimits;
use socialgraph_proto::events::v1::MessageEvent;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

/// A failure of the log (the broker or the database behind it).
pub type LogError = Box<dyn std::error::Error + Send + Sync>;

/// The message topic as live delivery reads it: one topic of the event log, object-safe for
/// the [`Hub`]. Its one implementation is [`TopicLog`], over either log.
#[tonic::async_trait]
pub trait EventLog: Send + Sync + 'static {
    /// Partitions of the topic.
    async fn partitions(&self) -> Result<i32, LogError>;
    /// Records of `partition` with offset ≥ `from`, in offset order: (offset, MessageEvent
    /// bytes), one batch, empty at the end of the log.
    async fn fetch(&self, partition: i32, from: i64) -> Result<Vec<(i64, Vec<u8>)>, LogError>;
    /// (earliest retained offset, high watermark) of `partition`.
    async fn bounds(&self, partition: i32) -> Result<(i64, i64), LogError>;
}

/// The message topic of a log of the one log interface ([`socialgraph_events::EventLog`]): Kafka
/// in the mesh (connected on first use: message-svc starts while the broker is down, and
/// Subscribe is UNAVAILABLE until it answers), the outbox table in the embedded mode.
pub struct TopicLog<L> {
    /// The log.
    pub log: Arc<L>,
    /// `kafka.message_topic`.
    pub topic: String,
}

/// Most bytes of one fetch, and its longest wait for records.
const FETCH: FetchLimits = FetchLimits { max_bytes: 1024 * 1024, max_wait_ms: 5 };

#[tonic::async_trait]
impl<L: socialgraph_events::EventLog> EventLog for TopicLog<L> {
    async fn partitions(&self) -> Result<i32, LogError> {
        self.log.partitions(&self.topic).await
    }

    async fn fetch(&self, partition: i32, from: i64) -> Result<Vec<(i64, Vec<u8>)>, LogError> {
        let fetched = self.log.fetch(&self.topic, partition, from, FETCH).await?;
        Ok(fetched.records.into_iter().filter(|r| r.offset >= from).map(|r| (r.offset, r.record.value.unwrap_or_default())).collect())
    }

    async fn bounds(&self, partition: i32) -> Result<(i64, i64), LogError> {
        Ok((self.log.earliest(&self.topic, partition).await?, self.log.high_watermark(&self.topic, partition).await?))
    }
}

/// One record of the log, decoded.
#[derive(Debug)]
pub struct Logged {
    /// Its partition.
    pub partition: i32,
    /// Its offset.
    pub offset: i64,
    /// The event.
    pub event: MessageEvent,
}

/// Decodes a record; `None` (logged) for bytes that are no MessageEvent.
pub fn decode(partition: i32, offset: i64, bytes: &[u8]) -> Option<Logged> {
    match MessageEvent::decode(bytes) {
        Ok(event) => Some(Logged { partition, offset, event }),
        Err(e) => {
            tracing::warn!(partition, offset, error = %e, "skipping a record of the message topic that is no MessageEvent");
            None
        }
    }
}

/// Settings of the hub and of the streams it feeds (`[subscribe]`).
#[derive(Debug, Clone, Copy)]
pub struct HubSettings {
    /// Longest sleep between empty fetches of a partition that had records in the last 10 s.
    pub idle_poll_ms: u64,
    /// Sleep between empty fetches of a partition quiet for 10 s.
    pub quiet_poll_ms: u64,
    /// Records buffered per stream before it falls behind and catches up from the log.
    pub buffer: usize,
}

/// The instance's tail of the log, shared by its Subscribe streams.
pub struct Hub {
    /// The log.
    pub log: Arc<dyn EventLog>,
    tx: broadcast::Sender<Arc<Logged>>,
    positions: RwLock<Option<Vec<i64>>>,
    settings: HubSettings,
    /// Fires when the instance stops: every stream ends (UNAVAILABLE: reconnect elsewhere).
    pub cancel: CancellationToken,
}

impl Hub {
    /// A hub over `log`; [`Hub::run`] starts it.
    pub fn new(log: Arc<dyn EventLog>, settings: HubSettings, cancel: CancellationToken) -> Arc<Self> {
        let (tx, _) = broadcast::channel(settings.buffer.max(16));
        Arc::new(Self { log, tx, positions: RwLock::new(None), settings, cancel })
    }

    /// A receiver of every record broadcast from now on, and the positions (next offset per
    /// partition) the broadcast has reached, taken after subscribing; `None` until the hub has
    /// reached the log.
    pub fn subscribe(&self) -> Option<(broadcast::Receiver<Arc<Logged>>, Vec<i64>)> {
        let rx = self.tx.subscribe();
        Some((rx, self.positions()?))
    }

    /// As [`Hub::subscribe`], waiting up to `wait` for the hub to reach the log (right after
    /// start, or while the broker is down).
    pub async fn subscribe_within(&self, wait: Duration) -> Option<(broadcast::Receiver<Arc<Logged>>, Vec<i64>)> {
        let deadline = Instant::now() + wait;
        loop {
            if let Some(s) = self.subscribe() {
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The positions the broadcast has reached (see [`Hub::subscribe`]).
    pub fn positions(&self) -> Option<Vec<i64>> {
        self.positions.read().map(|p| p.clone()).unwrap_or_default()
    }

    /// Tails the log until `cancel`: starts at its end (retrying while it is unreachable), then
    /// one task per partition broadcasts every record in offset order.
    pub async fn run(self: Arc<Self>) {
        let start = loop {
            match self.start().await {
                Ok(p) => break p,
                Err(e) => tracing::warn!(error = %e, "live delivery cannot reach the message log yet; retrying"),
            }
            tokio::select! { _ = tokio::time::sleep(Duration::from_secs(1)) => {}, _ = self.cancel.cancelled() => return }
        };
        tracing::info!(partitions = start.len(), "live delivery tails the message log");
        if let Ok(mut p) = self.positions.write() {
            *p = Some(start.clone());
        }
        let tasks: Vec<_> = start.into_iter().enumerate().map(|(p, from)| tokio::spawn(Arc::clone(&self).tail(p as i32, from))).collect();
        for t in tasks {
            let _ = t.await;
        }
    }

    async fn start(&self) -> Result<Vec<i64>, LogError> {
        let n = self.log.partitions().await?;
        let mut out = Vec::with_capacity(n as usize);
        for p in 0..n {
            out.push(self.log.bounds(p).await?.1);
        }
        Ok(out)
    }

    async fn tail(self: Arc<Self>, partition: i32, mut next: i64) {
        let mut idle = Duration::from_millis(1);
        let mut last_busy = Instant::now();
        while !self.cancel.is_cancelled() {
            let fetched = tokio::select! { r = self.log.fetch(partition, next) => r, _ = self.cancel.cancelled() => return };
            let records = match fetched {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(partition, error = %e, "live delivery could not read the message log; retrying");
                    tokio::select! { _ = tokio::time::sleep(Duration::from_millis(500)) => {}, _ = self.cancel.cancelled() => return }
                    continue;
                }
            };
            if records.is_empty() {
                let quiet = last_busy.elapsed() >= Duration::from_secs(10);
                let sleep = if quiet { Duration::from_millis(self.settings.quiet_poll_ms) } else { idle };
                tokio::select! { _ = tokio::time::sleep(sleep) => {}, _ = self.cancel.cancelled() => return }
                idle = (idle * 2).min(Duration::from_millis(self.settings.idle_poll_ms));
                continue;
            }
            (idle, last_busy) = (Duration::from_millis(1), Instant::now());
            for (offset, bytes) in records {
                next = offset + 1;
                // The position first, then the broadcast (see the module's documentation).
                if let Ok(mut p) = self.positions.write()
                    && let Some(p) = p.as_mut()
                {
                    p[partition as usize] = next;
                }
                if let Some(logged) = decode(partition, offset, &bytes) {
                    let _ = self.tx.send(Arc::new(logged));
                }
            }
        }
    }
}
