//! The `block` and `mute` tables: one directed restriction (owner → target) per row, with the
//! time it was made. Lists are newest first, ties by target id descending, like the follow
//! lists, so they page with the same keyset tokens.

use std::collections::HashSet;

use sea_orm::sea_query::{Alias, Cond, Expr, ExprTrait, LockType, Order, Query};
use sea_orm::{ConnectionTrait, DbErr};
use socialgraph_domain::{Cursor, ListEntry};

/// Which restriction table a call addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Restriction {
    /// `block(blocker_id, blocked_id, created_at_ms)`.
    Block,
    /// `mute(muter_id, muted_id, created_at_ms)`.
    Mute,
    /// `follow_request(requester_id, target_id, created_at_ms)`: a pending follow of a locked
    /// account.
    Request,
}

impl Restriction {
    fn table(self) -> Alias {
        Alias::new(match self {
            Self::Block => "block",
            Self::Mute => "mute",
            Self::Request => "follow_request",
        })
    }

    /// (owner column, target column).
    fn cols(self) -> (Alias, Alias) {
        match self {
            Self::Block => (Alias::new("blocker_id"), Alias::new("blocked_id")),
            Self::Mute => (Alias::new("muter_id"), Alias::new("muted_id")),
            Self::Request => (Alias::new("requester_id"), Alias::new("target_id")),
        }
    }
}

fn created() -> Alias {
    Alias::new("created_at_ms")
}

/// The restrictions between `user_id` and each of `others`, of every kind, in one query: the
/// (kind, owner, target) rows of blocks both ways, mutes by the user and follow requests both
/// ways. Each arm fixes one side to the user's id, so the primary keys answer it.
///
/// # Errors
/// Database errors.
pub async fn between<C: ConnectionTrait>(conn: &C, user_id: i64, others: &[i64]) -> Result<HashSet<(Restriction, i64, i64)>, DbErr> {
    const KINDS: [Restriction; 3] = [Restriction::Block, Restriction::Mute, Restriction::Request];
    let mut out = HashSet::new();
    for chunk in others.chunks(crate::edges::MAX_TUPLES_PER_QUERY) {
        let mut arms = Vec::new();
        for (k, kind) in KINDS.iter().enumerate() {
            let (o, t) = kind.cols();
            let both_ways = *kind != Restriction::Mute;
            for (mine, theirs) in [(o.clone(), t.clone()), (t.clone(), o.clone())].into_iter().take(if both_ways { 2 } else { 1 }) {
                arms.push(
                    Query::select()
                        .expr(Expr::val(k as i32))
                        .columns([o.clone(), t.clone()])
                        .from(kind.table())
                        .and_where(Expr::col(mine).eq(user_id))
                        .and_where(Expr::col(theirs).is_in(chunk.iter().copied()))
                        .to_owned(),
                );
            }
        }
        let mut arms = arms.into_iter();
        let Some(mut q) = arms.next() else { continue };
        for arm in arms {
            q.union(sea_orm::sea_query::UnionType::All, arm);
        }
        for row in conn.query_all(&q).await? {
            let k: i32 = row.try_get_by_index(0)?;
            out.insert((KINDS[k as usize], row.try_get_by_index(1)?, row.try_get_by_index(2)?));
        }
    }
    Ok(out)
}

/// Every restriction a relationship read of `user_id` needs, as (kind, owner, target): blocks
/// by and of the user, the user's mutes, follow requests by and to the user; `None` when there
/// are more than `limit`. One query per kind and side, each served by a primary key or the
/// target index.
///
/// # Errors
/// Database errors.
pub async fn of_user<C: ConnectionTrait>(conn: &C, user_id: i64, limit: usize) -> Result<Option<Vec<(Restriction, i64, i64)>>, DbErr> {
    let mut out = Vec::new();
    for (kind, as_owner) in [
        (Restriction::Block, true),
        (Restriction::Block, false),
        (Restriction::Mute, true),
        (Restriction::Request, true),
        (Restriction::Request, false),
    ] {
        let (o, t) = kind.cols();
        let mine = if as_owner { o.clone() } else { t.clone() };
        let q = Query::select()
            .columns([o, t])
            .from(kind.table())
            .and_where(Expr::col(mine).eq(user_id))
            .limit((limit + 1 - out.len()) as u64)
            .to_owned();
        for row in conn.query_all(&q).await? {
            out.push((kind, row.try_get_by_index(0)?, row.try_get_by_index(1)?));
        }
        if out.len() > limit {
            return Ok(None);
        }
    }
    Ok(Some(out))
}

/// Every user on the other side of a `kind` restriction of `user_id` (either side).
///
/// # Errors
/// Database errors.
pub async fn peers_of<C: ConnectionTrait>(conn: &C, kind: Restriction, user_id: i64) -> Result<Vec<i64>, DbErr> {
    let (o, t) = kind.cols();
    let mut peers = Vec::new();
    for (mine, theirs) in [(o.clone(), t.clone()), (t, o)] {
        let q = Query::select().column(theirs).from(kind.table()).and_where(Expr::col(mine).eq(user_id)).to_owned();
        for row in conn.query_all(&q).await? {
            peers.push(row.try_get_by_index(0)?);
        }
    }
    Ok(peers)
}

/// True when `owner` restricts `target`; with `for_update` the row, if any, is locked until
/// the transaction ends.
///
/// # Errors
/// Database errors.
pub async fn exists<C: ConnectionTrait>(conn: &C, kind: Restriction, owner: i64, target: i64, for_update: bool) -> Result<bool, DbErr> {
    let (o, t) = kind.cols();
    let mut q = Query::select().column(o.clone()).from(kind.table()).and_where(Expr::col(o).eq(owner)).and_where(Expr::col(t).eq(target)).to_owned();
    if for_update {
        q.lock(LockType::Update);
    }
    Ok(conn.query_one(&q).await?.is_some())
}

/// Inserts the restriction `owner` → `target` made at `at_ms`.
///
/// # Errors
/// Database errors, including a unique violation when it exists already (callers check first
/// and retry the transaction on a race).
pub async fn insert<C: ConnectionTrait>(conn: &C, kind: Restriction, owner: i64, target: i64, at_ms: i64) -> Result<(), DbErr> {
    let (o, t) = kind.cols();
    let q = Query::insert().into_table(kind.table()).columns([o, t, created()]).values_panic([owner.into(), target.into(), at_ms.into()]).to_owned();
    conn.execute(&q).await.map(|_| ())
}

/// Deletes the restriction `owner` → `target`; true when a row was deleted.
///
/// # Errors
/// Database errors.
pub async fn delete<C: ConnectionTrait>(conn: &C, kind: Restriction, owner: i64, target: i64) -> Result<bool, DbErr> {
    let (o, t) = kind.cols();
    let q = Query::delete().from_table(kind.table()).and_where(Expr::col(o).eq(owner)).and_where(Expr::col(t).eq(target)).to_owned();
    Ok(conn.execute(&q).await?.rows_affected() > 0)
}

/// One page of `owner`'s restrictions: newest first, ties by target id descending, strictly
/// after `after` (the entry's `followed_at_ms` is the restriction's creation time). Served by
/// the list index (owner, created_at_ms, target).
///
/// # Errors
/// Database errors.
pub async fn list<C: ConnectionTrait>(conn: &C, kind: Restriction, owner: i64, after: Option<Cursor>, limit: usize) -> Result<Vec<ListEntry>, DbErr> {
    let (o, t) = kind.cols();
    list_by(conn, kind, (o, t), owner, after, limit).await
}

/// Like [`list`], but of the rows whose target is `target` (a locked account's incoming
/// requests), listing their owners.
///
/// # Errors
/// Database errors.
pub async fn list_incoming<C: ConnectionTrait>(
    conn: &C,
    kind: Restriction,
    target: i64,
    after: Option<Cursor>,
    limit: usize,
) -> Result<Vec<ListEntry>, DbErr> {
    let (o, t) = kind.cols();
    list_by(conn, kind, (t, o), target, after, limit).await
}

async fn list_by<C: ConnectionTrait>(
    conn: &C,
    kind: Restriction,
    (o, t): (Alias, Alias),
    owner: i64,
    after: Option<Cursor>,
    limit: usize,
) -> Result<Vec<ListEntry>, DbErr> {
    let mut q = Query::select()
        .columns([t.clone(), created()])
        .from(kind.table())
        .and_where(Expr::col(o).eq(owner))
        .order_by(created(), Order::Desc)
        .order_by(t.clone(), Order::Desc)
        .limit(limit as u64)
        .to_owned();
    if let Some(c) = after {
        q.cond_where(
            Cond::any()
                .add(Expr::col(created()).lt(c.followed_at_ms))
                .add(Cond::all().add(Expr::col(created()).eq(c.followed_at_ms)).add(Expr::col(t).lt(c.peer_id))),
        );
    }
    conn.query_all(&q).await?.iter().map(|r| Ok(ListEntry { user_id: r.try_get_by_index(0)?, followed_at_ms: r.try_get_by_index(1)? })).collect()
}

/// The pairs (owner, target) among `pairs` that exist, by primary key.
///
/// # Errors
/// Database errors.
pub async fn among<C: ConnectionTrait>(conn: &C, kind: Restriction, pairs: &[(i64, i64)]) -> Result<HashSet<(i64, i64)>, DbErr> {
    among_locking(conn, kind, pairs, false).await
}

/// [`among`], with `for_update` locking the rows found (a row deleted meanwhile by another
/// transaction is waited for and then not found).
async fn among_locking<C: ConnectionTrait>(
    conn: &C,
    kind: Restriction,
    pairs: &[(i64, i64)],
    for_update: bool,
) -> Result<HashSet<(i64, i64)>, DbErr> {
    let (o, t) = kind.cols();
    let mut out = HashSet::new();
    for chunk in pairs.chunks(crate::edges::MAX_TUPLES_PER_QUERY) {
        let mut q = Query::select()
            .columns([o.clone(), t.clone()])
            .from(kind.table())
            .and_where(Expr::tuple([Expr::col(o.clone()), Expr::col(t.clone())]).in_tuples(chunk.iter().copied()))
            .to_owned();
        if for_update {
            q.lock(LockType::Update);
        }
        for row in conn.query_all(&q).await? {
            out.insert((row.try_get_by_index(0)?, row.try_get_by_index(1)?));
        }
    }
    Ok(out)
}

/// Deletes every restriction `user_id` makes or is subject to; returns how many.
///
/// # Errors
/// Database errors.
pub async fn delete_all_of<C: ConnectionTrait>(conn: &C, kind: Restriction, user_id: i64) -> Result<u64, DbErr> {
    let (o, t) = kind.cols();
    let q = Query::delete().from_table(kind.table()).cond_where(Cond::any().add(Expr::col(o).eq(user_id)).add(Expr::col(t).eq(user_id))).to_owned();
    Ok(conn.execute(&q).await?.rows_affected())
}

/// Deletes the rows `owner` → each of `targets` (or, with `incoming`, each of `targets` →
/// `owner`) that exist, locking them first; returns the peers whose row it deleted (a row
/// another transaction deleted first is not among them).
///
/// # Errors
/// Database errors.
pub async fn delete_many<C: ConnectionTrait>(conn: &C, kind: Restriction, owner: i64, targets: &[i64], incoming: bool) -> Result<Vec<i64>, DbErr> {
    let pairs: Vec<(i64, i64)> = targets.iter().map(|&t| if incoming { (t, owner) } else { (owner, t) }).collect();
    let found = among_locking(conn, kind, &pairs, true).await?;
    let (o, t) = kind.cols();
    let existing: Vec<(i64, i64)> = pairs.into_iter().filter(|p| found.contains(p)).collect();
    for chunk in existing.chunks(crate::edges::MAX_TUPLES_PER_QUERY) {
        let q = Query::delete()
            .from_table(kind.table())
            .and_where(Expr::tuple([Expr::col(o.clone()), Expr::col(t.clone())]).in_tuples(chunk.iter().copied()))
            .to_owned();
        conn.execute(&q).await?;
    }
    Ok(existing.into_iter().map(|(a, b)| if incoming { a } else { b }).collect())
}

/// Number of rows `owner` makes, counted over at most `limit` index entries.
///
/// # Errors
/// Database errors.
pub async fn count_of<C: ConnectionTrait>(conn: &C, kind: Restriction, owner: i64, limit: i64) -> Result<i64, DbErr> {
    let (o, _) = kind.cols();
    let inner = Query::select().expr(Expr::val(1)).from(kind.table()).and_where(Expr::col(o).eq(owner)).limit(Ord::max(limit, 0) as u64).to_owned();
    let q = Query::select().expr(Expr::cust("count(*)")).from_subquery(inner, Alias::new("r")).to_owned();
    match conn.query_one(&q).await? {
        Some(row) => row.try_get_by_index(0),
        None => Ok(0),
    }
}
