//! Follower-side reads from the projection, and its rebuild from relation-svc.

use std::collections::{HashMap, VecDeque};

use sea_orm::{DatabaseConnection, DbErr};
use secrecy::{ExposeSecret, SecretString};
use socialgraph_domain::{Edge, EdgeState, ListKind, Page, PageTokenKey, validate_user_id};
use socialgraph_events::consumer::Progress;
use socialgraph_proto::relation::v1 as rpb;
use socialgraph_proto::relation::v1::relation_service_client::RelationServiceClient;
use socialgraph_server::db_error;
use socialgraph_server::paging::page_request;
use socialgraph_server::{ApiError, ApiResult};
use socialgraph_storage::counts::{CountDelta, EdgeCount};
use socialgraph_storage::edges::{self, Col, EdgeTable, ScanFilter};
use socialgraph_storage::offsets::{self, StoredOffset};
use tonic::transport::Channel;

/// The projection's read side and rebuild.
pub struct Projection {
    /// The projection database.
    pub db: DatabaseConnection,
    /// Signs page tokens.
    pub token_key: PageTokenKey,
    /// Name of this consumer in `consumer_offset`.
    pub consumer: String,
    /// The consumed topic.
    pub topic: String,
    /// Progress of the owned partitions, shared with the consumers.
    pub progress: Progress,
    /// relation-svc (lazy connection) and its admin token, for rebuilds.
    pub relation: RelationServiceClient<Channel>,
    /// Bearer token for relation-svc's ScanEdges.
    pub relation_token: Option<SecretString>,
    /// The list caches (`None`: every read goes to the database).
    pub cache: Option<std::sync::Arc<crate::cache::Caches>>,
    /// `[feed]`: a repaired follow backfills the inbox like an applied one.
    pub feed: crate::feed::FeedSettings,
    /// Publishes the counts a repair changes, as the consumer does (`None`: not published).
    pub count_log: Option<std::sync::Arc<crate::count_log::CountLog>>,
}

/// Edge counts with the offsets they reflect.
#[derive(Debug, Clone)]
pub struct EdgeCounts {
    /// Accounts the user follows.
    pub followings: i64,
    /// Accounts following the user.
    pub followers: i64,
    /// The counts' version in `edge_count` (grows by one on every change; 0 = none yet).
    pub version: i64,
    /// Stored offsets, read in the same snapshot.
    pub offsets: Vec<StoredOffset>,
}

/// The edge counts of a batch of users with the offsets they reflect.
#[derive(Debug, Clone)]
pub struct BatchEdgeCounts {
    /// One `edge_count` row per requested user, in request order (zeros and version 0 for a
    /// user without one).
    pub counts: Vec<EdgeCount>,
    /// Stored offsets, read in the same snapshot.
    pub offsets: Vec<StoredOffset>,
}

/// Counts of a rebuild.
#[derive(Debug, Clone, Copy, Default)]
pub struct RebuildCounts {
    /// Edges read from relation-svc.
    pub edges_scanned: i64,
    /// Rows inserted or corrected.
    pub rows_written: i64,
    /// Rows removed.
    pub rows_deleted: i64,
}

/// Times one repair asks the source again because the stored row moved after the last answer.
const REPAIR_ATTEMPTS: usize = 5;

fn scan_error(e: tonic::Status) -> ApiError {
    {
        tracing::warn!(code = ?e.code(), message = e.message(), "relation-svc scan failed");
        ApiError::unavailable(socialgraph_server::REASON_PEER, "relation-svc did not answer the scan; retry")
    }
}

/// Longest a read holding a consistency token waits for the projection to apply its change.
pub const CONSISTENCY_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

impl Projection {
    /// Waits until the `follower` table holds the edge change named by `token` (request field
    /// `field`) or a newer one; returns at once for an empty token. Polls every 5 ms for at most
    /// [`CONSISTENCY_WAIT`].
    ///
    /// # Errors
    /// INVALID_ARGUMENT for a malformed token; UNAVAILABLE `NOT_YET_CONSISTENT` (with RetryInfo)
    /// when the change is not applied in time; UNAVAILABLE when the database fails.
    pub async fn await_token(&self, field: &str, token: &str) -> ApiResult<()> {
        let Some(t) = socialgraph_domain::ConsistencyToken::decode(field, token)? else { return Ok(()) };
        let deadline = tokio::time::Instant::now() + CONSISTENCY_WAIT;
        loop {
            let row = edges::get(&self.db, EdgeTable::Follower, t.follower_id, t.followee_id, false).await.map_err(db_error)?;
            if row.is_some_and(|e| e.version >= t.version) {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(ApiError::unavailable(
                    "NOT_YET_CONSISTENT",
                    "the projection has not applied the change of the consistency token yet; retry",
                ));
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    /// One page of `user_id`'s followers, newest first; from the follower window when `cached`
    /// (reads that waited for a consistency token pass false: the table is what they waited
    /// for).
    ///
    /// # Errors
    /// INVALID_ARGUMENT for a bad id, size or token; RESOURCE_EXHAUSTED `DEEP_PAGE_LIMITED`
    /// for a page past the window over the deep-page rate; UNAVAILABLE.
    pub async fn list_followers(&self, user_id: i64, page_size: i32, token: &str, cached: bool) -> ApiResult<Page> {
        let req = page_request(&self.token_key, ListKind::Followers, &[("user_id", user_id)], page_size, token)?;
        let rows = match self.cache.as_ref().filter(|_| cached) {
            Some(c) => match c.follower_page(&self.db, user_id, req.after, req.size).await? {
                crate::cache::PageAnswer::Entries(rows) => rows,
                crate::cache::PageAnswer::Database => c.follower_rows(&self.db, user_id, req.after, req.size + 1).await?,
            },
            None => edges::list(&self.db, EdgeTable::Follower, user_id, req.after, req.size + 1).await.map_err(db_error)?,
        };
        Ok(self.token_key.finish(rows, req.size, ListKind::Followers, user_id, 0))
    }

    /// For each candidate, in request order: when it followed `user_id`, if it does; through
    /// the caches when `cached` (see [`Self::list_followers`]).
    ///
    /// # Errors
    /// INVALID_ARGUMENT for bad ids or batch size; UNAVAILABLE.
    pub async fn check_followers(&self, user_id: i64, candidates: &[i64], cached: bool) -> ApiResult<Vec<Option<i64>>> {
        let mut bad: Vec<_> = validate_user_id("user_id", user_id).err().into_iter().collect();
        if let Err(v) = socialgraph_domain::validate_batch("candidate_ids", candidates) {
            bad.extend(v);
        }
        if !bad.is_empty() {
            return Err(bad.into());
        }
        if let Some(c) = self.cache.as_ref().filter(|_| cached) {
            return c.check_followers(&self.db, user_id, candidates).await;
        }
        let pairs: Vec<(i64, i64)> = candidates.iter().map(|&c| (c, user_id)).collect();
        let found: HashMap<i64, Edge> = edges::get_many(&self.db, EdgeTable::Follower, &pairs, false)
            .await
            .map_err(db_error)?
            .into_iter()
            .filter(|e| e.state == EdgeState::Following)
            .map(|e| (e.follower_id, e))
            .collect();
        Ok(candidates.iter().map(|c| found.get(c).map(|e| e.followed_at_ms)).collect())
    }

    /// Exact follower count of `user_id`.
    ///
    /// # Errors
    /// INVALID_ARGUMENT for a bad id; UNAVAILABLE.
    pub async fn count_followers(&self, user_id: i64) -> ApiResult<i64> {
        validate_user_id("user_id", user_id)?;
        edges::count(&self.db, EdgeTable::Follower, Col::FolloweeId, user_id).await.map_err(db_error)
    }

    /// Followings and followers of `user_id` with their version, and the stored offsets, in
    /// one snapshot.
    ///
    /// # Errors
    /// INVALID_ARGUMENT for a bad id; UNAVAILABLE.
    pub async fn edge_counts(&self, user_id: i64) -> ApiResult<EdgeCounts> {
        validate_user_id("user_id", user_id)?;
        let BatchEdgeCounts { mut counts, offsets } = self.batch_edge_counts(&[user_id]).await?;
        let c = counts.pop().unwrap_or_default();
        Ok(EdgeCounts { followings: c.followings, followers: c.followers, version: c.version, offsets })
    }

    /// The `edge_count` rows of `user_ids` and the stored offsets, read in one snapshot. Ids
    /// are validated by the caller.
    ///
    /// # Errors
    /// UNAVAILABLE.
    pub async fn batch_edge_counts(&self, user_ids: &[i64]) -> ApiResult<BatchEdgeCounts> {
        let read = async {
            let txn = crate::cache::snapshot(&self.db).await?;
            let counts = socialgraph_storage::counts::get_many(&txn, user_ids).await?;
            let offsets = offsets::list(&txn, &self.consumer, &self.topic).await?;
            txn.commit().await?;
            Ok::<_, DbErr>(BatchEdgeCounts { counts, offsets })
        };
        read.await.map_err(db_error)
    }

    fn admin<T>(&self, msg: T) -> tonic::Request<T> {
        let mut req = tonic::Request::new(msg);
        if let Some(t) = &self.relation_token
            && let Ok(v) = format!("Bearer {}", t.expose_secret()).parse()
        {
            req.metadata_mut().insert("authorization", v);
        }
        req
    }

    /// The source's current row for one edge (a one-row ScanEdges), `None` if it never existed.
    async fn source_edge(&self, follower_id: i64, followee_id: i64) -> ApiResult<Option<Edge>> {
        let req = rpb::ScanEdgesRequest {
            after: Some(rpb::EdgeCursor { follower_id, followee_id: followee_id - 1 }),
            limit: 1,
            follower_id,
            followee_id,
            page_size: 1,
        };
        let mut stream = self.relation.clone().scan_edges(self.admin(req)).await.map_err(scan_error)?.into_inner();
        let page = stream.message().await.map_err(scan_error)?;
        Ok(page.and_then(|p| p.edges.first().map(Edge::from)).filter(|e| (e.follower_id, e.followee_id) == (follower_id, followee_id)))
    }

    /// Makes the follower row of `key` agree with the source. `scanned` is the source row as
    /// the scan saw it (maybe stale). A stored row newer than the scan, or absent from it, is
    /// checked against a fresh read of the source, which is never behind a legitimately
    /// projected row: whatever disagrees with that fresh read was damaged and is corrected.
    ///
    /// No transaction stays open across that read: it is made with no transaction open, and
    /// the transaction that follows uses its answer only if the stored row is still the one
    /// the read was made for (else it asks again), so an event applied meanwhile is never
    /// undone by an older answer.
    async fn repair(&self, key: (i64, i64), scanned: Option<Edge>, counts: &mut RebuildCounts) -> ApiResult<()> {
        // (the stored row when the source was asked, the source's answer)
        let mut asked: Option<(Option<Edge>, Option<Edge>)> = None;
        for _ in 0..REPAIR_ATTEMPTS {
            let txn = socialgraph_storage::begin_write(&self.db).await.map_err(db_error)?;
            let stored = edges::get(&txn, EdgeTable::Follower, key.0, key.1, true).await.map_err(db_error)?;
            let target = match (stored, scanned) {
                (Some(t), Some(s)) if t == s => None,
                (None, Some(s)) => Some(Some(s)),
                (Some(t), Some(s)) if t.version <= s.version => Some(Some(s)),
                (None, None) => None,
                (Some(_), _) => match asked {
                    Some((seen, answer)) if seen == stored => Some(answer),
                    _ => {
                        txn.rollback().await.map_err(db_error)?;
                        asked = Some((stored, self.source_edge(key.0, key.1).await?));
                        continue;
                    }
                },
            };
            return self.repair_in(txn, key, stored, target, counts).await;
        }
        Err(ApiError::unavailable(socialgraph_server::REASON_PEER, "the follower row kept changing during its repair; retry"))
    }

    /// The write of [`Self::repair`]: `target` is the row the source holds (`Some(None)`: none;
    /// `None`: nothing to do).
    async fn repair_in(
        &self,
        txn: sea_orm::DatabaseTransaction,
        key: (i64, i64),
        stored: Option<Edge>,
        target: Option<Option<Edge>>,
        counts: &mut RebuildCounts,
    ) -> ApiResult<()> {
        let new_state = match (target, stored) {
            (Some(Some(s)), None) => {
                edges::insert(&txn, EdgeTable::Follower, &[s]).await.map_err(db_error)?;
                counts.rows_written += 1;
                Some(s.state)
            }
            (Some(Some(s)), Some(t)) if s != t => {
                edges::update(&txn, EdgeTable::Follower, &s).await.map_err(db_error)?;
                counts.rows_written += 1;
                Some(s.state)
            }
            (Some(None), Some(_)) => {
                edges::delete(&txn, EdgeTable::Follower, key.0, key.1).await.map_err(db_error)?;
                counts.rows_deleted += 1;
                Some(EdgeState::NotFollowing)
            }
            _ => None,
        };
        // The user counts move with the repaired row, in the same transaction.
        if let Some(new_state) = new_state {
            let d = socialgraph_storage::counts::transition(stored.map(|t| t.state), new_state);
            let deltas = [CountDelta { user_id: key.0, followings: d, followers: 0 }, CountDelta { user_id: key.1, followings: 0, followers: d }];
            socialgraph_storage::counts::add(&txn, &deltas).await.map_err(db_error)?;
            if let Some(log) = &self.count_log {
                log.write(&txn, &[key.0, key.1]).await.map_err(db_error)?;
            }
            // The inboxes follow the repaired edge as they follow an applied event.
            let (follows, unfollows) = match d {
                1 => (vec![key], Vec::new()),
                -1 => (Vec::new(), vec![key]),
                _ => (Vec::new(), Vec::new()),
            };
            crate::feed::ingest::on_edges(&txn, &self.feed, &follows, &unfollows, &[]).await.map_err(db_error)?;
        }
        txn.commit().await.map_err(db_error)?;
        self.wake_relay(new_state.is_some());
        Ok(())
    }

    fn wake_relay(&self, wrote: bool) {
        if let (true, Some(log)) = (wrote, &self.count_log) {
            log.wake.notify_one();
        }
    }

    async fn scan_source(&self, req: rpb::ScanEdgesRequest) -> ApiResult<tonic::Streaming<rpb::ScanEdgesResponse>> {
        Ok(self.relation.clone().scan_edges(self.admin(req)).await.map_err(scan_error)?.into_inner())
    }

    /// Re-derives the follower rows where `user_id` is follower or followee.
    ///
    /// # Errors
    /// INVALID_ARGUMENT for a bad id; UNAVAILABLE when relation-svc or the database fails.
    pub async fn rebuild_user(&self, user_id: i64) -> ApiResult<RebuildCounts> {
        validate_user_id("user_id", user_id)?;
        let mut counts = RebuildCounts::default();
        let mut source: HashMap<(i64, i64), Edge> = HashMap::new();
        for req in [
            rpb::ScanEdgesRequest { follower_id: user_id, ..Default::default() },
            rpb::ScanEdgesRequest { followee_id: user_id, ..Default::default() },
        ] {
            let mut stream = self.scan_source(req).await?;
            while let Some(page) = stream.message().await.map_err(scan_error)? {
                counts.edges_scanned += page.edges.len() as i64;
                source.extend(page.edges.iter().map(|e| ((e.follower_id, e.followee_id), Edge::from(e))));
            }
        }
        let mut stored = Vec::new();
        for filter in
            [ScanFilter { follower_id: Some(user_id), ..Default::default() }, ScanFilter { followee_id: Some(user_id), ..Default::default() }]
        {
            stored.extend(edges::scan(&self.db, EdgeTable::Follower, filter, usize::MAX >> 1).await.map_err(db_error)?);
        }
        let mut keys: Vec<(i64, i64)> = source.keys().copied().chain(stored.iter().map(|e| (e.follower_id, e.followee_id))).collect();
        keys.sort_unstable();
        keys.dedup();
        for key in keys {
            self.repair(key, source.get(&key).copied(), &mut counts).await?;
        }
        // The rows now agree with the source; make the user's own counts agree with the rows.
        let txn = socialgraph_storage::begin_write(&self.db).await.map_err(db_error)?;
        let corrected = socialgraph_storage::counts::recount(&txn, &[user_id]).await.map_err(db_error)?;
        if let (true, Some(log)) = (corrected > 0, &self.count_log) {
            log.write(&txn, &[user_id]).await.map_err(db_error)?;
        }
        txn.commit().await.map_err(db_error)?;
        self.wake_relay(corrected > 0);
        Ok(counts)
    }

    /// Re-derives the whole follower table: a merge of relation-svc's ScanEdges with the
    /// follower table, both in (follower_id, followee_id) order, repairing each difference.
    ///
    /// # Errors
    /// UNAVAILABLE when relation-svc or the database fails.
    pub async fn rebuild_all(&self) -> ApiResult<RebuildCounts> {
        let mut counts = RebuildCounts::default();
        let mut stream = self.scan_source(rpb::ScanEdgesRequest { page_size: 5000, ..Default::default() }).await?;
        let mut stored: VecDeque<Edge> = VecDeque::new();
        let mut stored_after: Option<(i64, i64)> = None;
        let mut stored_done = false;
        let mut source: VecDeque<Edge> = VecDeque::new();
        let mut source_done = false;
        loop {
            if source.is_empty() && !source_done {
                match stream.message().await.map_err(scan_error)? {
                    Some(page) => {
                        counts.edges_scanned += page.edges.len() as i64;
                        source.extend(page.edges.iter().map(Edge::from));
                    }
                    None => source_done = true,
                }
            }
            if stored.is_empty() && !stored_done {
                let page = edges::scan(&self.db, EdgeTable::Follower, ScanFilter { after: stored_after, ..Default::default() }, 5000)
                    .await
                    .map_err(db_error)?;
                stored_done = page.len() < 5000;
                stored_after = page.last().map(|e| (e.follower_id, e.followee_id)).or(stored_after);
                stored.extend(page);
            }
            let key = |e: &Edge| (e.follower_id, e.followee_id);
            match (source.front().copied(), stored.front().copied()) {
                (None, None) => return Ok(counts),
                (Some(s), Some(t)) if key(&s) == key(&t) => {
                    source.pop_front();
                    stored.pop_front();
                    if s != t {
                        self.repair(key(&s), Some(s), &mut counts).await?;
                    }
                }
                (Some(s), Some(t)) if key(&t) < key(&s) => {
                    stored.pop_front();
                    self.repair(key(&t), None, &mut counts).await?;
                }
                (None, Some(t)) => {
                    stored.pop_front();
                    self.repair(key(&t), None, &mut counts).await?;
                }
                (Some(s), _) => {
                    source.pop_front();
                    self.repair(key(&s), Some(s), &mut counts).await?;
                }
            }
        }
    }
}
