//! Part 1, relation: the Follow RPC vs the same transaction on PostgreSQL; the outbox relay vs
//! producing the same rows directly.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use prost::Message;
use rskafka::client::partition::Compression;
use rskafka::record::Record;
use sea_orm::{ConnectionTrait, DatabaseConnection, TransactionTrait};
use socialgraph_cache::keys::Keys;
use socialgraph_domain::{Edge, EdgeState};
use socialgraph_integration_tests::{Svc, admin, outbox_drained, relation_config, relation_on, spawn_relation};
use socialgraph_proto::events::v1::{RelationEvent, RelationEventKind};
use socialgraph_proto::relation::v1::relation_service_client::RelationServiceClient;
use socialgraph_proto::relation::v1::{FollowRequest, ImportEdge, ImportFollowsRequest};
use socialgraph_storage::edges::{self, EdgeTable};
use socialgraph_storage::outbox::{self, NewOutboxRow};
use socialgraph_testkit::{Backend, TestDb};
use tonic::transport::Channel;

use crate::RelationArgs;
use crate::backends::{PARTITIONS, bench_prefix, bench_redis, create_topic, delete_prefix, kafka, partition_clients};
use crate::load::{CHANNELS, channels, closed_loop, distinct_edges, mix, now_ms};
use crate::report::{Run, header, print_table, progress, row, summarize};

/// Runs the part: the Follow table, then the outbox relay table.
pub(crate) async fn run(a: &RelationArgs) -> anyhow::Result<()> {
    header("relation: Follow on PostgreSQL, outbox relay");
    follows(a).await?;
    outbox_relay(a).await
}

async fn follows(a: &RelationArgs) -> anyhow::Result<()> {
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
    progress("raw transaction through a bare tonic server (the floor of any gRPC write)");
    let bare = follow_bare(&edges, a.concurrency, max_time).await?;
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
            row("floor: bare tonic + raw tx /s", bare.rate(), raw.rate(), "/s"),
            row("floor: bare tonic + raw tx p99", bare.p99(), raw.p99(), "ms"),
        ],
        &[
            format!(
                "raw = the minimum transaction per follow on its own pool of {} (relation-svc's in this configuration): \
                 BEGIN, INSERT .. ON CONFLICT DO UPDATE of the edge, INSERT of the outbox row, COMMIT (4 round trips)",
                service_pool_size()
            ),
            "the RPC adds a pre-read of the edge, a Redis token-bucket script, the cap (counted inside its one statement) \
             and gRPC; on PostgreSQL it writes the edge and its event in one statement (compare-and-set on the version)"
                .into(),
            format!("fresh test databases on both sides, synchronous_commit = {sync_commit}"),
            rpc.describe("RPC relay on"),
            rpc_no_relay.describe("RPC relay off"),
            raw.describe("raw"),
            steps.describe("raw + pre-read + token bucket (the service's own TokenBucket, Redis pool of 16, no gRPC)"),
            bare.describe(&format!("floor: the raw transaction inside a bare tonic server's call (no layers, {CHANNELS} connections)")),
        ],
    );
    summarize(format!("Follow, PostgreSQL ({} callers)", a.concurrency), rpc.rate(), raw.rate(), "/s", ">= 0.8x");
    summarize("Follow p99", rpc.p99(), raw.p99(), "ms", "");
    summarize("floor: bare tonic server + raw tx", bare.rate(), raw.rate(), "/s", "about the most a gRPC write reaches");
    Ok(())
}

async fn outbox_relay(a: &RelationArgs) -> anyhow::Result<()> {
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

/// [`CHANNELS`] relation-svc clients, each on its own connection.
pub(crate) async fn relation_clients(svc: &Svc) -> anyhow::Result<Vec<RelationServiceClient<Channel>>> {
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
        follower_followings: 1,
        follower_followings_version: seq as i64 + 1,
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

/// The raw baseline of one Follow: the 4-statement minimum of an edge change with its outbox
/// row (BEGIN, the edge upsert, the outbox insert, COMMIT), as pgbench would run it.
async fn raw_follow_tx(db: &DatabaseConnection, follower_id: i64, followee_id: i64, seq: u64) -> anyhow::Result<()> {
    use sea_orm::{DbBackend, Statement};
    let now = now_ms();
    let edge = Edge { follower_id, followee_id, state: EdgeState::Following, version: 1, followed_at_ms: now, updated_at_ms: now };
    let ev = event_row("sg.relation.bench", &edge, now, seq);
    let txn = db.begin().await?;
    txn.execute_raw(Statement::from_sql_and_values(
        DbBackend::Postgres,
        "INSERT INTO following (follower_id, followee_id, state, version, followed_at_ms, updated_at_ms) VALUES ($1, $2, 1, 1, $3, $3) \
         ON CONFLICT (follower_id, followee_id) DO UPDATE SET state = 1, version = following.version + 1, followed_at_ms = $3, updated_at_ms = $3",
        [follower_id.into(), followee_id.into(), now.into()],
    ))
    .await?;
    txn.execute_raw(Statement::from_sql_and_values(
        DbBackend::Postgres,
        "INSERT INTO outbox (topic, partition_key, payload, headers, created_at_ms) VALUES ($1, $2, $3, $4, $5)",
        [ev.topic.into(), ev.partition_key.into(), ev.payload.into(), ev.headers.into(), ev.created_at_ms.into()],
    ))
    .await?;
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

/// The raw transaction inside the call of a bare tonic server ([`crate::floor`]) on a fresh
/// database (its pool opened on the server's runtime), from [`CHANNELS`] connections.
async fn follow_bare(edges: &Arc<Vec<(i64, i64)>>, concurrency: usize, max_time: Duration) -> anyhow::Result<Run> {
    let db = TestDb::create(Backend::Postgres).await?;
    let (url, e) = (db.url.clone(), Arc::clone(edges));
    let make = move || async move {
        let pool = socialgraph_storage::connect(&url, service_pool_size()).await?;
        let op: crate::floor::RawOp = Arc::new(move |asked: String| {
            let (e, pool) = (Arc::clone(&e), pool.clone());
            Box::pin(async move {
                let i: usize = asked.parse()?;
                let (f, t) = *e.get(i).ok_or_else(|| anyhow::anyhow!("no edge {i}"))?;
                raw_follow_tx(&pool, f, t, i as u64).await
            })
        });
        Ok(op)
    };
    let run = crate::floor::closed_loop(make, concurrency, edges.len(), max_time, |i| i.to_string()).await;
    db.drop_db().await?;
    run
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
pub(crate) async fn import(svc: &Svc, edges: &[(i64, i64)]) -> anyhow::Result<f64> {
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
    let pcs = partition_clients(&client, &raw_topic).await?;
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
