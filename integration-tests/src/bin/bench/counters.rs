//! Part 3, counters: user counter reads beside redis-benchmark GET/MGET of the same shapes;
//! memory per user counter, the service's packed string beside a hash of five fields.

use std::sync::Arc;
use std::time::Duration;

use socialgraph_cache::keys::Keys;
use socialgraph_integration_tests::{Mesh, Svc, spawn_counter};
use socialgraph_proto::counter::v1::counter_service_client::CounterServiceClient;
use socialgraph_proto::counter::v1::{BatchGetUserCountersRequest, GetUserCountersRequest};
use tonic::transport::Channel;

use crate::CountersArgs;
use crate::backends::{RedisBench, bench_prefix, bench_redis, delete_prefix, memory_usage, redis_benchmark, used_memory};
use crate::load::{CHANNELS, channels, closed_loop, mix};
use crate::report::{Run, header, print_table, progress, row, summarize};

/// Runs the part on a mesh of its own, whose Redis keys it removes at the end.
pub(crate) async fn run(a: &CountersArgs) -> anyhow::Result<()> {
    header("counters: user counter reads, memory per user");
    let mut m = Mesh::start(&socialgraph_testkit::redis_url()).await?;
    let result = counters_in(&mut m, a).await;
    let mut conn = bench_redis().await?;
    delete_prefix(&mut conn, &m.prefix).await?;
    m.stop().await?;
    result
}

/// [`CHANNELS`] counter-svc clients, each on its own connection.
pub(crate) async fn counter_clients(svc: &Svc) -> anyhow::Result<Vec<CounterServiceClient<Channel>>> {
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
            c.batch_get_user_counters(BatchGetUserCountersRequest { user_ids: ids, ..Default::default() }).await?;
            Ok(())
        }
    })
    .await;
    if run.errors > 0 {
        println!("  ({}: later reads create what is missing)", run.describe("reading every user"));
    }
    Ok(run)
}

/// One round of [`counter_reads`].
struct Reads {
    /// BatchGetUserCounters of 100 random ids.
    batch: Run,
    /// GetUserCounters of one random id.
    single: Run,
}

/// BatchGetUserCounters of 100 random ids and GetUserCounters of one, each for `secs` s.
async fn counter_reads(svc: &Svc, a: &CountersArgs, seed: u64) -> anyhow::Result<Reads> {
    let users = a.users as u64;
    let clients = counter_clients(svc).await?;
    let cl = clients.clone();
    let batch = closed_loop(a.concurrency, usize::MAX, Duration::from_secs(a.secs), move |w, i| {
        let mut c = cl[w % cl.len()].clone();
        let ids: Vec<i64> = (0..100u64).map(|k| (mix(seed ^ (i as u64 * 131 + k)) % users) as i64 + 1).collect();
        async move {
            let r = c.batch_get_user_counters(BatchGetUserCountersRequest { user_ids: ids, ..Default::default() }).await?.into_inner();
            anyhow::ensure!(r.counters.len() == 100, "{} counters for 100 ids", r.counters.len());
            Ok(())
        }
    })
    .await;
    let single = closed_loop(a.concurrency, usize::MAX, Duration::from_secs(a.secs), move |w, i| {
        let mut c = clients[w % clients.len()].clone();
        let user_id = (mix(seed ^ i as u64) % users) as i64 + 1;
        async move {
            c.get_user_counters(GetUserCountersRequest { user_id, ..Default::default() }).await?;
            Ok(())
        }
    })
    .await;
    Ok(Reads { batch, single })
}

/// Puts every user's sampled check at rest for an hour (`true`) or makes it due, by rewriting
/// the rest period inside each user's stored value.
async fn set_check_keys(m: &Mesh, users: i64, resting: bool) -> anyhow::Result<()> {
    use socialgraph_cache::counters::{Stored, rest_clock_now};
    let keys = Keys::new(m.prefix.clone());
    let mut conn = bench_redis().await?;
    let rest_until_s = if resting { rest_clock_now() + 3_600 } else { 0 };
    for chunk in (1..=users).collect::<Vec<_>>().chunks(1_000) {
        let mut pipe = redis::pipe();
        for &u in chunk {
            pipe.hget(keys.user_counters(u), u);
        }
        let values: Vec<Option<Vec<u8>>> = pipe.query_async(&mut conn).await?;
        let mut pipe = redis::pipe();
        for (&u, v) in chunk.iter().zip(values) {
            if let Some(stored) = v.as_deref().and_then(Stored::decode) {
                pipe.hset(keys.user_counters(u), u, Stored { rest_until_s, ..stored }.encode()).ignore();
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
    // check), so a read costs its HGETs plus, on the first read of an id, one check script.
    set_check_keys(m, a.users, true).await?;
    progress(&format!("BatchGetUserCounters(100) and GetUserCounters, checks resting, concurrency {}, {} s each", a.concurrency, a.secs));
    let resting = counter_reads(&m.counter, a, 7).await?;

    progress("the same with counter-svc restarted with counters.check_interval_secs = 0");
    restart_counter(m, 0).await?;
    let check_off = counter_reads(&m.counter, a, 8).await?;

    // Raw: the same shapes straight on Redis, keys of 20 bytes under a bench prefix.
    progress("redis-benchmark GET and MGET of 100 keys");
    let mut conn = bench_redis().await?;
    let (get, mget) = redis_reads(&mut conn, a).await?;
    progress("GET and MGET of 100 keys from redis-rs (the service's client library and pool)");
    let rs = redis_rs_reads(&mut conn, a, m.counter_config().redis.pool_size, &m.prefix).await?;

    // Last (its background checks outlive the run): every user's check due at once, as right
    // after counters are created or 300 s after a read of every user.
    progress("BatchGetUserCounters(100) and GetUserCounters with every user's sampled check due");
    restart_counter(m, 300).await?;
    set_check_keys(m, a.users, false).await?;
    let due = counter_reads(&m.counter, a, 9).await?;

    print_reads(a, &ReadResults { create, resting, check_off, due, get, mget, rs });
    Ok(())
}

/// The raw side of the counter read ratios and its floor.
struct RedisRs {
    /// GET from redis-rs.
    get: Run,
    /// MGET of 100 from redis-rs.
    mget: Run,
    /// The service's own read of 100 users from redis-rs: one HGET per user on its bucket
    /// hash, pipelined (the layout's share of the BatchGet ratio).
    hgets: Run,
    /// The same GETs through a bare tonic server ([`crate::floor`]).
    bare_get: Run,
    /// The same MGETs through a bare tonic server.
    bare_mget: Run,
}

/// GET of one and MGET of 100 random 20-byte keys from redis-rs over a bb8 pool of
/// `pool_size` (counter-svc's client library and pool), `a.concurrency` callers: the raw side
/// of the counter read ratios; the service's own Redis read of 100 users' counters (under key
/// prefix `prefix`), from the same pool; then GET and MGET through a bare tonic server on
/// [`CHANNELS`] connections, the most a gRPC read of one Redis command can reach here.
async fn redis_rs_reads(conn: &mut redis::aio::MultiplexedConnection, a: &CountersArgs, pool_size: u32, prefix: &str) -> anyhow::Result<RedisRs> {
    let bp = bench_prefix();
    for chunk in (0..a.users).collect::<Vec<_>>().chunks(1_000) {
        let mut pipe = redis::pipe();
        for u in chunk {
            pipe.set(format!("{bp}u:{u}"), [7u8; 20].as_slice()).ignore();
        }
        pipe.query_async::<()>(&mut *conn).await?;
    }
    let pool = socialgraph_cache::pool(&socialgraph_testkit::redis_url(), pool_size, Duration::from_secs(1))?;
    let users = a.users as u64;
    let (p, b) = (pool.clone(), bp.clone());
    let get = closed_loop(a.concurrency, usize::MAX, Duration::from_secs(a.secs), move |_, i| {
        let (pool, key) = (p.clone(), format!("{b}u:{}", mix(i as u64) % users));
        async move {
            let mut c = socialgraph_cache::conn(&pool).await?;
            let v: Option<Vec<u8>> = redis::cmd("GET").arg(key).query_async(&mut c).await?;
            anyhow::ensure!(v.is_some_and(|v| v.len() == 20), "missing key");
            Ok(())
        }
    })
    .await;
    let (p, b) = (pool.clone(), bp.clone());
    let mget = closed_loop(a.concurrency, usize::MAX, Duration::from_secs(a.secs), move |_, i| {
        let pool = p.clone();
        let keys: Vec<String> = (0..100u64).map(|k| format!("{b}u:{}", mix(i as u64 * 131 + k) % users)).collect();
        async move {
            let mut c = socialgraph_cache::conn(&pool).await?;
            let v: Vec<Option<Vec<u8>>> = redis::cmd("MGET").arg(keys).query_async(&mut c).await?;
            anyhow::ensure!(v.len() == 100, "{} values for 100 keys", v.len());
            Ok(())
        }
    })
    .await;
    let (p, keys) = (pool.clone(), Keys::new(prefix.to_owned()));
    let hgets = closed_loop(a.concurrency, usize::MAX, Duration::from_secs(a.secs), move |_, i| {
        let pool = p.clone();
        let mut pipe = redis::pipe();
        for k in 0..100u64 {
            let u = (mix(i as u64 * 131 + k) % users) as i64 + 1;
            pipe.hget(keys.user_counters(u), u);
        }
        async move {
            let mut c = socialgraph_cache::conn(&pool).await?;
            let v: Vec<Option<Vec<u8>>> = pipe.query_async(&mut c).await?;
            anyhow::ensure!(v.iter().all(Option::is_some), "a user without counters");
            Ok(())
        }
    })
    .await;
    let url = socialgraph_testkit::redis_url();
    let floor = |ask: fn(usize) -> String| {
        let (url, bp) = (url.clone(), bp.clone());
        crate::floor::closed_loop(move || counter_op(url, pool_size, bp, users), a.concurrency, usize::MAX, Duration::from_secs(a.secs), ask)
    };
    let bare_get = floor(|i| format!("get:{i}")).await;
    let bare_mget = floor(|i| format!("mget:{i}")).await;
    delete_prefix(conn, &bp).await?;
    Ok(RedisRs { get, mget, hgets, bare_get: bare_get?, bare_mget: bare_mget? })
}

/// The raw reads of [`redis_rs_reads`] for a bare tonic server: `get:<i>` the GET and `mget:<i>`
/// the MGET of the i-th op (the same keys), through a pool of `pool_size` opened where it runs.
async fn counter_op(url: String, pool_size: u32, prefix: String, users: u64) -> anyhow::Result<crate::floor::RawOp> {
    let pool = socialgraph_cache::pool(&url, pool_size, Duration::from_secs(1))?;
    Ok(Arc::new(move |asked: String| {
        let (pool, prefix) = (pool.clone(), prefix.clone());
        Box::pin(async move {
            let (kind, i) = asked.split_once(':').ok_or_else(|| anyhow::anyhow!("no op in {asked:?}"))?;
            let i: u64 = i.parse()?;
            let mut c = socialgraph_cache::conn(&pool).await?;
            if kind == "get" {
                let _: Option<Vec<u8>> = redis::cmd("GET").arg(format!("{prefix}u:{}", mix(i) % users)).query_async(&mut c).await?;
            } else {
                let keys: Vec<String> = (0..100u64).map(|k| format!("{prefix}u:{}", mix(i * 131 + k) % users)).collect();
                let _: Vec<Option<Vec<u8>>> = redis::cmd("MGET").arg(keys).query_async(&mut c).await?;
            }
            Ok(())
        })
    }))
}

/// redis-benchmark GET of one and MGET of 100 random keys of 20 bytes, one per user, written
/// under a bench prefix beforehand and deleted afterwards.
async fn redis_reads(conn: &mut redis::aio::MultiplexedConnection, a: &CountersArgs) -> anyhow::Result<(RedisBench, RedisBench)> {
    let bp = bench_prefix();
    for chunk in (0..a.users).collect::<Vec<_>>().chunks(1_000) {
        let mut pipe = redis::pipe();
        for u in chunk {
            pipe.set(format!("{bp}u:{u:012}"), [7u8; 20].as_slice()).ignore();
        }
        pipe.query_async::<()>(&mut *conn).await?;
    }
    let r = a.users.to_string();
    let c = a.concurrency.to_string();
    let get =
        redis_benchmark(&["-c".into(), c.clone(), "-n".into(), "200000".into(), "-r".into(), r.clone(), "GET".into(), format!("{bp}u:__rand_int__")])
            .await?;
    let mut mget_args = vec!["-c".into(), c.clone(), "-n".into(), "100000".into(), "-r".into(), r.clone(), "MGET".into()];
    mget_args.extend((0..100).map(|_| format!("{bp}u:__rand_int__")));
    let mget = redis_benchmark(&mget_args).await?;
    delete_prefix(conn, &bp).await?;
    Ok((get, mget))
}

/// Measures and prints the memory of `users` user counters in both layouts.
pub(crate) async fn memory(conn: &mut redis::aio::MultiplexedConnection, users: i64) -> anyhow::Result<()> {
    progress(&format!("memory of {users} user counters: the service's buckets vs hashes of five fields"));
    let (svc_usage, svc_delta, buckets) = counter_memory(conn, users, false).await?;
    let (hash_usage, hash_delta, _) = counter_memory(conn, users, true).await?;
    print_table(
        &format!("Memory per user counter, {users} users"),
        "bucketed sg:uc",
        "hash of 5 fields",
        &[row("MEMORY USAGE bytes/user", svc_usage, hash_usage, "B"), row("used_memory delta bytes/user", svc_delta, hash_delta, "B")],
        &[
            format!(
                "bucketed = the service's layout: {users} users in {buckets} hashes sg:uc:{{u:B}} (real key builder and encoder, \
                 bench prefix), field = user id, value = 5 counters + guard version + check rest period as varints; every \
                 byte the service keeps per user (no other key per user)"
            ),
            "hash = the same five counters as HSET fields fo,fe,po,lr,fr with decimal values, one key per user (listpack \
             encoding), no guard; ratio < 1 means the service's layout is smaller (target <= 0.33)"
                .into(),
            "MEMORY USAGE: the service's summed over every bucket key, the hashes averaged over a sample of 1000 keys; \
             used_memory delta over all keys (other clients of this Redis can disturb it)"
                .into(),
        ],
    );
    summarize("User counters, MEMORY USAGE per user (vs a 5-field hash)", svc_usage, hash_usage, "B", "<= 0.33x");
    Ok(())
}

/// Everything the user counter reads table shows.
struct ReadResults {
    /// The first read of every user, which creates the counters.
    create: Run,
    /// Default counter-svc, every user's sampled check resting.
    resting: Reads,
    /// counter-svc with `counters.check_interval_secs = 0`.
    check_off: Reads,
    /// Default counter-svc, every user's sampled check due.
    due: Reads,
    get: RedisBench,
    mget: RedisBench,
    /// GET and MGET from redis-rs, straight and through a bare tonic server.
    rs: RedisRs,
}

fn print_reads(a: &CountersArgs, r: &ReadResults) {
    let (get, mget) = (&r.get, &r.mget);
    let (batch, single) = (&r.resting.batch, &r.resting.single);
    let (batch_nc, single_nc) = (&r.check_off.batch, &r.check_off.single);
    let (batch_due, single_due) = (&r.due.batch, &r.due.single);
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
            row("Get req/s vs GET from redis-rs", single.rate(), r.rs.get.rate(), "/s"),
            row("Get p99 vs GET from redis-rs", single.p99(), r.rs.get.p99(), "ms"),
            row("BatchGet(100) req/s vs MGET from redis-rs", batch.rate(), r.rs.mget.rate(), "/s"),
            row("BatchGet(100) p99 vs MGET from redis-rs", batch.p99(), r.rs.mget.p99(), "ms"),
            row("the service's layout: 100 HGETs pipelined vs MGET, both from redis-rs", r.rs.hgets.rate(), r.rs.mget.rate(), "/s"),
            row("BatchGet(100) req/s vs those 100 HGETs from redis-rs", batch.rate(), r.rs.hgets.rate(), "/s"),
            row("floor: bare tonic + GET req/s vs GET from redis-rs", r.rs.bare_get.rate(), r.rs.get.rate(), "/s"),
            row("floor: bare tonic + MGET(100) req/s vs MGET from redis-rs", r.rs.bare_mget.rate(), r.rs.mget.rate(), "/s"),
        ],
        &[
            "raw = redis-benchmark -c 32 on the same Redis: MGET of 100 random keys of 20 bytes (-n 100000) and GET of one \
             (-n 200000); redis-benchmark has no MGET test of its own (its MSET test writes 10 keys)"
                .into(),
            "first rows: default counter-svc, every user's sampled check resting (its rest period set an hour ahead \
             beforehand, as within 300 s of a check): the first read of an id on this instance runs one check script, later \
             ones none"
                .into(),
            "check off = counter-svc restarted with counters.check_interval_secs = 0".into(),
            "checks due = default counter-svc, every user's rest period over: reads start a drift check per user \
             (projection-svc GetEdgeCounts and Redis reads), measured last"
                .into(),
            format!("first read of every user (creates counters from projection-svc): {:.0} ids/s", a.users as f64 / r.create.elapsed.as_secs_f64()),
            batch.describe("BatchGet"),
            single.describe("Get"),
            batch_nc.describe("BatchGet check off"),
            single_nc.describe("Get check off"),
            batch_due.describe("BatchGet checks due"),
            single_due.describe("Get checks due"),
            r.rs.get.describe("GET from redis-rs"),
            r.rs.mget.describe("MGET(100) from redis-rs"),
            r.rs.hgets.describe("100 HGETs on the service's bucket hashes, pipelined, from redis-rs"),
            r.rs.bare_get.describe(&format!("GET through a bare tonic server (no layers, {CHANNELS} connections)")),
            r.rs.bare_mget.describe("MGET(100) through a bare tonic server"),
        ],
    );
    summarize("GetUserCounters (vs GET, redis-rs)", single.rate(), r.rs.get.rate(), "/s", ">= 0.6x");
    summarize("BatchGetUserCounters(100) (vs MGET of 100)", batch.rate(), r.rs.mget.rate(), "/s", ">= 0.6x");
    summarize("floor: bare tonic server + GET (vs GET)", r.rs.bare_get.rate(), r.rs.get.rate(), "/s", "about the most a gRPC read reaches");
    summarize("the service's layout: 100 HGETs pipelined (vs MGET)", r.rs.hgets.rate(), r.rs.mget.rate(), "/s", "the layout's share");
    summarize("floor: bare tonic server + MGET(100) (vs MGET)", r.rs.bare_mget.rate(), r.rs.mget.rate(), "/s", "about the most a gRPC read reaches");
}

/// Writes `users` counters under a bench prefix (the service's buckets, or one hash of five
/// fields per user), measures them, deletes them. Returns (MEMORY USAGE per user, used_memory
/// delta per user, keys written).
async fn counter_memory(conn: &mut redis::aio::MultiplexedConnection, users: i64, as_hash: bool) -> anyhow::Result<(f64, f64, usize)> {
    use socialgraph_cache::counters::{Sds, Stored, rest_clock_now};
    let bp = bench_prefix();
    let keys = Keys::new(bp.clone());
    let hash_key = |u: i64| format!("{bp}sg:ucnth:{{{u}}}");
    let before = used_memory(conn).await?;
    let ids: Vec<i64> = (1..=users).collect();
    let mut buckets = std::collections::BTreeSet::new();
    for chunk in ids.chunks(1_000) {
        let mut pipe = redis::pipe();
        for &u in chunk {
            let v = [(u % 5_000) as u32, (mix(u as u64) % 100_000) as u32, (u % 300) as u32, (u % 70_000) as u32, (u % 9_000) as u32];
            if as_hash {
                pipe.cmd("HSET")
                    .arg(hash_key(u))
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
                // Versions as the projection's edge_count rows and relation-svc's following_count
                // rows reach it, a rest period running.
                let stored = Stored {
                    counters: Sds(v),
                    version: (mix(u as u64 + 7) % 20_000) as i64,
                    rest_until_s: rest_clock_now() + 300,
                    followings_version: (mix(u as u64 + 11) % 10_000) as i64,
                };
                buckets.insert(keys.user_counters(u));
                pipe.hset(keys.user_counters(u), u, stored.encode()).ignore();
            }
        }
        pipe.query_async::<()>(&mut *conn).await?;
    }
    let after = used_memory(conn).await?;
    let usage = if as_hash {
        let sample: Vec<String> = (0..1_000).map(|k| hash_key((mix(k) % users as u64) as i64 + 1)).collect();
        let usage = memory_usage(conn, &sample).await?;
        usage.iter().sum::<u64>() as f64 / usage.len() as f64
    } else {
        let all: Vec<String> = buckets.iter().cloned().collect();
        memory_usage(conn, &all).await?.iter().sum::<u64>() as f64 / users as f64
    };
    delete_prefix(conn, &bp).await?;
    Ok((usage, (after - before) as f64 / users as f64, buckets.len()))
}
