//! The `following` table (keyed follower → followee) and its projection `follower` (keyed
//! followee → follower): identical columns, read and written through one [`EdgeTable`].

use sea_orm::sea_query::{Alias, Cond, Expr, ExprTrait, JoinType, LockType, OnConflict, Order, Query, SelectStatement};
use sea_orm::{ConnectionTrait, DbErr, QueryResult};
pub use socialgraph_domain::ListEntry;
use socialgraph_domain::{Cursor, Edge, EdgeState};

/// Column names of the edge tables.
#[derive(Clone, Copy, sea_orm::DeriveIden)]
pub enum Col {
    /// `follower_id`
    FollowerId,
    /// `followee_id`
    FolloweeId,
    /// `state`
    State,
    /// `version`
    Version,
    /// `followed_at_ms`
    FollowedAtMs,
    /// `updated_at_ms`
    UpdatedAtMs,
    /// `blocked` (`following` only): either user of the pair blocks the other.
    Blocked,
}

const COLS: [Col; 6] = [Col::FollowerId, Col::FolloweeId, Col::State, Col::Version, Col::FollowedAtMs, Col::UpdatedAtMs];

/// Which edge table a call addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EdgeTable {
    /// `following`, the source of truth; its key starts with follower_id.
    Following,
    /// `follower`, the projection; its key starts with followee_id.
    Follower,
}

impl EdgeTable {
    pub(crate) fn name(self) -> Alias {
        Alias::new(match self {
            Self::Following => "following",
            Self::Follower => "follower",
        })
    }

    /// The peer of `e` in this table's lists (followee in `following`, follower in `follower`).
    pub fn peer_of(self, e: &Edge) -> i64 {
        match self {
            Self::Following => e.followee_id,
            Self::Follower => e.follower_id,
        }
    }

    /// The key's leading column (the table's shard key) and the peer column.
    pub(crate) fn owner_peer(self) -> (Col, Col) {
        match self {
            Self::Following => (Col::FollowerId, Col::FolloweeId),
            Self::Follower => (Col::FolloweeId, Col::FollowerId),
        }
    }
}

pub(crate) fn edge_from_row(row: &QueryResult) -> Result<Edge, DbErr> {
    Ok(Edge {
        follower_id: row.try_get_by_index(0)?,
        followee_id: row.try_get_by_index(1)?,
        state: EdgeState::from_i16(row.try_get_by_index(2)?),
        version: row.try_get_by_index(3)?,
        followed_at_ms: row.try_get_by_index(4)?,
        updated_at_ms: row.try_get_by_index(5)?,
    })
}

/// The edge's column values in table order (follower_id, followee_id, state, version,
/// followed_at_ms, updated_at_ms).
pub(crate) fn column_values(e: &Edge) -> [sea_orm::Value; 6] {
    [e.follower_id.into(), e.followee_id.into(), e.state.as_i16().into(), e.version.into(), e.followed_at_ms.into(), e.updated_at_ms.into()]
}

pub(crate) fn select_edges(table: EdgeTable) -> SelectStatement {
    Query::select().columns(COLS).from(table.name()).to_owned()
}

/// Reads one edge; with `for_update` the row is locked until the transaction ends
/// (PostgreSQL/MySQL; SQLite serializes writers anyway).
///
/// # Errors
/// Database errors.
pub async fn get<C: ConnectionTrait>(
    conn: &C,
    table: EdgeTable,
    follower_id: i64,
    followee_id: i64,
    for_update: bool,
) -> Result<Option<Edge>, DbErr> {
    let mut q = select_edges(table);
    q.and_where(Expr::col(Col::FollowerId).eq(follower_id)).and_where(Expr::col(Col::FolloweeId).eq(followee_id));
    if for_update {
        q.lock(LockType::Update);
    }
    conn.query_one(&q).await?.as_ref().map(edge_from_row).transpose()
}

/// Reads one `following` row with its `blocked` flag, for a write that must refuse a blocked
/// pair; with `for_update` the row is locked until the transaction ends.
///
/// # Errors
/// Database errors.
pub async fn get_following<C: ConnectionTrait>(
    conn: &C,
    follower_id: i64,
    followee_id: i64,
    for_update: bool,
) -> Result<Option<(Edge, bool)>, DbErr> {
    let mut q = select_edges(EdgeTable::Following);
    q.column(Col::Blocked).and_where(Expr::col(Col::FollowerId).eq(follower_id)).and_where(Expr::col(Col::FolloweeId).eq(followee_id));
    if for_update {
        q.lock(LockType::Update);
    }
    match conn.query_one(&q).await? {
        Some(row) => Ok(Some((edge_from_row(&row)?, row.try_get_by_index(6)?))),
        None => Ok(None),
    }
}

/// What a Follow reads before deciding: the edge's row with its `blocked` flag (`None`: no
/// row) and whether the followee's account is locked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FollowPreRead {
    /// The `following` row and its `blocked` flag.
    pub row: Option<(Edge, bool)>,
    /// The followee's account is locked (follows become requests).
    pub followee_locked: bool,
}

/// Reads, in one unlocked query, the `following` row follower → followee with its `blocked`
/// flag and the followee's `account.locked`.
///
/// # Errors
/// Database errors.
pub async fn follow_pre_read<C: ConnectionTrait>(conn: &C, follower_id: i64, followee_id: i64) -> Result<FollowPreRead, DbErr> {
    const SQL: &str = "SELECT f.follower_id, f.followee_id, f.state, f.version, f.followed_at_ms, f.updated_at_ms, f.blocked, \
        (SELECT a.locked FROM account a WHERE a.user_id = ?) AS locked \
        FROM (SELECT 1 AS one) AS o LEFT JOIN following f ON f.follower_id = ? AND f.followee_id = ?";
    let backend = conn.get_database_backend();
    let sql = if backend == sea_orm::DbBackend::Postgres {
        let mut n = 0;
        SQL.chars()
            .map(|c| {
                if c == '?' {
                    n += 1;
                    format!("${n}")
                } else {
                    c.to_string()
                }
            })
            .collect()
    } else {
        SQL.to_owned()
    };
    let values: [sea_orm::Value; 3] = [followee_id.into(), follower_id.into(), followee_id.into()];
    let Some(r) = conn.query_one_raw(sea_orm::Statement::from_sql_and_values(backend, sql, values)).await? else {
        return Ok(FollowPreRead { row: None, followee_locked: false });
    };
    let followee_locked = r.try_get_by_index::<Option<bool>>(7)?.unwrap_or(false);
    let row = match r.try_get_by_index::<Option<i64>>(0)? {
        Some(_) => Some((edge_from_row(&r)?, r.try_get_by_index(6)?)),
        None => None,
    };
    Ok(FollowPreRead { row, followee_locked })
}

/// Sets the `blocked` flag of the `following` row follower → followee, creating the row (state
/// not following, version 0, followed_at 0) when the pair never followed, so that a concurrent
/// first Follow of the pair meets the row and its flag. Takes the row's lock.
///
/// # Errors
/// Database errors.
pub async fn mark_blocked<C: ConnectionTrait>(conn: &C, follower_id: i64, followee_id: i64, blocked: bool, now_ms: i64) -> Result<(), DbErr> {
    let q = Query::insert()
        .into_table(EdgeTable::Following.name())
        .columns(COLS.into_iter().chain([Col::Blocked]))
        .values_panic([
            follower_id.into(),
            followee_id.into(),
            EdgeState::NotFollowing.as_i16().into(),
            0_i64.into(),
            0_i64.into(),
            now_ms.into(),
            blocked.into(),
        ])
        .on_conflict(OnConflict::columns([Col::FollowerId, Col::FolloweeId]).update_column(Col::Blocked).to_owned())
        .to_owned();
    conn.execute(&q).await.map(|_| ())
}

/// The pairs among `pairs` whose `following` row is marked blocked.
///
/// # Errors
/// Database errors.
pub async fn blocked_among<C: ConnectionTrait>(conn: &C, pairs: &[(i64, i64)]) -> Result<std::collections::HashSet<(i64, i64)>, DbErr> {
    if crate::pg_bulk::is_postgres(conn) {
        return Ok(crate::pg_bulk::blocked_pairs(conn, pairs).await?.into_iter().collect());
    }
    let mut out = std::collections::HashSet::new();
    for chunk in pairs.chunks(MAX_TUPLES_PER_QUERY) {
        let q = Query::select()
            .columns([Col::FollowerId, Col::FolloweeId])
            .from(EdgeTable::Following.name())
            .and_where(Expr::tuple([Expr::col(Col::FollowerId), Expr::col(Col::FolloweeId)]).in_tuples(chunk.iter().copied()))
            .and_where(Expr::col(Col::Blocked).eq(true))
            .to_owned();
        for row in conn.query_all(&q).await? {
            out.insert((row.try_get_by_index(0)?, row.try_get_by_index(1)?));
        }
    }
    Ok(out)
}

/// Reads the edges among `pairs` (follower_id, followee_id) that exist, each once (however
/// often it is asked), in no particular order; with `for_update` they are locked.
///
/// # Errors
/// Database errors.
pub async fn get_many<C: ConnectionTrait>(conn: &C, table: EdgeTable, pairs: &[(i64, i64)], for_update: bool) -> Result<Vec<Edge>, DbErr> {
    if crate::pg_bulk::is_postgres(conn) {
        return crate::pg_bulk::get_edges(conn, table, pairs, for_update).await;
    }
    // Each pair once (a pair repeated in another chunk would come back twice), in key order.
    let mut pairs = pairs.to_vec();
    pairs.sort_unstable();
    pairs.dedup();
    let mut out = Vec::with_capacity(pairs.len());
    // A row-value IN list is an OR chain to the planner: thousands of tuples can exceed its
    // stack depth, so ask in chunks.
    for chunk in pairs.chunks(MAX_TUPLES_PER_QUERY) {
        let mut q = select_edges(table);
        q.and_where(Expr::tuple([Expr::col(Col::FollowerId), Expr::col(Col::FolloweeId)]).in_tuples(chunk.iter().copied()));
        if for_update {
            q.lock(LockType::Update);
        }
        for row in conn.query_all(&q).await? {
            out.push(edge_from_row(&row)?);
        }
    }
    Ok(out)
}

/// Most (follower, followee) tuples in one `IN` list.
pub const MAX_TUPLES_PER_QUERY: usize = 500;

/// Inserts new edges in one statement.
///
/// # Errors
/// Database errors, including a unique violation when a row already exists (callers retry).
pub async fn insert<C: ConnectionTrait>(conn: &C, table: EdgeTable, edges: &[Edge]) -> Result<(), DbErr> {
    if edges.is_empty() {
        return Ok(());
    }
    if crate::pg_bulk::is_postgres(conn) {
        return crate::pg_bulk::insert_edges(conn, table, edges).await;
    }
    let mut q = Query::insert().into_table(table.name()).columns(COLS).to_owned();
    for e in edges {
        q.values_panic(column_values(e).map(Expr::from));
    }
    conn.execute(&q).await.map(|_| ())
}

/// Overwrites state, version and times of an existing edge.
///
/// # Errors
/// Database errors.
pub async fn update<C: ConnectionTrait>(conn: &C, table: EdgeTable, e: &Edge) -> Result<(), DbErr> {
    let q = Query::update()
        .table(table.name())
        .value(Col::State, e.state.as_i16())
        .value(Col::Version, e.version)
        .value(Col::FollowedAtMs, e.followed_at_ms)
        .value(Col::UpdatedAtMs, e.updated_at_ms)
        .and_where(Expr::col(Col::FollowerId).eq(e.follower_id))
        .and_where(Expr::col(Col::FolloweeId).eq(e.followee_id))
        .to_owned();
    conn.execute(&q).await.map(|_| ())
}

/// Deletes one edge row (projection repair only).
///
/// # Errors
/// Database errors.
pub async fn delete<C: ConnectionTrait>(conn: &C, table: EdgeTable, follower_id: i64, followee_id: i64) -> Result<(), DbErr> {
    let q = Query::delete()
        .from_table(table.name())
        .and_where(Expr::col(Col::FollowerId).eq(follower_id))
        .and_where(Expr::col(Col::FolloweeId).eq(followee_id))
        .to_owned();
    conn.execute(&q).await.map(|_| ())
}

/// Number of "following" edges whose `col` is `user_id` (in `following`: followings of the
/// user when `col` is follower_id; in `follower`: its followers when `col` is followee_id).
///
/// # Errors
/// Database errors.
pub async fn count<C: ConnectionTrait>(conn: &C, table: EdgeTable, col: Col, user_id: i64) -> Result<i64, DbErr> {
    let q = Query::select()
        .expr(Expr::col(col).count())
        .from(table.name())
        .and_where(Expr::col(col).eq(user_id))
        .and_where(Expr::col(Col::State).eq(EdgeState::Following.as_i16()))
        .to_owned();
    match conn.query_one(&q).await? {
        Some(row) => row.try_get_by_index(0),
        None => Ok(0),
    }
}

/// The `following` rows between `user_id` and each of `peers`, in one direction: with
/// `outgoing` the edges user → peer, else peer → user. On PostgreSQL the peers travel as one
/// array ([`crate::pg_bulk`]); elsewhere as an `IN` list on top of the user's id. Either
/// direction is one primary-key probe per peer.
///
/// # Errors
/// Database failure.
pub async fn between<C: ConnectionTrait>(conn: &C, user_id: i64, peers: &[i64], outgoing: bool) -> Result<Vec<Edge>, DbErr> {
    if crate::pg_bulk::is_postgres(conn) {
        return crate::pg_bulk::edges_between(conn, user_id, peers, outgoing).await;
    }
    let (owner, peer) = if outgoing { (Col::FollowerId, Col::FolloweeId) } else { (Col::FolloweeId, Col::FollowerId) };
    let mut out = Vec::with_capacity(peers.len());
    for chunk in peers.chunks(MAX_TUPLES_PER_QUERY) {
        let mut q = select_edges(EdgeTable::Following);
        q.and_where(Expr::col(owner).eq(user_id)).and_where(Expr::col(peer).is_in(chunk.iter().copied()));
        for row in conn.query_all(&q).await? {
            out.push(edge_from_row(&row)?);
        }
    }
    Ok(out)
}

/// Keyset condition "strictly after `cursor`" in (followed_at_ms, peer) descending order.
fn after_cursor(ts: Expr, peer: Expr, cursor: Cursor) -> Cond {
    Cond::any().add(ts.clone().lt(cursor.followed_at_ms)).add(Cond::all().add(ts.eq(cursor.followed_at_ms)).add(peer.lt(cursor.peer_id)))
}

/// One page of the owner's list (following list of a follower in `following`, follower list
/// of a followee in `follower`): state "following", newest follow first, ties by peer id
/// descending, strictly after `after`. Served by the table's list index.
///
/// # Errors
/// Database errors.
pub async fn list<C: ConnectionTrait>(
    conn: &C,
    table: EdgeTable,
    owner_id: i64,
    after: Option<Cursor>,
    limit: usize,
) -> Result<Vec<ListEntry>, DbErr> {
    let (owner, peer) = table.owner_peer();
    let mut q = Query::select()
        .columns([peer, Col::FollowedAtMs])
        .from(table.name())
        .and_where(Expr::col(owner).eq(owner_id))
        .and_where(Expr::col(Col::State).eq(EdgeState::Following.as_i16()))
        .order_by(Col::FollowedAtMs, Order::Desc)
        .order_by(peer, Order::Desc)
        .limit(limit as u64)
        .to_owned();
    if let Some(c) = after {
        q.cond_where(after_cursor(Expr::col(Col::FollowedAtMs), Expr::col(peer), c));
    }
    entries(conn, &q).await
}

async fn entries<C: ConnectionTrait>(conn: &C, q: &SelectStatement) -> Result<Vec<ListEntry>, DbErr> {
    conn.query_all(q).await?.iter().map(|r| Ok(ListEntry { user_id: r.try_get_by_index(0)?, followed_at_ms: r.try_get_by_index(1)? })).collect()
}

/// A self-join of `following`: rows `a` of `a_owner` (walked newest first through the list
/// index) whose peer satisfies a primary-key probe into `b`.
fn join_page(a_owner: i64, probe: Cond, after: Option<Cursor>, limit: usize) -> SelectStatement {
    let (a, b) = (Alias::new("a"), Alias::new("b"));
    let following = EdgeTable::Following.name();
    let mut q = Query::select()
        .column((a.clone(), Col::FolloweeId))
        .column((a.clone(), Col::FollowedAtMs))
        .from_as(following.clone(), a.clone())
        .join_as(JoinType::InnerJoin, following, b.clone(), probe)
        .and_where(Expr::col((a.clone(), Col::FollowerId)).eq(a_owner))
        .and_where(Expr::col((a.clone(), Col::State)).eq(EdgeState::Following.as_i16()))
        .and_where(Expr::col((b.clone(), Col::State)).eq(EdgeState::Following.as_i16()))
        .order_by((a.clone(), Col::FollowedAtMs), Order::Desc)
        .order_by((a.clone(), Col::FolloweeId), Order::Desc)
        .limit(limit as u64)
        .to_owned();
    if let Some(c) = after {
        q.cond_where(after_cursor(Expr::col((a.clone(), Col::FollowedAtMs)), Expr::col((a, Col::FolloweeId)), c));
    }
    q
}

/// Accounts both `user_id` and `other_id` follow, ordered by `user_id`'s follow time, newest
/// first. Walks `user_id`'s list index and probes `(other_id, peer)` by primary key.
///
/// # Errors
/// Database errors.
pub async fn list_common<C: ConnectionTrait>(
    conn: &C,
    user_id: i64,
    other_id: i64,
    after: Option<Cursor>,
    limit: usize,
) -> Result<Vec<ListEntry>, DbErr> {
    let (a, b) = (Alias::new("a"), Alias::new("b"));
    let probe =
        Cond::all().add(Expr::col((b.clone(), Col::FollowerId)).eq(other_id)).add(Expr::col((b, Col::FolloweeId)).equals((a, Col::FolloweeId)));
    entries(conn, &join_page(user_id, probe, after, limit)).await
}

/// Accounts `viewer_id` follows that follow `user_id`, ordered by the viewer's follow time,
/// newest first. Walks the viewer's list index and probes `(peer, user_id)` by primary key.
///
/// # Errors
/// Database errors.
pub async fn list_familiar<C: ConnectionTrait>(
    conn: &C,
    viewer_id: i64,
    user_id: i64,
    after: Option<Cursor>,
    limit: usize,
) -> Result<Vec<ListEntry>, DbErr> {
    let (a, b) = (Alias::new("a"), Alias::new("b"));
    let probe =
        Cond::all().add(Expr::col((b.clone(), Col::FollowerId)).equals((a, Col::FolloweeId))).add(Expr::col((b, Col::FolloweeId)).eq(user_id));
    entries(conn, &join_page(viewer_id, probe, after, limit)).await
}

/// Filters and position of a primary-key-order scan of an edge table.
#[derive(Debug, Clone, Copy, Default)]
pub struct ScanFilter {
    /// Resume strictly after this (follower_id, followee_id).
    pub after: Option<(i64, i64)>,
    /// Only this follower when set.
    pub follower_id: Option<i64>,
    /// Only this followee when set.
    pub followee_id: Option<i64>,
}

/// Up to `limit` rows of `table` (all states) in (follower_id, followee_id) order. Rows of
/// version 0 (made by a block for a pair that never followed; no event ever named them) are
/// not edges and are left out.
///
/// # Errors
/// Database errors.
pub async fn scan<C: ConnectionTrait>(conn: &C, table: EdgeTable, f: ScanFilter, limit: usize) -> Result<Vec<Edge>, DbErr> {
    let mut q = select_edges(table);
    q.and_where(Expr::col(Col::Version).gt(0));
    q.order_by(Col::FollowerId, Order::Asc).order_by(Col::FolloweeId, Order::Asc).limit(limit as u64);
    if let Some((fr, fe)) = f.after {
        q.cond_where(
            Cond::any()
                .add(Expr::col(Col::FollowerId).gt(fr))
                .add(Cond::all().add(Expr::col(Col::FollowerId).eq(fr)).add(Expr::col(Col::FolloweeId).gt(fe))),
        );
    }
    if let Some(id) = f.follower_id {
        q.and_where(Expr::col(Col::FollowerId).eq(id));
    }
    if let Some(id) = f.followee_id {
        q.and_where(Expr::col(Col::FolloweeId).eq(id));
    }
    conn.query_all(&q).await?.iter().map(edge_from_row).collect()
}
