//! projection-svc's side of the list caches ([`socialgraph_cache::lists`]): follower pages from
//! each account's window of newest followers (`cache.followers_window`), deep pages past it
//! read from the database under a per-instance rate limit, and BatchCheckFollowers answered
//! from the window, then from the account's relationship hash, then from one database query
//! whose answers fill the hash.
//!
//! The cache never decides an answer on its own: a miss reads the database (and starts a fill
//! in the background); a cache that is down, slow or failing answers nothing and the read goes
//! to the database (`sg_cache_requests_total{result="fallback"}`, no deep-page limit then: the
//! window cannot tell what is deep).
//!
//! Fills read `follower`, which this service writes itself, and a batch reaches the cache just
//! before its transaction commits. So a fill reads its rows and the stored offsets in one
//! snapshot, and writes to the cache only when those offsets cover every batch the cache had
//! applied when its marker was set, in every partition ([`crate::fence`]); a fill that cannot
//! see that within [`FILL_WAIT`] gives up (`result="behind"`) and a later miss tries again.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use prometheus::{IntCounterVec, Opts, Registry};
use sea_orm::{AccessMode, DatabaseConnection, DbBackend, DbErr, IsolationLevel, TransactionTrait};
use singleflight_async::SingleFlight;
use socialgraph_cache::lists::{CachedEdge, FillSlot, FillSlots, ListCaches, Lookup, PageRead};
use socialgraph_domain::{Cursor, Edge, EdgeState, ListEntry};
use socialgraph_server::{ApiError, ApiResult, db_error};
use socialgraph_storage::edges::{self, EdgeTable};
use socialgraph_storage::offsets::StoredOffset;
use socialgraph_storage::windows::{self, WindowRead};

pub use crate::fence::FILL_WAIT;
use crate::fence::{Fence, FillError};

/// A fill also reads the unfollowed edges inside the window; an account with more than this
/// many per cached follower is not cached (marked too long).
pub const NOT_FOLLOWED_MAX_PER_WINDOW: usize = 4;

/// Reason of the RESOURCE_EXHAUSTED answer to a deep page over the limit.
pub const DEEP_PAGE_LIMITED: &str = "DEEP_PAGE_LIMITED";

/// Metrics of the list caches in projection-svc.
#[derive(Clone)]
pub struct CacheMetrics {
    /// Reads by `cache`, `rpc` and `result` ([`socialgraph_server::cache_counters`]).
    pub requests: IntCounterVec,
    /// Fills by `cache` and `result`.
    pub fills: IntCounterVec,
    /// Follower-window fills running or waiting, by `cache`.
    pub pending: prometheus::IntGaugeVec,
    /// Deep follower pages by `result` (allowed, refused).
    pub deep_pages: IntCounterVec,
    /// Follower pages the cache could not answer, by `result`: `read` (this call read the
    /// database) or `shared` (an identical read in flight answered it).
    pub database_reads: IntCounterVec,
}

impl CacheMetrics {
    /// Registers `sg_cache_requests_total`, `sg_cache_fills_total`, `sg_cache_fills_pending`
    /// and `sg_cache_deep_pages_total` in `registry`.
    ///
    /// # Errors
    /// A metric of the same name is already registered.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let socialgraph_server::CacheCounters { requests, fills, pending } = socialgraph_server::cache_counters(registry)?;
        let deep_pages = IntCounterVec::new(
            Opts::new("sg_cache_deep_pages_total", "Follower pages past the cached window, by result (allowed, refused)"),
            &["result"],
        )?;
        registry.register(Box::new(deep_pages.clone()))?;
        let database_reads = IntCounterVec::new(
            Opts::new(
                "sg_cache_database_reads_total",
                "Follower pages read from the database after the cache, by result (read: this call read it; shared: an identical read in flight answered it)",
            ),
            &["cache", "rpc", "result"],
        )?;
        registry.register(Box::new(database_reads.clone()))?;
        Ok(Self { requests, fills, pending, deep_pages, database_reads })
    }
}

/// The list caches as projection-svc holds them.
pub struct Caches {
    /// Both directions (the projector applies events to both; reads use the followers).
    pub lists: ListCaches,
    /// Follower pages of hot accounts in this instance's memory.
    pub hot: crate::hot::Hot,
    /// Metrics.
    pub metrics: CacheMetrics,
    /// The positions of the consumer (its name in `consumer_offset`) and topic whose batches
    /// the cache holds.
    pub fence: Fence,
    /// Deep pages read from the database per second (per instance).
    deep_pages: DefaultDirectRateLimiter,
    fills: FillSlots,
    /// Follower-page database reads in flight in this instance, by (user, cursor, rows).
    flights: SingleFlight<PageKey, SharedPage>,
}

/// A follower page's read: the user, the cursor it starts after, the rows asked for.
type PageKey = (i64, Option<(i64, i64)>, usize);
/// One database read's answer, shared by every caller that waited for it.
type SharedPage = Result<Arc<Vec<ListEntry>>, Arc<DbErr>>;

impl Caches {
    /// The caches kept from `consumer`'s batches of `topic`, with `deep_pages_per_sec` deep
    /// pages a second (a burst of as many) and the follower windows' `fills`.
    pub fn new(
        lists: ListCaches,
        hot: crate::hot::Hot,
        consumer: &str,
        topic: &str,
        deep_pages_per_sec: u32,
        fills: FillSlots,
        metrics: CacheMetrics,
    ) -> Self {
        let rate = NonZeroU32::new(deep_pages_per_sec).unwrap_or(NonZeroU32::MIN);
        let deep_pages = RateLimiter::direct(Quota::per_second(rate));
        Self { lists, hot, metrics, fence: Fence::new(consumer, topic), deep_pages, fills, flights: SingleFlight::new() }
    }

    /// Up to `limit` rows of `user_id`'s follower list after `after` from the database, for a
    /// page the cache did not answer. Identical reads in flight are one read: a cold burst of
    /// readers of one large account costs the database one page read, not one per reader, as
    /// memcache's leases do for a miss. A joiner may get rows read a moment before it arrived;
    /// the follower list is a projection that lags its source anyway, and reads that must
    /// see a given write (a consistency token) do not come here.
    ///
    /// # Errors
    /// UNAVAILABLE when the database fails (every caller that shared the read gets it).
    pub(crate) async fn follower_rows(
        &self,
        db: &DatabaseConnection,
        user_id: i64,
        after: Option<Cursor>,
        limit: usize,
    ) -> ApiResult<Vec<ListEntry>> {
        let key = (user_id, after.map(|a| (a.followed_at_ms, a.peer_id)), limit);
        let read = std::sync::atomic::AtomicBool::new(false);
        let rows = self
            .flights
            .work(key, || async {
                read.store(true, std::sync::atomic::Ordering::Relaxed);
                edges::list(db, EdgeTable::Follower, user_id, after, limit).await.map(Arc::new).map_err(Arc::new)
            })
            .await;
        let result = if read.load(std::sync::atomic::Ordering::Relaxed) { "read" } else { "shared" };
        self.metrics.database_reads.with_label_values(&["followers", "ListFollowers", result]).inc();
        match rows {
            Ok(rows) => Ok(rows.as_ref().clone()),
            Err(e) => Err(socialgraph_server::shared_db_error(&e)),
        }
    }

    fn count(&self, rpc: &str, result: &str) {
        self.metrics.requests.with_label_values(&["followers", rpc, result]).inc();
    }

    /// Takes a deep-page permit.
    ///
    /// # Errors
    /// RESOURCE_EXHAUSTED [`DEEP_PAGE_LIMITED`] with RetryInfo when the rate is spent.
    fn deep_page(&self) -> ApiResult<()> {
        match self.deep_pages.check() {
            Ok(()) => {
                self.metrics.deep_pages.with_label_values(&["allowed"]).inc();
                Ok(())
            }
            Err(not_until) => {
                self.metrics.deep_pages.with_label_values(&["refused"]).inc();
                let retry_after = not_until.wait_time_from(governor::clock::Clock::now(&governor::clock::DefaultClock::default()));
                Err(ApiError::ResourceExhausted {
                    reason: DEEP_PAGE_LIMITED,
                    message: "follower pages past the newest cached followers are rate limited; retry later".into(),
                    retry_after: retry_after.max(Duration::from_millis(1)),
                })
            }
        }
    }
}

/// What a follower page read from the cache gave.
pub(crate) enum PageAnswer {
    /// The entries (with the lookahead entry when more follow).
    Entries(Vec<ListEntry>),
    /// Read the database (a miss, a fallback, or an allowed deep page).
    Database,
}

fn entries(v: Vec<(i64, i64)>) -> Vec<ListEntry> {
    v.into_iter().map(|(user_id, followed_at_ms)| ListEntry { user_id, followed_at_ms }).collect()
}

impl Caches {
    /// A follower page of `size` entries (asks `size + 1` for the lookahead) from the window.
    ///
    /// # Errors
    /// RESOURCE_EXHAUSTED for a deep page over the limit.
    pub(crate) async fn follower_page(
        self: &Arc<Self>,
        db: &DatabaseConnection,
        user_id: i64,
        after: Option<Cursor>,
        size: usize,
    ) -> ApiResult<PageAnswer> {
        if let Some(page) = self.hot.page(user_id, after, size) {
            self.count("ListFollowers", "local");
            return Ok(PageAnswer::Entries(page.to_vec()));
        }
        let cursor = after.map(|a| (a.followed_at_ms, a.peer_id));
        let read = match self.lists.followers.page(user_id, cursor, size + 1).await {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(error = %e, "cache unavailable: reading the database");
                self.count("ListFollowers", "fallback");
                return Ok(PageAnswer::Database);
            }
        };
        match read {
            PageRead::Hit(v) => {
                self.count("ListFollowers", "hit");
                let v = entries(v);
                self.hot.offer(user_id, after, size, &v);
                Ok(PageAnswer::Entries(v))
            }
            // The window ends exactly after this page: serve it, with a token for the next.
            PageRead::PastWindow(mut v) if v.len() == size && size > 0 => {
                self.count("ListFollowers", "hit");
                v.push(v[size - 1]);
                let v = entries(v);
                self.hot.offer(user_id, after, size, &v);
                Ok(PageAnswer::Entries(v))
            }
            PageRead::PastWindow(_) => {
                self.count("ListFollowers", "past_window");
                self.deep_page().map(|()| PageAnswer::Database)
            }
            PageRead::Miss => {
                self.count("ListFollowers", "miss");
                self.spawn_fill(db, user_id);
                Ok(PageAnswer::Database)
            }
        }
    }

    /// For each candidate, in request order: when it followed `user_id`, if it does. From the
    /// window, then the relationship hash, then one database query for the rest (whose
    /// answers fill the hash).
    ///
    /// # Errors
    /// UNAVAILABLE when the database fails.
    pub(crate) async fn check_followers(self: &Arc<Self>, db: &DatabaseConnection, user_id: i64, candidates: &[i64]) -> ApiResult<Vec<Option<i64>>> {
        let rpc = "BatchCheckFollowers";
        let looked = match self.lists.followers.lookup_marking(user_id, candidates, Some(self.fence.key())).await {
            Ok((looked, marks)) => Some((marks, looked)),
            Err(e) => {
                tracing::debug!(error = %e, "cache unavailable: reading the database");
                None
            }
        };
        let Some((marks, looked)) = looked else {
            self.count(rpc, "fallback");
            let (found, _) = self.read_checks(db, user_id, candidates).await.map_err(db_error)?;
            return Ok(candidates.iter().map(|c| found.get(c).filter(|e| e.state == EdgeState::Following).map(|e| e.followed_at_ms)).collect());
        };
        let unknown: Vec<i64> = candidates.iter().zip(&looked).filter(|(_, l)| **l == Lookup::Unknown).map(|(c, _)| *c).collect();
        let mut answers: Vec<Option<i64>> = looked.iter().map(|l| if let Lookup::Follows(ms) = l { Some(*ms) } else { None }).collect();
        if unknown.is_empty() {
            self.count(rpc, "hit");
            return Ok(answers);
        }
        if unknown.len() == candidates.len() {
            // Perhaps the window is not cached: fill it (a no-op when it is, in the background).
            self.count(rpc, "miss");
            self.spawn_fill(db, user_id);
        } else {
            self.count(rpc, "partial");
        }
        let (found, stored) = self.read_checks(db, user_id, &unknown).await.map_err(db_error)?;
        for (answer, c) in answers.iter_mut().zip(candidates) {
            if let Some(e) = found.get(c) {
                *answer = (e.state == EdgeState::Following).then_some(e.followed_at_ms);
            }
        }
        if self.fence.covers(&marks.applied, &stored) {
            let remembered: Vec<CachedEdge> = unknown
                .iter()
                .map(|c| found.get(c).map_or(CachedEdge { peer_id: *c, version: 0, following: false, followed_at_ms: 0 }, cached_follower))
                .collect();
            if let Err(e) = self.lists.followers.fill_relationships(user_id, &marks, &remembered).await {
                tracing::debug!(error = %e, "could not remember follower relationships");
            }
        }
        Ok(answers)
    }

    /// Starts filling `user_id`'s follower window in the background when a fill slot or a place
    /// in the fill queue is free ([`FillSlots::try_start`]); the fill writes within the row
    /// budget ([`FillSlot::pace`]).
    fn spawn_fill(self: &Arc<Self>, db: &DatabaseConnection, user_id: i64) {
        let (this, db) = (Arc::clone(self), db.clone());
        socialgraph_server::spawn_fill(&self.metrics.fills, &self.metrics.pending, &self.fills, "followers", user_id, move |slot| async move {
            this.fill(&db, user_id, &slot).await
        });
    }

    /// Fills `user_id`'s follower window: marker, then the positions applied to the cache and
    /// the database read (rows and offsets in one snapshot), repeated until the offsets cover
    /// the positions of every partition ([`Fence::read_covering`]), then the merge.
    async fn fill(&self, db: &DatabaseConnection, user_id: i64, slot: &FillSlot) -> Result<&'static str, FillError> {
        let cache = &self.lists.followers;
        let Some(nonce) = cache.begin_fill(user_id).await? else { return Ok("skipped") };
        let window = cache.limits().window;
        let Some(read) = self.fence.read_covering(cache, || self.read_window(db, user_id, window)).await? else { return Ok("behind") };
        let Some(read) = read else {
            cache.mark_too_long(user_id).await?;
            return Ok("too_long");
        };
        let cached: Vec<CachedEdge> = read.followed.iter().chain(&read.not_followed).map(cached_follower).collect();
        Ok(if cache.commit_fill_paced(user_id, &nonce, &cached, read.boundary, Some(slot)).await? { "cached" } else { "raced" })
    }
}

/// The cache's form of a `follower` edge (peer = the follower).
pub(crate) fn cached_follower(e: &Edge) -> CachedEdge {
    CachedEdge { peer_id: e.follower_id, version: e.version, following: e.state == EdgeState::Following, followed_at_ms: e.followed_at_ms }
}

/// A read-only REPEATABLE READ transaction (SQLite: a plain one): reads that must see one
/// snapshot, such as rows together with the offsets they reflect.
///
/// # Errors
/// The database failed.
pub(crate) async fn snapshot(db: &DatabaseConnection) -> Result<sea_orm::DatabaseTransaction, DbErr> {
    match db.get_database_backend() {
        DbBackend::Sqlite => db.begin().await,
        _ => db.begin_with_config(Some(IsolationLevel::RepeatableRead), Some(AccessMode::ReadOnly)).await,
    }
}

impl Caches {
    /// `user_id`'s window read and the stored offsets, in one snapshot.
    async fn read_window(&self, db: &DatabaseConnection, user_id: i64, window: usize) -> Result<(Option<WindowRead>, Vec<StoredOffset>), DbErr> {
        let txn = snapshot(db).await?;
        let stored = self.fence.stored(&txn).await?;
        let read = windows::read(&txn, EdgeTable::Follower, user_id, window, NOT_FOLLOWED_MAX_PER_WINDOW * window.max(1)).await?;
        txn.commit().await?;
        Ok((read, stored))
    }

    /// The follower rows (candidate → edge) of `candidates` to `user_id` and the stored offsets,
    /// in one snapshot: one statement on PostgreSQL, else a read-only transaction.
    async fn read_checks(&self, db: &DatabaseConnection, user_id: i64, candidates: &[i64]) -> Result<(HashMap<i64, Edge>, Vec<StoredOffset>), DbErr> {
        if let Some((stored, found)) = self.fence.stored_with_followers(db, user_id, candidates).await? {
            return Ok((found.into_iter().map(|e| (e.follower_id, e)).collect(), stored));
        }
        let txn = snapshot(db).await?;
        let stored = self.fence.stored(&txn).await?;
        let pairs: Vec<(i64, i64)> = candidates.iter().map(|&c| (c, user_id)).collect();
        let found = edges::get_many(&txn, EdgeTable::Follower, &pairs, false).await?.into_iter().map(|e| (e.follower_id, e)).collect();
        txn.commit().await?;
        Ok((found, stored))
    }
}
