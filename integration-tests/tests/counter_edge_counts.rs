//! Follow counts reach counter-svc as events: projection-svc writes each changed user's
//! `edge_count` row to its outbox in the transaction of the change, and counter-svc keeps the
//! newest version per user. Here, against real Redis, the broker and the three services: the
//! consumer applies by version whatever the order and the copies, creates a count from the
//! first event that carries it, never asks projection-svc, and keeps serving while
//! projection-svc is stopped. Followings come from relation-svc's events, which carry the
//! follower's count: they stay fresh while projection-svc is stopped; the followers counts
//! catch up within seconds of its restart.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use prometheus::{IntCounter, IntCounterVec, Opts};
use prost::Message;
use rskafka::record::{Record, RecordAndOffset};
use socialgraph_cache::counters::field;
use socialgraph_counter::consume::{ConsumerMetrics, EdgeCountCounter, FollowingsCounter};
use socialgraph_counter::store::{Checked, EdgeCounts, Store};
use socialgraph_domain::timestamp_from_ms;
use socialgraph_events::consumer::BatchHandler;
use socialgraph_integration_tests::*;
use socialgraph_proto::events::v1::{EdgeCountEvent, RelationEvent, RelationEventKind};
use socialgraph_proto::relation::v1::{FollowRequest, UnfollowRequest};
use socialgraph_testkit::Backend;

const SETTLE: Duration = Duration::from_secs(240);

fn record(user_id: i64, followings: i64, followers: i64, version: i64, offset: i64) -> RecordAndOffset {
    let e = EdgeCountEvent { event_id: format!("e{offset}"), user_id, followings, followers, version, occurred_at: Some(timestamp_from_ms(1_000)) };
    let record = Record {
        key: Some(user_id.to_be_bytes().to_vec()),
        value: Some(e.encode_to_vec()),
        headers: BTreeMap::new(),
        timestamp: rskafka::chrono::Utc::now(),
    };
    RecordAndOffset { record, offset }
}

fn consumer(prefix: &str) -> anyhow::Result<EdgeCountCounter> {
    let pool = socialgraph_cache::pool(&socialgraph_testkit::redis_url(), 4, Duration::from_secs(2))?;
    let store = Store {
        pool,
        keys: socialgraph_cache::keys::Keys::new(prefix.to_owned()),
        scripts: Default::default(),
        entity_scripts: Default::default(),
        timeout: Duration::from_secs(5),
    };
    let metrics =
        ConsumerMetrics { applied: IntCounter::new("applied", "test")?, skipped: IntCounterVec::new(Opts::new("skipped", "test"), &["reason"])? };
    Ok(EdgeCountCounter { store, consumer: "counter".into(), metrics })
}

async fn follow_counts(c: &EdgeCountCounter, users: &[i64]) -> anyhow::Result<Vec<Option<(u32, u32)>>> {
    Ok(c.store.read(users).await?.into_iter().map(|s| s.map(|s| (s.0[field::FOLLOWINGS], s.0[field::FOLLOWERS]))).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edge_count_events_keep_the_newest_version_whatever_the_order_and_the_copies() -> anyhow::Result<()> {
    let c = consumer(&socialgraph_testkit::unique("sgec"))?;
    let redis_down = |e| anyhow::anyhow!("{e} (is Redis up? `make deps` starts it)");
    // User 1 moves 1 → 2 → 3 within one batch, out of order and with a copy; user 2 appears
    // for the first time; user 3 gets an undecodable record beside a good one.
    let mut batch = vec![record(1, 5, 0, 2, 0), record(1, 7, 1, 3, 1), record(1, 3, 0, 1, 2), record(1, 7, 1, 3, 3), record(2, 0, 9, 4, 4)];
    batch.push(RecordAndOffset { record: Record { value: Some(vec![0xff, 0xff]), ..batch[0].record.clone() }, offset: 5 });
    batch.push(record(3, 1, 1, 1, 6));
    c.apply("sg.edge_count.v1", 0, &batch, 7).await.map_err(redis_down)?;
    assert_eq!(follow_counts(&c, &[1, 2, 3, 4]).await?, vec![Some((7, 1)), Some((0, 9)), Some((1, 1)), None], "the newest version of each user");
    assert_eq!(c.metrics.skipped.with_label_values(&["undecodable"]).get(), 1, "the bad record is counted, not applied");

    // The whole batch again at later offsets, then older versions alone: nothing moves.
    let later: Vec<RecordAndOffset> = batch.iter().map(|r| RecordAndOffset { record: r.record.clone(), offset: r.offset + 7 }).collect();
    c.apply("sg.edge_count.v1", 0, &later, 14).await.map_err(redis_down)?;
    c.apply("sg.edge_count.v1", 1, &[record(1, 0, 0, 2, 0), record(2, 1, 1, 3, 1)], 2).await.map_err(redis_down)?;
    assert_eq!(follow_counts(&c, &[1, 2, 3]).await?, vec![Some((7, 1)), Some((0, 9)), Some((1, 1))], "copies and older versions change nothing");

    // A newer version wins, from any partition.
    c.apply("sg.edge_count.v1", 2, &[record(2, 1, 8, 5, 0)], 1).await.map_err(redis_down)?;
    assert_eq!(follow_counts(&c, &[2]).await?, vec![Some((1, 8))]);
    Ok(())
}

fn relation_record(follower_id: i64, followings: i64, version: i64, offset: i64) -> RecordAndOffset {
    let e = RelationEvent {
        event_id: format!("r{offset}"),
        kind: RelationEventKind::Followed as i32,
        follower_id,
        followee_id: 1_000 + offset,
        version: 1,
        follower_followings: followings,
        follower_followings_version: version,
        ..Default::default()
    };
    let record = Record {
        key: Some(follower_id.to_be_bytes().to_vec()),
        value: Some(e.encode_to_vec()),
        headers: BTreeMap::new(),
        timestamp: rskafka::chrono::Utc::now(),
    };
    RecordAndOffset { record, offset }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followings_from_relation_events_win_by_their_own_version() -> anyhow::Result<()> {
    let counts = consumer(&socialgraph_testkit::unique("sgfc"))?;
    let followings = FollowingsCounter { store: counts.store.clone(), consumer: "counter".into(), metrics: counts.metrics.clone() };
    let redis_down = |e| anyhow::anyhow!("{e} (is Redis up? `make deps` starts it)");
    // User 1 exists (created by a projection event); user 2 was never seen.
    counts.apply("sg.edge_count.v1", 0, &[record(1, 3, 4, 10, 0)], 1).await.map_err(redis_down)?;
    // Out of order, with copies and an event of a producer that did not count (version 0).
    let batch = [
        relation_record(1, 5, 3, 0),
        relation_record(1, 6, 4, 1),
        relation_record(1, 4, 2, 2),
        relation_record(1, 6, 4, 3),
        relation_record(2, 9, 1, 4),
    ];
    followings.apply("sg.relation.v1", 0, &batch, 5).await.map_err(redis_down)?;
    followings.apply("sg.relation.v1", 1, &[relation_record(1, 0, 0, 0)], 1).await.map_err(redis_down)?;
    assert_eq!(
        follow_counts(&counts, &[1, 2]).await?,
        vec![Some((6, 4)), None],
        "the newest followings; a user never seen is left to its first read"
    );
    assert_eq!(followings.metrics.skipped.with_label_values(&["uncounted"]).get(), 1);
    // Replayed at later offsets, and older versions alone: nothing moves.
    let later: Vec<RecordAndOffset> = batch.iter().map(|r| RecordAndOffset { record: r.record.clone(), offset: r.offset + 5 }).collect();
    followings.apply("sg.relation.v1", 0, &later, 10).await.map_err(redis_down)?;
    followings.apply("sg.relation.v1", 2, &[relation_record(1, 1, 3, 0)], 1).await.map_err(redis_down)?;
    assert_eq!(follow_counts(&counts, &[1]).await?, vec![Some((6, 4))]);
    // A newer projection event moves the followers, not followings that relation events brought.
    counts.apply("sg.edge_count.v1", 0, &[record(1, 2, 8, 11, 1)], 2).await.map_err(redis_down)?;
    assert_eq!(follow_counts(&counts, &[1]).await?, vec![Some((6, 8))], "followings keep their own version space");
    followings.apply("sg.relation.v1", 0, &[relation_record(1, 7, 5, 10)], 11).await.map_err(redis_down)?;
    assert_eq!(follow_counts(&counts, &[1]).await?, vec![Some((7, 8))]);
    // The sampled check compares followers only: relation's followings are not "drift".
    assert_eq!(counts.store.check(EdgeCounts { user_id: 1, followings: 2, followers: 8, version: 11 }).await?, Checked::Agreed { written: false });
    assert_eq!(follow_counts(&counts, &[1]).await?, vec![Some((7, 8))]);
    Ok(())
}

async fn follow_ring(m: &Mesh, users: i64, round: i64) -> anyhow::Result<()> {
    let mut rc = m.relation.client().await?;
    for u in 1..=users {
        let followee_id = (u + round - 1) % users + 1;
        if followee_id != u {
            rc.follow(FollowRequest { follower_id: u, followee_id }).await?;
        }
    }
    Ok(())
}

/// Every third user unfollows the account it followed in `round`.
async fn unfollow_some(m: &Mesh, users: i64, round: i64) -> anyhow::Result<()> {
    let mut rc = m.relation.client().await?;
    for u in (1..=users).step_by(3) {
        let followee_id = (u + round - 1) % users + 1;
        if followee_id != u {
            rc.unfollow(UnfollowRequest { follower_id: u, followee_id }).await?;
        }
    }
    Ok(())
}

async fn counts_from_events_alone(backend: Backend) -> anyhow::Result<()> {
    const USERS: i64 = 40;
    let mut m = Mesh::start_on(backend, &socialgraph_testkit::redis_url(), &socialgraph_testkit::kafka::brokers()).await?;
    let users: Vec<i64> = (1..=USERS).collect();
    for round in 1..=3 {
        follow_ring(&m, USERS, round).await?;
    }
    m.settle(SETTLE).await?;
    // Before any read of the counters (a read of a missing one may ask projection-svc, which
    // is the API's job): the consumer itself asked nothing.
    assert_eq!(rpcs_served(&m.projection, Some("BatchGetEdgeCounts")).await?, 0.0, "counter-svc's consumer calls no projection-svc RPC");
    m.assert_views_exact(&users, SETTLE).await?;

    // projection-svc stopped while follows go on: counter-svc keeps serving every read.
    let stopped_for = Duration::from_secs(std::env::var("SG_TEST_PROJECTION_STOP_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(60));
    m.projection.shutdown.cancel();
    (&mut m.projection.task).await??;
    let stopped = Instant::now();
    let mut round = 4;
    let mut fresh_within = Duration::ZERO;
    while stopped.elapsed() < stopped_for {
        follow_ring(&m, USERS, round).await?;
        unfollow_some(&m, USERS, round).await?;
        round += 1;
        let served = model::served_users(&mut m.counter.counter().await?, &users).await?;
        assert_eq!(served.len(), users.len(), "counter-svc answers for every user while projection-svc is away");
        // Followings reach counter-svc from relation events alone: fresh within seconds.
        let written = Instant::now();
        let exact = model::Model::default().users(&m.db, &users).await?;
        let cc = m.counter.counter().await?;
        socialgraph_testkit::eventually(Duration::from_secs(10), "followings to be fresh while projection-svc is stopped", || {
            let (exact, mut cc, users) = (&exact, cc.clone(), &users);
            async move {
                let served = model::served_users(&mut cc, users).await?;
                Ok(served.iter().all(|(u, s)| exact.get(u).is_some_and(|e| e.0 == s.0)).then_some(()))
            }
        })
        .await?;
        fresh_within = fresh_within.max(written.elapsed());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!("{backend:?}: with projection-svc stopped, followings were fresh within {fresh_within:?} of each round");

    m.restart(Service::Projection).await?;
    let restarted = Instant::now();
    let exact = model::Model::default();
    let cc = m.counter.counter().await?;
    socialgraph_testkit::eventually(SETTLE, "every follow count to be exact after the restart", || {
        let (exact, mut cc, db, users) = (&exact, cc.clone(), &m.db, &users);
        async move { Ok((model::served_users(&mut cc, users).await? == exact.users(db, users).await?).then_some(())) }
    })
    .await?;
    let caught_up = restarted.elapsed();
    println!(
        "{backend:?}: projection-svc stopped {stopped_for:?} over {} follow rounds; every count exact {caught_up:?} after its restart",
        round - 4
    );
    assert!(caught_up < Duration::from_secs(30), "the counts caught up within seconds of the restart ({caught_up:?})");
    m.assert_views_exact(&users, SETTLE).await?;
    m.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn counts_arrive_as_events_and_survive_a_stopped_projection_on_postgres() -> anyhow::Result<()> {
    counts_from_events_alone(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn counts_arrive_as_events_and_survive_a_stopped_projection_on_mariadb() -> anyhow::Result<()> {
    counts_from_events_alone(Backend::MariaDb).await
}
