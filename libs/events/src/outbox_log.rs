//! The outbox table as the event log of the embedded mode.
//!
//! Nothing relays or deletes outbox rows there: each topic is one partition (0) whose offsets
//! are outbox ids, so the high watermark is the topic's largest id + 1 and offsets of one topic
//! have gaps (the ids of the other topics). SQLite has one writer at a time, so ids become
//! visible in id order and a reader never skips a row that commits later with a smaller id;
//! that is why this log is for SQLite only (on PostgreSQL and MariaDB, concurrent writers
//! commit out of id order and the relay publishes the outbox to Kafka instead).

use std::sync::Arc;
use std::time::Duration;

use rskafka::record::{Record, RecordAndOffset};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, Statement};
use socialgraph_storage::outbox::{self, NewOutboxRow};
use tokio::sync::Notify;

use crate::consumer::BoxError;
use crate::kafka::KeyedRecord;
use crate::log::{EventLog, FetchLimits, Fetched};

/// Rows one read returns at most.
pub const BATCH_ROWS: u64 = 2_000;

/// The log's only partition of every topic.
pub const PARTITION: i32 = 0;

/// The outbox table of a SQLite database as an [`EventLog`]. `wake` is notified after every
/// append and by every other writer of the outbox in this process; a read waiting for records
/// (`max_wait_ms`) returns as soon as it fires.
#[derive(Clone)]
pub struct OutboxLog {
    /// The SQLite database.
    pub db: DatabaseConnection,
    /// Fired after rows are committed.
    pub wake: Arc<Notify>,
}

impl OutboxLog {
    /// Rows of `topic` with id ≥ `from`, in id order, at most `limit`.
    ///
    /// # Errors
    /// Database errors.
    pub async fn read(&self, topic: &str, from: i64, limit: u64) -> Result<Vec<RecordAndOffset>, DbErr> {
        let sql = "SELECT id, partition_key, payload, headers, created_at_ms FROM outbox WHERE topic = ? AND id >= ? ORDER BY id LIMIT ?";
        let values: Vec<sea_orm::Value> = vec![topic.into(), from.into(), (limit as i64).into()];
        let rows = self.db.query_all_raw(Statement::from_sql_and_values(DbBackend::Sqlite, sql, values)).await?;
        rows.iter()
            .map(|r| {
                let id: i64 = r.try_get_by_index(0)?;
                let key: i64 = r.try_get_by_index(1)?;
                let payload: Vec<u8> = r.try_get_by_index(2)?;
                let headers: String = r.try_get_by_index(3)?;
                let created_at_ms: i64 = r.try_get_by_index(4)?;
                let record = Record {
                    key: Some(key.to_be_bytes().to_vec()),
                    value: Some(payload),
                    headers: crate::headers::decode(&headers),
                    timestamp: rskafka::chrono::DateTime::from_timestamp_millis(created_at_ms).unwrap_or_default(),
                };
                Ok(RecordAndOffset { record, offset: id })
            })
            .collect()
    }

    /// The high watermark of `topic`: its largest outbox id + 1, 0 when it has no row.
    ///
    /// # Errors
    /// Database errors.
    pub async fn high_watermark(&self, topic: &str) -> Result<i64, DbErr> {
        let stmt = Statement::from_sql_and_values(DbBackend::Sqlite, "SELECT MAX(id) FROM outbox WHERE topic = ?", [topic.into()]);
        let row = self.db.query_one_raw(stmt).await?;
        Ok(row.and_then(|r| r.try_get_by_index::<Option<i64>>(0).ok().flatten()).map_or(0, |m| m + 1))
    }
}

/// The outbox's `partition_key` of a record key: the 8 big-endian bytes every producer of
/// socialgraph writes ([`crate::user_key`]).
fn partition_key(key: &[u8]) -> Result<i64, BoxError> {
    let bytes: [u8; 8] = key.try_into().map_err(|_| format!("an outbox key is 8 bytes, not {}", key.len()))?;
    Ok(i64::from_be_bytes(bytes))
}

impl EventLog for OutboxLog {
    async fn append(&self, records: Vec<KeyedRecord>) -> Result<(), BoxError> {
        let rows = records
            .into_iter()
            .map(|r| {
                let headers = r.headers.into_iter().map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned())).collect();
                Ok(NewOutboxRow {
                    topic: r.topic,
                    partition_key: partition_key(&r.key)?,
                    payload: r.value,
                    headers: crate::headers::encode(&headers),
                    created_at_ms: r.timestamp_ms,
                })
            })
            .collect::<Result<Vec<_>, BoxError>>()?;
        outbox::insert(&self.db, &rows).await?;
        self.wake.notify_waiters();
        Ok(())
    }

    async fn partitions(&self, _topic: &str) -> Result<i32, BoxError> {
        Ok(1)
    }

    /// 0: the outbox is never trimmed in the embedded mode.
    async fn earliest(&self, _topic: &str, _partition: i32) -> Result<i64, BoxError> {
        Ok(0)
    }

    async fn high_watermark(&self, topic: &str, _partition: i32) -> Result<i64, BoxError> {
        Ok(OutboxLog::high_watermark(self, topic).await?)
    }

    async fn fetch(&self, topic: &str, partition: i32, from: i64, limits: FetchLimits) -> Result<Fetched, BoxError> {
        if partition != PARTITION {
            return Err(format!("the outbox log has one partition, not {partition}").into());
        }
        // Registered before reading, so a commit after the read still ends the wait.
        let woken = self.wake.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let mut records = self.read(topic, from, BATCH_ROWS).await?;
        if records.is_empty() && limits.max_wait_ms > 0 {
            let wait = Duration::from_millis(limits.max_wait_ms.unsigned_abs().into());
            if tokio::time::timeout(wait, woken).await.is_ok() {
                records = self.read(topic, from, BATCH_ROWS).await?;
            }
        }
        // A short read saw the end of the topic: only a full one leaves rows to count.
        let high_watermark = match records.last() {
            Some(_) if records.len() as u64 == BATCH_ROWS => OutboxLog::high_watermark(self, topic).await?,
            Some(last) => last.offset + 1,
            // No row of the topic at or after `from`: nothing is left to read.
            None => from,
        };
        Ok(Fetched { records, high_watermark })
    }
}
