//! RelationService over gRPC: convert the request, call [`Relations`], map the result.

use std::sync::Arc;

use futures::StreamExt;
use secrecy::SecretString;
use socialgraph_domain::{Edge, ListKind, timestamp_from_ms, timestamp_to_ms, validate_timestamp, validate_user_id};
use socialgraph_proto::relation::v1 as pb;
use socialgraph_proto::relation::v1::relation_service_server::RelationService;
use socialgraph_server::{ApiError, ApiResult};
use socialgraph_storage::accounts::{Account, AccountJob, AccountStatus};
use socialgraph_storage::edges::{ListEntry, ScanFilter};
use socialgraph_storage::restrictions::Restriction;

use crate::lifecycle::Caller;
use crate::requests::Direction;
use crate::restrict::Flags;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::import::{ImportCounts, ImportEdge};
use crate::service::{Relations, now_ms};

/// Most edges in one ImportFollows message.
const MAX_IMPORT_MESSAGE_EDGES: usize = 10_000;
/// Most edges per ScanEdges page.
const MAX_SCAN_PAGE: i32 = 10_000;

/// The tonic implementation of `socialgraph.relation.v1.RelationService`.
pub struct RelationGrpc {
    relations: Arc<Relations>,
    admin_token: Option<SecretString>,
}

impl RelationGrpc {
    /// Serves `relations`; admin RPCs accept `Bearer <admin_token>`, or nothing when unset.
    pub fn new(relations: Arc<Relations>, admin_token: Option<SecretString>) -> Self {
        Self { relations, admin_token }
    }

    fn require_admin<T>(&self, req: &Request<T>) -> ApiResult<()> {
        socialgraph_server::auth::require_admin(self.admin_token.as_ref(), req.metadata())
    }

    /// An administrator when the request carries authorization (which must then be the admin
    /// token), the account's owner otherwise.
    fn caller<T>(&self, req: &Request<T>) -> ApiResult<Caller> {
        if req.metadata().get("authorization").is_none() {
            return Ok(Caller::Owner);
        }
        self.require_admin(req).map(|()| Caller::Admin)
    }
}

fn entries(list: Vec<ListEntry>) -> Vec<pb::FollowEntry> {
    list.into_iter().map(|e| pb::FollowEntry { user_id: e.user_id, followed_at: Some(timestamp_from_ms(e.followed_at_ms)) }).collect()
}

/// One relationship from the edges both ways and the restrictions and requests between them.
fn relationship(other: i64, (out, inc): (Option<Edge>, Option<Edge>), f: Flags) -> pb::Relationship {
    pb::Relationship {
        other_user_id: other,
        following: out.is_some(),
        followed_by: inc.is_some(),
        followed_at: out.map(|e| timestamp_from_ms(e.followed_at_ms)),
        followed_by_at: inc.map(|e| timestamp_from_ms(e.followed_at_ms)),
        blocking: f.blocking,
        blocked_by: f.blocked_by,
        muting: f.muting,
        requested: f.requested,
        requested_by: f.requested_by,
    }
}

fn restricted(list: Vec<ListEntry>) -> Vec<pb::RestrictedAccount> {
    list.into_iter().map(|e| pb::RestrictedAccount { user_id: e.user_id, created_at: Some(timestamp_from_ms(e.followed_at_ms)) }).collect()
}

fn account_pb(a: &Account) -> pb::Account {
    let status = match a.status {
        AccountStatus::Active => pb::AccountStatus::Active,
        AccountStatus::Deactivated => pb::AccountStatus::Deactivated,
        AccountStatus::Suspended => pb::AccountStatus::Suspended,
        AccountStatus::Deleting => pb::AccountStatus::Deleting,
    };
    let job = match a.job {
        AccountJob::None => pb::AccountJob::None,
        AccountJob::Hide => pb::AccountJob::Hide,
        AccountJob::Restore => pb::AccountJob::Restore,
        AccountJob::Delete => pb::AccountJob::Delete,
    };
    pb::Account {
        user_id: a.user_id,
        status: status as i32,
        job: job as i32,
        edges_done: a.edges_done,
        changed_at: (a.changed_at_ms > 0).then(|| timestamp_from_ms(a.changed_at_ms)),
        locked: a.locked,
    }
}

/// Validates one import message whole, before any of it is written.
fn import_edges(msg: &pb::ImportFollowsRequest, index: usize) -> ApiResult<Vec<ImportEdge>> {
    if msg.edges.len() > MAX_IMPORT_MESSAGE_EDGES {
        return Err(ApiError::invalid(
            format!("messages[{index}].edges"),
            format!("holds {} edges, at most {MAX_IMPORT_MESSAGE_EDGES} per message", msg.edges.len()),
        ));
    }
    let now = now_ms();
    let mut bad = Vec::new();
    let out = msg
        .edges
        .iter()
        .enumerate()
        .map(|(i, e)| {
            bad.extend(validate_user_id(&format!("edges[{i}].follower_id"), e.follower_id).err());
            bad.extend(validate_user_id(&format!("edges[{i}].followee_id"), e.followee_id).err());
            if let Some(ts) = &e.followed_at {
                bad.extend(validate_timestamp(&format!("edges[{i}].followed_at"), ts).err());
            }
            (e.follower_id, e.followee_id, e.followed_at.as_ref().map_or(now, timestamp_to_ms))
        })
        .collect();
    if bad.is_empty() { Ok(out) } else { Err(bad.into()) }
}

fn add(total: &mut ImportCounts, c: ImportCounts) {
    total.received += c.received;
    total.imported += c.imported;
    total.skipped_self_loops += c.skipped_self_loops;
    total.skipped_duplicates += c.skipped_duplicates;
    total.skipped_blocked += c.skipped_blocked;
    total.skipped_inactive += c.skipped_inactive;
}

/// The edge's ids on the RPC's span (`socialgraph.follower_id`, `socialgraph.followee_id`):
/// what a trace of a follow is found by.
fn edge_attributes(follower_id: i64, followee_id: i64) {
    socialgraph_telemetry::annotate(&[("socialgraph.follower_id", follower_id), ("socialgraph.followee_id", followee_id)]);
}

#[tonic::async_trait]
impl RelationService for RelationGrpc {
    async fn follow(&self, req: Request<pb::FollowRequest>) -> Result<Response<pb::FollowResponse>, Status> {
        let r = req.into_inner();
        edge_attributes(r.follower_id, r.followee_id);
        let out = self.relations.follow(r.follower_id, r.followee_id).await?;
        Ok(Response::new(pb::FollowResponse {
            changed: out.changed,
            followed_at: (!out.requested).then(|| timestamp_from_ms(out.edge.followed_at_ms)),
            version: out.edge.version,
            requested: out.requested,
            consistency_token: self.relations.consistency_token(out.changed && !out.requested, r.follower_id, r.followee_id, out.edge.version).await,
        }))
    }

    async fn unfollow(&self, req: Request<pb::UnfollowRequest>) -> Result<Response<pb::UnfollowResponse>, Status> {
        let r = req.into_inner();
        edge_attributes(r.follower_id, r.followee_id);
        let out = self.relations.unfollow(r.follower_id, r.followee_id).await?;
        Ok(Response::new(pb::UnfollowResponse {
            changed: out.changed,
            version: out.version,
            request_cancelled: out.request_cancelled,
            consistency_token: self.relations.consistency_token(out.changed, r.follower_id, r.followee_id, out.version).await,
        }))
    }

    async fn list_following(&self, req: Request<pb::ListFollowingRequest>) -> Result<Response<pb::ListFollowingResponse>, Status> {
        let r = req.into_inner();
        let page = self.relations.list(ListKind::Following, r.user_id, 0, r.page_size, &r.page_token).await?;
        Ok(Response::new(pb::ListFollowingResponse { following: entries(page.entries), next_page_token: page.next_page_token }))
    }

    async fn get_relationship(&self, req: Request<pb::GetRelationshipRequest>) -> Result<Response<pb::GetRelationshipResponse>, Status> {
        let r = req.into_inner();
        validate_user_id("other_user_id", r.other_user_id).map_err(ApiError::from)?;
        let (mut rel, mut flags) = self.relations.relationships_with_flags(r.user_id, &[r.other_user_id], "other_user_id").await?;
        let (pair, flags) = (rel.pop().unwrap_or((None, None)), flags.pop().unwrap_or_default());
        Ok(Response::new(pb::GetRelationshipResponse { relationship: Some(relationship(r.other_user_id, pair, flags)) }))
    }

    async fn batch_get_relationships(
        &self,
        req: Request<pb::BatchGetRelationshipsRequest>,
    ) -> Result<Response<pb::BatchGetRelationshipsResponse>, Status> {
        let r = req.into_inner();
        let (rel, flags) = self.relations.relationships_with_flags(r.user_id, &r.other_user_ids, "other_user_ids").await?;
        let relationships = r.other_user_ids.iter().zip(rel).zip(flags).map(|((&o, p), f)| relationship(o, p, f)).collect();
        Ok(Response::new(pb::BatchGetRelationshipsResponse { relationships }))
    }

    async fn list_common_following(&self, req: Request<pb::ListCommonFollowingRequest>) -> Result<Response<pb::ListCommonFollowingResponse>, Status> {
        let r = req.into_inner();
        let page = self.relations.list(ListKind::CommonFollowing, r.user_id, r.other_user_id, r.page_size, &r.page_token).await?;
        Ok(Response::new(pb::ListCommonFollowingResponse { accounts: entries(page.entries), next_page_token: page.next_page_token }))
    }

    async fn list_familiar_followers(
        &self,
        req: Request<pb::ListFamiliarFollowersRequest>,
    ) -> Result<Response<pb::ListFamiliarFollowersResponse>, Status> {
        let r = req.into_inner();
        let page = self.relations.list(ListKind::FamiliarFollowers, r.viewer_id, r.user_id, r.page_size, &r.page_token).await?;
        Ok(Response::new(pb::ListFamiliarFollowersResponse { accounts: entries(page.entries), next_page_token: page.next_page_token }))
    }

    async fn import_follows(&self, req: Request<Streaming<pb::ImportFollowsRequest>>) -> Result<Response<pb::ImportFollowsResponse>, Status> {
        self.require_admin(&req)?;
        let mut stream = req.into_inner();
        let batch = self.relations.import_batch_size();
        let mut total = ImportCounts::default();
        let mut index = 0;
        while let Some(msg) = stream.next().await {
            let edges = import_edges(&msg?, index)?;
            for chunk in edges.chunks(batch) {
                add(&mut total, self.relations.import_chunk(chunk).await?);
            }
            index += 1;
        }
        Ok(Response::new(pb::ImportFollowsResponse {
            received: total.received,
            imported: total.imported,
            skipped_self_loops: total.skipped_self_loops,
            skipped_duplicates: total.skipped_duplicates,
            skipped_blocked: total.skipped_blocked,
            skipped_inactive: total.skipped_inactive,
        }))
    }

    async fn count_following(&self, req: Request<pb::CountFollowingRequest>) -> Result<Response<pb::CountFollowingResponse>, Status> {
        let count = self.relations.count_following(req.into_inner().user_id).await?;
        Ok(Response::new(pb::CountFollowingResponse { count }))
    }

    async fn block(&self, req: Request<pb::BlockRequest>) -> Result<Response<pb::BlockResponse>, Status> {
        let r = req.into_inner();
        let out = self.relations.block(r.blocker_id, r.blocked_id).await?;
        Ok(Response::new(pb::BlockResponse { changed: out.changed, edges_removed: out.edges_removed }))
    }

    async fn unblock(&self, req: Request<pb::UnblockRequest>) -> Result<Response<pb::UnblockResponse>, Status> {
        let r = req.into_inner();
        let changed = self.relations.unblock(r.blocker_id, r.blocked_id).await?;
        Ok(Response::new(pb::UnblockResponse { changed }))
    }

    async fn mute(&self, req: Request<pb::MuteRequest>) -> Result<Response<pb::MuteResponse>, Status> {
        let r = req.into_inner();
        let changed = self.relations.set_mute(r.muter_id, r.muted_id, true).await?;
        Ok(Response::new(pb::MuteResponse { changed }))
    }

    async fn unmute(&self, req: Request<pb::UnmuteRequest>) -> Result<Response<pb::UnmuteResponse>, Status> {
        let r = req.into_inner();
        let changed = self.relations.set_mute(r.muter_id, r.muted_id, false).await?;
        Ok(Response::new(pb::UnmuteResponse { changed }))
    }

    async fn list_blocks(&self, req: Request<pb::ListBlocksRequest>) -> Result<Response<pb::ListBlocksResponse>, Status> {
        let r = req.into_inner();
        let page = self.relations.list_restrictions(Restriction::Block, r.user_id, r.page_size, &r.page_token).await?;
        Ok(Response::new(pb::ListBlocksResponse { accounts: restricted(page.entries), next_page_token: page.next_page_token }))
    }

    async fn list_mutes(&self, req: Request<pb::ListMutesRequest>) -> Result<Response<pb::ListMutesResponse>, Status> {
        let r = req.into_inner();
        let page = self.relations.list_restrictions(Restriction::Mute, r.user_id, r.page_size, &r.page_token).await?;
        Ok(Response::new(pb::ListMutesResponse { accounts: restricted(page.entries), next_page_token: page.next_page_token }))
    }

    async fn remove_follower(&self, req: Request<pb::RemoveFollowerRequest>) -> Result<Response<pb::RemoveFollowerResponse>, Status> {
        let r = req.into_inner();
        let out = self.relations.remove_follower(r.user_id, r.follower_id).await?;
        Ok(Response::new(pb::RemoveFollowerResponse {
            changed: out.changed,
            version: out.version,
            consistency_token: self.relations.consistency_token(out.changed, r.follower_id, r.user_id, out.version).await,
        }))
    }

    async fn set_account_locked(&self, req: Request<pb::SetAccountLockedRequest>) -> Result<Response<pb::SetAccountLockedResponse>, Status> {
        let r = req.into_inner();
        let (changed, approved) = self.relations.set_locked(r.user_id, r.locked).await?;
        Ok(Response::new(pb::SetAccountLockedResponse { changed, approved }))
    }

    async fn list_follow_requests(&self, req: Request<pb::ListFollowRequestsRequest>) -> Result<Response<pb::ListFollowRequestsResponse>, Status> {
        let r = req.into_inner();
        let direction = match pb::RequestDirection::try_from(r.direction) {
            Ok(pb::RequestDirection::Incoming) => Direction::Incoming,
            Ok(pb::RequestDirection::Outgoing) => Direction::Outgoing,
            _ => return Err(ApiError::invalid("direction", "must be INCOMING or OUTGOING").into()),
        };
        let page = self.relations.list_requests(r.user_id, direction, r.page_size, &r.page_token).await?;
        Ok(Response::new(pb::ListFollowRequestsResponse { accounts: restricted(page.entries), next_page_token: page.next_page_token }))
    }

    async fn approve_follow_requests(
        &self,
        req: Request<pb::ApproveFollowRequestsRequest>,
    ) -> Result<Response<pb::ApproveFollowRequestsResponse>, Status> {
        let r = req.into_inner();
        let approved = self.relations.answer_requests(r.user_id, &r.requester_ids, true).await?;
        Ok(Response::new(pb::ApproveFollowRequestsResponse { approved }))
    }

    async fn reject_follow_requests(
        &self,
        req: Request<pb::RejectFollowRequestsRequest>,
    ) -> Result<Response<pb::RejectFollowRequestsResponse>, Status> {
        let r = req.into_inner();
        let rejected = self.relations.answer_requests(r.user_id, &r.requester_ids, false).await?;
        Ok(Response::new(pb::RejectFollowRequestsResponse { rejected }))
    }

    async fn set_account_status(&self, req: Request<pb::SetAccountStatusRequest>) -> Result<Response<pb::SetAccountStatusResponse>, Status> {
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let status = match pb::AccountStatus::try_from(r.status) {
            Ok(pb::AccountStatus::Active) => AccountStatus::Active,
            Ok(pb::AccountStatus::Deactivated) => AccountStatus::Deactivated,
            Ok(pb::AccountStatus::Suspended) => AccountStatus::Suspended,
            _ => return Err(ApiError::invalid("status", "must be ACTIVE, DEACTIVATED or SUSPENDED (DeleteAccount deletes)").into()),
        };
        let (account, changed) = self.relations.set_account_status(r.user_id, status, caller).await?;
        Ok(Response::new(pb::SetAccountStatusResponse { account: Some(account_pb(&account)), changed }))
    }

    async fn delete_account(&self, req: Request<pb::DeleteAccountRequest>) -> Result<Response<pb::DeleteAccountResponse>, Status> {
        let (account, changed) = self.relations.delete_account(req.into_inner().user_id).await?;
        Ok(Response::new(pb::DeleteAccountResponse { account: Some(account_pb(&account)), changed }))
    }

    async fn get_account(&self, req: Request<pb::GetAccountRequest>) -> Result<Response<pb::GetAccountResponse>, Status> {
        let account = self.relations.account(req.into_inner().user_id).await?;
        Ok(Response::new(pb::GetAccountResponse { account: Some(account_pb(&account)) }))
    }

    type ScanEdgesStream = ReceiverStream<Result<pb::ScanEdgesResponse, Status>>;

    async fn scan_edges(&self, req: Request<pb::ScanEdgesRequest>) -> Result<Response<Self::ScanEdgesStream>, Status> {
        self.require_admin(&req)?;
        let r = req.into_inner();
        let page = match r.page_size {
            0 => 1000,
            n if (1..=MAX_SCAN_PAGE).contains(&n) => n as usize,
            n => return Err(ApiError::invalid("page_size", format!("must be 0..={MAX_SCAN_PAGE}, got {n}")).into()),
        };
        if r.limit < 0 {
            return Err(ApiError::invalid("limit", "must be >= 0").into());
        }
        for (field, id) in [("follower_id", r.follower_id), ("followee_id", r.followee_id)] {
            if id < 0 {
                return Err(ApiError::invalid(field, format!("must be 0 (no filter) or a user id > 0, got {id}")).into());
            }
        }
        let mut filter = ScanFilter {
            after: r.after.map(|c| (c.follower_id, c.followee_id)),
            follower_id: (r.follower_id > 0).then_some(r.follower_id),
            followee_id: (r.followee_id > 0).then_some(r.followee_id),
        };
        let mut remaining = if r.limit == 0 { u64::MAX } else { r.limit as u64 };
        let relations = Arc::clone(&self.relations);
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            while remaining > 0 {
                let take = page.min(remaining.min(usize::MAX as u64) as usize);
                let rows = match relations.scan(filter, take).await {
                    Ok(rows) => rows,
                    Err(e) => {
                        let _ = tx.send(Err(e.into())).await;
                        return;
                    }
                };
                let Some(last) = rows.last().copied() else { return };
                let done = rows.len() < take;
                remaining -= rows.len() as u64;
                filter.after = Some((last.follower_id, last.followee_id));
                let cursor = Some(pb::EdgeCursor { follower_id: last.follower_id, followee_id: last.followee_id });
                let msg = pb::ScanEdgesResponse { edges: rows.into_iter().map(pb::Edge::from).collect(), cursor };
                if tx.send(Ok(msg)).await.is_err() || done {
                    return;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}
