//! Counters when the edges of the pipeline fail: owners first read after their likes (also
//! after a FLUSHALL), the broker stopped during likes and follows, a hot entity among hundreds
//! of recently liked ones, drift written by hand during a workload, and database connections
//! terminated mid-request.

use std::time::Duration;

use rand::{Rng, SeedableRng, rngs::StdRng};
use socialgraph_integration_tests::model::{Model, Toggle, assert_model, served_users, toggle};
use socialgraph_integration_tests::*;
use socialgraph_proto::counter::v1::counter_service_client::CounterServiceClient;
use socialgraph_proto::relation::v1::{FollowRequest, UnfollowRequest};
use socialgraph_testkit::{Backend, kafka, process};
use tonic::Code;
use tonic::transport::Channel;

const SETTLE: Duration = Duration::from_secs(240);
const OPS: [Toggle; 5] = [Toggle::Like, Toggle::Like, Toggle::Unlike, Toggle::Fav, Toggle::Unfav];

/// `ops` toggles by actors `1..=actors` on posts `first..first + entities`, owned by
/// `owner_base + entity % 10`, recorded in `model`.
async fn likes(
    c: &mut CounterServiceClient<Channel>,
    model: &mut Model,
    seed: u64,
    ops: usize,
    actors: i64,
    first: i64,
    owner_base: i64,
) -> anyhow::Result<()> {
    let mut rng = StdRng::seed_from_u64(seed);
    for _ in 0..ops {
        let (a, e) = (rng.random_range(1..=actors), rng.random_range(first..first + 40));
        let op = OPS[rng.random_range(0..OPS.len())];
        let owner = owner_base + e % 10;
        let (_, active) = toggle(c, op, a, e, owner).await?;
        model.record(op, a, e, owner, active);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn owners_first_read_after_their_likes_are_exact_also_after_a_flushall() -> anyhow::Result<()> {
    let redis = process::redis(0).await?;
    let url = format!("redis://127.0.0.1:{}", redis.port);
    let m = Mesh::start_on(Backend::Postgres, &url, &kafka::brokers()).await?;
    let mut c = m.counter.counter().await?;
    let owners: Vec<i64> = (200..210).collect();
    let mut model = Model::default();
    // Nobody reads an owner before its entities are liked.
    likes(&mut c, &mut model, 1, 600, 50, 1, 200).await?;
    m.settle(SETTLE).await?;
    assert_model(&model, &m.db, &mut c, &owners).await?;

    // Redis loses everything, the like facts included: from now on the facts are what is
    // toggled after the flush, and every owner (read before, or never) must follow them.
    let mut conn = redis_conn(&url).await?;
    let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await?;
    let mut model = Model::default();
    likes(&mut c, &mut model, 2, 400, 50, 1, 200).await?;
    m.settle(SETTLE).await?;
    assert_model(&model, &m.db, &mut c, &owners).await?;
    m.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broker_outage_during_likes_and_follows_loses_nothing_and_fails_nothing() -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(socialgraph_testkit::unique("sg-broker-"));
    let port = process::free_port()?;
    let mut broker = process::broker(port, &dir).await?;
    let brokers = vec![format!("127.0.0.1:{port}")];
    let m = Mesh::start_on(Backend::Postgres, &socialgraph_testkit::redis_url(), &brokers).await?;
    let (mut c, mut rc) = (m.counter.counter().await?, m.relation.client().await?);
    let users: Vec<i64> = (1..=40).chain(300..310).collect();
    let mut model = Model::default();
    let mut rng = StdRng::seed_from_u64(3);
    let (mut errors, mut down_for) = (Vec::new(), Duration::ZERO);
    let started = std::time::Instant::now();
    let mut stopped_at = None;
    for i in 0..1500 {
        if i == 300 {
            broker.kill().await?;
            stopped_at = Some(std::time::Instant::now());
        }
        if let Some(t) = stopped_at.filter(|t| t.elapsed() > Duration::from_secs(12)) {
            down_for = t.elapsed();
            broker = process::broker(port, &dir).await?;
            stopped_at = None;
        }
        let (a, mut b) = (rng.random_range(1..=40), rng.random_range(1..=40));
        if a == b {
            b = a % 40 + 1;
        }
        let r = if rng.random_bool(0.6) {
            rc.follow(FollowRequest { follower_id: a, followee_id: b }).await.map(|_| ())
        } else {
            rc.unfollow(UnfollowRequest { follower_id: a, followee_id: b }).await.map(|_| ())
        };
        if let Err(e) = r {
            errors.push(e.code());
        }
        let e = rng.random_range(1..=30);
        let op = OPS[rng.random_range(0..OPS.len())];
        match toggle(&mut c, op, a, e, 300 + e % 10).await {
            Ok((_, active)) => model.record(op, a, e, 300 + e % 10, active),
            Err(s) => errors.push(s.code()),
        }
        // Spread the ops so that the outage falls in the middle of them.
        if stopped_at.is_some() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    assert!(down_for >= Duration::from_secs(10), "the broker was down for {down_for:?} during the workload");
    println!("1500 follows + 1500 toggles in {:?}; broker down {down_for:?}; errors: {errors:?}", started.elapsed());
    assert!(errors.is_empty(), "writes do not wait on the broker: {errors:?}");
    m.settle(SETTLE).await?;
    assert_model(&model, &m.db, &mut c, &users).await?;
    m.stop().await?;
    broker.kill().await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// The owner's likes received, which move only when the relay publishes the likes' events.
async fn likes_received(c: &mut CounterServiceClient<Channel>, owner: i64) -> anyhow::Result<u64> {
    Ok(served_users(c, &[owner]).await?.get(&owner).map_or(0, |five| five.3))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hot_entity_is_relayed_while_hundreds_of_recently_liked_entities_stay_indexed() -> anyhow::Result<()> {
    let m = Mesh::start(&socialgraph_testkit::redis_url()).await?;
    let mut c = m.counter.counter().await?;
    // The relay's index as a steady load leaves it: 600 entities liked again and again (their
    // scores rewritten every 100 ms to half a second ago, within the quiet period, so they stay
    // indexed) whose outboxes are drained, all older than the hot post.
    let index = socialgraph_cache::keys::Keys::new(m.prefix.clone()).pending_entities();
    let others: Vec<String> = (1_000_000..1_000_600).map(|id| format!("post:{id}")).collect();
    let stop = tokio_util::sync::CancellationToken::new();
    let holder = {
        let (url, index, others, stop) = (m.redis_url.clone(), index.clone(), others.clone(), stop.clone());
        tokio::spawn(async move {
            let mut conn = redis_conn(&url).await?;
            while !stop.is_cancelled() {
                let at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis() as i64 - 500;
                let mut pipe = redis::pipe();
                for o in &others {
                    pipe.zadd(&index, o, at).ignore();
                }
                let _: () = pipe.query_async(&mut conn).await?;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            anyhow::Ok(())
        })
    };
    // A hot post liked by a new actor again and again is always the newest member; its
    // owner's likes received must move while it is still being liked.
    let (hot, owner) = (42, 4242);
    let (mut liked, mut seen) = (0u64, 0u64);
    let started = std::time::Instant::now();
    while seen < 20 && started.elapsed() < Duration::from_secs(20) {
        for _ in 0..10 {
            liked += 1;
            toggle(&mut c, Toggle::Like, liked as i64, hot, owner).await?;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        seen = likes_received(&mut c, owner).await?;
    }
    stop.cancel();
    holder.await??;
    assert!(seen >= 20, "the hot post's owner saw {seen} of {liked} likes in 20 s: its events were not relayed");
    let mut conn = redis_conn(&m.redis_url).await?;
    let _: () = redis::AsyncCommands::zrem(&mut conn, &index, &others).await?;
    m.likes_relayed(SETTLE).await?;
    m.settle(SETTLE).await?;
    assert_eq!(likes_received(&mut c, owner).await?, liked, "every like received, once");
    m.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn drift_written_by_hand_during_a_workload_is_repaired_by_the_sampled_check_and_counted() -> anyhow::Result<()> {
    let mut m = Mesh::start(&socialgraph_testkit::redis_url()).await?;
    m.counter.shutdown.cancel();
    (&mut m.counter.task).await??;
    let mut config = m.counter_config();
    config.counters.check_interval_secs = 2;
    m.counter = spawn_counter(config).await?;
    // Five quiet users: a ring of follows and likes on their posts, then read once.
    let quiet: Vec<i64> = (501..=505).collect();
    let (mut c, mut rc) = (m.counter.counter().await?, m.relation.client().await?);
    let mut model = Model::default();
    for u in &quiet {
        rc.follow(FollowRequest { follower_id: *u, followee_id: if *u == 505 { 501 } else { u + 1 } }).await?;
        for actor in 1..=3 {
            let (_, active) = toggle(&mut c, Toggle::Like, actor, *u * 10, *u).await?;
            model.record(Toggle::Like, actor, *u * 10, *u, active);
        }
    }
    m.settle(SETTLE).await?;
    assert_model(&model, &m.db, &mut c, &quiet).await?;

    // A workload on other users keeps every partition moving; meanwhile the quiet users'
    // followers and likes received are overwritten by hand (version untouched).
    let workload = tokio::spawn(random_workload(m.relation.addr, 4000, 100, 5));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let keys = socialgraph_cache::keys::Keys::new(m.prefix.clone());
    let mut conn = redis_conn(&m.redis_url).await?;
    for u in &quiet {
        let raw: Vec<u8> = redis::AsyncCommands::hget(&mut conn, keys.user_counters(*u), *u).await?;
        let mut stored = socialgraph_cache::counters::Stored::decode(&raw).expect("a well-formed value");
        stored.counters.0[1] = 77;
        stored.counters.0[3] = 55;
        let _: () = redis::AsyncCommands::hset(&mut conn, keys.user_counters(*u), *u, stored.encode()).await?;
    }
    let want = model.users(&m.db, &quiet).await?;
    socialgraph_testkit::eventually(Duration::from_secs(30), "the sampled check to repair the quiet users", || {
        let (mut c, quiet, want) = (c.clone(), &quiet, &want);
        async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            Ok((served_users(&mut c, quiet).await? == *want).then_some(()))
        }
    })
    .await?;
    let repairs = metric(&m.counter.metrics().await?, "sg_counter_repairs_total");
    assert_eq!(repairs, 5.0, "each drifted user repaired and counted once");
    workload.await??;
    m.settle(SETTLE).await?;
    let users: Vec<i64> = (1..=100).chain(501..=505).collect();
    assert_model(&model, &m.db, &mut c, &users).await?;
    m.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn database_connections_terminated_mid_request_answer_unavailable_never_internal() -> anyhow::Result<()> {
    let (db, svc, _topic) = relation_on(Backend::Postgres, |_| {}).await?;
    let stop = tokio_util::sync::CancellationToken::new();
    let killer = {
        let (stop, url) = (stop.clone(), db.url.clone());
        tokio::spawn(async move {
            let mut killed = 0i64;
            while !stop.is_cancelled() {
                killed += terminate_connections(&url).await?;
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
            anyhow::Ok(killed)
        })
    };
    let mut c = svc.client().await?;
    let (mut ok, mut codes) = (0, Vec::new());
    for i in 0..600i64 {
        let r = if i % 3 == 2 {
            c.unfollow(UnfollowRequest { follower_id: 1 + i % 7, followee_id: 100 + i / 3 }).await.map(|_| ())
        } else {
            c.follow(FollowRequest { follower_id: 1 + i % 7, followee_id: 100 + i }).await.map(|_| ())
        };
        match r {
            Ok(()) => ok += 1,
            Err(e) => codes.push(e.code()),
        }
    }
    stop.cancel();
    let killed = killer.await??;
    println!(
        "{ok} calls answered, {} failed ({:?}); {killed} connections terminated",
        codes.len(),
        codes.iter().map(|c| format!("{c:?}")).collect::<std::collections::BTreeSet<_>>()
    );
    assert!(killed > 0, "connections were terminated during the calls");
    assert!(codes.iter().all(|c| *c == Code::Unavailable), "a lost connection is UNAVAILABLE: {codes:?}");
    svc.stop().await?;
    db.drop_db().await
}
