//! ProjectionService over gRPC: convert the request, call [`Projection`], map the result.

use std::sync::Arc;

use secrecy::SecretString;
use socialgraph_domain::{timestamp_from_ms, validate_user_id};
use socialgraph_proto::projection::v1 as pb;
use socialgraph_proto::projection::v1::projection_service_server::ProjectionService;
use socialgraph_server::ApiError;
use tonic::{Request, Response, Status};

use crate::service::{Projection, RebuildCounts};

/// The tonic implementation of `socialgraph.projection.v1.ProjectionService`.
pub struct ProjectionGrpc {
    projection: Arc<Projection>,
    admin_token: Option<SecretString>,
}

impl ProjectionGrpc {
    /// Serves `projection`; Rebuild needs `Bearer <admin_token>` and is refused when unset.
    pub fn new(projection: Arc<Projection>, admin_token: Option<SecretString>) -> Self {
        Self { projection, admin_token }
    }
}

fn rebuild_response(c: RebuildCounts) -> pb::RebuildResponse {
    pb::RebuildResponse { edges_scanned: c.edges_scanned, rows_written: c.rows_written, rows_deleted: c.rows_deleted }
}

#[tonic::async_trait]
impl ProjectionService for ProjectionGrpc {
    async fn list_followers(&self, req: Request<pb::ListFollowersRequest>) -> Result<Response<pb::ListFollowersResponse>, Status> {
        let r = req.into_inner();
        self.projection.await_token("consistency_token", &r.consistency_token).await?;
        let page = self.projection.list_followers(r.user_id, r.page_size, &r.page_token, r.consistency_token.is_empty()).await?;
        let followers = page
            .entries
            .into_iter()
            .map(|e| pb::FollowerEntry { user_id: e.user_id, followed_at: Some(timestamp_from_ms(e.followed_at_ms)) })
            .collect();
        Ok(Response::new(pb::ListFollowersResponse { followers, next_page_token: page.next_page_token }))
    }

    async fn batch_check_followers(&self, req: Request<pb::BatchCheckFollowersRequest>) -> Result<Response<pb::BatchCheckFollowersResponse>, Status> {
        let r = req.into_inner();
        self.projection.await_token("consistency_token", &r.consistency_token).await?;
        let found = self.projection.check_followers(r.user_id, &r.candidate_ids, r.consistency_token.is_empty()).await?;
        let results = r
            .candidate_ids
            .iter()
            .zip(found)
            .map(|(&c, at)| pb::FollowerCheck { candidate_id: c, follows: at.is_some(), followed_at: at.map(timestamp_from_ms) })
            .collect();
        Ok(Response::new(pb::BatchCheckFollowersResponse { results }))
    }

    async fn count_followers(&self, req: Request<pb::CountFollowersRequest>) -> Result<Response<pb::CountFollowersResponse>, Status> {
        let r = req.into_inner();
        self.projection.await_token("consistency_token", &r.consistency_token).await?;
        let count = self.projection.count_followers(r.user_id).await?;
        Ok(Response::new(pb::CountFollowersResponse { count }))
    }

    async fn get_edge_counts(&self, req: Request<pb::GetEdgeCountsRequest>) -> Result<Response<pb::GetEdgeCountsResponse>, Status> {
        let r = req.into_inner();
        self.projection.await_token("consistency_token", &r.consistency_token).await?;
        let c = self.projection.edge_counts(r.user_id).await?;
        let offsets = c
            .offsets
            .iter()
            .map(|o| pb::PartitionOffset { topic: self.projection.topic.clone(), partition: o.partition, next_offset: o.next_offset })
            .collect();
        Ok(Response::new(pb::GetEdgeCountsResponse { followings: c.followings, followers: c.followers, offsets, version: c.version }))
    }

    async fn batch_get_edge_counts(&self, req: Request<pb::BatchGetEdgeCountsRequest>) -> Result<Response<pb::BatchGetEdgeCountsResponse>, Status> {
        let r = req.into_inner();
        let ids = r.user_ids;
        socialgraph_domain::validate_batch("user_ids", &ids).map_err(ApiError::from)?;
        self.projection.await_token("consistency_token", &r.consistency_token).await?;
        let batch = self.projection.batch_edge_counts(&ids).await?;
        let counts = batch
            .counts
            .into_iter()
            .map(|c| pb::UserEdgeCounts { user_id: c.user_id, followings: c.followings, followers: c.followers, version: c.version })
            .collect();
        let offsets = batch
            .offsets
            .iter()
            .map(|o| pb::PartitionOffset { topic: self.projection.topic.clone(), partition: o.partition, next_offset: o.next_offset })
            .collect();
        Ok(Response::new(pb::BatchGetEdgeCountsResponse { counts, offsets }))
    }

    async fn get_projection_status(
        &self,
        _req: Request<pb::GetProjectionStatusRequest>,
    ) -> Result<Response<pb::GetProjectionStatusResponse>, Status> {
        let progress = self.projection.progress.read().await;
        let partitions = progress
            .iter()
            .map(|((topic, partition), p)| pb::PartitionStatus {
                topic: topic.clone(),
                partition: *partition,
                next_offset: p.next_offset,
                high_watermark: p.high_watermark,
                lag: p.lag(),
                last_event_time: p.last_event_ms.map(timestamp_from_ms),
            })
            .collect();
        Ok(Response::new(pb::GetProjectionStatusResponse { partitions }))
    }

    async fn rebuild(&self, req: Request<pb::RebuildRequest>) -> Result<Response<pb::RebuildResponse>, Status> {
        socialgraph_server::auth::require_admin(self.admin_token.as_ref(), req.metadata())?;
        let counts = match req.into_inner().target {
            Some(pb::rebuild_request::Target::UserId(id)) => {
                validate_user_id("user_id", id).map_err(ApiError::from)?;
                self.projection.rebuild_user(id).await?
            }
            Some(pb::rebuild_request::Target::All(true)) => self.projection.rebuild_all().await?,
            _ => return Err(ApiError::invalid("target", "set user_id (> 0) or all = true").into()),
        };
        Ok(Response::new(rebuild_response(counts)))
    }
}
