//! Benchmarks of the socialgraph services against the local PostgreSQL, Redis and broker, each
//! printed beside a raw baseline of the same work done directly on the backing store, with the
//! ratio service/raw.
//!
//! `cargo run --release -p socialgraph-integration-tests --bin bench -- all`, or one part:
//! `relation`, `projection`, `counters`, `likes` (`--help` lists each part's knobs).
//!
//! It prints numbers and asserts nothing. Every loop is bounded in count and in time, and all
//! traffic goes to 127.0.0.1. Databases and Redis keys it creates are removed at the end of
//! their part; topics stay, as the tests' do (a DeleteTopics on the tansu 0.6 broker was once
//! followed by a panic of its storage task, which left the broker unusable until restarted).

use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use hdrhistogram::Histogram;
use prost::Message;
use rand::{Rng, SeedableRng, rngs::StdRng};
use rskafka::client::Client;
use rskafka::client::partition::{Compression, OffsetAt, UnknownTopicHandling};
use rskafka::record::Record;
use sea_orm::{AccessMode, ConnectionTrait, DatabaseConnection, IsolationLevel, TransactionTrait};
use socialgraph_cache::keys::Keys;
use socialgraph_domain::{Edge, EdgeState};
use socialgraph_integration_tests::*;
use socialgraph_proto::counter::v1::counter_service_client::CounterServiceClient;
use socialgraph_proto::counter::v1::{
    BatchGetEntityCountsRequest, BatchGetUserCountersRequest, EntityRef, FavRequest, GetUserCountersRequest, LikeRequest,
};
use socialgraph_proto::events::v1::{RelationEvent, RelationEventKind};
use socialgraph_proto::projection::v1::ListFollowersRequest;
use socialgraph_proto::projection::v1::projection_service_client::ProjectionServiceClient;
use socialgraph_proto::relation::v1::relation_service_client::RelationServiceClient;
use socialgraph_proto::relation::v1::{FollowRequest, ImportEdge, ImportFollowsRequest};
use socialgraph_storage::edges::{self, Col, EdgeTable};
use socialgraph_storage::outbox::{self, NewOutboxRow};
use socialgraph_testkit::{Backend, TestDb};
use tokio::sync::Semaphore;
use tonic::transport::Channel;

/// gRPC connections a load generator spreads its workers over.
const CHANNELS: usize = 8;
/// Partitions of the topics the test configurations create.
const PARTITIONS: i32 = 4;

#[derive(Parser)]
#[command(name = "bench", about = "socialgraph benchmarks: each service beside a raw baseline of the same work")]
struct Cli {
    #[command(subcommand)]
    part: Part,
    /// Run the in-process services under a plain log subscriber (warn) instead of the services'
    /// telemetry (whose OpenTelemetry layer turns every span of every level into an OTel span),
    /// to see what that costs.
    #[arg(long, global = true)]
    plain_tracing: bool,
}

#[derive(Subcommand)]
enum Part {
    /// Follow RPC vs the same transaction on PostgreSQL; relay vs direct produce.
    Relation(RelationArgs),
    /// Follow → ListFollowers propagation; consumer apply vs raw fetch.
    Projection(ProjectionArgs),
    /// User counter reads vs redis-benchmark; memory per user counter.
    Counters(CountersArgs),
    /// Like RPC vs the raw Lua toggle; entity count reads vs MGET; memory per liked entity.
    Likes(LikesArgs),
    /// Every part, in order, with default settings.
    All,
}

#[derive(Parser, Clone)]
struct RelationArgs {
    /// Follows per run (random distinct edges).
    #[arg(long, default_value_t = 20_000)]
    follows: usize,
    /// Concurrent callers.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Longest time one closed-loop run may take.
    #[arg(long, default_value_t = 120)]
    max_secs: u64,
    /// Outbox rows loaded with ImportFollows for the relay measurement.
    #[arg(long, default_value_t = 100_000)]
    relay_rows: usize,
}

#[derive(Parser, Clone)]
struct ProjectionArgs {
    /// Offered follow rates (follows/s), open loop.
    #[arg(long, value_delimiter = ',', default_values_t = [200u32, 2000])]
    rates: Vec<u32>,
    /// Seconds each rate is offered.
    #[arg(long, default_value_t = 10)]
    secs: u64,
    /// Measure the propagation of every n-th follow.
    #[arg(long, default_value_t = 10)]
    sample_every: u64,
    /// Events in the pre-filled topic of the apply-throughput measurement.
    #[arg(long, default_value_t = 500_000)]
    events: usize,
}

#[derive(Parser, Clone)]
struct CountersArgs {
    /// Users whose counters are read.
    #[arg(long, default_value_t = 10_000)]
    users: i64,
    /// Concurrent callers.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Seconds of each read run.
    #[arg(long, default_value_t = 10)]
    secs: u64,
    /// Users of the memory measurement.
    #[arg(long, default_value_t = 100_000)]
    memory_users: i64,
}

#[derive(Parser, Clone)]
struct LikesArgs {
    /// Entities (`post`) the likes go to.
    #[arg(long, default_value_t = 2_000)]
    entities: i64,
    /// Most likes of the Like run (distinct actor/entity pairs).
    #[arg(long, default_value_t = 200_000)]
    likes: usize,
    /// Concurrent callers.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Seconds of each run.
    #[arg(long, default_value_t = 10)]
    secs: u64,
    /// MovieLens ratings (gzip CSV userId,movieId,rating,timestamp).
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/data/ml-latest-small/ratings.csv.gz"))]
    movielens: String,
}

fn defaults<T: Parser>() -> T {
    T::parse_from(["bench"])
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if cli.plain_tracing {
        // The services' telemetry init then finds a subscriber in place and leaves it.
        let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().init();
        println!("(plain tracing: the services run without their OpenTelemetry layer)");
    }
    let started = Instant::now();
    match cli.part {
        Part::Relation(a) => relation(&a).await?,
        Part::Projection(a) => projection(&a).await?,
        Part::Counters(a) => counters(&a).await?,
        Part::Likes(a) => likes(&a).await?,
        Part::All => {
            relation(&defaults()).await?;
            projection(&defaults()).await?;
            counters(&defaults()).await?;
            likes(&defaults()).await?;
        }
    }
    println!("\ntotal bench time {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Measuring and printing

type Hist = Histogram<u64>;

/// Latencies in microseconds, up to 10 minutes.
fn hist() -> Hist {
    Histogram::new_with_bounds(1, 600_000_000, 3).unwrap_or_else(|_| unreachable!("valid histogram bounds"))
}

fn ms(h: &Hist, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

/// One closed-loop run.
struct Run {
    ok: u64,
    errors: u64,
    first_error: Option<String>,
    elapsed: Duration,
    lat: Hist,
}

impl Run {
    fn rate(&self) -> f64 {
        self.ok as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    fn p50(&self) -> f64 {
        ms(&self.lat, 0.50)
    }

    fn p99(&self) -> f64 {
        ms(&self.lat, 0.99)
    }

    /// `n ok in t s` plus errors, for the notes under a table.
    fn describe(&self, what: &str) -> String {
        let mut s = format!("{what}: {} ok in {:.1} s", self.ok, self.elapsed.as_secs_f64());
        if self.errors > 0 {
            s += &format!(", {} errors (first: {})", self.errors, self.first_error.as_deref().unwrap_or("?"));
        }
        s
    }
}

/// Runs `op(worker, i)` for i = 0.. from `concurrency` workers until `max_ops` ops were started
/// or `max_time` passed; each worker waits for its op before starting the next (closed loop).
async fn closed_loop<F, Fut>(concurrency: usize, max_ops: usize, max_time: Duration, op: F) -> Run
where
    F: Fn(usize, usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let op = Arc::new(op);
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let deadline = start + max_time;
    let mut tasks = Vec::new();
    for w in 0..concurrency.max(1) {
        let (op, next) = (Arc::clone(&op), Arc::clone(&next));
        tasks.push(tokio::spawn(async move {
            let (mut lat, mut errors, mut first_error) = (hist(), 0u64, None);
            while Instant::now() < deadline {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= max_ops {
                    break;
                }
                let t = Instant::now();
                match op(w, i).await {
                    Ok(()) => lat.saturating_record(t.elapsed().as_micros() as u64),
                    Err(e) => {
                        errors += 1;
                        first_error.get_or_insert_with(|| format!("{e:#}"));
                    }
                }
            }
            (lat, errors, first_error)
        }));
    }
    let mut run = Run { ok: 0, errors: 0, first_error: None, elapsed: Duration::ZERO, lat: hist() };
    for t in tasks {
        match t.await {
            Ok((lat, errors, first_error)) => {
                let _ = run.lat.add(&lat);
                run.errors += errors;
                if run.first_error.is_none() {
                    run.first_error = first_error;
                }
            }
            Err(e) => {
                run.errors += 1;
                run.first_error.get_or_insert_with(|| format!("worker panicked: {e}"));
            }
        }
    }
    run.elapsed = start.elapsed();
    run.ok = run.lat.len();
    run
}

/// One line of a result table: the service's value, the raw baseline's, their ratio.
struct Row {
    what: String,
    svc: String,
    raw: String,
    ratio: String,
}

fn fmt_num(v: f64, unit: &str) -> String {
    let n = if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    };
    if unit.is_empty() { n } else { format!("{n} {unit}") }
}

fn row(what: impl Into<String>, svc: f64, raw: f64, unit: &str) -> Row {
    let ratio = if raw > 0.0 && svc.is_finite() { format!("{:.2}", svc / raw) } else { "-".into() };
    Row { what: what.into(), svc: fmt_num(svc, unit), raw: fmt_num(raw, unit), ratio }
}

fn print_table(title: &str, svc_label: &str, raw_label: &str, rows: &[Row], notes: &[String]) {
    let w0 = rows.iter().map(|r| r.what.len()).max().unwrap_or(0).max(6);
    let w1 = rows.iter().map(|r| r.svc.len()).max().unwrap_or(0).max(svc_label.len());
    let w2 = rows.iter().map(|r| r.raw.len()).max().unwrap_or(0).max(raw_label.len());
    println!("\n{title}");
    println!("  {:<w0$} | {:>w1$} | {:>w2$} | {:>7}", "metric", svc_label, raw_label, "svc/raw");
    println!("  {:-<w0$}-+-{:->w1$}-+-{:->w2$}-+-{:->7}", "", "", "", "");
    for r in rows {
        println!("  {:<w0$} | {:>w1$} | {:>w2$} | {:>7}", r.what, r.svc, r.raw, r.ratio);
    }
    for n in notes {
        println!("  * {n}");
    }
}

fn header(part: &str) {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    println!("\n==================== {part} (load average {}) ====================", load.join(" "));
}

fn progress(msg: &str) {
    println!("  .. {msg}");
}

/// splitmix64: cheap, reproducible pseudo-random ids derived from an op index.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// `n` distinct directed edges among users `1..=users`, no self-loops.
fn distinct_edges(n: usize, users: i64, seed: u64) -> Vec<(i64, i64)> {
    assert!((users as f64) * (users as f64 - 1.0) > 2.0 * n as f64, "too few users for {n} distinct edges");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut seen = HashSet::with_capacity(n);
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let (a, b) = (rng.random_range(1..=users), rng.random_range(1..=users));
        if a != b && seen.insert((a, b)) {
            out.push((a, b));
        }
    }
    out
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or_default()
}

async fn channels(svc: &Svc, n: usize) -> anyhow::Result<Vec<Channel>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        // Distinct connections: a Channel's clones share one HTTP/2 connection.
        out.push(svc.channel().await?);
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Broker and Redis helpers

async fn kafka() -> anyhow::Result<Client> {
    socialgraph_testkit::kafka::connect(&socialgraph_testkit::kafka::brokers()).await
}

async fn create_topic(client: &Client, topic: &str, partitions: i32) -> anyhow::Result<()> {
    client.controller_client()?.create_topic(topic, partitions, 1, 5_000).await?;
    Ok(())
}

/// A patient connection to the shared Redis (long response timeout: big pipelines on a busy
/// machine).
async fn bench_redis() -> anyhow::Result<redis::aio::MultiplexedConnection> {
    redis_conn(&socialgraph_testkit::redis_url()).await
}

/// A key prefix of this run's own Redis keys.
fn bench_prefix() -> String {
    socialgraph_testkit::unique("sgbench:") + ":"
}

/// Deletes every key under `prefix` (SCAN + UNLINK, bounded by the key count).
async fn delete_prefix(conn: &mut redis::aio::MultiplexedConnection, prefix: &str) -> anyhow::Result<u64> {
    let pattern = format!("{prefix}*");
    let mut cursor: u64 = 0;
    let mut deleted = 0u64;
    for _ in 0..1_000_000 {
        let (next, keys): (u64, Vec<String>) =
            redis::cmd("SCAN").arg(cursor).arg("MATCH").arg(&pattern).arg("COUNT").arg(5_000).query_async(conn).await?;
        if !keys.is_empty() {
            deleted += redis::cmd("UNLINK").arg(&keys).query_async::<u64>(conn).await?;
        }
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    Ok(deleted)
}

async fn used_memory(conn: &mut redis::aio::MultiplexedConnection) -> anyhow::Result<i64> {
    let info: String = redis::cmd("INFO").arg("memory").query_async(conn).await?;
    info.lines().find_map(|l| l.strip_prefix("used_memory:")).and_then(|v| v.trim().parse().ok()).context("INFO memory has no used_memory")
}

/// MEMORY USAGE of each key (0 for a missing key), pipelined.
async fn memory_usage(conn: &mut redis::aio::MultiplexedConnection, keys: &[String]) -> anyhow::Result<Vec<u64>> {
    let mut out = Vec::with_capacity(keys.len());
    for chunk in keys.chunks(1_000) {
        let mut pipe = redis::pipe();
        for k in chunk {
            pipe.cmd("MEMORY").arg("USAGE").arg(k).arg("SAMPLES").arg(0);
        }
        let v: Vec<Option<u64>> = pipe.query_async(conn).await?;
        out.extend(v.into_iter().map(Option::unwrap_or_default));
    }
    Ok(out)
}

/// redis-benchmark's summary of one test (`--csv`).
struct RedisBench {
    rps: f64,
    p50: f64,
    p99: f64,
}

/// Runs `redis-benchmark --csv` against the local Redis with `args` and parses its last line.
async fn redis_benchmark(args: &[String]) -> anyhow::Result<RedisBench> {
    let out = tokio::time::timeout(
        Duration::from_secs(300),
        tokio::process::Command::new("redis-benchmark").args(["-h", "127.0.0.1", "-p", "6379", "--csv"]).args(args).kill_on_drop(true).output(),
    )
    .await
    .context("redis-benchmark took longer than 300 s")?
    .context("redis-benchmark is not installed (it comes with redis-tools)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with('"') && !l.starts_with("\"test\""))
        .with_context(|| format!("no result from redis-benchmark: {} {}", text.trim(), String::from_utf8_lossy(&out.stderr).trim()))?;
    // "test","rps","avg","min","p50","p95","p99","max": the test name may be long, so read from the right.
    let fields: Vec<&str> = line.trim().trim_matches('"').rsplit("\",\"").collect();
    let num = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(f64::NAN);
    Ok(RedisBench { rps: num(6), p50: num(3), p99: num(1) })
}

// ---------------------------------------------------------------------------------------------
// 1. relation: Follow RPC vs the raw transaction; relay vs direct produce

async fn relation(a: &RelationArgs) -> anyhow::Result<()> {
    header("relation: Follow on PostgreSQL, outbox relay");
    let edges = Arc::new(distinct_edges(a.follows, 200_000, 1));
    let max_time = Duration::from_secs(a.max_secs);

    progress(&format!("Follow RPC, {} follows, concurrency {}, relay on", a.follows, a.concurrency));
    let rpc = follow_rpc(&edges, a.concurrency, max_time, true).await?;
    progress("Follow RPC, relay off");
    let rpc_no_relay = follow_rpc(&edges, a.concurrency, max_time, false).await?;
    progress("raw transaction on PostgreSQL");
    let (raw, sync_commit) = follow_raw(&edges, a.concurrency, max_time).await?;
    progress("raw transaction plus the RPC's other steps (pre-read, Redis token bucket), in process");
    let steps = follow_raw_steps(&edges, a.concurrency, max_time).await?;
    print_table(
        &format!("Follow: {} random distinct edges, concurrency {}", a.follows, a.concurrency),
        "Follow RPC",
        "raw SQL tx",
        &[
            row("throughput (relay on)", rpc.rate(), raw.rate(), "/s"),
            row("p50 latency (relay on)", rpc.p50(), raw.p50(), "ms"),
            row("p99 latency (relay on)", rpc.p99(), raw.p99(), "ms"),
            row("throughput (relay off)", rpc_no_relay.rate(), raw.rate(), "/s"),
            row("p50 latency (relay off)", rpc_no_relay.p50(), raw.p50(), "ms"),
            row("p99 latency (relay off)", rpc_no_relay.p99(), raw.p99(), "ms"),
            row("raw + pre-read + token bucket /s", steps.rate(), raw.rate(), "/s"),
            row("raw + pre-read + token bucket p50", steps.p50(), raw.p50(), "ms"),
            row("raw + pre-read + token bucket p99", steps.p99(), raw.p99(), "ms"),
        ],
        &[
            format!(
                "raw = one sea-orm transaction per follow on its own pool of {} (relation-svc's in this configuration): \
                 READ COMMITTED, SELECT .. FOR UPDATE, COUNT, INSERT edge, INSERT outbox row, COMMIT (storage crate functions)",
                service_pool_size()
            ),
            "the RPC adds a pre-read of the edge outside the transaction and a Redis token-bucket script".into(),
            format!("fresh test databases on both sides, synchronous_commit = {sync_commit}"),
            rpc.describe("RPC relay on"),
            rpc_no_relay.describe("RPC relay off"),
            raw.describe("raw"),
            steps.describe("raw + pre-read + token bucket (the service's own TokenBucket, Redis pool of 16, no gRPC)"),
        ],
    );

    progress(&format!("relay: {} outbox rows through ImportFollows with the relay off", a.relay_rows));
    let r = relay(a.relay_rows).await?;
    print_table(
        &format!("Outbox relay: {} rows waiting in the outbox, {PARTITIONS} partitions", r.rows),
        "relay",
        "rskafka produce",
        &[row("rows published/s", r.relay_rate, r.raw_rate, "/s")],
        &[
            format!(
                "relay = start relation-svc with the relay on over the filled outbox, until the outbox is empty \
                 ({:.1} s, includes start-up)",
                r.relay_secs
            ),
            "raw = the same rows (read beforehand) produced with rskafka to a fresh topic, rounds of 1000 rows, \
             partitions in parallel, Lz4 (the relay's pattern without the outbox SELECT/DELETE)"
                .into(),
            format!("ImportFollows of {} edges (relay off): {:.0} edges/s", r.rows, r.import_rate),
        ],
    );
    Ok(())
}

async fn relation_clients(svc: &Svc) -> anyhow::Result<Vec<RelationServiceClient<Channel>>> {
    Ok(channels(svc, CHANNELS).await?.into_iter().map(RelationServiceClient::new).collect())
}

async fn follow_rpc(edges: &Arc<Vec<(i64, i64)>>, concurrency: usize, max_time: Duration, relay: bool) -> anyhow::Result<Run> {
    let (db, svc, _topic) = relation_on(Backend::Postgres, |c| c.kafka.relay_enabled = relay).await?;
    let clients = relation_clients(&svc).await?;
    let e = Arc::clone(edges);
    let run = closed_loop(concurrency, e.len(), max_time, move |w, i| {
        let mut c = clients[w % clients.len()].clone();
        let (follower_id, followee_id) = e[i];
        async move {
            let r = c.follow(FollowRequest { follower_id, followee_id }).await?.into_inner();
            anyhow::ensure!(r.changed, "follow {follower_id}->{followee_id} changed nothing");
            Ok(())
        }
    })
    .await;
    svc.stop().await?;
    db.drop_db().await?;
    Ok(run)
}

/// The event row the service writes for a follow (same payload and header shape).
fn event_row(topic: &str, edge: &Edge, now: i64, seq: u64) -> NewOutboxRow {
    let event = RelationEvent {
        event_id: format!("{:08x}-{:04x}-7000-8000-{:012x}", now as u64 >> 16, now as u64 & 0xffff, seq),
        kind: RelationEventKind::Followed as i32,
        follower_id: edge.follower_id,
        followee_id: edge.followee_id,
        version: edge.version,
        occurred_at: Some(socialgraph_domain::timestamp_from_ms(now)),
        followed_at: Some(socialgraph_domain::timestamp_from_ms(edge.followed_at_ms)),
    };
    let mut h = BTreeMap::new();
    h.insert("traceparent".to_owned(), format!("00-{:032x}-{:016x}-01", mix(seq) as u128 | 1, mix(seq + 1) | 1));
    h.insert(socialgraph_events::headers::EVENT_TYPE.to_owned(), "socialgraph.events.v1.RelationEvent".to_owned());
    h.insert(socialgraph_events::headers::SCHEMA.to_owned(), "v1".to_owned());
    NewOutboxRow {
        topic: topic.to_owned(),
        partition_key: edge.follower_id,
        payload: event.encode_to_vec(),
        headers: socialgraph_events::headers::encode(&h),
        created_at_ms: now,
    }
}

async fn raw_follow_tx(db: &DatabaseConnection, follower_id: i64, followee_id: i64, seq: u64) -> anyhow::Result<()> {
    let txn = db.begin_with_config(Some(IsolationLevel::ReadCommitted), Some(AccessMode::ReadWrite)).await?;
    let old = edges::get(&txn, EdgeTable::Following, follower_id, followee_id, true).await?;
    let count = edges::count(&txn, EdgeTable::Following, Col::FollowerId, follower_id).await?;
    anyhow::ensure!(count < 5_000, "cap reached");
    let now = now_ms();
    let edge = Edge {
        follower_id,
        followee_id,
        state: EdgeState::Following,
        version: old.map_or(1, |e| e.version + 1),
        followed_at_ms: now,
        updated_at_ms: now,
    };
    edges::insert(&txn, EdgeTable::Following, &[edge]).await?;
    outbox::insert(&txn, &[event_row("sg.relation.bench", &edge, now, seq)]).await?;
    txn.commit().await?;
    Ok(())
}

/// The database pool relation-svc gets in the test configuration (the raw side uses the same).
fn service_pool_size() -> u32 {
    relation_config("postgres://unused", "unused").database.max_connections
}

/// The raw transactions on a fresh database; returns the run and the database's
/// `synchronous_commit` (the test databases' durability setting applies to both sides).
async fn follow_raw(edges: &Arc<Vec<(i64, i64)>>, concurrency: usize, max_time: Duration) -> anyhow::Result<(Run, String)> {
    let db = TestDb::create(Backend::Postgres).await?;
    let pool = socialgraph_storage::connect(&db.url, service_pool_size()).await?;
    let sync_commit: String = match pool.query_one_raw(sea_orm::Statement::from_string(sea_orm::DbBackend::Postgres, "SHOW synchronous_commit")).await
    {
        Ok(Some(r)) => r.try_get_by_index(0).unwrap_or_else(|_| "?".into()),
        _ => "?".into(),
    };
    let e = Arc::clone(edges);
    let p = pool.clone();
    let run = closed_loop(concurrency, e.len(), max_time, move |_, i| {
        let pool = p.clone();
        let (f, t) = e[i];
        async move { raw_follow_tx(&pool, f, t, i as u64).await }
    })
    .await;
    pool.close().await.ok();
    db.drop_db().await?;
    Ok((run, sync_commit))
}

/// The RPC's steps without gRPC: the pre-read outside the transaction, the service's Redis
/// token bucket (pool of 16, as configured), then the raw transaction.
async fn follow_raw_steps(edges: &Arc<Vec<(i64, i64)>>, concurrency: usize, max_time: Duration) -> anyhow::Result<Run> {
    use socialgraph_cache::rate_limit::{TokenBucket, Verdict};
    let db = TestDb::create(Backend::Postgres).await?;
    let pool = socialgraph_storage::connect(&db.url, service_pool_size()).await?;
    let bp = bench_prefix();
    let redis = socialgraph_cache::pool(&socialgraph_testkit::redis_url(), 16, Duration::from_millis(250))?;
    let limiter = Arc::new(TokenBucket::new(redis, 1_000_000, 1_000_000, Duration::from_millis(250)));
    let keys = Keys::new(bp.clone());
    let e = Arc::clone(edges);
    let p = pool.clone();
    let run = closed_loop(concurrency, e.len(), max_time, move |_, i| {
        let (pool, limiter) = (p.clone(), Arc::clone(&limiter));
        let (f, t) = e[i];
        let key = keys.follow_rate_limit(f);
        async move {
            let pre = edges::get(&pool, EdgeTable::Following, f, t, false).await?;
            anyhow::ensure!(pre.is_none(), "edge exists");
            anyhow::ensure!(limiter.take(&key).await? == Verdict::Allowed, "rate limited");
            raw_follow_tx(&pool, f, t, i as u64).await
        }
    })
    .await;
    pool.close().await.ok();
    db.drop_db().await?;
    delete_prefix(&mut bench_redis().await?, &bp).await?;
    Ok(run)
}

struct RelayResult {
    rows: i64,
    import_rate: f64,
    relay_rate: f64,
    relay_secs: f64,
    raw_rate: f64,
}

/// Imports `edges` through ImportFollows in messages of 1000 edges; returns edges/s.
async fn import(svc: &Svc, edges: &[(i64, i64)]) -> anyhow::Result<f64> {
    let mut client = svc.client().await?;
    let msgs: Vec<ImportFollowsRequest> = edges
        .chunks(1_000)
        .map(|c| ImportFollowsRequest { edges: c.iter().map(|&(f, e)| ImportEdge { follower_id: f, followee_id: e, followed_at: None }).collect() })
        .collect();
    let t = Instant::now();
    let r = client.import_follows(admin(futures::stream::iter(msgs))).await?.into_inner();
    anyhow::ensure!(r.imported == edges.len() as i64, "imported {} of {} edges", r.imported, edges.len());
    Ok(edges.len() as f64 / t.elapsed().as_secs_f64())
}

async fn relay(rows: usize) -> anyhow::Result<RelayResult> {
    let (db, svc, topic) = relation_on(Backend::Postgres, |c| c.kafka.relay_enabled = false).await?;
    let edges = distinct_edges(rows, 1_000_000, 2);
    let import_rate = import(&svc, &edges).await?;
    let (backlog, _) = outbox::backlog(&db.conn).await?;
    svc.stop().await?;

    // Raw: the same rows, straight to a fresh topic.
    let outbox_rows = outbox::fetch(&db.conn, backlog as usize).await?;
    let client = kafka().await?;
    let raw_topic = socialgraph_testkit::unique("sg.bench.raw.");
    create_topic(&client, &raw_topic, PARTITIONS).await?;
    let mut pcs = Vec::new();
    for p in 0..PARTITIONS {
        pcs.push(client.partition_client(raw_topic.as_str(), p, UnknownTopicHandling::Retry).await?);
    }
    let t = Instant::now();
    for round in outbox_rows.chunks(1_000) {
        let mut groups: BTreeMap<i32, Vec<Record>> = BTreeMap::new();
        for r in round {
            let key = r.row.partition_key.to_be_bytes().to_vec();
            let p = socialgraph_events::kafka_partition(&key, PARTITIONS);
            groups.entry(p).or_default().push(Record {
                key: Some(key),
                value: Some(r.row.payload.clone()),
                headers: socialgraph_events::headers::decode(&r.row.headers),
                timestamp: rskafka::chrono::DateTime::from_timestamp_millis(r.row.created_at_ms).unwrap_or_default(),
            });
        }
        let results = futures::future::join_all(groups.into_iter().map(|(p, recs)| pcs[p as usize].produce(recs, Compression::Lz4))).await;
        for r in results {
            r?;
        }
    }
    let raw_rate = outbox_rows.len() as f64 / t.elapsed().as_secs_f64();

    // The relay over the same outbox.
    let t = Instant::now();
    let svc = spawn_relation(relation_config(&db.url, &topic)).await?;
    outbox_drained(&db, Duration::from_secs(900)).await?;
    let relay_secs = t.elapsed().as_secs_f64();
    svc.stop().await?;
    db.drop_db().await?;
    Ok(RelayResult { rows: backlog, import_rate, relay_rate: backlog as f64 / relay_secs, relay_secs, raw_rate })
}

// ---------------------------------------------------------------------------------------------
// 2. projection: propagation latency; consumer apply vs raw fetch

async fn projection(a: &ProjectionArgs) -> anyhow::Result<()> {
    header("projection: Follow → ListFollowers propagation, consumer apply throughput");
    let (db, relation, topic) = relation_on(Backend::Postgres, |_| {}).await?;
    let proj = spawn_projection(projection_config(&db.url, &topic, relation.addr)).await?;
    let rc = relation_clients(&relation).await?;
    let pc: Vec<ProjectionServiceClient<Channel>> = channels(&proj, CHANNELS).await?.into_iter().map(ProjectionServiceClient::new).collect();
    // Warm up: the topic exists and the consumers run once one follow made it through.
    progress("warm-up");
    let warm = propagate(&rc, &pc, 50, 2, 1, 1_000_000_000).await?;
    anyhow::ensure!(!warm.prop.is_empty(), "nothing propagated during the warm-up ({} errors)", warm.errors);

    let client = kafka().await?;
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    for (k, &rate) in a.rates.iter().enumerate() {
        progress(&format!("{rate} follows/s for {} s, every {}th measured", a.secs, a.sample_every));
        let base = 2_000_000_000 + k as i64 * 100_000_000;
        let s = propagate(&rc, &pc, rate, a.secs, a.sample_every, base).await?;
        progress(&format!("raw produce → fetch at {rate} records/s for {} s", a.secs));
        let raw = raw_transit(&client, rate, a.secs).await?;
        rows.push(row(format!("p50 @ {rate}/s"), ms(&s.prop, 0.5), ms(&raw, 0.5), "ms"));
        rows.push(row(format!("p99 @ {rate}/s"), ms(&s.prop, 0.99), ms(&raw, 0.99), "ms"));
        notes.push(format!(
            "{rate}/s offered: {} follows acked ({:.0}/s achieved, Follow p50 {:.1} ms p99 {:.1} ms), {} measured \
             ({} not measured: 64 pollers busy), {} errors{}, {} not seen within 30 s, {} not sent (4096 in flight); \
             raw measured {} records",
            s.acked,
            s.achieved,
            ms(&s.ack, 0.5),
            ms(&s.ack, 0.99),
            s.prop.len(),
            s.skipped,
            s.errors,
            s.first_error.as_deref().map(|e| format!(" (first: {e})")).unwrap_or_default(),
            s.timeouts,
            s.dropped,
            raw.len()
        ));
    }
    notes.insert(
        0,
        "svc = Follow acknowledged → follower listed by ProjectionService.ListFollowers of its (new) followee, page_size 1, \
         polled every 2 ms, then every tenth of the time waited (at most 20 ms)"
            .into(),
    );
    notes.insert(
        1,
        "raw = a record offered at the same rate → returned by a per-partition fetch loop (max_wait 5 ms, no sleep); \
         rskafka producer with one request in flight per partition, each taking every record waiting (like the relay)"
            .into(),
    );
    print_table("Propagation latency, open loop", "svc", "raw broker", &rows, &notes);
    proj.stop().await?;
    relation.stop().await?;
    db.drop_db().await?;

    apply_throughput(a.events).await
}

struct Propagation {
    acked: u64,
    achieved: f64,
    errors: u64,
    first_error: Option<String>,
    timeouts: u64,
    dropped: u64,
    skipped: u64,
    ack: Hist,
    prop: Hist,
}

/// Offers `rate` follows/s for `secs` s (open loop: one task per tick, at most 4096 in flight);
/// every `sample_every`-th follow is then polled on ListFollowers until it appears.
async fn propagate(
    rc: &[RelationServiceClient<Channel>],
    pc: &[ProjectionServiceClient<Channel>],
    rate: u32,
    secs: u64,
    sample_every: u64,
    base: i64,
) -> anyhow::Result<Propagation> {
    #[derive(Default)]
    struct Shared {
        ack: Option<Hist>,
        prop: Option<Hist>,
        errors: u64,
        first_error: Option<String>,
        timeouts: u64,
    }
    let shared = Arc::new(std::sync::Mutex::new(Shared { ack: Some(hist()), prop: Some(hist()), ..Default::default() }));
    let in_flight = Arc::new(Semaphore::new(4096));
    let pollers = Arc::new(Semaphore::new(64));
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate.max(1))));
    let start = Instant::now();
    let end = start + Duration::from_secs(secs);
    let (mut i, mut dropped, mut skipped) = (0u64, 0u64, 0u64);
    let mut tasks = tokio::task::JoinSet::new();
    while Instant::now() < end && i < u64::from(rate) * secs + 1 {
        tick.tick().await;
        let Ok(permit) = Arc::clone(&in_flight).try_acquire_owned() else {
            dropped += 1;
            i += 1;
            continue;
        };
        // Every followee is new, so its first follower is the one this follow adds.
        let follower = base + (i % 4_000) as i64 + 1;
        let followee = base + 10_000 + i as i64;
        // Sampled follows are polled; at most 64 pollers at once, so that polling cannot
        // swamp the services it measures (an overloaded run measures fewer follows instead).
        let poller = if i % sample_every.max(1) == 0 {
            let p = Arc::clone(&pollers).try_acquire_owned().ok();
            if p.is_none() {
                skipped += 1;
            }
            p
        } else {
            None
        };
        let mut r = rc[i as usize % rc.len()].clone();
        let mut p = pc[i as usize % pc.len()].clone();
        let shared = Arc::clone(&shared);
        tasks.spawn(async move {
            let _permit = permit;
            let t = Instant::now();
            if let Err(e) = r.follow(FollowRequest { follower_id: follower, followee_id: followee }).await {
                let mut s = shared.lock().unwrap_or_else(|e| e.into_inner());
                s.first_error.get_or_insert_with(|| format!("{:?}: {}", e.code(), e.message()));
                s.errors += 1;
                return;
            }
            let acked = Instant::now();
            if let Some(h) = shared.lock().unwrap_or_else(|e| e.into_inner()).ack.as_mut() {
                h.saturating_record((acked - t).as_micros() as u64);
            }
            let Some(_poller) = poller else {
                return;
            };
            let deadline = acked + Duration::from_secs(30);
            while Instant::now() < deadline {
                let req = ListFollowersRequest { user_id: followee, page_size: 1, page_token: String::new() };
                let listed = match p.list_followers(req).await {
                    Ok(resp) => resp.into_inner().followers.iter().any(|f| f.user_id == follower),
                    Err(_) => false,
                };
                if listed {
                    let seen = acked.elapsed().as_micros() as u64;
                    if let Some(h) = shared.lock().unwrap_or_else(|e| e.into_inner()).prop.as_mut() {
                        h.saturating_record(seen);
                    }
                    return;
                }
                // Every 2 ms at first, then a tenth of the time waited so far (at most 20 ms):
                // about 10% resolution at any latency, and little load when latency is high.
                let wait = (acked.elapsed() / 10).clamp(Duration::from_millis(2), Duration::from_millis(20));
                tokio::time::sleep(wait).await;
            }
            shared.lock().unwrap_or_else(|e| e.into_inner()).timeouts += 1;
        });
        i += 1;
    }
    let offered_secs = start.elapsed().as_secs_f64();
    // Stragglers: each task ends by itself within 30 s of its ack (bounded).
    let drain = tokio::time::timeout(Duration::from_secs(120), async { while tasks.join_next().await.is_some() {} }).await;
    if drain.is_err() {
        tasks.abort_all();
    }
    let mut s = shared.lock().unwrap_or_else(|e| e.into_inner());
    let ack = s.ack.take().unwrap_or_else(hist);
    let prop = s.prop.take().unwrap_or_else(hist);
    Ok(Propagation {
        first_error: s.first_error.take(),
        acked: ack.len(),
        achieved: ack.len() as f64 / offered_secs,
        errors: s.errors,
        timeouts: s.timeouts,
        dropped,
        skipped,
        ack,
        prop,
    })
}

/// Offers records at `rate`/s for `secs` s to a fresh topic: one producer task per partition
/// sends every record waiting, one request in flight (like the relay), while a fetch loop per
/// partition reads them back; latency = record offered → record fetched.
async fn raw_transit(client: &Client, rate: u32, secs: u64) -> anyhow::Result<Hist> {
    let topic = socialgraph_testkit::unique("sg.bench.transit.");
    create_topic(client, &topic, PARTITIONS).await?;
    let mut pcs = Vec::new();
    for p in 0..PARTITIONS {
        pcs.push(Arc::new(client.partition_client(topic.as_str(), p, UnknownTopicHandling::Retry).await?));
    }
    let start = Instant::now();
    let produced = Arc::new(AtomicU64::new(0));
    let stop = tokio_util::sync::CancellationToken::new();
    let mut fetchers = Vec::new();
    for pcl in &pcs {
        let (pcl, stop) = (Arc::clone(pcl), stop.clone());
        fetchers.push(tokio::spawn(async move {
            let mut h = hist();
            let mut offset = 0i64;
            // Bounded: stops when told, or after secs + 90 s.
            let hard_end = start + Duration::from_secs(secs + 90);
            while !stop.is_cancelled() && Instant::now() < hard_end {
                let Ok((records, _hw)) = pcl.fetch_records(offset, 1..4_000_000, 5).await else {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                };
                let now = start.elapsed().as_micros() as u64;
                for r in records {
                    offset = offset.max(r.offset + 1);
                    if let Some(v) = r.record.value.as_deref().and_then(|v| v.get(..8)) {
                        let mut b = [0u8; 8];
                        b.copy_from_slice(v);
                        h.saturating_record(now.saturating_sub(u64::from_be_bytes(b)));
                    }
                }
            }
            h
        }));
    }
    let mut senders = Vec::new();
    let mut producers = Vec::new();
    for pcl in &pcs {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
        senders.push(tx);
        let (pcl, produced) = (Arc::clone(pcl), Arc::clone(&produced));
        producers.push(tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                let mut offered = vec![first];
                while offered.len() < 1_000 {
                    match rx.try_recv() {
                        Ok(x) => offered.push(x),
                        Err(_) => break,
                    }
                }
                let n = offered.len() as u64;
                let records = offered
                    .into_iter()
                    .map(|t| {
                        let mut value = t.to_be_bytes().to_vec();
                        value.extend_from_slice(&[0u8; 64]);
                        Record {
                            key: Some(t.to_be_bytes().to_vec()),
                            value: Some(value),
                            headers: BTreeMap::new(),
                            timestamp: rskafka::chrono::Utc::now(),
                        }
                    })
                    .collect();
                if pcl.produce(records, Compression::Lz4).await.is_ok() {
                    produced.fetch_add(n, Ordering::Relaxed);
                }
            }
        }));
    }
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate.max(1))));
    let end = start + Duration::from_secs(secs);
    let mut i = 0u64;
    while Instant::now() < end && i < u64::from(rate) * secs + 1 {
        tick.tick().await;
        let _ = senders[(i % PARTITIONS as u64) as usize].send(start.elapsed().as_micros() as u64);
        i += 1;
    }
    drop(senders);
    let _ = tokio::time::timeout(Duration::from_secs(60), futures::future::join_all(producers)).await;
    // Let the fetchers see the last records, then stop them.
    let want = produced.load(Ordering::Relaxed);
    let wait_end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < wait_end {
        let hw = socialgraph_testkit::kafka::high_watermarks(client, &topic).await?;
        if hw.values().sum::<i64>() as u64 >= want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.cancel();
    let mut h = hist();
    for f in fetchers {
        if let Ok(x) = f.await {
            let _ = h.add(&x);
        }
    }
    Ok(h)
}

async fn apply_throughput(events: usize) -> anyhow::Result<()> {
    progress(&format!("apply throughput: ImportFollows of {events} edges with the relay on"));
    let (db, relation, topic) = relation_on(Backend::Postgres, |_| {}).await?;
    let edges = distinct_edges(events, 1_000_000, 3);
    let t = Instant::now();
    let import_rate = import(&relation, &edges).await?;
    outbox_drained(&db, Duration::from_secs(1_800)).await?;
    let drained_secs = t.elapsed().as_secs_f64();
    let client = kafka().await?;
    let hw = socialgraph_testkit::kafka::high_watermarks(&client, &topic).await?;
    let total: i64 = hw.values().sum();

    progress(&format!("raw fetch of {total} records"));
    let (raw_records, raw_secs) = raw_fetch(&client, &topic, &hw).await?;

    progress("projection-svc from offset 0 until caught up");
    let t = Instant::now();
    let proj = spawn_projection(projection_config(&db.url, &topic, relation.addr)).await?;
    projection_caught_up(&proj, &socialgraph_testkit::kafka::brokers(), &topic, Duration::from_secs(1_800)).await?;
    let apply_secs = t.elapsed().as_secs_f64();
    let metrics = proj.metrics().await.unwrap_or_default();
    let applied = metric(&metrics, "sg_projection_applied_total");
    print_table(
        &format!("Consumer apply: {total} events pre-filled in {PARTITIONS} partitions"),
        "projection-svc",
        "rskafka fetch",
        &[row("events/s", total as f64 / apply_secs, raw_records as f64 / raw_secs, "/s")],
        &[
            format!(
                "svc = spawn projection-svc on an empty follower table until its offsets reach the high watermarks \
                 ({apply_secs:.1} s, includes start-up; {applied} events applied)"
            ),
            format!(
                "raw = partition clients fetching every partition in parallel from offset 0 to the high watermark, \
                 4 MB per fetch, max_wait 5 ms, records decoded by rskafka but not applied ({raw_records} records in {raw_secs:.2} s)"
            ),
            format!(
                "fill: ImportFollows {import_rate:.0} edges/s; import + relay until the outbox was empty: {drained_secs:.1} s \
                 ({:.0} events/s end to end)",
                events as f64 / drained_secs
            ),
        ],
    );
    proj.stop().await?;
    relation.stop().await?;
    db.drop_db().await?;
    Ok(())
}

/// Fetches every partition from offset 0 to `hw` in parallel; returns (records, seconds).
async fn raw_fetch(client: &Client, topic: &str, hw: &BTreeMap<i32, i64>) -> anyhow::Result<(u64, f64)> {
    let mut pcs = Vec::new();
    for (&p, &h) in hw {
        pcs.push((client.partition_client(topic, p, UnknownTopicHandling::Error).await?, h));
    }
    let t = Instant::now();
    let results = futures::future::join_all(pcs.into_iter().map(|(pcl, h)| async move {
        let mut offset = pcl.get_offset(OffsetAt::Earliest).await?;
        let mut n = 0u64;
        let deadline = Instant::now() + Duration::from_secs(900);
        while offset < h {
            if Instant::now() > deadline {
                bail!("raw fetch took longer than 900 s");
            }
            let (records, _) = pcl.fetch_records(offset, 1..4 * 1024 * 1024, 5).await?;
            for r in records {
                if r.offset >= offset {
                    offset = r.offset + 1;
                    n += 1;
                }
            }
        }
        anyhow::Ok(n)
    }))
    .await;
    let mut total = 0;
    for r in results {
        total += r?;
    }
    Ok((total, t.elapsed().as_secs_f64()))
}

// ---------------------------------------------------------------------------------------------
// 3. counters: user counter reads vs redis-benchmark; memory per user counter

async fn counters(a: &CountersArgs) -> anyhow::Result<()> {
    header("counters: user counter reads, memory per user");
    let mut m = Mesh::start(&socialgraph_testkit::redis_url()).await?;
    let result = counters_in(&mut m, a).await;
    let mut conn = bench_redis().await?;
    delete_prefix(&mut conn, &m.prefix).await?;
    m.stop().await?;
    result
}

async fn counter_clients(svc: &Svc) -> anyhow::Result<Vec<CounterServiceClient<Channel>>> {
    Ok(channels(svc, CHANNELS).await?.into_iter().map(CounterServiceClient::new).collect())
}

/// Reads every user's counters once, in batches of 100 (creates missing ones).
async fn read_every_user(svc: &Svc, users: i64) -> anyhow::Result<Run> {
    let clients = counter_clients(svc).await?;
    let batches = ((users + 99) / 100) as usize;
    let run = closed_loop(8, batches, Duration::from_secs(600), move |w, i| {
        let mut c = clients[w % clients.len()].clone();
        let ids: Vec<i64> = (i as i64 * 100 + 1..=((i as i64 + 1) * 100).min(users)).collect();
        async move {
            c.batch_get_user_counters(BatchGetUserCountersRequest { user_ids: ids }).await?;
            Ok(())
        }
    })
    .await;
    if run.errors > 0 {
        println!("  ({}: later reads create what is missing)", run.describe("reading every user"));
    }
    Ok(run)
}

/// BatchGetUserCounters of 100 random ids and GetUserCounters of one, each for `secs` s.
async fn counter_reads(svc: &Svc, a: &CountersArgs, seed: u64) -> anyhow::Result<(Run, Run)> {
    let users = a.users as u64;
    let clients = counter_clients(svc).await?;
    let cl = clients.clone();
    let batch = closed_loop(a.concurrency, usize::MAX, Duration::from_secs(a.secs), move |w, i| {
        let mut c = cl[w % cl.len()].clone();
        let ids: Vec<i64> = (0..100u64).map(|k| (mix(seed ^ (i as u64 * 131 + k)) % users) as i64 + 1).collect();
        async move {
            let r = c.batch_get_user_counters(BatchGetUserCountersRequest { user_ids: ids }).await?.into_inner();
            anyhow::ensure!(r.counters.len() == 100, "{} counters for 100 ids", r.counters.len());
            Ok(())
        }
    })
    .await;
    let single = closed_loop(a.concurrency, usize::MAX, Duration::from_secs(a.secs), move |w, i| {
        let mut c = clients[w % clients.len()].clone();
        let user_id = (mix(seed ^ i as u64) % users) as i64 + 1;
        async move {
            c.get_user_counters(GetUserCountersRequest { user_id }).await?;
            Ok(())
        }
    })
    .await;
    Ok((batch, single))
}

/// Sets (`true`) or deletes the sampled-check rest key `sg:ucnt:{uid}:chk` of every user.
async fn set_check_keys(m: &Mesh, users: i64, resting: bool) -> anyhow::Result<()> {
    let keys = Keys::new(m.prefix.clone());
    let mut conn = bench_redis().await?;
    for chunk in (1..=users).collect::<Vec<_>>().chunks(1_000) {
        let mut pipe = redis::pipe();
        for &u in chunk {
            if resting {
                pipe.cmd("SET").arg(keys.user_check(u)).arg(1).arg("EX").arg(3_600).ignore();
            } else {
                pipe.del(keys.user_check(u)).ignore();
            }
        }
        pipe.query_async::<()>(&mut conn).await?;
    }
    Ok(())
}

/// Replaces the mesh's counter-svc by one with `check_interval_secs`.
async fn restart_counter(m: &mut Mesh, check_interval_secs: u64) -> anyhow::Result<()> {
    let mut config = m.counter_config();
    config.counters.check_interval_secs = check_interval_secs;
    let fresh = spawn_counter(config).await?;
    std::mem::replace(&mut m.counter, fresh).stop().await
}

async fn counters_in(m: &mut Mesh, a: &CountersArgs) -> anyhow::Result<()> {
    progress(&format!("creating the counters of {} users (one read each)", a.users));
    let create = read_every_user(&m.counter, a.users).await?;

    // Steady state: every user's sampled check is resting (as within 300 s of its last
    // check), so a read costs its GET plus one SET NX per id.
    set_check_keys(m, a.users, true).await?;
    progress(&format!("BatchGetUserCounters(100) and GetUserCounters, checks resting, concurrency {}, {} s each", a.concurrency, a.secs));
    let (batch, single) = counter_reads(&m.counter, a, 7).await?;

    progress("the same with counter-svc restarted with counters.check_interval_secs = 0");
    restart_counter(m, 0).await?;
    let (batch_nc, single_nc) = counter_reads(&m.counter, a, 8).await?;

    // Raw: the same shapes straight on Redis, keys of 20 bytes under a bench prefix.
    progress("redis-benchmark GET and MGET of 100 keys");
    let bp = bench_prefix();
    let mut conn = bench_redis().await?;
    for chunk in (0..a.users).collect::<Vec<_>>().chunks(1_000) {
        let mut pipe = redis::pipe();
        for u in chunk {
            pipe.set(format!("{bp}u:{u:012}"), [7u8; 20].as_slice()).ignore();
        }
        pipe.query_async::<()>(&mut conn).await?;
    }
    let r = a.users.to_string();
    let c = a.concurrency.to_string();
    let get =
        redis_benchmark(&["-c".into(), c.clone(), "-n".into(), "200000".into(), "-r".into(), r.clone(), "GET".into(), format!("{bp}u:__rand_int__")])
            .await?;
    let mut mget_args = vec!["-c".into(), c.clone(), "-n".into(), "100000".into(), "-r".into(), r.clone(), "MGET".into()];
    mget_args.extend((0..100).map(|_| format!("{bp}u:__rand_int__")));
    let mget = redis_benchmark(&mget_args).await?;
    delete_prefix(&mut conn, &bp).await?;

    progress(&format!("memory of {} user counters: 20-byte strings vs hashes of five fields", a.memory_users));
    let (str_usage, str_delta) = counter_memory(&mut conn, a.memory_users, false).await?;
    let (hash_usage, hash_delta) = counter_memory(&mut conn, a.memory_users, true).await?;
    print_table(
        &format!("Memory per user counter, {} users", a.memory_users),
        "string sg:ucnt",
        "hash of 5 fields",
        &[row("MEMORY USAGE bytes/user", str_usage, hash_usage, "B"), row("used_memory delta bytes/user", str_delta, hash_delta, "B")],
        &[
            "string = the service's layout: key sg:ucnt:{uid} (real key builder, bench prefix), 20-byte value (5 x u32)".into(),
            "hash = the same five counters as HSET fields fo,fe,po,lr,fr with decimal values (listpack encoding); \
             ratio < 1 means the service's layout is smaller"
                .into(),
            "MEMORY USAGE averaged over a sample of 1000 keys; used_memory delta over all keys (other clients of \
             this Redis can disturb it)"
                .into(),
        ],
    );

    // Last (its background checks outlive the run): every user's check due at once, as right
    // after counters are created or 300 s after a read of every user.
    progress("BatchGetUserCounters(100) and GetUserCounters with every user's sampled check due");
    restart_counter(m, 300).await?;
    set_check_keys(m, a.users, false).await?;
    let (batch_due, single_due) = counter_reads(&m.counter, a, 9).await?;

    print_table(
        &format!("User counter reads, {} users, concurrency {}", a.users, a.concurrency),
        "counter-svc",
        "redis-benchmark",
        &[
            row("BatchGet(100) req/s", batch.rate(), mget.rps, "/s"),
            row("BatchGet(100) p50", batch.p50(), mget.p50, "ms"),
            row("BatchGet(100) p99", batch.p99(), mget.p99, "ms"),
            row("Get req/s", single.rate(), get.rps, "/s"),
            row("Get p50", single.p50(), get.p50, "ms"),
            row("Get p99", single.p99(), get.p99, "ms"),
            row("BatchGet(100) req/s, check off", batch_nc.rate(), mget.rps, "/s"),
            row("BatchGet(100) p99, check off", batch_nc.p99(), mget.p99, "ms"),
            row("Get req/s, check off", single_nc.rate(), get.rps, "/s"),
            row("Get p99, check off", single_nc.p99(), get.p99, "ms"),
            row("BatchGet(100) req/s, checks due", batch_due.rate(), mget.rps, "/s"),
            row("BatchGet(100) p99, checks due", batch_due.p99(), mget.p99, "ms"),
            row("Get req/s, checks due", single_due.rate(), get.rps, "/s"),
            row("Get p99, checks due", single_due.p99(), get.p99, "ms"),
        ],
        &[
            "raw = redis-benchmark -c 32 on the same Redis: MGET of 100 random keys of 20 bytes (-n 100000) and GET of one \
             (-n 200000); redis-benchmark has no MGET test of its own (its MSET test writes 10 keys)"
                .into(),
            "first rows: default counter-svc, every user's sampled check resting (its sg:ucnt:{uid}:chk key set beforehand, \
             as within 300 s of a check): each read still spawns one SET NX per id"
                .into(),
            "check off = counter-svc restarted with counters.check_interval_secs = 0".into(),
            "checks due = default counter-svc, every user's check key absent: reads start a drift check per user \
             (projection-svc GetEdgeCounts and Redis reads), measured last"
                .into(),
            format!("first read of every user (creates counters from projection-svc): {:.0} ids/s", a.users as f64 / create.elapsed.as_secs_f64()),
            batch.describe("BatchGet"),
            single.describe("Get"),
            batch_nc.describe("BatchGet check off"),
            single_nc.describe("Get check off"),
            batch_due.describe("BatchGet checks due"),
            single_due.describe("Get checks due"),
        ],
    );
    Ok(())
}

/// Writes `users` counters under a bench prefix (strings of 20 bytes, or hashes of five
/// fields), measures them, deletes them. Returns (MEMORY USAGE mean, used_memory delta) per user.
async fn counter_memory(conn: &mut redis::aio::MultiplexedConnection, users: i64, as_hash: bool) -> anyhow::Result<(f64, f64)> {
    let bp = bench_prefix();
    let keys = Keys::new(bp.clone());
    let before = used_memory(conn).await?;
    let ids: Vec<i64> = (1..=users).collect();
    for chunk in ids.chunks(1_000) {
        let mut pipe = redis::pipe();
        for &u in chunk {
            let v = [(u % 5_000) as u32, (mix(u as u64) % 100_000) as u32, (u % 300) as u32, (u % 70_000) as u32, (u % 9_000) as u32];
            if as_hash {
                let key = keys.user_counters(u).replace("sg:ucnt:", "sg:ucnth:");
                pipe.cmd("HSET")
                    .arg(key)
                    .arg("fo")
                    .arg(v[0])
                    .arg("fe")
                    .arg(v[1])
                    .arg("po")
                    .arg(v[2])
                    .arg("lr")
                    .arg(v[3])
                    .arg("fr")
                    .arg(v[4])
                    .ignore();
            } else {
                pipe.set(keys.user_counters(u), socialgraph_cache::counters::Sds(v).encode().as_slice()).ignore();
            }
        }
        pipe.query_async::<()>(&mut *conn).await?;
    }
    let after = used_memory(conn).await?;
    let sample: Vec<String> = (0..1_000)
        .map(|k| (mix(k) % users as u64) as i64 + 1)
        .map(|u| if as_hash { keys.user_counters(u).replace("sg:ucnt:", "sg:ucnth:") } else { keys.user_counters(u) })
        .collect();
    let usage = memory_usage(conn, &sample).await?;
    delete_prefix(conn, &bp).await?;
    Ok((usage.iter().sum::<u64>() as f64 / usage.len() as f64, (after - before) as f64 / users as f64))
}

// ---------------------------------------------------------------------------------------------
// 4. likes: Like RPC vs the raw toggle; entity counts vs MGET; memory per liked entity

async fn likes(a: &LikesArgs) -> anyhow::Result<()> {
    header("likes: Like toggles, entity counts, memory per liked entity");
    let m = Mesh::start(&socialgraph_testkit::redis_url()).await?;
    let bp = bench_prefix();
    let result = likes_in(&m, a, &bp).await;
    let mut conn = bench_redis().await?;
    delete_prefix(&mut conn, &m.prefix).await?;
    delete_prefix(&mut conn, &bp).await?;
    m.stop().await?;
    result
}

/// Waits until `svc`'s admin port answers /ready with 200.
async fn ready(svc: &Svc) -> anyhow::Result<()> {
    let url = format!("http://{}/ready", svc.admin_addr);
    socialgraph_testkit::eventually(Duration::from_secs(60), "the service to be ready", || {
        let url = url.clone();
        async move { Ok(reqwest::get(url).await.ok().filter(|r| r.status().is_success()).map(|_| ())) }
    })
    .await
}

async fn likes_in(m: &Mesh, a: &LikesArgs, bp: &str) -> anyhow::Result<()> {
    ready(&m.counter).await?;
    let clients = counter_clients(&m.counter).await?;
    // Distinct (actor, entity) pairs; actors below 32768 keep every entity in one bitmap chunk.
    let mut rng = StdRng::seed_from_u64(5);
    let mut seen = HashSet::new();
    let mut pairs = Vec::with_capacity(a.likes);
    while pairs.len() < a.likes && seen.len() < (a.entities as usize) * 32_000 {
        let p = (rng.random_range(1..=32_767i64), rng.random_range(1..=a.entities));
        if seen.insert(p) {
            pairs.push(p);
        }
    }
    let pairs = Arc::new(pairs);
    progress(&format!("Like RPC, concurrency {}, up to {} s", a.concurrency, a.secs));
    let (cl, pp) = (clients.clone(), Arc::clone(&pairs));
    let like = closed_loop(a.concurrency, pp.len(), Duration::from_secs(a.secs), move |w, i| {
        let mut c = cl[w % cl.len()].clone();
        let (actor_id, entity_id) = pp[i];
        async move {
            let r =
                c.like(LikeRequest { actor_id, entity: Some(EntityRef { entity_type: "post".into(), entity_id }), owner_id: 0 }).await?.into_inner();
            anyhow::ensure!(r.changed, "like {actor_id} → post {entity_id} changed nothing");
            Ok(())
        }
    })
    .await;
    let publish_failures = metric(&m.counter.metrics().await.unwrap_or_default(), "sg_action_publish_failures_total");

    // Raw 1: redis-benchmark EVALSHA of the toggle script.
    progress("redis-benchmark EVALSHA of the toggle script");
    let mut conn = bench_redis().await?;
    let scripts = socialgraph_cache::entities::EntityScripts::default();
    let sha = scripts.toggle.prepare_invoke().load_async(&mut conn).await?;
    // __rand_int__ expands to 12 zero-padded digits, which GETBIT/SETBIT refuse as a bit offset
    // ("bit offset is not an integer"), so the randomness goes into the entity of the keys and
    // the bit stays fixed: every call flips a new entity's bit (the `changed` path).
    let ek = Keys::new(bp.to_owned()).entity("rb", 0);
    let tag = |k: String| k.replace("{rb:0}", "{rb:__rand_int__}");
    let mut eval_args: Vec<String> = vec!["-c".into(), a.concurrency.to_string(), "-n".into(), "200000".into()];
    eval_args.extend(["-r".into(), "100000000".into(), "EVALSHA".into(), sha.clone(), "10".into()]);
    eval_args.extend(toggle_keys(&ek, 0).into_iter().map(tag));
    eval_args.extend(["bit".into(), "4242".into(), "1".into(), "0".into(), "1".into(), "1|0|1|1|0|".into()]);
    let eval = redis_benchmark(&eval_args).await?;
    let eval_probe: redis::Value = redis::cmd("EVALSHA")
        .arg(&sha)
        .arg(10)
        .arg(toggle_keys(&ek, 0))
        .arg("bit")
        .arg("000000004242")
        .arg(1)
        .arg(0)
        .arg(1)
        .arg("1|0|1|1|0|")
        .query_async(&mut conn)
        .await
        .unwrap_or_else(|e| redis::Value::SimpleString(format!("error: {e}")));
    delete_prefix(&mut conn, bp).await?;

    // Raw 2: the same EVALSHA from this process (redis-rs), the Like run's pairs, 4 connections.
    progress("EVALSHA of the toggle script from redis-rs, the same pairs");
    let mut rconns = Vec::new();
    for _ in 0..4 {
        rconns.push(bench_redis().await?);
    }
    let (pp, bpx) = (Arc::clone(&pairs), bp.to_owned());
    let toggle = Arc::new(scripts.toggle.clone());
    let direct = closed_loop(a.concurrency, pp.len(), Duration::from_secs(a.secs), move |w, i| {
        let mut conn = rconns[w % rconns.len()].clone();
        let (actor, entity) = pp[i];
        let k = Keys::new(bpx.clone()).entity("post", entity);
        let toggle = Arc::clone(&toggle);
        async move {
            let (bit, chunk) = ((actor as u64) % 32_768, (actor as u64) / 32_768);
            let (changed, _seq): (i64, i64) = toggle
                .key(toggle_keys(&k, chunk))
                .arg("bit")
                .arg(bit)
                .arg(1)
                .arg(chunk)
                .arg(1)
                .arg(format!("{actor}|0|1|1|0|"))
                .invoke_async(&mut conn)
                .await?;
            anyhow::ensure!(changed == 1, "raw toggle changed nothing");
            Ok(())
        }
    })
    .await;
    delete_prefix(&mut conn, bp).await?;

    // Raw 3: one record per produce request, what each Like waits on after its toggle.
    progress("rskafka produce of one record per request");
    let client = kafka().await?;
    let topic = socialgraph_testkit::unique("sg.bench.produce.");
    create_topic(&client, &topic, PARTITIONS).await?;
    let mut pcs = Vec::new();
    for p in 0..PARTITIONS {
        pcs.push(Arc::new(client.partition_client(topic.as_str(), p, UnknownTopicHandling::Retry).await?));
    }
    let produce = closed_loop(a.concurrency, 1_000_000, Duration::from_secs(a.secs), move |_, i| {
        let pcl = Arc::clone(&pcs[i % pcs.len()]);
        async move {
            let rec = Record {
                key: Some(format!("post:{i}").into_bytes()),
                value: Some(vec![0u8; 90]),
                headers: BTreeMap::new(),
                timestamp: rskafka::chrono::Utc::now(),
            };
            pcl.produce(vec![rec], Compression::Lz4).await?;
            Ok(())
        }
    })
    .await;

    print_table(
        &format!("Like, distinct (actor, post) pairs over {} posts, concurrency {}", a.entities, a.concurrency),
        "Like RPC",
        "raw",
        &[
            row("Like/s vs redis-benchmark EVALSHA", like.rate(), eval.rps, "/s"),
            row("p50 vs redis-benchmark EVALSHA", like.p50(), eval.p50, "ms"),
            row("p99 vs redis-benchmark EVALSHA", like.p99(), eval.p99, "ms"),
            row("Like/s vs EVALSHA from redis-rs", like.rate(), direct.rate(), "/s"),
            row("p99 vs EVALSHA from redis-rs", like.p99(), direct.p99(), "ms"),
            row("Like/s vs rskafka produce(1 record)", like.rate(), produce.rate(), "/s"),
            row("p50 vs rskafka produce(1 record)", like.p50(), produce.p50(), "ms"),
            row("p99 vs rskafka produce(1 record)", like.p99(), produce.p99(), "ms"),
        ],
        &[
            like.describe("Like RPC") + &format!(" (publish failures: {publish_failures})"),
            "redis-benchmark EVALSHA <toggle sha> 10 <entity keys> <chunk> bit 4242 1 0 1 <entry> -r 100000000 -n 200000: random \
             entity per call (each __rand_int__ independently), fixed bit"
                .into(),
            format!(
                "the same call with bit __rand_int__ (12 zero-padded digits, as redis-benchmark expands it) fails: {}",
                match &eval_probe {
                    redis::Value::SimpleString(s) => s.clone(),
                    other => format!("{other:?}"),
                }
            ),
            direct.describe("EVALSHA from redis-rs (same pairs, 4 multiplexed connections)"),
            produce.describe("rskafka produce, 1 record of 90 bytes per request, Lz4, 4 partitions"),
        ],
    );

    // Entity counts: BatchGetEntityCounts(100) vs MGET of 100 counters.
    progress("waiting for the counter consumer, then BatchGetEntityCounts(100)");
    counter_caught_up(&m.redis_url, &m.prefix, &[&m.topics.counter], Duration::from_secs(600)).await?;
    let entities = a.entities as u64;
    let cl = clients.clone();
    let counts = closed_loop(a.concurrency, usize::MAX, Duration::from_secs(a.secs), move |w, i| {
        let mut c = cl[w % cl.len()].clone();
        let ents: Vec<EntityRef> =
            (0..100u64).map(|k| EntityRef { entity_type: "post".into(), entity_id: (mix(i as u64 * 131 + k) % entities) as i64 + 1 }).collect();
        async move {
            let r = c.batch_get_entity_counts(BatchGetEntityCountsRequest { entities: ents, metrics: vec![] }).await?.into_inner();
            anyhow::ensure!(r.counts.len() == 100, "{} counts for 100 entities", r.counts.len());
            Ok(())
        }
    })
    .await;
    progress("redis-benchmark MGET of 100 entity counters");
    let kk = Keys::new(bp.to_owned());
    for chunk in (0..a.entities).collect::<Vec<_>>().chunks(1_000) {
        let mut pipe = redis::pipe();
        for e in chunk {
            pipe.set(kk.entity("post", 0).counter().replace("{post:0}", &format!("{{post:{e:012}}}")), [3u8; 20].as_slice()).ignore();
        }
        pipe.query_async::<()>(&mut conn).await?;
    }
    let mut mget_args: Vec<String> =
        vec!["-c".into(), a.concurrency.to_string(), "-n".into(), "100000".into(), "-r".into(), a.entities.to_string(), "MGET".into()];
    mget_args.extend((0..100).map(|_| kk.entity("post", 0).counter().replace("{post:0}", "{post:__rand_int__}")));
    let mget = redis_benchmark(&mget_args).await?;
    delete_prefix(&mut conn, bp).await?;
    print_table(
        &format!("Entity counts, 100 random posts of {} per request, concurrency {}", a.entities, a.concurrency),
        "BatchGetEntityCounts",
        "redis-benchmark MGET",
        &[row("req/s", counts.rate(), mget.rps, "/s"), row("p50", counts.p50(), mget.p50, "ms"), row("p99", counts.p99(), mget.p99, "ms")],
        &[
            counts.describe("BatchGetEntityCounts"),
            "the service runs one read-or-rebuild script per entity (9 keys each) in one pipeline; raw = one MGET of 100 \
             counter keys of 20 bytes"
                .into(),
        ],
    );

    movielens(m, a, &clients, bp, &mut conn).await
}

async fn movielens(
    m: &Mesh,
    a: &LikesArgs,
    clients: &[CounterServiceClient<Channel>],
    bp: &str,
    conn: &mut redis::aio::MultiplexedConnection,
) -> anyhow::Result<()> {
    use std::io::Read;
    let file = match std::fs::File::open(&a.movielens) {
        Ok(f) => f,
        Err(e) => {
            println!("\n  MovieLens memory not measured: cannot open {}: {e}", a.movielens);
            return Ok(());
        }
    };
    let mut text = String::new();
    flate2::read::GzDecoder::new(file).read_to_string(&mut text)?;
    // (user, movie, fav): rating >= 4 is a like, 5 also a fav.
    let mut ops: Vec<(i64, i64, bool)> = Vec::new();
    let mut likes: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    let mut favs: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    let mut ratings = 0usize;
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        let (Some(u), Some(mv), Some(r)) = (f.first(), f.get(1), f.get(2)) else {
            continue;
        };
        let (Ok(u), Ok(mv), Ok(r)) = (u.parse::<i64>(), mv.parse::<i64>(), r.parse::<f64>()) else {
            continue;
        };
        ratings += 1;
        if r >= 4.0 {
            ops.push((u, mv, false));
            likes.entry(mv).or_default().push(u);
        }
        if r >= 5.0 {
            ops.push((u, mv, true));
            favs.entry(mv).or_default().push(u);
        }
    }
    let (n_likes, n_favs) = (likes.values().map(Vec::len).sum::<usize>(), favs.values().map(Vec::len).sum::<usize>());
    progress(&format!("MovieLens: {ratings} ratings → {n_likes} likes and {n_favs} favs through the RPCs"));
    let ops = Arc::new(ops);
    let (cl, oo) = (clients.to_vec(), Arc::clone(&ops));
    let load = closed_loop(a.concurrency, oo.len(), Duration::from_secs(900), move |w, i| {
        let mut c = cl[w % cl.len()].clone();
        let (actor_id, entity_id, fav) = oo[i];
        let entity = Some(EntityRef { entity_type: "movie".into(), entity_id });
        async move {
            let changed = if fav {
                c.fav(FavRequest { actor_id, entity, owner_id: 0 }).await?.into_inner().changed
            } else {
                c.like(LikeRequest { actor_id, entity, owner_id: 0 }).await?.into_inner().changed
            };
            anyhow::ensure!(changed, "toggle changed nothing");
            Ok(())
        }
    })
    .await;
    counter_caught_up(&m.redis_url, &m.prefix, &[&m.topics.counter], Duration::from_secs(600)).await?;

    // Every key of every movie with a fact, by kind.
    let movies: Vec<i64> = likes.keys().chain(favs.keys()).copied().collect::<std::collections::BTreeSet<_>>().into_iter().collect();
    let keys = Keys::new(m.prefix.clone());
    let mut pipe = redis::pipe();
    for &mv in &movies {
        let k = keys.entity("movie", mv);
        pipe.smembers(k.chunk_set("like")).smembers(k.chunk_set("fav"));
    }
    let chunk_ids: Vec<Vec<u64>> = pipe.query_async(&mut *conn).await?;
    let kinds = ["bitmap chunks", "chunk sets", "sparse sets", "seq", "counter", "outbox"];
    let mut by_kind: Vec<Vec<String>> = vec![Vec::new(); kinds.len()];
    for (i, &mv) in movies.iter().enumerate() {
        let k = keys.entity("movie", mv);
        for (j, metric) in ["like", "fav"].iter().enumerate() {
            for c in &chunk_ids[2 * i + j] {
                by_kind[0].push(k.chunk(metric, *c));
            }
            by_kind[1].push(k.chunk_set(metric));
            by_kind[2].push(k.sparse(metric));
        }
        by_kind[3].push(k.seq());
        by_kind[4].push(k.counter());
        by_kind[5].push(k.outbox());
    }
    let mut svc_total = 0u64;
    let mut breakdown = Vec::new();
    for (kind, ks) in kinds.iter().zip(&by_kind) {
        let usage = memory_usage(conn, ks).await?;
        let sum: u64 = usage.iter().sum();
        let present = usage.iter().filter(|&&u| u > 0).count();
        svc_total += sum;
        breakdown.push(format!("{kind} {:.0} B ({present} keys)", sum as f64 / movies.len() as f64));
    }

    // The shared set of recently toggled entities (emptied by the outbox relay once quiet).
    let pending_key = keys.pending_entities();
    let pending_members: u64 = redis::cmd("ZCARD").arg(&pending_key).query_async(&mut *conn).await.unwrap_or_default();
    let pending_bytes = memory_usage(conn, std::slice::from_ref(&pending_key)).await?.first().copied().unwrap_or_default();

    // Raw: the same facts as one SET of user ids per movie and metric.
    let before = used_memory(conn).await?;
    let mut set_keys = Vec::new();
    for (metric, map) in [("like", &likes), ("fav", &favs)] {
        for chunk in map.iter().collect::<Vec<_>>().chunks(500) {
            let mut pipe = redis::pipe();
            for (mv, users) in chunk {
                let key = format!("{bp}ml:{{movie:{mv}}}:{metric}");
                pipe.sadd(&key, users.as_slice()).ignore();
                set_keys.push(key);
            }
            pipe.query_async::<()>(&mut *conn).await?;
        }
    }
    let set_delta = used_memory(conn).await? - before;
    let set_total: u64 = memory_usage(conn, &set_keys).await?.iter().sum();
    delete_prefix(conn, bp).await?;
    let n = movies.len() as f64;
    print_table(
        &format!("Memory per liked entity: MovieLens, {} movies with {n_likes} likes and {n_favs} favs", movies.len()),
        "counter-svc keys",
        "SET of user ids",
        &[row("MEMORY USAGE bytes/movie", svc_total as f64 / n, set_total as f64 / n, "B")],
        &[
            format!("counter-svc per movie: {}", breakdown.join(", ")),
            format!(
                "not counted: the shared pending-entities sorted set, {pending_members} members and {pending_bytes} B when measured \
                 (every toggle adds its entity; the outbox relay removes quiet entities with an empty outbox)"
            ),
            format!(
                "raw = SADD {bp}ml:{{movie:id}}:like / :fav of the user ids (intset encoding); used_memory delta {:.0} B/movie",
                set_delta as f64 / n
            ),
            load.describe("load through Like/Fav RPCs") + &format!(" ({:.0} toggles/s)", load.rate()),
        ],
    );
    Ok(())
}

/// The ten keys of the toggle script for a like of an actor in `chunk`: the entity's nine script
/// keys, then the chunk.
fn toggle_keys(k: &socialgraph_cache::keys::EntityKeys, chunk: u64) -> Vec<String> {
    let mut keys = socialgraph_counter::entities::script_keys(k).to_vec();
    keys.push(k.chunk("like", chunk));
    keys
}
