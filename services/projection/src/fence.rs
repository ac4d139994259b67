//! The position fence of projection-svc's cache fills (follower windows, their relationship
//! hashes, authors' post lists).
//!
//! A batch reaches the cache before its transaction commits (the follower windows just
//! before, the post lists inside it), its position first: the partition's next offset in the
//! consumer's mark hash (`sg:capp:{consumer/topic}`, [`socialgraph_cache::lists::AppliedMark`]).
//! A batch applied to a list that is not cached changes nothing there, so a fill must not
//! commit a database read that misses a batch the cache had already applied. A fill therefore
//! reads its rows and the consumer's stored offsets in one snapshot and writes to the cache only
//! when, for **every partition of the topic**, the mark hash holds a position and the stored
//! offset is at least that far ([`Fence::covers`]; a partition never stored counts as 0).
//!
//! Every partition, not only those the hash names: the cache Redis may evict the hash or lose
//! it (a flush, a restart of a Redis that keeps nothing on disk). A batch applied before that
//! and committed after it would otherwise be missing from a fill that saw no mark for it, and
//! no later event would bring it back. Each consumer writes its partition's position again
//! whenever the partition is idle ([`Fence::mark`], from [`BatchHandler::idle`], at most every
//! [`IDLE_EVERY`]) and with every batch, and a position only grows (a late or repeated older
//! one changes nothing). A partition's task writes either only between batches: an idle
//! position is the stored one, so every batch it had applied to the cache is committed, except
//! one whose transaction failed, which the task applies again (cache first) before going on.
//! Until every partition is marked again, fills wait (then give up, `result="behind"`) and
//! reads go to the database.
//!
//! [`BatchHandler::idle`]: socialgraph_events::consumer::BatchHandler::idle
//! [`IDLE_EVERY`]: socialgraph_events::consumer::IDLE_EVERY

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

use sea_orm::{ConnectionTrait, DbErr};
use socialgraph_cache::lists::{AppliedMark, ListCache};
use socialgraph_domain::Edge;
use socialgraph_storage::offsets::{self, StoredOffset};

/// Longest a fill waits for every partition's mark and for the projection's commits to cover
/// them.
pub const FILL_WAIT: Duration = Duration::from_secs(2);

/// Boxed error of a fill (cache or database).
pub type FillError = Box<dyn std::error::Error + Send + Sync>;

/// One consumer's positions on one topic, as the cache fills check them.
#[derive(Debug)]
pub struct Fence {
    consumer: String,
    topic: String,
    /// `consumer/topic`: names the mark hash.
    key: String,
    /// The topic's partition count, once the consumer has read it from the broker.
    partitions: OnceLock<i32>,
}

impl Fence {
    /// The fence of `consumer` (its name in `consumer_offset`) on `topic`. It covers nothing
    /// until [`Self::set_partitions`].
    pub fn new(consumer: &str, topic: &str) -> Self {
        Self { consumer: consumer.to_owned(), topic: topic.to_owned(), key: format!("{consumer}/{topic}"), partitions: OnceLock::new() }
    }

    /// The name of the mark hash (`consumer/topic`).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The consumer's stored offsets on the topic (read inside the fill's snapshot `conn`).
    ///
    /// # Errors
    /// The database failed.
    pub async fn stored<C: ConnectionTrait>(&self, conn: &C) -> Result<Vec<StoredOffset>, DbErr> {
        offsets::list(conn, &self.consumer, &self.topic).await
    }

    /// The consumer's stored offsets and the `follower` rows of `followers` → `followee` in one
    /// snapshot by one statement (PostgreSQL); `None` where that needs a transaction (see
    /// [`socialgraph_storage::offsets::with_follower_edges`]).
    ///
    /// # Errors
    /// Database errors.
    pub async fn stored_with_followers<C: ConnectionTrait>(
        &self,
        conn: &C,
        followee: i64,
        followers: &[i64],
    ) -> Result<Option<(Vec<StoredOffset>, Vec<Edge>)>, DbErr> {
        offsets::with_follower_edges(conn, &self.consumer, &self.topic, followee, followers).await
    }

    /// Records the topic's partition count (the first call wins; the count of a topic never
    /// shrinks).
    pub fn set_partitions(&self, total: i32) {
        let _ = self.partitions.set(total);
    }

    /// True when `applied` (the mark hash) holds a position for every partition of the topic
    /// and `stored` (the consumer's offsets, read in the fill's snapshot) is at least as far in
    /// each; false while the partition count is unknown.
    pub fn covers(&self, applied: &HashMap<i32, i64>, stored: &[StoredOffset]) -> bool {
        let Some(&total) = self.partitions.get() else { return false };
        covers(total, applied, stored)
    }

    /// Reads with `read` (rows and the stored offsets, in one snapshot) until they cover the
    /// mark hash as `list` holds it then ([`Self::covers`]); `None` when they still do not
    /// after [`FILL_WAIT`]. Call it after the fill's marker is set: every read of the marks here
    /// comes after it, and positions only grow.
    ///
    /// # Errors
    /// The cache Redis or the database failed.
    pub async fn read_covering<T, F, Fut>(&self, list: &ListCache, mut read: F) -> Result<Option<T>, FillError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<(T, Vec<StoredOffset>), DbErr>>,
    {
        let deadline = tokio::time::Instant::now() + FILL_WAIT;
        loop {
            let applied = list.applied(&self.key).await?;
            if self.partitions.get().is_some_and(|&total| (0..total).all(|p| applied.contains_key(&p))) {
                let (value, stored) = read().await?;
                if self.covers(&applied, &stored) {
                    return Ok(Some(value));
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(None);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Writes `partition`'s position (`next_offset`: every record before it is applied to the
    /// cache and committed, 0 when none ever was) into the mark hash held by `list`, from an
    /// idle consumer ([`socialgraph_events::consumer::BatchHandler::idle`]). A failure is logged: the next idle call writes it
    /// again.
    pub async fn mark(&self, list: &ListCache, partition: i32, next_offset: i64) {
        if let Err(e) = list.apply(&[], Some(AppliedMark { key: &self.key, partition, next_offset })).await {
            tracing::debug!(error = %e, key = self.key, partition, "could not write a consumer's position to the cache");
        }
    }
}

/// [`Fence::covers`] for a topic of `total` partitions: a mark for each of them, and every
/// mark covered (also of a partition added to the topic since `total` was read).
fn covers(total: i32, applied: &HashMap<i32, i64>, stored: &[StoredOffset]) -> bool {
    let done = |p: i32| stored.iter().find(|s| s.partition == p).map_or(0, |s| s.next_offset);
    (0..total).all(|p| applied.contains_key(&p)) && applied.iter().all(|(&p, &mark)| done(p) >= mark)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(list: &[(i32, i64)]) -> Vec<StoredOffset> {
        list.iter().map(|&(partition, next_offset)| StoredOffset { partition, next_offset, last_event_ms: None }).collect()
    }

    #[test]
    fn every_partition_needs_a_mark_and_a_commit_at_least_as_far() {
        let applied: HashMap<i32, i64> = [(0, 10), (1, 0), (2, 7)].into();
        assert!(covers(3, &applied, &stored(&[(0, 10), (2, 9)])), "a partition never stored counts as 0");
        assert!(!covers(3, &applied, &stored(&[(0, 9), (2, 9)])), "partition 0's batch is not committed yet");
        assert!(!covers(4, &applied, &stored(&[(0, 10), (1, 5), (2, 9), (3, 5)])), "partition 3 has no mark (lost with the hash)");
        assert!(!covers(1, &HashMap::new(), &stored(&[(0, 100)])), "an empty hash covers nothing");
        let grown: HashMap<i32, i64> = [(0, 10), (1, 0), (2, 7), (3, 4)].into();
        assert!(!covers(3, &grown, &stored(&[(0, 10), (2, 9), (3, 3)])), "a partition added since the count was read");
    }

    #[test]
    fn an_unknown_partition_count_covers_nothing() {
        let fence = Fence::new("projection", "sg.relation.v1");
        let applied: HashMap<i32, i64> = [(0, 1)].into();
        assert!(!fence.covers(&applied, &stored(&[(0, 5)])));
        fence.set_partitions(1);
        fence.set_partitions(7);
        assert!(fence.covers(&applied, &stored(&[(0, 5)])), "the first count stays");
        assert_eq!(fence.key(), "projection/sg.relation.v1");
    }
}
