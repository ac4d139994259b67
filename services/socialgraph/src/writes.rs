//! One change of the graph on a user's behalf: follow, unfollow, block, unblock, mute, unmute,
//! remove a follower. Each is one idempotent RPC to relation-svc; the result says whether
//! anything changed.

use serde::Serialize;
use socialgraph_proto::relation::v1 as rel;

use crate::endpoints::{Endpoints, RELATION};
use crate::error::{CliError, CliResult};
use crate::output::TableRow;

/// A change between an acting user and another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    /// `actor` follows `other` (Follow).
    Follow,
    /// `actor` stops following `other` (Unfollow).
    Unfollow,
    /// `actor` blocks `other`: the edges both ways end (Block).
    Block,
    /// `actor` lifts its block of `other` (Unblock).
    Unblock,
    /// `actor` mutes `other` (Mute).
    Mute,
    /// `actor` lifts its mute of `other` (Unmute).
    Unmute,
    /// `actor` removes its follower `other` (RemoveFollower).
    RemoveFollower,
}

/// What a [`Write`] did, as printed.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct WriteRow {
    /// The RPC called.
    pub action: &'static str,
    /// The acting user.
    pub user_id: i64,
    /// The other user.
    pub other_user_id: i64,
    /// Whether anything changed (false: it was already so).
    pub changed: bool,
    /// Edge version after a follow, unfollow or removal; edges ended by a block.
    pub detail: String,
}

impl TableRow for WriteRow {
    fn header() -> Vec<&'static str> {
        vec!["action", "user_id", "other_user_id", "changed", "detail"]
    }
    fn cells(&self) -> Vec<String> {
        vec![self.action.to_owned(), self.user_id.to_string(), self.other_user_id.to_string(), self.changed.to_string(), self.detail.clone()]
    }
}

/// Performs `write` by `actor` on `other`.
///
/// # Errors
/// [`CliError::Connect`]; [`CliError::Rpc`] with the server's status (INVALID_ARGUMENT for bad
/// ids or a self-reference, FAILED_PRECONDITION BLOCKED or FOLLOWING_LIMIT, RESOURCE_EXHAUSTED
/// RATE_LIMITED, …).
pub async fn write(endpoints: &Endpoints, write: Write, actor: i64, other: i64) -> CliResult<WriteRow> {
    let mut c = endpoints.relation().await?;
    let err = |s| CliError::rpc(RELATION, s);
    let (action, changed, detail) = match write {
        Write::Follow => {
            let r = c.follow(rel::FollowRequest { follower_id: actor, followee_id: other }).await.map_err(err)?.into_inner();
            ("follow", r.changed, format!("version {}", r.version))
        }
        Write::Unfollow => {
            let r = c.unfollow(rel::UnfollowRequest { follower_id: actor, followee_id: other }).await.map_err(err)?.into_inner();
            ("unfollow", r.changed, format!("version {}", r.version))
        }
        Write::Block => {
            let r = c.block(rel::BlockRequest { blocker_id: actor, blocked_id: other }).await.map_err(err)?.into_inner();
            ("block", r.changed, format!("{} edges removed", r.edges_removed))
        }
        Write::Unblock => {
            let r = c.unblock(rel::UnblockRequest { blocker_id: actor, blocked_id: other }).await.map_err(err)?.into_inner();
            ("unblock", r.changed, String::new())
        }
        Write::Mute => {
            let r = c.mute(rel::MuteRequest { muter_id: actor, muted_id: other }).await.map_err(err)?.into_inner();
            ("mute", r.changed, String::new())
        }
        Write::Unmute => {
            let r = c.unmute(rel::UnmuteRequest { muter_id: actor, muted_id: other }).await.map_err(err)?.into_inner();
            ("unmute", r.changed, String::new())
        }
        Write::RemoveFollower => {
            let r = c.remove_follower(rel::RemoveFollowerRequest { user_id: actor, follower_id: other }).await.map_err(err)?.into_inner();
            ("remove-follower", r.changed, format!("version {}", r.version))
        }
    };
    Ok(WriteRow { action, user_id: actor, other_user_id: other, changed, detail })
}

/// A change of an account's lifecycle, or a look at it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccountAction {
    /// GetAccount.
    Show,
    /// SetAccountStatus DEACTIVATED (the owner).
    Deactivate,
    /// SetAccountStatus ACTIVE: lifts a deactivation (or, with the admin token, a suspension).
    Reactivate,
    /// SetAccountStatus SUSPENDED (needs the admin token).
    Suspend,
    /// DeleteAccount (irreversible).
    Delete,
}

/// An account as printed.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct AccountRow {
    /// The user.
    pub user_id: i64,
    /// ACTIVE, DEACTIVATED, SUSPENDED or DELETING.
    pub status: String,
    /// The edge job in progress (NONE when the edges agree with the status).
    pub job: String,
    /// Edges the job changed so far.
    pub edges_done: i64,
    /// Whether this call changed anything (always false for `Show`).
    pub changed: bool,
}

impl TableRow for AccountRow {
    fn header() -> Vec<&'static str> {
        vec!["user_id", "status", "job", "edges_done", "changed"]
    }
    fn cells(&self) -> Vec<String> {
        vec![self.user_id.to_string(), self.status.clone(), self.job.clone(), self.edges_done.to_string(), self.changed.to_string()]
    }
}

/// Performs `action` on `user_id`'s account; suspension and lifting one send the admin token.
///
/// # Errors
/// [`CliError::Connect`]; [`CliError::Rpc`] (PERMISSION_DENIED without the admin token,
/// FAILED_PRECONDITION ACCOUNT_DELETING, …).
pub async fn account(endpoints: &Endpoints, action: AccountAction, user_id: i64) -> CliResult<AccountRow> {
    let mut c = endpoints.relation().await?;
    let err = |s| CliError::rpc(RELATION, s);
    let set = |status: rel::AccountStatus| {
        let mut req = tonic::Request::new(rel::SetAccountStatusRequest { user_id, status: status as i32 });
        if let Some(t) = endpoints.admin_token.as_ref().filter(|_| matches!(action, AccountAction::Suspend | AccountAction::Reactivate))
            && let Ok(v) = format!("Bearer {t}").parse()
        {
            req.metadata_mut().insert("authorization", v);
        }
        req
    };
    let (account, changed) = match action {
        AccountAction::Show => (c.get_account(rel::GetAccountRequest { user_id }).await.map_err(err)?.into_inner().account, false),
        AccountAction::Deactivate => {
            let r = c.set_account_status(set(rel::AccountStatus::Deactivated)).await.map_err(err)?.into_inner();
            (r.account, r.changed)
        }
        AccountAction::Reactivate => {
            let r = c.set_account_status(set(rel::AccountStatus::Active)).await.map_err(err)?.into_inner();
            (r.account, r.changed)
        }
        AccountAction::Suspend => {
            let r = c.set_account_status(set(rel::AccountStatus::Suspended)).await.map_err(err)?.into_inner();
            (r.account, r.changed)
        }
        AccountAction::Delete => {
            let r = c.delete_account(rel::DeleteAccountRequest { user_id }).await.map_err(err)?.into_inner();
            (r.account, r.changed)
        }
    };
    let a = account.unwrap_or_default();
    let name = |s: &str, prefix: &str| s.strip_prefix(prefix).unwrap_or(s).to_owned();
    let status = rel::AccountStatus::try_from(a.status).map_or_else(|_| a.status.to_string(), |s| name(s.as_str_name(), "ACCOUNT_STATUS_"));
    let job = rel::AccountJob::try_from(a.job).map_or_else(|_| a.job.to_string(), |j| name(j.as_str_name(), "ACCOUNT_JOB_"));
    Ok(AccountRow { user_id: a.user_id, status, job, edges_done: a.edges_done, changed })
}

/// Locks (`locked`) or unlocks `user_id`'s account; returns (changed, requests an unlock
/// approved).
///
/// # Errors
/// [`CliError::Connect`]; [`CliError::Rpc`].
pub async fn set_locked(endpoints: &Endpoints, user_id: i64, locked: bool) -> CliResult<(bool, i64)> {
    let mut c = endpoints.relation().await?;
    let r = c.set_account_locked(rel::SetAccountLockedRequest { user_id, locked }).await.map_err(|s| CliError::rpc(RELATION, s))?.into_inner();
    Ok((r.changed, r.approved))
}

/// `user_id` approves (`approve`) or rejects the pending requests of `requesters` (sent 1000
/// per call); returns how many it handled.
///
/// # Errors
/// [`CliError::Connect`]; [`CliError::Rpc`].
pub async fn answer_requests(endpoints: &Endpoints, user_id: i64, requesters: &[i64], approve: bool) -> CliResult<i64> {
    let mut c = endpoints.relation().await?;
    let mut total = 0;
    for chunk in requesters.chunks(socialgraph_domain::MAX_BATCH) {
        let requester_ids = chunk.to_vec();
        total += if approve {
            c.approve_follow_requests(rel::ApproveFollowRequestsRequest { user_id, requester_ids }).await.map(|r| r.into_inner().approved)
        } else {
            c.reject_follow_requests(rel::RejectFollowRequestsRequest { user_id, requester_ids }).await.map(|r| r.into_inner().rejected)
        }
        .map_err(|s| CliError::rpc(RELATION, s))?;
    }
    Ok(total)
}
