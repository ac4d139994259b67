//! Reads of user counters with self-healing, and rebuilds that agree with the log.
//!
//! A rebuild takes followings and followers from projection-svc together with the
//! per-partition offsets they reflect (one snapshot), and writes them with those positions as
//! the user's guards — but only if the counters have applied nothing beyond them (else it waits
//! for the projection to catch up and retries). Events already in the value are then skipped
//! and later ones applied, whenever the rebuild runs (DESIGN.md §5).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use rand::Rng;
use tokio::sync::Semaphore;

use futures::StreamExt;
use prometheus::IntCounter;
use socialgraph_cache::CacheError;
use socialgraph_cache::counters::{Sds, field};
use socialgraph_cache::keys::partition_field;
use socialgraph_proto::projection::v1::GetEdgeCountsRequest;
use socialgraph_proto::projection::v1::projection_service_client::ProjectionServiceClient;
use socialgraph_server::{ApiError, ApiResult};
use tonic::transport::Channel;

use crate::store::{RebuildValues, Store};

/// Missing counters of one batch rebuilt at once.
const REBUILD_CONCURRENCY: usize = 32;

/// Sampled checks running at once across all reads; a read that finds them all busy skips
/// its check (it is a sample), so checks never queue behind reads or slow them.
pub const CHECK_SLOTS: usize = 2;

/// The user-counter side of counter-svc.
pub struct Counters {
    /// Redis.
    pub store: Store,
    /// projection-svc.
    pub projection: ProjectionServiceClient<Channel>,
    /// The relation topic and its partition count (0 until known).
    pub relation_topic: String,
    /// Partition count of the relation topic, learnt when the consumers start.
    pub relation_partitions: Arc<AtomicI32>,
    /// Seconds between sampled checks of one user (0 = off).
    pub check_interval_secs: u64,
    /// How long a rebuild waits for the projection to catch up.
    pub rebuild_wait: Duration,
    /// Rebuilds written.
    pub rebuilds: IntCounter,
    /// Sampled checks that found drift and repaired it.
    pub repairs: IntCounter,
    /// Permits for sampled checks in flight ([`CHECK_SLOTS`]).
    pub check_slots: Arc<Semaphore>,
}

pub(crate) fn cache_error(e: CacheError) -> ApiError {
    if e.is_unavailable() {
        tracing::warn!(error = %e, "redis unavailable");
        ApiError::Unavailable("redis unavailable".into())
    } else {
        ApiError::internal(e)
    }
}

/// What a rebuild attempt saw.
struct Snapshot {
    values: RebuildValues,
    positions: Vec<(String, i64)>,
}

impl Counters {
    async fn snapshot(&self, user_id: i64, current: Option<Sds>) -> ApiResult<Snapshot> {
        let counts = self
            .projection
            .clone()
            .get_edge_counts(GetEdgeCountsRequest { user_id })
            .await
            .map_err(|s| ApiError::Unavailable(format!("projection-svc: {}", s.message())))?
            .into_inner();
        let mut next: HashMap<i32, i64> = counts.offsets.iter().map(|o| (o.partition, o.next_offset)).collect();
        for p in 0..self.relation_partitions.load(Ordering::Relaxed) {
            next.entry(p).or_insert(0);
        }
        let positions = next.into_iter().map(|(p, n)| (partition_field(&self.relation_topic, p), n - 1)).collect();
        // Likes and favourites received keep their applied values: their facts are the entity
        // counters, which their own consumer keeps exact.
        let kept = current.unwrap_or_default();
        let values = RebuildValues {
            followings: counts.followings,
            followers: counts.followers,
            likes_received: i64::from(kept.0[field::LIKES_RECEIVED]),
            favs_received: i64::from(kept.0[field::FAVS_RECEIVED]),
        };
        Ok(Snapshot { values, positions })
    }

    /// Rebuilds one user's counters from the facts, consistent with the log; returns them.
    ///
    /// # Errors
    /// UNAVAILABLE when projection-svc or Redis is down, or the projection stays behind this
    /// consumer for longer than the configured wait.
    pub async fn rebuild(&self, user_id: i64) -> ApiResult<Sds> {
        let start = Instant::now();
        let mut wait = Duration::from_millis(5);
        loop {
            let current = self.store.read(&[user_id]).await.map_err(cache_error)?.pop().flatten();
            let snap = self.snapshot(user_id, current).await?;
            if self.store.rebuild(user_id, snap.values, &snap.positions, self.rest_secs()).await.map_err(cache_error)?.is_some() {
                self.rebuilds.inc();
                let after = self.store.read(&[user_id]).await.map_err(cache_error)?.pop().flatten();
                return after.ok_or_else(|| ApiError::Unavailable("counters vanished during the rebuild".into()));
            }
            if start.elapsed() > self.rebuild_wait {
                return Err(ApiError::Unavailable("projection-svc is behind the counter consumer; retry later".into()));
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_millis(200));
        }
    }

    /// The sampled check: when the counters reflect exactly the projection's positions and
    /// still differ from its counts, they drifted: rewrite them and count a repair.
    async fn check(&self, user_id: i64) -> ApiResult<()> {
        let Some(current) = self.store.read(&[user_id]).await.map_err(cache_error)?.pop().flatten() else {
            return Ok(());
        };
        let guards = self.store.guard_map(user_id).await.map_err(cache_error)?;
        let snap = self.snapshot(user_id, Some(current)).await?;
        let same_position = snap.positions.iter().all(|(f, last)| guards.get(f).copied().unwrap_or(-1) == *last);
        let differs = i64::from(current.0[field::FOLLOWINGS]) != snap.values.followings
            || i64::from(current.0[field::FOLLOWERS]) != snap.values.followers;
        if same_position && differs {
            if self.store.rebuild(user_id, snap.values, &snap.positions, 0).await.map_err(cache_error)?.is_some() {
                self.repairs.inc();
                tracing::warn!(user_id, ?current, followings = snap.values.followings, followers = snap.values.followers, "counter drift repaired");
            }
        }
        Ok(())
    }

    /// One user's rest period between sampled checks: the configured interval plus up to a
    /// fifth more, at random, so that users first read together do not fall due together.
    /// 0 when checks are off.
    fn rest_secs(&self) -> u64 {
        let base = self.check_interval_secs;
        if base == 0 { 0 } else { base + rand::rng().random_range(0..=base / 5) }
    }

    /// Runs the sampled check of the users of one read whose rest period is over, in the
    /// background: one round trip finds them (and starts their next period), then each is
    /// checked in turn. At most [`CHECK_SLOTS`] such tasks run; when all are busy the read's
    /// users go unchecked this time.
    fn maybe_check(self: &Arc<Self>, user_ids: Vec<i64>) {
        if self.check_interval_secs == 0 || user_ids.is_empty() {
            return;
        }
        let Ok(permit) = Arc::clone(&self.check_slots).try_acquire_owned() else {
            return;
        };
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let _permit = permit;
            let periods: Vec<(i64, u64)> = user_ids.into_iter().map(|u| (u, me.rest_secs())).collect();
            match me.store.checks_due(&periods).await {
                Ok(due) => {
                    for u in due {
                        if let Err(e) = me.check(u).await {
                            tracing::debug!(user_id = u, error = %e, "sampled check skipped");
                        }
                    }
                }
                Err(e) => tracing::debug!(error = %e, "sampled check unavailable"),
            }
        });
    }

    /// Counters of each user, in request order, read in one round trip; missing or malformed
    /// ones are rebuilt first.
    ///
    /// Ids are validated by the caller.
    ///
    /// # Errors
    /// UNAVAILABLE.
    pub async fn get(self: &Arc<Self>, user_ids: &[i64]) -> ApiResult<Vec<Sds>> {
        let read = self.store.read(user_ids).await.map_err(cache_error)?;
        let present: Vec<i64> = user_ids.iter().zip(&read).filter(|(_, v)| v.is_some()).map(|(u, _)| *u).collect();
        // Missing counters are rebuilt concurrently (each waits on projection-svc and Redis).
        let missing: Vec<i64> = user_ids.iter().zip(&read).filter(|(_, v)| v.is_none()).map(|(u, _)| *u).collect();
        let futures: Vec<_> = missing.into_iter().map(|u| self.rebuild(u)).collect();
        let rebuilt: Vec<ApiResult<Sds>> = futures::stream::iter(futures).buffered(REBUILD_CONCURRENCY).collect().await;
        let mut rebuilt = rebuilt.into_iter();
        let mut out = Vec::with_capacity(user_ids.len());
        for v in read {
            match v {
                Some(s) => out.push(s),
                None => out.push(rebuilt.next().unwrap_or_else(|| Err(ApiError::Unavailable("rebuild missing".into())))?),
            }
        }
        self.maybe_check(present);
        Ok(out)
    }
}
