//! One interface to the event log, for producers and consumers alike: Kafka in the mesh
//! ([`crate::kafka::KafkaLog`]) and the outbox table in the embedded mode
//! ([`crate::outbox_log::OutboxLog`]). Every consumer runs on [`crate::consumer::run_partition`]
//! over either, so the services and the embedded mode share one consumer loop.
//!
//! What the consumers rely on, and what the conformance suite (`integration-tests/tests/
//! event_log.rs`) checks of both (docs/src/architecture/events.md#one-log-interface):
//! - records of one key land in one partition, in the order they were appended;
//! - a partition read again from an offset gives the same records (replay);
//! - a copy of a record appended again is a new record at a later offset: the log never
//!   deduplicates, the consumers' versions do;
//! - a read may end anywhere: any batch boundaries concatenate to the same sequence;
//! - a consumer resumes from the offset it stored with its effects.

use std::future::Future;

use rskafka::record::RecordAndOffset;

use crate::consumer::BoxError;
use crate::kafka::KeyedRecord;

/// One read of a partition.
#[derive(Debug, Default)]
pub struct Fetched {
    /// Records at or after the requested offset, in offset order (possibly empty).
    pub records: Vec<RecordAndOffset>,
    /// The partition's high watermark: the offset the next appended record gets at the least.
    pub high_watermark: i64,
}

/// How much one read may return and how long it may wait for records.
#[derive(Debug, Clone, Copy)]
pub struct FetchLimits {
    /// Most bytes (Kafka) of one read.
    pub max_bytes: i32,
    /// Longest wait for a record when none is there yet, in milliseconds; 0: answer at once.
    pub max_wait_ms: i32,
}

/// A partitioned, append-only log of keyed records.
pub trait EventLog: Send + Sync + 'static {
    /// Appends `records` (each names its topic); records of one key keep their order. Returns
    /// once every record is durable, or fails (then some may still have been appended, and
    /// appending them again makes copies).
    fn append(&self, records: Vec<KeyedRecord>) -> impl Future<Output = Result<(), BoxError>> + Send;
    /// The number of partitions of `topic`.
    fn partitions(&self, topic: &str) -> impl Future<Output = Result<i32, BoxError>> + Send;
    /// The earliest offset still held by `topic`/`partition`.
    fn earliest(&self, topic: &str, partition: i32) -> impl Future<Output = Result<i64, BoxError>> + Send;
    /// The high watermark of `topic`/`partition`: the offset after its last record.
    fn high_watermark(&self, topic: &str, partition: i32) -> impl Future<Output = Result<i64, BoxError>> + Send;
    /// Records of `topic`/`partition` from offset `from` on (a read may also return some
    /// before `from`; callers skip them) and the high watermark.
    fn fetch(&self, topic: &str, partition: i32, from: i64, limits: FetchLimits) -> impl Future<Output = Result<Fetched, BoxError>> + Send;
}
