//! The RelationEvents of edge changes: each carries the edge after the change and the
//! follower's followings with their version, as `following_count` holds them in the change's
//! transaction, so a consumer keeps followings from these events alone
//! (docs/src/architecture/counters.md#where-follow-counts-come-from).

use prost::Message;
use sea_orm::{ConnectionTrait, DbErr};
use socialgraph_domain::Edge;
use socialgraph_events::headers;
use socialgraph_proto::events::v1::{RelationEvent, RelationEventKind};
use socialgraph_storage::following_counts::{self, FollowingCount};
use socialgraph_storage::outbox::NewOutboxRow;

use crate::service::Relations;

impl Relations {
    /// The outbox row of one edge change whose follower has `count` after it.
    pub(crate) fn event_row(&self, edge: &Edge, kind: RelationEventKind, now: i64, count: FollowingCount) -> NewOutboxRow {
        let event = RelationEvent {
            event_id: uuid::Uuid::now_v7().to_string(),
            kind: kind as i32,
            follower_id: edge.follower_id,
            followee_id: edge.followee_id,
            version: edge.version,
            occurred_at: Some(socialgraph_domain::timestamp_from_ms(now)),
            followed_at: Some(socialgraph_domain::timestamp_from_ms(edge.followed_at_ms)),
            follower_followings: count.followings,
            follower_followings_version: count.version,
        };
        NewOutboxRow {
            topic: self.config.kafka.relation_topic.clone(),
            partition_key: edge.follower_id,
            payload: event.encode_to_vec(),
            headers: headers::encode(&headers::event_headers("socialgraph.events.v1.RelationEvent")),
            created_at_ms: now,
        }
    }

    /// The consistency token of an edge change (empty when nothing changed), with the version of
    /// the follower's followings read after it (the change's or a later one), so that a counter
    /// read holding the token waits for its followings too. A failed read leaves that version
    /// out (the change is made; its token only promises less).
    pub async fn consistency_token(&self, changed: bool, follower_id: i64, followee_id: i64, version: i64) -> String {
        if !changed {
            return String::new();
        }
        let followings_version = match following_counts::get(&self.db, follower_id).await {
            Ok(c) => c.map_or(0, |c| c.version),
            Err(e) => {
                tracing::warn!(error = %e, follower_id, "following_count unreadable: the consistency token carries no followings version");
                0
            }
        };
        socialgraph_domain::ConsistencyToken { follower_id, followee_id, version, followings_version }.encode()
    }

    /// The outbox rows of `changes` (edges as written, in `conn`'s transaction, after every
    /// write of it): recounts the followers' followings first ([`following_counts::recount`]),
    /// so the events of one follower all carry its count after the whole change.
    pub(crate) async fn edge_events<C: ConnectionTrait>(
        &self,
        conn: &C,
        changes: &[(Edge, RelationEventKind)],
        now: i64,
    ) -> Result<Vec<NewOutboxRow>, DbErr> {
        if changes.is_empty() {
            return Ok(Vec::new());
        }
        let followers: Vec<i64> = changes.iter().map(|(e, _)| e.follower_id).collect();
        let counts = following_counts::recount(conn, &followers).await?;
        Ok(changes.iter().map(|(e, kind)| self.event_row(e, *kind, now, counts.get(&e.follower_id).copied().unwrap_or_default())).collect())
    }
}
