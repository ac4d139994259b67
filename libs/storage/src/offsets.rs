//! The `consumer_offset` table: (consumer, topic, partition) → next offset to apply, written in
//! the same transaction as the rows it covers, so a crash never separates the two.

use sea_orm::sea_query::{Expr, ExprTrait, OnConflict, Order, Query};
use sea_orm::{ConnectionTrait, DbErr};

#[derive(Clone, Copy, sea_orm::DeriveIden)]
enum ConsumerOffset {
    Table,
    Consumer,
    Topic,
    Partition,
    NextOffset,
    LastEventMs,
    UpdatedAtMs,
}

/// A stored position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredOffset {
    /// Partition number.
    pub partition: i32,
    /// Next offset to apply (last applied + 1).
    pub next_offset: i64,
    /// Occurrence time (ms) of the last applied event, if known.
    pub last_event_ms: Option<i64>,
}

/// The stored positions of `consumer` on `topic`, by partition.
///
/// # Errors
/// Database errors.
pub async fn list<C: ConnectionTrait>(conn: &C, consumer: &str, topic: &str) -> Result<Vec<StoredOffset>, DbErr> {
    let q = Query::select()
        .columns([ConsumerOffset::Partition, ConsumerOffset::NextOffset, ConsumerOffset::LastEventMs])
        .from(ConsumerOffset::Table)
        .and_where(Expr::col(ConsumerOffset::Consumer).eq(consumer))
        .and_where(Expr::col(ConsumerOffset::Topic).eq(topic))
        .order_by(ConsumerOffset::Partition, Order::Asc)
        .to_owned();
    conn.query_all(&q)
        .await?
        .iter()
        .map(|r| Ok(StoredOffset { partition: r.try_get_by_index(0)?, next_offset: r.try_get_by_index(1)?, last_event_ms: r.try_get_by_index(2)? }))
        .collect()
}

/// The stored positions of `consumer` on `topic` (as [`list`], by partition) and the `follower`
/// rows of each of `followers` → `followee` (in no particular order, each once), read in one
/// snapshot by one statement where the database can: `Some` on PostgreSQL (one round trip, no
/// transaction), `None` on MySQL/MariaDB and SQLite, whose callers read both inside a snapshot
/// transaction ([`list`], [`crate::edges::get_many`]).
///
/// # Errors
/// Database errors.
pub async fn with_follower_edges<C: ConnectionTrait>(
    conn: &C,
    consumer: &str,
    topic: &str,
    followee: i64,
    followers: &[i64],
) -> Result<Option<(Vec<StoredOffset>, Vec<socialgraph_domain::Edge>)>, DbErr> {
    if !crate::pg_bulk::is_postgres(conn) {
        return Ok(None);
    }
    crate::pg_bulk::offsets_with_follower_edges(conn, consumer, topic, followee, followers).await.map(Some)
}

/// The next offset `consumer` stored for `topic`/`partition`, if any: a consumer's
/// `load_offset` when its offsets live in this database.
///
/// # Errors
/// Database errors.
pub async fn next_offset<C: ConnectionTrait>(conn: &C, consumer: &str, topic: &str, partition: i32) -> Result<Option<i64>, DbErr> {
    Ok(list(conn, consumer, topic).await?.into_iter().find(|o| o.partition == partition).map(|o| o.next_offset))
}

/// Stores the position of `consumer` on `topic`/`o.partition` (insert or overwrite).
///
/// # Errors
/// Database errors.
pub async fn store<C: ConnectionTrait>(conn: &C, consumer: &str, topic: &str, o: StoredOffset, now_ms: i64) -> Result<(), DbErr> {
    let q = Query::insert()
        .into_table(ConsumerOffset::Table)
        .columns([
            ConsumerOffset::Consumer,
            ConsumerOffset::Topic,
            ConsumerOffset::Partition,
            ConsumerOffset::NextOffset,
            ConsumerOffset::LastEventMs,
            ConsumerOffset::UpdatedAtMs,
        ])
        .values_panic([consumer.into(), topic.into(), o.partition.into(), o.next_offset.into(), o.last_event_ms.into(), now_ms.into()])
        .on_conflict(
            OnConflict::columns([ConsumerOffset::Consumer, ConsumerOffset::Topic, ConsumerOffset::Partition])
                .update_columns([ConsumerOffset::NextOffset, ConsumerOffset::LastEventMs, ConsumerOffset::UpdatedAtMs])
                .to_owned(),
        )
        .to_owned();
    conn.execute(&q).await.map(|_| ())
}

/// Deletes every stored position of `consumer` on `topic` (the next start replays from the
/// earliest offset).
///
/// # Errors
/// Database errors.
pub async fn reset<C: ConnectionTrait>(conn: &C, consumer: &str, topic: &str) -> Result<(), DbErr> {
    let q = Query::delete()
        .from_table(ConsumerOffset::Table)
        .and_where(Expr::col(ConsumerOffset::Consumer).eq(consumer))
        .and_where(Expr::col(ConsumerOffset::Topic).eq(topic))
        .to_owned();
    conn.execute(&q).await.map(|_| ())
}
