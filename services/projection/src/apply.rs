//! Applying relation events to the follower table, effectively-once: an event changes an edge
//! only when its version is newer than the stored one, and the partition's next offset is
//! stored in the same transaction as the rows of the batch, together with the change of every
//! touched user's `edge_count` row and the outbox rows that publish those rows' new values
//! ([`crate::count_log`]; the exact counts counter-svc copies).
//!
//! Before that transaction, the batch goes to the list caches, both directions (pseudo-replicas
//! with the same version rule, so a batch applied again after a crash changes nothing), with
//! its position first, and an idle partition writes its position again (see [`crate::fence`]
//! for why fills need it). When the cache Redis cannot
//! be reached, the batch's users are marked in `cache_stale` in the same transaction, and
//! the stale drain ([`socialgraph_server::cache_drain`]) deletes their cached lists once it answers
//! again.

use std::collections::HashMap;
use std::sync::Arc;

use prometheus::{IntCounter, IntCounterVec};
use prost::Message;
use rskafka::record::RecordAndOffset;
use sea_orm::DatabaseConnection;
use socialgraph_cache::lists::{AppliedMark, CachedEdge};
use socialgraph_domain::Edge;
use socialgraph_domain::EdgeState;
use socialgraph_events::consumer::{BatchHandler, BoxError};
use socialgraph_proto::events::v1::RelationEvent;
use socialgraph_storage::counts::{self, CountDelta};
use socialgraph_storage::edges::{self, EdgeTable};
use socialgraph_storage::offsets::{self, StoredOffset};
use socialgraph_storage::stale;
use tracing::Instrument;

/// Retries of one batch transaction that lost a race with a rebuild.
const MAX_RETRIES: usize = 10;

/// The projection's [`BatchHandler`].
pub struct Projector {
    /// The projection database.
    pub db: DatabaseConnection,
    /// Name in `consumer_offset`.
    pub consumer: String,
    /// Events applied (changed a row).
    pub applied: IntCounter,
    /// Records skipped: stale version, or undecodable (by `reason`).
    pub skipped: IntCounterVec,
    /// The list caches kept from the events (`None`: no cache Redis).
    pub cache: Option<Arc<crate::cache::Caches>>,
    /// Batches applied to the cache, by `result` (ok, failed).
    pub cache_applies: IntCounterVec,
    /// `[feed]`: inboxes follow the edges in the same transaction.
    pub feed: crate::feed::FeedSettings,
    /// The feed's metrics (backfilled inbox rows).
    pub feed_metrics: Option<crate::feed::FeedMetrics>,
    /// The counts a batch changed, published through the outbox (`None`: not published; the
    /// embedded mode reads `edge_count` itself).
    pub count_log: Option<Arc<crate::count_log::CountLog>>,
}

impl Projector {
    /// The newest event per edge in a batch ([`newest_per_edge`]), counting undecodable and
    /// stale records.
    fn newest(&self, records: &[RecordAndOffset]) -> HashMap<(i64, i64), Edge> {
        let mut edges = Vec::with_capacity(records.len());
        for r in records {
            match RelationEvent::decode(r.record.value.as_deref().unwrap_or_default()) {
                Ok(e) if e.follower_id > 0 && e.followee_id > 0 && e.version > 0 => {
                    edges.push(Edge::from(&e));
                }
                Ok(_) | Err(_) => {
                    self.skipped.with_label_values(&["undecodable"]).inc();
                    tracing::warn!(offset = r.offset, "skipping a record that is not a valid RelationEvent");
                }
            }
        }
        let (newest, stale) = newest_per_edge(edges);
        self.skipped.with_label_values(&["stale"]).inc_by(stale);
        newest
    }

    /// Applies the batch to both list caches; returns the users to mark stale when it failed.
    async fn apply_to_cache(&self, newest: &HashMap<(i64, i64), Edge>, partition: i32, next_offset: i64) -> Vec<i64> {
        let Some(cache) = &self.cache else { return Vec::new() };
        let edge = |e: &Edge, peer_id: i64| CachedEdge {
            peer_id,
            version: e.version,
            following: e.state == EdgeState::Following,
            followed_at_ms: e.followed_at_ms,
        };
        let following: Vec<(i64, CachedEdge)> = newest.values().map(|e| (e.follower_id, edge(e, e.followee_id))).collect();
        let followers: Vec<(i64, CachedEdge)> = newest.values().map(|e| (e.followee_id, edge(e, e.follower_id))).collect();
        let mark = AppliedMark { key: cache.fence.key(), partition, next_offset };
        let lists = &cache.lists;
        let result = match lists.followers.apply(&followers, Some(mark)).await {
            Ok(_) => lists.following.apply(&following, None).await,
            Err(e) => Err(e),
        };
        // After the cache Redis took the batch: pages read from now on are the new ones.
        cache.hot.invalidate(newest.keys().map(|(_, followee)| *followee));
        match result {
            Ok(_) => {
                self.cache_applies.with_label_values(&["ok"]).inc();
                Vec::new()
            }
            Err(e) => {
                self.cache_applies.with_label_values(&["failed"]).inc();
                tracing::warn!(error = %e, "cache Redis unavailable: marking the batch's users stale");
                let mut users: Vec<i64> = newest.keys().flat_map(|(a, b)| [*a, *b]).collect();
                users.sort_unstable();
                users.dedup();
                users
            }
        }
    }

    async fn apply_once(
        &self,
        topic: &str,
        newest: &HashMap<(i64, i64), Edge>,
        position: StoredOffset,
        stale_users: &[i64],
    ) -> Result<u64, sea_orm::DbErr> {
        let txn = socialgraph_storage::begin_write(&self.db).await?;
        stale::mark(&txn, stale_users, crate::now_ms()).await?;
        let pairs: Vec<(i64, i64)> = newest.keys().copied().collect();
        let stored: HashMap<(i64, i64), Edge> =
            edges::get_many(&txn, EdgeTable::Follower, &pairs, true).await?.into_iter().map(|e| ((e.follower_id, e.followee_id), e)).collect();
        let (mut inserts, mut changed) = (Vec::new(), 0u64);
        let mut deltas: HashMap<i64, CountDelta> = HashMap::new();
        let (mut follows, mut unfollows) = (Vec::new(), Vec::new());
        for (key, edge) in newest {
            let old = match stored.get(key) {
                None => {
                    inserts.push(*edge);
                    None
                }
                Some(old) if socialgraph_domain::newer_wins(Some(old.version), edge.version) => {
                    edges::update(&txn, EdgeTable::Follower, edge).await?;
                    changed += 1;
                    Some(old.state)
                }
                Some(_) => {
                    self.skipped.with_label_values(&["stale"]).inc();
                    continue;
                }
            };
            let d = counts::transition(old, edge.state);
            match d {
                1 => follows.push(*key),
                -1 => unfollows.push(*key),
                _ => {}
            }
            if d != 0 {
                deltas.entry(edge.follower_id).or_insert_with(|| CountDelta { user_id: edge.follower_id, ..CountDelta::default() }).followings += d;
                deltas.entry(edge.followee_id).or_insert_with(|| CountDelta { user_id: edge.followee_id, ..CountDelta::default() }).followers += d;
            }
        }
        changed += inserts.len() as u64;
        for chunk in inserts.chunks(1000) {
            edges::insert(&txn, EdgeTable::Follower, chunk).await?;
        }
        // Last before the offset: the hot rows of popular accounts stay locked only until the
        // commit right after.
        let deltas: Vec<CountDelta> = deltas.into_values().collect();
        counts::add(&txn, &deltas).await?;
        if let Some(log) = &self.count_log {
            log.write(&txn, &deltas.iter().map(|d| d.user_id).collect::<Vec<i64>>()).await?;
        }
        // After the counts: the followees' rows are locked, so a post of theirs is applied
        // wholly before or wholly after this backfill (see crate::feed).
        let followees: std::collections::HashSet<i64> = follows.iter().map(|(_, b)| *b).collect();
        let unlocked: Vec<i64> =
            deltas.iter().filter(|d| d.followers == 0 && d.followings == 0 && followees.contains(&d.user_id)).map(|d| d.user_id).collect();
        let backfilled = crate::feed::ingest::on_edges(&txn, &self.feed, &follows, &unfollows, &unlocked).await?;
        offsets::store(&txn, &self.consumer, topic, position, crate::now_ms()).await?;
        txn.commit().await?;
        if let Some(m) = &self.feed_metrics {
            m.inbox_writes.with_label_values(&["backfill"]).inc_by(backfilled);
        }
        Ok(changed)
    }
}

impl BatchHandler for Projector {
    async fn load_offset(&self, topic: &str, partition: i32) -> Result<Option<i64>, BoxError> {
        Ok(offsets::next_offset(&self.db, &self.consumer, topic, partition).await?)
    }

    async fn apply(&self, topic: &str, partition: i32, records: &[RecordAndOffset], next_offset: i64) -> Result<(), BoxError> {
        let span = tracing::info_span!("projection.apply", partition, offset = next_offset - 1, records = records.len());
        socialgraph_telemetry::adopt_records(&span, records.iter().map(|r| &r.record.headers));
        let newest = self.newest(records);
        let last_event_ms = records.last().map(|r| r.record.timestamp.timestamp_millis());
        let position = StoredOffset { partition, next_offset, last_event_ms };
        let stale_users = self.apply_to_cache(&newest, partition, next_offset).instrument(span.clone()).await;
        let changed =
            socialgraph_storage::retry_tx(MAX_RETRIES, || self.apply_once(topic, &newest, position, &stale_users).instrument(span.clone())).await?;
        self.applied.inc_by(changed);
        if let Some(log) = &self.count_log {
            log.wake.notify_one();
        }
        Ok(())
    }

    /// Writes the partition's position to the list caches again ([`crate::fence`]): a mark
    /// hash the cache Redis lost makes every fill wait until each partition has one.
    async fn idle(&self, _topic: &str, partition: i32, next_offset: i64) {
        if let Some(cache) = &self.cache {
            cache.fence.mark(&cache.lists.followers, partition, next_offset).await;
        }
    }
}

/// Of the edges of one batch (in log order), the one with the highest version per
/// (follower, followee), and how many were older than one already seen (stale). An equal
/// version (a copy of the same event) is neither newer nor stale.
pub fn newest_per_edge(edges: impl IntoIterator<Item = Edge>) -> (HashMap<(i64, i64), Edge>, u64) {
    let mut newest: HashMap<(i64, i64), Edge> = HashMap::new();
    let mut stale = 0;
    for edge in edges {
        let slot = newest.entry((edge.follower_id, edge.followee_id)).or_insert(edge);
        if socialgraph_domain::newer_wins(Some(slot.version), edge.version) {
            *slot = edge;
        } else if edge.version < slot.version {
            stale += 1;
        }
    }
    (newest, stale)
}

#[cfg(test)]
mod tests {
    use super::*;
    use socialgraph_domain::EdgeState;

    fn edge(follower_id: i64, followee_id: i64, version: i64) -> Edge {
        let state = if version % 2 == 1 { EdgeState::Following } else { EdgeState::NotFollowing };
        Edge { follower_id, followee_id, state, version, followed_at_ms: version, updated_at_ms: version }
    }

    #[test]
    fn the_highest_version_of_each_edge_wins_whatever_the_order_and_copies() {
        let (newest, stale) = newest_per_edge([edge(1, 2, 1), edge(1, 2, 3), edge(1, 2, 2), edge(1, 2, 3), edge(2, 1, 1)]);
        assert_eq!(newest[&(1, 2)], edge(1, 2, 3));
        assert_eq!(newest[&(2, 1)], edge(2, 1, 1));
        assert_eq!(newest.len(), 2);
        assert_eq!(stale, 1, "version 2 after 3 is stale; the copy of 3 is not");
    }
}
