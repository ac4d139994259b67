//! CounterService over gRPC: validate the request, call the backend, map the result. The
//! same layer serves counter-svc (Redis) and the embedded mode (SQL tables).

use std::sync::Arc;

use secrecy::SecretString;
use socialgraph_cache::counters::{Sds, field};
use socialgraph_domain::{validate_batch, validate_user_id};
use socialgraph_proto::counter::v1 as pb;
use socialgraph_proto::counter::v1::counter_service_server::CounterService;
use socialgraph_proto::events::v1::Metric;
use tonic::{Request, Response, Status};

use crate::backend::CounterBackend;
use crate::entities::{FAV, LIKE, Toggled, validate_counts, validate_entity_ref, validate_states, validate_toggle};

/// The tonic implementation of `socialgraph.counter.v1.CounterService` over backend `B`.
pub struct CounterGrpc<B> {
    backend: Arc<B>,
    admin_token: Option<SecretString>,
}

impl<B: CounterBackend> CounterGrpc<B> {
    /// Serves user and entity counters from `backend`; rebuild RPCs need
    /// `Bearer <admin_token>`.
    pub fn new(backend: Arc<B>, admin_token: Option<SecretString>) -> Self {
        Self { backend, admin_token }
    }

    fn admin<T>(&self, req: &Request<T>) -> Result<(), Status> {
        Ok(socialgraph_server::auth::require_admin(self.admin_token.as_ref(), req.metadata())?)
    }

    /// Counters of `ids`, after the change of `token` when one is given.
    async fn counters(&self, ids: &[i64], token: &str) -> Result<Vec<Sds>, Status> {
        let token = socialgraph_domain::ConsistencyToken::decode("consistency_token", token).map_err(socialgraph_server::ApiError::from)?;
        Ok(match token {
            Some(t) => self.backend.user_counters_after(ids, t).await?,
            None => self.backend.user_counters(ids).await?,
        })
    }

    async fn toggle(&self, actor_id: i64, entity: Option<&pb::EntityRef>, owner_id: i64, metric: Metric, wanted: bool) -> Result<Toggled, Status> {
        let entity = validate_toggle(actor_id, entity, owner_id)?;
        socialgraph_telemetry::annotate(&[
            ("socialgraph.actor_id", actor_id),
            ("socialgraph.owner_id", owner_id),
            ("socialgraph.entity_id", entity.entity_id),
        ]);
        Ok(self.backend.toggle(actor_id, entity, owner_id, metric, wanted).await?)
    }
}

/// The proto message of one user's counters.
pub fn user_counters(user_id: i64, s: Sds) -> pb::UserCounters {
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
impl<B: CounterBackend> CounterService for CounterGrpc<B> {
    async fn get_user_counters(&self, req: Request<pb::GetUserCountersRequest>) -> Result<Response<pb::GetUserCountersResponse>, Status> {
        let r = req.into_inner();
        let id = r.user_id;
        validate_user_id("user_id", id).map_err(socialgraph_server::ApiError::from)?;
        let s = self.counters(&[id], &r.consistency_token).await?;
        Ok(Response::new(pb::GetUserCountersResponse { counters: s.first().map(|s| user_counters(id, *s)) }))
    }

    async fn batch_get_user_counters(
        &self,
        req: Request<pb::BatchGetUserCountersRequest>,
    ) -> Result<Response<pb::BatchGetUserCountersResponse>, Status> {
        let r = req.into_inner();
        let ids = r.user_ids;
        validate_batch("user_ids", &ids).map_err(socialgraph_server::ApiError::from)?;
        let s = self.counters(&ids, &r.consistency_token).await?;
        let counters = ids.iter().zip(s).map(|(u, s)| user_counters(*u, s)).collect();
        Ok(Response::new(pb::BatchGetUserCountersResponse { counters }))
    }

    async fn like(&self, req: Request<pb::LikeRequest>) -> Result<Response<pb::LikeResponse>, Status> {
        let r = req.into_inner();
        let Toggled { changed, active } = self.toggle(r.actor_id, r.entity.as_ref(), r.owner_id, LIKE, true).await?;
        Ok(Response::new(pb::LikeResponse { changed, active }))
    }

    async fn unlike(&self, req: Request<pb::UnlikeRequest>) -> Result<Response<pb::UnlikeResponse>, Status> {
        let r = req.into_inner();
        let Toggled { changed, active } = self.toggle(r.actor_id, r.entity.as_ref(), r.owner_id, LIKE, false).await?;
        Ok(Response::new(pb::UnlikeResponse { changed, active }))
    }

    async fn fav(&self, req: Request<pb::FavRequest>) -> Result<Response<pb::FavResponse>, Status> {
        let r = req.into_inner();
        let Toggled { changed, active } = self.toggle(r.actor_id, r.entity.as_ref(), r.owner_id, FAV, true).await?;
        Ok(Response::new(pb::FavResponse { changed, active }))
    }

    async fn unfav(&self, req: Request<pb::UnfavRequest>) -> Result<Response<pb::UnfavResponse>, Status> {
        let r = req.into_inner();
        let Toggled { changed, active } = self.toggle(r.actor_id, r.entity.as_ref(), r.owner_id, FAV, false).await?;
        Ok(Response::new(pb::UnfavResponse { changed, active }))
    }

    async fn get_entity_counts(&self, req: Request<pb::GetEntityCountsRequest>) -> Result<Response<pb::GetEntityCountsResponse>, Status> {
        let r = req.into_inner();
        let entity = r.entity.unwrap_or_default();
        let entities = std::slice::from_ref(&entity);
        let wanted = validate_counts(entities, &r.metrics, "entity")?;
        let mut counts = self.backend.entity_counts(entities, &wanted).await?;
        Ok(Response::new(pb::GetEntityCountsResponse { counts: counts.pop() }))
    }

    async fn batch_get_entity_counts(
        &self,
        req: Request<pb::BatchGetEntityCountsRequest>,
    ) -> Result<Response<pb::BatchGetEntityCountsResponse>, Status> {
        let r = req.into_inner();
        let wanted = validate_counts(&r.entities, &r.metrics, "entities")?;
        let counts = self.backend.entity_counts(&r.entities, &wanted).await?;
        Ok(Response::new(pb::BatchGetEntityCountsResponse { counts }))
    }

    async fn get_action_states(&self, req: Request<pb::GetActionStatesRequest>) -> Result<Response<pb::GetActionStatesResponse>, Status> {
        let r = req.into_inner();
        validate_states(r.actor_id, &r.entity_type, &r.entity_ids)?;
        let states = self.backend.action_states(r.actor_id, &r.entity_type, &r.entity_ids).await?;
        Ok(Response::new(pb::GetActionStatesResponse { states }))
    }

    async fn rebuild_user_counters(&self, req: Request<pb::RebuildUserCountersRequest>) -> Result<Response<pb::RebuildUserCountersResponse>, Status> {
        self.admin(&req)?;
        let id = req.into_inner().user_id;
        validate_user_id("user_id", id).map_err(socialgraph_server::ApiError::from)?;
        let s = self.backend.rebuild_user_counters(id).await?;
        Ok(Response::new(pb::RebuildUserCountersResponse { counters: Some(user_counters(id, s)) }))
    }

    async fn rebuild_entity_counts(&self, req: Request<pb::RebuildEntityCountsRequest>) -> Result<Response<pb::RebuildEntityCountsResponse>, Status> {
        self.admin(&req)?;
        let entity = req.into_inner().entity.unwrap_or_default();
        validate_entity_ref("entity", &entity)?;
        let counts = self.backend.rebuild_entity_counts(&entity).await?;
        Ok(Response::new(pb::RebuildEntityCountsResponse { counts: Some(counts) }))
    }

    async fn rebuild_unread_counts(&self, req: Request<pb::RebuildUnreadCountsRequest>) -> Result<Response<pb::RebuildUnreadCountsResponse>, Status> {
        self.admin(&req)?;
        let id = req.into_inner().user_id;
        validate_user_id("user_id", id).map_err(socialgraph_server::ApiError::from)?;
        let (total_unread, per) = self.backend.rebuild_unread_counts(id).await?;
        let conversations = per.into_iter().map(|(conversation_id, unread_count)| pb::ConversationUnread { conversation_id, unread_count }).collect();
        Ok(Response::new(pb::RebuildUnreadCountsResponse { conversations, total_unread }))
    }

    async fn get_unread_counts(&self, req: Request<pb::GetUnreadCountsRequest>) -> Result<Response<pb::GetUnreadCountsResponse>, Status> {
        let id = req.into_inner().user_id;
        validate_user_id("user_id", id).map_err(socialgraph_server::ApiError::from)?;
        let (total_unread, per) = self.backend.unread_counts(id).await?;
        let conversations = per.into_iter().map(|(conversation_id, unread_count)| pb::ConversationUnread { conversation_id, unread_count }).collect();
        Ok(Response::new(pb::GetUnreadCountsResponse { conversations, total_unread }))
    }
}
