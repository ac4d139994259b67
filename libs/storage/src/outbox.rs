//! The `outbox` table: events written in the transaction of the change they describe, read by
//! the relay in id order, and deleted once the broker acknowledged them.

use sea_orm::sea_query::{Expr, ExprTrait, Order, Query};
use sea_orm::{ConnectionTrait, DbErr};

#[derive(Clone, Copy, sea_orm::DeriveIden)]
enum Outbox {
    Table,
    Id,
    Topic,
    PartitionKey,
    Payload,
    Headers,
    CreatedAtMs,
}

/// An event to write to the outbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewOutboxRow {
    /// Kafka topic the relay publishes to.
    pub topic: String,
    /// The record key's id (follower_id for relation events); the relay derives the partition.
    pub partition_key: i64,
    /// Encoded protobuf message.
    pub payload: Vec<u8>,
    /// Record headers as `name: value` lines (W3C `traceparent`, `event-type`, `schema`).
    pub headers: String,
    /// When the row was written, ms since the epoch.
    pub created_at_ms: i64,
}

/// A stored outbox row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxRow {
    /// Auto-increment id: the relay's publishing order.
    pub id: i64,
    /// The row's content.
    pub row: NewOutboxRow,
}

/// Writes rows in one statement (on PostgreSQL as arrays, see `pg_bulk`), ids in slice order.
///
/// # Errors
/// Database errors.
pub async fn insert<C: ConnectionTrait>(conn: &C, rows: &[NewOutboxRow]) -> Result<(), DbErr> {
    if rows.is_empty() {
        return Ok(());
    }
    if crate::pg_bulk::is_postgres(conn) {
        return crate::pg_bulk::insert_outbox(conn, rows).await;
    }
    let mut q = Query::insert()
        .into_table(Outbox::Table)
        .columns([Outbox::Topic, Outbox::PartitionKey, Outbox::Payload, Outbox::Headers, Outbox::CreatedAtMs])
        .to_owned();
    for r in rows {
        q.values_panic([r.topic.clone().into(), r.partition_key.into(), r.payload.clone().into(), r.headers.clone().into(), r.created_at_ms.into()]);
    }
    conn.execute(&q).await.map(|_| ())
}

/// The oldest `limit` rows, in id order.
///
/// # Errors
/// Database errors.
pub async fn fetch<C: ConnectionTrait>(conn: &C, limit: usize) -> Result<Vec<OutboxRow>, DbErr> {
    let q = Query::select()
        .columns([Outbox::Id, Outbox::Topic, Outbox::PartitionKey, Outbox::Payload, Outbox::Headers, Outbox::CreatedAtMs])
        .from(Outbox::Table)
        .order_by(Outbox::Id, Order::Asc)
        .limit(limit as u64)
        .to_owned();
    conn.query_all(&q)
        .await?
        .iter()
        .map(|r| {
            Ok(OutboxRow {
                id: r.try_get_by_index(0)?,
                row: NewOutboxRow {
                    topic: r.try_get_by_index(1)?,
                    partition_key: r.try_get_by_index(2)?,
                    payload: r.try_get_by_index(3)?,
                    headers: r.try_get_by_index(4)?,
                    created_at_ms: r.try_get_by_index(5)?,
                },
            })
        })
        .collect()
}

/// Deletes the rows with these ids.
///
/// # Errors
/// Database errors.
pub async fn delete<C: ConnectionTrait>(conn: &C, ids: &[i64]) -> Result<(), DbErr> {
    if ids.is_empty() {
        return Ok(());
    }
    if crate::pg_bulk::is_postgres(conn) {
        return crate::pg_bulk::ids_execute(conn, "DELETE FROM outbox WHERE id = ANY($1)", ids).await;
    }
    let q = Query::delete().from_table(Outbox::Table).and_where(Expr::col(Outbox::Id).is_in(ids.iter().copied())).to_owned();
    conn.execute(&q).await.map(|_| ())
}

/// Backlog: the number of rows waiting and the creation time (ms) of the oldest, if any.
///
/// # Errors
/// Database errors.
pub async fn backlog<C: ConnectionTrait>(conn: &C) -> Result<(i64, Option<i64>), DbErr> {
    let q = Query::select().expr(Expr::col(Outbox::Id).count()).expr(Expr::col(Outbox::CreatedAtMs).min()).from(Outbox::Table).to_owned();
    match conn.query_one(&q).await? {
        Some(r) => Ok((r.try_get_by_index(0)?, r.try_get_by_index::<Option<i64>>(1)?)),
        None => Ok((0, None)),
    }
}
