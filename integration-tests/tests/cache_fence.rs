//! The fills' position fence when the cache Redis loses its marks: a batch that reached the
//! cache before a flush and commits after it is never left out of a follower window, a
//! relationship hash or an author's post list filled in between.
//!
//! The batch is held between its cache write and its commit by a lock on `consumer_offset`
//! (the last table the projection writes before its commit), so the race is the same on every
//! run.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use sea_orm::{ConnectionTrait, DatabaseTransaction, TransactionTrait};
use socialgraph_cache::keys::Keys;
use socialgraph_integration_tests::cache::{assert_cached_exact, cached_posts, flush_prefix};
use socialgraph_integration_tests::feeds::{FeedMesh, publish};
use socialgraph_integration_tests::*;
use socialgraph_projection::feed::FeedSettings;
use socialgraph_proto::feed::v1::ListAuthorPostsRequest;
use socialgraph_proto::projection::v1 as pp;
use socialgraph_proto::relation::v1::*;
use socialgraph_testkit::{Backend, TestDb, cache_redis_url, redis_url};

const DEADLINE: Duration = Duration::from_secs(60);
const FOLLOWER: i64 = 7;
const FOLLOWEE: i64 = 100;
const T0: i64 = 1_700_000_000_000;

async fn cache_conn() -> anyhow::Result<socialgraph_cache::Conn> {
    let url = cache_redis_url();
    redis_conn(&url).await.map_err(|e| anyhow::anyhow!("the cache Redis at {url} is not reachable ({e}): run `make deps`"))
}

async fn marks(key: &str) -> anyhow::Result<HashMap<i32, i64>> {
    Ok(redis::AsyncCommands::hgetall(&mut cache_conn().await?, key).await?)
}

/// Locks `db`'s `consumer_offset`, runs `write`, waits until its batch reached the cache (a
/// mark under `mark_key` moved), then deletes every key under `prefix`, marks included.
/// Returns the lock: its commit lets the batch commit.
async fn held_across_a_flush(
    db: &TestDb,
    mark_key: &str,
    prefix: &str,
    write: impl Future<Output = anyhow::Result<()>>,
) -> anyhow::Result<DatabaseTransaction> {
    let before = marks(mark_key).await?;
    assert!(!before.is_empty(), "projection-svc marks its positions in the cache");
    let lock = db.conn.begin().await?;
    lock.execute_unprepared("LOCK TABLE consumer_offset IN SHARE ROW EXCLUSIVE MODE").await?;
    write.await?;
    socialgraph_testkit::eventually(DEADLINE, "the batch to reach the cache", || async {
        let now = marks(mark_key).await?;
        Ok(now.iter().any(|(p, n)| before.get(p).is_none_or(|b| n > b)).then_some(()))
    })
    .await?;
    flush_prefix(&mut cache_conn().await?, prefix).await?;
    Ok(lock)
}

/// Waits until a fill of `cache` on `svc` gave up (`behind`), asserting that none committed.
async fn fill_gave_up(svc: &Svc, cache: &str) -> anyhow::Result<()> {
    socialgraph_testkit::eventually(DEADLINE, "the fill to give up", || async {
        let text = svc.metrics().await?;
        let fills = |result: &str| -> f64 {
            let (c, r) = (format!("cache=\"{cache}\""), format!("result=\"{result}\""));
            let lines = text.lines().filter(|l| l.starts_with("sg_cache_fills_total") && l.contains(&c) && l.contains(&r));
            lines.filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok())).sum()
        };
        assert_eq!(fills("cached"), 0.0, "a {cache} fill committed while a partition's position was unknown");
        Ok((fills("behind") >= 1.0).then_some(()))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_applied_before_a_cache_flush_and_committed_after_it_is_in_every_fill() -> anyhow::Result<()> {
    let mut conn = cache_conn().await?;
    let m = Mesh::start(&redis_url()).await?;
    let cache = cache_settings(&m.topics.relation);
    let keys = Keys::new(cache.key_prefix.clone());
    let mark_key = keys.cache_applied(&format!("{}/{}", m.projection_config().database.consumer_name, m.topics.relation));
    let mut relation = m.relation.client().await?;
    let mut projection = m.projection.projection().await?;
    relation.follow(FollowRequest { follower_id: FOLLOWER + 1, followee_id: FOLLOWEE }).await?;
    m.settle(DEADLINE).await?;

    // The follow's batch reaches the cache, the cache Redis loses everything of this mesh, and
    // reads miss and fill while the batch is still uncommitted.
    let write = async {
        relation.follow(FollowRequest { follower_id: FOLLOWER, followee_id: FOLLOWEE }).await?;
        Ok(())
    };
    let lock = held_across_a_flush(&m.db, &mark_key, &cache.key_prefix, write).await?;
    let page = pp::ListFollowersRequest { user_id: FOLLOWEE, page_size: 10, ..Default::default() };
    projection.list_followers(page.clone()).await?;
    let check = pp::BatchCheckFollowersRequest { user_id: FOLLOWEE, candidate_ids: vec![FOLLOWER, FOLLOWER + 1], ..Default::default() };
    projection.batch_check_followers(check.clone()).await?;
    fill_gave_up(&m.projection, "followers").await?;
    let held: Vec<(Vec<u8>, String)> = redis::cmd("HGETALL").arg(&keys.list(false, FOLLOWEE)[2]).query_async(&mut conn).await?;
    let remembered: Vec<_> = held.iter().filter(|(m, v)| m.as_slice() != b"_h" && !v.starts_with("p:")).collect();
    assert!(remembered.is_empty(), "no relationship was remembered from the uncommitted read: {remembered:?}");

    lock.commit().await?;
    m.settle(DEADLINE).await?;
    // Every partition is marked again; the next miss fills the window, and both reads show the
    // follow.
    let want = [FOLLOWER, FOLLOWER + 1];
    socialgraph_testkit::eventually(DEADLINE, "the window to be filled with the follow", || async {
        let mut p = m.projection.projection().await?;
        let listed: Vec<i64> = p.list_followers(page.clone()).await?.into_inner().followers.iter().map(|e| e.user_id).collect();
        assert_eq!(listed.iter().copied().collect::<std::collections::BTreeSet<_>>(), want.iter().copied().collect(), "ListFollowers");
        let checked = p.batch_check_followers(check.clone()).await?.into_inner();
        assert!(checked.results.iter().all(|r| r.follows), "BatchCheckFollowers: {:?}", checked.results);
        Ok((assert_cached_exact(&m.db, &cache.url, &cache.key_prefix, false, &[FOLLOWEE]).await? == 1).then_some(()))
    })
    .await?;
    m.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_post_applied_before_a_cache_flush_and_committed_after_it_is_in_its_authors_list() -> anyhow::Result<()> {
    cache_conn().await?;
    let mesh = FeedMesh::start(Backend::Postgres, &[FeedSettings::default()]).await?;
    let replica = &mesh.replicas[0];
    let cache = cache_settings(&mesh.topic);
    let consumer = format!("{}/{}", replica.config.database.consumer_name, replica.config.kafka.content_topic);
    let mark_key = Keys::new(cache.key_prefix.clone()).cache_applied(&consumer);
    let mut feed = mesh.feed(0).await?;
    publish(&mut feed, 1, 1, T0).await?;
    mesh.settle(DEADLINE).await?;

    let lock = held_across_a_flush(&replica.db, &mark_key, &cache.key_prefix, publish(&mut feed, 1, 2, T0 + 1)).await?;
    let page = ListAuthorPostsRequest { author_id: 1, page_size: 10, page_token: String::new() };
    feed.list_author_posts(page.clone()).await?;
    fill_gave_up(&replica.svc, "posts").await?;

    lock.commit().await?;
    mesh.settle(DEADLINE).await?;
    let want = vec![(2, T0 + 1), (1, T0)];
    socialgraph_testkit::eventually(DEADLINE, "the author's list to be filled with the post", || async {
        let mut f = mesh.feed(0).await?;
        let posts = f.list_author_posts(page.clone()).await?.into_inner().posts;
        let listed: Vec<(i64, i64)> =
            posts.iter().map(|p| (p.post_id, p.created_at.as_ref().map(socialgraph_domain::timestamp_to_ms).unwrap_or_default())).collect();
        assert_eq!(listed, want, "ListAuthorPosts");
        let cached = cached_posts(&cache.url, &cache.key_prefix, 1).await?;
        if let Some(c) = &cached {
            assert_eq!(c.entries, want, "the cached post list");
        }
        Ok(cached.map(|_| ()))
    })
    .await?;
    mesh.stop().await
}
