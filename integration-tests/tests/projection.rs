//! projection-svc against real databases and the broker: convergence, replay, out-of-order
//! and duplicated events, crashes, rebuilds, and bad input.

use std::time::Duration;

use prost::Message;
use rskafka::client::partition::{Compression, UnknownTopicHandling};
use rskafka::record::Record;
use sea_orm::ConnectionTrait;
use socialgraph_domain::timestamp_from_ms;
use socialgraph_integration_tests::*;
use socialgraph_proto::events::v1::{RelationEvent, RelationEventKind};
use socialgraph_proto::projection::v1::*;
use socialgraph_proto::relation::v1::{FollowRequest, ImportEdge, ImportFollowsRequest};
use socialgraph_storage::edges::{self, EdgeTable};
use socialgraph_testkit::{Backend, TestDb, kafka};
use tonic::Code;

const CATCH_UP: Duration = Duration::from_secs(180);

/// relation-svc and projection-svc on one fresh database and topic.
async fn mesh(backend: Backend) -> anyhow::Result<(TestDb, Svc, Svc, String)> {
    let (db, relation, topic) = relation_on(backend, |_| {}).await?;
    let projection = spawn_projection(projection_config(&db.url, &topic, relation.addr)).await?;
    Ok((db, relation, projection, topic))
}

async fn assert_projection_equals_source(db: &TestDb) -> anyhow::Result<()> {
    let (following, follower) = both_tables(db).await?;
    assert_eq!(follower.len(), following.len(), "same number of edges");
    assert!(follower == following, "the follower table equals the following table transposed, edge by edge");
    Ok(())
}

async fn converges_and_replays_to_the_same_table(backend: Backend) -> anyhow::Result<()> {
    let (db, relation, projection, topic) = mesh(backend).await?;
    random_workload(relation.addr, 10_000, 400, 3).await?;
    outbox_drained(&db, CATCH_UP).await?;
    projection_caught_up(&projection, &kafka::brokers(), &topic, CATCH_UP).await?;
    assert_projection_equals_source(&db).await?;

    // Replay: forget every offset, consume everything again.
    projection.stop().await?;
    socialgraph_storage::offsets::reset(&db.conn, "projection", &topic).await?;
    let projection = spawn_projection(projection_config(&db.url, &topic, relation.addr)).await?;
    projection_caught_up(&projection, &kafka::brokers(), &topic, CATCH_UP).await?;
    assert_projection_equals_source(&db).await?;
    projection.stop().await?;
    relation.stop().await?;
    db.drop_db().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn projection_converges_to_the_following_table_and_replay_changes_nothing_on_postgres() -> anyhow::Result<()> {
    converges_and_replays_to_the_same_table(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn projection_converges_to_the_following_table_and_replay_changes_nothing_on_mariadb() -> anyhow::Result<()> {
    converges_and_replays_to_the_same_table(Backend::MariaDb).await
}

fn event(kind: RelationEventKind, version: i64, at_ms: i64) -> RelationEvent {
    RelationEvent {
        event_id: format!("e{version}"),
        kind: kind as i32,
        follower_id: 1,
        followee_id: 2,
        version,
        occurred_at: Some(timestamp_from_ms(at_ms)),
        followed_at: Some(timestamp_from_ms(1000)),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn out_of_order_and_duplicated_events_leave_the_newest_state() -> anyhow::Result<()> {
    let db = TestDb::create(Backend::Postgres).await?;
    let topic = socialgraph_testkit::unique("sg.relation.test.");
    let client = kafka::connect(&kafka::brokers()).await?;
    client.controller_client()?.create_topic(&topic, 1, 1, 5_000).await?;
    let pc = client.partition_client(&topic, 0, UnknownTopicHandling::Retry).await?;
    let record = |value: Vec<u8>| Record {
        key: Some(1_i64.to_be_bytes().to_vec()),
        value: Some(value),
        headers: Default::default(),
        timestamp: rskafka::chrono::Utc::now(),
    };
    use RelationEventKind::{Followed, Unfollowed};
    let sequence =
        [event(Followed, 1, 1000), event(Followed, 1, 1000), event(Followed, 3, 3000), event(Unfollowed, 2, 2000), event(Unfollowed, 2, 2000)];
    // One batch holding all of them, then the same again one record per batch.
    let mut records: Vec<Record> = sequence.iter().map(|e| record(e.encode_to_vec())).collect();
    records.push(record(b"not a protobuf message".to_vec()));
    pc.produce(records, Compression::Lz4).await?;

    let mut config = projection_config(&db.url, &topic, "127.0.0.1:1".parse()?);
    config.kafka.partitions = 1;
    let projection = spawn_projection(config).await?;
    projection_caught_up(&projection, &kafka::brokers(), &topic, CATCH_UP).await?;
    for e in [event(Unfollowed, 2, 2000), event(Followed, 1, 1000), event(Followed, 3, 3000)] {
        pc.produce(vec![record(e.encode_to_vec())], Compression::Lz4).await?;
        projection_caught_up(&projection, &kafka::brokers(), &topic, CATCH_UP).await?;
    }
    let row = edges::get(&db.conn, EdgeTable::Follower, 1, 2, false).await?.expect("the edge is projected");
    assert_eq!((row.state.as_i16(), row.version, row.updated_at_ms), (1, 3, 3000), "version 3 wins");
    let metrics = projection.metrics().await?;
    assert!(metrics.contains("sg_projection_skipped_total{reason=\"undecodable\"} 1"), "the bad record is counted");
    projection.stop().await?;
    db.drop_db().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_projection_mid_batch_and_restarting_loses_and_doubles_nothing() -> anyhow::Result<()> {
    let (db, relation, topic) = relation_on(Backend::Postgres, |_| {}).await?;
    let mut rc = relation.client().await?;
    // 30,000 events waiting in the topic before the projection starts.
    let edges_in: Vec<ImportFollowsRequest> = (0..30)
        .map(|m| ImportFollowsRequest {
            edges: (0..1000)
                .map(|i| ImportEdge { follower_id: 1 + (m * 1000 + i) % 997, followee_id: 2000 + m * 1000 + i, followed_at: None })
                .collect(),
        })
        .collect();
    rc.import_follows(admin(futures::stream::iter(edges_in))).await?;
    outbox_drained(&db, CATCH_UP).await?;
    let config = projection_config(&db.url, &topic, relation.addr);

    for round in 0..3 {
        let mut projection = spawn_projection(config.clone()).await?;
        // Let it get into the middle of its batches, then kill it without any shutdown.
        socialgraph_testkit::eventually(CATCH_UP, "the projection to apply something", || async {
            let n: i64 = edges::count(&db.conn, EdgeTable::Follower, edges::Col::State, 1).await?;
            Ok((n > 2000 * (round + 1)).then_some(()))
        })
        .await?;
        projection.kill().await;
        // Follows keep arriving meanwhile.
        for i in 0..50 {
            rc.follow(FollowRequest { follower_id: 5000 + round, followee_id: 1 + i }).await?;
        }
    }
    outbox_drained(&db, CATCH_UP).await?;
    let projection = spawn_projection(config).await?;
    projection_caught_up(&projection, &kafka::brokers(), &topic, CATCH_UP).await?;
    assert_projection_equals_source(&db).await?;
    projection.stop().await?;
    relation.stop().await?;
    db.drop_db().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rebuild_of_one_user_and_of_all_restores_a_damaged_follower_table_exactly() -> anyhow::Result<()> {
    let (db, relation, projection, topic) = mesh(Backend::Postgres).await?;
    random_workload(relation.addr, 3000, 60, 9).await?;
    outbox_drained(&db, CATCH_UP).await?;
    projection_caught_up(&projection, &kafka::brokers(), &topic, CATCH_UP).await?;
    assert_projection_equals_source(&db).await?;
    let (following, _) = both_tables(&db).await?;
    let user = following[0].follower_id;

    let damage = [
        "DELETE FROM follower WHERE followee_id % 7 = 0",
        "UPDATE follower SET state = 1 - state WHERE follower_id % 5 = 0",
        "UPDATE follower SET followed_at_ms = 1, version = version + 10 WHERE follower_id % 3 = 0",
        "INSERT INTO follower VALUES (9999, 9997, 1, 1, 1, 1), (9996, 9998, 1, 1, 1, 1)",
    ];
    let mut pc = projection.projection().await?;
    for sql in damage {
        db.conn.execute_unprepared(sql).await?;
    }
    let sql_user = format!("DELETE FROM follower WHERE follower_id = {user} OR followee_id = {user}");
    db.conn.execute_unprepared(&sql_user).await?;
    let r = pc.rebuild(admin(RebuildRequest { target: Some(rebuild_request::Target::UserId(user)) })).await?.into_inner();
    assert!(r.rows_written > 0);
    let (following, follower) = both_tables(&db).await?;
    let mine = |v: &Vec<socialgraph_domain::Edge>| -> Vec<socialgraph_domain::Edge> {
        v.iter().filter(|e| e.follower_id == user || e.followee_id == user).copied().collect()
    };
    assert_eq!(mine(&follower), mine(&following), "the user's rows are restored");

    let r = pc.rebuild(admin(RebuildRequest { target: Some(rebuild_request::Target::All(true)) })).await?.into_inner();
    assert!(r.rows_written > 0 && r.rows_deleted >= 2, "{r:?}");
    assert_projection_equals_source(&db).await?;
    let again = pc.rebuild(admin(RebuildRequest { target: Some(rebuild_request::Target::All(true)) })).await?.into_inner();
    assert_eq!((again.rows_written, again.rows_deleted), (0, 0), "a second rebuild finds nothing to fix");
    projection.stop().await?;
    relation.stop().await?;
    db.drop_db().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn follower_reads_agree_with_the_source() -> anyhow::Result<()> {
    let (db, relation, projection, topic) = mesh(Backend::Postgres).await?;
    random_workload(relation.addr, 2000, 40, 5).await?;
    outbox_drained(&db, CATCH_UP).await?;
    projection_caught_up(&projection, &kafka::brokers(), &topic, CATCH_UP).await?;
    let (following, _) = both_tables(&db).await?;
    let live: Vec<_> = following.iter().filter(|e| e.state.as_i16() == 1).collect();
    let mut pc = projection.projection().await?;
    for user in 1..=40 {
        let mut expected: Vec<(i64, i64)> = live.iter().filter(|e| e.followee_id == user).map(|e| (e.followed_at_ms, e.follower_id)).collect();
        expected.sort_by(|a, b| b.cmp(a));
        let (mut got, mut token) = (Vec::new(), String::new());
        loop {
            let r =
                pc.list_followers(ListFollowersRequest { user_id: user, page_size: 3, page_token: token, ..Default::default() }).await?.into_inner();
            got.extend(r.followers.iter().map(|f| f.user_id));
            if r.next_page_token.is_empty() {
                break;
            }
            token = r.next_page_token;
        }
        assert_eq!(got, expected.iter().map(|e| e.1).collect::<Vec<_>>(), "followers of {user}, newest first");
        let count = pc.count_followers(CountFollowersRequest { user_id: user, ..Default::default() }).await?.into_inner().count;
        assert_eq!(count, expected.len() as i64);
        let counts = pc.get_edge_counts(GetEdgeCountsRequest { user_id: user, ..Default::default() }).await?.into_inner();
        assert_eq!(counts.followers, expected.len() as i64);
        assert_eq!(counts.followings, live.iter().filter(|e| e.follower_id == user).count() as i64);
        assert_eq!(counts.offsets.len(), 4, "offsets of every partition");
        let candidates: Vec<i64> = (1..=40).collect();
        let checks = pc
            .batch_check_followers(BatchCheckFollowersRequest { user_id: user, candidate_ids: candidates, ..Default::default() })
            .await?
            .into_inner();
        for c in checks.results {
            assert_eq!(c.follows, live.iter().any(|e| e.follower_id == c.candidate_id && e.followee_id == user));
        }
    }
    let mut status = pc.get_projection_status(GetProjectionStatusRequest {}).await?.into_inner();
    status.partitions.retain(|p| p.topic == topic);
    assert_eq!(status.partitions.len(), 4);
    assert!(status.partitions.iter().all(|p| p.lag == 0 && p.last_event_time.is_some()));
    projection.stop().await?;
    relation.stop().await?;
    db.drop_db().await
}

fn fields(status: &tonic::Status) -> Vec<String> {
    use tonic_types::StatusExt;
    status.get_error_details().bad_request().map(|b| b.field_violations.iter().map(|v| v.field.clone()).collect()).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_input_on_every_projection_rpc_gets_invalid_argument() -> anyhow::Result<()> {
    let (db, relation, projection, _topic) = mesh(Backend::Postgres).await?;
    let mut pc = projection.projection().await?;
    let e =
        pc.list_followers(ListFollowersRequest { user_id: 0, page_size: 1001, page_token: String::new(), ..Default::default() }).await.unwrap_err();
    assert_eq!((e.code(), fields(&e)), (Code::InvalidArgument, vec!["user_id".to_owned(), "page_size".to_owned()]));
    let e =
        pc.list_followers(ListFollowersRequest { user_id: 1, page_size: 5, page_token: "forged".into(), ..Default::default() }).await.unwrap_err();
    assert_eq!((e.code(), fields(&e)), (Code::InvalidArgument, vec!["page_token".to_owned()]));
    let e =
        pc.batch_check_followers(BatchCheckFollowersRequest { user_id: 1, candidate_ids: vec![2; 1001], ..Default::default() }).await.unwrap_err();
    assert_eq!((e.code(), fields(&e)), (Code::InvalidArgument, vec!["candidate_ids".to_owned()]));
    let e = pc.batch_check_followers(BatchCheckFollowersRequest { user_id: -1, candidate_ids: vec![2, 0], ..Default::default() }).await.unwrap_err();
    assert_eq!(fields(&e), ["user_id", "candidate_ids[1]"]);
    let e = pc.count_followers(CountFollowersRequest { user_id: 0, ..Default::default() }).await.unwrap_err();
    assert_eq!((e.code(), fields(&e)), (Code::InvalidArgument, vec!["user_id".to_owned()]));
    let e = pc.get_edge_counts(GetEdgeCountsRequest { user_id: -5, ..Default::default() }).await.unwrap_err();
    assert_eq!((e.code(), fields(&e)), (Code::InvalidArgument, vec!["user_id".to_owned()]));
    let e = pc.rebuild(admin(RebuildRequest { target: None })).await.unwrap_err();
    assert_eq!((e.code(), fields(&e)), (Code::InvalidArgument, vec!["target".to_owned()]));
    let e = pc.rebuild(admin(RebuildRequest { target: Some(rebuild_request::Target::UserId(0)) })).await.unwrap_err();
    assert_eq!((e.code(), fields(&e)), (Code::InvalidArgument, vec!["user_id".to_owned()]));
    let e = pc.rebuild(RebuildRequest { target: Some(rebuild_request::Target::All(true)) }).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    projection.stop().await?;
    relation.stop().await?;
    db.drop_db().await
}
