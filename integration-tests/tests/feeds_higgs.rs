//! The higgs-twitter activity stream (the data set `higgs-activity_time.txt.gz`) as a feed:
//! each interaction A → B is A following B, each activity line is a post by A at its time
//! (post id = line number). The graph is imported, the posts replayed in time order through
//! PublishPost, and the timelines of a sample of users read from three projection-svc
//! replicas, push, pull and hybrid, must equal a brute-force merge of their followees' posts,
//! exactly and in order.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::time::{Duration, Instant};

use futures::StreamExt;
use rand::seq::IndexedRandom;
use rand::{SeedableRng, rngs::StdRng};
use socialgraph_integration_tests::feeds::*;
use socialgraph_integration_tests::*;
use socialgraph_projection::feed::{FeedMode, FeedSettings};
use socialgraph_proto::relation::v1::{ImportEdge, ImportFollowsRequest};
use socialgraph_testkit::Backend;

/// Lines of the stream replayed (the first ones, in time order): a bounded test.
const LINES: usize = 20_000;
const SETTLE: Duration = Duration::from_secs(300);

fn read_stream() -> anyhow::Result<Vec<(i64, i64, i64)>> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/higgs-activity_time.txt.gz");
    anyhow::ensure!(path.exists(), "{} is missing: the data sets live in ../shared/data beside the repository", path.display());
    let reader = std::io::BufReader::new(flate2::read::GzDecoder::new(std::fs::File::open(&path)?));
    let mut out = Vec::with_capacity(LINES);
    for line in reader.lines().take(LINES) {
        let line = line?;
        let f: Vec<&str> = line.split_whitespace().collect();
        anyhow::ensure!(f.len() == 4, "unexpected line {line:?}");
        out.push((f[0].parse()?, f[1].parse()?, f[2].parse::<i64>()? * 1000));
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn higgs_timelines_equal_the_brute_force_merge_in_push_pull_and_hybrid() -> anyhow::Result<()> {
    let stream = read_stream()?;
    let mut model = FeedModel::default();
    for (a, b, _) in &stream {
        if a != b {
            model.follows.insert((*a, *b));
        }
    }
    let mut followers: BTreeMap<i64, i64> = BTreeMap::new();
    for (_, b) in &model.follows {
        *followers.entry(*b).or_default() += 1;
    }
    // Hybrid: the authors among the 1 % most followed posters are pulled.
    let mut poster_followers: Vec<i64> = stream.iter().map(|(a, _, _)| followers.get(a).copied().unwrap_or(0)).collect();
    poster_followers.sort_unstable();
    let threshold = poster_followers[poster_followers.len() * 99 / 100].max(1);
    let feeds = [
        FeedSettings { mode: FeedMode::Push, ..FeedSettings::default() },
        FeedSettings { mode: FeedMode::Pull, ..FeedSettings::default() },
        FeedSettings { mode: FeedMode::Hybrid, pull_threshold: threshold, inbox_size: 200, ..FeedSettings::default() },
    ];
    let mesh = FeedMesh::start(Backend::Postgres, &feeds).await?;
    let edges: Vec<ImportEdge> = model.follows.iter().map(|(a, b)| ImportEdge { follower_id: *a, followee_id: *b, followed_at: None }).collect();
    let messages: Vec<ImportFollowsRequest> = edges.chunks(10_000).map(|c| ImportFollowsRequest { edges: c.to_vec() }).collect();
    mesh.relation.client().await?.import_follows(admin(futures::stream::iter(messages))).await?;
    mesh.settle(SETTLE).await?;

    let started = Instant::now();
    let feed = mesh.feed(0).await?;
    let posts: Vec<(i64, i64, i64)> = stream.iter().enumerate().map(|(i, (a, _, at))| (*a, i as i64 + 1, *at)).collect();
    let mut calls = futures::stream::iter(posts.iter().copied())
        .map(|(a, id, at)| {
            let mut feed = feed.clone();
            async move { publish(&mut feed, a, id, at).await }
        })
        .buffered(64);
    while let Some(r) = calls.next().await {
        r?;
    }
    let published = started.elapsed();
    model.posts.extend(posts.iter().map(|(a, id, at)| (*id, (*a, *at))));
    mesh.settle(SETTLE).await?;
    println!(
        "higgs: {} follows, {} posts published in {:.1} s ({:.0}/s), all applied and pushed after {:.1} s; hybrid threshold {threshold} followers",
        model.follows.len(),
        posts.len(),
        published.as_secs_f64(),
        posts.len() as f64 / published.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );

    // The sample: the 20 users following the most accounts, and 40 drawn at random.
    let mut followings: BTreeMap<i64, usize> = BTreeMap::new();
    for (a, _) in &model.follows {
        *followings.entry(*a).or_default() += 1;
    }
    let mut by_count: Vec<(usize, i64)> = followings.iter().map(|(u, n)| (*n, *u)).collect();
    by_count.sort_unstable_by(|a, b| b.cmp(a));
    let mut sample: Vec<i64> = by_count.iter().take(20).map(|(_, u)| *u).collect();
    let everyone: Vec<i64> = followings.keys().copied().collect();
    sample.extend(everyone.choose_multiple(&mut StdRng::seed_from_u64(16), 40).copied());
    let mut compared = 0;
    for (i, name) in ["push", "pull", "hybrid"].iter().enumerate() {
        let mut client = mesh.feed(i).await?;
        for u in &sample {
            let want = model.timeline(*u);
            assert_eq!(whole_timeline(&mut client, *u, 100).await?, want, "{name}: user {u}'s timeline");
            compared += want.len();
        }
        let metrics = mesh.replicas[i].svc.metrics().await?;
        let (pushed, pulled) =
            (metric_sum(&metrics, "sg_feed_posts_total", "mode=\"pushed\""), metric_sum(&metrics, "sg_feed_posts_total", "mode=\"pulled\""));
        println!("{name}: {pushed} posts pushed, {pulled} pulled, {} inbox rows written", metric_sum(&metrics, "sg_feed_inbox_writes_total", ""));
        match *name {
            "push" => assert_eq!(pulled, 0.0),
            "pull" => assert_eq!(pushed, 0.0),
            _ => assert!(pushed > 0.0 && pulled > 0.0, "hybrid used both modes ({pushed} pushed, {pulled} pulled)"),
        }
    }
    assert!(compared > 1_000, "the sample's timelines hold {compared} posts in all");
    mesh.stop().await
}
