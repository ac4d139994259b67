//! The `account` table (accounts that are not plainly active, and the progress of their edge
//! job) and the batch reads and writes of an account's edges that the job makes.

use std::collections::HashSet;

use sea_orm::sea_query::{Alias, Cond, Expr, ExprTrait, LockType, OnConflict, Query};
use sea_orm::{ConnectionTrait, DbBackend, DbErr, Statement};
use socialgraph_domain::{Edge, EdgeState};

use crate::edges::{Col, MAX_TUPLES_PER_QUERY};

/// An account's lifecycle state (`account.status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccountStatus {
    /// 0: active (also every id without a row).
    Active = 0,
    /// 1: deactivated by its owner; reversible.
    Deactivated = 1,
    /// 2: suspended by an administrator; reversible by one.
    Suspended = 2,
    /// 3: being deleted; irreversible. The row goes when every edge has ended.
    Deleting = 3,
}

impl AccountStatus {
    fn from_i16(v: i16) -> Self {
        match v {
            1 => Self::Deactivated,
            2 => Self::Suspended,
            3 => Self::Deleting,
            _ => Self::Active,
        }
    }
}

/// What the account's edge job still has to do (`account.job`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccountJob {
    /// 0: nothing.
    None = 0,
    /// 1: hide every "following" edge of the account (both directions).
    Hide = 1,
    /// 2: make its hidden edges "following" again where the other user is active.
    Restore = 2,
    /// 3: end every edge (both directions), then drop restrictions and the row.
    Delete = 3,
}

impl AccountJob {
    fn from_i16(v: i16) -> Self {
        match v {
            1 => Self::Hide,
            2 => Self::Restore,
            3 => Self::Delete,
            _ => Self::None,
        }
    }
}

/// One `account` row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Account {
    /// The user.
    pub user_id: i64,
    /// Lifecycle state.
    pub status: AccountStatus,
    /// The job in progress.
    pub job: AccountJob,
    /// Edges the current job changed so far.
    pub edges_done: i64,
    /// PostgreSQL only: a transaction id taken after the status changed; the job finishes only
    /// once no transaction at or before it is still running (0: not taken yet).
    pub status_xid: i64,
    /// When the status last changed, ms since the epoch.
    pub changed_at_ms: i64,
    /// Follows of this account are requests until it approves them.
    pub locked: bool,
}

impl Account {
    /// The row an id without one stands for: active, no job.
    pub fn active(user_id: i64) -> Self {
        Self { user_id, status: AccountStatus::Active, job: AccountJob::None, edges_done: 0, status_xid: 0, changed_at_ms: 0, locked: false }
    }
}

fn table() -> Alias {
    Alias::new("account")
}

const COLS: [&str; 7] = ["user_id", "status", "job", "edges_done", "status_xid", "changed_at_ms", "locked"];

/// Reads one account (`None`: no row, i.e. active and not locked); with `lock` the row is
/// locked (`LockType::Share` or `Update`) until the transaction ends.
///
/// # Errors
/// Database errors.
pub async fn get_locked<C: ConnectionTrait>(conn: &C, user_id: i64, lock: Option<LockType>) -> Result<Option<Account>, DbErr> {
    let mut q = Query::select().columns(COLS.map(Alias::new)).from(table()).and_where(Expr::col(Alias::new("user_id")).eq(user_id)).to_owned();
    if let Some(l) = lock {
        q.lock(l);
    }
    let Some(r) = conn.query_one(&q).await? else { return Ok(None) };
    Ok(Some(Account {
        user_id: r.try_get_by_index(0)?,
        status: AccountStatus::from_i16(r.try_get_by_index(1)?),
        job: AccountJob::from_i16(r.try_get_by_index(2)?),
        edges_done: r.try_get_by_index(3)?,
        status_xid: r.try_get_by_index(4)?,
        changed_at_ms: r.try_get_by_index(5)?,
        locked: r.try_get_by_index(6)?,
    }))
}

/// Reads one account (`None`: no row); with `for_update` the row is locked for update.
///
/// # Errors
/// Database errors.
pub async fn get<C: ConnectionTrait>(conn: &C, user_id: i64, for_update: bool) -> Result<Option<Account>, DbErr> {
    get_locked(conn, user_id, for_update.then_some(LockType::Update)).await
}

/// Writes `a` whole (insert or overwrite).
///
/// # Errors
/// Database errors.
pub async fn put<C: ConnectionTrait>(conn: &C, a: &Account) -> Result<(), DbErr> {
    let q = Query::insert()
        .into_table(table())
        .columns(COLS.map(Alias::new))
        .values_panic([
            a.user_id.into(),
            (a.status as i16).into(),
            (a.job as i16).into(),
            a.edges_done.into(),
            a.status_xid.into(),
            a.changed_at_ms.into(),
            a.locked.into(),
        ])
        .on_conflict(OnConflict::column(Alias::new("user_id")).update_columns(COLS[1..].iter().map(|c| Alias::new(*c))).to_owned())
        .to_owned();
    conn.execute(&q).await.map(|_| ())
}

/// Deletes the account's row (its id is then a fresh, active account).
///
/// # Errors
/// Database errors.
pub async fn delete<C: ConnectionTrait>(conn: &C, user_id: i64) -> Result<(), DbErr> {
    let q = Query::delete().from_table(table()).and_where(Expr::col(Alias::new("user_id")).eq(user_id)).to_owned();
    conn.execute(&q).await.map(|_| ())
}

/// The users among `users` whose account is not active.
///
/// # Errors
/// Database errors.
pub async fn inactive_among<C: ConnectionTrait>(conn: &C, users: &[i64]) -> Result<HashSet<i64>, DbErr> {
    if crate::pg_bulk::is_postgres(conn) {
        let sql = format!("SELECT user_id FROM account WHERE user_id = ANY($1) AND status <> {}", AccountStatus::Active as i16);
        return Ok(crate::pg_bulk::ids_query(conn, &sql, users).await?.into_iter().collect());
    }
    let mut out = HashSet::new();
    for chunk in users.chunks(MAX_TUPLES_PER_QUERY) {
        let q = Query::select()
            .column(Alias::new("user_id"))
            .from(table())
            .and_where(Expr::col(Alias::new("user_id")).is_in(chunk.iter().copied()))
            .and_where(Expr::col(Alias::new("status")).ne(AccountStatus::Active as i16))
            .to_owned();
        for r in conn.query_all(&q).await? {
            out.insert(r.try_get_by_index(0)?);
        }
    }
    Ok(out)
}

/// Users whose account has a job in progress.
///
/// # Errors
/// Database errors.
pub async fn with_jobs<C: ConnectionTrait>(conn: &C) -> Result<Vec<i64>, DbErr> {
    let q =
        Query::select().column(Alias::new("user_id")).from(table()).and_where(Expr::col(Alias::new("job")).ne(AccountJob::None as i16)).to_owned();
    conn.query_all(&q).await?.iter().map(|r| r.try_get_by_index(0)).collect()
}

/// PostgreSQL: the current transaction's id (assigning one); elsewhere 0.
///
/// # Errors
/// Database errors.
pub async fn current_xid<C: ConnectionTrait>(conn: &C) -> Result<i64, DbErr> {
    if conn.get_database_backend() != DbBackend::Postgres {
        return Ok(0);
    }
    let row = conn.query_one_raw(Statement::from_string(DbBackend::Postgres, "SELECT txid_current()")).await?;
    row.map_or(Ok(0), |r| r.try_get_by_index(0))
}

/// PostgreSQL: true while another session of this database runs a transaction, or holds a
/// snapshot, that began at or before transaction `xid`: such a session may still commit a
/// follow that read the account as active. Elsewhere false (their follow paths write the edge
/// before reading the status, and the job's locking reads wait for those writes).
///
/// # Errors
/// Database errors.
pub async fn older_transactions_running<C: ConnectionTrait>(conn: &C, xid: i64) -> Result<bool, DbErr> {
    const SQL: &str = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() \
        AND ((backend_xid IS NOT NULL AND age(backend_xid) >= age(($1 % 4294967296)::text::xid)) \
          OR (backend_xmin IS NOT NULL AND age(backend_xmin) >= age(($1 % 4294967296)::text::xid)))";
    if conn.get_database_backend() != DbBackend::Postgres {
        return Ok(false);
    }
    let row = conn.query_one_raw(Statement::from_sql_and_values(DbBackend::Postgres, SQL, [xid.into()])).await?;
    Ok(row.map_or(Ok(0_i64), |r| r.try_get_by_index(0))? > 0)
}

/// Up to `limit` edges of `user_id` in either direction whose state is one of `states`, locked
/// for update; with `peer_active`, only those whose other user has an active account.
///
/// # Errors
/// Database errors.
pub async fn edges_of<C: ConnectionTrait>(conn: &C, user_id: i64, states: &[EdgeState], peer_active: bool, limit: usize) -> Result<Vec<Edge>, DbErr> {
    let mut out = Vec::new();
    for (own, peer) in [(Col::FollowerId, Col::FolloweeId), (Col::FolloweeId, Col::FollowerId)] {
        if out.len() >= limit {
            break;
        }
        let mut q = Query::select()
            .columns([Col::FollowerId, Col::FolloweeId, Col::State, Col::Version, Col::FollowedAtMs, Col::UpdatedAtMs])
            .from(Alias::new("following"))
            .and_where(Expr::col(own).eq(user_id))
            .and_where(Expr::col(Col::State).is_in(states.iter().map(|s| s.as_i16())))
            .limit((limit - out.len()) as u64)
            .lock(LockType::Update)
            .to_owned();
        if peer_active {
            let inactive = Query::select()
                .column(Alias::new("user_id"))
                .from(table())
                .and_where(Expr::col(Alias::new("status")).ne(AccountStatus::Active as i16))
                .and_where(Expr::col(Alias::new("user_id")).ne(user_id))
                .to_owned();
            q.cond_where(Cond::all().add(Expr::col(peer).not_in_subquery(inactive)));
        }
        for r in conn.query_all(&q).await? {
            out.push(Edge {
                follower_id: r.try_get_by_index(0)?,
                followee_id: r.try_get_by_index(1)?,
                state: EdgeState::from_i16(r.try_get_by_index(2)?),
                version: r.try_get_by_index(3)?,
                followed_at_ms: r.try_get_by_index(4)?,
                updated_at_ms: r.try_get_by_index(5)?,
            });
        }
    }
    Ok(out)
}

/// Moves `edges` (as read, locked) to `state` in one statement: version + 1, `updated_at_ms`
/// = `now_ms`, `followed_at_ms` kept. Returns the edges as written.
///
/// # Errors
/// Database errors.
pub async fn set_state<C: ConnectionTrait>(conn: &C, edges: &[Edge], state: EdgeState, now_ms: i64) -> Result<Vec<Edge>, DbErr> {
    if crate::pg_bulk::is_postgres(conn) {
        crate::pg_bulk::set_edge_states(conn, edges, state, now_ms).await?;
        return Ok(edges.iter().map(|e| Edge { state, version: e.version + 1, updated_at_ms: now_ms, ..*e }).collect());
    }
    for chunk in edges.chunks(MAX_TUPLES_PER_QUERY) {
        let q = Query::update()
            .table(Alias::new("following"))
            .value(Col::State, state.as_i16())
            .value(Col::Version, Expr::col(Col::Version).add(1))
            .value(Col::UpdatedAtMs, now_ms)
            .and_where(
                Expr::tuple([Expr::col(Col::FollowerId), Expr::col(Col::FolloweeId)]).in_tuples(chunk.iter().map(|e| (e.follower_id, e.followee_id))),
            )
            .to_owned();
        conn.execute(&q).await?;
    }
    Ok(edges.iter().map(|e| Edge { state, version: e.version + 1, updated_at_ms: now_ms, ..*e }).collect())
}

/// Clears the `blocked` flag of every `following` row of `user_id` (both directions): after
/// its blocks in both directions were deleted, no block can stand between it and anyone.
///
/// # Errors
/// Database errors.
pub async fn clear_block_flags<C: ConnectionTrait>(conn: &C, user_id: i64) -> Result<(), DbErr> {
    let q = Query::update()
        .table(Alias::new("following"))
        .value(Col::Blocked, false)
        .cond_where(Cond::any().add(Expr::col(Col::FollowerId).eq(user_id)).add(Expr::col(Col::FolloweeId).eq(user_id)))
        .and_where(Expr::col(Col::Blocked).eq(true))
        .to_owned();
    conn.execute(&q).await.map(|_| ())
}
