//! Part 4, likes: the Like RPC beside the raw Lua toggle (from redis-benchmark and from this
//! process) and a one-record produce; entity count reads beside MGET; memory per liked entity
//! on MovieLens (the other densities are in the memory part).

pub(crate) mod density;
mod movielens;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use rand::{Rng, SeedableRng, rngs::StdRng};
use rskafka::client::partition::Compression;
use rskafka::record::Record;
use socialgraph_cache::entities::EntityScripts;
use socialgraph_cache::keys::{EntityKeys, Keys};
use socialgraph_integration_tests::{Mesh, Svc, counter_caught_up, metric};
use socialgraph_proto::counter::v1::counter_service_client::CounterServiceClient;
use socialgraph_proto::counter::v1::{BatchGetEntityCountsRequest, EntityRef, LikeRequest};
use tonic::transport::Channel;

use crate::LikesArgs;
use crate::backends::{
    Broker, Cores, Cpu, PARTITIONS, RedisBench, bench_prefix, bench_redis, create_topic, delete_prefix, kafka, partition_clients, redis_benchmark,
};
use crate::counters::counter_clients;
use crate::load::{closed_loop, mix};
use crate::report::{Run, header, print_table, progress, row, summarize};

/// Runs the part on a mesh of its own; its Redis keys and the bench's are removed at the end.
pub(crate) async fn run(a: &LikesArgs) -> anyhow::Result<()> {
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
    let pairs = Arc::new(like_pairs(a));
    let mut conn = bench_redis().await?;
    progress(&format!("Like RPC, concurrency {}, up to {} s", a.concurrency, a.secs));
    let cpu = Cpu::with_redis(&mut conn).await?;
    let like = like_run(a, &clients, &pairs, "post").await;
    let cpu = Cpu::with_redis(&mut conn).await?.since(&cpu);
    let metrics = m.counter.metrics().await.unwrap_or_default();
    let (publish_failures, relayed) = (metric(&metrics, "sg_action_publish_failures_total"), metric(&metrics, "sg_action_events_published_total"));
    let drain = std::time::Instant::now();
    m.likes_relayed(Duration::from_secs(300)).await?;
    let drained_after = drain.elapsed();

    // The same on other entities with the broker held for the run: the relay publishes after.
    progress("Like RPC again with the broker stopped for the run (SIGSTOP, then SIGCONT)");
    let cpu_held = Cpu::with_redis(&mut conn).await?;
    let held = {
        let _held = Broker::stop()?;
        like_run(a, &clients, &pairs, "photo").await
    };
    let cpu_held = Cpu::with_redis(&mut conn).await?.since(&cpu_held);
    let drain = std::time::Instant::now();
    m.likes_relayed(Duration::from_secs(300)).await?;
    let held_drained_after = drain.elapsed();

    // Raw 1: redis-benchmark EVALSHA of the toggle script.
    progress("redis-benchmark EVALSHA of the toggle script");
    let scripts = EntityScripts::default();
    let eval = toggle_benchmark(&mut conn, &scripts, a, bp).await?;

    // Raw 2: the same EVALSHA from this process (redis-rs), the Like run's pairs, 4 connections.
    progress("EVALSHA of the toggle script from redis-rs, the same pairs");
    let direct = toggle_direct(a, &scripts, &pairs, bp).await?;
    progress("the same through a bare tonic server (the floor of any gRPC call)");
    let bare = toggle_bare(a, &scripts, &pairs, &format!("{bp}floor:")).await?;
    delete_prefix(&mut conn, bp).await?;

    // Raw 3: one record per produce request, what each Like waits on after its toggle.
    progress("rskafka produce of one record per request");
    let produce = produce_singles(a).await?;

    summarize(format!("Like ({} callers)", a.concurrency), like.rate(), direct.rate(), "/s", ">= 0.6x");
    summarize("Like, broker stopped for the run", held.rate(), direct.rate(), "/s", "the Like path alone");
    summarize("floor: bare tonic server + the raw toggle", bare.rate(), direct.rate(), "/s", "about the most a gRPC call reaches");
    let held = Held { run: held, cpu: cpu_held, drained_after: held_drained_after };
    print_likes(a, &LikeResults { like, cpu, publish_failures, relayed, drained_after, held, eval, direct, bare, produce });
    entity_counts(m, a, &clients, bp, &mut conn).await?;
    movielens::run(m, a, &clients, bp, &mut conn).await
}

/// Distinct (actor, entity) pairs; actors below 32768 keep every entity in one bitmap chunk.
fn like_pairs(a: &LikesArgs) -> Vec<(i64, i64)> {
    let mut rng = StdRng::seed_from_u64(5);
    let mut seen = HashSet::new();
    let mut pairs = Vec::with_capacity(a.likes);
    while pairs.len() < a.likes && seen.len() < (a.entities as usize) * 32_000 {
        let p = (rng.random_range(1..=32_767i64), rng.random_range(1..=a.entities));
        if seen.insert(p) {
            pairs.push(p);
        }
    }
    pairs
}

/// A Like RPC of each of `pairs`, until they or `secs` run out.
async fn like_run(a: &LikesArgs, clients: &[CounterServiceClient<Channel>], pairs: &Arc<Vec<(i64, i64)>>, entity_type: &'static str) -> Run {
    let (cl, pp) = (clients.to_vec(), Arc::clone(pairs));
    closed_loop(a.concurrency, pp.len(), Duration::from_secs(a.secs), move |w, i| {
        let mut c = cl[w % cl.len()].clone();
        let (actor_id, entity_id) = pp[i];
        async move {
            let r = c
                .like(LikeRequest { actor_id, entity: Some(EntityRef { entity_type: entity_type.into(), entity_id }), owner_id: 0 })
                .await?
                .into_inner();
            anyhow::ensure!(r.changed, "like {actor_id} → {entity_type} {entity_id} changed nothing");
            Ok(())
        }
    })
    .await
}

/// redis-benchmark EVALSHA of the toggle script, each call on a new entity.
async fn toggle_benchmark(
    conn: &mut redis::aio::MultiplexedConnection,
    scripts: &EntityScripts,
    a: &LikesArgs,
    bp: &str,
) -> anyhow::Result<RedisBench> {
    let sha = scripts.toggle.prepare_invoke().load_async(&mut *conn).await?;
    // The randomness goes into the entity of the keys and the actor stays fixed: every call
    // flips a new entity's fact (the `changed` path).
    let ek = Keys::new(bp.to_owned()).entity("rb", 0);
    let tag = |k: String| k.replace("{rb:0}", "{rb:__rand_int__}");
    let mut eval_args: Vec<String> = vec!["-c".into(), a.concurrency.to_string(), "-n".into(), "200000".into()];
    eval_args.extend(["-r".into(), "100000000".into(), "EVALSHA".into(), sha.clone(), "4".into()]);
    eval_args.extend(toggle_keys(&ek).into_iter().map(tag));
    // ARGV: like, actor 4242 in decimal, its 8 bytes (unused below 2^32: any 8 bytes), set.
    eval_args.extend(["1".into(), "4242".into(), "00000000".into(), "1".into(), "4242|0|1|1|0|".into()]);
    let eval = redis_benchmark(&eval_args).await?;
    delete_prefix(conn, bp).await?;
    Ok(eval)
}

/// The service's Redis round trip of one Like (ZADD to the pending-entity index and the toggle
/// script, one pipeline) under the key prefix `bp`; fails unless the toggle changed the fact.
async fn toggle_once(mut conn: redis::aio::MultiplexedConnection, toggle: &redis::Script, bp: &str, actor: i64, entity: i64) -> anyhow::Result<()> {
    let k = Keys::new(bp.to_owned()).entity("post", entity);
    let (small, bytes) = socialgraph_cache::entities::actor_args(actor);
    let mut pipe = redis::pipe();
    pipe.zadd(Keys::new(bp.to_owned()).pending_entities(), format!("post:{entity}"), 1).ignore();
    pipe.invoke_script(toggle.key(toggle_keys(&k)).arg(1).arg(small).arg(bytes.as_slice()).arg(1).arg(format!("{actor}|0|1|1|0|")));
    let ((changed, _seq),): ((i64, i64),) = pipe.query_async(&mut conn).await?;
    anyhow::ensure!(changed == 1, "raw toggle changed nothing");
    Ok(())
}

/// `n` multiplexed connections to the bench's Redis.
async fn redis_conns(n: usize) -> anyhow::Result<Vec<redis::aio::MultiplexedConnection>> {
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        conns.push(bench_redis().await?);
    }
    Ok(conns)
}

/// [`toggle_once`] from redis-rs on 4 multiplexed connections, for the Like run's pairs.
async fn toggle_direct(a: &LikesArgs, scripts: &EntityScripts, pairs: &Arc<Vec<(i64, i64)>>, bp: &str) -> anyhow::Result<Run> {
    let rconns = redis_conns(4).await?;
    let (pp, bpx) = (Arc::clone(pairs), bp.to_owned());
    let toggle = Arc::new(scripts.toggle.clone());
    Ok(closed_loop(a.concurrency, pp.len(), Duration::from_secs(a.secs), move |w, i| {
        let (conn, (actor, entity)) = (rconns[w % rconns.len()].clone(), pp[i]);
        let (bpx, toggle) = (bpx.clone(), Arc::clone(&toggle));
        async move { toggle_once(conn, &toggle, &bpx, actor, entity).await }
    })
    .await)
}

/// [`toggle_once`] inside the call of a bare tonic server ([`crate::floor`]) on 4 connections
/// opened on the server's runtime, from [`crate::load::CHANNELS`] client connections: about the
/// most a gRPC Like reaches here.
async fn toggle_bare(a: &LikesArgs, scripts: &EntityScripts, pairs: &Arc<Vec<(i64, i64)>>, bp: &str) -> anyhow::Result<Run> {
    let (pp, bpx) = (Arc::clone(pairs), bp.to_owned());
    let toggle = Arc::new(scripts.toggle.clone());
    let make = move || async move {
        let rconns = redis_conns(4).await?;
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let op: crate::floor::RawOp = Arc::new(move |asked: String| {
            let conn = rconns[next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % rconns.len()].clone();
            let (pp, bpx, toggle) = (Arc::clone(&pp), bpx.clone(), Arc::clone(&toggle));
            Box::pin(async move {
                let (actor, entity) = *pp.get(asked.parse::<usize>()?).ok_or_else(|| anyhow::anyhow!("no pair {asked}"))?;
                toggle_once(conn, &toggle, &bpx, actor, entity).await
            })
        });
        Ok(op)
    };
    crate::floor::closed_loop(make, a.concurrency, pairs.len(), Duration::from_secs(a.secs), |i| i.to_string()).await
}

/// rskafka produce requests of one record each to a fresh topic.
async fn produce_singles(a: &LikesArgs) -> anyhow::Result<Run> {
    let client = kafka().await?;
    let topic = socialgraph_testkit::unique("sg.bench.produce.");
    create_topic(&client, &topic, PARTITIONS).await?;
    let pcs: Vec<_> = partition_clients(&client, &topic).await?.into_iter().map(Arc::new).collect();
    Ok(closed_loop(a.concurrency, 1_000_000, Duration::from_secs(a.secs), move |_, i| {
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
    .await)
}

/// Everything the Like table shows.
struct LikeResults {
    like: Run,
    /// Cores used during the Like run ([`Cpu::since`]).
    cpu: Cores,
    /// counter-svc's `sg_action_publish_failures_total` after the Like run.
    publish_failures: f64,
    /// Like events the relay had published (broker acknowledged) when the run ended.
    relayed: f64,
    /// From the end of the run until every outbox was empty (polled, about 0.1 s apart).
    drained_after: Duration,
    /// The Like run with the broker stopped.
    held: Held,
    eval: RedisBench,
    direct: Run,
    /// The same toggles through a bare tonic server ([`crate::floor`]).
    bare: Run,
    produce: Run,
}

/// The Like run on other entities with the broker stopped ([`Broker`]).
struct Held {
    run: Run,
    /// Cores used during it.
    cpu: Cores,
    /// From the broker's restart until every outbox was empty.
    drained_after: Duration,
}

fn print_likes(a: &LikesArgs, r: &LikeResults) {
    let (like, eval, direct, produce) = (&r.like, &r.eval, &r.direct, &r.produce);
    print_table(
        &format!("Like, distinct (actor, post) pairs over {} posts, concurrency {}", a.entities, a.concurrency),
        "Like RPC",
        "raw",
        &[
            row("Like/s vs redis-benchmark EVALSHA", like.rate(), eval.rps, "/s"),
            row("p50 vs redis-benchmark EVALSHA", like.p50(), eval.p50, "ms"),
            row("p99 vs redis-benchmark EVALSHA", like.p99(), eval.p99, "ms"),
            row("Like/s vs ZADD + EVALSHA from redis-rs", like.rate(), direct.rate(), "/s"),
            row("p99 vs ZADD + EVALSHA from redis-rs", like.p99(), direct.p99(), "ms"),
            row("broker stopped: Like/s vs redis-rs", r.held.run.rate(), direct.rate(), "/s"),
            row("broker stopped: p99 vs redis-rs", r.held.run.p99(), direct.p99(), "ms"),
            row("floor: bare tonic + ZADD + EVALSHA /s vs redis-rs", r.bare.rate(), direct.rate(), "/s"),
            row("Like/s vs rskafka produce(1 record)", like.rate(), produce.rate(), "/s"),
            row("p50 vs rskafka produce(1 record)", like.p50(), produce.p50(), "ms"),
            row("p99 vs rskafka produce(1 record)", like.p99(), produce.p99(), "ms"),
        ],
        &[
            like.describe("Like RPC")
                + &format!(
                    " (publish failures: {}; relayed by the run's end: {} of {}; outboxes empty {:.2} s after it)",
                    r.publish_failures,
                    r.relayed,
                    like.ok,
                    r.drained_after.as_secs_f64()
                ),
            format!("CPU during the Like run: {}", r.cpu.describe()),
            per_like(&r.cpu, like.rate()),
            r.held.run.describe("Like RPC on other posts (entity type photo) with the broker stopped for the run")
                + &format!("; CPU: {}; outboxes empty {:.2} s after the broker went on", r.held.cpu.describe(), r.held.drained_after.as_secs_f64()),
            "redis-benchmark EVALSHA <toggle sha> 4 <entity keys> 1 4242 <8 bytes> 1 <entry> -r 100000000 -n 200000: random \
             entity per call (each __rand_int__ independently), fixed actor"
                .into(),
            direct.describe("EVALSHA from redis-rs (same pairs, 4 multiplexed connections)"),
            r.bare.describe(&format!("floor: the same inside a bare tonic server's call (no layers, {} connections)", crate::load::CHANNELS)),
            produce.describe("rskafka produce, 1 record of 90 bytes per request, Lz4, 4 partitions"),
        ],
    );
}

/// Entity counts: BatchGetEntityCounts(100) vs MGET of 100 counters.
async fn entity_counts(
    m: &Mesh,
    a: &LikesArgs,
    clients: &[CounterServiceClient<Channel>],
    bp: &str,
    conn: &mut redis::aio::MultiplexedConnection,
) -> anyhow::Result<()> {
    progress("waiting for the counter consumer, then BatchGetEntityCounts(100)");
    counter_caught_up(&m.redis_url, &m.prefix, &[&m.topics.counter], Duration::from_secs(600)).await?;
    let entities = a.entities as u64;
    let cl = clients.to_vec();
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
    let mget = entity_counters_mget(conn, a, bp).await?;
    print_table(
        &format!("Entity counts, 100 random posts of {} per request, concurrency {}", a.entities, a.concurrency),
        "BatchGetEntityCounts",
        "redis-benchmark MGET",
        &[row("req/s", counts.rate(), mget.rps, "/s"), row("p50", counts.p50(), mget.p50, "ms"), row("p99", counts.p99(), mget.p99, "ms")],
        &[
            counts.describe("BatchGetEntityCounts"),
            "the service sends one GETRANGE of the state's first 31 bytes per entity in one pipeline; raw = one MGET of 100 \
             entity state strings of 6 bytes (a state with seq 3, 3 likes, 3 favs, no actors)"
                .into(),
        ],
    );
    Ok(())
}

/// redis-benchmark MGET of 100 random entity state strings of 6 bytes, written under the bench
/// prefix beforehand and deleted afterwards.
async fn entity_counters_mget(conn: &mut redis::aio::MultiplexedConnection, a: &LikesArgs, bp: &str) -> anyhow::Result<RedisBench> {
    let kk = Keys::new(bp.to_owned());
    for chunk in (0..a.entities).collect::<Vec<_>>().chunks(1_000) {
        let mut pipe = redis::pipe();
        for e in chunk {
            pipe.set(kk.entity("post", 0).state().replace("{post:0}", &format!("{{post:{e:012}}}")), [1u8, 3, 3, 3, 0, 0].as_slice()).ignore();
        }
        pipe.query_async::<()>(&mut *conn).await?;
    }
    let mut mget_args: Vec<String> =
        vec!["-c".into(), a.concurrency.to_string(), "-n".into(), "100000".into(), "-r".into(), a.entities.to_string(), "MGET".into()];
    mget_args.extend((0..100).map(|_| kk.entity("post", 0).state().replace("{post:0}", "{post:__rand_int__}")));
    let mget = redis_benchmark(&mget_args).await?;
    delete_prefix(conn, bp).await?;
    Ok(mget)
}

/// The four keys of the toggle script for a like: state, outbox, like chunk prefix, like spill
/// set.
fn toggle_keys(k: &EntityKeys) -> Vec<String> {
    vec![k.state(), k.outbox(), k.chunk_prefix("like"), k.spill("like")]
}

/// CPU per Like at `rate` Likes/s, and the rate the same work without the broker's share would
/// reach on this machine's cores: cores / ((Redis + this process) CPU per Like). Arithmetic on
/// the measured CPU, not a run: it assumes the cores are the limit. On this machine the
/// development broker shares the two cores with the services; the run with the broker stopped
/// shows what the Like path itself reaches.
fn per_like(cpu: &Cores, rate: f64) -> String {
    let rate = rate.max(1e-9);
    let us = |cores: f64| cores / rate * 1e6;
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get) as f64;
    let without = cores / ((cpu.store + cpu.process) / rate).max(1e-12);
    format!(
        "CPU per Like: broker {:.0} µs, Redis {:.0}, this process {:.0}; without the broker's share the same work \
         would fit {without:.0}/s on {cores} cores (arithmetic, not a run)",
        us(cpu.broker),
        us(cpu.store),
        us(cpu.process)
    )
}
