//! Locked accounts and follow requests. A Follow of a locked account writes a pending request
//! (`follow_request`) instead of an edge: no event, not a follower, not counted, but it counts
//! against the requester's following cap and rate limit like a follow. The account approves
//! (the edge is made with its FOLLOWED event, in one transaction with the request's removal) or
//! rejects; the requester cancels with Unfollow; a block removes requests both ways; unlocking
//! approves every pending request in the same transaction that unlocks.
//!
//! How a request racing an unlock is closed: a locked account always has an `account` row; the
//! request's transaction reads it FOR SHARE, and the unlock updates it, so the unlock waits for
//! requests in flight and then approves them, and a request after the unlock sees it unlocked
//! and becomes a plain follow.

use sea_orm::DatabaseTransaction;
use sea_orm::sea_query::LockType;
use socialgraph_domain::{Edge, EdgeState, ListKind, validate_batch, validate_user_id};
use socialgraph_proto::events::v1::RelationEventKind;
use socialgraph_server::paging::page_request;
use socialgraph_server::{ApiResult, db_error};
use socialgraph_storage::accounts::{self, Account, AccountStatus};
use socialgraph_storage::edges::{self, Col, EdgeTable};
use socialgraph_storage::outbox;
use socialgraph_storage::restrictions::{self, Restriction};

use crate::service::{FollowOutcome, Page, Relations, TxError, cap_reached, in_tx, now_ms};

/// What a Follow of a (maybe) locked account did.
pub(crate) enum RequestOutcome {
    /// The account is not locked (any more): follow it.
    NotLocked,
    /// Answered: a request was written, one was pending already, or the edge exists.
    Done(FollowOutcome),
}

/// Which requests to list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Requests others made to the user.
    Incoming,
    /// Requests the user made.
    Outgoing,
}

impl Relations {
    /// `follower_id` asks to follow the locked `followee_id`. Validated ids, token taken.
    pub(crate) async fn request_follow(&self, follower_id: i64, followee_id: i64) -> ApiResult<RequestOutcome> {
        let out = in_tx!(self, txn => self.request_tx(&txn, follower_id, followee_id).await);
        if matches!(out, RequestOutcome::Done(FollowOutcome { changed: true, .. })) {
            self.forget_restrictions(&[follower_id, followee_id]).await;
        }
        Ok(out)
    }

    async fn request_tx(&self, txn: &DatabaseTransaction, follower_id: i64, followee_id: i64) -> Result<RequestOutcome, TxError> {
        let target = accounts::get_locked(txn, followee_id, Some(LockType::Share)).await?;
        let Some(target) = target.filter(|a| a.locked) else { return Ok(RequestOutcome::NotLocked) };
        if target.status != AccountStatus::Active {
            return Err(TxError::Api(crate::lifecycle::inactive_error()));
        }
        let row = edges::get_following(txn, follower_id, followee_id, true).await?;
        let old = match row {
            Some((_, true)) => return Err(TxError::Api(crate::restrict::blocked_error())),
            Some((e, _)) if e.state == EdgeState::Following => return Ok(RequestOutcome::Done(FollowOutcome::edge(false, e))),
            row => row.map(|(e, _)| e),
        };
        let pending = FollowOutcome::request(follower_id, followee_id, old);
        if restrictions::exists(txn, Restriction::Request, follower_id, followee_id, false).await? {
            return Ok(RequestOutcome::Done(FollowOutcome { changed: false, ..pending }));
        }
        let cap = self.config.limits.following_cap;
        let count = edges::count(txn, EdgeTable::Following, Col::FollowerId, follower_id).await?
            + restrictions::count_of(txn, Restriction::Request, follower_id, cap).await?;
        if count >= cap {
            return Err(TxError::Api(cap_reached(follower_id, count, cap)));
        }
        restrictions::insert(txn, Restriction::Request, follower_id, followee_id, now_ms()).await?;
        self.restrictions_changed(txn, &[follower_id, followee_id]).await?;
        if !accounts::inactive_among(txn, &[follower_id]).await?.is_empty() {
            return Err(TxError::Api(crate::lifecycle::inactive_error()));
        }
        Ok(RequestOutcome::Done(pending))
    }

    /// Cancels `follower_id`'s pending request to follow `followee_id` (an Unfollow of an
    /// account not followed); true when there was one.
    pub(crate) async fn cancel_request(&self, follower_id: i64, followee_id: i64) -> ApiResult<bool> {
        let cancelled = in_tx!(self, txn => async {
            let cancelled = restrictions::delete(&txn, Restriction::Request, follower_id, followee_id).await?;
            if cancelled {
                self.restrictions_changed(&txn, &[follower_id, followee_id]).await?;
            }
            Ok::<_, sea_orm::DbErr>(cancelled)
        }
        .await
        .map_err(TxError::Db));
        if cancelled {
            self.forget_restrictions(&[follower_id, followee_id]).await;
        }
        Ok(cancelled)
    }

    /// Locks (`locked`) or unlocks `user_id`'s account; unlocking approves every pending
    /// request in the same transaction. Returns (changed, requests approved).
    ///
    /// # Errors
    /// INVALID_ARGUMENT (bad id); FAILED_PRECONDITION ACCOUNT_INACTIVE; UNAVAILABLE.
    pub async fn set_locked(&self, user_id: i64, locked: bool) -> ApiResult<(bool, i64)> {
        validate_user_id("user_id", user_id)?;
        let out = in_tx!(self, txn => async {
            let acc = accounts::get(&txn, user_id, true).await?.unwrap_or(Account::active(user_id));
            if acc.status != AccountStatus::Active {
                return Err(TxError::Api(crate::lifecycle::inactive_error()));
            }
            if acc.locked == locked {
                return Ok((false, Vec::new(), Vec::new()));
            }
            accounts::put(&txn, &Account { locked, ..acc }).await?;
            let (mut approved, mut answered) = (Vec::new(), Vec::new());
            if !locked {
                // Keyset pages: requests kept (an inactive requester's) are not read twice.
                let mut after = None;
                loop {
                    let page = restrictions::list_incoming(&txn, Restriction::Request, user_id, after, 1000).await?;
                    let Some(last) = page.last() else { break };
                    after = Some(socialgraph_domain::Cursor { followed_at_ms: last.followed_at_ms, peer_id: last.user_id });
                    let ids: Vec<i64> = page.iter().map(|e| e.user_id).collect();
                    let (written, found) = self.approve_tx(&txn, user_id, &ids).await?;
                    approved.extend(written);
                    answered.extend(found);
                }
            }
            Ok((true, approved, answered))
        }
        .await);
        if !out.1.is_empty() {
            self.relay_wake.notify_one();
            self.write_through_edges(&out.1).await;
        }
        // Every requester whose request the unlock answered reads it gone at once.
        self.forget_restrictions(&with_user(&out.2, user_id)).await;
        Ok((out.0, out.1.len() as i64))
    }

    /// `user_id` approves (`approve`) or rejects the pending requests of `requester_ids`;
    /// returns how many it handled (requests that were not pending are ignored).
    ///
    /// # Errors
    /// INVALID_ARGUMENT (bad ids, batch size); FAILED_PRECONDITION ACCOUNT_INACTIVE (approving
    /// on an inactive account); UNAVAILABLE.
    pub async fn answer_requests(&self, user_id: i64, requester_ids: &[i64], approve: bool) -> ApiResult<i64> {
        let mut bad: Vec<_> = validate_user_id("user_id", user_id).err().into_iter().collect();
        if let Err(v) = validate_batch("requester_ids", requester_ids) {
            bad.extend(v);
        }
        if !bad.is_empty() {
            return Err(bad.into());
        }
        if !approve {
            let gone = in_tx!(self, txn => async {
                let gone = restrictions::delete_many(&txn, Restriction::Request, user_id, requester_ids, true).await?;
                self.restrictions_changed(&txn, &with_user(&gone, user_id)).await?;
                Ok::<_, sea_orm::DbErr>(gone)
            }
            .await
            .map_err(TxError::Db));
            self.forget_restrictions(&with_user(&gone, user_id)).await;
            return Ok(gone.len() as i64);
        }
        let (approved, answered) = in_tx!(self, txn => self.approve_tx(&txn, user_id, requester_ids).await);
        self.forget_restrictions(&with_user(&answered, user_id)).await;
        if !approved.is_empty() {
            self.relay_wake.notify_one();
            self.write_through_edges(&approved).await;
        }
        Ok(approved.len() as i64)
    }

    /// Turns the pending requests of `requester_ids` to `user_id` into edges with their events;
    /// the edge of a requester whose account is not active is made hidden (it comes back with
    /// the account). The accounts are read again after the writes, as every follow path does
    /// (see `lifecycle`). Returns the edges written and the requesters whose request it deleted
    /// (a blocked pair's request is deleted without an edge).
    async fn approve_tx(&self, txn: &DatabaseTransaction, user_id: i64, requester_ids: &[i64]) -> Result<(Vec<Edge>, Vec<i64>), TxError> {
        let mut everyone: Vec<i64> = requester_ids.to_vec();
        everyone.push(user_id);
        let inactive = accounts::inactive_among(txn, &everyone).await?;
        if inactive.contains(&user_id) {
            return Err(TxError::Api(crate::lifecycle::inactive_error()));
        }
        let mut wanted: Vec<i64> = requester_ids.to_vec();
        wanted.sort_unstable();
        wanted.dedup();
        let found = restrictions::delete_many(txn, Restriction::Request, user_id, &wanted, true).await?;
        self.restrictions_changed(txn, &with_user(&found, user_id)).await?;
        let pairs: Vec<(i64, i64)> = found.iter().map(|&r| (r, user_id)).collect();
        let existing: std::collections::HashMap<(i64, i64), Edge> =
            edges::get_many(txn, EdgeTable::Following, &pairs, true).await?.into_iter().map(|e| ((e.follower_id, e.followee_id), e)).collect();
        let blocked = edges::blocked_among(txn, &pairs).await?;
        let now = now_ms();
        let (mut inserts, mut changes, mut written) = (Vec::new(), Vec::new(), Vec::new());
        for pair in pairs.iter().filter(|p| !blocked.contains(p)) {
            let old = existing.get(pair);
            if old.is_some_and(|e| e.state != EdgeState::NotFollowing) {
                continue;
            }
            let followed = Edge::followed(pair.0, pair.1, old, now, now);
            // An inactive requester's follow is made hidden, as its other follows are: it
            // counts from its reactivation on (UNFOLLOWED says "not following" until then).
            let (edge, kind) = if inactive.contains(&pair.0) {
                (Edge { state: EdgeState::Hidden, ..followed }, RelationEventKind::Unfollowed)
            } else {
                (followed, RelationEventKind::Followed)
            };
            match old {
                Some(_) => edges::update(txn, EdgeTable::Following, &edge).await?,
                None => inserts.push(edge),
            }
            changes.push((edge, kind));
            written.push(edge);
        }
        edges::insert(txn, EdgeTable::Following, &inserts).await?;
        let events = self.edge_events(txn, &changes, now).await?;
        outbox::insert(txn, &events).await?;
        if !events.is_empty() && accounts::inactive_among(txn, &everyone).await?.len() > inactive.len() {
            return Err(TxError::Raced);
        }
        Ok((written, found))
    }

    /// One page of `user_id`'s incoming or outgoing pending requests, newest first.
    ///
    /// # Errors
    /// INVALID_ARGUMENT for a bad id, page size or token; UNAVAILABLE.
    pub async fn list_requests(&self, user_id: i64, direction: Direction, page_size: i32, token: &str) -> ApiResult<Page> {
        let list = match direction {
            Direction::Incoming => ListKind::IncomingRequests,
            Direction::Outgoing => ListKind::OutgoingRequests,
        };
        let req = page_request(self.token_key(), list, &[("user_id", user_id)], page_size, token)?;
        let rows = match direction {
            Direction::Incoming => restrictions::list_incoming(&self.db, Restriction::Request, user_id, req.after, req.size + 1).await,
            Direction::Outgoing => restrictions::list(&self.db, Restriction::Request, user_id, req.after, req.size + 1).await,
        }
        .map_err(db_error)?;
        Ok(self.token_key().finish(rows, req.size, list, user_id, 0))
    }
}

impl FollowOutcome {
    /// A Follow answered with an edge (`changed`: this call wrote it).
    pub(crate) fn edge(changed: bool, edge: Edge) -> Self {
        Self { changed, edge, requested: false }
    }

    /// A Follow answered with a pending request; `edge` is the row as it stands (version 0
    /// when none).
    pub(crate) fn request(follower_id: i64, followee_id: i64, edge: Option<Edge>) -> Self {
        let edge = edge.unwrap_or(Edge { follower_id, followee_id, state: EdgeState::NotFollowing, version: 0, followed_at_ms: 0, updated_at_ms: 0 });
        Self { changed: true, edge, requested: true }
    }
}

/// `peers` and `user_id`: the users whose restriction summaries a change of requests between
/// them touches (none when no request changed).
fn with_user(peers: &[i64], user_id: i64) -> Vec<i64> {
    if peers.is_empty() {
        return Vec::new();
    }
    peers.iter().copied().chain([user_id]).collect()
}
