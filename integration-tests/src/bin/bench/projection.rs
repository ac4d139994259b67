//! Part 2, projection: Follow → ListFollowers propagation latency at offered rates beside the
//! broker's own transit time; consumer apply throughput beside a raw fetch of the same topic.

mod raw;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use socialgraph_integration_tests::{metric, outbox_drained, projection_caught_up, projection_config, relation_on, spawn_projection};
use socialgraph_proto::projection::v1::ListFollowersRequest;
use socialgraph_proto::projection::v1::projection_service_client::ProjectionServiceClient;
use socialgraph_proto::relation::v1::FollowRequest;
use socialgraph_proto::relation::v1::relation_service_client::RelationServiceClient;
use socialgraph_testkit::Backend;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::transport::Channel;

use crate::ProjectionArgs;
use crate::backends::{PARTITIONS, kafka};
use crate::load::{CHANNELS, channels, distinct_edges};
use crate::relation::{import, relation_clients};
use crate::report::{Hist, header, hist, ms, print_table, progress, row, summarize};

/// Runs the part: the propagation table, then the consumer apply table.
pub(crate) async fn run(a: &ProjectionArgs) -> anyhow::Result<()> {
    header("projection: Follow → ListFollowers propagation, consumer apply throughput");
    propagation(a).await?;
    apply_throughput(a.events).await
}

/// Propagation latency at each of the offered rates, beside raw produce → fetch at that rate.
async fn propagation(a: &ProjectionArgs) -> anyhow::Result<()> {
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
    let mut notes: Vec<String> = vec![
        "svc = Follow acknowledged → follower listed by ProjectionService.ListFollowers of its (new) followee, page_size 1, \
         polled every 2 ms, then every tenth of the time waited (at most 20 ms)"
            .into(),
        "raw = a record offered at the same rate → returned by a per-partition fetch loop (max_wait 5 ms, no sleep); \
         rskafka producer with one request in flight per partition, each taking every record waiting (like the relay)"
            .into(),
    ];
    for (k, &rate) in a.rates.iter().enumerate() {
        progress(&format!("{rate} follows/s for {} s, every {}th measured", a.secs, a.sample_every));
        let base = 2_000_000_000 + k as i64 * 100_000_000;
        let s = propagate(&rc, &pc, rate, a.secs, a.sample_every, base).await?;
        progress(&format!("raw produce → fetch at {rate} records/s for {} s", a.secs));
        let raw = raw::raw_transit(&client, rate, a.secs).await?;
        rows.push(row(format!("p50 @ {rate}/s"), ms(&s.prop, 0.5), ms(&raw, 0.5), "ms"));
        rows.push(row(format!("p99 @ {rate}/s"), ms(&s.prop, 0.99), ms(&raw, 0.99), "ms"));
        summarize(format!("follow -> visible in ListFollowers p99 @ {rate}/s"), ms(&s.prop, 0.99), ms(&raw, 0.99), "ms", "<= 50 ms, <= 2x raw");
        notes.push(rate_note(rate, &s, &raw));
    }
    print_table("Propagation latency, open loop", "svc", "raw broker", &rows, &notes);
    proj.stop().await?;
    relation.stop().await?;
    db.drop_db().await?;
    Ok(())
}

/// The note under the propagation table on what happened at one offered rate.
fn rate_note(rate: u32, s: &Propagation, raw: &Hist) -> String {
    format!(
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
    )
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

/// What the follow tasks of one [`propagate`] run record; shared by all of them behind a lock.
#[derive(Default)]
struct Shared {
    ack: Option<Hist>,
    prop: Option<Hist>,
    errors: u64,
    first_error: Option<String>,
    timeouts: u64,
}

/// The lock of `shared`, even if a task panicked while holding it.
fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(|e| e.into_inner())
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
    let shared = Arc::new(Mutex::new(Shared { ack: Some(hist()), prop: Some(hist()), ..Default::default() }));
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
        let r = rc[i as usize % rc.len()].clone();
        let p = pc[i as usize % pc.len()].clone();
        let shared = Arc::clone(&shared);
        tasks.spawn(async move {
            let _permit = permit;
            follow_and_poll(r, p, follower, followee, poller, &shared).await;
        });
        i += 1;
    }
    let offered_secs = start.elapsed().as_secs_f64();
    // Stragglers: each task ends by itself within 30 s of its ack (bounded).
    let drain = tokio::time::timeout(Duration::from_secs(120), async { while tasks.join_next().await.is_some() {} }).await;
    if drain.is_err() {
        tasks.abort_all();
    }
    Ok(collect(&shared, offered_secs, dropped, skipped))
}

/// The result of a [`propagate`] run from what its tasks recorded in `shared`.
fn collect(shared: &Mutex<Shared>, offered_secs: f64, dropped: u64, skipped: u64) -> Propagation {
    let mut s = lock(shared);
    let ack = s.ack.take().unwrap_or_else(hist);
    let prop = s.prop.take().unwrap_or_else(hist);
    Propagation {
        first_error: s.first_error.take(),
        acked: ack.len(),
        achieved: ack.len() as f64 / offered_secs,
        errors: s.errors,
        timeouts: s.timeouts,
        dropped,
        skipped,
        ack,
        prop,
    }
}

/// One follow of [`propagate`]: records its ack latency and, if it holds a `poller` permit,
/// polls ListFollowers of `followee` until `follower` is listed or 30 s passed.
async fn follow_and_poll(
    mut r: RelationServiceClient<Channel>,
    mut p: ProjectionServiceClient<Channel>,
    follower: i64,
    followee: i64,
    poller: Option<OwnedSemaphorePermit>,
    shared: &Mutex<Shared>,
) {
    let t = Instant::now();
    if let Err(e) = r.follow(FollowRequest { follower_id: follower, followee_id: followee }).await {
        let mut s = lock(shared);
        s.first_error.get_or_insert_with(|| format!("{:?}: {}", e.code(), e.message()));
        s.errors += 1;
        return;
    }
    let acked = Instant::now();
    if let Some(h) = lock(shared).ack.as_mut() {
        h.saturating_record((acked - t).as_micros() as u64);
    }
    let Some(_poller) = poller else {
        return;
    };
    let deadline = acked + Duration::from_secs(30);
    while Instant::now() < deadline {
        let req = ListFollowersRequest { user_id: followee, page_size: 1, page_token: String::new(), ..Default::default() };
        let listed = match p.list_followers(req).await {
            Ok(resp) => resp.into_inner().followers.iter().any(|f| f.user_id == follower),
            Err(_) => false,
        };
        if listed {
            let seen = acked.elapsed().as_micros() as u64;
            if let Some(h) = lock(shared).prop.as_mut() {
                h.saturating_record(seen);
            }
            return;
        }
        // Every 2 ms at first, then a tenth of the time waited so far (at most 20 ms):
        // about 10% resolution at any latency, and little load when latency is high.
        let wait = (acked.elapsed() / 10).clamp(Duration::from_millis(2), Duration::from_millis(20));
        tokio::time::sleep(wait).await;
    }
    lock(shared).timeouts += 1;
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
    let (raw_records, raw_secs) = raw::raw_fetch(&client, &topic, &hw).await?;

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
