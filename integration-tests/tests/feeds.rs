//! FeedService on real databases and the broker: every correctness rule of the home timelines
//! (follow, unfollow, backfill, delete, threshold crossings both ways, mutes, blocks, inbox
//! bounds, replays and copies of events, rebuilds, paging while posts arrive, bad input), and a
//! crash in the middle of pushes.

use std::time::Duration;

use prost::Message;
use rskafka::client::partition::{Compression, UnknownTopicHandling};
use socialgraph_integration_tests::feeds::*;
use socialgraph_integration_tests::*;
use socialgraph_projection::feed::{FeedMode, FeedSettings};
use socialgraph_proto::events::v1::ContentEvent;
use socialgraph_proto::feed::v1::{DeletePostRequest, GetTimelineRequest, RebuildInboxesRequest, rebuild_inboxes_request};
use socialgraph_proto::projection::v1::projection_service_client::ProjectionServiceClient;
use socialgraph_proto::projection::v1::{RebuildRequest, rebuild_request};
use socialgraph_proto::relation::v1::{BlockRequest, ImportEdge, ImportFollowsRequest, MuteRequest};
use socialgraph_testkit::{Backend, kafka};
use tonic::Code;

const SETTLE: Duration = Duration::from_secs(120);
const T0: i64 = 1_700_000_000_000;

fn hybrid(threshold: i64) -> FeedSettings {
    FeedSettings { mode: FeedMode::Hybrid, pull_threshold: threshold, inbox_size: 4, fanout_batch: 2, ..FeedSettings::default() }
}

async fn every_rule_holds(backend: Backend) -> anyhow::Result<()> {
    let mut d = Driver { mesh: FeedMesh::start(backend, &[hybrid(2)]).await?, model: FeedModel::default() };
    let users = 1..=6;
    // Author 10 has two followers (pushed), author 11 four (pulled).
    for (a, b) in [(1, 10), (2, 10), (1, 11), (2, 11), (3, 11), (4, 11)] {
        d.follow(a, b).await?;
    }
    d.mesh.settle(SETTLE).await?;
    for i in 1..=6 {
        d.post(10, 100 + i, T0 + i * 1000).await?;
    }
    for i in 1..=3 {
        d.post(11, 110 + i, T0 + i * 1000 + 500).await?;
    }
    // Same time, different ids: the post id breaks the tie.
    d.post(11, 120, T0 + 3000).await?;
    d.check(users.clone(), "pushed and pulled posts merged, the inbox bound of 4 passed").await?;

    d.unfollow(1, 10).await?;
    d.check(users.clone(), "an unfollow hides the author's posts").await?;
    d.follow(5, 10).await?;
    d.check(users.clone(), "a new follow backfills the author's recent posts").await?;

    // 10 crosses the threshold upwards (4 followers): its next posts are pulled...
    d.follow(3, 10).await?;
    d.follow(4, 10).await?;
    d.mesh.settle(SETTLE).await?;
    d.post(10, 107, T0 + 7000).await?;
    d.post(10, 108, T0 + 8000).await?;
    d.check(users.clone(), "above the threshold").await?;
    // ...and downwards again (2 followers): pushed.
    d.unfollow(3, 10).await?;
    d.unfollow(4, 10).await?;
    d.mesh.settle(SETTLE).await?;
    d.post(10, 109, T0 + 9000).await?;
    d.follow(6, 10).await?;
    d.check(users.clone(), "back below the threshold").await?;
    let metrics = d.mesh.replicas[0].svc.metrics().await?;
    for (what, sample) in [("pushed", "mode=\"pushed\""), ("pulled", "mode=\"pulled\"")] {
        assert!(metric_sum(&metrics, "sg_feed_posts_total", sample) >= 2.0, "both modes occurred: {what}");
    }
    assert!(metric(&metrics, "sg_feed_inbox_trims_total") >= 1.0, "an inbox passed its bound and was trimmed");

    d.delete(10, 102).await?;
    d.delete(11, 112).await?;
    d.delete(10, 108).await?;
    d.check(users.clone(), "deleted posts vanish, pushed or pulled").await?;

    d.mesh.relation.client().await?.mute(MuteRequest { muter_id: 2, muted_id: 11 }).await?;
    d.model.mutes.insert((2, 11));
    d.check([2], "a mute filters").await?;
    d.mesh.relation.client().await?.block(BlockRequest { blocker_id: 10, blocked_id: 5 }).await?;
    d.model.follows.remove(&(5, 10));
    d.check(users.clone(), "a block ends the follow and the posts go").await?;

    // Idempotent publishes; refusals.
    let mut feed = d.mesh.feed(0).await?;
    publish(&mut feed, 10, 101, T0 + 1000).await?;
    let taken = publish(&mut feed, 11, 101, T0).await.unwrap_err();
    let status = taken.downcast_ref::<tonic::Status>().expect("a status");
    assert_eq!((status.code(), reason(status).as_str()), (Code::FailedPrecondition, "POST_ID_TAKEN"));
    let bad = publish(&mut feed, 0, 5, T0).await.unwrap_err();
    assert_eq!(bad.downcast_ref::<tonic::Status>().map(tonic::Status::code), Some(Code::InvalidArgument));
    let token =
        feed.get_timeline(GetTimelineRequest { user_id: 1, page_size: 1, page_token: "garbage".into(), ..Default::default() }).await.unwrap_err();
    assert_eq!((token.code(), reason(&token).as_str()), (Code::InvalidArgument, "BAD_PAGE_TOKEN"));
    let future = socialgraph_domain::now_ms() + 86_400_000;
    let late = publish(&mut feed, 10, 140, future).await.unwrap_err();
    assert_eq!(late.downcast_ref::<tonic::Status>().map(tonic::Status::code), Some(Code::InvalidArgument), "a day ahead is refused");
    // Another author cannot delete the post (the consumer also ignores such an event).
    let theirs = feed.delete_post(DeletePostRequest { author_id: 11, post_id: 101 }).await.unwrap_err();
    assert_eq!((theirs.code(), reason(&theirs).as_str()), (Code::FailedPrecondition, "POST_ID_TAKEN"));
    let mut deleted_again = d.mesh.feed(0).await?;
    deleted_again.delete_post(DeletePostRequest { author_id: 10, post_id: 102 }).await?;
    publish(&mut deleted_again, 10, 102, T0 + 2000).await?;
    d.check(users.clone(), "a repeated publish, a refused one, a deleted post published again").await?;

    // Paging while posts arrive: the next page continues strictly after the last entry seen.
    let first = feed.get_timeline(GetTimelineRequest { user_id: 2, page_size: 2, ..Default::default() }).await?.into_inner();
    d.post(10, 130, T0 + 20_000).await?;
    d.mesh.settle(SETTLE).await?;
    let second = feed
        .get_timeline(GetTimelineRequest { user_id: 2, page_size: 50, page_token: first.next_page_token, ..Default::default() })
        .await?
        .into_inner();
    let ids: Vec<i64> = first.posts.iter().chain(&second.posts).map(|p| p.post_id).collect();
    let expected: Vec<i64> = d.model.timeline(2).iter().map(|e| e.0).filter(|id| *id != 130).collect();
    assert_eq!(ids, expected, "pages neither repeat nor skip while a newer post arrives");

    // A follower row lost from the projection and its inbox with it: Rebuild restores the row
    // and the inbox follows, as for an applied follow.
    let r = &d.mesh.replicas[0];
    for sql in ["DELETE FROM follower WHERE follower_id = 6 AND followee_id = 10", "DELETE FROM inbox WHERE user_id = 6"] {
        sea_orm::ConnectionTrait::execute_unprepared(&r.db.conn, sql).await?;
    }
    let mut projection = ProjectionServiceClient::new(r.svc.channel().await?);
    projection.rebuild(admin(RebuildRequest { target: Some(rebuild_request::Target::UserId(6)) })).await?;
    d.check([6], "a follow restored by Rebuild backfills the inbox").await?;

    // Copies of every content event at new offsets, then a full replay: nothing changes.
    let client = kafka::connect(&kafka::brokers()).await?;
    let records = kafka::read_all(&client, &d.mesh.content_topic).await?;
    assert!(records.len() >= 15, "{} content records", records.len());
    for (p, r) in &records {
        ContentEvent::decode(r.record.value.as_deref().unwrap_or_default())?;
        let pc = client.partition_client(&d.mesh.content_topic, *p, UnknownTopicHandling::Retry).await?;
        pc.produce(vec![r.record.clone()], Compression::NoCompression).await?;
    }
    d.check(users.clone(), "every content event delivered twice").await?;
    let r = &d.mesh.replicas[0];
    r.svc.shutdown.cancel();
    socialgraph_storage::offsets::reset(&r.db.conn, "projection", &d.mesh.content_topic).await?;
    socialgraph_storage::offsets::reset(&r.db.conn, "projection", &d.mesh.topic).await?;
    let _ = (&mut d.mesh.replicas[0].svc.task).await;
    d.mesh.restart(0).await?;
    d.check(users.clone(), "both topics replayed from the start").await?;

    // Rebuilding every inbox from the facts gives the same timelines.
    let all = RebuildInboxesRequest { target: Some(rebuild_inboxes_request::Target::All(true)) };
    let rebuilt = d.mesh.feed(0).await?.rebuild_inboxes(admin(all)).await?.into_inner();
    assert!(rebuilt.inboxes >= 3, "{rebuilt:?}");
    d.check(users.clone(), "after RebuildInboxes").await?;
    d.mesh.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_timeline_rule_holds_on_postgres() -> anyhow::Result<()> {
    every_rule_holds(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_timeline_rule_holds_on_mariadb() -> anyhow::Result<()> {
    every_rule_holds(Backend::MariaDb).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_projection_mid_push_resumes_without_losing_or_doubling() -> anyhow::Result<()> {
    let push = FeedSettings { mode: FeedMode::Push, inbox_size: 50, fanout_batch: 40, ..FeedSettings::default() };
    let mut mesh = FeedMesh::start(Backend::Postgres, &[push]).await?;
    let mut model = FeedModel::default();
    // Two authors with 600 followers each.
    let edges: Vec<ImportEdge> = (1..=600)
        .flat_map(|f| {
            [ImportEdge { follower_id: f, followee_id: 1001, followed_at: None }, ImportEdge { follower_id: f, followee_id: 1002, followed_at: None }]
        })
        .collect();
    model.follows.extend(edges.iter().map(|e| (e.follower_id, e.followee_id)));
    mesh.relation.client().await?.import_follows(admin(futures::stream::iter([ImportFollowsRequest { edges }]))).await?;
    mesh.settle(SETTLE).await?;
    let mut feed = mesh.feed(0).await?;
    for i in 0..40 {
        let author = 1001 + i % 2;
        publish(&mut feed, author, 5000 + i, T0 + i * 10).await?;
        model.posts.insert(5000 + i, (author, T0 + i * 10));
    }
    for round in 0..3 {
        // Kill it while pushes are under way (no shutdown: the task is dropped where it is).
        socialgraph_testkit::eventually(SETTLE, "pushes to be under way", || async {
            let rows = sea_orm::ConnectionTrait::query_one_raw(
                &mesh.replicas[0].db.conn,
                sea_orm::Statement::from_string(mesh.replicas[0].db.conn.get_database_backend(), "SELECT COUNT(*) FROM inbox"),
            )
            .await?;
            let n: i64 = rows.map(|r| r.try_get_by_index(0)).transpose()?.unwrap_or(0);
            Ok((n > 3000 * (round + 1)).then_some(()))
        })
        .await?;
        mesh.replicas[0].svc.kill().await;
        mesh.restart(0).await?;
    }
    mesh.settle(SETTLE).await?;
    let mut feed = mesh.feed(0).await?;
    for u in [1, 2, 299, 300, 599, 600] {
        assert_eq!(whole_timeline(&mut feed, u, 100).await?, model.timeline(u), "user {u} after three kills");
    }
    let metrics = mesh.replicas[0].svc.metrics().await?;
    assert!(metric(&metrics, "sg_feed_fanout_batches_total") > 0.0, "the restarted worker pushed");
    mesh.stop().await
}
