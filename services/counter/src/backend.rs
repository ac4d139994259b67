//! What CounterService needs from a counter store. counter-svc keeps counters in Redis
//! ([`RedisCounters`]); the embedded mode keeps them in SQL tables. Requests reach a backend
//! validated by the gRPC layer ([`crate::grpc`]), so both answer bad input identically.

use std::sync::Arc;

use socialgraph_cache::counters::Sds;
use socialgraph_domain::ConsistencyToken;
use socialgraph_proto::counter::v1 as pb;
use socialgraph_proto::events::v1::Metric;
use socialgraph_proto::message::v1::message_service_client::MessageServiceClient;
use socialgraph_server::{ApiError, ApiResult};
use tonic::transport::Channel;

use crate::entities::{Entities, Toggled};
use crate::users::Counters;

/// A counter store behind CounterService. Every input is already validated (ids > 0, batch
/// sizes, entity types, metrics).
#[tonic::async_trait]
pub trait CounterBackend: Send + Sync + 'static {
    /// The five counters of each user, in request order.
    async fn user_counters(&self, user_ids: &[i64]) -> ApiResult<Vec<Sds>>;
    /// As [`Self::user_counters`], with follow counts that reflect the edge change of `token`
    /// (read-your-writes for a BFF passing a RelationService write's token along).
    async fn user_counters_after(&self, user_ids: &[i64], token: ConsistencyToken) -> ApiResult<Vec<Sds>>;
    /// Recomputes one user's counters from the facts and returns them.
    async fn rebuild_user_counters(&self, user_id: i64) -> ApiResult<Sds>;
    /// Sets (`wanted`) or clears `actor_id`'s `metric` on `entity`.
    /// Repeats are no-ops (changed = false); a change emits one ActionEvent.
    async fn toggle(&self, actor_id: i64, entity: &pb::EntityRef, owner_id: i64, metric: Metric, wanted: bool) -> ApiResult<Toggled>;
    /// The `wanted` metrics of each entity, in request order.
    async fn entity_counts(&self, entities: &[pb::EntityRef], wanted: &[Metric]) -> ApiResult<Vec<pb::EntityCounts>>;
    /// Whether `actor_id` liked / favourited each entity, in request order.
    async fn action_states(&self, actor_id: i64, entity_type: &str, ids: &[i64]) -> ApiResult<Vec<pb::ActionState>>;
    /// Recomputes one entity's like and fav counts from its facts.
    async fn rebuild_entity_counts(&self, entity: &pb::EntityRef) -> ApiResult<pb::EntityCounts>;
    /// A user's unread message counts: the total and (conversation, count) for each
    /// conversation with unread messages, by conversation id.
    async fn unread_counts(&self, user_id: i64) -> ApiResult<(i64, Vec<(i64, i64)>)>;
    /// Recomputes a user's unread counts from message-svc's tables and returns them.
    async fn rebuild_unread_counts(&self, user_id: i64) -> ApiResult<(i64, Vec<(i64, i64)>)>;
}

/// counter-svc's backend: SDS strings, bitmaps and Lua scripts in Redis.
pub struct RedisCounters {
    /// User counters.
    pub counters: Arc<Counters>,
    /// Entity counters and their bitmap facts.
    pub entities: Arc<Entities>,
    /// message-svc, whose tables the unread counts are rebuilt from (`None`: unread counters off).
    pub message: Option<MessageServiceClient<Channel>>,
}

#[tonic::async_trait]
impl CounterBackend for RedisCounters {
    async fn user_counters(&self, user_ids: &[i64]) -> ApiResult<Vec<Sds>> {
        self.counters.get(user_ids).await
    }

    async fn user_counters_after(&self, user_ids: &[i64], token: ConsistencyToken) -> ApiResult<Vec<Sds>> {
        self.counters.sync_after(user_ids, token).await?;
        self.counters.get(user_ids).await
    }

    async fn rebuild_user_counters(&self, user_id: i64) -> ApiResult<Sds> {
        self.counters.rebuild(user_id).await
    }

    async fn toggle(&self, actor_id: i64, entity: &pb::EntityRef, owner_id: i64, metric: Metric, wanted: bool) -> ApiResult<Toggled> {
        self.entities.toggle(actor_id, entity, owner_id, metric, wanted).await
    }

    async fn entity_counts(&self, entities: &[pb::EntityRef], wanted: &[Metric]) -> ApiResult<Vec<pb::EntityCounts>> {
        self.entities.counts(entities, wanted).await
    }

    async fn action_states(&self, actor_id: i64, entity_type: &str, ids: &[i64]) -> ApiResult<Vec<pb::ActionState>> {
        self.entities.states(actor_id, entity_type, ids).await
    }

    async fn rebuild_entity_counts(&self, entity: &pb::EntityRef) -> ApiResult<pb::EntityCounts> {
        self.entities.rebuild(entity).await
    }

    async fn unread_counts(&self, user_id: i64) -> ApiResult<(i64, Vec<(i64, i64)>)> {
        let u = crate::unread::read(&self.counters.store, self.message.as_ref(), user_id).await?;
        Ok((u.total, u.conversations))
    }

    async fn rebuild_unread_counts(&self, user_id: i64) -> ApiResult<(i64, Vec<(i64, i64)>)> {
        let Some(message) = &self.message else {
            return Err(ApiError::FailedPrecondition {
                reason: "UNREAD_COUNTERS_OFF",
                message: "counter-svc keeps no unread counts: message.url is unset".into(),
                metadata: Default::default(),
            });
        };
        let u = crate::unread::rebuild(&self.counters.store, message, user_id).await?;
        Ok((u.total, u.conversations))
    }
}
