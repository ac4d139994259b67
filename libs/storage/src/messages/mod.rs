//! The tables of message-svc (`conversation`, `conversation_member`, `message`; see the
//! migration `m20261203_000001_create_messages` for their shapes). Every statement binds its
//! values (`?` placeholders, numbered for PostgreSQL, or sea-query), so one text serves
//! PostgreSQL, MySQL/MariaDB and SQLite and is prepared once per connection: with the ids in
//! the text each send prepared a dozen new statements and took 2.5 times as long. The caller holds the transaction:
//! every write of a conversation starts with [`lock_conversation`], which orders them.

use sea_orm::{ConnectionTrait, DbErr, QueryResult, Value};

/// `conversation.kind` of a private conversation (two members).
pub const PRIVATE: i16 = 1;
/// `conversation.kind` of a group.
pub const GROUP: i16 = 2;

#[derive(Clone, Copy, sea_orm::DeriveIden)]
enum Conversation {
    Table,
    Id,
    Kind,
    DirectLow,
    DirectHigh,
    OwnerId,
    Title,
    LastSeq,
    MemberCount,
    CreatedAtMs,
    UpdatedAtMs,
}

#[derive(Clone, Copy, sea_orm::DeriveIden)]
enum Message {
    Table,
    ConversationId,
    Seq,
    SenderId,
    ClientMessageId,
    Body,
    SentAtMs,
}

pub mod accounts;
mod write;
pub use write::*;

/// A row of `message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageRow {
    /// Global id, growing in send order.
    pub id: i64,
    /// The conversation.
    pub conversation_id: i64,
    /// Position in the conversation, from 1.
    pub seq: i64,
    /// The sender.
    pub sender_id: i64,
    /// The sender's idempotency key.
    pub client_message_id: String,
    /// Opaque bytes.
    pub body: Vec<u8>,
    /// Accepted at, ms since the epoch.
    pub sent_at_ms: i64,
    /// Last edited at, ms since the epoch; `None` when never edited.
    pub edited_at_ms: Option<i64>,
    /// Deleted at, ms since the epoch (a tombstone: its body is empty); `None` when live.
    pub deleted_at_ms: Option<i64>,
}

/// A row of `conversation`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConversationRow {
    /// The id.
    pub id: i64,
    /// [`PRIVATE`] or [`GROUP`].
    pub kind: i16,
    /// A private conversation's pair, smaller id first; `None` for a group.
    pub direct: Option<(i64, i64)>,
    /// A group's owner (the creator); a private conversation's first sender.
    pub owner_id: i64,
    /// A group's title; empty for a private conversation.
    pub title: String,
    /// Sequence of the newest message, 0 before the first.
    pub last_seq: i64,
    /// Active members.
    pub member_count: i32,
}

/// A row of `conversation_member`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberRow {
    /// The conversation.
    pub conversation_id: i64,
    /// The member.
    pub user_id: i64,
    /// False once removed or left.
    pub active: bool,
    /// Messages with a greater sequence are visible to the member.
    pub joined_seq: i64,
    /// Sequence of the newest message visible to the member.
    pub last_seq: i64,
    /// Id of the newest message visible to the member (0: none); orders its conversation list.
    pub last_message_id: i64,
    /// The member's read cursor (a sequence).
    pub read_seq: i64,
    /// Live messages after the read cursor (all sent by others); 0 once inactive.
    pub unread_count: i64,
    /// Grows by one with every change of the membership; events carry it beside the count, and
    /// derived copies keep the highest they saw.
    pub version: i64,
}

const MESSAGE_COLS: &str = "id, conversation_id, seq, sender_id, client_message_id, body, sent_at_ms, edited_at_ms, deleted_at_ms";
const MEMBER_COLS: &str = "conversation_id, user_id, state, joined_seq, last_seq, last_message_id, read_seq, unread_count, version";
/// Columns in [`MEMBER_COLS`], where a joined conversation's columns start.
const MEMBER_COL_COUNT: usize = 9;
const CONVERSATION_COLS: &str = "id, kind, direct_low, direct_high, owner_id, title, last_seq, member_count";

fn message(r: &QueryResult, at: usize) -> Result<MessageRow, DbErr> {
    Ok(MessageRow {
        id: r.try_get_by_index(at)?,
        conversation_id: r.try_get_by_index(at + 1)?,
        seq: r.try_get_by_index(at + 2)?,
        sender_id: r.try_get_by_index(at + 3)?,
        client_message_id: r.try_get_by_index(at + 4)?,
        body: r.try_get_by_index(at + 5)?,
        sent_at_ms: r.try_get_by_index(at + 6)?,
        edited_at_ms: r.try_get_by_index(at + 7)?,
        deleted_at_ms: r.try_get_by_index(at + 8)?,
    })
}

fn member(r: &QueryResult, at: usize) -> Result<MemberRow, DbErr> {
    Ok(MemberRow {
        conversation_id: r.try_get_by_index(at)?,
        user_id: r.try_get_by_index(at + 1)?,
        active: r.try_get_by_index::<i16>(at + 2)? == 1,
        joined_seq: r.try_get_by_index(at + 3)?,
        last_seq: r.try_get_by_index(at + 4)?,
        last_message_id: r.try_get_by_index(at + 5)?,
        read_seq: r.try_get_by_index(at + 6)?,
        unread_count: r.try_get_by_index(at + 7)?,
        version: r.try_get_by_index(at + 8)?,
    })
}

fn conversation(r: &QueryResult, at: usize) -> Result<ConversationRow, DbErr> {
    let low: Option<i64> = r.try_get_by_index(at + 2)?;
    let high: Option<i64> = r.try_get_by_index(at + 3)?;
    Ok(ConversationRow {
        id: r.try_get_by_index(at)?,
        kind: r.try_get_by_index(at + 1)?,
        direct: low.zip(high),
        owner_id: r.try_get_by_index(at + 4)?,
        title: r.try_get_by_index(at + 5)?,
        last_seq: r.try_get_by_index(at + 6)?,
        member_count: r.try_get_by_index(at + 7)?,
    })
}

async fn all<C: ConnectionTrait>(conn: &C, sql: &str, values: Vec<Value>) -> Result<Vec<QueryResult>, DbErr> {
    conn.query_all_raw(crate::bound(conn.get_database_backend(), sql, values)).await
}

async fn exec<C: ConnectionTrait>(conn: &C, sql: &str, values: Vec<Value>) -> Result<u64, DbErr> {
    Ok(conn.execute_raw(crate::bound(conn.get_database_backend(), sql, values)).await?.rows_affected())
}

/// `?, ?, …` for `n` values.
fn marks(n: usize) -> String {
    vec!["?"; n].join(", ")
}

fn values(ids: &[i64]) -> Vec<Value> {
    ids.iter().map(|i| (*i).into()).collect()
}

/// The message `sender_id` sent with `client_message_id`, if any.
///
/// # Errors
/// Database errors.
pub async fn by_client_id<C: ConnectionTrait>(conn: &C, sender_id: i64, client_message_id: &str) -> Result<Option<MessageRow>, DbErr> {
    let sql = format!("SELECT {MESSAGE_COLS} FROM message WHERE sender_id = ? AND client_message_id = ?");
    all(conn, &sql, vec![sender_id.into(), client_message_id.into()]).await?.first().map(|r| message(r, 0)).transpose()
}

/// The messages with these ids, deleted ones included (any order; unknown ids are skipped).
///
/// # Errors
/// Database errors.
pub async fn by_ids<C: ConnectionTrait>(conn: &C, ids: &[i64]) -> Result<Vec<MessageRow>, DbErr> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let sql = format!("SELECT {MESSAGE_COLS} FROM message WHERE id IN ({})", marks(ids.len()));
    all(conn, &sql, values(ids)).await?.iter().map(|r| message(r, 0)).collect()
}

/// The private conversation of the pair `(low, high)` (smaller id first), if it exists.
///
/// # Errors
/// Database errors.
pub async fn find_private<C: ConnectionTrait>(conn: &C, low: i64, high: i64) -> Result<Option<i64>, DbErr> {
    let rows = all(conn, "SELECT id FROM conversation WHERE direct_low = ? AND direct_high = ?", values(&[low, high])).await?;
    rows.first().map(|r| r.try_get_by_index(0)).transpose()
}

/// The member rows of these users in the conversation (absent users are skipped).
///
/// # Errors
/// Database errors.
pub async fn members<C: ConnectionTrait>(conn: &C, conversation_id: i64, users: &[i64]) -> Result<Vec<MemberRow>, DbErr> {
    if users.is_empty() {
        return Ok(Vec::new());
    }
    let sql = format!("SELECT {MEMBER_COLS} FROM conversation_member WHERE conversation_id = ? AND user_id IN ({})", marks(users.len()));
    let mut v = values(&[conversation_id]);
    v.extend(values(users));
    all(conn, &sql, v).await?.iter().map(|r| member(r, 0)).collect()
}

/// One user's member row in the conversation.
///
/// # Errors
/// Database errors.
pub async fn member_of<C: ConnectionTrait>(conn: &C, conversation_id: i64, user_id: i64) -> Result<Option<MemberRow>, DbErr> {
    Ok(members(conn, conversation_id, &[user_id]).await?.into_iter().next())
}

/// The rows of the conversation's active members, by user id.
///
/// # Errors
/// Database errors.
pub async fn active_members<C: ConnectionTrait>(conn: &C, conversation_id: i64) -> Result<Vec<MemberRow>, DbErr> {
    let sql = format!("SELECT {MEMBER_COLS} FROM conversation_member WHERE conversation_id = ? AND state = 1 ORDER BY user_id");
    all(conn, &sql, values(&[conversation_id])).await?.iter().map(|r| member(r, 0)).collect()
}

/// The id of the conversation's message at `seq` (0 when there is none, as at seq 0).
///
/// # Errors
/// Database errors.
pub async fn message_id_at<C: ConnectionTrait>(conn: &C, conversation_id: i64, seq: i64) -> Result<i64, DbErr> {
    let rows = all(conn, "SELECT id FROM message WHERE conversation_id = ? AND seq = ?", values(&[conversation_id, seq])).await?;
    Ok(rows.first().map(|r| r.try_get_by_index(0)).transpose()?.unwrap_or(0))
}

/// One entry of a user's conversation list: its membership and the conversation.
pub type Listed = (MemberRow, ConversationRow);

/// `limit` of the user's conversations (active or not), ordered by (`last_message_id`,
/// `conversation_id`) descending, strictly after `after` when given.
///
/// # Errors
/// Database errors.
pub async fn conversations_of<C: ConnectionTrait>(conn: &C, user_id: i64, after: Option<(i64, i64)>, limit: usize) -> Result<Vec<Listed>, DbErr> {
    let cols: Vec<String> =
        MEMBER_COLS.split(", ").map(|c| format!("m.{c}")).chain(CONVERSATION_COLS.split(", ").map(|c| format!("c.{c}"))).collect();
    let mut v = values(&[user_id]);
    let window = match after {
        Some((mid, cid)) => {
            v.extend(values(&[mid, mid, cid]));
            " AND (m.last_message_id < ? OR (m.last_message_id = ? AND m.conversation_id < ?))"
        }
        None => "",
    };
    v.push((limit as i64).into());
    let sql = format!(
        "SELECT {} FROM conversation_member m JOIN conversation c ON c.id = m.conversation_id WHERE m.user_id = ?{window} \
         ORDER BY m.last_message_id DESC, m.conversation_id DESC LIMIT ?",
        cols.join(", ")
    );
    all(conn, &sql, v).await?.iter().map(|r| Ok((member(r, 0)?, conversation(r, MEMBER_COL_COUNT)?))).collect()
}

/// `limit` live messages of a conversation with a sequence in `(after_seq, up_to_seq]`, newest
/// first.
///
/// # Errors
/// Database errors.
pub async fn messages_between<C: ConnectionTrait>(
    conn: &C,
    conversation_id: i64,
    after_seq: i64,
    up_to_seq: i64,
    limit: usize,
) -> Result<Vec<MessageRow>, DbErr> {
    let sql = format!(
        "SELECT {MESSAGE_COLS} FROM message WHERE conversation_id = ? AND seq > ? AND seq <= ? AND deleted_at_ms IS NULL ORDER BY seq DESC LIMIT ?"
    );
    all(conn, &sql, values(&[conversation_id, after_seq, up_to_seq, limit as i64])).await?.iter().map(|r| message(r, 0)).collect()
}

/// The user's member rows with unread messages, by conversation id.
///
/// # Errors
/// Database errors.
pub async fn unread_of<C: ConnectionTrait>(conn: &C, user_id: i64) -> Result<Vec<MemberRow>, DbErr> {
    let sql = format!("SELECT {MEMBER_COLS} FROM conversation_member WHERE user_id = ? AND unread_count > 0 ORDER BY conversation_id");
    all(conn, &sql, values(&[user_id])).await?.iter().map(|r| member(r, 0)).collect()
}

/// The member rows of these (conversation, user) pairs (pairs that are no membership are
/// skipped).
///
/// # Errors
/// Database errors.
pub async fn member_states<C: ConnectionTrait>(conn: &C, pairs: &[(i64, i64)]) -> Result<Vec<MemberRow>, DbErr> {
    if pairs.is_empty() {
        return Ok(Vec::new());
    }
    let sql =
        format!("SELECT {MEMBER_COLS} FROM conversation_member WHERE (conversation_id, user_id) IN ({})", vec!["(?, ?)"; pairs.len()].join(", "));
    let v = pairs.iter().flat_map(|(c, u)| values(&[*c, *u])).collect();
    all(conn, &sql, v).await?.iter().map(|r| member(r, 0)).collect()
}
