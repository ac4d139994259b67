//! The writes of message-svc's tables; the caller's transaction holds them together.

use sea_orm::sea_query::Query;
use sea_orm::{ConnectionTrait, DbBackend, DbErr};

use super::{CONVERSATION_COLS, Conversation, ConversationRow, Message, all, conversation, exec, marks, members, values};

/// Runs an INSERT into a table with an auto-increment `id` and returns the new id
/// (`RETURNING` on PostgreSQL, the driver's last insert id elsewhere).
async fn insert_returning_id<C: ConnectionTrait>(conn: &C, mut q: sea_orm::sea_query::InsertStatement) -> Result<i64, DbErr> {
    if conn.get_database_backend() == DbBackend::Postgres {
        q.returning_col(Conversation::Id);
        let row = conn.query_one(&q).await?.ok_or_else(|| DbErr::RecordNotInserted)?;
        return row.try_get_by_index(0);
    }
    let id = conn.execute(&q).await?.last_insert_id();
    i64::try_from(id).map_err(|_| DbErr::Custom(format!("insert id {id} out of range")))
}

/// A new conversation row.
#[derive(Debug, Clone)]
pub struct NewConversation {
    /// [`PRIVATE`] or [`GROUP`].
    pub kind: i16,
    /// A private conversation's pair, smaller id first.
    pub direct: Option<(i64, i64)>,
    /// Owner (creator).
    pub owner_id: i64,
    /// Title (groups).
    pub title: String,
    /// The members; each gets a row that sees every message.
    pub members: Vec<i64>,
    /// Now, ms since the epoch.
    pub now_ms: i64,
}

/// Creates a conversation and its member rows; returns its id. A second private conversation of
/// one pair fails with a unique violation (the caller retries and finds the first).
///
/// # Errors
/// Database errors.
pub async fn create<C: ConnectionTrait>(conn: &C, new: &NewConversation) -> Result<i64, DbErr> {
    let q = Query::insert()
        .into_table(Conversation::Table)
        .columns([
            Conversation::Kind,
            Conversation::DirectLow,
            Conversation::DirectHigh,
            Conversation::OwnerId,
            Conversation::Title,
            Conversation::LastSeq,
            Conversation::MemberCount,
            Conversation::CreatedAtMs,
            Conversation::UpdatedAtMs,
        ])
        .values_panic([
            new.kind.into(),
            new.direct.map(|d| d.0).into(),
            new.direct.map(|d| d.1).into(),
            new.owner_id.into(),
            new.title.clone().into(),
            0i64.into(),
            (new.members.len() as i32).into(),
            new.now_ms.into(),
            new.now_ms.into(),
        ])
        .to_owned();
    let id = insert_returning_id(conn, q).await?;
    join(conn, id, &new.members, 0, 0, new.now_ms).await?;
    Ok(id)
}

/// Locks the conversation's row for the rest of the transaction (every write of a conversation
/// takes it first, so they apply one at a time) and returns it; `None` when it does not exist.
///
/// # Errors
/// Database errors.
pub async fn lock_conversation<C: ConnectionTrait>(conn: &C, id: i64, now_ms: i64) -> Result<Option<ConversationRow>, DbErr> {
    if exec(conn, "UPDATE conversation SET updated_at_ms = ? WHERE id = ?", values(&[now_ms, id])).await? == 0 {
        return Ok(None);
    }
    let sql = format!("SELECT {CONVERSATION_COLS} FROM conversation WHERE id = ?");
    all(conn, &sql, values(&[id])).await?.first().map(|r| conversation(r, 0)).transpose()
}

/// Takes the next sequence of the conversation (`last_seq` + 1, which also locks its row for
/// the rest of the transaction) and returns the row with it; `None` when it does not exist.
///
/// # Errors
/// Database errors.
pub async fn next_seq<C: ConnectionTrait>(conn: &C, id: i64, now_ms: i64) -> Result<Option<ConversationRow>, DbErr> {
    if exec(conn, "UPDATE conversation SET last_seq = last_seq + 1, updated_at_ms = ? WHERE id = ?", values(&[now_ms, id])).await? == 0 {
        return Ok(None);
    }
    let sql = format!("SELECT {CONVERSATION_COLS} FROM conversation WHERE id = ?");
    all(conn, &sql, values(&[id])).await?.first().map(|r| conversation(r, 0)).transpose()
}

/// Makes `users` active members that see the messages after `seq` (the conversation's
/// `last_seq` now) and have read up to it: new rows for new users, rows of removed members
/// reset. Current members must not be passed.
///
/// # Errors
/// Database errors.
pub async fn join<C: ConnectionTrait>(
    conn: &C,
    conversation_id: i64,
    users: &[i64],
    seq: i64,
    last_message_id: i64,
    now_ms: i64,
) -> Result<(), DbErr> {
    if users.is_empty() {
        return Ok(());
    }
    let known: Vec<i64> = members(conn, conversation_id, users).await?.iter().map(|m| m.user_id).collect();
    if !known.is_empty() {
        let sql = format!(
            "UPDATE conversation_member SET state = 1, joined_seq = ?, last_seq = ?, read_seq = ?, last_message_id = ?, updated_at_ms = ? \
             WHERE conversation_id = ? AND user_id IN ({})",
            marks(known.len())
        );
        let mut v = values(&[seq, seq, seq, last_message_id, now_ms, conversation_id]);
        v.extend(values(&known));
        exec(conn, &sql, v).await?;
    }
    let fresh: Vec<i64> = users.iter().copied().filter(|u| !known.contains(u)).collect();
    for chunk in fresh.chunks(500) {
        let rows = vec!["(?, ?, 1, ?, ?, ?, ?, ?)"; chunk.len()].join(", ");
        let sql = format!(
            "INSERT INTO conversation_member (conversation_id, user_id, state, joined_seq, last_seq, last_message_id, read_seq, updated_at_ms) VALUES {rows}"
        );
        let v = chunk.iter().flat_map(|u| values(&[conversation_id, *u, seq, seq, last_message_id, seq, now_ms])).collect();
        exec(conn, &sql, v).await?;
    }
    Ok(())
}

/// Marks an active member removed; false when it was not an active member. Its last visible
/// message and read cursor stay as they were.
///
/// # Errors
/// Database errors.
pub async fn leave<C: ConnectionTrait>(conn: &C, conversation_id: i64, user_id: i64, now_ms: i64) -> Result<bool, DbErr> {
    let sql = "UPDATE conversation_member SET state = 0, updated_at_ms = ? WHERE conversation_id = ? AND user_id = ? AND state = 1";
    Ok(exec(conn, sql, values(&[now_ms, conversation_id, user_id])).await? == 1)
}

/// Adds `delta` to the conversation's active member count.
///
/// # Errors
/// Database errors.
pub async fn add_member_count<C: ConnectionTrait>(conn: &C, conversation_id: i64, delta: i32) -> Result<(), DbErr> {
    exec(conn, "UPDATE conversation SET member_count = member_count + ? WHERE id = ?", vec![delta.into(), conversation_id.into()]).await.map(|_| ())
}

/// A message to append.
#[derive(Debug, Clone)]
pub struct NewMessage<'a> {
    /// The conversation, its sequence taken with [`next_seq`].
    pub conversation_id: i64,
    /// That sequence.
    pub seq: i64,
    /// The sender, an active member.
    pub sender_id: i64,
    /// The sender's idempotency key.
    pub client_message_id: &'a str,
    /// The body.
    pub body: &'a [u8],
    /// Now, ms since the epoch.
    pub now_ms: i64,
}

/// Appends a message at a sequence taken with [`next_seq`]: inserts it, moves every active
/// member's newest message to it, and the sender's read cursor too. Returns its id. A
/// reused (sender, client_message_id) fails with a unique violation.
///
/// # Errors
/// Database errors.
pub async fn append<C: ConnectionTrait>(conn: &C, m: &NewMessage<'_>) -> Result<i64, DbErr> {
    let q = Query::insert()
        .into_table(Message::Table)
        .columns([Message::ConversationId, Message::Seq, Message::SenderId, Message::ClientMessageId, Message::Body, Message::SentAtMs])
        .values_panic([
            m.conversation_id.into(),
            m.seq.into(),
            m.sender_id.into(),
            m.client_message_id.into(),
            m.body.to_vec().into(),
            m.now_ms.into(),
        ])
        .to_owned();
    let id = insert_returning_id(conn, q).await?;
    let (c, s) = (m.conversation_id, m.seq);
    let sql = "UPDATE conversation_member SET last_seq = ?, last_message_id = ?, updated_at_ms = ?, \
               read_seq = CASE WHEN user_id = ? THEN ? ELSE read_seq END WHERE conversation_id = ? AND state = 1";
    exec(conn, sql, values(&[s, id, m.now_ms, m.sender_id, s, c])).await?;
    Ok(id)
}

/// Moves a member's read cursor forward to `seq`; false when it was already there or further.
///
/// # Errors
/// Database errors.
pub async fn mark_read<C: ConnectionTrait>(conn: &C, conversation_id: i64, user_id: i64, seq: i64, now_ms: i64) -> Result<bool, DbErr> {
    let sql = "UPDATE conversation_member SET read_seq = ?, updated_at_ms = ? WHERE conversation_id = ? AND user_id = ? AND read_seq < ?";
    Ok(exec(conn, sql, values(&[seq, now_ms, conversation_id, user_id, seq])).await? == 1)
}
