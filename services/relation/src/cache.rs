//! relation-svc's side of the following-list cache ([`socialgraph_cache::following`]): reads
//! that try the cache first, fills on a miss, and the write-through after every transaction
//! that changed edges (Follow, Unfollow, blocks, approvals, imports, account jobs), which gives
//! the actor read-your-writes.
//!
//! The cache never decides an answer on its own: a miss fills the list from the `following`
//! table and answers from the rows read; a cache that is down, slow or failing answers nothing
//! and the read goes to the database (`sg_cache_requests_total{result="fallback"}`). The event
//! stream (projection-svc) keeps cached lists in step with every change, whoever made it; the
//! write-through only makes the actor's change visible before the event arrives.

use prometheus::{IntCounterVec, Opts, Registry};
use socialgraph_cache::following::{CachedEdge, FollowingCache};
use socialgraph_domain::{Cursor, Edge, EdgeState, ListEntry};
use socialgraph_server::{ApiResult, db_error};
use socialgraph_storage::edges::{self, EdgeTable};

use crate::service::Relations;

/// Metrics of the following-list cache.
#[derive(Clone)]
pub struct CacheMetrics {
    /// Reads by `rpc` and `result` (hit, miss, fallback).
    pub requests: IntCounterVec,
    /// Fills by `result` (cached, raced, too_long).
    pub fills: IntCounterVec,
    /// Write-throughs by `result` (ok, failed).
    pub writes: IntCounterVec,
}

impl CacheMetrics {
    /// Registers `sg_cache_requests_total`, `sg_cache_fills_total` and
    /// `sg_cache_writes_total` (label `cache="following"`) in `registry`.
    ///
    /// # Errors
    /// A metric of the same name is already registered.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let requests = IntCounterVec::new(
            Opts::new("sg_cache_requests_total", "Cache reads by cache, RPC and result (hit, miss, fallback)"),
            &["cache", "rpc", "result"],
        )?;
        let fills = IntCounterVec::new(
            Opts::new("sg_cache_fills_total", "Cache fills from the database by cache and result (cached, raced, too_long)"),
            &["cache", "result"],
        )?;
        let writes = IntCounterVec::new(
            Opts::new("sg_cache_writes_total", "Write-throughs of the caller's own changes by cache and result"),
            &["cache", "result"],
        )?;
        for m in [&requests, &fills, &writes] {
            registry.register(Box::new(m.clone()))?;
        }
        Ok(Self { requests, fills, writes })
    }
}

/// The cache and its metrics, as relation-svc holds them.
#[derive(Clone)]
pub struct Caches {
    /// Following lists.
    pub following: FollowingCache,
    /// Longest following list that is cached.
    pub following_max: i64,
    /// Metrics.
    pub metrics: CacheMetrics,
}

/// What a cache read found.
enum Looked<T> {
    Hit(T),
    Miss,
    Fallback,
}

/// The cache's form of a `following` edge.
pub(crate) fn cached_edge(e: &Edge) -> CachedEdge {
    CachedEdge { followee_id: e.followee_id, version: e.version, following: e.state == EdgeState::Following, followed_at_ms: e.followed_at_ms }
}

/// The list order: followed_at desc, then peer id desc.
fn list_order(a: &ListEntry, b: &ListEntry) -> std::cmp::Ordering {
    (b.followed_at_ms, b.user_id).cmp(&(a.followed_at_ms, a.user_id))
}

impl Caches {
    fn count(&self, rpc: &str, result: &str) {
        self.metrics.requests.with_label_values(&["following", rpc, result]).inc();
    }

    fn looked<T>(&self, rpc: &str, r: Result<Option<T>, socialgraph_cache::CacheError>) -> Looked<T> {
        match r {
            Ok(Some(v)) => {
                self.count(rpc, "hit");
                Looked::Hit(v)
            }
            Ok(None) => {
                self.count(rpc, "miss");
                Looked::Miss
            }
            Err(e) => {
                self.count(rpc, "fallback");
                tracing::debug!(error = %e, rpc, "cache unavailable: reading the database");
                Looked::Fallback
            }
        }
    }
}

impl Relations {
    /// Up to `limit` entries of `user_id`'s following list after `after`, in list order: from
    /// the cache, or from a fill on a miss, or from the database.
    ///
    /// # Errors
    /// UNAVAILABLE when the database fails.
    pub(crate) async fn following_entries(&self, user_id: i64, after: Option<Cursor>, limit: usize) -> ApiResult<Vec<ListEntry>> {
        let db_page = || async { edges::list(&self.db, EdgeTable::Following, user_id, after, limit).await.map_err(db_error) };
        let Some(c) = &self.caches else { return db_page().await };
        let cursor = after.map(|a| (a.followed_at_ms, a.peer_id));
        match c.looked("ListFollowing", c.following.page(user_id, cursor, limit).await) {
            Looked::Hit(v) => return Ok(v.into_iter().map(|(user_id, followed_at_ms)| ListEntry { user_id, followed_at_ms }).collect()),
            Looked::Fallback => return db_page().await,
            Looked::Miss => {}
        }
        let Some(rows) = self.fill_following(c, user_id).await? else { return db_page().await };
        let mut entries: Vec<ListEntry> = rows
            .iter()
            .map(|e| ListEntry { user_id: e.followee_id, followed_at_ms: e.followed_at_ms })
            .filter(|e| after.is_none_or(|a| is_after(e, a)))
            .collect();
        entries.sort_by(list_order);
        entries.truncate(limit);
        Ok(entries)
    }

    /// followed_at of `user_id`'s edge to each of `others` (input order), from the cache or a
    /// fill; `None` when the caller must read the database.
    ///
    /// # Errors
    /// UNAVAILABLE when the database fails during a fill.
    pub(crate) async fn cached_following_at(&self, rpc: &str, user_id: i64, others: &[i64]) -> ApiResult<Option<Vec<Option<i64>>>> {
        let Some(c) = &self.caches else { return Ok(None) };
        match c.looked(rpc, c.following.scores(user_id, others).await) {
            Looked::Hit(v) => return Ok(Some(v)),
            Looked::Fallback => return Ok(None),
            Looked::Miss => {}
        }
        let Some(rows) = self.fill_following(c, user_id).await? else { return Ok(None) };
        let at: std::collections::HashMap<i64, i64> = rows.iter().map(|e| (e.followee_id, e.followed_at_ms)).collect();
        Ok(Some(others.iter().map(|o| at.get(o).copied()).collect()))
    }

    /// Fills `user_id`'s cached list: marker first, then the database read, then the merge
    /// (see [`socialgraph_cache::following`] for why this order closes the fill race). Returns
    /// the followed edges read, or `None` when the cache is unusable (down, or the list
    /// completed meanwhile: the caller reads the database).
    async fn fill_following(&self, c: &Caches, user_id: i64) -> ApiResult<Option<Vec<Edge>>> {
        let nonce = match c.following.begin_fill(user_id).await {
            Ok(Some(n)) => n,
            Ok(None) | Err(_) => return Ok(None),
        };
        let max = usize::try_from(c.following_max).unwrap_or(0);
        let rows = edges::followed_by_follower(&self.db, user_id, max + 1).await.map_err(db_error)?;
        if rows.len() > max {
            c.metrics.fills.with_label_values(&["following", "too_long"]).inc();
            // Leave the marker to its TTL: the list is never marked complete.
            return Ok(None);
        }
        let cached: Vec<CachedEdge> = rows.iter().map(cached_edge).collect();
        let result = match c.following.commit_fill(user_id, &nonce, &cached).await {
            Ok(true) => "cached",
            Ok(false) | Err(_) => "raced",
        };
        c.metrics.fills.with_label_values(&["following", result]).inc();
        Ok(Some(rows))
    }

    /// Writes the caller's own edge changes (follower id, edge) into the cache
    /// (version-guarded like every apply), so the actor reads them back at once; a failure is
    /// counted and otherwise left to the event stream.
    pub(crate) async fn write_through(&self, changes: &[(i64, CachedEdge)]) {
        let Some(c) = &self.caches else { return };
        let result = match c.following.apply(changes).await {
            Ok(_) => "ok",
            Err(e) => {
                tracing::debug!(error = %e, "cache write-through failed; the event stream will apply the change");
                "failed"
            }
        };
        c.metrics.writes.with_label_values(&["following", result]).inc();
    }

    /// Writes edges a committed transaction changed (imports, approvals, blocks, account
    /// jobs) into the cache, as [`Self::write_through`] does for a Follow.
    pub(crate) async fn write_through_edges(&self, edges: &[Edge]) {
        if self.caches.is_none() || edges.is_empty() {
            return;
        }
        let changes: Vec<(i64, CachedEdge)> = edges.iter().map(|e| (e.follower_id, cached_edge(e))).collect();
        self.write_through(&changes).await;
    }
}

/// True when `e` comes strictly after cursor `a` in list order.
fn is_after(e: &ListEntry, a: Cursor) -> bool {
    (e.followed_at_ms, e.user_id) < (a.followed_at_ms, a.peer_id)
}
