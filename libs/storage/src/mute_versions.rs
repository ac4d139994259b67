//! Mutes as versioned rows (see the migration `m20261207_000004_create_mute_versions`):
//! `mute_version`, relation-svc's record of whether `muter_id` mutes `muted_id`, with a version
//! one up on every change; and `timeline_mute_copy`, projection-svc's copy of it, kept from the
//! AccountEvents (kind MUTE) that carry each change (the newest version wins), which timeline
//! reads filter by with no call to relation-svc.
//!
//! Statements bind their values, so one text serves PostgreSQL, MySQL/MariaDB and SQLite.

use sea_orm::{ConnectionTrait, DbBackend, DbErr};

use crate::block_pairs::{put_flag, statement};

/// The two tables of the same shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MuteTable {
    /// `mute_version`: the source (relation-svc).
    Source,
    /// `timeline_mute_copy`: projection-svc's copy.
    TimelineCopy,
}

impl MuteTable {
    fn name(self) -> &'static str {
        match self {
            Self::Source => "mute_version",
            Self::TimelineCopy => "timeline_mute_copy",
        }
    }
}

const COLUMNS: (&str, &str, &str) = ("muter_id", "muted_id", "muted");

/// The stored (muted, version) of `(muter, muted)` in `table`, if it has a row; locked for the
/// transaction's rest when `for_update` (not on SQLite, which serializes writers).
///
/// # Errors
/// Database errors.
pub async fn get<C: ConnectionTrait>(conn: &C, table: MuteTable, (muter, muted): (i64, i64), for_update: bool) -> Result<Option<(bool, i64)>, DbErr> {
    let lock = if for_update && conn.get_database_backend() != DbBackend::Sqlite { " FOR UPDATE" } else { "" };
    let sql = format!("SELECT muted, version FROM {} WHERE muter_id = ? AND muted_id = ?{lock}", table.name());
    let row = conn.query_one_raw(statement(conn, &sql, vec![muter.into(), muted.into()])).await?;
    row.map(|r| Ok((r.try_get_by_index::<bool>(0)?, r.try_get_by_index::<i64>(1)?))).transpose()
}

/// Sets whether `muter` mutes `muted` in `mute_version`, in the transaction of a change of the
/// `mute` row, and returns the new version. The version moves even when the stored flag says
/// so already: a `mute` row changed by a relation-svc of the release before (during a rolling
/// upgrade) left the flag behind, and this change's event brings the copies back in line.
///
/// # Errors
/// Database errors.
pub async fn set<C: ConnectionTrait>(conn: &C, muter: i64, muted: i64, on: bool, now_ms: i64) -> Result<i64, DbErr> {
    let version = get(conn, MuteTable::Source, (muter, muted), true).await?.map_or(0, |(_, v)| v) + 1;
    put_flag(conn, MuteTable::Source.name(), COLUMNS, (muter, muted), on, version, now_ms).await?;
    Ok(version)
}

/// The (muter, muted) pairs `user_id` is in, either side, that are muted in `mute_version`,
/// with a locking read (not on SQLite, which serializes writers): on MariaDB it waits for a
/// Mute still being written, so an account's deletion never misses one (see relation-svc's
/// `lifecycle`).
///
/// # Errors
/// Database errors.
pub async fn muted_of<C: ConnectionTrait>(conn: &C, user_id: i64) -> Result<Vec<(i64, i64)>, DbErr> {
    let lock = if conn.get_database_backend() == DbBackend::Sqlite { "" } else { " FOR UPDATE" };
    let sql = format!("SELECT muter_id, muted_id FROM mute_version WHERE (muter_id = ? OR muted_id = ?) AND muted = ?{lock}");
    let rows = conn.query_all_raw(statement(conn, &sql, vec![user_id.into(), user_id.into(), true.into()])).await?;
    rows.iter().map(|r| Ok((r.try_get_by_index(0)?, r.try_get_by_index(1)?))).collect()
}

/// Applies (muted, version) of `(muter, muted)` to projection-svc's copy when `version` is newer
/// than the stored one; returns whether it applied.
///
/// # Errors
/// Database errors.
pub async fn apply_copy<C: ConnectionTrait>(conn: &C, key: (i64, i64), on: bool, version: i64, now_ms: i64) -> Result<bool, DbErr> {
    if !socialgraph_domain::newer_wins(get(conn, MuteTable::TimelineCopy, key, true).await?.map(|(_, stored)| stored), version) {
        return Ok(false);
    }
    put_flag(conn, MuteTable::TimelineCopy.name(), COLUMNS, key, on, version, now_ms).await?;
    Ok(true)
}

/// Whom `viewer` mutes in projection-svc's copy, at most `limit`.
///
/// # Errors
/// Database errors.
pub async fn copy_muted_by<C: ConnectionTrait>(conn: &C, viewer: i64, limit: usize) -> Result<Vec<i64>, DbErr> {
    let sql = "SELECT muted_id FROM timeline_mute_copy WHERE muter_id = ? AND muted = ? ORDER BY muted_id LIMIT ?";
    let rows = conn.query_all_raw(statement(conn, sql, vec![viewer.into(), true.into(), (limit as i64).into()])).await?;
    rows.iter().map(|r| r.try_get_by_index(0)).collect()
}
