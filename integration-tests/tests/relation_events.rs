//! The outbox and relay: events read back from Kafka are exactly one per real change, in
//! per-edge version order, each carrying its follower's followings after the change with a
//! per-follower version one up on every change, and replaying them reproduces the following
//! table and the followings of every follower.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use prost::Message;
use socialgraph_domain::timestamp_to_ms;
use socialgraph_events::kafka_partition;
use socialgraph_integration_tests::{outbox_drained, random_workload, relation_on};
use socialgraph_proto::events::v1::{RelationEvent, RelationEventKind};
use socialgraph_proto::relation::v1::FollowRequest;
use socialgraph_storage::edges::{self, EdgeTable, ScanFilter};
use socialgraph_storage::following_counts::FollowingCount;
use socialgraph_testkit::{Backend, kafka};

async fn events_are_exactly_one_per_change(backend: Backend) -> anyhow::Result<()> {
    let (db, svc, topic) = relation_on(backend, |_| {}).await?;
    let changes = random_workload(svc.addr, 5000, 200, 1).await?;
    outbox_drained(&db, Duration::from_secs(60)).await?;

    let client = kafka::connect(&kafka::brokers()).await?;
    let records = kafka::read_all(&client, &topic).await?;
    assert_eq!(records.len(), changes, "one event per real change");

    let mut replayed: BTreeMap<(i64, i64), (bool, i64, i64)> = BTreeMap::new();
    // follower → (followings, version) as the replay reached them
    let mut counted: BTreeMap<i64, (i64, i64)> = BTreeMap::new();
    for (partition, r) in &records {
        let key = r.record.key.clone().unwrap_or_default();
        let event = RelationEvent::decode(r.record.value.as_deref().unwrap_or_default())?;
        assert_eq!(key, event.follower_id.to_be_bytes(), "key is the follower id, 8 bytes big-endian");
        assert_eq!(*partition, kafka_partition(&key, 4), "Kafka's default partitioner places the record");
        for h in ["traceparent", "event-type", "schema"] {
            assert!(r.record.headers.contains_key(h), "header {h} present");
        }
        let edge = (event.follower_id, event.followee_id);
        let prev_version = replayed.get(&edge).map_or(0, |v| v.1);
        assert_eq!(event.version, prev_version + 1, "per-edge events arrive in version order without gaps");
        let following = event.kind == RelationEventKind::Followed as i32;
        let followed_at = event.followed_at.as_ref().map(timestamp_to_ms).unwrap_or_default();
        let was_following = replayed.get(&edge).is_some_and(|v| v.0);
        replayed.insert(edge, (following, event.version, followed_at));
        let (followings, version) = counted.get(&event.follower_id).copied().unwrap_or_default();
        let followings = followings + i64::from(following) - i64::from(was_following);
        assert_eq!(
            (event.follower_followings, event.follower_followings_version),
            (followings, version + 1),
            "the event carries its follower's followings after the change, one version up (follower {})",
            event.follower_id
        );
        counted.insert(event.follower_id, (followings, version + 1));
    }

    let table = edges::scan(&db.conn, EdgeTable::Following, ScanFilter::default(), 1_000_000).await?;
    let table: BTreeMap<(i64, i64), (bool, i64, i64)> =
        table.into_iter().map(|e| ((e.follower_id, e.followee_id), (e.state.as_i16() == 1, e.version, e.followed_at_ms))).collect();
    assert_eq!(replayed, table, "replaying the events onto an empty map reproduces the following table");
    for (follower, (followings, version)) in counted {
        let row = socialgraph_storage::following_counts::get(&db.conn, follower).await?;
        assert_eq!(row, Some(FollowingCount { followings, version }), "following_count of {follower} is what its last event said");
    }
    svc.stop().await?;
    db.drop_db().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn events_are_exactly_one_per_change_in_version_order_on_postgres() -> anyhow::Result<()> {
    events_are_exactly_one_per_change(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn events_are_exactly_one_per_change_in_version_order_on_mariadb() -> anyhow::Result<()> {
    events_are_exactly_one_per_change(Backend::MariaDb).await
}

async fn concurrent_identical_follows(backend: Backend) -> anyhow::Result<()> {
    let (db, svc, topic) = relation_on(backend, |_| {}).await?;
    let mut calls = Vec::new();
    for _ in 0..32 {
        let mut c = svc.client().await?;
        calls.push(tokio::spawn(async move { c.follow(FollowRequest { follower_id: 7, followee_id: 9 }).await }));
    }
    let mut changed = 0;
    for c in calls {
        let r = c.await??.into_inner();
        assert_eq!(r.version, 1);
        changed += usize::from(r.changed);
    }
    assert_eq!(changed, 1, "exactly one of 32 identical follows changes the edge");
    outbox_drained(&db, Duration::from_secs(30)).await?;
    let records = kafka::read_all(&kafka::connect(&kafka::brokers()).await?, &topic).await?;
    assert_eq!(records.len(), 1, "one event");
    let event = RelationEvent::decode(records[0].1.record.value.as_deref().unwrap_or_default())?;
    assert_eq!((event.follower_id, event.followee_id, event.version), (7, 9, 1));
    svc.stop().await?;
    db.drop_db().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_simultaneous_identical_follows_make_one_change_on_postgres() -> anyhow::Result<()> {
    concurrent_identical_follows(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_simultaneous_identical_follows_make_one_change_on_mariadb() -> anyhow::Result<()> {
    concurrent_identical_follows(Backend::MariaDb).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_relay_leads_and_another_replica_takes_over_when_it_stops() -> anyhow::Result<()> {
    let (db, first, topic) = relation_on(Backend::Postgres, |_| {}).await?;
    let mut config = socialgraph_integration_tests::relation_config(&db.url, &topic);
    config.kafka.partitions = 4;
    let second = socialgraph_integration_tests::spawn_relation(config).await?;
    let leaders = || async {
        let a = socialgraph_integration_tests::metric(&first.metrics().await?, "sg_relay_leader");
        let b = socialgraph_integration_tests::metric(&second.metrics().await?, "sg_relay_leader");
        anyhow::Ok((a, b))
    };
    socialgraph_testkit::eventually(Duration::from_secs(10), "a relay leader", || async {
        let (a, b) = leaders().await?;
        Ok((a + b >= 1.0).then_some(()))
    })
    .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (a, b) = leaders().await?;
    assert_eq!(a + b, 1.0, "exactly one replica leads the relay");
    let (leader, standby) = if a == 1.0 { (first, second) } else { (second, first) };
    leader.stop().await?;

    let mut client = standby.client().await?;
    for i in 2..=50 {
        client.follow(FollowRequest { follower_id: 1, followee_id: i }).await?;
    }
    outbox_drained(&db, Duration::from_secs(30)).await?;
    let records = kafka::read_all(&kafka::connect(&kafka::brokers()).await?, &topic).await?;
    let edges: HashSet<(i64, i64)> = records
        .iter()
        .map(|(_, r)| RelationEvent::decode(r.record.value.as_deref().unwrap_or_default()).map(|e| (e.follower_id, e.followee_id)))
        .collect::<Result<_, _>>()?;
    assert_eq!(edges.len(), 49, "the standby took over and relayed every event");
    standby.stop().await?;
    db.drop_db().await
}
