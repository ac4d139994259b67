//! Part: feeds. One relation-svc and three projection-svc replicas in hybrid mode with pull
//! thresholds of 100, 1,000 and 100,000 followers, on authors with 50, 500 and 5,000 followers:
//! PublishPost throughput, inbox writes per post, fan-out rate beside a raw Redis pipeline of
//! the same ZADDs, GetTimeline beside ZREVRANGE of an inbox of the same length and beside
//! the raw pull merge (one PostgreSQL query over follower ⨝ post), and ListAuthorPosts from
//! the cached post lists beside ZREVRANGE and the same page in SQL.

use std::time::{Duration, Instant};

use socialgraph_integration_tests::feeds::FeedMesh;
use socialgraph_integration_tests::{admin, metric_sum};
use socialgraph_projection::feed::{FeedMode, FeedSettings};
use socialgraph_proto::feed::v1::feed_service_client::FeedServiceClient;
use socialgraph_proto::feed::v1::{GetTimelineRequest, ListAuthorPostsRequest, PublishPostRequest};
use socialgraph_proto::relation::v1::{ImportEdge, ImportFollowsRequest};
use socialgraph_testkit::Backend;

use crate::FeedsArgs;
use crate::backends::{bench_prefix, bench_redis, delete_prefix};
use crate::cache::{none, timed};
use crate::load::{closed_loop, mix};
use crate::report::{header, latency_rows, print_table, progress, row, summarize};

const THRESHOLDS: [i64; 3] = [100, 1_000, 100_000];
/// Authors per size class and their follower counts.
const CLASSES: [(i64, usize); 3] = [(50, 20), (500, 20), (5_000, 4)];
const FOLLOWER_POOL: i64 = 20_000;
const AUTHOR_BASE: i64 = 1_000_000;

/// The authors: (author id, followers).
fn authors() -> Vec<(i64, i64)> {
    let mut out = Vec::new();
    for (class, (followers, n)) in CLASSES.iter().enumerate() {
        for i in 0..*n {
            out.push((AUTHOR_BASE + class as i64 * 1000 + i as i64, *followers));
        }
    }
    out
}

pub(crate) async fn run(a: &FeedsArgs) -> anyhow::Result<()> {
    header("feeds: publish, fan-out, timelines (hybrid, thresholds 100 / 1,000 / 100,000)");
    let settings: Vec<FeedSettings> =
        THRESHOLDS.iter().map(|t| FeedSettings { mode: FeedMode::Hybrid, pull_threshold: *t, inbox_size: 800, ..FeedSettings::default() }).collect();
    let mesh = FeedMesh::start(Backend::Postgres, &settings).await?;
    let result = feeds_in(&mesh, a).await;
    mesh.stop().await?;
    result
}

async fn feeds_in(mesh: &FeedMesh, a: &FeedsArgs) -> anyhow::Result<()> {
    let authors = authors();
    let mut edges = Vec::new();
    for (k, (author, followers)) in authors.iter().enumerate() {
        for j in 0..*followers {
            let follower = (mix((k as u64) << 32 | j as u64) % FOLLOWER_POOL as u64) as i64 + 1;
            edges.push(ImportEdge { follower_id: follower, followee_id: *author, followed_at: None });
        }
    }
    progress(&format!("importing {} follows of {} authors", edges.len(), authors.len()));
    let messages: Vec<ImportFollowsRequest> = edges.chunks(10_000).map(|c| ImportFollowsRequest { edges: c.to_vec() }).collect();
    mesh.relation.client().await?.import_follows(admin(futures::stream::iter(messages))).await?;
    mesh.settle(Duration::from_secs(600)).await?;

    progress(&format!("publishing {} posts round-robin over the authors, {} in flight", a.posts, a.concurrency));
    let feed = FeedServiceClient::new(mesh.replicas[0].svc.channel().await?);
    let started = Instant::now();
    let authors_c = authors.clone();
    let publish = closed_loop(a.concurrency, a.posts, Duration::from_secs(600), move |_, i| {
        let mut feed = feed.clone();
        let author = authors_c[i % authors_c.len()].0;
        let req = PublishPostRequest {
            author_id: author,
            post_id: 10_000_000 + i as i64,
            created_at: Some(socialgraph_domain::timestamp_from_ms(1_700_000_000_000 + i as i64)),
        };
        async move {
            feed.publish_post(req).await?;
            Ok(())
        }
    })
    .await;
    // Each replica's time until its pushes are done.
    let mut done = Vec::new();
    for r in &mesh.replicas {
        socialgraph_integration_tests::projection_caught_up(
            &r.svc,
            &socialgraph_testkit::kafka::brokers(),
            &mesh.content_topic,
            Duration::from_secs(900),
        )
        .await?;
        socialgraph_testkit::eventually(Duration::from_secs(900), "pushes to finish", || async {
            let left = socialgraph_storage::feed::fanout_backlog(&r.db.conn).await?;
            if left > 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok((left == 0).then_some(()))
        })
        .await?;
        done.push(started.elapsed());
    }

    let mut rows = vec![row("PublishPost (posts/s)", publish.rate(), 0.0, "")];
    let mut notes = vec![publish.describe("publish")];
    let mut push_rows: f64 = 0.0;
    for (i, t) in THRESHOLDS.iter().enumerate() {
        let m = mesh.replicas[i].svc.metrics().await?;
        let writes = metric_sum(&m, "sg_feed_inbox_writes_total", "source=\"fanout\"");
        let pushed = metric_sum(&m, "sg_feed_posts_total", "mode=\"pushed\"");
        let pulled = metric_sum(&m, "sg_feed_posts_total", "mode=\"pulled\"");
        rows.push(row(format!("threshold {t}: inbox writes per post"), writes / (pushed + pulled).max(1.0), 0.0, ""));
        rows.push(row(format!("threshold {t}: inbox rows/s (publish start → pushes done)"), writes / done[i].as_secs_f64(), 0.0, ""));
        notes.push(format!("threshold {t}: {pushed} posts pushed, {pulled} pulled, {writes} inbox rows, done after {:.1} s", done[i].as_secs_f64()));
        push_rows = push_rows.max(writes);
    }

    // Raw: the same number of ZADDs in pipelines of 1,000.
    let mut conn = bench_redis().await?;
    let prefix = bench_prefix();
    let n = push_rows as usize;
    let t = Instant::now();
    for chunk in 0..n.div_ceil(1000) {
        let mut pipe = redis::pipe();
        for k in chunk * 1000..((chunk + 1) * 1000).min(n) {
            pipe.cmd("ZADD").arg(format!("{prefix}inbox:{}", k as i64 % FOLLOWER_POOL)).arg(k as f64).arg(k as i64).ignore();
        }
        let () = pipe.query_async(&mut conn).await?;
    }
    let raw_rate = n as f64 / t.elapsed().as_secs_f64();
    rows.push(row("fan-out (threshold 100,000) vs Redis ZADD pipeline (rows/s)", push_rows / done[2].as_secs_f64(), raw_rate, ""));
    summarize("feed fan-out, inbox rows/s", push_rows / done[2].as_secs_f64(), raw_rate, "", "-");
    print_table("feeds: writes", "service", "raw", &rows, &notes);

    // Reads: followers of several authors, pages of 50.
    let users: Vec<i64> = (0..a.reads).map(|i| (mix(i as u64 ^ 0xfeed) % FOLLOWER_POOL as u64) as i64 + 1).collect();
    let mut feeds = Vec::new();
    for r in &mesh.replicas {
        feeds.push(FeedServiceClient::new(r.svc.channel().await?));
    }
    let mut hists = Vec::new();
    for f in &feeds {
        let h = timed(users.len(), none, |i| {
            let (mut f, user_id) = (f.clone(), users[i]);
            async move {
                f.get_timeline(GetTimelineRequest { user_id, page_size: 50, ..Default::default() }).await?;
                anyhow::Ok(())
            }
        })
        .await?;
        hists.push(h);
    }
    // Raw: ZREVRANGE of an 800-entry zset; the pull merge as one query on the push replica's data.
    let key = format!("{prefix}inbox:raw");
    let mut pipe = redis::pipe();
    for k in 0..800 {
        pipe.cmd("ZADD").arg(&key).arg(k).arg(10_000_000 + k).ignore();
    }
    let () = pipe.query_async(&mut conn).await?;
    let zrev = timed(users.len(), none, |_| {
        let (mut conn, key) = (conn.clone(), key.clone());
        async move {
            let _: Vec<(i64, f64)> = redis::cmd("ZREVRANGE").arg(key).arg(0).arg(50).arg("WITHSCORES").query_async(&mut conn).await?;
            anyhow::Ok(())
        }
    })
    .await?;
    let pool = mesh.replicas[2].db.conn.get_postgres_connection_pool().clone();
    let merge = crate::raw::sql(
        &pool,
        "SELECT p.created_at_ms, p.post_id, p.author_id FROM follower f JOIN post p ON p.author_id = f.followee_id \
         WHERE f.follower_id = $1 AND f.state = 1 AND p.deleted = 0 ORDER BY p.created_at_ms DESC, p.post_id DESC LIMIT 51",
        &users,
        None,
    )
    .await?;
    // ListAuthorPosts(50) from the cached post lists (warmed by one pass), beside the same
    // page as one SQL query.
    let author_ids: Vec<i64> = (0..users.len()).map(|i| authors[i % authors.len()].0).collect();
    let list = |f: &FeedServiceClient<tonic::transport::Channel>, author_id: i64| {
        let mut f = f.clone();
        async move {
            f.list_author_posts(ListAuthorPostsRequest { author_id, page_size: 50, page_token: String::new() }).await?;
            anyhow::Ok(())
        }
    };
    for (author, _) in &authors {
        list(&feeds[0], *author).await?;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let author_posts = timed(author_ids.len(), none, |i| list(&feeds[0], author_ids[i])).await?;
    let author_sql = crate::raw::sql(
        &pool,
        "SELECT created_at_ms, post_id, author_id FROM post WHERE author_id = $1 AND deleted = 0 ORDER BY created_at_ms DESC, post_id DESC LIMIT 51",
        &author_ids,
        None,
    )
    .await?;
    delete_prefix(&mut conn, &prefix).await?;
    let mut read_rows = Vec::new();
    read_rows.extend(latency_rows(&[("ListAuthorPosts(50), cached, vs ZREVRANGE", &author_posts, &zrev)]));
    read_rows.extend(latency_rows(&[("ListAuthorPosts(50), cached, vs the page in SQL", &author_posts, &author_sql)]));
    for (i, t) in THRESHOLDS.iter().enumerate() {
        read_rows.extend(latency_rows(&[(&format!("GetTimeline(50), threshold {t} vs ZREVRANGE"), &hists[i], &zrev)]));
    }
    read_rows.extend(latency_rows(&[("GetTimeline(50), threshold 100 vs raw pull merge (SQL)", &hists[0], &merge)]));
    summarize("GetTimeline(50) p50, hybrid 100,000, vs ZREVRANGE", crate::report::ms(&hists[2], 0.5), crate::report::ms(&zrev, 0.5), "ms", "-");
    print_table("feeds: reads (one caller)", "service", "raw", &read_rows, &[format!("{} reads per row", users.len())]);
    Ok(())
}
