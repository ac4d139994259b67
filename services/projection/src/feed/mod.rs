//! FeedService: home timelines built three ways from one rule. Each post is either **pushed**
//! (fanned out into the inbox of every follower of its author, in batches, by [`fanout`]) or
//! **pulled** (read from its author's post list at read time); which one is decided once, when
//! the post is applied, from the author's follower count: `mode = push` pushes everything,
//! `pull` nothing, `hybrid` the posts of authors with at most `pull_threshold` followers. A
//! timeline page ([`read`]) merges the inbox with the pulled posts of followed authors, so an
//! author crossing the threshold in either direction loses or repeats nothing.
//!
//! Facts and derived state live in the projection database: `post` (the fact, from
//! `sg.content.v1`, see [`ingest`]), `inbox` and `inbox_state` (derived, rebuildable with
//! RebuildInboxes), `fanout` (pushes in progress). Reads join the inbox with `follower` and
//! `post`, so an unfollow or a delete hides a post at once, whatever the inbox still holds.
//!
//! Why no push is ever missed: a follow and a post of one author are serialized by the lock on
//! the author's `edge_count` row (the follow's transaction holds it while it backfills the
//! author's pushed posts into the new follower's inbox; the post's transaction holds it while
//! it records the post and queues the push). Whichever commits second sees the other: the
//! backfill finds the post, or the push, which starts after the post committed, finds the
//! follower.

pub mod fanout;
pub mod grpc;
pub mod ingest;
pub mod posts_cache;
pub mod read;
pub mod walk;

use std::sync::Arc;
use std::time::Duration;

use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};
use serde::{Deserialize, Serialize};
use socialgraph_proto::events::v1::ContentEvent;
use socialgraph_server::ApiError;
use tokio::sync::Notify;

/// Full gRPC name of the service.
pub const SERVICE_NAME: &str = "socialgraph.feed.v1.FeedService";

/// Which posts are pushed into inboxes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FeedMode {
    /// Every post is fanned out on write.
    Push,
    /// No post is fanned out; timelines merge the followed authors' post lists.
    Pull,
    /// Posts of authors with at most `pull_threshold` followers are pushed, others pulled.
    Hybrid,
}

/// `[feed]`: projection-svc's home timelines.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FeedSettings {
    /// push, pull or hybrid (default hybrid).
    pub mode: FeedMode,
    /// Hybrid mode: authors with more followers than this (when a post is applied) are pulled
    /// (default 100,000).
    pub pull_threshold: i64,
    /// Inbox rows kept per user (default 800); older timeline pages are pulled.
    pub inbox_size: usize,
    /// Followers reached per fan-out transaction (default 1,000).
    pub fanout_batch: usize,
    /// The entity type of `sg.content.v1` events that are posts (default `post`); other types
    /// are not feed content.
    pub entity_type: String,
}

impl Default for FeedSettings {
    fn default() -> Self {
        Self { mode: FeedMode::Hybrid, pull_threshold: 100_000, inbox_size: 800, fanout_batch: 1_000, entity_type: "post".into() }
    }
}

impl FeedSettings {
    /// Whether a post of an author with `followers` followers is pushed.
    pub fn pushes(&self, followers: i64) -> bool {
        match self.mode {
            FeedMode::Push => true,
            FeedMode::Pull => false,
            FeedMode::Hybrid => followers <= self.pull_threshold,
        }
    }

    /// The `inbox_state.entries` above which an inbox is trimmed back to `inbox_size` (a quarter
    /// more, so trims are rare).
    pub fn trim_bound(&self) -> i64 {
        (self.inbox_size + self.inbox_size / 4) as i64
    }

    /// Refuses settings the feed cannot run with.
    ///
    /// # Errors
    /// A message naming the key.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=100_000).contains(&self.inbox_size) {
            return Err(format!("feed.inbox_size must be 1..=100000, got {}", self.inbox_size));
        }
        if !(1..=100_000).contains(&self.fanout_batch) {
            return Err(format!("feed.fanout_batch must be 1..=100000, got {}", self.fanout_batch));
        }
        if self.pull_threshold < 0 {
            return Err(format!("feed.pull_threshold must be ≥ 0, got {}", self.pull_threshold));
        }
        if !socialgraph_domain::valid_entity_type(&self.entity_type) {
            return Err(format!("feed.entity_type must be 1..64 bytes of [a-z0-9_], got {:?}", self.entity_type));
        }
        Ok(())
    }
}

/// Where PublishPost and DeletePost put their events: Kafka in the mesh, the outbox table in
/// the embedded mode.
#[tonic::async_trait]
pub trait ContentLog: Send + Sync + 'static {
    /// Appends `event` (key = author id) durably; returns once it is in the log.
    ///
    /// # Errors
    /// UNAVAILABLE when the log cannot take it.
    async fn append(&self, event: ContentEvent) -> Result<(), ApiError>;
}

/// [`ContentLog`] on Kafka: produces to the content topic, connecting on first use. Appends
/// that arrive while a produce request is in flight wait and go together in the next one (at
/// most [`MAX_PRODUCE_BATCH`]), so concurrent callers share the broker's round trips; each caller
/// returns once the broker acknowledged its own record.
pub struct KafkaContentLog {
    queue: tokio::sync::mpsc::Sender<PendingAppend>,
}

/// Most records of one produce request of the content log.
pub const MAX_PRODUCE_BATCH: usize = 500;

struct PendingAppend {
    record: socialgraph_events::kafka::KeyedRecord,
    done: tokio::sync::oneshot::Sender<bool>,
}

impl KafkaContentLog {
    /// A log on `topic` of `brokers` (created with `partitions` partitions when missing); its
    /// producer task runs until the log is dropped.
    pub fn new(brokers: Vec<String>, topic: String, partitions: i32, deadline: Duration) -> Self {
        let (queue, rx) = tokio::sync::mpsc::channel(4 * MAX_PRODUCE_BATCH);
        tokio::spawn(produce_loop(brokers, topic, partitions, deadline, rx));
        Self { queue }
    }
}

async fn produce_loop(brokers: Vec<String>, topic: String, partitions: i32, deadline: Duration, mut rx: tokio::sync::mpsc::Receiver<PendingAppend>) {
    // Connected on first use, and again after a failed attempt.
    let log = socialgraph_events::kafka::KafkaLog::connect_on_first_use(brokers, deadline, partitions);
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < MAX_PRODUCE_BATCH {
            match rx.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        let (records, waiters): (Vec<_>, Vec<_>) =
            batch.into_iter().map(|p| (socialgraph_events::kafka::KeyedRecord { topic: topic.clone(), ..p.record }, p.done)).unzip();
        let Produced { acked, error } = log.produce(records).await;
        if let Some(e) = error {
            tracing::warn!(topic, error = %e, "content events not produced");
        }
        for (done, ok) in waiters.into_iter().zip(acked) {
            let _ = done.send(ok);
        }
    }
}

#[tonic::async_trait]
impl ContentLog for KafkaContentLog {
    async fn append(&self, event: ContentEvent) -> Result<(), ApiError> {
        let unavailable = || ApiError::unavailable(socialgraph_server::REASON_BROKER, "the event log (Kafka) did not take the event; retry");
        let mut headers = socialgraph_events::headers::event_headers("socialgraph.events.v1.ContentEvent");
        socialgraph_telemetry::inject_headers(&tracing::Span::current(), &mut headers);
        let record = socialgraph_events::kafka::KeyedRecord {
            topic: String::new(),
            key: socialgraph_events::user_key(event.author_id).to_vec(),
            value: prost::Message::encode_to_vec(&event),
            headers: headers.into_iter().map(|(k, v)| (k, v.into_bytes())).collect(),
            timestamp_ms: crate::now_ms(),
        };
        let (done, acked) = tokio::sync::oneshot::channel();
        self.queue.send(PendingAppend { record, done }).await.map_err(|_| unavailable())?;
        match acked.await {
            Ok(true) => Ok(()),
            _ => Err(unavailable()),
        }
    }
}

use socialgraph_events::kafka::Produced;

/// The feed's metrics.
#[derive(Clone)]
pub struct FeedMetrics {
    /// Posts recorded, by how they reach timelines (`pushed`, `pulled`).
    pub posts: IntCounterVec,
    /// Inbox rows written by pushes and follow backfills, by `source` (`fanout`, `backfill`).
    pub inbox_writes: IntCounterVec,
    /// Fan-out transactions done.
    pub fanout_batches: IntCounter,
    /// Pushes queued and not finished.
    pub fanout_backlog: IntGauge,
    /// Inbox trims.
    pub trims: IntCounter,
}

impl FeedMetrics {
    /// Registers `sg_feed_posts_total`, `sg_feed_inbox_writes_total`,
    /// `sg_feed_fanout_batches_total`, `sg_feed_fanout_backlog` and `sg_feed_inbox_trims_total`.
    ///
    /// # Errors
    /// A metric of the same name is already registered.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let m = Self {
            posts: IntCounterVec::new(Opts::new("sg_feed_posts_total", "Posts recorded, by how they reach timelines (pushed, pulled)"), &["mode"])?,
            inbox_writes: IntCounterVec::new(
                Opts::new("sg_feed_inbox_writes_total", "Inbox rows written, by source (fanout, backfill)"),
                &["source"],
            )?,
            fanout_batches: IntCounter::new("sg_feed_fanout_batches_total", "Fan-out transactions done")?,
            fanout_backlog: IntGauge::new("sg_feed_fanout_backlog", "Pushes queued and not finished")?,
            trims: IntCounter::new("sg_feed_inbox_trims_total", "Inbox trims back to feed.inbox_size")?,
        };
        registry.register(Box::new(m.posts.clone()))?;
        registry.register(Box::new(m.inbox_writes.clone()))?;
        registry.register(Box::new(m.fanout_batches.clone()))?;
        registry.register(Box::new(m.fanout_backlog.clone()))?;
        registry.register(Box::new(m.trims.clone()))?;
        Ok(m)
    }
}

/// The feed over the projection database: settings, metrics, the content log and the wake-up
/// of the fan-out worker.
pub struct Feed {
    /// The projection database.
    pub db: sea_orm::DatabaseConnection,
    /// `[feed]`.
    pub settings: FeedSettings,
    /// Metrics.
    pub metrics: FeedMetrics,
    /// Where PublishPost and DeletePost append.
    pub log: Arc<dyn ContentLog>,
    /// Woken when pushes are queued.
    pub fanout_wake: Arc<Notify>,
    /// Signs page tokens.
    pub token_key: socialgraph_domain::PageTokenKey,
    /// Name of the content consumer's offsets.
    pub consumer: String,
    /// The authors' newest posts in the cache Redis (`None`: no cache Redis).
    pub posts_cache: Option<Arc<posts_cache::PostCache>>,
}
