//! What message-svc keeps of other services' accounts: the newest AccountEvent version it
//! applied per account (`message_account_seen`), and the conversations an account is in.

use sea_orm::{ConnectionTrait, DbBackend, DbErr};

use super::{all, exec, values};

/// The newest account event version applied for `user_id`, if any.
///
/// # Errors
/// Database errors.
pub async fn seen_version<C: ConnectionTrait>(conn: &C, user_id: i64) -> Result<Option<i64>, DbErr> {
    let rows = all(conn, "SELECT version FROM message_account_seen WHERE user_id = ?", values(&[user_id])).await?;
    rows.first().map(|r| r.try_get_by_index(0)).transpose()
}

/// Records `version` as the newest account event applied for `user_id`.
///
/// # Errors
/// Database errors.
pub async fn record_seen<C: ConnectionTrait>(conn: &C, user_id: i64, version: i64, now_ms: i64) -> Result<(), DbErr> {
    let sql = match conn.get_database_backend() {
        DbBackend::MySql => {
            "INSERT INTO message_account_seen (user_id, version, updated_at_ms) VALUES (?, ?, ?) \
                             ON DUPLICATE KEY UPDATE version = VALUES(version), updated_at_ms = VALUES(updated_at_ms)"
        }
        _ => {
            "INSERT INTO message_account_seen (user_id, version, updated_at_ms) VALUES (?, ?, ?) \
              ON CONFLICT (user_id) DO UPDATE SET version = excluded.version, updated_at_ms = excluded.updated_at_ms"
        }
    };
    exec(conn, sql, values(&[user_id, version, now_ms])).await.map(|_| ())
}

/// Up to `limit` conversations `user_id` is an active member of, by id.
///
/// # Errors
/// Database errors.
pub async fn active_conversations_of<C: ConnectionTrait>(conn: &C, user_id: i64, limit: usize) -> Result<Vec<i64>, DbErr> {
    let sql = "SELECT conversation_id FROM conversation_member WHERE user_id = ? AND state = 1 ORDER BY conversation_id LIMIT ?";
    all(conn, sql, values(&[user_id, limit as i64])).await?.iter().map(|r| r.try_get_by_index(0)).collect()
}
