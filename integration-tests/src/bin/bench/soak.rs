//! Part `soak`: the fault catalogue's mixed workload (follows, unfollows, likes, unlikes, favs)
//! offered open loop at 80 % of the rate the whole pipeline sustains (a closed-loop run's ops
//! over the time until the views hold them all), for ten minutes, with one
//! fault of the catalogue every minute (in catalogue order, round robin); then lag 0 and the
//! exact comparison of every view with the source of truth. Prints, per minute, the fault, ops
//! done, errors by code, latency and the backlog; at the end, the mismatches (0 is the target).
//!
//! Every call is retried on a transient code until it succeeds, as a client would, so its
//! latency includes the retries; the toggles of one actor run one at a time (each actor's last
//! answer per entity is its fact). The Redis flush is left out: likes toggled while it runs have
//! no knowable fact (the catalogue runs it between two halves of its workload instead).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng, rngs::StdRng};
use socialgraph_integration_tests::faults::{Fault, Tally, World, follow_or_unfollow, lazy, mismatches, retried};
use socialgraph_integration_tests::model::{Model, Toggle, toggle};
use socialgraph_proto::counter::v1::counter_service_client::CounterServiceClient;
use socialgraph_proto::projection::v1::GetProjectionStatusRequest;
use socialgraph_proto::projection::v1::projection_service_client::ProjectionServiceClient;
use socialgraph_proto::relation::v1::relation_service_client::RelationServiceClient;
use socialgraph_testkit::Backend;
use tonic::transport::Channel;

use crate::SoakArgs;
use crate::load::{closed_loop, mix};
use crate::report::{Hist, header, hist, ms, progress, summarize};

/// Longest a fault may take to strike and heal (a 10 s outage and a restart included).
const STRIKE_WITHIN: Duration = Duration::from_secs(120);
/// Length of the closed-loop run that finds the sustainable rate.
const PROBE: Duration = Duration::from_secs(10);
/// Callers of the closed-loop run that finds the sustainable rate.
const CALLERS: usize = 32;
/// Ops in flight at most, under the servers' limits (`concurrency_limit_per_connection` 256 on
/// each of [`CONNECTIONS`], `concurrency_limit` 1,024), which shed what goes beyond them; an op
/// offered beyond it is counted as not sent (the backlog an outage leaves).
const MAX_IN_FLIGHT: usize = 960;
/// Connections to each service.
const CONNECTIONS: usize = 4;
/// Entities liked; entity e belongs to owner `OWNERS_FROM + e % OWNERS`.
const ENTITIES: i64 = 5_000;
const OWNERS_FROM: i64 = 1_000_000;
const OWNERS: i64 = 50;
const TOGGLES: [Toggle; 5] = [Toggle::Like, Toggle::Like, Toggle::Unlike, Toggle::Fav, Toggle::Unfav];

/// What every op shares.
struct Load {
    relation: Vec<RelationServiceClient<Channel>>,
    counter: Vec<CounterServiceClient<Channel>>,
    tally: Tally,
    model: Mutex<Model>,
    /// One per actor: the toggles of an actor run one at a time.
    actors: Vec<tokio::sync::Mutex<()>>,
    users: i64,
    /// Latency (µs, retries included) of the ops finished in the current minute.
    lat: Mutex<Hist>,
}

impl Load {
    /// Op `i`: half follows or unfollows between random users, half toggles by a random actor.
    async fn op(&self, i: usize) -> anyhow::Result<()> {
        let mut rng = StdRng::seed_from_u64(mix(i as u64));
        let started = Instant::now();
        let k = i % CONNECTIONS;
        if rng.random_bool(0.5) {
            follow_or_unfollow(&self.tally, &self.relation[k], &mut rng, self.users).await?;
        } else {
            let (actor, e) = (rng.random_range(1..=self.users), rng.random_range(1..=ENTITIES));
            let (op, owner) = (TOGGLES[rng.random_range(0..TOGGLES.len())], OWNERS_FROM + e % OWNERS);
            let _turn = self.actors[actor as usize].lock().await;
            let (_, active) = retried(&self.tally, || {
                let mut cc = self.counter[k].clone();
                async move { toggle(&mut cc, op, actor, e, owner).await }
            })
            .await?;
            self.model.lock().expect("model").record(op, actor, e, owner, active);
        }
        self.lat.lock().expect("latency").saturating_record(started.elapsed().as_micros() as u64);
        Ok(())
    }
}

pub(crate) async fn run(a: &SoakArgs) -> anyhow::Result<()> {
    header("soak: the mixed workload open loop with a fault every minute");
    let faults: Vec<Fault> = Fault::ALL.into_iter().filter(|f| !f.loses_facts()).collect();
    let mut world = World::start(Backend::Postgres, &faults).await?;
    // One channel each: clones of a channel share its one connection.
    let (ra, ca) = (world.m.relation.addr, world.m.counter.addr);
    let load = Arc::new(Load {
        relation: (0..CONNECTIONS).map(|_| lazy(ra).map(RelationServiceClient::new)).collect::<anyhow::Result<_>>()?,
        counter: (0..CONNECTIONS).map(|_| lazy(ca).map(CounterServiceClient::new)).collect::<anyhow::Result<_>>()?,
        tally: Tally::default(),
        model: Mutex::new(Model::default()),
        actors: (0..=a.users).map(|_| tokio::sync::Mutex::new(())).collect(),
        users: a.users,
        lat: Mutex::new(hist()),
    });
    let next = Arc::new(AtomicU64::new(0));
    let rate = if a.rate > 0 {
        a.rate
    } else {
        progress(&format!("finding the sustainable rate: {PROBE:?} closed loop, {CALLERS} callers, then lag 0"));
        let (l, n) = (Arc::clone(&load), Arc::clone(&next));
        let probe = closed_loop(CALLERS, usize::MAX, PROBE, move |_, _| {
            let (l, i) = (Arc::clone(&l), n.fetch_add(1, Ordering::Relaxed) as usize);
            async move { l.op(i).await }
        })
        .await;
        progress(&probe.describe("closed loop"));
        // Sustainable means the whole pipeline keeps up, not only the RPCs: the probe's ops
        // over the time until the views have them all (the relays and consumers share the
        // machine with the broker and the callers).
        let drained = Instant::now();
        world.m.settle(Duration::from_secs(600)).await?;
        let drain = drained.elapsed();
        let sustained = probe.rate() * PROBE.as_secs_f64() / (PROBE + drain).as_secs_f64();
        progress(&format!("lag 0 {:.1} s after the probe: {sustained:.0} ops/s end to end", drain.as_secs_f64()));
        ((sustained * 0.8) as u32).max(1)
    };
    progress(&format!("{rate} ops/s for {} s, faults in turn every {} s: {faults:?}", a.secs, a.fault_every));
    *load.lat.lock().expect("latency") = hist();

    let (done, stop) = (Arc::new(AtomicU64::new(0)), tokio_util::sync::CancellationToken::new());
    let not_sent = Arc::new(AtomicU64::new(0));
    let in_flight = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
    let first_op = next.load(Ordering::Relaxed);
    let offer = tokio::spawn({
        let (load, next, done, stop, not_sent, in_flight) =
            (Arc::clone(&load), Arc::clone(&next), Arc::clone(&done), stop.clone(), Arc::clone(&not_sent), Arc::clone(&in_flight));
        async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            while !stop.is_cancelled() {
                let second = tick.tick().await;
                for k in 0..rate {
                    let Ok(permit) = Arc::clone(&in_flight).try_acquire_owned() else {
                        not_sent.fetch_add(1, Ordering::Relaxed);
                        continue;
                    };
                    let (load, done, i) = (Arc::clone(&load), Arc::clone(&done), next.fetch_add(1, Ordering::Relaxed) as usize);
                    tokio::spawn(async move {
                        if let Err(e) = load.op(i).await {
                            println!("  op {i} failed for good: {e:#}");
                        } else {
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                        drop(permit);
                    });
                    // Spread the second's ops over it, on its clock (sleeps that only add up
                    // drift and offer less than the rate).
                    if k % 16 == 15 {
                        tokio::time::sleep_until(second + Duration::from_secs_f64(f64::from(k + 1) / f64::from(rate))).await;
                    }
                }
            }
        }
    });

    let mut projection = ProjectionServiceClient::new(lazy(world.m.projection.addr)?);
    // Connected again after a failure (the broker's restart breaks the client).
    let mut kafka: Option<rskafka::client::Client> = None;
    let started = Instant::now();
    let minutes = a.secs.div_ceil(a.fault_every.max(1));
    let mut worst_p99 = 0.0f64;
    for minute in 0..minutes {
        let window = started + Duration::from_secs((minute + 1) * a.fault_every);
        let fault = faults[minute as usize % faults.len()];
        tokio::time::sleep(Duration::from_secs(a.fault_every / 4)).await;
        let t = Instant::now();
        progress(&format!("{fault:?}"));
        tokio::time::timeout(STRIKE_WITHIN, world.strike(fault)).await.map_err(|_| anyhow::anyhow!("{fault:?} took over {STRIKE_WITHIN:?}"))??;
        let took = t.elapsed();
        tokio::time::sleep_until(window.into()).await;
        let lat = std::mem::replace(&mut *load.lat.lock().expect("latency"), hist());
        worst_p99 = worst_p99.max(ms(&lat, 0.99));
        let within = Duration::from_secs(15);
        let outbox =
            tokio::time::timeout(within, socialgraph_storage::outbox::backlog(&world.m.db.conn)).await.ok().and_then(|b| b.ok()).map_or(-1, |b| b.0);
        let measured = tokio::time::timeout(within, async {
            if kafka.is_none() {
                kafka = Some(socialgraph_testkit::kafka::connect(&world.m.brokers).await?);
            }
            projection_lag(kafka.as_ref().expect("connected"), &world.m.topics.relation, &mut projection).await
        })
        .await;
        let lag = match measured {
            Ok(Ok(lag)) => lag,
            failed => {
                if let Ok(Err(e)) = failed {
                    println!("  projection lag unknown: {e:#}");
                }
                kafka = None;
                -1
            }
        };
        println!(
            "  [{:>4} s] {fault:<28?} ({:>5.1} s)  done {:>8}  not sent {:>6}  p50 {:>7.1} ms  p99 {:>8.1} ms  max {:>8.1} ms  outbox {outbox:>6}  projection lag {lag:>6}  errors {:?}",
            started.elapsed().as_secs(),
            took.as_secs_f64(),
            done.load(Ordering::Relaxed),
            not_sent.load(Ordering::Relaxed),
            ms(&lat, 0.5),
            ms(&lat, 0.99),
            ms(&lat, 1.0),
            load.tally.codes(),
        );
    }
    stop.cancel();
    offer.await?;
    let _ = in_flight.acquire_many(MAX_IN_FLIGHT as u32).await;
    let offered = started.elapsed();
    let last_write = Instant::now();
    world.m.settle(Duration::from_secs(600)).await?;
    let to_lag_0 = last_write.elapsed();
    let model = load.model.lock().expect("model").clone();
    let users: Vec<i64> = (1..=a.users).chain((0..OWNERS).map(|o| OWNERS_FROM + o)).collect();
    let wrong = mismatches(&world.m, &model, &users).await?;
    let (done, not_sent) = (done.load(Ordering::Relaxed), not_sent.load(Ordering::Relaxed));
    let sent = next.load(Ordering::Relaxed) - first_op;
    println!(
        "  {done} ops done in {:.0} s ({:.0}/s; {} offered at {:.0}/s for a target of {rate}/s, {not_sent} of them not sent), errors retried {:?}; lag 0 {:.1} s after the last write; {wrong} mismatches over {} users and {} entities",
        offered.as_secs_f64(),
        done as f64 / offered.as_secs_f64(),
        sent + not_sent,
        (sent + not_sent) as f64 / offered.as_secs_f64(),
        load.tally.codes(),
        to_lag_0.as_secs_f64(),
        users.len(),
        model.owner.len()
    );
    world.stop().await?;
    summarize(format!("soak {rate} ops/s for {} s, a fault every {} s: mismatches", a.secs, a.fault_every), wrong as f64, 0.0, "", "0");
    summarize("soak: worst per-minute p99 (retries included)", worst_p99, 0.0, "ms", "bounded");
    Ok(())
}

/// Records of the relation topic the projection has not applied yet: its positions first, then
/// the high watermarks (read the other way round, records appended in between showed as a
/// negative lag).
async fn projection_lag(kafka: &rskafka::client::Client, topic: &str, projection: &mut ProjectionServiceClient<Channel>) -> anyhow::Result<i64> {
    let status = projection.get_projection_status(GetProjectionStatusRequest {}).await?.into_inner();
    let applied: i64 = status.partitions.iter().filter(|p| p.topic == topic).map(|p| p.next_offset).sum();
    let hw: i64 = socialgraph_testkit::kafka::high_watermarks(kafka, topic).await?.values().sum();
    Ok(hw - applied)
}
