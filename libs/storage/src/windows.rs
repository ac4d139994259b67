//! The reads that fill the list caches (`socialgraph_cache::lists`): a list's newest followed
//! edges, and its not-followed edges (unfollowed, hidden) newer than a point, whose versions
//! the cache keeps so that a late copy of an old follow cannot bring an edge back. Both walk the
//! table's list index (owner, state, followed_at, peer).

use sea_orm::sea_query::{Expr, ExprTrait, Order};
use sea_orm::{ConnectionTrait, DbErr};
use socialgraph_domain::{Edge, EdgeState};

use crate::edges::{Col, EdgeTable, edge_from_row, select_edges};

/// The newest `limit` followed edges of `owner_id`'s list (following list in `following`,
/// follower list in `follower`), in list order: followed_at descending, peer id descending.
///
/// # Errors
/// Database errors.
pub async fn newest<C: ConnectionTrait>(conn: &C, table: EdgeTable, owner_id: i64, limit: usize) -> Result<Vec<Edge>, DbErr> {
    let (owner, peer) = table.owner_peer();
    let mut q = select_edges(table);
    q.and_where(Expr::col(owner).eq(owner_id))
        .and_where(Expr::col(Col::State).eq(EdgeState::Following.as_i16()))
        .order_by(Col::FollowedAtMs, Order::Desc)
        .order_by(peer, Order::Desc)
        .limit(limit as u64);
    conn.query_all(&q).await?.iter().map(edge_from_row).collect()
}

/// At most `limit` edges of `owner_id`'s list that are not followed (any order) and were
/// followed or changed at or after `since_ms` (all of them for `None`).
///
/// # Errors
/// Database errors.
pub async fn not_followed_since<C: ConnectionTrait>(
    conn: &C,
    table: EdgeTable,
    owner_id: i64,
    since_ms: Option<i64>,
    limit: usize,
) -> Result<Vec<Edge>, DbErr> {
    let (owner, _) = table.owner_peer();
    let mut q = select_edges(table);
    q.and_where(Expr::col(owner).eq(owner_id)).and_where(Expr::col(Col::State).ne(EdgeState::Following.as_i16())).limit(limit as u64);
    if let Some(since) = since_ms {
        q.and_where(Expr::col(Col::FollowedAtMs).gte(since));
    }
    conn.query_all(&q).await?.iter().map(edge_from_row).collect()
}

/// What a list cache's fill reads.
#[derive(Debug, Clone, Default)]
pub struct WindowRead {
    /// The newest followed edges, at most the window, in list order.
    pub followed: Vec<Edge>,
    /// (followed_at ms, peer id) of the newest followed edge left out; `None`: none was.
    pub boundary: Option<(i64, i64)>,
    /// The not-followed edges at or after the boundary's time (all of them without one).
    pub not_followed: Vec<Edge>,
}

/// Reads the newest `window` followed edges of `owner_id`'s list and the not-followed edges
/// the window needs; `None` when those are more than `not_followed_max` (the list churns too
/// much to cache).
///
/// # Errors
/// Database errors.
pub async fn read<C: ConnectionTrait>(
    conn: &C,
    table: EdgeTable,
    owner_id: i64,
    window: usize,
    not_followed_max: usize,
) -> Result<Option<WindowRead>, DbErr> {
    let mut followed = newest(conn, table, owner_id, window + 1).await?;
    let boundary = (followed.len() > window).then(|| followed.pop()).flatten().map(|e| (e.followed_at_ms, table.peer_of(&e)));
    let not_followed = not_followed_since(conn, table, owner_id, boundary.map(|b| b.0), not_followed_max + 1).await?;
    Ok((not_followed.len() <= not_followed_max).then_some(WindowRead { followed, boundary, not_followed }))
}
