//! Blocks as versioned pairs (see the migration `m20261207_000003_create_block_pairs`):
//! `block_pair`, relation-svc's record of whether either user of a pair blocks the other, with
//! a version one up on every change; and `message_block_copy`, message-svc's copy of it, kept
//! from the events that carry each change (the newest version wins).
//!
//! A pair is (smaller id, larger id). Statements bind their values, so one text serves
//! PostgreSQL, MySQL/MariaDB and SQLite.

use sea_orm::{ConnectionTrait, DbBackend, DbErr, Value};

/// The two tables of the same shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PairTable {
    /// `block_pair`: the source (relation-svc).
    Source,
    /// `message_block_copy`: message-svc's copy.
    MessageCopy,
}

impl PairTable {
    fn name(self) -> &'static str {
        match self {
            Self::Source => "block_pair",
            Self::MessageCopy => "message_block_copy",
        }
    }
}

/// `(a, b)` as a pair: smaller id first.
pub fn pair(a: i64, b: i64) -> (i64, i64) {
    (a.min(b), a.max(b))
}

pub(crate) fn statement(conn: &impl ConnectionTrait, sql: &str, values: Vec<Value>) -> sea_orm::Statement {
    crate::bound(conn.get_database_backend(), sql, values)
}

/// The stored (blocked, version) of the pair `(low, high)` in `table`, if it has a row.
///
/// # Errors
/// Database errors.
pub async fn get<C: ConnectionTrait>(conn: &C, table: PairTable, (low, high): (i64, i64)) -> Result<Option<(bool, i64)>, DbErr> {
    let sql = format!("SELECT blocked, version FROM {} WHERE low_id = ? AND high_id = ?", table.name());
    let row = conn.query_one_raw(statement(conn, &sql, vec![low.into(), high.into()])).await?;
    row.map(|r| Ok((r.try_get_by_index::<bool>(0)?, r.try_get_by_index::<i64>(1)?))).transpose()
}

/// Writes (`flag`, version) of the row keyed `key` in `table` (key columns `cols.0`, `cols.1`,
/// flag column `cols.2`), inserting the row when missing: the write of every versioned copy
/// table (the block pairs here, the mutes in [`crate::mute_versions`]). The statement itself
/// keeps the newer version: a stored row at `version` or above is left as it is, so two
/// appliers racing to insert the same missing row cannot leave the older one behind.
pub async fn put_flag<C: ConnectionTrait>(
    conn: &C,
    table: &str,
    (k1, k2, f): (&str, &str, &str),
    key: (i64, i64),
    flag: bool,
    version: i64,
    now_ms: i64,
) -> Result<(), DbErr> {
    let sql = match conn.get_database_backend() {
        DbBackend::MySql => format!(
            "INSERT INTO {table} ({k1}, {k2}, {f}, version, updated_at_ms) VALUES (?, ?, ?, ?, ?) \
             ON DUPLICATE KEY UPDATE {f} = IF(VALUES(version) > version, VALUES({f}), {f}), \
             updated_at_ms = IF(VALUES(version) > version, VALUES(updated_at_ms), updated_at_ms), \
             version = GREATEST(version, VALUES(version))"
        ),
        _ => format!(
            "INSERT INTO {table} ({k1}, {k2}, {f}, version, updated_at_ms) VALUES (?, ?, ?, ?, ?) \
             ON CONFLICT ({k1}, {k2}) DO UPDATE SET {f} = excluded.{f}, version = excluded.version, \
             updated_at_ms = excluded.updated_at_ms WHERE {table}.version < excluded.version"
        ),
    };
    let values = vec![key.0.into(), key.1.into(), flag.into(), version.into(), now_ms.into()];
    conn.execute_raw(statement(conn, &sql, values)).await.map(|_| ())
}

/// Writes (blocked, version) of the pair in `table`, inserting its row when missing.
async fn put<C: ConnectionTrait>(conn: &C, table: PairTable, p: (i64, i64), blocked: bool, version: i64, now_ms: i64) -> Result<(), DbErr> {
    put_flag(conn, table.name(), ("low_id", "high_id", "blocked"), p, blocked, version, now_ms).await
}

/// Sets whether the pair of `a` and `b` is blocked in `block_pair` (the caller holds the
/// pair's lock, as Block and Unblock take it on the pair's `following` rows); returns the new
/// version when that changed anything, `None` when it was so already.
///
/// # Errors
/// Database errors.
pub async fn set<C: ConnectionTrait>(conn: &C, a: i64, b: i64, blocked: bool, now_ms: i64) -> Result<Option<i64>, DbErr> {
    let p = pair(a, b);
    // Locked: an account's deletion job changes the pairs it is in without the pair's
    // `following` rows (SQLite serializes writers anyway).
    let lock = if conn.get_database_backend() == DbBackend::Sqlite { "" } else { " FOR UPDATE" };
    let sql = format!("SELECT blocked, version FROM block_pair WHERE low_id = ? AND high_id = ?{lock}");
    let row = conn.query_one_raw(statement(conn, &sql, vec![p.0.into(), p.1.into()])).await?;
    let (was, version) =
        row.map(|r| Ok::<_, DbErr>((r.try_get_by_index::<bool>(0)?, r.try_get_by_index::<i64>(1)?))).transpose()?.unwrap_or((false, 0));
    if was == blocked {
        return Ok(None);
    }
    put(conn, PairTable::Source, p, blocked, version + 1, now_ms).await?;
    Ok(Some(version + 1))
}

/// The blocked pairs `user_id` is in, from `block_pair`, with a locking read (not on SQLite):
/// on MariaDB it waits for a Block still being written, so an account's deletion never misses
/// one (see relation-svc's `lifecycle`).
///
/// # Errors
/// Database errors.
pub async fn blocked_of<C: ConnectionTrait>(conn: &C, user_id: i64) -> Result<Vec<(i64, i64)>, DbErr> {
    let lock = if conn.get_database_backend() == DbBackend::Sqlite { "" } else { " FOR UPDATE" };
    let sql = format!("SELECT low_id, high_id FROM block_pair WHERE (low_id = ? OR high_id = ?) AND blocked = ?{lock}");
    let rows = conn.query_all_raw(statement(conn, &sql, vec![user_id.into(), user_id.into(), true.into()])).await?;
    rows.iter().map(|r| Ok((r.try_get_by_index(0)?, r.try_get_by_index(1)?))).collect()
}

/// Applies a pair's (blocked, version) to message-svc's copy when `version` is newer than the
/// stored one; returns whether it applied.
///
/// # Errors
/// Database errors.
pub async fn apply_copy<C: ConnectionTrait>(conn: &C, p: (i64, i64), blocked: bool, version: i64, now_ms: i64) -> Result<bool, DbErr> {
    if !socialgraph_domain::newer_wins(get(conn, PairTable::MessageCopy, p).await?.map(|(_, stored)| stored), version) {
        return Ok(false);
    }
    put(conn, PairTable::MessageCopy, p, blocked, version, now_ms).await?;
    Ok(true)
}

/// Whether message-svc's copy holds the pair of `a` and `b` as blocked.
///
/// # Errors
/// Database errors.
pub async fn copy_blocked<C: ConnectionTrait>(conn: &C, a: i64, b: i64) -> Result<bool, DbErr> {
    Ok(get(conn, PairTable::MessageCopy, pair(a, b)).await?.is_some_and(|(blocked, _)| blocked))
}
