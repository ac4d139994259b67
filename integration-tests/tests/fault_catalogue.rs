//! The fault catalogue: every fault the design claims to survive, one scenario each, on real
//! PostgreSQL (and MariaDB where marked), the broker and a Redis of the scenario's own (for the
//! slot migration, a three-node Redis Cluster holding the counters and the caches).
//!
//! Each scenario runs a bounded random workload (follows, unfollows, likes, unlikes, favs) from
//! four workers in two halves (for a slot migration, as many as it lasts), injects its fault
//! between or during the second half, lets the mesh reach lag 0 and counts mismatches: the follower
//! table against the source transposed, every touched user's counters against exact counts (follows
//! from the `following` table, likes and favs received from the facts the toggles reported), every
//! touched entity's counts against its facts. It prints ops done, errors by code, time to lag 0 and
//! mismatches, and passes with zero mismatches and no error but the kinds its fault may cause. A
//! write that fails is retried until it succeeds (as a client would), so nothing the workload meant
//! to do is dropped and every like's last answer is its fact.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng, rngs::StdRng};
use socialgraph_integration_tests::faults::{Fault, Tally, World, follow_or_unfollow, mismatches, retried};
use socialgraph_integration_tests::model::{Model, Toggle, toggle};
use socialgraph_proto::counter::v1::counter_service_client::CounterServiceClient;
use socialgraph_proto::relation::v1::relation_service_client::RelationServiceClient;
use socialgraph_testkit::Backend;
use tonic::transport::Channel;

const SETTLE: Duration = Duration::from_secs(240);
const WORKERS: i64 = 4;
/// Follows and toggles per worker per half.
const OPS: usize = 80;
/// Users 1..=USERS follow each other; worker w toggles as users w*10+1..=w*10+10.
const USERS: i64 = 40;
const ENTITIES: i64 = 30;
const TOGGLES: [Toggle; 5] = [Toggle::Like, Toggle::Like, Toggle::Unlike, Toggle::Fav, Toggle::Unfav];

fn owner_of(entity: i64) -> i64 {
    100 + entity % 5
}

/// One worker's half: `OPS` follows or unfollows and `OPS` toggles by its own actors (so every
/// (actor, entity) fact is written by one worker, in order); returns the facts it was told.
async fn worker(w: i64, seed: u64, relation: Channel, counter: Channel, tally: Arc<Tally>) -> anyhow::Result<Model> {
    let (rc, cc) = (RelationServiceClient::new(relation), CounterServiceClient::new(counter));
    let mut rng = StdRng::seed_from_u64(seed * 100 + w as u64);
    let mut model = Model::default();
    for _ in 0..OPS {
        follow_or_unfollow(&tally, &rc, &mut rng, USERS).await?;
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

async fn scenario(backend: Backend, fault: Fault) -> anyhow::Result<()> {
    let mut world = World::start(backend, &[fault]).await?;
    let (tally, mut model, mut halves) = (Arc::new(Tally::default()), Model::default(), 1);
    let users: Vec<i64> = (1..=USERS).chain((0..5).map(|i| 100 + i)).collect();
    half(world.channels()?, 1, &tally, &mut model).await?;
    if fault == Fault::SlotMigration {
        // Cached lists on the cluster, for the second half's events to change while they move.
        world.read_lists(&users).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    if matches!(fault, Fault::FlushCounterRedis | Fault::DeleteAllOffsets | Fault::TerminateDatabaseConnections) {
        // Between the halves.
        world.strike(fault).await?;
        if fault.loses_facts() {
            // The like facts are gone with Redis: from now on the facts are what is toggled.
            model = Model::default();
        }
        halves += 1;
        half(world.channels()?, halves, &tally, &mut model).await?;
    } else {
        // While the workers write: the consumers are applying and the relay is publishing
        // (maybe between the broker's acknowledgement and its delete); an outage lasts through
        // most of the half.
        // A slot migration outlasts one half: the workload goes on (with fresh seeds) until
        // it is over, so that every slot moves under load.
        let struck = AtomicBool::new(false);
        let channels = world.channels()?;
        let workload = async {
            let started = Instant::now();
            loop {
                halves += 1;
                half(channels.clone(), halves, &tally, &mut model).await?;
                if fault != Fault::SlotMigration || struck.load(Ordering::Relaxed) {
                    return anyhow::Ok(started.elapsed());
                }
            }
        };
        let strike = async {
            tokio::time::sleep(Duration::from_millis(150)).await;
            let started = Instant::now();
            let done = world.strike(fault).await.map(|()| started.elapsed());
            struck.store(true, Ordering::Relaxed);
            done
        };
        let (w, s) = tokio::join!(workload, strike);
        println!("the workload wrote for {:?} after the first half; the fault lasted {:?} from 150 ms in", w?, s?);
    }
    let last_write = Instant::now();
    world.m.settle(SETTLE).await?;
    let to_lag_0 = last_write.elapsed();
    let wrong = mismatches(&world.m, &model, &users).await?;
    if fault == Fault::SlotMigration {
        let cached = world.cached_lists_exact(&users).await?;
        println!("{cached} cached lists on the cluster equal the tables");
        assert!(cached > 0, "the lists read before the migration are cached");
    }
    let errors = tally.codes();
    let ops = halves as usize * 2 * WORKERS as usize * OPS;
    println!("{fault:?} on {backend:?}: {ops} ops, errors {errors:?}, lag 0 {to_lag_0:?} after the last write, {wrong} mismatches");
    assert_eq!(wrong, 0, "{fault:?}: views differ from the source of truth");
    let tolerated = fault.tolerated();
    assert!(errors.keys().all(|c| tolerated.contains(&c.as_str())), "{fault:?} may cause only {tolerated:?}, saw {errors:?}");
    world.stop().await
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
    f11_slot_migration_on_a_redis_cluster: Postgres, SlotMigration;
}
