//! Reads of user counters, their creation, rebuilds and the sampled drift check.
//!
//! Followers (and followings, until a relation event brought relation-svc's) are copies of
//! projection-svc's `edge_count` rows, which the projection changes in the transaction that
//! applies each batch of relation events; every copy carries the row's version and Redis keeps
//! only the newest ([`Store::sync_edges`]). Followings from relation events have a version
//! space of their own ([`Store::sync_followings`]) and are left alone here. Posts and
//! likes/favs received derive from facts in the user's own slot (the posts set, the recv hash).
//! So a counter is created, rebuilt or checked without waiting for any consumer: whatever is in
//! flight arrives later with a newer version and is applied then
//! (docs/src/architecture/consistency.md#a-rebuild-agrees-with-the-log).

use std::collections::HashMap;
use std::sync::Arc;

use prometheus::IntCounter;
use rand::Rng;
use socialgraph_cache::CacheError;
use socialgraph_cache::counters::Sds;
use socialgraph_domain::ConsistencyToken;
use socialgraph_proto::projection::v1::BatchGetEdgeCountsRequest;
use socialgraph_proto::projection::v1::projection_service_client::ProjectionServiceClient;
use socialgraph_server::{ApiError, ApiResult};
use tokio::sync::Semaphore;
use tonic::transport::Channel;

use crate::store::{Checked, EdgeCounts, Store};

/// Longest a read holding a consistency token waits for the relation consumer to copy the
/// token's followings (as projection-svc waits for its change).
pub const CONSISTENCY_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Sampled checks running at once across all reads; a read that finds them all busy skips
/// its check (it is a sample), so checks never queue behind reads or slow them.
pub const CHECK_SLOTS: usize = 2;

/// Most owned entities whose counts a check or rebuild re-reads per owner.
pub const RESYNC_ENTITIES: usize = 1000;

/// Ids per BatchGetEdgeCounts call (the RPC's batch limit).
const EDGE_COUNT_BATCH: usize = 1000;

/// The user-counter side of counter-svc.
pub struct Counters {
    /// Redis.
    pub store: Store,
    /// projection-svc.
    pub projection: ProjectionServiceClient<Channel>,
    /// Seconds between sampled checks of one user (0 = off).
    pub check_interval_secs: u64,
    /// Counters created or rebuilt.
    pub rebuilds: IntCounter,
    /// Checks and rebuilds that found drift and repaired it.
    pub repairs: IntCounter,
    /// Permits for sampled checks in flight ([`CHECK_SLOTS`]).
    pub check_slots: Arc<Semaphore>,
    /// Users whose rest period this instance started less than `check_interval_secs` ago:
    /// their reads skip the round trip that asks Redis whether a check is due.
    pub resting: moka::sync::Cache<i64, ()>,
}

/// Most users [`Counters::resting`] remembers (~100 bytes each); beyond it the least used are
/// forgotten and merely ask Redis again.
pub const RESTING_CAPACITY: u64 = 1_000_000;

/// The local set of resting users: each entry lives `check_interval_secs`.
pub fn resting_cache(check_interval_secs: u64) -> moka::sync::Cache<i64, ()> {
    moka::sync::Cache::builder().max_capacity(RESTING_CAPACITY).time_to_live(std::time::Duration::from_secs(check_interval_secs.max(1))).build()
}

pub(crate) fn cache_error(e: CacheError) -> ApiError {
    if e.is_unavailable() {
        tracing::warn!(error = %e, "redis unavailable");
        ApiError::unavailable(socialgraph_server::REASON_REDIS, "redis unavailable")
    } else {
        ApiError::internal(e)
    }
}

/// The projection's counts of some users and its stored next offset per partition, read in
/// one snapshot.
pub struct ProjectionCounts {
    /// One per requested user, in request order.
    pub counts: Vec<EdgeCounts>,
    /// partition → next offset the projection will apply, as far as every answer reflects: a
    /// partition one answer did not name (the projection had stored no position for it yet)
    /// is left out, as not applied at all.
    pub next_offsets: HashMap<i32, i64>,
}

/// Merges the positions of one more answer into those of the earlier ones (`None`: this is the
/// first): per partition the oldest, and a partition missing from either side is dropped. Each
/// answer is its own snapshot, so the counts of all of them reflect a partition only up to the
/// oldest position, and not at all when one answer was read before the projection stored any
/// position for it. Keeping such a partition from the other answers let a relation batch pass
/// its "applied" check with the first 1,000 users' counts read before the batch was applied
/// (the Slashdot acceptance test lost 14 followers' counts that way, once).
fn merge_offsets(acc: Option<HashMap<i32, i64>>, got: HashMap<i32, i64>) -> HashMap<i32, i64> {
    match acc {
        None => got,
        Some(mut acc) => {
            acc.retain(|p, n| match got.get(p) {
                Some(g) => {
                    *n = (*n).min(*g);
                    true
                }
                None => false,
            });
            acc
        }
    }
}

impl Counters {
    /// Follow counts of `users` (any number; 1,000 per call) with the projection's positions.
    ///
    /// # Errors
    /// UNAVAILABLE when projection-svc does not answer.
    pub async fn edge_counts(&self, users: &[i64]) -> ApiResult<ProjectionCounts> {
        let (mut counts, mut next_offsets) = (Vec::with_capacity(users.len()), None);
        for chunk in users.chunks(EDGE_COUNT_BATCH) {
            let r = self
                .projection
                .clone()
                .batch_get_edge_counts(BatchGetEdgeCountsRequest { user_ids: chunk.to_vec(), consistency_token: String::new() })
                .await
                .map_err(|s| {
                    tracing::warn!(code = ?s.code(), message = s.message(), "projection-svc did not answer");
                    ApiError::unavailable(socialgraph_server::REASON_PEER, "projection-svc unavailable; retry")
                })?
                .into_inner();
            counts.extend(r.counts.iter().map(|c| EdgeCounts {
                user_id: c.user_id,
                followings: c.followings,
                followers: c.followers,
                version: c.version,
            }));
            next_offsets = Some(merge_offsets(next_offsets, r.offsets.iter().map(|o| (o.partition, o.next_offset)).collect()));
        }
        Ok(ProjectionCounts { counts, next_offsets: next_offsets.unwrap_or_default() })
    }

    /// Copies into the counters of `users` the projection's follow counts once the projection
    /// has applied the edge change of `token` (it waits for that, bounded); newer versions only,
    /// as always. When the token's follower is among `users` and its followings come from
    /// relation events, then waits (bounded, polling this service's own Redis) until the
    /// relation consumer has copied the token's followings version or a newer one.
    ///
    /// # Errors
    /// UNAVAILABLE when projection-svc does not answer or a change is not applied in time
    /// (reason NOT_YET_CONSISTENT), or Redis is down.
    pub async fn sync_after(&self, users: &[i64], token: ConsistencyToken) -> ApiResult<()> {
        self.sync_projection_after(users, token).await?;
        if token.followings_version <= 0 || !users.contains(&token.follower_id) {
            return Ok(());
        }
        let deadline = tokio::time::Instant::now() + CONSISTENCY_WAIT;
        loop {
            let stored = self.store.read_stored(token.follower_id).await.map_err(cache_error)?;
            // -1: the followings are the projection's, copied above after the change.
            if stored.is_none_or(|s| s.followings_version < 0 || s.followings_version >= token.followings_version) {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(ApiError::unavailable("NOT_YET_CONSISTENT", "the followings of the consistency token are not applied yet; retry"));
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    /// The projection's part of [`Self::sync_after`].
    async fn sync_projection_after(&self, users: &[i64], token: ConsistencyToken) -> ApiResult<()> {
        let r = self
            .projection
            .clone()
            .batch_get_edge_counts(BatchGetEdgeCountsRequest { user_ids: users.to_vec(), consistency_token: token.encode() })
            .await
            .map_err(|s| {
                if socialgraph_server::reason_of(&s).as_deref() == Some("NOT_YET_CONSISTENT") {
                    return ApiError::unavailable("NOT_YET_CONSISTENT", "the change of the consistency token is not applied yet; retry");
                }
                tracing::warn!(code = ?s.code(), message = s.message(), "projection-svc did not answer");
                ApiError::unavailable(socialgraph_server::REASON_PEER, "projection-svc unavailable; retry")
            })?
            .into_inner();
        let counts: Vec<EdgeCounts> = r
            .counts
            .iter()
            .map(|c| EdgeCounts { user_id: c.user_id, followings: c.followings, followers: c.followers, version: c.version })
            .collect();
        self.store.sync_edges(&counts, false).await.map_err(cache_error)?;
        Ok(())
    }

    /// Re-reads up to [`RESYNC_ENTITIES`] of the owner's entities and copies their counts into
    /// its likes/favs received (newer sequences only).
    async fn resync_owner(&self, user_id: i64) -> Result<(), CacheError> {
        let entities = self.store.received_entities(user_id, RESYNC_ENTITIES).await?;
        if entities.is_empty() {
            return Ok(());
        }
        let states = self.store.entity_states(&entities).await?;
        self.store.owner_sync(&[(user_id, states)]).await.map(|_| ())
    }

    /// Checks one user's counters against the facts and repairs drift: follow counts of the
    /// version they claim, posts against the posts set, likes/favs received against the owned
    /// entities' counts. Creates the counters when missing. Returns whether drift was repaired.
    async fn verify(&self, user_id: i64) -> ApiResult<bool> {
        self.resync_owner(user_id).await.map_err(cache_error)?;
        let counts = self.edge_counts(&[user_id]).await?.counts.pop().unwrap_or_default();
        match self.store.check(counts).await.map_err(cache_error)? {
            Checked::Missing => {
                self.store.sync_edges(&[counts], false).await.map_err(cache_error)?;
                Ok(false)
            }
            Checked::Agreed { .. } => Ok(false),
            Checked::Repaired => {
                self.repairs.inc();
                tracing::warn!(user_id, followings = counts.followings, followers = counts.followers, "counter drift repaired");
                Ok(true)
            }
        }
    }

    /// Rebuilds one user's counters from the facts (admin); returns them.
    ///
    /// # Errors
    /// UNAVAILABLE when projection-svc or Redis is down.
    pub async fn rebuild(&self, user_id: i64) -> ApiResult<Sds> {
        self.verify(user_id).await?;
        self.rebuilds.inc();
        let after = self.store.read(&[user_id]).await.map_err(cache_error)?.pop().flatten();
        after.ok_or_else(|| ApiError::unavailable(socialgraph_server::REASON_REDIS, "counters vanished during the rebuild"))
    }

    /// One user's rest period between sampled checks: the configured interval plus up to a
    /// fifth more, at random, so that users first read together do not fall due together.
    fn rest_secs(&self) -> u64 {
        let base = self.check_interval_secs;
        base + rand::rng().random_range(0..=base / 5)
    }

    /// Runs the sampled check of the users of one read whose rest period is over, in the
    /// background: one round trip finds them (and starts their next period), then each is
    /// checked in turn. At most [`CHECK_SLOTS`] such tasks run; when all are busy the read's
    /// users go unchecked this time.
    fn maybe_check(self: &Arc<Self>, user_ids: Vec<i64>) {
        if self.check_interval_secs == 0 || user_ids.is_empty() {
            return;
        }
        // Most reads are of users this instance already scheduled: no round trip for them.
        let user_ids: Vec<i64> = user_ids.into_iter().filter(|u| !self.resting.contains_key(u)).collect();
        if user_ids.is_empty() {
            return;
        }
        let Ok(permit) = Arc::clone(&self.check_slots).try_acquire_owned() else {
            return;
        };
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let _permit = permit;
            for u in &user_ids {
                me.resting.insert(*u, ());
            }
            let periods: Vec<(i64, u64)> = user_ids.into_iter().map(|u| (u, me.rest_secs())).collect();
            match me.store.checks_due(&periods).await {
                Ok(due) => {
                    for u in due {
                        if let Err(e) = me.verify(u).await {
                            tracing::debug!(user_id = u, error = %e, "sampled check skipped");
                        }
                    }
                }
                Err(e) => tracing::debug!(error = %e, "sampled check unavailable"),
            }
        });
    }

    /// Counters of each user, in request order, read in one round trip; missing or malformed
    /// ones are created first (one BatchGetEdgeCounts for all of them). Users read for the
    /// first time start their check rest period then.
    ///
    /// Ids are validated by the caller.
    ///
    /// # Errors
    /// UNAVAILABLE.
    pub async fn get(self: &Arc<Self>, user_ids: &[i64]) -> ApiResult<Vec<Sds>> {
        let mut read = self.store.read(user_ids).await.map_err(cache_error)?;
        let missing: Vec<i64> = user_ids.iter().zip(&read).filter(|(_, v)| v.is_none()).map(|(u, _)| *u).collect();
        let present: Vec<i64> = user_ids.iter().zip(&read).filter(|(_, v)| v.is_some()).map(|(u, _)| *u).collect();
        if !missing.is_empty() {
            let counts = self.edge_counts(&missing).await?.counts;
            let periods: Vec<(i64, u64)> =
                if self.check_interval_secs > 0 { missing.iter().map(|u| (*u, self.rest_secs())).collect() } else { Vec::new() };
            let created = self.store.create(&counts, &periods).await.map_err(cache_error)?;
            self.rebuilds.inc_by(missing.len() as u64);
            for (u, _) in &periods {
                self.resting.insert(*u, ());
            }
            let mut created = created.into_iter();
            for v in read.iter_mut().filter(|v| v.is_none()) {
                *v = created.next().flatten();
            }
        }
        self.maybe_check(present);
        read.into_iter()
            .map(|v| v.ok_or_else(|| ApiError::unavailable(socialgraph_server::REASON_REDIS, "counters vanished while being created")))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_one_answer_did_not_name_counts_as_not_applied() {
        // The first answer was read before the projection stored any position of partition 0,
        // the second after it had applied partition 0 up to offset 10.
        let first: HashMap<i32, i64> = [(1, 7)].into();
        let second: HashMap<i32, i64> = [(0, 10), (1, 5)].into();
        let merged = merge_offsets(Some(merge_offsets(None, first.clone())), second.clone());
        assert_eq!(merged, [(1, 5)].into(), "partition 0 is not applied for the first answer's users; partition 1 up to the oldest");
        let merged = merge_offsets(Some(second), first);
        assert_eq!(merged, [(1, 5)].into(), "in either order");
        assert_eq!(merge_offsets(None, [(0, 3)].into()), [(0, 3)].into(), "one answer: its own positions");
    }
}
