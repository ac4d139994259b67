//! Accounts deleted in relation-svc, from topic `kafka.account_topic` (its AccountEvents): when
//! an account is being deleted, each conversation it is in ends for it. A group loses the
//! member, as a removal does; a private conversation ends for both members, so neither counts
//! anything unread there and it stays listed, inactive. Each conversation ends in its own
//! transaction, under its lock, with a MEMBERS_REMOVED event carrying the ended memberships'
//! states (counter-svc's unread counts follow from it). A later private message between the
//! peer and the id, a fresh account by then, opens the conversation again from the present.
//!
//! The same events carry every change of whether a pair of users blocks each other (kind
//! BLOCK): message-svc copies them into `message_block_copy`, newest version per pair, in the
//! transaction that stores the offset, and decides private sends from that copy
//! ([`crate::blocks`]).
//!
//! Effectively once: per account the newest version applied is kept (`message_account_seen`),
//! written with the consumer's offset once the account's conversations have ended; an event not
//! above it changes nothing. A crash in the middle leaves the rest to the replay, which finds
//! the conversations already ended inactive and ends the others.

use std::sync::Arc;

use prost::Message as _;
use rskafka::record::RecordAndOffset;
use socialgraph_domain::now_ms;
use socialgraph_events::consumer::{BatchHandler, BoxError};
use socialgraph_proto::events::v1::{AccountEvent, AccountEventKind, AccountLifecycle, MessageEventKind};
use socialgraph_storage::block_pairs;
use socialgraph_storage::messages::{self as store, MemberRow, accounts as seen};
use socialgraph_storage::offsets::{self, StoredOffset};
use socialgraph_storage::retry_tx;

use crate::service::{Messages, TxError, in_tx};

/// Conversations read per round while ending an account's.
const ROUND: usize = 100;

/// AccountEvents applied to message-svc's tables.
pub struct AccountEnder {
    /// The service (its database, relay wake-up and event writer).
    pub messages: Arc<Messages>,
    /// Name of this consumer's offsets in `consumer_offset`.
    pub consumer: String,
}

impl Messages {
    /// Ends `user_id`'s membership of `conversation_id`, and in a private conversation the
    /// peer's too; false when neither was active.
    async fn end_in(&self, tx: &sea_orm::DatabaseTransaction, user_id: i64, conversation_id: i64) -> Result<bool, TxError> {
        let now = now_ms();
        let Some(c) = store::lock_conversation(tx, conversation_id, now).await? else { return Ok(false) };
        let users = c.direct.map_or_else(|| vec![user_id], |(low, high)| vec![low, high]);
        let mut ended: Vec<MemberRow> = Vec::new();
        for u in users {
            ended.extend(store::leave(tx, conversation_id, u, now).await?);
        }
        if ended.is_empty() {
            return Ok(false);
        }
        store::add_member_count(tx, conversation_id, -(ended.len() as i32)).await?;
        let ids = ended.iter().map(|m| m.user_id).collect();
        self.publish(tx, &self.event(MessageEventKind::MembersRemoved, conversation_id, user_id, ids, &ended, now), now).await?;
        Ok(true)
    }

    /// Ends every conversation of `user_id` for it (see the module); returns how many changed.
    ///
    /// # Errors
    /// The database failed.
    pub async fn end_conversations_of(&self, user_id: i64) -> Result<usize, socialgraph_server::ApiError> {
        let mut changed = 0;
        loop {
            let ids = seen::active_conversations_of(&self.db, user_id, ROUND).await.map_err(socialgraph_server::db_error)?;
            if ids.is_empty() {
                return Ok(changed);
            }
            for c in ids {
                let ended: socialgraph_server::ApiResult<bool> = in_tx!(self, tx => { self.end_in(tx, user_id, c).await });
                changed += usize::from(ended?);
            }
        }
    }
}

impl BatchHandler for AccountEnder {
    async fn load_offset(&self, topic: &str, partition: i32) -> Result<Option<i64>, BoxError> {
        Ok(offsets::next_offset(&self.messages.db, &self.consumer, topic, partition).await?)
    }

    async fn apply(&self, topic: &str, partition: i32, records: &[RecordAndOffset], next_offset: i64) -> Result<(), BoxError> {
        let mut applied: Vec<(i64, i64)> = Vec::new();
        let mut blocks: Vec<((i64, i64), bool, i64)> = Vec::new();
        let mut last_event_ms = None;
        for r in records {
            let Ok(e) = AccountEvent::decode(r.record.value.as_deref().unwrap_or_default()) else { continue };
            last_event_ms = e.occurred_at.as_ref().map(socialgraph_domain::timestamp_to_ms).or(last_event_ms);
            if e.kind == AccountEventKind::Block as i32 && e.user_id > 0 && e.other_user_id > e.user_id {
                blocks.push(((e.user_id, e.other_user_id), e.blocked, e.version));
                continue;
            }
            if e.kind != AccountEventKind::Status as i32 || e.user_id <= 0 || e.status != AccountLifecycle::Deleting as i32 {
                continue;
            }
            let newest = applied.iter().filter(|(u, _)| *u == e.user_id).map(|(_, v)| *v).max();
            let seen = match newest {
                Some(v) => Some(v),
                None => seen::seen_version(&self.messages.db, e.user_id).await?,
            };
            if !socialgraph_domain::newer_wins(seen, e.version) {
                continue;
            }
            let ended = self.messages.end_conversations_of(e.user_id).await.map_err(|e| e.to_string())?;
            tracing::info!(user_id = e.user_id, conversations = ended, "an account being deleted left its conversations");
            applied.push((e.user_id, e.version));
        }
        let db = &self.messages.db;
        retry_tx(8, || async {
            let txn = socialgraph_storage::begin_write(db).await?;
            let now = now_ms();
            for (user, version) in &applied {
                seen::record_seen(&txn, *user, *version, now).await?;
            }
            for (pair, blocked, version) in &blocks {
                block_pairs::apply_copy(&txn, *pair, *blocked, *version, now).await?;
            }
            offsets::store(&txn, &self.consumer, topic, StoredOffset { partition, next_offset, last_event_ms }, now).await?;
            txn.commit().await
        })
        .await?;
        Ok(())
    }
}
