//! relation-svc when its dependencies fail: Redis down (fail open / fail closed), and the
//! broker killed in the middle of a workload. Each test runs its own private instance.

use std::collections::HashSet;
use std::time::Duration;

use prost::Message;
use socialgraph_integration_tests::{metric, outbox_drained, relation_config, spawn_relation};
use socialgraph_proto::events::v1::RelationEvent;
use socialgraph_proto::relation::v1::FollowRequest;
use socialgraph_relation::config::OnRedisError;
use socialgraph_testkit::{Backend, TestDb, kafka, process};
use tonic::Code;

async fn follows_with_redis_down(mode: OnRedisError) -> anyhow::Result<()> {
    let db = TestDb::create(Backend::Postgres).await?;
    let mut redis = process::redis(0).await?;
    let mut config = relation_config(&db.url, &socialgraph_testkit::unique("sg.relation.test."));
    config.redis.url = format!("redis://127.0.0.1:{}", redis.port);
    config.limits.on_redis_error = mode;
    let svc = spawn_relation(config).await?;
    let mut c = svc.client().await?;
    assert!(c.follow(FollowRequest { follower_id: 1, followee_id: 2 }).await?.into_inner().changed);
    redis.kill().await?;
    let result = c.follow(FollowRequest { follower_id: 1, followee_id: 3 }).await;
    let bypassed = metric(&svc.metrics().await?, "sg_rate_limit_bypassed_total");
    match mode {
        OnRedisError::Open => {
            assert!(result?.into_inner().changed, "fail open: the follow goes through");
            assert_eq!(bypassed, 1.0, "and is counted");
        }
        OnRedisError::Closed => {
            let e = result.unwrap_err();
            assert_eq!(e.code(), Code::Unavailable, "fail closed: UNAVAILABLE, not a silent failure");
            assert_eq!(bypassed, 0.0);
        }
    }
    // Redis back on the same port: the pool's connection reconnects by itself, and follows are
    // rate-limited again (a follow goes through without being counted as bypassed).
    let port = redis.port;
    let _redis = process::redis(port).await?;
    let mut next = 100;
    socialgraph_testkit::eventually(std::time::Duration::from_secs(15), "the rate limiter to answer again", || {
        next += 1;
        let (mut c, svc, followee) = (c.clone(), &svc, next);
        async move {
            let before = metric(&svc.metrics().await?, "sg_rate_limit_bypassed_total");
            let ok = c.follow(FollowRequest { follower_id: 1, followee_id: followee }).await.is_ok();
            let after = metric(&svc.metrics().await?, "sg_rate_limit_bypassed_total");
            Ok((ok && after == before).then_some(()))
        }
    })
    .await?;
    svc.stop().await?;
    db.drop_db().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn follows_go_through_and_are_counted_when_redis_is_down_and_failing_open() -> anyhow::Result<()> {
    follows_with_redis_down(OnRedisError::Open).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn follows_are_refused_with_unavailable_when_redis_is_down_and_failing_closed() -> anyhow::Result<()> {
    follows_with_redis_down(OnRedisError::Closed).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_the_broker_during_a_workload_loses_no_event() -> anyhow::Result<()> {
    let db = TestDb::create(Backend::Postgres).await?;
    let dir = std::env::temp_dir().join(socialgraph_testkit::unique("sg-broker-"));
    let port = process::free_port()?;
    let mut broker = process::broker(port, &dir).await?;
    let topic = socialgraph_testkit::unique("sg.relation.test.");
    let mut config = relation_config(&db.url, &topic);
    config.kafka.brokers = vec![format!("127.0.0.1:{port}")];
    config.kafka.request_deadline_ms = 1000;
    let svc = spawn_relation(config).await?;
    let mut c = svc.client().await?;

    let mut expected = HashSet::new();
    for i in 0..600_i64 {
        let (a, b) = (1 + i % 20, 100 + i);
        c.follow(FollowRequest { follower_id: a, followee_id: b }).await?;
        expected.insert((a, b));
        if i == 200 {
            broker.kill().await?;
        }
        if i == 400 {
            // Writes keep working while the broker is down: they wait in the outbox.
            let (backlog, _) = socialgraph_storage::outbox::backlog(&db.conn).await?;
            assert!(backlog > 0, "events wait in the outbox while the broker is down");
            broker = process::broker(port, &dir).await?;
        }
    }
    outbox_drained(&db, Duration::from_secs(90)).await?;
    let client = kafka::connect(&[format!("127.0.0.1:{port}")]).await?;
    let got: HashSet<(i64, i64)> = kafka::read_all(&client, &topic)
        .await?
        .iter()
        .map(|(_, r)| RelationEvent::decode(r.record.value.as_deref().unwrap_or_default()).map(|e| (e.follower_id, e.followee_id)))
        .collect::<Result<_, _>>()?;
    assert_eq!(got, expected, "every event reached the broker");
    svc.stop().await?;
    broker.kill().await?;
    let _ = std::fs::remove_dir_all(&dir);
    db.drop_db().await
}

/// relation-svc on a fresh database of `backend` with `count` follows (from `followers`
/// accounts) written, published and drained, then stopped (releasing the relay lead): the
/// database, the topic, a broker client and every published record.
async fn follows_published(
    backend: Backend,
    count: i64,
    followers: i64,
) -> anyhow::Result<(TestDb, String, rskafka::client::Client, Vec<(i32, rskafka::record::RecordAndOffset)>)> {
    let (db, svc, topic) = socialgraph_integration_tests::relation_on(backend, |_| {}).await?;
    let mut c = svc.client().await?;
    for i in 0..count {
        c.follow(FollowRequest { follower_id: 1 + i % followers, followee_id: 100 + i }).await?;
    }
    outbox_drained(&db, Duration::from_secs(60)).await?;
    svc.stop().await?;
    let client = kafka::connect(&kafka::brokers()).await?;
    let published = kafka::read_all(&client, &topic).await?;
    Ok((db, topic, client, published))
}

/// The `outbox-id` header of a published record.
fn outbox_id(r: &rskafka::record::RecordAndOffset) -> i64 {
    String::from_utf8_lossy(&r.record.headers["outbox-id"]).parse().expect("outbox-id header")
}

/// Writes outbox rows `(id, partition_key, payload, headers)` of `topic` under their own ids, as
/// a writer (or a dead leader's unfinished batch) would have left them.
async fn put_outbox_rows(db: &TestDb, topic: &str, rows: &[(i64, i64, Vec<u8>, String)]) -> anyhow::Result<()> {
    use sea_orm::sea_query::{Alias, Query};
    let mut insert = Query::insert()
        .into_table(Alias::new("outbox"))
        .columns(["id", "topic", "partition_key", "payload", "headers", "created_at_ms"].map(Alias::new))
        .to_owned();
    for (id, key, payload, headers) in rows {
        insert.values_panic([(*id).into(), topic.into(), (*key).into(), payload.clone().into(), headers.clone().into(), 0i64.into()]);
    }
    sea_orm::ConnectionTrait::execute(&db.conn, &insert).await?;
    Ok(())
}

/// A leader that died after the broker acknowledged its last batch and before deleting it
/// leaves those rows in the outbox; the next leader must find them published and delete them
/// instead of publishing them again.
async fn a_new_leader_skips_rows_its_predecessor_published(backend: Backend) -> anyhow::Result<()> {
    let (db, topic, client, published) = follows_published(backend, 50, 9).await?;
    // The last 20 published records back in the outbox under their own ids.
    let mut rows: Vec<(i64, i64, Vec<u8>, String)> = published
        .iter()
        .map(|(_, r)| {
            let id = outbox_id(r);
            let key = i64::from_be_bytes(r.record.key.as_deref().unwrap_or_default().try_into().expect("8-byte key"));
            let headers = r
                .record
                .headers
                .iter()
                .filter(|(k, _)| *k != "outbox-id")
                .map(|(k, v)| (k.clone(), String::from_utf8_lossy(v).into_owned()))
                .collect();
            (id, key, r.record.value.clone().unwrap_or_default(), socialgraph_events::headers::encode(&headers))
        })
        .collect();
    rows.sort_by_key(|r| r.0);
    put_outbox_rows(&db, &topic, &rows[rows.len() - 20..]).await?;

    let svc = spawn_relation(relation_config(&db.url, &topic)).await?;
    let mut c = svc.client().await?;
    for i in 0..5_i64 {
        c.follow(FollowRequest { follower_id: 20, followee_id: 500 + i }).await?;
    }
    outbox_drained(&db, Duration::from_secs(60)).await?;
    let ids: Vec<String> = kafka::read_all(&client, &topic)
        .await?
        .iter()
        .map(|(_, r)| RelationEvent::decode(r.record.value.as_deref().unwrap_or_default()).map(|e| e.event_id))
        .collect::<Result<_, _>>()?;
    let unique: HashSet<&String> = ids.iter().collect();
    assert_eq!((ids.len(), unique.len()), (55, 55), "every event exactly once");
    assert_eq!(metric(&svc.metrics().await?, "sg_relay_already_published_total"), 20.0);
    svc.stop().await?;
    db.drop_db().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_relay_leader_skips_what_its_predecessor_published_on_postgres() -> anyhow::Result<()> {
    a_new_leader_skips_rows_its_predecessor_published(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_relay_leader_skips_what_its_predecessor_published_on_mariadb() -> anyhow::Result<()> {
    a_new_leader_skips_rows_its_predecessor_published(Backend::MariaDb).await
}

/// Outbox ids are taken at insert and committed in any order: a row can become visible after
/// rows with higher ids were published (its writer committed late). A new leader must publish
/// it, not take it for published because a higher id is on its partition (which lost the
/// event of a committed follow under kills and contention, and every view under it drifted).
/// A row whose id matches a published record but whose content differs (an outbox that
/// restarted its ids) is published too.
async fn a_new_leader_publishes_a_row_committed_below_the_published_ids(backend: Backend) -> anyhow::Result<()> {
    let (db, topic, client, published) = follows_published(backend, 30, 3).await?;
    let max_id = published.iter().map(|(_, r)| outbox_id(r)).max().expect("published");
    // Late: an id below every published one of its key's partition, never published. Reused: a
    // published id with other content.
    let event = |n: i64| RelationEvent { event_id: format!("late-{n}"), follower_id: 1, followee_id: 900 + n, ..Default::default() }.encode_to_vec();
    put_outbox_rows(&db, &topic, &[(max_id + 50, 1, event(0), String::new())]).await?;
    // Published by a relay that then dies: the tail of partition of key 1 now holds max_id + 50.
    let svc = spawn_relation(relation_config(&db.url, &topic)).await?;
    outbox_drained(&db, Duration::from_secs(60)).await?;
    svc.stop().await?;
    put_outbox_rows(&db, &topic, &[(max_id + 10, 1, event(1), String::new()), (max_id + 50, 1, event(2), String::new())]).await?;

    let svc = spawn_relation(relation_config(&db.url, &topic)).await?;
    outbox_drained(&db, Duration::from_secs(60)).await?;
    let events: Vec<String> = kafka::read_all(&client, &topic)
        .await?
        .iter()
        .map(|(_, r)| RelationEvent::decode(r.record.value.as_deref().unwrap_or_default()).map(|e| e.event_id))
        .collect::<Result<_, _>>()?;
    for id in ["late-0", "late-1", "late-2"] {
        assert_eq!(events.iter().filter(|e| *e == id).count(), 1, "{id} published once: {events:?}");
    }
    assert_eq!(events.len(), 33, "the 30 follows and the three rows, each once");
    assert_eq!(metric(&svc.metrics().await?, "sg_relay_already_published_total"), 0.0);
    svc.stop().await?;
    db.drop_db().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_relay_leader_publishes_a_row_committed_below_the_published_ids_on_postgres() -> anyhow::Result<()> {
    a_new_leader_publishes_a_row_committed_below_the_published_ids(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_relay_leader_publishes_a_row_committed_below_the_published_ids_on_mariadb() -> anyhow::Result<()> {
    a_new_leader_publishes_a_row_committed_below_the_published_ids(Backend::MariaDb).await
}
