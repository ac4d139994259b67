//! Consumers of counter-svc. None of them applies a blind delta, so none needs to know whether
//! it saw an event before: at-least-once delivery (a replayed offset range, a copy of an event
//! at a later offset, events reordered across partitions) leaves every counter unchanged.
//! - `sg.relation.v1`: each follower's absolute followings with their version, as relation-svc
//!   counted them in the edge change's transaction; older versions are ignored.
//! - `sg.edge_count.v1`: each user's absolute follow counts with their version, as
//!   projection-svc published them (followers; followings only until a relation event brought
//!   them); older versions are ignored.
//! - `sg.counter.v1`: the owners of the batch's entities get the entities' current counts with
//!   their toggle sequence; older sequences are ignored.
//! - `sg.content.v1`: each entity's publish/delete applies only when newer than the last one
//!   applied to it (event time).
//!
//! Offsets only say how far a consumer got; they are stored after the batch's writes.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;

use prometheus::{IntCounter, IntCounterVec};
use prost::Message;
use rskafka::record::RecordAndOffset;
use socialgraph_domain::{newer_wins, timestamp_to_ms};
use socialgraph_events::consumer::{BatchHandler, BoxError};
use socialgraph_proto::events::v1::{ActionEvent, ContentEvent, ContentEventKind, EdgeCountEvent, Metric, RelationEvent};
use tracing::Instrument;

use crate::store::{AuthorContent, EdgeCounts, EntityState, Followings, Store};

/// Metrics shared by the consumers.
#[derive(Clone)]
pub struct ConsumerMetrics {
    /// Counter writes that changed a value.
    pub applied: IntCounter,
    /// Records skipped, by reason.
    pub skipped: IntCounterVec,
}

impl ConsumerMetrics {
    /// Registers `sg_counter_applied_total` and `sg_counter_skipped_total` in `registry`.
    ///
    /// # Errors
    /// A metric of the same name is registered already.
    pub fn register(registry: &prometheus::Registry) -> prometheus::Result<Self> {
        let applied = IntCounter::new(
            "sg_counter_applied_total",
            "Counter copies that changed a value (follow counts, likes and favs received, unread counts)",
        )?;
        registry.register(Box::new(applied.clone()))?;
        let skipped = IntCounterVec::new(prometheus::Opts::new("sg_counter_skipped_total", "Records skipped, by reason"), &["reason"])?;
        registry.register(Box::new(skipped.clone()))?;
        Ok(Self { applied, skipped })
    }
}

/// Where the follow-count consumers keep the counts: Redis in counter-svc ([`Store`]), SQL
/// tables beside the facts in the embedded mode. Either keeps the newest version of each count
/// ([`newer_wins`]), so the consumers below are the one algorithm of both.
pub trait FollowCountStore: Send + Sync + 'static {
    /// The stored next offset of `consumer` on `topic`/`partition`.
    fn load_offset(&self, consumer: &str, topic: &str, partition: i32) -> impl Future<Output = Result<Option<i64>, BoxError>> + Send;
    /// Stores the next offset of `consumer` on `topic`/`partition`, after the batch's writes.
    fn store_offset(
        &self,
        consumer: &str,
        topic: &str,
        partition: i32,
        next: i64,
        last_event_ms: Option<i64>,
    ) -> impl Future<Output = Result<(), BoxError>> + Send;
    /// Keeps each user's followings of a newer version than the stored one (relation-svc's
    /// count); users without counters are left alone (their first read creates them). Returns
    /// how many it wrote.
    fn sync_followings(&self, counts: &[Followings]) -> impl Future<Output = Result<usize, BoxError>> + Send;
    /// Keeps each user's followers of a newer version than the stored one (projection-svc's
    /// count), and its followings only while no relation event brought them. Returns how many
    /// it wrote.
    fn sync_follow_counts(&self, counts: &[EdgeCounts]) -> impl Future<Output = Result<usize, BoxError>> + Send;
}

impl FollowCountStore for Store {
    async fn load_offset(&self, consumer: &str, topic: &str, partition: i32) -> Result<Option<i64>, BoxError> {
        Ok(Store::load_offset(self, consumer, topic, partition).await?)
    }

    async fn store_offset(&self, consumer: &str, topic: &str, partition: i32, next: i64, _last_event_ms: Option<i64>) -> Result<(), BoxError> {
        Ok(Store::store_offset(self, consumer, topic, partition, next).await?)
    }

    async fn sync_followings(&self, counts: &[Followings]) -> Result<usize, BoxError> {
        Ok(Store::sync_followings(self, counts).await?)
    }

    async fn sync_follow_counts(&self, counts: &[EdgeCounts]) -> Result<usize, BoxError> {
        Ok(self.sync_edges(counts, false).await?.iter().filter(|w| w.is_some()).count())
    }
}

fn last_event_ms(records: &[RecordAndOffset]) -> Option<i64> {
    records.last().map(|r| r.record.timestamp.timestamp_millis())
}

/// Followings and followers of each user, from projection-svc's `sg.edge_count.v1`: every event
/// carries the user's absolute counts after a projection batch with the `edge_count` row's
/// version, so the batch's newest event per user is copied and the store keeps the newest
/// version ([`FollowCountStore::sync_follow_counts`]). Nothing else is read: no call to
/// projection-svc, no waiting for it.
pub struct EdgeCountCounter<S = Store> {
    /// Where the counts are kept.
    pub store: S,
    /// Name of this consumer's offsets.
    pub consumer: String,
    /// Metrics.
    pub metrics: ConsumerMetrics,
}

/// Keeps in `newest` the item of the newest version per user (the first of equal versions):
/// [`newer_wins`] over one batch.
fn keep_newest<T>(newest: &mut BTreeMap<i64, T>, user_id: i64, item: T, version: fn(&T) -> i64) {
    match newest.entry(user_id) {
        std::collections::btree_map::Entry::Vacant(slot) => {
            slot.insert(item);
        }
        std::collections::btree_map::Entry::Occupied(mut slot) => {
            if newer_wins(Some(version(slot.get())), version(&item)) {
                slot.insert(item);
            }
        }
    }
}

impl<S> EdgeCountCounter<S> {
    /// The newest counts per user in `records` (by version; the first of equal versions).
    pub fn newest(&self, records: &[RecordAndOffset]) -> Vec<EdgeCounts> {
        let mut newest: BTreeMap<i64, EdgeCounts> = BTreeMap::new();
        for r in records {
            match EdgeCountEvent::decode(r.record.value.as_deref().unwrap_or_default()) {
                Ok(e) if e.user_id > 0 && e.version > 0 && e.followings >= 0 && e.followers >= 0 => {
                    let c = EdgeCounts { user_id: e.user_id, followings: e.followings, followers: e.followers, version: e.version };
                    keep_newest(&mut newest, e.user_id, c, |c| c.version);
                }
                _ => self.metrics.skipped.with_label_values(&["undecodable"]).inc(),
            }
        }
        newest.into_values().collect()
    }
}

impl<S: FollowCountStore> BatchHandler for EdgeCountCounter<S> {
    async fn load_offset(&self, topic: &str, partition: i32) -> Result<Option<i64>, BoxError> {
        self.store.load_offset(&self.consumer, topic, partition).await
    }

    async fn apply(&self, topic: &str, partition: i32, records: &[RecordAndOffset], next_offset: i64) -> Result<(), BoxError> {
        let span = socialgraph_telemetry::batch_span("counter.edge_count", topic, partition, records.iter().map(|r| &r.record.headers));
        async {
            let counts = self.newest(records);
            if !counts.is_empty() {
                let written = self.store.sync_follow_counts(&counts).await?;
                self.metrics.applied.inc_by(written as u64);
            }
            self.store.store_offset(&self.consumer, topic, partition, next_offset, last_event_ms(records)).await?;
            Ok(())
        }
        .instrument(span)
        .await
    }
}

/// Followings of each follower, from relation-svc's `sg.relation.v1`: every event carries the
/// follower's absolute followings after the change with their per-user version, so the batch's
/// newest per follower is copied and the store keeps the newest version
/// ([`FollowCountStore::sync_followings`]). Fresh while projection-svc is down: nothing here
/// waits for it.
pub struct FollowingsCounter<S = Store> {
    /// Where the counts are kept.
    pub store: S,
    /// Name of this consumer's offsets.
    pub consumer: String,
    /// Metrics.
    pub metrics: ConsumerMetrics,
}

impl<S> FollowingsCounter<S> {
    /// The newest followings per follower in `records` (events without a count are skipped).
    pub fn newest(&self, records: &[RecordAndOffset]) -> Vec<Followings> {
        let mut newest: BTreeMap<i64, Followings> = BTreeMap::new();
        for r in records {
            match RelationEvent::decode(r.record.value.as_deref().unwrap_or_default()) {
                Ok(e) if e.follower_id > 0 && e.follower_followings_version > 0 && e.follower_followings >= 0 => {
                    let c = Followings { user_id: e.follower_id, followings: e.follower_followings, version: e.follower_followings_version };
                    keep_newest(&mut newest, e.follower_id, c, |c| c.version);
                }
                Ok(_) => self.metrics.skipped.with_label_values(&["uncounted"]).inc(),
                Err(_) => self.metrics.skipped.with_label_values(&["undecodable"]).inc(),
            }
        }
        newest.into_values().collect()
    }
}

impl<S: FollowCountStore> BatchHandler for FollowingsCounter<S> {
    async fn load_offset(&self, topic: &str, partition: i32) -> Result<Option<i64>, BoxError> {
        self.store.load_offset(&self.consumer, topic, partition).await
    }

    async fn apply(&self, topic: &str, partition: i32, records: &[RecordAndOffset], next_offset: i64) -> Result<(), BoxError> {
        let span = socialgraph_telemetry::batch_span("counter.followings", topic, partition, records.iter().map(|r| &r.record.headers));
        async {
            let counts = self.newest(records);
            if !counts.is_empty() {
                let written = self.store.sync_followings(&counts).await?;
                self.metrics.applied.inc_by(written as u64);
            }
            self.store.store_offset(&self.consumer, topic, partition, next_offset, last_event_ms(records)).await?;
            Ok(())
        }
        .instrument(span)
        .await
    }
}

/// Copies the current counts of `entities` (`(etype, eid)` → owner) into their owners' likes
/// and favs received; returns how many owners changed.
async fn sync_owners(store: &Store, owned: &BTreeMap<(String, i64), i64>) -> Result<u64, BoxError> {
    if owned.is_empty() {
        return Ok(0);
    }
    let entities: Vec<(String, i64)> = owned.keys().cloned().collect();
    let states = store.entity_states(&entities).await?;
    let mut per_owner: BTreeMap<i64, Vec<EntityState>> = BTreeMap::new();
    for (state, owner) in states.into_iter().zip(owned.values()) {
        per_owner.entry(*owner).or_default().push(state);
    }
    let per_owner: Vec<(i64, Vec<EntityState>)> = per_owner.into_iter().collect();
    let changes = store.owner_sync(&per_owner).await?;
    Ok(changes.iter().filter(|(l, f)| *l != 0 || *f != 0).count() as u64)
}

/// Posts of authors and the owner registry, from `sg.content.v1`.
pub struct ContentCounter {
    /// Redis.
    pub store: Store,
    /// Name of this consumer's offsets.
    pub consumer: String,
    /// Metrics.
    pub metrics: ConsumerMetrics,
}

impl BatchHandler for ContentCounter {
    async fn load_offset(&self, topic: &str, partition: i32) -> Result<Option<i64>, BoxError> {
        Ok(self.store.load_offset(&self.consumer, topic, partition).await?)
    }

    async fn apply(&self, topic: &str, partition: i32, records: &[RecordAndOffset], next_offset: i64) -> Result<(), BoxError> {
        let span = socialgraph_telemetry::batch_span("counter.content", topic, partition, records.iter().map(|r| &r.record.headers));
        async {
            let mut ops: BTreeMap<i64, Vec<(bool, String, i64)>> = BTreeMap::new();
            let mut published: BTreeMap<(String, i64), i64> = BTreeMap::new();
            let mut owners = redis::pipe();
            for r in records {
                let e = match ContentEvent::decode(r.record.value.as_deref().unwrap_or_default()) {
                    Ok(e) if e.author_id > 0 && e.entity_id > 0 && socialgraph_domain::valid_entity_type(&e.entity_type) => e,
                    _ => {
                        self.metrics.skipped.with_label_values(&["undecodable"]).inc();
                        continue;
                    }
                };
                let is_published = match ContentEventKind::try_from(e.kind) {
                    Ok(ContentEventKind::Published) => true,
                    Ok(ContentEventKind::Deleted) => false,
                    _ => {
                        self.metrics.skipped.with_label_values(&["unknown_kind"]).inc();
                        continue;
                    }
                };
                // The event's own time orders copies of it; records without one use the record's.
                let at_ms = e.occurred_at.as_ref().map(timestamp_to_ms).unwrap_or_else(|| r.record.timestamp.timestamp_millis());
                if is_published {
                    owners.set(self.store.keys.owner(&e.entity_type, e.entity_id), e.author_id).ignore();
                    published.insert((e.entity_type.clone(), e.entity_id), e.author_id);
                }
                ops.entry(e.author_id).or_default().push((is_published, format!("{}:{}", e.entity_type, e.entity_id), at_ms));
            }
            self.store.query(&owners).await?;
            let ops: Vec<AuthorContent> = ops.into_iter().collect();
            self.store.apply_content(&ops).await?;
            // Likes made before the entity's owner was known reach the owner now.
            self.metrics.applied.inc_by(sync_owners(&self.store, &published).await?);
            self.store.store_offset(&self.consumer, topic, partition, next_offset).await?;
            Ok(())
        }
        .instrument(span)
        .await
    }
}

/// The owners' likes/favs received, from `sg.counter.v1` (entity counts move in the toggle
/// script itself).
pub struct ActionCounter {
    /// Redis.
    pub store: Store,
    /// Name of this consumer's offsets.
    pub consumer: String,
    /// Metrics.
    pub metrics: ConsumerMetrics,
}

impl ActionCounter {
    fn decode(&self, records: &[RecordAndOffset]) -> Vec<ActionEvent> {
        let mut out = Vec::with_capacity(records.len());
        for r in records {
            match ActionEvent::decode(r.record.value.as_deref().unwrap_or_default()) {
                Ok(e)
                    if e.entity_id > 0
                        && e.actor_id > 0
                        && matches!(Metric::try_from(e.metric), Ok(Metric::Like | Metric::Fav))
                        && socialgraph_domain::valid_entity_type(&e.entity_type) =>
                {
                    out.push(e)
                }
                _ => self.metrics.skipped.with_label_values(&["undecodable"]).inc(),
            }
        }
        out
    }

    /// The owner of each event's entity: the event's owner_id, else the content registry.
    async fn owners(&self, actions: &[ActionEvent]) -> Result<BTreeMap<(String, i64), i64>, BoxError> {
        let mut owned = BTreeMap::new();
        let mut unknown = BTreeSet::new();
        for e in actions {
            let key = (e.entity_type.clone(), e.entity_id);
            if e.owner_id > 0 {
                owned.insert(key, e.owner_id);
            } else {
                unknown.insert(key);
            }
        }
        let unknown: Vec<(String, i64)> = unknown.into_iter().filter(|k| !owned.contains_key(k)).collect();
        if !unknown.is_empty() {
            let mut pipe = redis::pipe();
            for (t, id) in &unknown {
                pipe.get(self.store.keys.owner(t, *id));
            }
            for (k, v) in unknown.into_iter().zip(self.store.query(&pipe).await?) {
                if let Ok(Some(owner)) = redis::from_redis_value::<Option<i64>>(v) {
                    owned.insert(k, owner);
                }
            }
        }
        Ok(owned)
    }
}

impl BatchHandler for ActionCounter {
    async fn load_offset(&self, topic: &str, partition: i32) -> Result<Option<i64>, BoxError> {
        Ok(self.store.load_offset(&self.consumer, topic, partition).await?)
    }

    async fn apply(&self, topic: &str, partition: i32, records: &[RecordAndOffset], next_offset: i64) -> Result<(), BoxError> {
        let span = socialgraph_telemetry::batch_span("counter.action", topic, partition, records.iter().map(|r| &r.record.headers));
        async {
            let actions = self.decode(records);
            let owned = self.owners(&actions).await?;
            self.metrics.applied.inc_by(sync_owners(&self.store, &owned).await?);
            self.store.store_offset(&self.consumer, topic, partition, next_offset).await?;
            Ok(())
        }
        .instrument(span)
        .await
    }
}
