//! The authors' newest posts in the cache Redis (`cache.posts_window`): the cached list equals
//! the newest live posts of the `post` table after publishes, deletes, copies of every content
//! event and an evicted key; ListAuthorPosts serves the first page from it and every page
//! exactly; a replica whose cache Redis is down answers exactly from the database and marks the
//! authors stale.

use std::collections::BTreeMap;
use std::time::Duration;

use rskafka::client::partition::{Compression, UnknownTopicHandling};
use socialgraph_integration_tests::cache::{CachedList, cached_posts};
use socialgraph_integration_tests::feeds::*;
use socialgraph_integration_tests::*;
use socialgraph_projection::feed::FeedSettings;
use socialgraph_proto::feed::v1::{DeletePostRequest, ListAuthorPostsRequest};
use socialgraph_testkit::{Backend, kafka};

const SETTLE: Duration = Duration::from_secs(120);
const T0: i64 = 1_700_000_000_000;
const WINDOW: usize = 20;

/// Live posts: post id → (author, created ms).
type Posts = BTreeMap<i64, (i64, i64)>;

/// `author`'s live posts by definition: (post id, created ms), newest first.
fn expected(posts: &Posts, author: i64) -> Vec<(i64, i64)> {
    let mut out: Vec<(i64, i64)> = posts.iter().filter(|(_, (a, _))| *a == author).map(|(id, (_, at))| (*id, *at)).collect();
    out.sort_by_key(|(id, at)| std::cmp::Reverse((*at, *id)));
    out
}

/// The window the cache must hold for `author`: the newest [`WINDOW`] live posts, bounded by
/// the newest one left out.
fn expected_window(posts: &Posts, author: i64) -> CachedList {
    let all = expected(posts, author);
    let boundary = all.get(WINDOW).map(|(id, at)| (*at, *id));
    CachedList { entries: all.into_iter().take(WINDOW).collect(), boundary }
}

/// Every page of `author`'s posts from replica `i`, pages of `size`.
async fn listed(mesh: &FeedMesh, i: usize, author: i64, size: i32) -> anyhow::Result<Vec<(i64, i64)>> {
    let mut client = mesh.feed(i).await?;
    let (mut out, mut token) = (Vec::new(), String::new());
    loop {
        let page = client.list_author_posts(ListAuthorPostsRequest { author_id: author, page_size: size, page_token: token }).await?.into_inner();
        assert!(page.posts.iter().all(|p| p.author_id == author));
        out.extend(page.posts.iter().map(|p| (p.post_id, p.created_at.as_ref().map(socialgraph_domain::timestamp_to_ms).unwrap_or_default())));
        if page.next_page_token.is_empty() {
            return Ok(out);
        }
        token = page.next_page_token;
    }
}

/// Both replicas list every author's posts exactly, with several page sizes.
async fn lists_exact(mesh: &FeedMesh, posts: &Posts, when: &str) -> anyhow::Result<()> {
    for i in 0..2 {
        for author in [1, 2] {
            for size in [1, 7, 50] {
                assert_eq!(listed(mesh, i, author, size).await?, expected(posts, author), "{when}: replica {i}, author {author}, pages of {size}");
            }
        }
    }
    Ok(())
}

/// True when `got` is a valid window of `author`'s live posts: every live post newer than its
/// boundary and no more than [`WINDOW`] (a fill gives exactly [`expected_window`]; deletes
/// shrink a window without moving its boundary, which may be deleted itself).
fn valid_window(got: &CachedList, posts: &Posts, author: i64) -> bool {
    let all = expected(posts, author);
    let newer: Vec<(i64, i64)> = match got.boundary {
        Some((at, id)) => all.iter().copied().filter(|(i, a)| (*a, *i) > (at, id)).collect(),
        None => all,
    };
    got.entries == newer && newer.len() <= WINDOW
}

/// Waits until `author`'s cached list is a valid window (`filled`: the window a fill gives;
/// a read starts the fill).
async fn cached_window(mesh: &FeedMesh, posts: &Posts, author: i64, filled: bool, when: &str) -> anyhow::Result<()> {
    let cache = cache_settings(&mesh.topic);
    let want = expected_window(posts, author);
    let got = socialgraph_testkit::eventually(Duration::from_secs(30), "the cached post list to be the newest live posts", || async {
        listed(mesh, 0, author, 5).await?;
        let got = cached_posts(&cache.url, &cache.key_prefix, author).await?;
        Ok(got.filter(|g| if filled { *g == want } else { valid_window(g, posts, author) }))
    })
    .await;
    assert!(got.is_ok(), "{when}: author {author}'s cached list {:?}, want {want:?}", cached_posts(&cache.url, &cache.key_prefix, author).await?);
    Ok(())
}

async fn delete(mesh: &FeedMesh, posts: &mut Posts, author: i64, id: i64) -> anyhow::Result<()> {
    mesh.feed(0).await?.delete_post(DeletePostRequest { author_id: author, post_id: id }).await?;
    posts.remove(&id);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_cached_post_lists_equal_the_newest_live_posts_through_copies_and_evictions() -> anyhow::Result<()> {
    // Replica 1's cache Redis is a port where nothing listens.
    let mesh = FeedMesh::start_tuned(Backend::Postgres, &[FeedSettings::default(), FeedSettings::default()], |i, c| {
        c.cache.posts_window = WINDOW as i64;
        if i == 1 {
            c.cache.url = "redis://127.0.0.1:1/".into();
            c.cache.timeout_ms = 200;
        }
    })
    .await?;
    let mut posts = Posts::new();
    let mut feed = mesh.feed(0).await?;
    for i in 0..60 {
        publish(&mut feed, 1, 1000 + i, T0 + i * 1000).await?;
        posts.insert(1000 + i, (1, T0 + i * 1000));
    }
    // Two posts at one time: the list orders them by id.
    for (id, at) in [(2001, T0 + 5), (2002, T0 + 5), (2003, T0 + 9)] {
        publish(&mut feed, 2, id, at).await?;
        posts.insert(id, (2, at));
    }
    for id in [1059, 1055, 1010] {
        delete(&mesh, &mut posts, 1, id).await?;
    }
    mesh.settle(SETTLE).await?;
    lists_exact(&mesh, &posts, "after the first posts").await?;
    cached_window(&mesh, &posts, 1, true, "after the first posts").await?;
    cached_window(&mesh, &posts, 2, true, "a list shorter than the window").await?;

    // The first page comes from the cache.
    let before = mesh.replicas[0].svc.metrics().await?;
    let first = listed(&mesh, 0, 2, 50).await?;
    assert_eq!(first, expected(&posts, 2));
    let after = mesh.replicas[0].svc.metrics().await?;
    let hits = |t: &str| metric_sum(t, "sg_cache_requests_total", "cache=\"posts\",result=\"hit\",rpc=\"ListAuthorPosts\"");
    assert_eq!(hits(&after) - hits(&before), 1.0, "the whole list of author 2 is one cache hit");

    // New posts and deletes reach the cached list from the stream; copies of every content
    // event at new offsets (publishes of deleted posts among them) change nothing.
    publish(&mut feed, 1, 1060, T0 + 60_000).await?;
    posts.insert(1060, (1, T0 + 60_000));
    for id in [1058, 1045] {
        delete(&mesh, &mut posts, 1, id).await?;
    }
    let client = kafka::connect(&kafka::brokers()).await?;
    for (p, r) in kafka::read_all(&client, &mesh.content_topic).await? {
        let pc = client.partition_client(&mesh.content_topic, p, UnknownTopicHandling::Retry).await?;
        pc.produce(vec![r.record.clone()], Compression::NoCompression).await?;
    }
    mesh.settle(SETTLE).await?;
    cached_window(&mesh, &posts, 1, false, "after new posts, deletes and copies").await?;
    lists_exact(&mesh, &posts, "after new posts, deletes and copies").await?;

    // An evicted key: the list reads as not cached and the next read fills it again.
    let cache = cache_settings(&mesh.topic);
    let versions = format!("{}:v", socialgraph_cache::keys::Keys::new(cache.key_prefix.clone()).posts(1));
    redis::AsyncCommands::del::<_, ()>(&mut redis_conn(&cache.url).await?, &versions).await?;
    cached_window(&mesh, &posts, 1, true, "after an eviction").await?;
    lists_exact(&mesh, &posts, "after an eviction").await?;

    // Replica 1 never reached its cache: every read above was exact from the database, and
    // the authors of its batches are marked stale for the drain.
    let text = mesh.replicas[1].svc.metrics().await?;
    let fallbacks = metric_sum(&text, "sg_cache_requests_total", "cache=\"posts\",result=\"fallback\",rpc=\"ListAuthorPosts\"");
    assert!(fallbacks >= 1.0, "replica 1 fell back to the database ({fallbacks})");
    let stale = socialgraph_storage::stale::count(&mesh.replicas[1].db.conn).await?;
    assert!(stale >= 2, "authors 1 and 2 marked stale on replica 1 ({stale})");
    mesh.stop().await
}
