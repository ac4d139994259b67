//! `following_count`: how many accounts each user follows, kept by relation-svc in the
//! transaction of every change of the user's "following" edges, with a per-user version one up
//! on every such change (see the migration `m20261207_000005_create_following_count`). The
//! RelationEvents of the change carry the count and its version, so a consumer keeps followings
//! from relation events alone and the newest version wins
//! (docs/src/architecture/counters.md#where-follow-counts-come-from).
//!
//! The transaction paths recount the user's edges after their writes ([`recount`]), so a row
//! can never drift from the edges for longer than one change; the PostgreSQL single-statement
//! Follow and Unfollow move it by one under the row's lock (`cas`).

use std::collections::BTreeMap;

use sea_orm::{ConnectionTrait, DbBackend, DbErr, Value};

use crate::edges::MAX_TUPLES_PER_QUERY;

/// One user's followings with the row's version.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FollowingCount {
    /// Accounts the user follows.
    pub followings: i64,
    /// One up on every change of the user's edges (0: the row was only created).
    pub version: i64,
}

fn placeholders(n: usize) -> String {
    vec!["?"; n].join(", ")
}

/// The row of `user_id`, if there is one (unlocked).
///
/// # Errors
/// Database errors.
pub async fn get<C: ConnectionTrait>(conn: &C, user_id: i64) -> Result<Option<FollowingCount>, DbErr> {
    let sql = "SELECT followings, version FROM following_count WHERE user_id = ?";
    let row = conn.query_one_raw(crate::bound(conn.get_database_backend(), sql, vec![user_id.into()])).await?;
    row.map(|r| Ok(FollowingCount { followings: r.try_get_by_index(0)?, version: r.try_get_by_index(1)? })).transpose()
}

/// Creates the row of `user_id` from its edges (version 0) unless it exists: the single-statement
/// paths only move rows that exist.
///
/// # Errors
/// Database errors.
pub async fn ensure<C: ConnectionTrait>(conn: &C, user_id: i64) -> Result<(), DbErr> {
    let backend = conn.get_database_backend();
    let select = "SELECT ?, COUNT(*), 0 FROM following WHERE follower_id = ? AND state = 1";
    let sql = match backend {
        DbBackend::MySql => format!("INSERT IGNORE INTO following_count (user_id, followings, version) {select}"),
        _ => format!("INSERT INTO following_count (user_id, followings, version) {select} ON CONFLICT (user_id) DO NOTHING"),
    };
    conn.execute_raw(crate::bound(backend, &sql, vec![user_id.into(), user_id.into()])).await.map(|_| ())
}

/// In the transaction that changed edges of `users` (as followers), after those writes: bumps
/// each user's version (creating missing rows; users in id order, so concurrent transactions
/// lock them in one order), recounts its "following" edges under that lock and returns the
/// rows as they now are. Concurrent changes of the same user's edges wait for the lock, so the
/// count a transaction stores includes every change committed before it and its own.
///
/// # Errors
/// Database errors.
pub async fn recount<C: ConnectionTrait>(conn: &C, users: &[i64]) -> Result<BTreeMap<i64, FollowingCount>, DbErr> {
    let mut users = users.to_vec();
    users.sort_unstable();
    users.dedup();
    let backend = conn.get_database_backend();
    let mut out = BTreeMap::new();
    for chunk in users.chunks(MAX_TUPLES_PER_QUERY) {
        let ids: Vec<Value> = chunk.iter().map(|&u| u.into()).collect();
        let rows = vec!["(?, 0, 1)"; chunk.len()].join(", ");
        let bump = match backend {
            DbBackend::MySql => {
                format!("INSERT INTO following_count (user_id, followings, version) VALUES {rows} ON DUPLICATE KEY UPDATE version = version + 1")
            }
            _ => format!(
                "INSERT INTO following_count (user_id, followings, version) VALUES {rows} \
                 ON CONFLICT (user_id) DO UPDATE SET version = following_count.version + 1"
            ),
        };
        conn.execute_raw(crate::bound(backend, &bump, ids.clone())).await?;
        let count = format!(
            "UPDATE following_count SET followings = (SELECT COUNT(*) FROM following f WHERE f.follower_id = following_count.user_id AND f.state = 1) \
             WHERE user_id IN ({})",
            placeholders(chunk.len())
        );
        conn.execute_raw(crate::bound(backend, &count, ids.clone())).await?;
        let read = format!("SELECT user_id, followings, version FROM following_count WHERE user_id IN ({})", placeholders(chunk.len()));
        for r in conn.query_all_raw(crate::bound(backend, &read, ids)).await? {
            out.insert(r.try_get_by_index::<i64>(0)?, FollowingCount { followings: r.try_get_by_index(1)?, version: r.try_get_by_index(2)? });
        }
    }
    Ok(out)
}
