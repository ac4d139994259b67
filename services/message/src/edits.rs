//! Changes to what was said: DeleteMessage and EditMessage by the message's sender, RenameGroup
//! by a member. Each is one transaction that takes the conversation's lock first (so it is
//! ordered with the sends, reads and member changes of the conversation) and writes its event.
//!
//! A deletion is the only one that moves unread counts: the members who had the message unread
//! have one less, and its event carries their states. Edits and renames move no count and no
//! conversation order.

use socialgraph_domain::now_ms;
use socialgraph_proto::events::v1::MessageEventKind;
use socialgraph_server::{ApiError, ApiResult};
use socialgraph_storage::messages::{self as store, MessageRow};

use crate::service::{Messages, TxError, in_tx, not_a_group, not_a_member};

fn unknown_message() -> ApiError {
    ApiError::NotFound { reason: "UNKNOWN_MESSAGE", message: "no message has this id".into() }
}

fn not_the_sender() -> ApiError {
    ApiError::Forbidden { reason: "NOT_THE_SENDER", message: "only a message's sender changes it".into() }
}

/// The conversation's other active members: whom a change is for besides its actor (live
/// delivery reads it from the event).
async fn others(tx: &sea_orm::DatabaseTransaction, conversation_id: i64, actor_id: i64) -> Result<Vec<i64>, sea_orm::DbErr> {
    Ok(store::active_members(tx, conversation_id).await?.into_iter().map(|m| m.user_id).filter(|u| *u != actor_id).collect())
}

impl Messages {
    /// The message `message_id` with its conversation locked for the rest of the transaction,
    /// when `user_id` sent it.
    async fn own_message(&self, tx: &sea_orm::DatabaseTransaction, user_id: i64, message_id: i64, now: i64) -> Result<MessageRow, TxError> {
        let found = store::by_ids(tx, &[message_id]).await?.into_iter().next().ok_or_else(unknown_message)?;
        store::lock_conversation(tx, found.conversation_id, now).await?.ok_or_else(unknown_message)?;
        if found.sender_id != user_id {
            return Err(not_the_sender().into());
        }
        // Read again under the lock: a concurrent deletion or edit has committed by now.
        Ok(store::by_ids(tx, &[message_id]).await?.into_iter().next().ok_or_else(unknown_message)?)
    }

    /// Deletes `message_id` as `user_id`; false when it was deleted already.
    ///
    /// # Errors
    /// NOT_FOUND (UNKNOWN_MESSAGE), PERMISSION_DENIED (NOT_THE_SENDER).
    pub async fn delete_message(&self, user_id: i64, message_id: i64) -> ApiResult<bool> {
        in_tx!(self, tx => {
            let now = now_ms();
            let m = self.own_message(tx, user_id, message_id, now).await?;
            let Some(moved) = store::delete_message(tx, &m, now).await? else { return Ok(false) };
            let users = others(tx, m.conversation_id, user_id).await?;
            let mut event = self.event(MessageEventKind::MessageDeleted, m.conversation_id, user_id, users, &moved, now);
            (event.seq, event.message_id) = (m.seq, m.id);
            self.publish(tx, &event, now).await?;
            Ok(true)
        })
    }

    /// Replaces the body of `message_id` as `user_id`; returns (changed, the message now).
    ///
    /// # Errors
    /// NOT_FOUND (UNKNOWN_MESSAGE, also for a deleted message), PERMISSION_DENIED
    /// (NOT_THE_SENDER, NOT_A_MEMBER).
    pub async fn edit_message(&self, user_id: i64, message_id: i64, body: &[u8]) -> ApiResult<(bool, MessageRow)> {
        in_tx!(self, tx => {
            let now = now_ms();
            let m = self.own_message(tx, user_id, message_id, now).await?;
            if m.deleted_at_ms.is_some() {
                return Err(unknown_message().into());
            }
            if !store::member_of(tx, m.conversation_id, user_id).await?.is_some_and(|me| me.active) {
                return Err(not_a_member().into());
            }
            if m.body == body {
                return Ok((false, m));
            }
            store::edit_message(tx, m.id, body, now).await?;
            let users = others(tx, m.conversation_id, user_id).await?;
            let mut event = self.event(MessageEventKind::MessageEdited, m.conversation_id, user_id, users, &[], now);
            (event.seq, event.message_id, event.body) = (m.seq, m.id, body.to_vec());
            event.edited_at = Some(socialgraph_domain::timestamp_from_ms(now));
            self.publish(tx, &event, now).await?;
            Ok((true, MessageRow { body: body.to_vec(), edited_at_ms: Some(now), ..m }))
        })
    }

    /// Renames group `conversation_id` as `user_id`; false when it had that title already.
    ///
    /// # Errors
    /// PERMISSION_DENIED (NOT_A_MEMBER), FAILED_PRECONDITION (NOT_A_GROUP).
    pub async fn rename_group(&self, user_id: i64, conversation_id: i64, title: &str) -> ApiResult<bool> {
        in_tx!(self, tx => {
            let now = now_ms();
            let c = store::lock_conversation(tx, conversation_id, now).await?.ok_or_else(not_a_member)?;
            if !store::member_of(tx, conversation_id, user_id).await?.is_some_and(|me| me.active) {
                return Err(not_a_member().into());
            }
            if c.kind != store::GROUP {
                return Err(not_a_group().into());
            }
            if c.title == title {
                return Ok(false);
            }
            store::rename(tx, conversation_id, title, now).await?;
            let users = others(tx, conversation_id, user_id).await?;
            let mut event = self.event(MessageEventKind::GroupRenamed, conversation_id, user_id, users, &[], now);
            event.title = title.to_owned();
            self.publish(tx, &event, now).await?;
            Ok(true)
        })
    }
}
