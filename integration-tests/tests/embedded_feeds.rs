//! Home timelines in the embedded mode (`socialgraph dev`, one SQLite file): posts loaded with
//! the CLI's `load posts`, timelines exact, deletes, the posts counter moving with them, and
//! everything the same after a restart.

use std::time::Duration;

use socialgraph_integration_tests::feeds::{FeedModel, whole_timeline};
use socialgraph_integration_tests::{DEV_ADMIN_TOKEN, spawn_dev};
use socialgraph_proto::counter::v1::counter_service_client::CounterServiceClient;
use socialgraph_proto::counter::v1::{GetUserCountersRequest, RebuildUserCountersRequest};
use socialgraph_proto::feed::v1::DeletePostRequest;
use socialgraph_proto::feed::v1::feed_service_client::FeedServiceClient;
use socialgraph_proto::relation::v1::FollowRequest;
use socialgraph_proto::relation::v1::relation_service_client::RelationServiceClient;

const SETTLE: Duration = Duration::from_secs(60);

async fn assert_settles(dev: &socialgraph_integration_tests::DevSvc, model: &FeedModel, users: &[i64], posts_of_100: u64) -> anyhow::Result<()> {
    let mut feed = FeedServiceClient::connect(dev.projection.clone()).await?;
    let mut counter = CounterServiceClient::connect(dev.counter.clone()).await?;
    socialgraph_testkit::eventually(SETTLE, "timelines and the posts counter to reach the model", || {
        let (mut feed, mut counter) = (feed.clone(), counter.clone());
        async move {
            for u in users {
                if whole_timeline(&mut feed, *u, 7).await? != model.timeline(*u) {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    return Ok(None);
                }
            }
            let c = counter.get_user_counters(GetUserCountersRequest { user_id: 100, ..Default::default() }).await?.into_inner();
            Ok((c.counters.map(|c| c.posts) == Some(posts_of_100)).then_some(()))
        }
    })
    .await?;
    for u in users {
        assert_eq!(whole_timeline(&mut feed, *u, 50).await?, model.timeline(*u), "user {u}");
    }
    let c = counter.get_user_counters(GetUserCountersRequest { user_id: 100, ..Default::default() }).await?.into_inner();
    assert_eq!(c.counters.map(|c| c.posts), Some(posts_of_100));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_embedded_mode_serves_exact_timelines_and_counts_posts() -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(socialgraph_testkit::unique("sg-dev-feed"));
    std::fs::create_dir_all(&dir)?;
    let data = dir.join("dev.sqlite");
    let dev = spawn_dev(&data).await?;
    let mut model = FeedModel::default();
    let mut relation = RelationServiceClient::connect(dev.relation.clone()).await?;
    for (a, b) in [(1, 100), (2, 100), (3, 100), (1, 200), (4, 200)] {
        relation.follow(FollowRequest { follower_id: a, followee_id: b }).await?;
        model.follows.insert((a, b));
    }
    // The CLI's loader, from a file of `author post_id unix_seconds` lines.
    let mut text = String::from("# author post_id unix_seconds\n");
    for i in 1..=30i64 {
        let (author, at) = (if i % 6 == 0 { 200 } else { 100 }, 1_600_000_000 + i * 60);
        text.push_str(&format!("{author} {i} {at}\n"));
        model.posts.insert(i, (author, at * 1000));
    }
    let file = dir.join("posts.txt");
    std::fs::write(&file, text)?;
    let posts = socialgraph_cli::posts::read_posts(&file)?;
    let summary = socialgraph_cli::posts::load_posts(&dev.endpoints(), &posts, 8, &socialgraph_cli::commands::progress_bar(false, "posts")).await?;
    assert_eq!(summary.posts, 30);
    let users = [1, 2, 3, 4, 5];
    assert_settles(&dev, &model, &users, 25).await?;

    let mut feed = FeedServiceClient::connect(dev.projection.clone()).await?;
    feed.delete_post(DeletePostRequest { author_id: 100, post_id: 7 }).await?;
    feed.delete_post(DeletePostRequest { author_id: 100, post_id: 7 }).await?;
    model.posts.remove(&7);
    assert_settles(&dev, &model, &users, 24).await?;
    // A counter rebuild recounts the posts from the post list.
    let mut counter = CounterServiceClient::connect(dev.counter.clone()).await?;
    let mut req = tonic::Request::new(RebuildUserCountersRequest { user_id: 100 });
    req.metadata_mut().insert("authorization", format!("Bearer {DEV_ADMIN_TOKEN}").parse()?);
    let rebuilt = counter.rebuild_user_counters(req).await?.into_inner();
    assert_eq!(rebuilt.counters.map(|c| c.posts), Some(24));

    dev.stop().await?;
    let dev = spawn_dev(&data).await?;
    // Loading the same file again changes nothing (publishes are idempotent by post id).
    socialgraph_cli::posts::load_posts(&dev.endpoints(), &posts, 8, &socialgraph_cli::commands::progress_bar(false, "posts")).await?;
    assert_settles(&dev, &model, &users, 24).await?;
    dev.stop().await?;
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
