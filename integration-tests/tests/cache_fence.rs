//! The fills' position fence when the cache Redis loses its marks: a batch that reached the
//! cache before a flush and commits after it is never left out of a follower window or a
//! relationship hash filled in between.
//!
//! The batch is held between its cache write and its commit by a lock on `consumer_offset`
//! (the last table the projection writes before its commit), so the race is the same on every
//! run.

use std::collections::HashMap;
use std::time::Duration;

use sea_orm::{ConnectionTrait, TransactionTrait};
use socialgraph_cache::keys::Keys;
use socialgraph_integration_tests::cache::assert_cached_exact;
use socialgraph_integration_tests::*;
use socialgraph_proto::projection::v1 as pp;
use socialgraph_proto::relation::v1::*;
use socialgraph_testkit::{cache_redis_url, redis_url};

const DEADLINE: Duration = Duration::from_secs(60);
const FOLLOWER: i64 = 7;
const FOLLOWEE: i64 = 100;

async fn marks(conn: &mut socialgraph_cache::Conn, key: &str) -> anyhow::Result<HashMap<i32, i64>> {
    Ok(redis::AsyncCommands::hgetall(conn, key).await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_applied_before_a_cache_flush_and_committed_after_it_is_in_every_fill() -> anyhow::Result<()> {
    let url = cache_redis_url();
    let mut conn = redis_conn(&url).await.map_err(|e| anyhow::anyhow!("the cache Redis at {url} is not reachable ({e}): run `make deps`"))?;
    let m = Mesh::start(&redis_url()).await?;
    let cache = cache_settings(&m.topics.relation);
    let keys = Keys::new(cache.key_prefix.clone());
    let mark_key = keys.cache_applied(&format!("{}/{}", m.projection_config().database.consumer_name, m.topics.relation));
    let mut relation = m.relation.client().await?;
    let mut projection = m.projection.projection().await?;
    relation.follow(FollowRequest { follower_id: FOLLOWER + 1, followee_id: FOLLOWEE }).await?;
    m.settle(DEADLINE).await?;
    let before = marks(&mut conn, &mark_key).await?;
    assert!(!before.is_empty(), "projection-svc marks its positions in the cache");

    // The projection writes the next batch to the cache, then waits on the lock to commit it.
    let lock = m.db.conn.begin().await?;
    lock.execute_unprepared("LOCK TABLE consumer_offset IN SHARE ROW EXCLUSIVE MODE").await?;
    relation.follow(FollowRequest { follower_id: FOLLOWER, followee_id: FOLLOWEE }).await?;
    socialgraph_testkit::eventually(DEADLINE, "the follow's batch to reach the cache", || async {
        let now = marks(&mut redis_conn(&url).await?, &mark_key).await?;
        Ok(now.iter().any(|(p, n)| before.get(p).is_none_or(|b| n > b)).then_some(()))
    })
    .await?;

    // The cache Redis loses everything of this mesh, marks included; then reads miss and fill
    // while the batch is still uncommitted.
    let stale: Vec<Vec<u8>> = redis::cmd("KEYS").arg(format!("{}*", cache.key_prefix)).query_async(&mut conn).await?;
    let _: i64 = redis::cmd("DEL").arg(stale).query_async(&mut conn).await?;
    let page = pp::ListFollowersRequest { user_id: FOLLOWEE, page_size: 10, ..Default::default() };
    projection.list_followers(page.clone()).await?;
    let check = pp::BatchCheckFollowersRequest { user_id: FOLLOWEE, candidate_ids: vec![FOLLOWER, FOLLOWER + 1], ..Default::default() };
    projection.batch_check_followers(check.clone()).await?;
    socialgraph_testkit::eventually(DEADLINE, "the window's fill to give up", || async {
        let text = m.projection.metrics().await?;
        let fills = |result: &str| metric_sum(&text, "sg_cache_fills_total", &format!("result=\"{result}\""));
        assert_eq!(fills("cached"), 0.0, "a fill committed while a partition's position was unknown");
        Ok((fills("behind") >= 1.0).then_some(()))
    })
    .await?;
    let held: Vec<(Vec<u8>, String)> = redis::cmd("HGETALL").arg(&keys.list(false, FOLLOWEE)[2]).query_async(&mut conn).await?;
    assert!(held.iter().all(|(_, v)| v == "p"), "no relationship was remembered from the uncommitted read: {held:?}");

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
