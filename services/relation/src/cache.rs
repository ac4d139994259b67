//! relation-svc's side of the following-list cache ([`socialgraph_cache::lists`]): reads
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
use sea_orm::DatabaseConnection;
use socialgraph_cache::CacheError;
use socialgraph_cache::lists::{CachedEdge, FillSlot, FillSlots, ListCache, Listed, Lookup, PageRead};
use socialgraph_cache::restrictions::SummaryRead;
use socialgraph_domain::{Cursor, Edge, EdgeState, ListEntry};
use socialgraph_server::{ApiResult, db_error};
use socialgraph_storage::edges::{self, EdgeTable};
use socialgraph_storage::windows;

use crate::service::Relations;

/// Metrics of the following-list cache.
#[derive(Clone)]
pub struct CacheMetrics {
    /// Reads by `cache`, `rpc` and `result` ([`socialgraph_server::cache_counters`]).
    pub requests: IntCounterVec,
    /// Fills by `cache` and `result`.
    pub fills: IntCounterVec,
    /// Following-list fills running or waiting, by `cache`.
    pub pending: prometheus::IntGaugeVec,
    /// Write-throughs by `result` (ok, failed).
    pub writes: IntCounterVec,
}

impl CacheMetrics {
    /// Registers `sg_cache_requests_total`, `sg_cache_fills_total`, `sg_cache_fills_pending`
    /// and `sg_cache_writes_total` in `registry`.
    ///
    /// # Errors
    /// A metric of the same name is already registered.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let socialgraph_server::CacheCounters { requests, fills, pending } = socialgraph_server::cache_counters(registry)?;
        let writes = IntCounterVec::new(
            Opts::new("sg_cache_writes_total", "Write-throughs of the caller's own changes by cache and result"),
            &["cache", "result"],
        )?;
        registry.register(Box::new(writes.clone()))?;
        Ok(Self { requests, fills, pending, writes })
    }
}

/// The cache and its metrics, as relation-svc holds them.
#[derive(Clone)]
pub struct Caches {
    /// Following lists (filled here from `following`).
    pub following: ListCache,
    /// Follower windows (filled by projection-svc; read here for the incoming direction of
    /// relationships, whose relationship hashes this service fills from `following`, and
    /// written through with the caller's own changes).
    pub followers: ListCache,
    /// Restriction summaries (filled and deleted here; see [`crate::restrict_cache`]).
    pub restrictions: socialgraph_cache::restrictions::RestrictionCache,
    /// Metrics.
    pub metrics: CacheMetrics,
    /// Background fills of following lists in this instance.
    pub fills: FillSlots,
    /// Background fills of restriction summaries in this instance.
    pub restriction_fills: FillSlots,
    /// The whole cache, for the stale drain.
    pub all: socialgraph_cache::lists::ListCaches,
}

impl Caches {
    /// The caches `lists` with their limits, the following lists' `fills` and metrics.
    pub fn new(lists: socialgraph_cache::lists::ListCaches, fills: FillSlots, metrics: CacheMetrics) -> Self {
        Self {
            following: lists.following.clone(),
            followers: lists.followers.clone(),
            restrictions: lists.restrictions.clone(),
            metrics,
            fills,
            restriction_fills: FillSlots::default(),
            all: lists,
        }
    }
}

/// What a cache read found.
enum Looked<T> {
    /// The cache answered.
    Hit(T),
    /// The list is not cached.
    Miss,
    /// The list is cached as a window (longer than `cache.following_max`) and the read needs
    /// more than it holds.
    Past,
    /// The cache is down, slow or failing.
    Fallback,
}

impl<T> Looked<T> {
    fn label(&self) -> &'static str {
        match self {
            Self::Hit(_) => "hit",
            Self::Miss => "miss",
            Self::Past => "past_window",
            Self::Fallback => "fallback",
        }
    }
}

/// One part of a relationship read's cache answers read ahead ([`Relations::read_ahead`]):
/// `None` when the part asks the cache itself (caches off, a Redis Cluster), else what the one
/// transaction read for it, or its failure.
pub(crate) type Ahead<T> = Option<Result<T, CacheError>>;

/// The three parts of [`Relations::read_ahead`].
#[derive(Default)]
pub(crate) struct ReadAhead {
    /// The following list's answers ([`Relations::following_at`]).
    pub following: Ahead<Listed>,
    /// The follower window's and relationship hash's ([`Relations::followed_by_at`]).
    pub followers: Ahead<Listed>,
    /// The restriction summary ([`Relations::cached_restrictions`]).
    pub restrictions: Ahead<SummaryRead>,
}

/// The cache's form of a `following` edge.
pub(crate) fn cached_edge(e: &Edge) -> CachedEdge {
    CachedEdge { peer_id: e.followee_id, version: e.version, following: e.state == EdgeState::Following, followed_at_ms: e.followed_at_ms }
}

impl Caches {
    fn looked<T>(&self, cache: &str, rpc: &str, r: Result<Looked<T>, socialgraph_cache::CacheError>) -> Looked<T> {
        let looked = r.unwrap_or_else(|e| {
            tracing::debug!(error = %e, rpc, "cache unavailable: reading the database");
            Looked::Fallback
        });
        self.metrics.requests.with_label_values(&[cache, rpc, looked.label()]).inc();
        looked
    }
}

impl Relations {
    /// A relationship read's three cache reads of `user_id` (following list, follower window
    /// and relationship hash, restriction summary) in one round trip
    /// ([`socialgraph_cache::lists::ListCaches::relationships_read`]), for each part to go on
    /// from; every part empty (each asks itself) without caches, on a cluster or for no
    /// `others`.
    pub(crate) async fn read_ahead(&self, user_id: i64, others: &[i64]) -> ReadAhead {
        let Some(c) = self.caches.as_ref() else { return ReadAhead::default() };
        match c.all.relationships_read(user_id, others).await {
            Ok(None) => ReadAhead::default(),
            Ok(Some(r)) => ReadAhead { following: Some(Ok(r.following)), followers: Some(Ok(r.followers)), restrictions: Some(Ok(r.restrictions)) },
            Err(e) => {
                // Each part counts and logs its fallback, as it would after its own failed call.
                let failed = || CacheError::Unavailable(e.to_string());
                ReadAhead { following: Some(Err(failed())), followers: Some(Err(failed())), restrictions: Some(Err(failed())) }
            }
        }
    }

    /// Up to `limit` entries of `user_id`'s following list after `after`, in list order: from
    /// the cache, else from the database (a miss also starts a fill in the background).
    ///
    /// # Errors
    /// UNAVAILABLE when the database fails.
    pub(crate) async fn following_entries(&self, user_id: i64, after: Option<Cursor>, limit: usize) -> ApiResult<Vec<ListEntry>> {
        let cursor = after.map(|a| (a.followed_at_ms, a.peer_id));
        if let Some(v) = self.cached_following_page("ListFollowing", user_id, cursor, limit).await {
            return Ok(v.into_iter().map(|(user_id, followed_at_ms)| ListEntry { user_id, followed_at_ms }).collect());
        }
        edges::list(&self.db, EdgeTable::Following, user_id, after, limit).await.map_err(db_error)
    }

    /// Up to `limit` entries (followee, followed_at ms) of `user_id`'s following list after
    /// `after`, from the cache, counted under `rpc`; `None` when the caller must read the
    /// database (a miss also starts a fill in the background).
    pub(crate) async fn cached_following_page(&self, rpc: &str, user_id: i64, after: Option<(i64, i64)>, limit: usize) -> Option<Vec<(i64, i64)>> {
        let c = self.caches.as_ref()?;
        let read = c.following.page(user_id, after, limit).await.map(|p| match p {
            PageRead::Hit(v) => Looked::Hit(v),
            PageRead::Miss => Looked::Miss,
            PageRead::PastWindow(_) => Looked::Past,
        });
        self.following_answer(c, rpc, user_id, read)
    }

    /// What a read of `user_id`'s cached following list answers, counted under `rpc`: a hit's
    /// value; `None` otherwise, a miss also starting a fill in the background.
    fn following_answer<T>(&self, c: &Caches, rpc: &str, user_id: i64, read: Result<Looked<T>, socialgraph_cache::CacheError>) -> Option<T> {
        match c.looked("following", rpc, read) {
            Looked::Hit(v) => Some(v),
            Looked::Miss => {
                self.spawn_fill(c, user_id);
                None
            }
            Looked::Past | Looked::Fallback => None,
        }
    }

    /// followed_at of `user_id`'s edge to each of `others` (input order; `None`: not
    /// following) from the user's cached following list, going on from `ahead` when it was
    /// read ahead; `None` when the caller must read the database (a miss also starts a fill in
    /// the background).
    pub(crate) async fn following_at(&self, rpc: &str, user_id: i64, others: &[i64], ahead: Ahead<Listed>) -> Option<Vec<Option<i64>>> {
        let c = self.caches.as_ref()?;
        let read = match ahead {
            None => c.following.lookup(user_id, others).await,
            Some(Ok(listed)) => c.following.lookup_ahead(user_id, others, listed).await,
            Some(Err(e)) => Err(e),
        };
        let read = read.map(|answers| {
            let unknown = answers.iter().filter(|a| **a == Lookup::Unknown).count();
            match unknown {
                0 => Looked::Hit(answers.iter().map(|a| if let Lookup::Follows(ms) = a { Some(*ms) } else { None }).collect()),
                n if n == answers.len() => Looked::Miss,
                _ => Looked::Past,
            }
        });
        self.following_answer(c, rpc, user_id, read)
    }

    /// followed_at of each of `others`' edge to `user_id` (input order; `None`: not
    /// following), from the user's follower window and relationship hash; the candidates
    /// those do not know are read from `following` in one query and remembered in the
    /// relationship hash. It goes on from `ahead` when that was read ahead. `Ok(None)` when the
    /// cache cannot answer (caches off or down): the caller reads the database.
    ///
    /// No position fence is needed, unlike projection-svc's fills: `following` is the source
    /// of truth, so every event applied before the candidates were marked is already in the
    /// read, and every one applied after is kept over it by its version.
    ///
    /// # Errors
    /// UNAVAILABLE when the database fails.
    pub(crate) async fn followed_by_at(&self, rpc: &str, user_id: i64, others: &[i64], ahead: Ahead<Listed>) -> ApiResult<Option<Vec<Option<i64>>>> {
        let Some(c) = self.caches.as_ref() else { return Ok(None) };
        let read = match ahead {
            None => c.followers.lookup_marking(user_id, others, None).await,
            Some(Ok(listed)) => c.followers.lookup_marking_ahead(user_id, others, listed).await,
            Some(Err(e)) => Err(e),
        };
        let (looked, marks) = match read {
            Ok(looked) => looked,
            Err(e) => {
                tracing::debug!(error = %e, rpc, "cache unavailable: reading the database");
                c.metrics.requests.with_label_values(&["followers", rpc, "fallback"]).inc();
                return Ok(None);
            }
        };
        let mut answers: Vec<Option<i64>> = looked.iter().map(|l| if let Lookup::Follows(ms) = l { Some(*ms) } else { None }).collect();
        let unknown: Vec<i64> = others.iter().zip(&looked).filter(|(_, l)| **l == Lookup::Unknown).map(|(o, _)| *o).collect();
        let label = match unknown.len() {
            0 => "hit",
            n if n == others.len() => "miss",
            _ => "partial",
        };
        c.metrics.requests.with_label_values(&["followers", rpc, label]).inc();
        if unknown.is_empty() {
            return Ok(Some(answers));
        }
        let found: std::collections::HashMap<i64, Edge> =
            edges::between(&self.db, user_id, &unknown, false).await.map_err(db_error)?.into_iter().map(|e| (e.follower_id, e)).collect();
        for (answer, o) in answers.iter_mut().zip(others) {
            if let Some(e) = found.get(o) {
                *answer = (e.state == EdgeState::Following).then_some(e.followed_at_ms);
            }
        }
        let remembered: Vec<CachedEdge> = unknown
            .iter()
            .map(|o| {
                found.get(o).map_or(CachedEdge { peer_id: *o, version: 0, following: false, followed_at_ms: 0 }, |e| CachedEdge {
                    peer_id: e.follower_id,
                    ..cached_edge(e)
                })
            })
            .collect();
        if let Err(e) = c.followers.fill_relationships(user_id, &marks, &remembered).await {
            tracing::debug!(error = %e, "could not remember the relationships read");
        }
        Ok(Some(answers))
    }

    /// Starts filling `user_id`'s cached list in the background when a fill slot or a place in
    /// the fill queue is free ([`FillSlots::try_start`]); the fill writes within the row budget
    /// ([`FillSlot::pace`]).
    pub(crate) fn spawn_fill(&self, c: &Caches, user_id: i64) {
        let (cc, db) = (c.clone(), self.db.clone());
        socialgraph_server::spawn_fill(&c.metrics.fills, &c.metrics.pending, &c.fills, "following", user_id, move |slot| async move {
            fill_following(&cc, &db, user_id, &slot).await
        });
    }

    /// Writes the caller's own edge changes (follower id, edge) into the cache
    /// (version-guarded like every apply), so the actor reads them back at once; a failure is
    /// counted and otherwise left to the event stream.
    pub(crate) async fn write_through(&self, changes: &[(i64, CachedEdge)]) {
        let Some(c) = &self.caches else { return };
        let incoming: Vec<(i64, CachedEdge)> = changes.iter().map(|(follower, e)| (e.peer_id, CachedEdge { peer_id: *follower, ..*e })).collect();
        let (following, followers) = tokio::join!(c.following.apply(changes, None), c.followers.apply(&incoming, None));
        for (cache, applied) in [("following", following), ("followers", followers)] {
            let result = match applied {
                Ok(_) => "ok",
                Err(e) => {
                    tracing::debug!(error = %e, cache, "cache write-through failed; the event stream will apply the change");
                    "failed"
                }
            };
            c.metrics.writes.with_label_values(&[cache, result]).inc();
        }
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

/// Fills `user_id`'s cached list: marker first, then the database read, then the merge (see
/// [`socialgraph_cache::following`] for why this order closes the fill race). Returns the
/// result for `sg_cache_fills_total`.
async fn fill_following(
    c: &Caches,
    db: &DatabaseConnection,
    user_id: i64,
    slot: &FillSlot,
) -> Result<&'static str, Box<dyn std::error::Error + Send + Sync>> {
    let Some(nonce) = c.following.begin_fill(user_id).await? else { return Ok("skipped") };
    let window = c.following.limits().window;
    let Some(read) = windows::read(db, EdgeTable::Following, user_id, window, NOT_FOLLOWED_MAX_PER_WINDOW * window.max(1)).await? else {
        // Never cached: later reads of it skip the fill until the mark expires.
        c.following.mark_too_long(user_id).await?;
        return Ok("too_long");
    };
    let cached: Vec<CachedEdge> = read.followed.iter().chain(&read.not_followed).map(cached_edge).collect();
    Ok(if c.following.commit_fill_paced(user_id, &nonce, &cached, read.boundary, Some(slot)).await? { "cached" } else { "raced" })
}

/// A fill also reads the list's unfollowed and hidden edges inside the window (their versions
/// stop late copies of old follows); a list with more than this many per cached entry churns
/// too much to cache and is marked too long.
pub const NOT_FOLLOWED_MAX_PER_WINDOW: usize = 4;
