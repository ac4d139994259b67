//! What other services keep of relation-svc's accounts, as events on topic
//! `kafka.account_topic` (AccountEvent, key = user id): every status change of an account,
//! every change of whether a pair of users blocks each other, and of whether a user mutes
//! another (projection-svc's copy filters timelines by it). Each is written to the outbox in
//! the transaction of the change, so a consumer's copy (message-svc's block copy and its
//! handling of deleted accounts) follows the source exactly, by version.

use socialgraph_proto::events::v1::{AccountEvent, AccountEventKind, AccountLifecycle};
use socialgraph_storage::accounts::{Account, AccountStatus};
use socialgraph_storage::outbox::NewOutboxRow;
use socialgraph_storage::{block_pairs, mute_versions};

use crate::service::Relations;

impl Relations {
    fn account_topic_row(&self, event: AccountEvent, at_ms: i64) -> NewOutboxRow {
        NewOutboxRow {
            topic: self.config.kafka.account_topic.clone(),
            partition_key: event.user_id,
            payload: prost::Message::encode_to_vec(&event),
            headers: socialgraph_events::headers::encode(&socialgraph_events::headers::event_headers("socialgraph.events.v1.AccountEvent")),
            created_at_ms: at_ms,
        }
    }

    /// The outbox row of `account`'s status change; its version is the change's time.
    pub(crate) fn account_event_row(&self, account: &Account) -> NewOutboxRow {
        let status = match account.status {
            AccountStatus::Active => AccountLifecycle::Active,
            AccountStatus::Deactivated => AccountLifecycle::Deactivated,
            AccountStatus::Suspended => AccountLifecycle::Suspended,
            AccountStatus::Deleting => AccountLifecycle::Deleting,
        };
        let event = AccountEvent {
            event_id: uuid::Uuid::now_v7().to_string(),
            kind: AccountEventKind::Status as i32,
            user_id: account.user_id,
            status: status as i32,
            version: account.changed_at_ms,
            occurred_at: Some(socialgraph_domain::timestamp_from_ms(account.changed_at_ms)),
            ..AccountEvent::default()
        };
        self.account_topic_row(event, account.changed_at_ms)
    }

    /// Records in `block_pair` whether the pair of `a` and `b` is blocked (the caller holds the
    /// pair's lock) and, when that changed, writes its event: the outbox row to insert with it.
    pub(crate) async fn block_changed<C: sea_orm::ConnectionTrait>(
        &self,
        conn: &C,
        (a, b): (i64, i64),
        blocked: bool,
        now_ms: i64,
    ) -> Result<Option<NewOutboxRow>, sea_orm::DbErr> {
        let Some(version) = block_pairs::set(conn, a, b, blocked, now_ms).await? else { return Ok(None) };
        let (low, high) = block_pairs::pair(a, b);
        let event = AccountEvent {
            event_id: uuid::Uuid::now_v7().to_string(),
            kind: AccountEventKind::Block as i32,
            user_id: low,
            other_user_id: high,
            blocked,
            version,
            occurred_at: Some(socialgraph_domain::timestamp_from_ms(now_ms)),
            ..AccountEvent::default()
        };
        Ok(Some(self.account_topic_row(event, now_ms)))
    }

    /// Records in `mute_version` whether `muter` mutes `muted`, after a change of their `mute`
    /// row, and writes its event: the outbox row to insert with it.
    pub(crate) async fn mute_changed<C: sea_orm::ConnectionTrait>(
        &self,
        conn: &C,
        (muter, muted): (i64, i64),
        on: bool,
        now_ms: i64,
    ) -> Result<NewOutboxRow, sea_orm::DbErr> {
        let version = mute_versions::set(conn, muter, muted, on, now_ms).await?;
        let event = AccountEvent {
            event_id: uuid::Uuid::now_v7().to_string(),
            kind: AccountEventKind::Mute as i32,
            user_id: muter,
            other_user_id: muted,
            muted: on,
            version,
            occurred_at: Some(socialgraph_domain::timestamp_from_ms(now_ms)),
            ..AccountEvent::default()
        };
        Ok(self.account_topic_row(event, now_ms))
    }
}
