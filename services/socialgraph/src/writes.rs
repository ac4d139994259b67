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
