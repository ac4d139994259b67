//! One conformance suite for both implementations of the event log (`socialgraph_events::
//! EventLog`): Kafka, as the mesh uses it, and the outbox table of a SQLite file, as the
//! embedded mode uses it. Each case is written once against the trait and run on both:
//! - order per key: every record of a key is in one partition, in append order;
//! - replay: reading a partition again gives the same records at the same offsets;
//! - a copy at a later offset: the same record appended twice is two records, in order;
//! - a batch split anywhere: reading on from any offset gives exactly the rest (in the outbox,
//!   also from an offset another topic's row holds);
//! - restart resume: the shared consumer loop, stopped and started again, and failing a batch
//!   once, applies every record exactly once, in order, from the offset its handler stored,
//!   also when that offset lies inside a batch the log returns whole.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rskafka::record::RecordAndOffset;
use socialgraph_events::consumer::{BatchHandler, BoxError, ConsumerSettings, Progress, run_partition};
use socialgraph_events::{EventLog, FetchLimits, KafkaLog, KeyedRecord, OutboxLog, user_key};
use socialgraph_testkit::{Backend, TestDb, eventually, unique};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

const LIMITS: FetchLimits = FetchLimits { max_bytes: 1 << 20, max_wait_ms: 0 };
const DEADLINE: Duration = Duration::from_secs(30);

fn record(topic: &str, key: i64, value: &str) -> KeyedRecord {
    KeyedRecord {
        topic: topic.to_owned(),
        key: user_key(key).to_vec(),
        value: value.as_bytes().to_vec(),
        headers: BTreeMap::from([("event-type".to_owned(), b"test".to_vec())]),
        timestamp_ms: 1_700_000_000_000,
    }
}

fn key_of(r: &RecordAndOffset) -> i64 {
    i64::from_be_bytes(r.record.key.as_deref().unwrap_or_default().try_into().expect("8-byte key"))
}

fn value_of(r: &RecordAndOffset) -> String {
    String::from_utf8_lossy(r.record.value.as_deref().unwrap_or_default()).into_owned()
}

/// Every record of `topic`/`partition` from `from` on, read in batches until the end.
async fn read_from<L: EventLog>(log: &L, topic: &str, partition: i32, from: i64) -> anyhow::Result<Vec<RecordAndOffset>> {
    let mut out: Vec<RecordAndOffset> = Vec::new();
    let mut next = from;
    loop {
        let fetched = log.fetch(topic, partition, next, LIMITS).await.map_err(|e| anyhow::anyhow!("{e}"))?;
        let records: Vec<RecordAndOffset> = fetched.records.into_iter().filter(|r| r.offset >= next).collect();
        let Some(last) = records.last() else {
            anyhow::ensure!(next >= fetched.high_watermark, "an empty read below the high watermark ({next} < {})", fetched.high_watermark);
            return Ok(out);
        };
        next = last.offset + 1;
        out.extend(records);
    }
}

/// Every record of every partition: partition → records in offset order.
async fn read_all<L: EventLog>(log: &L, topic: &str) -> anyhow::Result<BTreeMap<i32, Vec<RecordAndOffset>>> {
    let mut out = BTreeMap::new();
    for p in 0..log.partitions(topic).await.map_err(|e| anyhow::anyhow!("{e}"))? {
        let earliest = log.earliest(topic, p).await.map_err(|e| anyhow::anyhow!("{e}"))?;
        out.insert(p, read_from(log, topic, p, earliest).await?);
    }
    Ok(out)
}

async fn append<L: EventLog>(log: &L, records: Vec<KeyedRecord>) -> anyhow::Result<()> {
    log.append(records).await.map_err(|e| anyhow::anyhow!("{e}"))
}

/// 12 keys, 5 records each, appended in 3 interleaved calls; then the order-per-key, replay,
/// copy and split cases on what the log holds.
async fn order_replay_copy_split<L: EventLog>(log: &L, topic: &str) -> anyhow::Result<()> {
    let mut expected: BTreeMap<i64, Vec<String>> = BTreeMap::new();
    for round in 0..3 {
        let mut batch = Vec::new();
        for i in 0..5 {
            for key in 1..=12_i64 {
                if (key + i) % 3 == round {
                    let value = format!("{key}:{}", expected.get(&key).map_or(0, Vec::len));
                    expected.entry(key).or_default().push(value.clone());
                    batch.push(record(topic, key, &value));
                    // Another topic's record between: in the outbox its id is a gap here.
                    batch.push(record(&format!("{topic}.other"), key, "other"));
                }
            }
        }
        append(log, batch).await?;
    }
    let all = read_all(log, topic).await?;
    // Order per key, and every key in one partition.
    let mut seen: BTreeMap<i64, (i32, Vec<String>)> = BTreeMap::new();
    for (p, records) in &all {
        assert!(records.windows(2).all(|w| w[0].offset < w[1].offset), "offsets grow within partition {p}");
        for r in records {
            let slot = seen.entry(key_of(r)).or_insert((*p, Vec::new()));
            assert_eq!(slot.0, *p, "key {} is in partitions {} and {p}", key_of(r), slot.0);
            slot.1.push(value_of(r));
        }
    }
    let got: BTreeMap<i64, Vec<String>> = seen.into_iter().map(|(k, (_, v))| (k, v)).collect();
    assert_eq!(got, expected, "every key's records in append order");

    // Replay: the same records at the same offsets.
    let again = read_all(log, topic).await?;
    let view = |m: &BTreeMap<i32, Vec<RecordAndOffset>>| -> Vec<(i32, i64, i64, String)> {
        m.iter().flat_map(|(p, rs)| rs.iter().map(move |r| (*p, r.offset, key_of(r), value_of(r)))).collect()
    };
    assert_eq!(view(&again), view(&all), "a replay reads the same records");

    // A batch split anywhere: from every offset on, exactly the rest of the partition, also
    // from an offset no record of this topic has (a gap).
    for (p, records) in &all {
        for (i, r) in records.iter().enumerate() {
            let want: Vec<i64> = records[i..].iter().map(|r| r.offset).collect();
            let mut starts = vec![r.offset];
            if i > 0 && records[i - 1].offset + 1 < r.offset {
                starts.push(records[i - 1].offset + 1);
            }
            for from in starts {
                let offsets: Vec<i64> = read_from(log, topic, *p, from).await?.iter().map(|r| r.offset).collect();
                assert_eq!(offsets, want, "reading partition {p} on from offset {from}");
            }
        }
    }

    // A copy at a later offset: appended again, it is a second record after the first.
    let copy = record(topic, 7, "7:copy");
    append(log, vec![copy.clone()]).await?;
    append(log, vec![copy]).await?;
    let after = read_all(log, topic).await?;
    let copies: Vec<i64> = after.values().flatten().filter(|r| value_of(r) == "7:copy").map(|r| r.offset).collect();
    assert_eq!(copies.len(), 2, "the log keeps both copies");
    assert!(copies[0] < copies[1], "the copy is at a later offset");
    let p7 = after.iter().find(|(_, rs)| rs.iter().any(|r| key_of(r) == 7)).map(|(p, _)| *p).expect("key 7 has a partition");
    let last_two: Vec<String> = after[&p7].iter().filter(|r| key_of(r) == 7).rev().take(2).map(value_of).collect();
    assert_eq!(last_two, ["7:copy", "7:copy"], "both copies follow key 7's earlier records");
    Ok(())
}

/// What a [`Recorder`] applied, (partition, offset, value) in order, and its stored offsets.
type Applied = (Vec<(i32, i64, String)>, HashMap<(String, i32), i64>);

/// A handler that stores its next offset with its effects (one lock), as every consumer does,
/// and fails the batch that would bring it to `fail_at` applied records once.
#[derive(Default)]
struct Recorder {
    state: Mutex<Applied>,
    fail_at: AtomicUsize,
    batches: AtomicUsize,
}

impl Recorder {
    fn applied(&self) -> Vec<(i32, i64, String)> {
        self.state.lock().unwrap().0.clone()
    }
}

impl BatchHandler for Recorder {
    async fn load_offset(&self, topic: &str, partition: i32) -> Result<Option<i64>, BoxError> {
        Ok(self.state.lock().unwrap().1.get(&(topic.to_owned(), partition)).copied())
    }

    async fn apply(&self, topic: &str, partition: i32, records: &[RecordAndOffset], next_offset: i64) -> Result<(), BoxError> {
        let mut state = self.state.lock().unwrap();
        let fail_at = self.fail_at.load(Ordering::SeqCst);
        if fail_at > 0 && state.0.len() < fail_at && state.0.len() + records.len() >= fail_at {
            self.fail_at.store(0, Ordering::SeqCst);
            return Err("a batch fails once".into());
        }
        self.batches.fetch_add(1, Ordering::SeqCst);
        state.0.extend(records.iter().map(|r| (partition, r.offset, value_of(r))));
        state.1.insert((topic.to_owned(), partition), next_offset);
        Ok(())
    }
}

/// Runs the shared consumer loop on every partition of `topic` until `want` records are applied.
async fn consume_until<L: EventLog>(
    log: &Arc<L>,
    topic: &str,
    handler: &Arc<Recorder>,
    settings: &ConsumerSettings,
    want: usize,
) -> anyhow::Result<()> {
    let cancel = CancellationToken::new();
    let partitions = log.partitions(topic).await.map_err(|e| anyhow::anyhow!("{e}"))?;
    let tasks: Vec<_> = (0..partitions)
        .map(|p| {
            let (log, h, s, c) = (Arc::clone(log), Arc::clone(handler), settings.clone(), cancel.clone());
            tokio::spawn(run_partition(log, topic.to_owned(), p, h, Progress::default(), s, Arc::new(Notify::new()), c))
        })
        .collect();
    let reached = eventually(DEADLINE, &format!("{want} records applied"), || async { Ok((handler.applied().len() >= want).then_some(())) }).await;
    cancel.cancel();
    for t in tasks {
        t.await?;
    }
    reached
}

/// Restart resume: 40 records consumed, the loop stopped, 40 more appended, the loop started
/// again (one batch failing once on the way): all 80 applied once each, in order per partition.
async fn restart_resume<L: EventLog>(log: Arc<L>, topic: &str, settings: ConsumerSettings) -> anyhow::Result<()> {
    let batch = |from: i64| (from..from + 40).map(|i| record(topic, i % 6 + 1, &format!("{}:{i}", i % 6 + 1))).collect::<Vec<_>>();
    append(log.as_ref(), batch(0)).await?;
    let handler = Arc::new(Recorder::default());
    consume_until(&log, topic, &handler, &settings, 40).await?;
    assert_eq!(handler.applied().len(), 40, "the loop stops at a batch boundary, nothing more");
    // Appended while stopped, in small calls so the next run reads several batches.
    for chunk in batch(40).chunks(7) {
        append(log.as_ref(), chunk.to_vec()).await?;
    }
    handler.fail_at.store(55, Ordering::SeqCst);
    consume_until(&log, topic, &handler, &settings, 80).await?;
    assert_eq!(handler.fail_at.load(Ordering::SeqCst), 0, "a batch failed on the way");
    let applied = handler.applied();
    assert_eq!(applied.len(), 80, "every record once: {applied:?}");
    let mut per_key: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for (p, _, value) in &applied {
        let (key, i) = value.split_once(':').expect("key:index");
        per_key.entry(format!("{p}/{key}")).or_default().push(i.parse()?);
    }
    for (key, indexes) in per_key {
        assert!(indexes.windows(2).all(|w| w[0] < w[1]), "key {key} applied in order: {indexes:?}");
    }
    let on_log = read_all(log.as_ref(), topic).await?;
    let want: Vec<(i32, i64)> = on_log.iter().flat_map(|(p, rs)| rs.iter().map(move |r| (*p, r.offset))).collect();
    let mut got: Vec<(i32, i64)> = applied.iter().map(|(p, o, _)| (*p, *o)).collect();
    got.sort_unstable();
    assert_eq!(got, want, "exactly the log's records");

    // Resuming inside a batch: a stored offset at the third record of each partition (the first
    // 40 records were one append, so Kafka holds them as one record batch per partition, and a
    // read from the middle returns the batch's first records too). The loop applies exactly the
    // records from the stored offset on.
    let resumed = Arc::new(Recorder::default());
    let mut want = Vec::new();
    for (p, records) in &on_log {
        let from = records.get(2).map_or(0, |r| r.offset);
        if records.len() > 2 {
            resumed.state.lock().unwrap().1.insert((topic.to_owned(), *p), from);
        }
        want.extend(records.iter().filter(|r| r.offset >= from).map(|r| (*p, r.offset)));
    }
    consume_until(&log, topic, &resumed, &settings, want.len()).await?;
    let mut got: Vec<(i32, i64)> = resumed.applied().iter().map(|(p, o, _)| (*p, *o)).collect();
    got.sort_unstable();
    assert_eq!(got, want, "resumed inside a batch: exactly the records from the stored offset on");
    Ok(())
}

fn kafka_settings() -> ConsumerSettings {
    ConsumerSettings { max_bytes: 4_096, ..ConsumerSettings::default() }
}

async fn kafka() -> anyhow::Result<Arc<KafkaLog>> {
    let client = socialgraph_testkit::kafka::connect(&socialgraph_testkit::kafka::brokers()).await?;
    Ok(Arc::new(KafkaLog::new(client, 3)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_keeps_order_replays_copies_and_splits() -> anyhow::Result<()> {
    order_replay_copy_split(kafka().await?.as_ref(), &unique("sg.test.log")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_consumers_resume_where_they_stopped() -> anyhow::Result<()> {
    restart_resume(kafka().await?, &unique("sg.test.log"), kafka_settings()).await
}

fn outbox_settings() -> ConsumerSettings {
    ConsumerSettings { max_wait_ms: 200, idle_max_ms: 1, deep_idle_ms: 1, ..ConsumerSettings::default() }
}

async fn outbox() -> anyhow::Result<(TestDb, Arc<OutboxLog>)> {
    let db = TestDb::create(Backend::Sqlite).await?;
    let log = Arc::new(OutboxLog { db: db.conn.clone(), wake: Arc::new(Notify::new()) });
    Ok((db, log))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_keeps_order_replays_copies_and_splits() -> anyhow::Result<()> {
    let (db, log) = outbox().await?;
    order_replay_copy_split(log.as_ref(), "sg.test.log").await?;
    db.drop_db().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_consumers_resume_where_they_stopped() -> anyhow::Result<()> {
    let (db, log) = outbox().await?;
    restart_resume(log, "sg.test.log", outbox_settings()).await?;
    db.drop_db().await
}
