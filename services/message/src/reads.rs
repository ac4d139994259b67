//! MessageService's reads: conversation lists, message pages and unread counts, straight from
//! message-svc's tables (exact as of the read).

use std::collections::HashMap;

use socialgraph_domain::{ListEntry, ListKind, timestamp_from_ms};
use socialgraph_proto::message::v1 as pb;
use socialgraph_server::paging::page_request;
use socialgraph_server::{ApiResult, db_error};
use socialgraph_storage::messages::{self as store, MessageRow};

use crate::service::Messages;

/// A stored message as the API shows it.
pub fn message_pb(m: MessageRow) -> pb::Message {
    pb::Message {
        message_id: m.id,
        conversation_id: m.conversation_id,
        seq: m.seq,
        sender_id: m.sender_id,
        client_message_id: m.client_message_id,
        body: m.body,
        sent_at: Some(timestamp_from_ms(m.sent_at_ms)),
        edited_at: m.edited_at_ms.map(timestamp_from_ms),
    }
}

impl Messages {
    /// One page of `user_id`'s conversations, most recent activity first.
    ///
    /// # Errors
    /// INVALID_ARGUMENT for bad ids, sizes or tokens; UNAVAILABLE when the database is.
    pub async fn list_conversations(&self, user_id: i64, page_size: i32, page_token: &str) -> ApiResult<pb::ListConversationsResponse> {
        let kind = ListKind::Conversations;
        let page = page_request(&self.tokens, kind, &[("user_id", user_id)], page_size, page_token)?;
        let after = page.after.map(|c| (c.followed_at_ms, c.peer_id));
        let mut rows = store::conversations_of(&self.db, user_id, after, page.size + 1).await.map_err(db_error)?;
        let entries = rows.iter().map(|(m, _)| ListEntry { user_id: m.conversation_id, followed_at_ms: m.last_message_id }).collect();
        let cut = self.tokens.finish(entries, page.size, kind, user_id, 0);
        rows.truncate(cut.entries.len());
        let ids: Vec<i64> = rows.iter().map(|(m, _)| m.last_message_id).filter(|id| *id > 0).collect();
        let mut last: HashMap<i64, MessageRow> = store::by_ids(&self.db, &ids).await.map_err(db_error)?.into_iter().map(|m| (m.id, m)).collect();
        let conversations = rows
            .into_iter()
            .map(|(m, c)| pb::Conversation {
                conversation_id: c.id,
                kind: if c.kind == store::GROUP { pb::ConversationKind::Group } else { pb::ConversationKind::Private } as i32,
                peer_id: c.direct.map_or(0, |(low, high)| if low == user_id { high } else { low }),
                title: c.title,
                last_message: last.remove(&m.last_message_id).map(message_pb),
                unread_count: m.unread_count,
                active: m.active,
                member_count: c.member_count,
            })
            .collect();
        Ok(pb::ListConversationsResponse { conversations, next_page_token: cut.next_page_token })
    }

    /// One page of a conversation's messages visible to `user_id`, newest first.
    ///
    /// # Errors
    /// INVALID_ARGUMENT for bad ids, sizes or tokens; PERMISSION_DENIED (NOT_A_MEMBER).
    pub async fn list_messages(&self, user_id: i64, conversation_id: i64, page_size: i32, page_token: &str) -> ApiResult<pb::ListMessagesResponse> {
        let kind = ListKind::Messages;
        let page = page_request(&self.tokens, kind, &[("user_id", user_id), ("conversation_id", conversation_id)], page_size, page_token)?;
        let me = store::member_of(&self.db, conversation_id, user_id).await.map_err(db_error)?.ok_or_else(crate::service::not_a_member)?;
        // The member row is read first: every message up to its last_seq is committed.
        let up_to = page.after.map_or(me.last_seq, |c| me.last_seq.min(c.followed_at_ms - 1));
        let rows = store::messages_between(&self.db, conversation_id, me.joined_seq, up_to, page.size + 1).await.map_err(db_error)?;
        let entries = rows.iter().map(|m| ListEntry { user_id: m.id, followed_at_ms: m.seq }).collect();
        let cut = self.tokens.finish(entries, page.size, kind, user_id, conversation_id);
        let messages = rows.into_iter().take(cut.entries.len()).map(message_pb).collect();
        Ok(pb::ListMessagesResponse { messages, next_page_token: cut.next_page_token })
    }

    /// `user_id`'s unread counts per conversation (those above 0) and in total.
    ///
    /// # Errors
    /// UNAVAILABLE when the database is.
    pub async fn unread_counts(&self, user_id: i64) -> ApiResult<pb::GetUnreadCountsResponse> {
        let rows = store::unread_of(&self.db, user_id).await.map_err(db_error)?;
        let total_unread = rows.iter().map(|m| m.unread_count).sum();
        let conversations = rows
            .iter()
            .map(|m| pb::ConversationUnread { conversation_id: m.conversation_id, unread_count: m.unread_count, version: m.version })
            .collect();
        Ok(pb::GetUnreadCountsResponse { conversations, total_unread })
    }
}

impl Messages {
    /// The unread state of each (conversation, user) pair, in request order (version 0 for no
    /// membership).
    ///
    /// # Errors
    /// UNAVAILABLE when the database is.
    pub async fn member_states(&self, pairs: &[(i64, i64)]) -> ApiResult<Vec<pb::MemberState>> {
        let rows = store::member_states(&self.db, pairs).await.map_err(db_error)?;
        let found: HashMap<(i64, i64), &store::MemberRow> = rows.iter().map(|m| ((m.conversation_id, m.user_id), m)).collect();
        Ok(pairs
            .iter()
            .map(|(c, u)| {
                let m = found.get(&(*c, *u));
                pb::MemberState {
                    conversation_id: *c,
                    user_id: *u,
                    unread_count: m.map_or(0, |m| m.unread_count),
                    version: m.map_or(0, |m| m.version),
                }
            })
            .collect())
    }
}
