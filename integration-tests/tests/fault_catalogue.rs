//! The fault catalogue: every fault the design claims to survive, one scenario each, on real
//! PostgreSQL (and MariaDB where marked), the broker and a Redis of the scenario's own.
//!
//! Each scenario runs a bounded random workload (follows, unfollows, likes, unlikes, favs) from
//! four workers in two halves, injects its fault between or during the second half, lets the
//! mesh reach lag 0 and counts mismatches: the follower table against the source transposed,
//! every touched user's counters against exact counts (follows from the `following` table,
//! likes and favs received from the facts the toggles reported), every touched entity's counts
//! against its facts. It prints ops done, errors by code, time to lag 0 and mismatches, and
//! passes with zero mismatches and no error but the kinds its fault may cause. A write that
//! fails is retried until it succeeds (as a client would), so nothing the workload meant to do
//! is dropped and every like's last answer is its fact.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng, rngs::StdRng};
use socialgraph_integration_tests::model::{Model, Toggle, served_entities, served_users, toggle};
use socialgraph_integration_tests::*;
use socialgraph_proto::counter::v1::counter_service_client::CounterServiceClient;
use socialgraph_proto::relation::v1::relation_service_client::RelationServiceClient;
use socialgraph_proto::relation::v1::{FollowRequest, UnfollowRequest};
use socialgraph_testkit::process::{self, Instance};
use socialgraph_testkit::{Backend, kafka};
use tonic::Code;
use tonic::transport::Channel;

const SETTLE: Duration = Duration::from_secs(240);
const WORKERS: i64 = 4;
/// Follows and toggles per worker per half.
const OPS: usize = 80;
/// Users 1..=USERS follow each other; worker w toggles as users w*10+1..=w*10+10.
const USERS: i64 = 40;
const ENTITIES: i64 = 30;
const TOGGLES: [Toggle; 5] = [Toggle::Like, Toggle::Like, Toggle::Unlike, Toggle::Fav, Toggle::Unfav];
/// Codes a client retries.
const TRANSIENT: &[Code] = &[Code::Unavailable, Code::Unknown, Code::Cancelled, Code::DeadlineExceeded, Code::Aborted];
/// How long a stopped broker or Redis stays down.
const DOWN: Duration = Duration::from_secs(10);
/// Errors a client may see while a server dies under it and restarts.
const RESTARTING: &[&str] = &["Unavailable", "Unsent", "Unknown", "Cancelled"];

fn owner_of(entity: i64) -> i64 {
    100 + entity % 5
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    KillProjection,
    KillCounter,
    KillRelationMidRelay,
    BrokerDown,
    FlushCounterRedis,
    DeleteAllOffsets,
    RollingRestart,
    TerminateDatabaseConnections,
    CounterRedisDown,
}

impl Fault {
    /// Errors the workload may see under this fault (each retried until it succeeds).
    fn tolerated(self) -> &'static [&'static str] {
        match self {
            Self::KillProjection | Self::BrokerDown | Self::FlushCounterRedis => &[],
            Self::KillCounter | Self::KillRelationMidRelay | Self::DeleteAllOffsets => RESTARTING,
            Self::RollingRestart => &["Unavailable", "Unsent"],
            Self::TerminateDatabaseConnections | Self::CounterRedisDown => &["Unavailable"],
        }
    }
}

/// Errors seen by the workload, by code. `Unsent` is a request that a connection closing under
/// it (the server's graceful GOAWAY racing the client) never sent: tonic reports it as
/// CANCELLED "operation was canceled" with hyper's "connection closed" underneath, and a client
/// retries it as it retries UNAVAILABLE.
#[derive(Default)]
struct Tally(Mutex<BTreeMap<String, usize>>);

impl Tally {
    fn note(&self, s: &tonic::Status) {
        let unsent = s.code() == Code::Cancelled && format!("{s:?}").contains("connection closed");
        let label = if unsent { "Unsent".to_owned() } else { format!("{:?}", s.code()) };
        *self.0.lock().expect("tally").entry(label).or_default() += 1;
    }
    fn codes(&self) -> BTreeMap<String, usize> {
        self.0.lock().expect("tally").clone()
    }
}

/// `call` until it succeeds (at most 90 s), each failure noted; a failure no client would retry
/// (INVALID_ARGUMENT, …) ends the scenario at once.
async fn retried<T, Fut>(tally: &Tally, mut call: impl FnMut() -> Fut) -> anyhow::Result<T>
where
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let started = Instant::now();
    loop {
        match call().await {
            Ok(v) => return Ok(v),
            Err(s) if TRANSIENT.contains(&s.code()) && started.elapsed() < Duration::from_secs(90) => {
                if std::env::var_os("SG_FAULTS_VERBOSE").is_some() {
                    println!("retrying after {s:?}");
                }
                tally.note(&s);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(s) => anyhow::bail!("failed after {:?}: {s:?}", started.elapsed()),
        }
    }
}

/// One worker's half: `OPS` follows or unfollows and `OPS` toggles by its own actors (so every
/// (actor, entity) fact is written by one worker, in order); returns the facts it was told.
async fn worker(w: i64, seed: u64, relation: Channel, counter: Channel, tally: Arc<Tally>) -> anyhow::Result<Model> {
    let (rc, cc) = (RelationServiceClient::new(relation), CounterServiceClient::new(counter));
    let mut rng = StdRng::seed_from_u64(seed * 100 + w as u64);
    let mut model = Model::default();
    for _ in 0..OPS {
        let (a, b) = (rng.random_range(1..=USERS), rng.random_range(1..USERS));
        let b = if b >= a { b + 1 } else { b };
        let follow = rng.random_bool(0.7);
        retried(&tally, || {
            let mut rc = rc.clone();
            async move {
                if follow {
                    rc.follow(FollowRequest { follower_id: a, followee_id: b }).await.map(drop)
                } else {
                    rc.unfollow(UnfollowRequest { follower_id: a, followee_id: b }).await.map(drop)
                }
            }
        })
        .await?;
        let (actor, e) = (w * 10 + rng.random_range(1..=10), rng.random_range(1..=ENTITIES));
        let op = TOGGLES[rng.random_range(0..TOGGLES.len())];
        let (_, active) = retried(&tally, || {
            let mut cc = cc.clone();
            async move { toggle(&mut cc, op, actor, e, owner_of(e)).await }
        })
        .await?;
        model.record(op, actor, e, owner_of(e), active);
    }
    Ok(model)
}

/// The channels of the workload: relation-svc's and counter-svc's addresses.
fn channels(m: &Mesh) -> anyhow::Result<(Channel, Channel)> {
    Ok((lazy(m.relation.addr)?, lazy(m.counter.addr)?))
}

/// The workers of one half, their facts merged into `model`.
async fn half((relation, counter): (Channel, Channel), seed: u64, tally: &Arc<Tally>, model: &mut Model) -> anyhow::Result<()> {
    let tasks: Vec<_> = (0..WORKERS).map(|w| tokio::spawn(worker(w, seed, relation.clone(), counter.clone(), Arc::clone(tally)))).collect();
    for t in tasks {
        let part = t.await??;
        model.liked.extend(part.liked);
        model.faved.extend(part.faved);
        model.owner.extend(part.owner);
    }
    Ok(())
}

/// A channel that connects on first use and reconnects after its server restarts.
fn lazy(addr: std::net::SocketAddr) -> anyhow::Result<Channel> {
    Ok(Channel::from_shared(format!("http://{addr}"))?.connect_lazy())
}

/// The mesh of one scenario: its own counter Redis (with an append-only file when the fault
/// stops it: it holds facts) and its own broker when the fault stops that.
struct World {
    m: Mesh,
    redis: Instance,
    aof: std::path::PathBuf,
    broker: Option<(Instance, std::path::PathBuf)>,
}

impl World {
    async fn start(backend: Backend, fault: Fault) -> anyhow::Result<Self> {
        let aof = std::env::temp_dir().join(socialgraph_testkit::unique("sg-aof-"));
        let redis = if fault == Fault::CounterRedisDown { process::redis_with_aof(0, &aof).await? } else { process::redis(0).await? };
        let broker = if fault == Fault::BrokerDown {
            let dir = std::env::temp_dir().join(socialgraph_testkit::unique("sg-broker-"));
            Some((process::broker(process::free_port()?, &dir).await?, dir))
        } else {
            None
        };
        let brokers = broker.as_ref().map_or_else(kafka::brokers, |(b, _)| vec![format!("127.0.0.1:{}", b.port)]);
        let m = Mesh::start_on(backend, &format!("redis://127.0.0.1:{}", redis.port), &brokers).await?;
        Ok(Self { m, redis, aof, broker })
    }

    /// Injects `fault`; `model` forgets the like facts when Redis loses them.
    async fn inject(&mut self, fault: Fault, model: &mut Model) -> anyhow::Result<()> {
        let m = &mut self.m;
        match fault {
            Fault::FlushCounterRedis => {
                let _: () = redis::cmd("FLUSHALL").query_async(&mut redis_conn(&m.redis_url).await?).await?;
                // The like facts are gone with it: from now on the facts are what is toggled.
                *model = Model::default();
            }
            Fault::DeleteAllOffsets => {
                m.projection.kill().await;
                m.counter.kill().await;
                for topic in [&m.topics.relation, &m.topics.content] {
                    socialgraph_storage::offsets::reset(&m.db.conn, &m.projection_config().database.consumer_name, topic).await?;
                }
                let keys = socialgraph_cache::keys::Keys::new(m.prefix.clone());
                let _: i64 = redis::AsyncCommands::del(&mut redis_conn(&m.redis_url).await?, keys.consumer_offsets("counter")).await?;
                m.restart(Service::Projection).await?;
                m.restart(Service::Counter).await?;
            }
            Fault::TerminateDatabaseConnections => {
                let n = terminate_connections(&m.db.url).await?;
                println!("{n} database connections terminated");
            }
            // These come during the second half: see `second_half`.
            Fault::KillProjection
            | Fault::KillCounter
            | Fault::KillRelationMidRelay
            | Fault::BrokerDown
            | Fault::RollingRestart
            | Fault::CounterRedisDown => {}
        }
        Ok(())
    }

    /// Runs the second half with `fault` lasting through it where the fault has a duration.
    async fn second_half(&mut self, fault: Fault, tally: &Arc<Tally>, model: &mut Model) -> anyhow::Result<()> {
        match fault {
            Fault::BrokerDown | Fault::CounterRedisDown => {
                // Down for DOWN while the workers write, then started again on the same port.
                let down = Instant::now();
                if fault == Fault::BrokerDown {
                    self.broker.as_mut().expect("own broker").0.kill().await?;
                } else {
                    self.redis.kill().await?;
                }
                let workload = half(channels(&self.m)?, 2, tally, model);
                let (broker, redis, aof) = (&mut self.broker, &mut self.redis, &self.aof);
                let outage = async {
                    tokio::time::sleep(DOWN).await;
                    match broker.as_mut().filter(|_| fault == Fault::BrokerDown) {
                        Some((b, dir)) => *b = process::broker(b.port, dir).await?,
                        None => *redis = process::redis_with_aof(redis.port, aof).await?,
                    }
                    anyhow::Ok(down.elapsed())
                };
                let (w, o) = tokio::join!(workload, outage);
                w?;
                println!("down for {:?}", o?);
            }
            Fault::KillProjection | Fault::KillCounter | Fault::KillRelationMidRelay => {
                // Killed while the workers write: the consumers are applying and the relay is
                // publishing (maybe between the broker's acknowledgement and its delete).
                let which = match fault {
                    Fault::KillProjection => Service::Projection,
                    Fault::KillCounter => Service::Counter,
                    _ => Service::Relation,
                };
                let workload = half(channels(&self.m)?, 2, tally, model);
                let m = &mut self.m;
                let kill = async {
                    tokio::time::sleep(Duration::from_millis(150)).await;
                    let (waiting, _) = socialgraph_storage::outbox::backlog(&m.db.conn).await?;
                    m.svc(which).kill().await;
                    println!("{which:?} killed with {waiting} events waiting in the outbox");
                    m.restart(which).await
                };
                let (w, k) = tokio::join!(workload, kill);
                w?;
                k?;
            }
            Fault::RollingRestart => {
                // SIGTERM to each service in turn while the workers write: drains, restarts.
                let workload = half(channels(&self.m)?, 2, tally, model);
                let m = &mut self.m;
                let rolling = async {
                    for which in [Service::Relation, Service::Projection, Service::Counter] {
                        tokio::time::sleep(Duration::from_millis(700)).await;
                        let svc = m.svc(which);
                        svc.shutdown.cancel();
                        (&mut svc.task).await??;
                        if which == Service::Counter {
                            // Stopped gracefully, counter-svc gave its relay lease up for the
                            // next replica to take at once.
                            let lease = socialgraph_cache::keys::Keys::new(m.prefix.clone()).relay_lease();
                            let held: bool = redis::AsyncCommands::exists(&mut redis_conn(&m.redis_url).await?, &lease).await?;
                            assert!(!held, "the like/fav relay lease outlives a graceful stop");
                        }
                        m.restart(which).await?;
                    }
                    anyhow::Ok(())
                };
                let (w, r) = tokio::join!(workload, rolling);
                w?;
                r?;
            }
            _ => half(channels(&self.m)?, 2, tally, model).await?,
        }
        Ok(())
    }
}

/// Mismatches between every view and the source of truth after lag 0.
async fn mismatches(m: &Mesh, model: &Model) -> anyhow::Result<usize> {
    let (following, follower) = both_tables(&m.db).await?;
    let source: BTreeSet<String> = projected(following).into_iter().map(|e| format!("{e:?}")).collect();
    let follower: BTreeSet<String> = follower.into_iter().map(|e| format!("{e:?}")).collect();
    let mut wrong = source.symmetric_difference(&follower).count();
    let users: Vec<i64> = (1..=USERS).chain((0..5).map(|i| 100 + i)).collect();
    let mut cc = m.counter.counter().await?;
    let (want, got) = (model.users(&m.db, &users).await?, served_users(&mut cc, &users).await?);
    for u in &users {
        if want.get(u) != got.get(u) {
            println!("user {u}: want {:?}, got {:?}", want.get(u), got.get(u));
            wrong += 1;
        }
    }
    let entities: Vec<i64> = model.owner.keys().copied().collect();
    let (want, got) = (model.entity_counts(), served_entities(&mut cc, &entities).await?);
    for e in &entities {
        if want.get(e) != got.get(e) {
            println!("entity {e}: want {:?}, got {:?}", want.get(e), got.get(e));
            wrong += 1;
        }
    }
    Ok(wrong)
}

async fn scenario(backend: Backend, fault: Fault) -> anyhow::Result<()> {
    let mut world = World::start(backend, fault).await?;
    let (tally, mut model) = (Arc::new(Tally::default()), Model::default());
    half(channels(&world.m)?, 1, &tally, &mut model).await?;
    world.inject(fault, &mut model).await?;
    world.second_half(fault, &tally, &mut model).await?;
    let last_write = Instant::now();
    world.m.settle(SETTLE).await?;
    let to_lag_0 = last_write.elapsed();
    let wrong = mismatches(&world.m, &model).await?;
    let errors = tally.codes();
    let ops = 2 * 2 * WORKERS as usize * OPS;
    println!("{fault:?} on {backend:?}: {ops} ops, errors {errors:?}, lag 0 {to_lag_0:?} after the last write, {wrong} mismatches");
    assert_eq!(wrong, 0, "{fault:?}: views differ from the source of truth");
    let tolerated = fault.tolerated();
    assert!(errors.keys().all(|c| tolerated.contains(&c.as_str())), "{fault:?} may cause only {tolerated:?}, saw {errors:?}");
    let World { m, redis: _redis, aof, broker } = world;
    m.stop().await?;
    let _ = std::fs::remove_dir_all(aof);
    if let Some((_, dir)) = broker {
        let _ = std::fs::remove_dir_all(dir);
    }
    Ok(())
}

macro_rules! scenarios {
    ($($name:ident: $backend:ident, $fault:ident;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $name() -> anyhow::Result<()> {
            scenario(Backend::$backend, Fault::$fault).await
        }
    )*};
}

scenarios! {
    f01_projection_killed_mid_apply: Postgres, KillProjection;
    f02_counter_killed: Postgres, KillCounter;
    f03_relation_killed_between_produce_and_delete: Postgres, KillRelationMidRelay;
    f04_broker_stopped_for_10_s: Postgres, BrokerDown;
    f05_counter_redis_flushed: Postgres, FlushCounterRedis;
    f06_all_consumer_offsets_deleted: Postgres, DeleteAllOffsets;
    f07_rolling_sigterm_restart_under_load: Postgres, RollingRestart;
    f08_database_connections_terminated: Postgres, TerminateDatabaseConnections;
    f09_counter_redis_stopped_for_10_s: Postgres, CounterRedisDown;
    f10_projection_killed_mid_apply_on_mariadb: MariaDb, KillProjection;
    f10_relation_killed_between_produce_and_delete_on_mariadb: MariaDb, KillRelationMidRelay;
    f10_all_consumer_offsets_deleted_on_mariadb: MariaDb, DeleteAllOffsets;
}
