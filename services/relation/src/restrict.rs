//! Blocks, mutes and removed followers: restrictions one user puts on another, owned by
//! relation-svc beside the edges.
//!
//! A block ends the follow edges in both directions in its own transaction, with one
//! Unfollowed event per edge that changed, so the projection and the counters need nothing
//! new. While it stands neither user can follow the other. The rule is enforced on the edge
//! row itself: a block sets `following.blocked` on both directions' rows (creating rows of
//! version 0 for pairs that never followed), and every follow path refuses a blocked row.
//! How each race is closed:
//! - Follow vs Block, PostgreSQL compare-and-set: the Follow statement only writes a row that is
//!   not blocked; a row the block wrote first is re-checked after the block commits, and a row
//!   the Follow wrote first is locked, so the block waits and then ends it.
//! - Follow vs Block, transaction path (MariaDB, SQLite): the Follow locks the row it reads;
//!   a Follow inserting a row the block inserted meanwhile fails on the key and retries.
//! - Block/Unblock vs each other: both lock the pair's two rows first, always in the same
//!   order, and only then read or write the `block` rows, so the flag is computed from a
//!   settled view ("blocked" = either direction blocks).

use socialgraph_cache::restrictions::SummaryRead;
use socialgraph_domain::{Edge, EdgeState, ListKind, Violation, validate_user_id};
use socialgraph_proto::events::v1::RelationEventKind;
use socialgraph_server::paging::page_request;
use socialgraph_server::{ApiError, ApiResult, db_error};
use socialgraph_storage::edges::{self, EdgeTable};
use socialgraph_storage::outbox;
use socialgraph_storage::restrictions::{self, Restriction};

use crate::cache::Ahead;
use crate::service::{Page, Relations, TxError, UnfollowOutcome, in_tx, now_ms};

/// Result of a Block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockOutcome {
    /// The block is new.
    pub changed: bool,
    /// Follow edges ended by this call (0..=2), one event each.
    pub edges_removed: i32,
}

/// What stands between a user and another besides the edges.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Flags {
    /// The user blocks the other.
    pub blocking: bool,
    /// The other blocks the user.
    pub blocked_by: bool,
    /// The user mutes the other.
    pub muting: bool,
    /// The user's follow request to the other is pending.
    pub requested: bool,
    /// The other's follow request to the user is pending.
    pub requested_by: bool,
}

/// FAILED_PRECONDITION BLOCKED: one of the two users blocks the other. The same answer for
/// both sides, so the blocked user learns nothing about who blocked whom.
pub(crate) fn blocked_error() -> ApiError {
    ApiError::FailedPrecondition { reason: "BLOCKED", message: "a block between these users prevents following".into(), metadata: Default::default() }
}

/// Both directions' rows of a pair, in the one order every block and unblock locks them.
fn pair_rows(a: i64, b: i64) -> [(i64, i64); 2] {
    let (lo, hi) = (a.min(b), a.max(b));
    [(lo, hi), (hi, lo)]
}

/// Validates (owner, target) ids named `names`, refusing owner == target with `self_reason`.
fn validate_restriction(names: (&str, &str), owner: i64, target: i64, self_reason: &'static str) -> ApiResult<()> {
    let bad: Vec<Violation> = [validate_user_id(names.0, owner), validate_user_id(names.1, target)].into_iter().filter_map(Result::err).collect();
    if !bad.is_empty() {
        return Err(bad.into());
    }
    if owner == target {
        return Err(ApiError::InvalidArgument { reason: self_reason, violations: vec![Violation::new(names.1, "must differ from the caller")] });
    }
    Ok(())
}

impl Relations {
    /// `blocker_id` blocks `blocked_id`; see the RPC's contract.
    ///
    /// # Errors
    /// INVALID_ARGUMENT (bad ids, SELF_BLOCK); FAILED_PRECONDITION ACCOUNT_DELETING (either account
    /// is being deleted); UNAVAILABLE.
    pub async fn block(&self, blocker_id: i64, blocked_id: i64) -> ApiResult<BlockOutcome> {
        validate_restriction(("blocker_id", "blocked_id"), blocker_id, blocked_id, "SELF_BLOCK")?;
        let (out, ended) = in_tx!(self, txn => self.block_tx(&txn, blocker_id, blocked_id).await);
        if out.changed {
            self.forget_restrictions(&[blocker_id, blocked_id]).await;
        }
        if !ended.is_empty() {
            self.relay_wake.notify_one();
            self.write_through_edges(&ended).await;
        }
        Ok(out)
    }

    /// The block in `txn`: its outcome and the edges it ended.
    async fn block_tx(&self, txn: &sea_orm::DatabaseTransaction, blocker_id: i64, blocked_id: i64) -> Result<(BlockOutcome, Vec<Edge>), TxError> {
        let now = now_ms();
        let rows = pair_rows(blocker_id, blocked_id);
        for (f, e) in rows {
            edges::mark_blocked(txn, f, e, true, now).await?;
        }
        if restrictions::exists(txn, Restriction::Block, blocker_id, blocked_id, false).await? {
            return Ok((BlockOutcome { changed: false, edges_removed: 0 }, Vec::new()));
        }
        restrictions::insert(txn, Restriction::Block, blocker_id, blocked_id, now).await?;
        self.restrictions_changed(txn, &[blocker_id, blocked_id]).await?;
        // The pair's block as other services copy it (a block the other way already set it).
        let mut events: Vec<_> = self.block_changed(txn, (blocker_id, blocked_id), true, now).await?.into_iter().collect();
        // Pending follow requests between them go too (not edges: no events).
        restrictions::delete(txn, Restriction::Request, blocker_id, blocked_id).await?;
        restrictions::delete(txn, Restriction::Request, blocked_id, blocker_id).await?;
        let mut ended = Vec::new();
        for (f, e) in rows {
            let Some((old, _)) = edges::get_following(txn, f, e, true).await? else { continue };
            if old.state != EdgeState::NotFollowing {
                let edge = old.unfollowed(now);
                edges::update(txn, EdgeTable::Following, &edge).await?;
                ended.push(edge);
            }
        }
        let changes: Vec<_> = ended.iter().map(|e| (*e, RelationEventKind::Unfollowed)).collect();
        events.extend(self.edge_events(txn, &changes, now).await?);
        outbox::insert(txn, &events).await?;
        crate::lifecycle::refuse_deleting(txn, &[blocker_id, blocked_id]).await?;
        Ok((BlockOutcome { changed: true, edges_removed: ended.len() as i32 }, ended))
    }

    /// Lifts `blocker_id`'s block of `blocked_id`; true when there was one.
    ///
    /// # Errors
    /// INVALID_ARGUMENT for bad ids; UNAVAILABLE.
    pub async fn unblock(&self, blocker_id: i64, blocked_id: i64) -> ApiResult<bool> {
        validate_restriction(("blocker_id", "blocked_id"), blocker_id, blocked_id, "SELF_BLOCK")?;
        let lifted = in_tx!(self, txn => async {
            let rows = pair_rows(blocker_id, blocked_id);
            for (f, e) in rows {
                edges::get_following(&txn, f, e, true).await?;
            }
            if !restrictions::delete(&txn, Restriction::Block, blocker_id, blocked_id).await? {
                return Ok(false);
            }
            self.restrictions_changed(&txn, &[blocker_id, blocked_id]).await?;
            if !restrictions::exists(&txn, Restriction::Block, blocked_id, blocker_id, false).await? {
                let now = now_ms();
                for (f, e) in rows {
                    edges::mark_blocked(&txn, f, e, false, now).await?;
                }
                let events: Vec<_> = self.block_changed(&txn, (blocker_id, blocked_id), false, now).await?.into_iter().collect();
                outbox::insert(&txn, &events).await?;
            }
            Ok::<_, sea_orm::DbErr>(true)
        }
        .await
        .map_err(TxError::Db));
        if lifted {
            self.forget_restrictions(&[blocker_id, blocked_id]).await;
        }
        Ok(lifted)
    }

    /// `muter_id` mutes (`on`) or unmutes `muted_id`; true when that changed anything.
    ///
    /// # Errors
    /// INVALID_ARGUMENT (bad ids, SELF_MUTE); FAILED_PRECONDITION ACCOUNT_DELETING (a new mute
    /// while either account is being deleted); UNAVAILABLE.
    pub async fn set_mute(&self, muter_id: i64, muted_id: i64, on: bool) -> ApiResult<bool> {
        validate_restriction(("muter_id", "muted_id"), muter_id, muted_id, "SELF_MUTE")?;
        // Two identical mutes at once: the second insert meets the key and retries, then sees it.
        let changed = in_tx!(self, txn => async {
            let now = now_ms();
            let changed = if on {
                let new = !restrictions::exists(&txn, Restriction::Mute, muter_id, muted_id, false).await?;
                if new {
                    restrictions::insert(&txn, Restriction::Mute, muter_id, muted_id, now).await?;
                }
                new
            } else {
                restrictions::delete(&txn, Restriction::Mute, muter_id, muted_id).await?
            };
            if changed {
                self.restrictions_changed(&txn, &[muter_id, muted_id]).await?;
                // The mute as projection-svc copies it, with its version.
                let event = self.mute_changed(&txn, (muter_id, muted_id), on, now).await?;
                outbox::insert(&txn, &[event]).await?;
                if on {
                    crate::lifecycle::refuse_deleting(&txn, &[muter_id, muted_id]).await?;
                }
            }
            Ok::<_, TxError>(changed)
        }
        .await);
        if changed {
            self.relay_wake.notify_one();
            self.forget_restrictions(&[muter_id, muted_id]).await;
        }
        Ok(changed)
    }

    /// `user_id` removes `follower_id` from its followers: the edge follower → user ends.
    ///
    /// # Errors
    /// INVALID_ARGUMENT for bad ids; UNAVAILABLE.
    pub async fn remove_follower(&self, user_id: i64, follower_id: i64) -> ApiResult<UnfollowOutcome> {
        let bad: Vec<Violation> =
            [validate_user_id("user_id", user_id), validate_user_id("follower_id", follower_id)].into_iter().filter_map(Result::err).collect();
        if !bad.is_empty() {
            return Err(bad.into());
        }
        self.unfollow(follower_id, user_id).await
    }

    /// One page of `user_id`'s blocks or mutes, newest first.
    ///
    /// # Errors
    /// INVALID_ARGUMENT for a bad id, page size or token; UNAVAILABLE.
    pub async fn list_restrictions(&self, kind: Restriction, user_id: i64, page_size: i32, token: &str) -> ApiResult<Page> {
        let list = match kind {
            Restriction::Block => ListKind::Blocks,
            Restriction::Mute => ListKind::Mutes,
            Restriction::Request => ListKind::OutgoingRequests,
        };
        let req = page_request(self.token_key(), list, &[("user_id", user_id)], page_size, token)?;
        let rows = restrictions::list(&self.db, kind, user_id, req.after, req.size + 1).await.map_err(db_error)?;
        Ok(self.token_key().finish(rows, req.size, list, user_id, 0))
    }

    /// For each of `others`, in order: the edges both ways ([`Self::relationships`]) and the
    /// restrictions ([`Self::restrictions_with`]) between it and `user_id`, read at once: on
    /// a single cache Redis the three cache reads are one transaction ([`Self::read_ahead`]),
    /// and each part goes on from what it read (its script, the database) at the same time.
    ///
    /// # Errors
    /// INVALID_ARGUMENT for bad ids or batch size (before anything is read); UNAVAILABLE.
    pub async fn relationships_with_flags(
        &self,
        user_id: i64,
        others: &[i64],
        field: &str,
    ) -> ApiResult<(Vec<(Option<Edge>, Option<Edge>)>, Vec<Flags>)> {
        let mut bad: Vec<Violation> = validate_user_id("user_id", user_id).err().into_iter().collect();
        if let Err(v) = socialgraph_domain::validate_batch(field, others) {
            bad.extend(v);
        }
        if !bad.is_empty() {
            return Err(bad.into());
        }
        let rpc = if field == "other_user_id" { "GetRelationship" } else { "BatchGetRelationships" };
        let ahead = self.read_ahead(user_id, others).await;
        let (rel, flags) = tokio::join!(
            self.relationships(rpc, user_id, others, ahead.following, ahead.followers),
            self.restrictions_with(rpc, user_id, others, ahead.restrictions)
        );
        Ok((rel?, flags?))
    }

    /// For each of `others`, in order: the blocks, mute and pending follow requests between it
    /// and `user_id`, from the user's cached restriction summary when there is one, else from
    /// the database (`rpc` names the caller in the cache metrics; `ahead`, the summary when it
    /// was read ahead). The ids are validated by the caller.
    ///
    /// # Errors
    /// UNAVAILABLE.
    pub(crate) async fn restrictions_with(&self, rpc: &str, user_id: i64, others: &[i64], ahead: Ahead<SummaryRead>) -> ApiResult<Vec<Flags>> {
        let found = match self.cached_restrictions(rpc, user_id, ahead).await {
            Some(found) => found,
            None => restrictions::between(&self.db, user_id, others).await.map_err(db_error)?,
        };
        let has = |kind: Restriction, owner: i64, target: i64| found.contains(&(kind, owner, target));
        Ok(others
            .iter()
            .map(|&o| Flags {
                blocking: has(Restriction::Block, user_id, o),
                blocked_by: has(Restriction::Block, o, user_id),
                muting: has(Restriction::Mute, user_id, o),
                requested: has(Restriction::Request, user_id, o),
                requested_by: has(Restriction::Request, o, user_id),
            })
            .collect())
    }
}
