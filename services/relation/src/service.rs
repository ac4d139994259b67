//! The rules of relation-svc on domain types: follow/unfollow with their outbox events in one
//! transaction, the cap and the rate limit, keyset-paged lists and the bulk import.

use std::sync::Arc;

use prometheus::IntCounter;
use sea_orm::{AccessMode, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr, IsolationLevel, TransactionTrait};
use socialgraph_cache::{
    keys::Keys,
    lists::Listed,
    rate_limit::{TokenBucket, Verdict},
};
use socialgraph_domain::{Edge, EdgeState, ListKind, PageTokenKey, Violation, validate_user_id};
use socialgraph_proto::events::v1::RelationEventKind;
use socialgraph_server::db_error;
use socialgraph_server::paging::{page_request, page_token_key};
use socialgraph_server::{ApiError, ApiResult};
use socialgraph_storage::accounts;
use socialgraph_storage::cas::{self, CasOutcome};
use socialgraph_storage::edges::{self, Col, EdgeTable};
use socialgraph_storage::following_counts::{self, FollowingCount};
use socialgraph_storage::outbox;
use socialgraph_storage::restrictions::{self, Restriction};
use tokio::sync::Notify;

use crate::cache::Ahead;
use crate::config::{Config, OnRedisError};

/// Most retries of one transaction that lost a race (unique key, deadlock).
pub(crate) const MAX_TX_RETRIES: usize = 20;

/// Runs `$body` (a `Result<T, TxError>` expression using the open transaction `$txn`) and
/// commits, retrying the whole transaction when it lost a race (unique key, deadlock); a
/// rule's verdict or the last database error ends it as the service's error.
macro_rules! in_tx {
    ($svc:expr, $txn:ident => $body:expr) => {
        socialgraph_storage::retry_tx($crate::service::MAX_TX_RETRIES, || async {
            // A busy database can refuse BEGIN itself (SQLite's IMMEDIATE): retry like a race.
            let $txn = $svc.begin().await?;
            let result: Result<_, $crate::service::TxError> = $body;
            match result {
                Ok(v) => $txn.commit().await.map(|()| v).map_err($crate::service::TxError::Db),
                Err(e) => {
                    let _ = $txn.rollback().await;
                    Err(e)
                }
            }
        })
        .await
        .map_err($crate::service::TxError::into_api)?
    };
}
pub(crate) use in_tx;

/// The relation service's state, shared by every RPC.
pub struct Relations {
    pub(crate) db: DatabaseConnection,
    /// The per-follower token bucket; `None` in the embedded mode, which has no Redis.
    limiter: Option<TokenBucket>,
    keys: Keys,
    token_key: PageTokenKey,
    pub(crate) config: Config,
    /// Wakes the outbox relay after each commit that wrote events.
    pub(crate) relay_wake: Arc<Notify>,
    /// Follows let through because Redis was unreachable (fail-open).
    rate_limit_bypassed: IntCounter,
    /// Wakes the account job runner after a status change.
    pub(crate) jobs_wake: Arc<Notify>,
    /// The following-list cache; `None` without a cache Redis (embedded mode, `cache.url` "").
    pub(crate) caches: Option<crate::cache::Caches>,
    /// Follow and Unfollow write one statement each ([`cas`]; PostgreSQL) rather than a
    /// transaction.
    single_statement: bool,
}

/// Result of a Follow.
#[derive(Debug, Clone, Copy)]
pub struct FollowOutcome {
    /// The edge changed and one event was written, or (with `requested`) a request was made.
    pub changed: bool,
    /// The edge after the call.
    pub edge: Edge,
    /// The followee's account is locked: a follow request is pending instead of an edge.
    pub requested: bool,
}

/// Result of an Unfollow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnfollowOutcome {
    /// The edge changed and one event was written; false when it was not followed.
    pub changed: bool,
    /// The edge's version after the call (0 when the edge never existed).
    pub version: i64,
    /// A pending follow request was cancelled instead (the edge did not change).
    pub request_cancelled: bool,
}

pub use socialgraph_domain::Page;

pub(crate) use socialgraph_domain::now_ms;

impl Relations {
    /// Builds the service over an open database, Redis pool (`None`: follows are not
    /// rate-limited, as in the embedded mode) and following-list cache (`None`: reads go to the
    /// database).
    pub fn new(
        db: DatabaseConnection,
        redis: Option<socialgraph_cache::Pool>,
        caches: Option<crate::cache::Caches>,
        config: Config,
        relay_wake: Arc<Notify>,
        rate_limit_bypassed: IntCounter,
    ) -> Self {
        let limiter = redis.map(|redis| {
            TokenBucket::new(
                redis,
                config.limits.follow_burst,
                config.limits.follow_refill_per_day,
                std::time::Duration::from_millis(config.redis.timeout_ms),
            )
        });
        let token_key = page_token_key(config.auth.page_token_secret.as_ref());
        let jobs_wake = Arc::new(Notify::new());
        let single_statement = db.get_database_backend() == DbBackend::Postgres;
        let keys = Keys::new(config.redis.key_prefix.clone());
        Self { db, limiter, keys, token_key, config, relay_wake, rate_limit_bypassed, jobs_wake, caches, single_statement }
    }

    /// The same service writing every Follow and Unfollow in a transaction, as on MariaDB and
    /// SQLite, also on PostgreSQL: the rule's two paths are checked against one table of cases
    /// (`relation_follow_rule`), so they cannot drift apart.
    #[must_use]
    pub fn with_transaction_writes(mut self) -> Self {
        self.single_statement = false;
        self
    }

    /// The notifier that wakes the account job runner ([`crate::lifecycle::run_jobs`]).
    pub fn jobs_wake(&self) -> Arc<Notify> {
        Arc::clone(&self.jobs_wake)
    }

    /// The page-token key (shared with tests that forge tokens).
    pub fn token_key(&self) -> &PageTokenKey {
        &self.token_key
    }

    pub(crate) async fn begin(&self) -> Result<DatabaseTransaction, DbErr> {
        // READ COMMITTED: a first follow of an edge takes no gap lock on MySQL, so concurrent
        // first follows collide on the primary key (and retry) instead of deadlocking.
        match self.db.get_database_backend() {
            DbBackend::Sqlite => socialgraph_storage::begin_write(&self.db).await,
            _ => self.db.begin_with_config(Some(IsolationLevel::ReadCommitted), Some(AccessMode::ReadWrite)).await,
        }
    }

    async fn check_rate_limit(&self, follower_id: i64) -> ApiResult<()> {
        let Some(limiter) = &self.limiter else {
            return Ok(());
        };
        match limiter.take(&self.keys.follow_rate_limit(follower_id)).await {
            Ok(Verdict::Allowed) => Ok(()),
            Ok(Verdict::Limited { retry_after }) => Err(ApiError::ResourceExhausted {
                reason: "RATE_LIMITED",
                message: format!("follow rate limit reached; retry in {} ms", retry_after.as_millis()),
                retry_after,
            }),
            Err(e) => match self.config.limits.on_redis_error {
                OnRedisError::Open => {
                    self.rate_limit_bypassed.inc();
                    tracing::warn!(error = %e, follower_id, "rate limiter unreachable: follow allowed (fail open)");
                    Ok(())
                }
                OnRedisError::Closed => {
                    tracing::warn!(error = %e, follower_id, "rate limiter unreachable: follow refused (fail closed)");
                    Err(ApiError::unavailable(socialgraph_server::REASON_RATE_LIMITER, "the follow rate limiter is unavailable"))
                }
            },
        }
    }

    /// Makes `follower_id` follow `followee_id`; see the RPC's contract.
    ///
    /// # Errors
    /// INVALID_ARGUMENT (bad ids, SELF_FOLLOW), FAILED_PRECONDITION (FOLLOWING_LIMIT, BLOCKED,
    /// ACCOUNT_INACTIVE),
    /// RESOURCE_EXHAUSTED (RATE_LIMITED), UNAVAILABLE.
    pub async fn follow(&self, follower_id: i64, followee_id: i64) -> ApiResult<FollowOutcome> {
        validate_pair(follower_id, followee_id)?;
        if follower_id == followee_id {
            return Err(ApiError::InvalidArgument {
                reason: "SELF_FOLLOW",
                violations: vec![Violation::new("followee_id", "a user cannot follow themselves")],
            });
        }
        // A repeat costs no token and takes no lock; nor does a refusal for a block.
        let pre = edges::follow_pre_read(&self.db, follower_id, followee_id).await.map_err(db_error)?;
        let seen = unblocked(pre.row)?;
        if let Some(e) = seen.filter(|e| e.state == EdgeState::Following) {
            return Ok(FollowOutcome::edge(false, e));
        }
        self.check_rate_limit(follower_id).await?;
        if pre.followee_locked
            && let crate::requests::RequestOutcome::Done(out) = self.request_follow(follower_id, followee_id).await?
        {
            return Ok(out);
        }
        let outcome = if self.single_statement {
            self.follow_cas(follower_id, followee_id, seen).await?
        } else {
            in_tx!(self, txn => self.follow_tx(&txn, follower_id, followee_id).await)
        };
        if outcome.changed {
            self.relay_wake.notify_one();
            if !outcome.requested {
                self.write_through(&[(follower_id, crate::cache::cached_edge(&outcome.edge))]).await;
            }
        }
        Ok(outcome)
    }

    /// Follow as a compare-and-set on the version read in `seen`; a lost race reads again.
    async fn follow_cas(&self, follower_id: i64, followee_id: i64, mut seen: Option<Edge>) -> ApiResult<FollowOutcome> {
        let cap = self.config.limits.following_cap;
        for _ in 0..=MAX_TX_RETRIES {
            if let Some(e) = seen.filter(|e| e.state == EdgeState::Following) {
                return Ok(FollowOutcome::edge(false, e));
            }
            let count = self.following_count(follower_id).await?;
            let next = FollowingCount { followings: count.followings + 1, version: count.version + 1 };
            let now = now_ms();
            let edge = Edge::followed(follower_id, followee_id, seen.as_ref(), now, now);
            let event = self.event_row(&edge, RelationEventKind::Followed, now, next);
            let expected = seen.map_or(0, |e| e.version);
            let outcome = socialgraph_storage::retry_tx(MAX_TX_RETRIES, || cas::follow(&self.db, &edge, expected, cap, next, &event))
                .await
                .map_err(db_error)?;
            match outcome {
                CasOutcome::Written => return Ok(FollowOutcome::edge(true, edge)),
                CasOutcome::AtCap(count) => return Err(cap_reached(follower_id, count, cap)),
                CasOutcome::Conflict => {
                    if !accounts::inactive_among(&self.db, &[follower_id, followee_id]).await.map_err(db_error)?.is_empty() {
                        return Err(crate::lifecycle::inactive_error());
                    }
                    seen = unblocked(edges::get_following(&self.db, follower_id, followee_id, false).await.map_err(db_error)?)?;
                }
            }
        }
        Err(edge_contended())
    }

    /// Unfollow as a compare-and-set on the version of the edge read first.
    async fn unfollow_cas(&self, follower_id: i64, followee_id: i64) -> ApiResult<UnfollowOutcome> {
        for _ in 0..=MAX_TX_RETRIES {
            let Some(old) = edges::get(&self.db, EdgeTable::Following, follower_id, followee_id, false).await.map_err(db_error)? else {
                return Ok(UnfollowOutcome { changed: false, version: 0, request_cancelled: false });
            };
            if old.state == EdgeState::NotFollowing {
                return Ok(UnfollowOutcome { changed: false, version: old.version, request_cancelled: false });
            }
            let count = self.following_count(follower_id).await?;
            // A hidden edge (an inactive account's) did not count.
            let lost = i64::from(old.state == EdgeState::Following);
            let next = FollowingCount { followings: (count.followings - lost).max(0), version: count.version + 1 };
            let now = now_ms();
            let edge = old.unfollowed(now);
            let event = self.event_row(&edge, RelationEventKind::Unfollowed, now, next);
            let outcome =
                socialgraph_storage::retry_tx(MAX_TX_RETRIES, || cas::unfollow(&self.db, &old, &edge, next, &event)).await.map_err(db_error)?;
            if outcome == CasOutcome::Written {
                return Ok(UnfollowOutcome { changed: true, version: edge.version, request_cancelled: false });
            }
        }
        Err(edge_contended())
    }

    /// The follower's `following_count` row for a compare-and-set, created first when missing.
    async fn following_count(&self, follower_id: i64) -> ApiResult<FollowingCount> {
        if let Some(c) = following_counts::get(&self.db, follower_id).await.map_err(db_error)? {
            return Ok(c);
        }
        following_counts::ensure(&self.db, follower_id).await.map_err(db_error)?;
        Ok(following_counts::get(&self.db, follower_id).await.map_err(db_error)?.unwrap_or_default())
    }

    async fn follow_tx(&self, txn: &DatabaseTransaction, follower_id: i64, followee_id: i64) -> Result<FollowOutcome, TxError> {
        let old = unblocked(edges::get_following(txn, follower_id, followee_id, true).await?).map_err(TxError::Api)?;
        if let Some(e) = old.filter(|e| e.state == EdgeState::Following) {
            return Ok(FollowOutcome::edge(false, e));
        }
        let cap = self.config.limits.following_cap;
        let count = edges::count(txn, EdgeTable::Following, Col::FollowerId, follower_id).await?
            + restrictions::count_of(txn, Restriction::Request, follower_id, cap).await?;
        if count >= cap {
            return Err(TxError::Api(cap_reached(follower_id, count, cap)));
        }
        let now = now_ms();
        let edge = Edge::followed(follower_id, followee_id, old.as_ref(), now, now);
        match old {
            Some(_) => edges::update(txn, EdgeTable::Following, &edge).await?,
            None => edges::insert(txn, EdgeTable::Following, &[edge]).await?,
        }
        outbox::insert(txn, &self.edge_events(txn, &[(edge, RelationEventKind::Followed)], now).await?).await?;
        // Last, after the edge is written: see `lifecycle` on why the order matters.
        if !accounts::inactive_among(txn, &[follower_id, followee_id]).await?.is_empty() {
            return Err(TxError::Api(crate::lifecycle::inactive_error()));
        }
        Ok(FollowOutcome::edge(true, edge))
    }

    async fn unfollow_tx(&self, txn: &DatabaseTransaction, follower_id: i64, followee_id: i64) -> Result<UnfollowOutcome, TxError> {
        let Some(old) = edges::get(txn, EdgeTable::Following, follower_id, followee_id, true).await? else {
            return Ok(UnfollowOutcome { changed: false, version: 0, request_cancelled: false });
        };
        if old.state == EdgeState::NotFollowing {
            return Ok(UnfollowOutcome { changed: false, version: old.version, request_cancelled: false });
        }
        let now = now_ms();
        let edge = old.unfollowed(now);
        edges::update(txn, EdgeTable::Following, &edge).await?;
        outbox::insert(txn, &self.edge_events(txn, &[(edge, RelationEventKind::Unfollowed)], now).await?).await?;
        Ok(UnfollowOutcome { changed: true, version: edge.version, request_cancelled: false })
    }

    /// Makes `follower_id` stop following `followee_id`.
    ///
    /// # Errors
    /// INVALID_ARGUMENT for bad ids; UNAVAILABLE.
    pub async fn unfollow(&self, follower_id: i64, followee_id: i64) -> ApiResult<UnfollowOutcome> {
        validate_pair(follower_id, followee_id)?;
        let mut outcome = if self.single_statement {
            self.unfollow_cas(follower_id, followee_id).await?
        } else {
            in_tx!(self, txn => self.unfollow_tx(&txn, follower_id, followee_id).await)
        };
        if outcome.changed {
            self.relay_wake.notify_one();
            let tombstone =
                socialgraph_cache::lists::CachedEdge { peer_id: followee_id, version: outcome.version, following: false, followed_at_ms: 0 };
            self.write_through(&[(follower_id, tombstone)]).await;
        } else {
            // Not following: maybe a request is pending (a locked followee); cancel it.
            outcome.request_cancelled = self.cancel_request(follower_id, followee_id).await?;
        }
        Ok(outcome)
    }

    /// One page of a list named by `kind` and owners `a`, `b` (b = 0 for one-owner lists).
    ///
    /// # Errors
    /// INVALID_ARGUMENT for bad ids, page size or token; UNAVAILABLE.
    pub async fn list(&self, kind: ListKind, a: i64, b: i64, page_size: i32, token: &str) -> ApiResult<Page> {
        let owners: &[(&str, i64)] = match kind {
            ListKind::CommonFollowing => &[("user_id", a), ("other_user_id", b)],
            ListKind::FamiliarFollowers => &[("viewer_id", a), ("user_id", b)],
            _ => &[("user_id", a)],
        };
        let req = page_request(&self.token_key, kind, owners, page_size, token)?;
        let rows = match kind {
            ListKind::CommonFollowing => match self.cached_common(a, b, req.after, req.size + 1).await {
                Some(rows) => rows,
                None => edges::list_common(&self.db, a, b, req.after, req.size + 1).await.map_err(db_error)?,
            },
            ListKind::FamiliarFollowers => match self.cached_familiar(a, b, req.after, req.size + 1).await? {
                Some(rows) => rows,
                None => edges::list_familiar(&self.db, a, b, req.after, req.size + 1).await.map_err(db_error)?,
            },
            _ => self.following_entries(a, req.after, req.size + 1).await?,
        };
        Ok(self.token_key.finish(rows, req.size, kind, a, b))
    }

    /// Both directions between `user_id` and each of `others`, in request order:
    /// (edge user→other if following, edge other→user if following); `rpc` names the caller
    /// in the cache metrics; `following` and `followers`, each list's answers when they were
    /// read ahead. The ids are validated by the caller ([`Self::relationships_with_flags`]).
    ///
    /// # Errors
    /// UNAVAILABLE.
    pub(crate) async fn relationships(
        &self,
        rpc: &str,
        user_id: i64,
        others: &[i64],
        following: Ahead<Listed>,
        followers: Ahead<Listed>,
    ) -> ApiResult<Vec<(Option<Edge>, Option<Edge>)>> {
        let is_following = |e: &Edge| e.state == EdgeState::Following;
        // Each direction from its cache, else from the database; the two run at once, so a
        // read both caches miss costs one database round trip of latency, not two.
        let out = async {
            Ok::<_, ApiError>(match self.following_at(rpc, user_id, others, following).await {
                Some(at) => others.iter().zip(at).filter_map(|(&o, at)| at.map(|ms| (o, Edge::followed(user_id, o, None, ms, ms)))).collect(),
                None => {
                    let outgoing = edges::between(&self.db, user_id, others, true).await.map_err(db_error)?;
                    outgoing.into_iter().filter(is_following).map(|e| (e.followee_id, e)).collect::<std::collections::HashMap<i64, Edge>>()
                }
            })
        };
        let inc = async {
            Ok::<_, ApiError>(match self.followed_by_at(rpc, user_id, others, followers).await? {
                Some(at) => others.iter().zip(at).filter_map(|(&o, at)| at.map(|ms| (o, Edge::followed(o, user_id, None, ms, ms)))).collect(),
                None => {
                    let incoming = edges::between(&self.db, user_id, others, false).await.map_err(db_error)?;
                    incoming.into_iter().filter(is_following).map(|e| (e.follower_id, e)).collect::<std::collections::HashMap<i64, Edge>>()
                }
            })
        };
        let (out, inc) = tokio::try_join!(out, inc)?;
        Ok(others.iter().map(|o| (out.get(o).copied(), inc.get(o).copied())).collect())
    }

    /// Exact number of accounts `user_id` follows.
    ///
    /// # Errors
    /// INVALID_ARGUMENT for a bad id; UNAVAILABLE.
    pub async fn count_following(&self, user_id: i64) -> ApiResult<i64> {
        validate_user_id("user_id", user_id)?;
        edges::count(&self.db, EdgeTable::Following, Col::FollowerId, user_id).await.map_err(db_error)
    }

    /// Edges in primary-key order for ScanEdges.
    ///
    /// # Errors
    /// UNAVAILABLE or INTERNAL on database failure.
    pub async fn scan(&self, filter: edges::ScanFilter, limit: usize) -> ApiResult<Vec<Edge>> {
        edges::scan(&self.db, EdgeTable::Following, filter, limit).await.map_err(db_error)
    }
}

/// A transaction body's failure: a database error (maybe retryable) or a rule's verdict.
pub(crate) enum TxError {
    Db(DbErr),
    Api(ApiError),
    /// Something the transaction read changed under it (an account's status during an
    /// import): run it again.
    Raced,
}

impl From<DbErr> for TxError {
    fn from(e: DbErr) -> Self {
        Self::Db(e)
    }
}

impl socialgraph_storage::RetryableError for TxError {
    fn is_retryable(&self) -> bool {
        matches!(self, Self::Raced) || matches!(self, Self::Db(e) if socialgraph_storage::is_retryable(e))
    }
}

impl TxError {
    /// The service's answer: a rule's verdict as is, a database error through [`db_error`].
    pub(crate) fn into_api(self) -> ApiError {
        match self {
            Self::Api(e) => e,
            Self::Db(e) => db_error(e),
            Self::Raced => edge_contended(),
        }
    }
}

/// The edge of a `following` row read with its block flag; FAILED_PRECONDITION BLOCKED when
/// the pair is blocked.
fn unblocked(row: Option<(Edge, bool)>) -> ApiResult<Option<Edge>> {
    match row {
        Some((_, true)) => Err(crate::restrict::blocked_error()),
        row => Ok(row.map(|(e, _)| e)),
    }
}

/// FAILED_PRECONDITION FOLLOWING_LIMIT: the follower already follows (or has requested) at least
/// `count` ≥ `cap` accounts (the compare-and-set stops counting at the cap, so `count` is a
/// lower bound).
pub(crate) fn cap_reached(follower_id: i64, count: i64, cap: i64) -> ApiError {
    ApiError::FailedPrecondition {
        reason: "FOLLOWING_LIMIT",
        message: format!("user {follower_id} already follows or has requested at least {count} accounts, the limit is {cap}"),
        metadata: [("limit".to_owned(), cap.to_string())].into(),
    }
}

/// UNAVAILABLE: every attempt at one edge lost a race to another writer of the same edge.
fn edge_contended() -> ApiError {
    ApiError::unavailable(socialgraph_server::REASON_DATABASE, "the edge is being changed by other calls; retry")
}

fn validate_pair(follower_id: i64, followee_id: i64) -> ApiResult<()> {
    let bad: Vec<Violation> =
        [validate_user_id("follower_id", follower_id), validate_user_id("followee_id", followee_id)].into_iter().filter_map(Result::err).collect();
    if bad.is_empty() { Ok(()) } else { Err(bad.into()) }
}
