//! The follow counts projection-svc publishes: after every change of `edge_count` rows, in the
//! same transaction, one [`EdgeCountEvent`] per changed user goes to the outbox, carrying the
//! row as the change left it (absolute counts and the row's version). The relay publishes them
//! to `kafka.edge_count_topic`, keyed by user id, and counter-svc keeps the newest version of
//! each user (docs/src/architecture/counters.md#how-the-counters-move): it learns the counts from the
//! events alone, never by asking projection-svc.

use std::sync::Arc;

use sea_orm::{ConnectionTrait, DbErr};
use socialgraph_proto::events::v1::EdgeCountEvent;
use socialgraph_storage::counts;
use socialgraph_storage::outbox::{self, NewOutboxRow};
use tokio::sync::Notify;

/// Where the counts go: the outbox topic, and the relay to wake after a commit.
pub struct CountLog {
    /// `kafka.edge_count_topic`.
    pub topic: String,
    /// Wakes this process's relay once rows are committed.
    pub wake: Arc<Notify>,
}

impl CountLog {
    /// Writes the current `edge_count` rows of `users` to the outbox (inside the caller's
    /// transaction, after its count changes). Users without a counted row (version 0) are left
    /// out: nothing about them changed.
    ///
    /// # Errors
    /// Database errors.
    pub async fn write<C: ConnectionTrait>(&self, conn: &C, users: &[i64]) -> Result<(), DbErr> {
        if users.is_empty() {
            return Ok(());
        }
        let mut users = users.to_vec();
        users.sort_unstable();
        users.dedup();
        let now = crate::now_ms();
        let headers = socialgraph_events::headers::encode(&socialgraph_events::headers::event_headers("socialgraph.events.v1.EdgeCountEvent"));
        let rows: Vec<NewOutboxRow> = counts::get_many(conn, &users)
            .await?
            .into_iter()
            .filter(|c| c.version > 0)
            .map(|c| NewOutboxRow {
                topic: self.topic.clone(),
                partition_key: c.user_id,
                payload: prost::Message::encode_to_vec(&event(c, now)),
                headers: headers.clone(),
                created_at_ms: now,
            })
            .collect();
        outbox::insert(conn, &rows).await
    }
}

/// The event of one row.
pub fn event(c: counts::EdgeCount, now_ms: i64) -> EdgeCountEvent {
    EdgeCountEvent {
        event_id: uuid::Uuid::now_v7().to_string(),
        user_id: c.user_id,
        followings: c.followings,
        followers: c.followers,
        version: c.version,
        occurred_at: Some(socialgraph_domain::timestamp_from_ms(now_ms)),
    }
}
