//! Each author's newest posts in the cache Redis (`sg:pst:{uid}`, `cache.posts_window` of
//! them; [`socialgraph_cache::lists`], direction `Posts`), kept by the content consumer as a
//! pseudo-replica and serving ListAuthorPosts.
//!
//! The content consumer ([`super::ingest`]) applies each batch's outcome (posts recorded,
//! tombstones) to the cache with the batch's position, inside the batch's transaction and before
//! its commit; when the cache Redis does not take it, the authors are marked in `cache_stale` in
//! that transaction and the stale drain deletes their lists. A fill (on a miss, in the
//! background) reads the author's window and the content consumer's offsets in one snapshot and
//! commits only when those offsets cover every position the cache had applied when the fill's
//! marker was set, in every partition, exactly as the follower windows do ([`crate::fence`]). Entries carry version 1
//! while live and 2 once deleted, so copies, replays and a publish after its delete change
//! nothing.

use std::sync::Arc;

use prometheus::IntCounterVec;
use sea_orm::DatabaseConnection;
use socialgraph_cache::CacheError;
use socialgraph_cache::lists::{AppliedMark, CachedEdge, FillSlots, ListCache, PageRead};
use socialgraph_storage::feed::{FeedEntry, FeedKey};
use socialgraph_storage::feed_window;

use crate::cache::{NOT_FOLLOWED_MAX_PER_WINDOW, snapshot};
use crate::fence::{Fence, FillError};

/// The authors' post lists in the cache Redis, as projection-svc keeps and reads them.
pub struct PostCache {
    list: ListCache,
    /// The positions of the content consumer (its name in `consumer_offset`) and topic.
    pub fence: Fence,
    fills: FillSlots,
    /// `sg_cache_requests_total` (cache `posts`).
    requests: IntCounterVec,
    /// `sg_cache_fills_total` (cache `posts`).
    fills_done: IntCounterVec,
}

/// A change of a post for [`PostCache::apply`]: (author, the post as the list holds it).
pub type PostChange = (i64, CachedEdge);

impl PostCache {
    /// The post lists of `list`, kept from `consumer`'s batches of `topic`, counting into the
    /// list caches' `requests` and `fills` metrics.
    pub fn new(list: ListCache, consumer: &str, topic: &str, requests: IntCounterVec, fills: IntCounterVec) -> Self {
        Self { list, fence: Fence::new(consumer, topic), fills: FillSlots::default(), requests, fills_done: fills }
    }

    /// Applies one content batch's outcome, recording its position (`partition`, `next_offset`)
    /// first; idempotent (versions).
    ///
    /// # Errors
    /// The cache Redis is unreachable, slow or failing: the caller marks the authors stale.
    pub async fn apply(&self, changes: &[PostChange], partition: i32, next_offset: i64) -> Result<(), CacheError> {
        let mark = AppliedMark { key: self.fence.key(), partition, next_offset };
        self.list.apply(changes, Some(mark)).await.map(|_| ())
    }

    /// Writes `partition`'s position while the content consumer is idle ([`Fence::mark`]).
    pub async fn mark_idle(&self, partition: i32, next_offset: i64) {
        self.fence.mark(&self.list, partition, next_offset).await;
    }

    /// Drops the lists of `authors` (best effort: a cache that does not answer keeps them until
    /// their lifetime ends).
    pub async fn evict(&self, authors: &[i64]) {
        if let Err(e) = self.list.evict(authors).await {
            tracing::warn!(error = %e, "could not drop post lists an unfinished batch changed");
        }
    }

    /// Up to `limit` live posts of `author_id` strictly older than `before`, newest first, from
    /// the cache; `None` when the database must answer (a miss, which also starts a fill; a page
    /// past the window; a cache that is down).
    pub async fn page(self: &Arc<Self>, db: &DatabaseConnection, author_id: i64, before: Option<FeedKey>, limit: usize) -> Option<Vec<FeedEntry>> {
        let count = |result: &str| self.requests.with_label_values(&["posts", "ListAuthorPosts", result]).inc();
        let after = before.map(|k| (k.created_at_ms, k.post_id));
        match self.list.page(author_id, after, limit).await {
            Ok(PageRead::Hit(v)) => {
                count("hit");
                Some(v.into_iter().map(|(post_id, created_at_ms)| FeedEntry { key: FeedKey { created_at_ms, post_id }, author_id }).collect())
            }
            Ok(PageRead::PastWindow(_)) => {
                count("past_window");
                None
            }
            Ok(PageRead::Miss) => {
                count("miss");
                self.spawn_fill(db, author_id);
                None
            }
            Err(e) => {
                tracing::debug!(error = %e, "cache unavailable: reading the database");
                count("fallback");
                None
            }
        }
    }

    fn spawn_fill(self: &Arc<Self>, db: &DatabaseConnection, author_id: i64) {
        let Ok(slot) = self.fills.try_start(author_id) else { return };
        let (this, db) = (Arc::clone(self), db.clone());
        tokio::spawn(async move {
            let _slot = slot;
            let result = this.fill(&db, author_id).await.unwrap_or_else(|e| {
                tracing::debug!(author_id, error = %e, "post list fill failed");
                "failed"
            });
            this.fills_done.with_label_values(&["posts", result]).inc();
        });
    }

    /// Fills `author_id`'s list: marker, then the positions applied to the cache and the window
    /// and the offsets in one snapshot until those cover the positions of every partition
    /// ([`Fence::read_covering`]), then the merge.
    async fn fill(&self, db: &DatabaseConnection, author_id: i64) -> Result<&'static str, FillError> {
        let Some(nonce) = self.list.begin_fill(author_id).await? else { return Ok("skipped") };
        let window = self.list.limits().window;
        let snapshot_read = || async {
            let txn = snapshot(db).await?;
            let stored = self.fence.stored(&txn).await?;
            let read = feed_window::author_window(&txn, author_id, window, NOT_FOLLOWED_MAX_PER_WINDOW * window.max(1)).await?;
            txn.commit().await?;
            Ok((read, stored))
        };
        let Some(read) = self.fence.read_covering(&self.list, snapshot_read).await? else { return Ok("behind") };
        let Some(read) = read else {
            self.list.mark_too_long(author_id).await?;
            return Ok("too_long");
        };
        let live = read.live.iter().map(|e| CachedEdge::post(e.key.post_id, e.key.created_at_ms, false));
        let deleted = read.deleted.iter().map(|e| CachedEdge::post(e.key.post_id, e.key.created_at_ms, true));
        let cached: Vec<CachedEdge> = live.chain(deleted).collect();
        let boundary = read.boundary.map(|b| (b.created_at_ms, b.post_id));
        Ok(if self.list.commit_fill(author_id, &nonce, &cached, boundary).await? { "cached" } else { "raced" })
    }
}
