//! CounterService over gRPC: convert the request, call the service, map the result.

use std::sync::Arc;

use secrecy::SecretString;
use socialgraph_cache::counters::{Sds, field};
use socialgraph_proto::counter::v1 as pb;
use socialgraph_proto::counter::v1::counter_service_server::CounterService;
use tonic::{Request, Response, Status};

use crate::entities::Entities;
use crate::service::Counters;

/// The tonic implementation of `socialgraph.counter.v1.CounterService`.
pub struct CounterGrpc {
    counters: Arc<Counters>,
    entities: Arc<Entities>,
    admin_token: Option<SecretString>,
}

impl CounterGrpc {
    /// Serves user and entity counters; rebuild RPCs need `Bearer <admin_token>`.
    pub fn new(counters: Arc<Counters>, entities: Arc<Entities>, admin_token: Option<SecretString>) -> Self {
        Self { counters, entities, admin_token }
    }

    fn admin<T>(&self, req: &Request<T>) -> Result<(), Status> {
        Ok(socialgraph_server::auth::require_admin(self.admin_token.as_ref(), req.metadata())?)
    }
}

fn user_counters(user_id: i64, s: Sds) -> pb::UserCounters {
    pb::UserCounters {
        user_id,
        followings: u64::from(s.0[field::FOLLOWINGS]),
        followers: u64::from(s.0[field::FOLLOWERS]),
        posts: u64::from(s.0[field::POSTS]),
        likes_received: u64::from(s.0[field::LIKES_RECEIVED]),
        favs_received: u64::from(s.0[field::FAVS_RECEIVED]),
    }
}

#[tonic::async_trait]
impl CounterService for CounterGrpc {
    async fn get_user_counters(&self, req: Request<pb::GetUserCountersRequest>) -> Result<Response<pb::GetUserCountersResponse>, Status> {
        let id = Counters::user("user_id", req.into_inner().user_id)?;
        let s = self.counters.get(&[id], "user_id").await?;
        Ok(Response::new(pb::GetUserCountersResponse { counters: s.first().map(|s| user_counters(id, *s)) }))
    }

    async fn batch_get_user_counters(
        &self,
        req: Request<pb::BatchGetUserCountersRequest>,
    ) -> Result<Response<pb::BatchGetUserCountersResponse>, Status> {
        let ids = req.into_inner().user_ids;
        let s = self.counters.get(&ids, "user_ids").await?;
        let counters = ids.iter().zip(s).map(|(u, s)| user_counters(*u, s)).collect();
        Ok(Response::new(pb::BatchGetUserCountersResponse { counters }))
    }

    async fn like(&self, req: Request<pb::LikeRequest>) -> Result<Response<pb::LikeResponse>, Status> {
        let r = req.into_inner();
        let (changed, active) = self.entities.toggle(r.actor_id, r.entity.as_ref(), r.owner_id, crate::entities::LIKE, true).await?;
        Ok(Response::new(pb::LikeResponse { changed, active }))
    }

    async fn unlike(&self, req: Request<pb::UnlikeRequest>) -> Result<Response<pb::UnlikeResponse>, Status> {
        let r = req.into_inner();
        let (changed, active) = self.entities.toggle(r.actor_id, r.entity.as_ref(), r.owner_id, crate::entities::LIKE, false).await?;
        Ok(Response::new(pb::UnlikeResponse { changed, active }))
    }

    async fn fav(&self, req: Request<pb::FavRequest>) -> Result<Response<pb::FavResponse>, Status> {
        let r = req.into_inner();
        let (changed, active) = self.entities.toggle(r.actor_id, r.entity.as_ref(), r.owner_id, crate::entities::FAV, true).await?;
        Ok(Response::new(pb::FavResponse { changed, active }))
    }

    async fn unfav(&self, req: Request<pb::UnfavRequest>) -> Result<Response<pb::UnfavResponse>, Status> {
        let r = req.into_inner();
        let (changed, active) = self.entities.toggle(r.actor_id, r.entity.as_ref(), r.owner_id, crate::entities::FAV, false).await?;
        Ok(Response::new(pb::UnfavResponse { changed, active }))
    }

    async fn get_entity_counts(&self, req: Request<pb::GetEntityCountsRequest>) -> Result<Response<pb::GetEntityCountsResponse>, Status> {
        let r = req.into_inner();
        let entity = r.entity.unwrap_or_default();
        let mut counts = self.entities.counts(std::slice::from_ref(&entity), &r.metrics, "entity").await?;
        Ok(Response::new(pb::GetEntityCountsResponse { counts: counts.pop() }))
    }

    async fn batch_get_entity_counts(
        &self,
        req: Request<pb::BatchGetEntityCountsRequest>,
    ) -> Result<Response<pb::BatchGetEntityCountsResponse>, Status> {
        let r = req.into_inner();
        let counts = self.entities.counts(&r.entities, &r.metrics, "entities").await?;
        Ok(Response::new(pb::BatchGetEntityCountsResponse { counts }))
    }

    async fn get_action_states(&self, req: Request<pb::GetActionStatesRequest>) -> Result<Response<pb::GetActionStatesResponse>, Status> {
        let r = req.into_inner();
        let states = self.entities.states(r.actor_id, &r.entity_type, &r.entity_ids).await?;
        Ok(Response::new(pb::GetActionStatesResponse { states }))
    }

    async fn rebuild_user_counters(
        &self,
        req: Request<pb::RebuildUserCountersRequest>,
    ) -> Result<Response<pb::RebuildUserCountersResponse>, Status> {
        self.admin(&req)?;
        let id = Counters::user("user_id", req.into_inner().user_id)?;
        let s = self.counters.rebuild(id).await?;
        Ok(Response::new(pb::RebuildUserCountersResponse { counters: Some(user_counters(id, s)) }))
    }

    async fn rebuild_entity_counts(
        &self,
        req: Request<pb::RebuildEntityCountsRequest>,
    ) -> Result<Response<pb::RebuildEntityCountsResponse>, Status> {
        self.admin(&req)?;
        let entity = req.into_inner().entity.unwrap_or_default();
        let counts = self.entities.rebuild(&entity).await?;
        Ok(Response::new(pb::RebuildEntityCountsResponse { counts: Some(counts) }))
    }
}
