//! Home timelines in the embedded mode (`socialgraph dev`, one SQLite file): posts loaded with
//! the CLI's `load posts`, timelines exact, deletes, the posts counter moving with them, and
//! everything the same after a restart; catching up from a post (both walks, through the CLI's
//! reader) across the inbox floor while posts arrive.

use std::time::Duration;

use socialgraph_cli::posts::TimelineWalk;
use socialgraph_integration_tests::feeds::{Entry, FeedModel, entry_of, timeline_page, whole_timeline};
use socialgraph_integration_tests::{DEV_ADMIN_TOKEN, spawn_dev};
use socialgraph_proto::counter::v1::counter_service_client::CounterServiceClient;
use socialgraph_proto::counter::v1::{GetUserCountersRequest, RebuildUserCountersRequest};
use socialgraph_proto::feed::v1::feed_service_client::FeedServiceClient;
use socialgraph_proto::feed::v1::{DeletePostRequest, GetTimelineRequest, PublishPostRequest};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_embedded_mode_catches_up_from_a_post_across_the_inbox_floor() -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(socialgraph_testkit::unique("sg-dev-catchup"));
    std::fs::create_dir_all(&dir)?;
    let data = dir.join("dev.sqlite");
    let dev = spawn_dev(&data).await?;
    let endpoints = dev.endpoints();
    let mut model = FeedModel::default();
    let mut relation = RelationServiceClient::connect(dev.relation.clone()).await?;
    for (a, b) in [(1, 100), (1, 200), (2, 100)] {
        relation.follow(FollowRequest { follower_id: a, followee_id: b }).await?;
        model.follows.insert((a, b));
    }
    // More posts than an inbox keeps (800, trimmed past 1,000): user 1's oldest posts are
    // below its floor, read from the post list.
    let posts: Vec<socialgraph_cli::posts::Post> = (1..=1100i64)
        .map(|i| socialgraph_cli::posts::Post {
            author_id: if i % 7 == 0 { 200 } else { 100 },
            post_id: i,
            created_at_ms: (1_600_000_000 + i * 60) * 1000,
        })
        .collect();
    model.posts.extend(posts.iter().map(|p| (p.post_id, (p.author_id, p.created_at_ms))));
    socialgraph_cli::posts::load_posts(&endpoints, &posts, 8, &socialgraph_cli::commands::progress_bar(false, "posts")).await?;
    let mut feed = FeedServiceClient::connect(dev.projection.clone()).await?;
    for id in [5, 600, 1050] {
        feed.delete_post(DeletePostRequest { author_id: model.posts[&id].0, post_id: id }).await?;
        model.posts.remove(&id);
    }
    settle(&mut feed, &model).await?;
    let db = socialgraph_storage::connect(&format!("sqlite://{}", data.display()), 1).await?;
    let floor = socialgraph_storage::feed::inbox_state(&db, 1).await?.floor;
    db.close().await?;
    assert!(floor.post_id > 64, "user 1's inbox was trimmed: its floor is {floor:?}");

    let key = |id: i64| ((1_600_000_000 + id * 60) * 1000, id);
    for (bound, size) in [(1, 64), (5, 100), (150, 7), (700, 1000), (1099, 3)] {
        let up = TimelineWalk { min_post_id: bound, since_post_id: 0 };
        let (listed, next) = socialgraph_cli::posts::timeline(&endpoints, 1, up, size, String::new(), true).await?;
        assert_eq!((listed.iter().map(entry_of).collect::<Vec<_>>(), next), (model.newer(1, key(bound)), String::new()), "up from {bound} by {size}");
        let down = TimelineWalk { min_post_id: 0, since_post_id: bound };
        let (listed, _) = socialgraph_cli::posts::timeline(&endpoints, 1, down, size, String::new(), true).await?;
        let mut want = model.newer(1, key(bound));
        want.reverse();
        assert_eq!(listed.iter().map(entry_of).collect::<Vec<_>>(), want, "down to {bound} by {size}");
    }

    // A walk up under way: a post arrives at the top and one ahead of the walk goes.
    let req = |token: String| GetTimelineRequest { user_id: 1, page_size: 50, page_token: token, min_post_id: 10, since_post_id: 0 };
    let (mut listed, mut token) = timeline_page(&mut feed, req(String::new())).await?;
    feed.publish_post(PublishPostRequest { author_id: 200, post_id: 2000, created_at: Some(socialgraph_domain::timestamp_from_ms(key(1200).0)) })
        .await?;
    model.posts.insert(2000, (200, key(1200).0));
    feed.delete_post(DeletePostRequest { author_id: 100, post_id: 1000 }).await?;
    model.posts.remove(&1000);
    settle(&mut feed, &model).await?;
    while !token.is_empty() {
        let (page, next) = timeline_page(&mut feed, req(token)).await?;
        (listed, token) = ([listed, page].concat(), next);
    }
    let want: Vec<Entry> = model.newer(1, key(10));
    assert_eq!(listed, want, "the walk up lists the post that arrived and not the one deleted");
    dev.stop().await?;
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

async fn settle(feed: &mut FeedServiceClient<tonic::transport::Channel>, model: &FeedModel) -> anyhow::Result<()> {
    socialgraph_testkit::eventually(SETTLE, "user 1's timeline to reach the model", || {
        let mut feed = feed.clone();
        async move {
            let done = whole_timeline(&mut feed, 1, 1000).await? == model.timeline(1);
            if !done {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok(done.then_some(()))
        }
    })
    .await
}
