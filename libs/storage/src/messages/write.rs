//! The writes of message-svc's tables; the caller's transaction holds them together.

use sea_orm::sea_query::Query;
use sea_orm::{ConnectionTrait, DbBackend, DbErr};

use super::{
    CONVERSATION_COLS, Conversation, ConversationRow, MEMBER_COLS, MemberRow, Message, MessageRow, all, conversation, exec, marks, member, members,
    values,
};

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

/// Creates a conversation and its member rows; returns its id and the rows. A second private
/// conversation of one pair fails with a unique violation (the caller retries and finds the
/// first).
///
/// # Errors
/// Database errors.
pub async fn create<C: ConnectionTrait>(conn: &C, new: &NewConversation) -> Result<(i64, Vec<MemberRow>), DbErr> {
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
    let members = join(conn, id, &new.members, 0, 0, new.now_ms).await?;
    Ok((id, members))
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
/// `last_seq` now) and have read up to it, with nothing unread: new rows (version 1) for new
/// users, rows of removed members reset (their version one up). Current members must not be
/// passed. Returns the rows as they are now.
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
) -> Result<Vec<MemberRow>, DbErr> {
    if users.is_empty() {
        return Ok(Vec::new());
    }
    let known: Vec<i64> = members(conn, conversation_id, users).await?.iter().map(|m| m.user_id).collect();
    if !known.is_empty() {
        let sql = format!(
            "UPDATE conversation_member SET state = 1, joined_seq = ?, last_seq = ?, read_seq = ?, last_message_id = ?, unread_count = 0, \
             version = version + 1, updated_at_ms = ? WHERE conversation_id = ? AND user_id IN ({})",
            marks(known.len())
        );
        let mut v = values(&[seq, seq, seq, last_message_id, now_ms, conversation_id]);
        v.extend(values(&known));
        exec(conn, &sql, v).await?;
    }
    let fresh: Vec<i64> = users.iter().copied().filter(|u| !known.contains(u)).collect();
    for chunk in fresh.chunks(500) {
        let rows = vec!["(?, ?, 1, ?, ?, ?, ?, 0, 1, ?)"; chunk.len()].join(", ");
        let sql = format!(
            "INSERT INTO conversation_member (conversation_id, user_id, state, joined_seq, last_seq, last_message_id, read_seq, unread_count, version, updated_at_ms) \
             VALUES {rows}"
        );
        let v = chunk.iter().flat_map(|u| values(&[conversation_id, *u, seq, seq, last_message_id, seq, now_ms])).collect();
        exec(conn, &sql, v).await?;
    }
    members(conn, conversation_id, users).await
}

/// Marks an active member removed: nothing of the conversation is unread for it any more (its
/// read cursor moves to its last visible message), and later messages do not reach it. Returns
/// its row after, or `None` when it was not an active member.
///
/// # Errors
/// Database errors.
pub async fn leave<C: ConnectionTrait>(conn: &C, conversation_id: i64, user_id: i64, now_ms: i64) -> Result<Option<MemberRow>, DbErr> {
    let sql = "UPDATE conversation_member SET state = 0, read_seq = last_seq, unread_count = 0, version = version + 1, updated_at_ms = ? \
               WHERE conversation_id = ? AND user_id = ? AND state = 1";
    if exec(conn, sql, values(&[now_ms, conversation_id, user_id])).await? != 1 {
        return Ok(None);
    }
    Ok(members(conn, conversation_id, &[user_id]).await?.into_iter().next())
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
/// member's newest message to it, one more unread for each but the sender, and the sender's read
/// cursor to it (nothing unread). `active` are the conversation's active member rows, read
/// after its lock was taken. Returns the message's id and those rows as they are now. A reused
/// (sender, client_message_id) fails with a unique violation.
///
/// # Errors
/// Database errors.
pub async fn append<C: ConnectionTrait>(conn: &C, m: &NewMessage<'_>, active: &[MemberRow]) -> Result<(i64, Vec<MemberRow>), DbErr> {
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
    let (c, s, me) = (m.conversation_id, m.seq, m.sender_id);
    let sql = "UPDATE conversation_member SET last_seq = ?, last_message_id = ?, updated_at_ms = ?, version = version + 1, \
               read_seq = CASE WHEN user_id = ? THEN ? ELSE read_seq END, \
               unread_count = CASE WHEN user_id = ? THEN 0 ELSE unread_count + 1 END WHERE conversation_id = ? AND state = 1";
    exec(conn, sql, values(&[s, id, m.now_ms, me, s, me, c])).await?;
    let after = active
        .iter()
        .map(|r| {
            let mine = r.user_id == me;
            MemberRow {
                last_seq: s,
                last_message_id: id,
                read_seq: if mine { s } else { r.read_seq },
                unread_count: if mine { 0 } else { r.unread_count + 1 },
                version: r.version + 1,
                ..*r
            }
        })
        .collect();
    Ok((id, after))
}

/// The live messages of a conversation with a sequence in `(after_seq, up_to_seq]`.
async fn live_between<C: ConnectionTrait>(conn: &C, conversation_id: i64, after_seq: i64, up_to_seq: i64) -> Result<i64, DbErr> {
    let sql = "SELECT COUNT(*) FROM message WHERE conversation_id = ? AND seq > ? AND seq <= ? AND deleted_at_ms IS NULL";
    let rows = all(conn, sql, values(&[conversation_id, after_seq, up_to_seq])).await?;
    Ok(rows.first().map(|r| r.try_get_by_index::<i64>(0)).transpose()?.unwrap_or(0))
}

/// Moves a member's read cursor forward to `seq` and recounts what is unread after it; returns
/// the row after, or `None` when the cursor was already there or further (or no such member).
/// The caller holds the conversation's lock.
///
/// # Errors
/// Database errors.
pub async fn mark_read<C: ConnectionTrait>(conn: &C, member: &MemberRow, seq: i64, now_ms: i64) -> Result<Option<MemberRow>, DbErr> {
    if member.read_seq >= seq {
        return Ok(None);
    }
    let unread = if member.active { live_between(conn, member.conversation_id, seq, member.last_seq).await? } else { 0 };
    let sql = "UPDATE conversation_member SET read_seq = ?, unread_count = ?, version = version + 1, updated_at_ms = ? \
               WHERE conversation_id = ? AND user_id = ? AND read_seq < ?";
    let v = values(&[seq, unread, now_ms, member.conversation_id, member.user_id, seq]);
    Ok((exec(conn, sql, v).await? == 1).then_some(MemberRow { read_seq: seq, unread_count: unread, version: member.version + 1, ..*member }))
}

/// Deletes a live message (the caller holds its conversation's lock): a tombstone keeps its id
/// and idempotency key, its body goes; the active members who had it unread have one unread
/// less; members whose newest visible message it was get the newest live one before it (0 when
/// none), which is what orders their conversation lists. Returns the rows whose unread count
/// changed, as they are now; `None` when the message was deleted already.
///
/// # Errors
/// Database errors.
pub async fn delete_message<C: ConnectionTrait>(conn: &C, m: &MessageRow, now_ms: i64) -> Result<Option<Vec<MemberRow>>, DbErr> {
    let sql = "UPDATE message SET deleted_at_ms = ?, body = ? WHERE id = ? AND deleted_at_ms IS NULL";
    if exec(conn, sql, vec![now_ms.into(), Vec::<u8>::new().into(), m.id.into()]).await? != 1 {
        return Ok(None);
    }
    let (c, s) = (m.conversation_id, m.seq);
    let unread_sql = format!(
        "SELECT {MEMBER_COLS} FROM conversation_member WHERE conversation_id = ? AND state = 1 AND user_id <> ? \
         AND joined_seq < ? AND read_seq < ? AND last_seq >= ? AND unread_count > 0"
    );
    let had: Vec<MemberRow> =
        all(conn, &unread_sql, values(&[c, m.sender_id, s, s, s])).await?.iter().map(|r| member(r, 0)).collect::<Result<_, _>>()?;
    let ids: Vec<i64> = had.iter().map(|r| r.user_id).collect();
    for chunk in ids.chunks(500) {
        let sql = format!(
            "UPDATE conversation_member SET unread_count = unread_count - 1, version = version + 1, updated_at_ms = ? \
             WHERE conversation_id = ? AND user_id IN ({})",
            marks(chunk.len())
        );
        let mut v = values(&[now_ms, c]);
        v.extend(values(chunk));
        exec(conn, &sql, v).await?;
    }
    // Message ids grow with a conversation's sequence, so the newest live one is the largest id.
    let newest = "UPDATE conversation_member SET last_message_id = COALESCE((SELECT MAX(m.id) FROM message m \
                  WHERE m.conversation_id = conversation_member.conversation_id AND m.seq > conversation_member.joined_seq \
                  AND m.seq <= conversation_member.last_seq AND m.deleted_at_ms IS NULL), 0) \
                  WHERE conversation_id = ? AND last_message_id = ?";
    exec(conn, newest, values(&[c, m.id])).await?;
    Ok(Some(had.into_iter().map(|r| MemberRow { unread_count: r.unread_count - 1, version: r.version + 1, ..r }).collect()))
}

/// Replaces a live message's body and stamps the edit; false when it is deleted.
///
/// # Errors
/// Database errors.
pub async fn edit_message<C: ConnectionTrait>(conn: &C, message_id: i64, body: &[u8], now_ms: i64) -> Result<bool, DbErr> {
    let sql = "UPDATE message SET body = ?, edited_at_ms = ? WHERE id = ? AND deleted_at_ms IS NULL";
    Ok(exec(conn, sql, vec![body.to_vec().into(), now_ms.into(), message_id.into()]).await? == 1)
}

/// Sets a conversation's title.
///
/// # Errors
/// Database errors.
pub async fn rename<C: ConnectionTrait>(conn: &C, conversation_id: i64, title: &str, now_ms: i64) -> Result<(), DbErr> {
    let sql = "UPDATE conversation SET title = ?, updated_at_ms = ? WHERE id = ?";
    exec(conn, sql, vec![title.into(), now_ms.into(), conversation_id.into()]).await.map(|_| ())
}
