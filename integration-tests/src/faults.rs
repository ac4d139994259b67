//! The faults the design claims to survive, each one injectable into a running mesh while a
//! workload writes, and the exact comparison of every view with the source of truth afterwards.
//! Used by the fault catalogue test (one fault per scenario) and by the soak benchmark (a fault
//! every minute).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rand::Rng;
use socialgraph_proto::relation::v1::relation_service_client::RelationServiceClient;
use socialgraph_proto::relation::v1::{FollowRequest, UnfollowRequest};
use socialgraph_testkit::process::{self, Instance, RedisCluster};
use socialgraph_testkit::{Backend, kafka};
use tonic::Code;
use tonic::transport::Channel;

use crate::model::{Model, served_entities, served_users};
use crate::{Mesh, Service, both_tables, projected, redis_conn, terminate_connections};

/// Codes a client retries.
pub const TRANSIENT: &[Code] = &[Code::Unavailable, Code::Unknown, Code::Cancelled, Code::DeadlineExceeded, Code::Aborted];
/// How long a stopped broker or Redis stays down.
pub const DOWN: Duration = Duration::from_secs(10);
/// Errors a client may see while a server dies under it and restarts.
const RESTARTING: &[&str] = &["Unavailable", "Unsent", "Unknown", "Cancelled"];
/// How long [`retried`] keeps retrying one call.
const RETRY_FOR: Duration = Duration::from_secs(90);

/// One fault of the catalogue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// projection-svc killed (its runtime dropped mid-apply) and restarted on its ports.
    KillProjection,
    /// counter-svc killed and restarted.
    KillCounter,
    /// relation-svc killed while its relay publishes (between the broker's acknowledgement and
    /// the outbox delete, so records are published twice), and restarted.
    KillRelationMidRelay,
    /// The broker stopped for [`DOWN`] and started again on its port and data directory.
    BrokerDown,
    /// The counter Redis flushed (counters, like facts, consumer offsets: everything).
    FlushCounterRedis,
    /// Every consumer offset deleted (a full replay of every topic).
    DeleteAllOffsets,
    /// SIGTERM to each service in turn, each restarted after it drained.
    RollingRestart,
    /// Every database connection of the services terminated by the server.
    TerminateDatabaseConnections,
    /// The counter Redis stopped for [`DOWN`] and started again from its append-only file.
    CounterRedisDown,
    /// On a three-node Redis Cluster holding the counters and the caches: every slot of the
    /// first node migrated to the second, then 4,000 of those on to the third (not in
    /// [`Self::ALL`]: its world runs on a cluster, where the single-Redis faults do not apply).
    SlotMigration,
}

impl Fault {
    /// Every fault, in catalogue order.
    pub const ALL: [Fault; 9] = [
        Self::KillProjection,
        Self::KillCounter,
        Self::KillRelationMidRelay,
        Self::BrokerDown,
        Self::FlushCounterRedis,
        Self::DeleteAllOffsets,
        Self::RollingRestart,
        Self::TerminateDatabaseConnections,
        Self::CounterRedisDown,
    ];

    /// Errors a client may see under this fault (each retried until it succeeds), as labelled by
    /// [`Tally`].
    pub fn tolerated(self) -> &'static [&'static str] {
        match self {
            Self::KillProjection | Self::BrokerDown | Self::FlushCounterRedis => &[],
            Self::KillCounter | Self::KillRelationMidRelay | Self::DeleteAllOffsets => RESTARTING,
            Self::RollingRestart => &["Unavailable", "Unsent", "GoAway"],
            Self::TerminateDatabaseConnections | Self::CounterRedisDown | Self::SlotMigration => &["Unavailable"],
        }
    }

    /// Whether the fault loses like facts (a workload's model of them must start again).
    pub fn loses_facts(self) -> bool {
        self == Self::FlushCounterRedis
    }
}

/// Errors seen by a workload, by code, with two labels of their own for requests a server's
/// graceful shutdown refused (its GOAWAY raced the client), which a client retries as it
/// retries UNAVAILABLE:
/// - `Unsent`: never sent, the connection closing under it; tonic reports CANCELLED "operation
///   was canceled" with hyper's "connection closed" underneath;
/// - `GoAway`: sent on a stream the GOAWAY(NO_ERROR) refused; tonic reports INTERNAL "h2
///   protocol error" (grpc-java maps the same to UNAVAILABLE since its issue 1355).
#[derive(Default)]
pub struct Tally(Mutex<BTreeMap<String, usize>>);

/// The [`Tally`] label of `s`, or `None` for a status no client retries.
fn transient_label(s: &tonic::Status) -> Option<String> {
    let text = format!("{s:?}");
    if s.code() == Code::Cancelled && text.contains("connection closed") {
        Some("Unsent".to_owned())
    } else if s.code() == Code::Internal && text.contains("GoAway") && text.contains("NO_ERROR") {
        Some("GoAway".to_owned())
    } else {
        TRANSIENT.contains(&s.code()).then(|| format!("{:?}", s.code()))
    }
}

impl Tally {
    /// Counts `s` under its label.
    pub fn note(&self, s: &tonic::Status) {
        let label = transient_label(s).unwrap_or_else(|| format!("{:?}", s.code()));
        *self.0.lock().expect("tally").entry(label).or_default() += 1;
    }

    /// The counts so far, by label.
    pub fn codes(&self) -> BTreeMap<String, usize> {
        self.0.lock().expect("tally").clone()
    }
}

/// `call` until it succeeds (for at most 90 s), each failure noted in `tally`; a failure no
/// client would retry (INVALID_ARGUMENT, INTERNAL but a refused stream, …) is returned at once.
///
/// # Errors
/// The first non-transient status, or the last one after 90 s.
pub async fn retried<T, Fut>(tally: &Tally, mut call: impl FnMut() -> Fut) -> anyhow::Result<T>
where
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let started = Instant::now();
    loop {
        match call().await {
            Ok(v) => return Ok(v),
            Err(s) if transient_label(&s).is_some() && started.elapsed() < RETRY_FOR => {
                tally.note(&s);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(s) => anyhow::bail!("failed after {:?}: {s:?}", started.elapsed()),
        }
    }
}

/// One random change of the follow graph among users `1..=users`: a follows or unfollows b
/// (a != b, follows 70 %), retried as [`retried`] does.
///
/// # Errors
/// See [`retried`].
pub async fn follow_or_unfollow(tally: &Tally, rc: &RelationServiceClient<Channel>, rng: &mut impl Rng, users: i64) -> anyhow::Result<()> {
    let (a, b) = (rng.random_range(1..=users), rng.random_range(1..users));
    let b = if b >= a { b + 1 } else { b };
    let follow = rng.random_bool(0.7);
    retried(tally, || {
        let mut rc = rc.clone();
        async move {
            if follow {
                rc.follow(FollowRequest { follower_id: a, followee_id: b }).await.map(drop)
            } else {
                rc.unfollow(UnfollowRequest { follower_id: a, followee_id: b }).await.map(drop)
            }
        }
    })
    .await
}

/// A channel to `addr` that connects on first use and reconnects after its server restarts.
///
/// # Errors
/// Only for an address that makes no URI.
pub fn lazy(addr: std::net::SocketAddr) -> anyhow::Result<Channel> {
    Ok(Channel::from_shared(format!("http://{addr}"))?.connect_lazy())
}

/// A mesh with a counter Redis of its own (with an append-only file when it may be stopped: it
/// holds facts) and, when it may be stopped, a broker of its own.
pub struct World {
    /// The mesh.
    pub m: Mesh,
    redis: Option<Instance>,
    /// The Redis Cluster of a [`Fault::SlotMigration`] world (counters and caches), instead of
    /// `redis`.
    pub cluster: Option<RedisCluster>,
    /// The append-only file's directory, when Redis keeps one.
    aof: Option<PathBuf>,
    broker: Option<(Instance, PathBuf)>,
}

impl World {
    /// Starts the stores and the mesh on `backend`, ready for each of `faults`.
    ///
    /// # Errors
    /// A store or service that does not start.
    pub async fn start(backend: Backend, faults: &[Fault]) -> anyhow::Result<Self> {
        let aof = faults.contains(&Fault::CounterRedisDown).then(|| std::env::temp_dir().join(socialgraph_testkit::unique("sg-aof-")));
        let broker = if faults.contains(&Fault::BrokerDown) {
            let dir = std::env::temp_dir().join(socialgraph_testkit::unique("sg-broker-"));
            Some((process::broker(process::free_port()?, &dir).await?, dir))
        } else {
            None
        };
        let brokers = broker.as_ref().map_or_else(kafka::brokers, |(b, _)| vec![format!("127.0.0.1:{}", b.port)]);
        if faults.contains(&Fault::SlotMigration) {
            let cluster = process::redis_cluster(3).await?;
            let url = cluster.url();
            let m = Mesh::start_tuned(backend, &url, &brokers, |c| c.url.clone_from(&url)).await?;
            return Ok(Self { m, redis: None, cluster: Some(cluster), aof, broker });
        }
        let redis = match &aof {
            Some(dir) => process::redis_with_aof(0, dir).await?,
            None => process::redis(0).await?,
        };
        let m = Mesh::start_on(backend, &format!("redis://127.0.0.1:{}", redis.port), &brokers).await?;
        Ok(Self { m, redis: Some(redis), cluster: None, aof, broker })
    }

    /// Lazy channels to relation-svc and counter-svc (they follow restarts on the same ports).
    ///
    /// # Errors
    /// See [`lazy`].
    pub fn channels(&self) -> anyhow::Result<(Channel, Channel)> {
        Ok((lazy(self.m.relation.addr)?, lazy(self.m.counter.addr)?))
    }

    /// Injects `fault` and, for a fault that lasts (a kill, an outage, a rolling restart), waits
    /// until the mesh is whole again. Runs beside a workload: it borrows the world only.
    ///
    /// # Errors
    /// A store or service that does not come back, or a fault the world was not started for.
    pub async fn strike(&mut self, fault: Fault) -> anyhow::Result<()> {
        let m = &mut self.m;
        match fault {
            Fault::KillProjection | Fault::KillCounter | Fault::KillRelationMidRelay => {
                let which = match fault {
                    Fault::KillProjection => Service::Projection,
                    Fault::KillCounter => Service::Counter,
                    _ => Service::Relation,
                };
                let (waiting, _) = socialgraph_storage::outbox::backlog(&m.db.conn).await?;
                m.svc(which).kill().await;
                println!("{which:?} killed with {waiting} events waiting in the outbox");
                m.restart(which).await?;
            }
            Fault::BrokerDown => {
                let Some((broker, dir)) = self.broker.as_mut() else { anyhow::bail!("this world shares the broker: start it for BrokerDown") };
                broker.kill().await?;
                tokio::time::sleep(DOWN).await;
                *broker = process::broker(broker.port, dir).await?;
            }
            Fault::CounterRedisDown => {
                let (Some(aof), Some(redis)) = (&self.aof, self.redis.as_mut()) else {
                    anyhow::bail!("this Redis keeps no append-only file: start the world for CounterRedisDown")
                };
                redis.kill().await?;
                tokio::time::sleep(DOWN).await;
                *redis = process::redis_with_aof(redis.port, aof).await?;
            }
            Fault::SlotMigration => {
                let Some(cluster) = &self.cluster else { anyhow::bail!("this world has no Redis Cluster: start it for SlotMigration") };
                let started = Instant::now();
                let all = cluster.slots_of(0).await?;
                cluster.reshard(0, 1, all).await?;
                cluster.reshard(1, 2, 4_000).await?;
                let held = [cluster.slots_of(0).await?, cluster.slots_of(1).await?, cluster.slots_of(2).await?];
                println!("{} slot migrations in {:?}; slots per node now {held:?}", all + 4_000, started.elapsed());
                anyhow::ensure!(held[0] == 0 && held.iter().sum::<u32>() == 16_384, "unexpected slot map {held:?}");
            }
            Fault::FlushCounterRedis => {
                let _: () = redis::cmd("FLUSHALL").query_async(&mut redis_conn(&m.redis_url).await?).await?;
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
            Fault::RollingRestart => {
                for which in [Service::Relation, Service::Projection, Service::Counter] {
                    tokio::time::sleep(Duration::from_millis(700)).await;
                    let svc = m.svc(which);
                    svc.shutdown.cancel();
                    (&mut svc.task).await??;
                    if which == Service::Counter {
                        // Stopped gracefully, counter-svc gave its relay lease up for the next
                        // replica to take at once.
                        let lease = socialgraph_cache::keys::Keys::new(m.prefix.clone()).relay_lease();
                        let held: bool = redis::AsyncCommands::exists(&mut redis_conn(&m.redis_url).await?, &lease).await?;
                        anyhow::ensure!(!held, "the like/fav relay lease outlives a graceful stop");
                    }
                    m.restart(which).await?;
                }
            }
            Fault::TerminateDatabaseConnections => {
                let n = terminate_connections(&m.db.url).await?;
                println!("{n} database connections terminated");
            }
        }
        Ok(())
    }

    /// Reads the following list and follower window of each of `users` once, so that their
    /// caches fill (in the background, as the services fill them).
    ///
    /// # Errors
    /// A call failed.
    pub async fn read_lists(&self, users: &[i64]) -> anyhow::Result<()> {
        use socialgraph_proto::projection::v1::ListFollowersRequest;
        use socialgraph_proto::relation::v1::ListFollowingRequest;
        let (mut rc, mut pc) = (self.m.relation.client().await?, self.m.projection.projection().await?);
        for &user_id in users {
            rc.list_following(ListFollowingRequest { user_id, page_size: 1000, ..Default::default() }).await?;
            pc.list_followers(ListFollowersRequest { user_id, page_size: 1000, ..Default::default() }).await?;
        }
        Ok(())
    }

    /// On a [`Fault::SlotMigration`] world at lag 0: asserts that every cached following list
    /// and follower window of `users` on the cluster equals the tables; returns how many were
    /// cached.
    ///
    /// # Errors
    /// No cluster, or the cluster or the database failed; a difference panics.
    pub async fn cached_lists_exact(&self, users: &[i64]) -> anyhow::Result<usize> {
        let Some(cluster) = &self.cluster else { anyhow::bail!("this world has no Redis Cluster") };
        let prefix = crate::cache_settings(&self.m.topics.relation).key_prefix;
        let mut cached = 0;
        for following in [true, false] {
            cached += crate::cache::assert_cached_exact(&self.m.db, &cluster.url(), &prefix, following, users).await?;
        }
        Ok(cached)
    }

    /// Stops the mesh and the stores and removes their files.
    ///
    /// # Errors
    /// A service that fails on its way out.
    pub async fn stop(self) -> anyhow::Result<()> {
        let Self { m, redis, cluster, aof, broker } = self;
        m.stop().await?;
        drop((redis, cluster));
        if let Some(dir) = aof {
            let _ = std::fs::remove_dir_all(dir);
        }
        if let Some((b, dir)) = broker {
            drop(b);
            let _ = std::fs::remove_dir_all(dir);
        }
        Ok(())
    }
}

/// Mismatches between every view and the source of truth, once the mesh is at lag 0: follower
/// rows not equal to the `following` table transposed, then each of `users` whose served
/// counters differ from the exact counts (follows from the table, likes and favs received from
/// `model`), then each entity of `model` whose counts differ from its facts. Each mismatch is
/// printed.
///
/// # Errors
/// A store or service that does not answer.
pub async fn mismatches(m: &Mesh, model: &Model, users: &[i64]) -> anyhow::Result<usize> {
    let (following, follower) = both_tables(&m.db).await?;
    let source: BTreeSet<String> = projected(following).into_iter().map(|e| format!("{e:?}")).collect();
    let follower: BTreeSet<String> = follower.into_iter().map(|e| format!("{e:?}")).collect();
    let mut wrong = source.symmetric_difference(&follower).count();
    let mut cc = m.counter.counter().await?;
    let (want, got) = (model.users(&m.db, users).await?, served_users(&mut cc, users).await?);
    for u in users {
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
