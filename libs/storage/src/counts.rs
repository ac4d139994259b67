//! `edge_count`: followings and followers of each user per the projection, with a per-user
//! `version` that grows by one on every change. projection-svc changes it in the transaction
//! that applies relation events (so it is exact at every stored offset); counter-svc copies the
//! absolute values and keeps only the newest version it has seen, which makes duplicated,
//! replayed and reordered events harmless to the user counters.

use sea_orm::sea_query::{Alias, Expr, ExprTrait, Query};
use sea_orm::{ConnectionTrait, DbBackend, DbErr};
use socialgraph_domain::EdgeState;

use crate::edges::{Col, MAX_TUPLES_PER_QUERY};

/// One user's row of `edge_count` (all zero with version 0 when the user has none).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EdgeCount {
    /// The user.
    pub user_id: i64,
    /// Accounts the user follows.
    pub followings: i64,
    /// Accounts following the user.
    pub followers: i64,
    /// Bumped by one on every change of either count; 0 = never counted.
    pub version: i64,
}

/// A change of one user's counts (edges gained minus edges lost).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CountDelta {
    /// The user.
    pub user_id: i64,
    /// Change of followings.
    pub followings: i64,
    /// Change of followers.
    pub followers: i64,
}

/// Adds `deltas` in one multi-row upsert per 500 users (on PostgreSQL one for all), bumping each touched row's version.
/// Rows are written in user-id order, so concurrent batches lock them in one order and cannot
/// deadlock on each other. Zero deltas are skipped.
///
/// # Errors
/// Database errors.
pub async fn add<C: ConnectionTrait>(conn: &C, deltas: &[CountDelta]) -> Result<(), DbErr> {
    let mut rows: Vec<CountDelta> = deltas.iter().copied().filter(|d| d.followings != 0 || d.followers != 0).collect();
    rows.sort_by_key(|d| d.user_id);
    if crate::pg_bulk::is_postgres(conn) {
        return crate::pg_bulk::add_counts(conn, &rows).await;
    }
    let tail = match conn.get_database_backend() {
        DbBackend::MySql => {
            " ON DUPLICATE KEY UPDATE followings = followings + VALUES(followings), \
             followers = followers + VALUES(followers), version = version + 1"
        }
        _ => {
            " ON CONFLICT (user_id) DO UPDATE SET followings = edge_count.followings + excluded.followings, \
             followers = edge_count.followers + excluded.followers, version = edge_count.version + 1"
        }
    };
    for chunk in rows.chunks(MAX_TUPLES_PER_QUERY) {
        // Integers only, so they are written into the statement (one text for all backends).
        let values: Vec<String> = chunk.iter().map(|d| format!("({}, {}, {}, 1)", d.user_id, d.followings, d.followers)).collect();
        let sql = format!("INSERT INTO edge_count (user_id, followings, followers, version) VALUES {}{tail}", values.join(", "));
        conn.execute_unprepared(&sql).await?;
    }
    Ok(())
}

/// The rows of `users`, in request order (a user without a row gets zeros and version 0).
///
/// # Errors
/// Database errors.
pub async fn get_many<C: ConnectionTrait>(conn: &C, users: &[i64]) -> Result<Vec<EdgeCount>, DbErr> {
    let mut rows = Vec::new();
    if crate::pg_bulk::is_postgres(conn) {
        const SQL: &str = "SELECT user_id, followings, followers, version FROM edge_count WHERE user_id = ANY($1)";
        rows = crate::pg_bulk::ids_rows(conn, SQL, users).await?;
    } else {
        for chunk in users.chunks(MAX_TUPLES_PER_QUERY) {
            let q = Query::select()
                .columns(["user_id", "followings", "followers", "version"].map(Alias::new))
                .from(Alias::new("edge_count"))
                .and_where(Expr::col(Alias::new("user_id")).is_in(chunk.iter().copied()))
                .to_owned();
            rows.extend(conn.query_all(&q).await?);
        }
    }
    let mut found = std::collections::HashMap::with_capacity(users.len());
    for row in rows {
        let c = EdgeCount {
            user_id: row.try_get_by_index(0)?,
            followings: row.try_get_by_index(1)?,
            followers: row.try_get_by_index(2)?,
            version: row.try_get_by_index(3)?,
        };
        found.insert(c.user_id, c);
    }
    Ok(users.iter().map(|u| found.get(u).copied().unwrap_or(EdgeCount { user_id: *u, ..EdgeCount::default() })).collect())
}

/// Recounts `users` from the `follower` table and corrects the rows that differ (bumping their
/// version); used after the projection's rows were repaired outside the event flow. Returns how
/// many rows were corrected.
///
/// The users' `edge_count` rows are locked first, as an applying batch locks them: a batch that
/// committed before is counted in both the row and the `follower` rows, one that commits after
/// waits and adds its change to the corrected row. (Read without the lock, a batch committing
/// between the row's read and the count would be counted twice on PostgreSQL, whose statements
/// each see the newest commits.) `conn` must be a transaction.
///
/// # Errors
/// Database errors.
pub async fn recount<C: ConnectionTrait>(conn: &C, users: &[i64]) -> Result<u64, DbErr> {
    crate::feed::lock_authors(conn, users).await?;
    let stored = get_many(conn, users).await?;
    let mut deltas = Vec::new();
    for s in stored {
        let followings = count_follower_rows(conn, Col::FollowerId, s.user_id).await?;
        let followers = count_follower_rows(conn, Col::FolloweeId, s.user_id).await?;
        if followings != s.followings || followers != s.followers {
            deltas.push(CountDelta { user_id: s.user_id, followings: followings - s.followings, followers: followers - s.followers });
        }
    }
    add(conn, &deltas).await?;
    Ok(deltas.len() as u64)
}

async fn count_follower_rows<C: ConnectionTrait>(conn: &C, col: Col, user_id: i64) -> Result<i64, DbErr> {
    crate::edges::count(conn, crate::edges::EdgeTable::Follower, col, user_id).await
}

/// The count change of one edge moving from `old` (None: never stored) to `new`: -1, 0 or +1,
/// for both the follower's followings and the followee's followers.
pub fn transition(old: Option<EdgeState>, new: EdgeState) -> i64 {
    let was = old == Some(EdgeState::Following);
    match (was, new == EdgeState::Following) {
        (false, true) => 1,
        (true, false) => -1,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_change_of_state_moves_the_counts() {
        assert_eq!(transition(None, EdgeState::Following), 1);
        assert_eq!(transition(None, EdgeState::NotFollowing), 0);
        assert_eq!(transition(Some(EdgeState::NotFollowing), EdgeState::Following), 1);
        assert_eq!(transition(Some(EdgeState::Following), EdgeState::Following), 0);
        assert_eq!(transition(Some(EdgeState::Following), EdgeState::NotFollowing), -1);
        assert_eq!(transition(Some(EdgeState::NotFollowing), EdgeState::NotFollowing), 0);
    }
}
