//! The outbox table as the event log of the embedded mode.
//!
//! Nothing relays or deletes outbox rows here: each topic is one partition (0) whose offsets
//! are outbox ids, so "next offset" is the smallest id not yet applied and the high watermark
//! is the largest id + 1. SQLite has one writer at a time, so ids become visible in id order
//! and a reader never skips a row that commits later with a smaller id. Consumers are the
//! distributed mode's own [`BatchHandler`]s, fed [`RecordAndOffset`]s built from the rows, and
//! store their next offset in the same transaction as their effects (effectively-once).

use std::sync::Arc;
use std::time::Duration;

use rskafka::record::{Record, RecordAndOffset};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, Statement};
use socialgraph_events::consumer::{BatchHandler, PartitionProgress, Progress};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Rows applied per batch.
pub const BATCH_ROWS: u64 = 2_000;
/// How long an idle reader waits for a wake-up before looking again (commits in this process
/// wake it at once).
const IDLE_POLL: Duration = Duration::from_millis(200);

/// The log's only partition of every topic.
pub const PARTITION: i32 = 0;

/// Rows of `topics` (all topics when empty) with id ≥ `from`, in id order, at most `limit`.
///
/// # Errors
/// Database errors.
pub async fn read<C: ConnectionTrait>(conn: &C, topics: &[&str], from: i64, limit: u64) -> Result<Vec<RecordAndOffset>, DbErr> {
    let mut sql = "SELECT id, topic, partition_key, payload, headers, created_at_ms FROM outbox WHERE id >= ?".to_owned();
    let mut values: Vec<sea_orm::Value> = vec![from.into()];
    if !topics.is_empty() {
        sql.push_str(&format!(" AND topic IN ({})", vec!["?"; topics.len()].join(", ")));
        values.extend(topics.iter().map(|t| sea_orm::Value::from(t.to_string())));
    }
    sql.push_str(" ORDER BY id LIMIT ?");
    values.push((limit as i64).into());
    let rows = conn.query_all_raw(Statement::from_sql_and_values(DbBackend::Sqlite, sql, values)).await?;
    rows.iter()
        .map(|r| {
            let id: i64 = r.try_get_by_index(0)?;
            let topic: String = r.try_get_by_index(1)?;
            let key: i64 = r.try_get_by_index(2)?;
            let payload: Vec<u8> = r.try_get_by_index(3)?;
            let headers: String = r.try_get_by_index(4)?;
            let created_at_ms: i64 = r.try_get_by_index(5)?;
            let record = Record {
                key: Some(key.to_be_bytes().to_vec()),
                value: Some(payload),
                headers: socialgraph_events::headers::decode(&headers)
                    .into_iter()
                    .chain(std::iter::once(("topic".to_owned(), topic.into_bytes())))
                    .collect(),
                timestamp: chrono::DateTime::from_timestamp_millis(created_at_ms).unwrap_or_default(),
            };
            Ok(RecordAndOffset { record, offset: id })
        })
        .collect()
}

/// The high watermark of `topics` (all when empty): largest outbox id + 1, 0 when empty.
///
/// # Errors
/// Database errors.
pub async fn high_watermark<C: ConnectionTrait>(conn: &C, topics: &[&str]) -> Result<i64, DbErr> {
    let mut sql = "SELECT MAX(id) FROM outbox".to_owned();
    let mut values: Vec<sea_orm::Value> = Vec::new();
    if !topics.is_empty() {
        sql.push_str(&format!(" WHERE topic IN ({})", vec!["?"; topics.len()].join(", ")));
        values.extend(topics.iter().map(|t| sea_orm::Value::from(t.to_string())));
    }
    let row = conn.query_one_raw(Statement::from_sql_and_values(DbBackend::Sqlite, sql, values)).await?;
    Ok(row.and_then(|r| r.try_get_by_index::<Option<i64>>(0).ok().flatten()).map_or(0, |m| m + 1))
}

/// Feeds `handler` every row of `topics` from its stored offset on, until `cancel`; progress
/// is reported under (`name`, 0). Failed batches are retried after a pause, never skipped.
pub async fn consume<H: BatchHandler>(
    db: DatabaseConnection,
    name: String,
    topics: Vec<String>,
    handler: Arc<H>,
    progress: Progress,
    wake: Arc<Notify>,
    cancel: CancellationToken,
) {
    let topic_refs: Vec<&str> = topics.iter().map(String::as_str).collect();
    let mut next = loop {
        match handler.load_offset(&name, PARTITION).await {
            Ok(n) => break n.unwrap_or(0),
            Err(e) => {
                tracing::warn!(consumer = %name, error = %e, "loading the stored offset failed; retrying");
                tokio::select! { _ = tokio::time::sleep(Duration::from_secs(1)) => {}, _ = cancel.cancelled() => return }
            }
        }
    };
    let pause = || async {
        tokio::select! { _ = tokio::time::sleep(Duration::from_secs(1)) => {}, _ = cancel.cancelled() => {} }
    };
    while !cancel.is_cancelled() {
        // Registered before reading, so a commit after the read still wakes the next wait.
        let notified = wake.notified();
        let records = match read(&db, &topic_refs, next, BATCH_ROWS).await {
            Ok(records) => records,
            Err(e) => {
                tracing::warn!(consumer = %name, error = %e, "reading the log failed; retrying");
                pause().await;
                continue;
            }
        };
        let last_ms = records.last().map(|r| r.record.timestamp.timestamp_millis());
        if let Some(last) = records.last() {
            if let Err(e) = handler.apply(&name, PARTITION, &records, last.offset + 1).await {
                tracing::warn!(consumer = %name, error = %e, "applying a batch of the log failed; retrying");
                pause().await;
                continue;
            }
            next = last.offset + 1;
        }
        // A short read saw the end of the log: only a full batch leaves rows to count.
        let high = if records.len() as u64 == BATCH_ROWS { high_watermark(&db, &topic_refs).await.unwrap_or(next) } else { next };
        {
            let mut map = progress.write().await;
            let p = map.entry((name.clone(), PARTITION)).or_default();
            *p = PartitionProgress { next_offset: next, high_watermark: high.max(next), last_event_ms: last_ms.or(p.last_event_ms), running: true };
        }
        if records.is_empty() {
            tokio::select! {
                _ = notified => {},
                _ = tokio::time::sleep(IDLE_POLL) => {},
                _ = cancel.cancelled() => {},
            }
        }
    }
}

/// PublishPost's and DeletePost's log in the embedded mode: the event becomes an outbox row of
/// the content topic (key = author), and the log readers are woken.
pub struct OutboxContentLog {
    /// The SQLite database.
    pub db: DatabaseConnection,
    /// The content topic.
    pub topic: String,
    /// Wakes the log readers.
    pub wake: Arc<Notify>,
}

#[tonic::async_trait]
impl socialgraph_projection::feed::ContentLog for OutboxContentLog {
    async fn append(&self, event: socialgraph_proto::events::v1::ContentEvent) -> Result<(), socialgraph_server::ApiError> {
        let row = socialgraph_storage::outbox::NewOutboxRow {
            topic: self.topic.clone(),
            partition_key: event.author_id,
            payload: prost::Message::encode_to_vec(&event),
            headers: socialgraph_events::headers::encode(&socialgraph_events::headers::event_headers("socialgraph.events.v1.ContentEvent")),
            created_at_ms: crate::now_ms(),
        };
        socialgraph_storage::outbox::insert(&self.db, &[row]).await.map_err(socialgraph_server::db_error)?;
        self.wake.notify_waiters();
        Ok(())
    }
}

/// The message topic of the log, as live delivery reads it: one partition whose offsets are
/// outbox ids (the outbox is never trimmed here, so every position stays readable).
pub struct MessageLog {
    /// The database.
    pub db: DatabaseConnection,
    /// The message topic.
    pub topic: String,
}

#[tonic::async_trait]
impl socialgraph_message::live::EventLog for MessageLog {
    async fn partitions(&self) -> Result<i32, socialgraph_message::live::LogError> {
        Ok(1)
    }

    async fn fetch(&self, _partition: i32, from: i64) -> Result<Vec<(i64, Vec<u8>)>, socialgraph_message::live::LogError> {
        let rows = read(&self.db, &[&self.topic], from, BATCH_ROWS).await?;
        Ok(rows.into_iter().map(|r| (r.offset, r.record.value.unwrap_or_default())).collect())
    }

    async fn bounds(&self, _partition: i32) -> Result<(i64, i64), socialgraph_message::live::LogError> {
        Ok((0, high_watermark(&self.db, &[&self.topic]).await?))
    }
}
