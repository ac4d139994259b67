//! The `cache_stale` table: users whose cached state may be wrong. projection-svc marks the
//! users of a batch the cache Redis did not take, in the transaction that stores the consumer's
//! offset; relation-svc marks both users of every restriction change, in the change's own
//! transaction. So a crash cannot forget them; each mark is cleared once everything cached of
//! the user is deleted (`socialgraph_server::cache_drain`).
//!
//! Every mark of a user bumps its `marks`, and a clear removes a row only if `marks` is still
//! what the drain read: a user marked again after its cached list was deleted stays marked.

use sea_orm::sea_query::{Expr, ExprTrait, OnConflict, Order, Query};
use sea_orm::{ConnectionTrait, DbErr};

#[derive(Clone, Copy, sea_orm::DeriveIden)]
enum CacheStale {
    Table,
    UserId,
    Marks,
    MarkedAtMs,
}

/// One marked user as a drain reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StaleUser {
    /// The user whose cached following list may be stale.
    pub user_id: i64,
    /// Marks so far (the clear's guard).
    pub marks: i64,
    /// When the user was first marked (ms).
    pub marked_at_ms: i64,
}

/// Marks `users` stale at `now_ms`.
///
/// # Errors
/// Database errors.
pub async fn mark<C: ConnectionTrait>(conn: &C, users: &[i64], now_ms: i64) -> Result<(), DbErr> {
    for chunk in users.chunks(1000) {
        let mut q = Query::insert();
        q.into_table(CacheStale::Table).columns([CacheStale::UserId, CacheStale::Marks, CacheStale::MarkedAtMs]);
        for u in chunk {
            q.values_panic([(*u).into(), 1i64.into(), now_ms.into()]);
        }
        q.on_conflict(
            OnConflict::column(CacheStale::UserId).value(CacheStale::Marks, Expr::col((CacheStale::Table, CacheStale::Marks)).add(1)).to_owned(),
        );
        conn.execute(&q).await?;
    }
    Ok(())
}

/// Up to `limit` marked users, first marked first.
///
/// # Errors
/// Database errors.
pub async fn oldest<C: ConnectionTrait>(conn: &C, limit: usize) -> Result<Vec<StaleUser>, DbErr> {
    let q = Query::select()
        .columns([CacheStale::UserId, CacheStale::Marks, CacheStale::MarkedAtMs])
        .from(CacheStale::Table)
        .order_by(CacheStale::MarkedAtMs, Order::Asc)
        .limit(limit as u64)
        .to_owned();
    conn.query_all(&q)
        .await?
        .iter()
        .map(|r| Ok(StaleUser { user_id: r.try_get_by_index(0)?, marks: r.try_get_by_index(1)?, marked_at_ms: r.try_get_by_index(2)? }))
        .collect()
}

/// Clears the marks of `users` that were not marked again since they were read.
///
/// # Errors
/// Database errors.
pub async fn clear<C: ConnectionTrait>(conn: &C, users: &[StaleUser]) -> Result<(), DbErr> {
    for u in users {
        let q = Query::delete()
            .from_table(CacheStale::Table)
            .and_where(Expr::col(CacheStale::UserId).eq(u.user_id))
            .and_where(Expr::col(CacheStale::Marks).eq(u.marks))
            .to_owned();
        conn.execute(&q).await?;
    }
    Ok(())
}

/// How many users are marked.
///
/// # Errors
/// Database errors.
pub async fn count<C: ConnectionTrait>(conn: &C) -> Result<i64, DbErr> {
    let q = Query::select().expr(Expr::col(CacheStale::UserId).count()).from(CacheStale::Table).to_owned();
    Ok(conn.query_one(&q).await?.map(|r| r.try_get_by_index::<i64>(0)).transpose()?.unwrap_or(0))
}
