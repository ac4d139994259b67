//! Consumers of counter-svc. Each fetched batch is aggregated per user and applied with one
//! guarded script per user (compare-and-set on the user's guard of that partition), then the
//! partition's next offset is stored. A crash between the two replays the batch, and the guards
//! skip what was applied: effectively-once.

use std::collections::{BTreeMap, HashMap};

use prometheus::{IntCounter, IntCounterVec};
use prost::Message;
use rskafka::record::RecordAndOffset;
use socialgraph_cache::counters::{FIELDS, field};
use socialgraph_cache::keys::partition_field;
use socialgraph_events::consumer::{BatchHandler, BoxError};
use socialgraph_proto::events::v1::{ContentEvent, ContentEventKind, RelationEvent, RelationEventKind};

use crate::store::{Applied, Delta, Store};

/// Rounds of re-reading guards after conflicts with concurrent rebuilds.
const MAX_ROUNDS: usize = 20;

/// Metrics shared by the consumers.
#[derive(Clone)]
pub struct ConsumerMetrics {
    /// User counter scripts that applied a delta.
    pub applied: IntCounter,
    /// Records skipped, by reason.
    pub skipped: IntCounterVec,
}

/// One change to one user's counter from one record: (offset, counter index, +1/−1).
type Change = (i64, usize, i64);

/// Applies per-user changes of one batch, re-reading guards after conflicts.
async fn apply_changes(store: &Store, field_name: &str, last: i64, changes: &HashMap<i64, Vec<Change>>, applied: &IntCounter) -> Result<(), BoxError> {
    let mut pending: Vec<i64> = changes.keys().copied().collect();
    for _ in 0..MAX_ROUNDS {
        if pending.is_empty() {
            return Ok(());
        }
        let guards = store.guards(&pending, field_name).await?;
        let deltas: Vec<Delta> = pending
            .iter()
            .filter_map(|u| {
                let guard = guards.get(u).copied().flatten();
                if guard.is_some_and(|g| g >= last) {
                    return None;
                }
                let mut delta = [0i64; FIELDS];
                for (offset, idx, sign) in &changes[u] {
                    if *offset > guard.unwrap_or(-1) {
                        delta[*idx] += sign;
                    }
                }
                Some(Delta { user_id: *u, expected: guard, new_guard: last, delta })
            })
            .collect();
        let outcomes = store.apply_deltas(field_name, &deltas).await?;
        applied.inc_by(outcomes.iter().filter(|o| **o == Applied::Done).count() as u64);
        pending = deltas.iter().zip(outcomes).filter(|(_, o)| *o == Applied::Conflict).map(|(d, _)| d.user_id).collect();
    }
    Err(format!("user guards kept moving for {} users", pending.len()).into())
}

/// Followings of the follower and followers of the followee, from `sg.relation.v1`.
pub struct RelationCounter {
    /// Redis.
    pub store: Store,
    /// Name of this consumer's offsets.
    pub consumer: String,
    /// Metrics.
    pub metrics: ConsumerMetrics,
}

impl BatchHandler for RelationCounter {
    async fn load_offset(&self, topic: &str, partition: i32) -> Result<Option<i64>, BoxError> {
        Ok(self.store.load_offset(&self.consumer, topic, partition).await?)
    }

    async fn apply(&self, topic: &str, partition: i32, records: &[RecordAndOffset], next_offset: i64) -> Result<(), BoxError> {
        let mut changes: HashMap<i64, Vec<Change>> = HashMap::new();
        for r in records {
            let e = match RelationEvent::decode(r.record.value.as_deref().unwrap_or_default()) {
                Ok(e) if e.follower_id > 0 && e.followee_id > 0 => e,
                _ => {
                    self.metrics.skipped.with_label_values(&["undecodable"]).inc();
                    continue;
                }
            };
            let sign = match RelationEventKind::try_from(e.kind) {
                Ok(RelationEventKind::Followed) => 1,
                Ok(RelationEventKind::Unfollowed) => -1,
                _ => {
                    self.metrics.skipped.with_label_values(&["unknown_kind"]).inc();
                    continue;
                }
            };
            changes.entry(e.follower_id).or_default().push((r.offset, field::FOLLOWINGS, sign));
            changes.entry(e.followee_id).or_default().push((r.offset, field::FOLLOWERS, sign));
        }
        let field_name = partition_field(topic, partition);
        apply_changes(&self.store, &field_name, next_offset - 1, &changes, &self.metrics.applied).await?;
        self.store.store_offset(&self.consumer, topic, partition, next_offset).await?;
        Ok(())
    }
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
        let mut ops: BTreeMap<i64, Vec<(i64, bool, String)>> = BTreeMap::new();
        let mut owners = redis::pipe();
        for r in records {
            let e = match ContentEvent::decode(r.record.value.as_deref().unwrap_or_default()) {
                Ok(e) if e.author_id > 0 && e.entity_id > 0 && socialgraph_domain::valid_entity_type(&e.entity_type) => e,
                _ => {
                    self.metrics.skipped.with_label_values(&["undecodable"]).inc();
                    continue;
                }
            };
            let published = match ContentEventKind::try_from(e.kind) {
                Ok(ContentEventKind::Published) => true,
                Ok(ContentEventKind::Deleted) => false,
                _ => {
                    self.metrics.skipped.with_label_values(&["unknown_kind"]).inc();
                    continue;
                }
            };
            let owner_key = self.store.keys.owner(&e.entity_type, e.entity_id);
            if published {
                owners.set(owner_key, e.author_id).ignore();
            } else {
                owners.del(owner_key).ignore();
            }
            ops.entry(e.author_id).or_default().push((r.offset, published, format!("{}:{}", e.entity_type, e.entity_id)));
        }
        self.store.query(&owners).await?;
        let field_name = partition_field(topic, partition);
        let last = next_offset - 1;
        let mut pending: Vec<i64> = ops.keys().copied().collect();
        for _ in 0..MAX_ROUNDS {
            if pending.is_empty() {
                break;
            }
            let guards = self.store.guards(&pending, &field_name).await?;
            let work: Vec<(i64, Option<i64>, i64, Vec<(bool, String)>)> = pending
                .iter()
                .filter_map(|a| {
                    let guard = guards.get(a).copied().flatten();
                    if guard.is_some_and(|g| g >= last) {
                        return None;
                    }
                    let list = ops[a].iter().filter(|(o, _, _)| *o > guard.unwrap_or(-1)).map(|(_, p, m)| (*p, m.clone())).collect();
                    Some((*a, guard, last, list))
                })
                .collect();
            let outcomes = self.store.apply_content(&field_name, &work).await?;
            self.metrics.applied.inc_by(outcomes.iter().filter(|o| **o == Applied::Done).count() as u64);
            pending = work.iter().zip(outcomes).filter(|(_, o)| *o == Applied::Conflict).map(|(w, _)| w.0).collect();
        }
        if !pending.is_empty() {
            return Err(format!("author guards kept moving for {} authors", pending.len()).into());
        }
        self.store.store_offset(&self.consumer, topic, partition, next_offset).await?;
        Ok(())
    }
}

/// Entity like/fav counts and the owners' likes/favs received, from `sg.counter.v1`.
pub struct ActionCounter {
    /// Redis.
    pub store: Store,
    /// Name of this consumer's offsets.
    pub consumer: String,
    /// Metrics.
    pub metrics: ConsumerMetrics,
}

/// One decoded action: (offset, event).
type Action = (i64, socialgraph_proto::events::v1::ActionEvent);

impl ActionCounter {
    fn decode(&self, records: &[RecordAndOffset]) -> Vec<Action> {
        use socialgraph_proto::events::v1::{ActionEvent, Metric};
        let mut out = Vec::with_capacity(records.len());
        for r in records {
            match ActionEvent::decode(r.record.value.as_deref().unwrap_or_default()) {
                Ok(e) if e.entity_id > 0
                    && e.actor_id > 0
                    && (e.delta == 1 || e.delta == -1)
                    && matches!(Metric::try_from(e.metric), Ok(Metric::Like | Metric::Fav))
                    && socialgraph_domain::valid_entity_type(&e.entity_type) =>
                {
                    out.push((r.offset, e))
                }
                _ => self.metrics.skipped.with_label_values(&["undecodable"]).inc(),
            }
        }
        out
    }

    /// Owners of the events' entities: the event's owner_id, else the content registry.
    async fn owners(&self, actions: &[Action]) -> Result<HashMap<(String, i64), i64>, BoxError> {
        let unknown: Vec<(String, i64)> = actions
            .iter()
            .filter(|(_, e)| e.owner_id <= 0)
            .map(|(_, e)| (e.entity_type.clone(), e.entity_id))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut owners: HashMap<(String, i64), i64> = HashMap::new();
        if !unknown.is_empty() {
            let mut pipe = redis::pipe();
            for (t, id) in &unknown {
                pipe.get(self.store.keys.owner(t, *id));
            }
            for (k, v) in unknown.into_iter().zip(self.store.query(&pipe).await?) {
                if let Ok(Some(owner)) = redis::from_redis_value::<Option<i64>>(v) {
                    owners.insert(k, owner);
                }
            }
        }
        Ok(owners)
    }
}

impl BatchHandler for ActionCounter {
    async fn load_offset(&self, topic: &str, partition: i32) -> Result<Option<i64>, BoxError> {
        Ok(self.store.load_offset(&self.consumer, topic, partition).await?)
    }

    async fn apply(&self, topic: &str, partition: i32, records: &[RecordAndOffset], next_offset: i64) -> Result<(), BoxError> {
        use socialgraph_cache::entities::{FAV_INDEX, LIKE_INDEX};
        use socialgraph_proto::events::v1::Metric;
        let last = next_offset - 1;
        let actions = self.decode(records);
        let registry = self.owners(&actions).await?;
        let mut per_entity: BTreeMap<(String, i64), Vec<(i64, i64, usize, i64)>> = BTreeMap::new();
        let mut changes: HashMap<i64, Vec<Change>> = HashMap::new();
        for (offset, e) in &actions {
            let fav = e.metric == Metric::Fav as i32;
            let key = (e.entity_type.clone(), e.entity_id);
            let idx = if fav { FAV_INDEX } else { LIKE_INDEX };
            per_entity.entry(key.clone()).or_default().push((*offset, e.sequence, idx, i64::from(e.delta)));
            let owner = if e.owner_id > 0 { Some(e.owner_id) } else { registry.get(&key).copied() };
            if let Some(owner) = owner {
                let received = if fav { field::FAVS_RECEIVED } else { field::LIKES_RECEIVED };
                changes.entry(owner).or_default().push((*offset, received, i64::from(e.delta)));
            }
        }
        // One script (one write) per entity, however many events it had in the batch.
        let mut pipe = redis::pipe();
        for ((t, id), events) in &per_entity {
            let keys = self.store.keys.entity(t, *id);
            pipe.invoke_script(&crate::entities::apply_invocation(&self.store.entity_scripts, &keys, last, events)).ignore();
        }
        self.store.query(&pipe).await?;
        apply_changes(&self.store, &partition_field(topic, partition), last, &changes, &self.metrics.applied).await?;
        self.store.store_offset(&self.consumer, topic, partition, next_offset).await?;
        Ok(())
    }
}
