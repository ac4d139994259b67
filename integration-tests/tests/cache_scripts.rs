//! The following-list cache's scripts on the real cache Redis: every race the module documents
//! (a fill overtaken by writes, eviction of one of the two keys, a fill whose marker was lost or
//! taken over, late and reordered events) and the paging order with ties.

use std::time::Duration;

use socialgraph_cache::keys::Keys;
use socialgraph_cache::lists::{CachedEdge, Direction, JOIN_MAX, Limits, ListCache, Lookup, PageRead};
use socialgraph_integration_tests::redis_conn;
use socialgraph_testkit::{cache_redis_url, unique};

const USER: i64 = 42;

fn edge(peer_id: i64, version: i64, following: bool, followed_at_ms: i64) -> CachedEdge {
    CachedEdge { peer_id, version, following, followed_at_ms }
}

/// A cache under a fresh prefix, and its keys.
async fn fresh() -> anyhow::Result<(ListCache, Keys)> {
    let url = cache_redis_url();
    redis_conn(&url).await.map_err(|e| anyhow::anyhow!("the cache Redis at {url} is not reachable ({e}): run `make deps`"))?;
    let keys = Keys::new(unique("cs") + ":");
    let pool = socialgraph_cache::pool(&url, 2, Duration::from_secs(5))?;
    let limits = Limits { window: 2_000, relationship_max: 100, ttl: Duration::from_secs(600), timeout: Duration::from_secs(5) };
    Ok((ListCache::new(pool, keys.clone(), Direction::Following, limits), keys))
}

async fn list(cache: &ListCache) -> anyhow::Result<Option<Vec<i64>>> {
    Ok(match cache.page(USER, None, 1000).await? {
        PageRead::Hit(v) => Some(v.into_iter().map(|(id, _)| id).collect()),
        PageRead::Miss => None,
        PageRead::PastWindow(v) => panic!("a list under its window is whole, got a window of {v:?}"),
    })
}

async fn del(keys: &[String]) -> anyhow::Result<()> {
    let _: i64 = redis::AsyncCommands::del(&mut redis_conn(&cache_redis_url()).await?, keys).await?;
    Ok(())
}

async fn exists(key: &str) -> anyhow::Result<bool> {
    Ok(redis::AsyncCommands::exists(&mut redis_conn(&cache_redis_url()).await?, key).await?)
}

#[tokio::test]
async fn a_fill_keeps_every_write_that_landed_after_its_marker() -> anyhow::Result<()> {
    let (cache, _) = fresh().await?;
    assert_eq!(list(&cache).await?, None, "nothing cached yet");
    assert_eq!(cache.apply(&[(USER, edge(9, 1, true, 900))], None).await?, 0, "an event for a list not cached changes nothing");
    let nonce = cache.begin_fill(USER).await?.expect("a fill starts");
    // Events after the marker: 5 followed again (v2), 7 unfollowed (v3), 8 followed (v1).
    cache.apply(&[(USER, edge(5, 2, true, 500)), (USER, edge(7, 3, false, 700)), (USER, edge(8, 1, true, 800))], None).await?;
    assert_eq!(list(&cache).await?, None, "a list being filled is not served");
    // The database read happened before those writes: 5 unfollowed at v1 (absent), 7 followed
    // at v2, 6 followed at v1.
    assert!(cache.commit_fill(USER, &nonce, &[edge(7, 2, true, 700), edge(6, 1, true, 600)], None).await?);
    assert_eq!(list(&cache).await?, Some(vec![8, 6, 5]), "newer writes win over the older read, whatever their order");
    assert_eq!(cache.count(USER).await?, Some(3));
    assert_eq!(cache.begin_fill(USER).await?, None, "a complete list needs no fill");
    Ok(())
}

#[tokio::test]
async fn an_unfollowed_account_never_comes_back_from_a_late_or_copied_event() -> anyhow::Result<()> {
    let (cache, _) = fresh().await?;
    let nonce = cache.begin_fill(USER).await?.expect("a fill starts");
    assert!(cache.commit_fill(USER, &nonce, &[edge(3, 1, true, 300), edge(4, 1, true, 400)], None).await?);
    cache.apply(&[(USER, edge(3, 2, false, 300))], None).await?;
    // The follow event again (a copy at a later offset), then out of order.
    assert_eq!(cache.apply(&[(USER, edge(3, 1, true, 300))], None).await?, 0);
    assert_eq!(list(&cache).await?, Some(vec![4]));
    // Count-preserving change: unfollow one, follow another.
    cache.apply(&[(USER, edge(4, 2, false, 400)), (USER, edge(2, 1, true, 200))], None).await?;
    assert_eq!(list(&cache).await?, Some(vec![2]));
    assert_eq!(cache.count(USER).await?, Some(1));
    assert_eq!(cache.lookup(USER, &[2, 3, 4]).await?, vec![Lookup::Follows(200), Lookup::No, Lookup::No]);
    Ok(())
}

#[tokio::test]
async fn evicting_either_key_makes_the_list_a_miss_never_a_partial_answer() -> anyhow::Result<()> {
    let (cache, keys) = fresh().await?;
    // A read straight after an eviction, before any script saw it, must not answer from what
    // is left: a complete state over an empty set would say "not followed" and "no entries".
    for evicted in [keys.following(USER), keys.following_versions(USER)] {
        for page in [false, true] {
            let nonce = cache.begin_fill(USER).await?.expect("a fill starts");
            assert!(cache.commit_fill(USER, &nonce, &[edge(1, 1, true, 100), edge(2, 1, true, 200)], None).await?);
            del(std::slice::from_ref(&evicted)).await?;
            if page {
                assert_eq!(list(&cache).await?, None, "a first page straight after evicting {evicted}");
            } else {
                assert_eq!(cache.lookup(USER, &[1, 2]).await?, vec![Lookup::Unknown; 2], "a lookup straight after evicting {evicted}");
            }
            del(&[keys.following(USER), keys.following_versions(USER)]).await?;
        }
    }
    for evicted in [keys.following(USER), keys.following_versions(USER)] {
        let nonce = cache.begin_fill(USER).await?.expect("a fill starts");
        assert!(cache.commit_fill(USER, &nonce, &[edge(1, 1, true, 100), edge(2, 1, true, 200)], None).await?);
        del(std::slice::from_ref(&evicted)).await?;
        // An event applied after the eviction must not rebuild a partial list either.
        cache.apply(&[(USER, edge(3, 1, true, 300))], None).await?;
        assert_eq!(list(&cache).await?, None, "after evicting {evicted}");
        assert_eq!(cache.lookup(USER, &[1]).await?, vec![Lookup::Unknown]);
        assert_eq!(cache.count(USER).await?, None);
        assert!(!exists(&keys.following_versions(USER)).await?, "no state is left that could mark a list complete");
        // The next fill starts clean: nothing of the old sorted set leaks into it.
        let nonce = cache.begin_fill(USER).await?.expect("a fill starts");
        assert!(cache.commit_fill(USER, &nonce, &[edge(4, 1, true, 400)], None).await?);
        assert_eq!(list(&cache).await?, Some(vec![4]), "after evicting {evicted} and filling again");
        del(&[keys.following(USER), keys.following_versions(USER)]).await?;
    }
    Ok(())
}

#[tokio::test]
async fn a_fill_whose_marker_was_evicted_or_taken_over_after_its_lease_marks_nothing_complete() -> anyhow::Result<()> {
    let (cache, keys) = fresh().await?;
    let first = cache.begin_fill(USER).await?.expect("a fill starts");
    del(&[keys.following_versions(USER)]).await?;
    assert!(!cache.commit_fill(USER, &first, &[edge(1, 1, true, 100)], None).await?, "the marker was evicted");
    assert_eq!(list(&cache).await?, None);

    let first = cache.begin_fill(USER).await?.expect("a fill starts");
    assert_eq!(cache.begin_fill(USER).await?, None, "no takeover while the first fill's lease runs");
    // The first fill's lease runs out (its instance stopped): the next fill takes over.
    let _: i64 = redis::AsyncCommands::hdel(&mut redis_conn(&cache_redis_url()).await?, keys.following_versions(USER), "_fl").await?;
    let second = cache.begin_fill(USER).await?.expect("a second fill takes over");
    assert!(!cache.commit_fill(USER, &first, &[edge(1, 1, true, 100)], None).await?, "the first fill lost its marker");
    assert_eq!(list(&cache).await?, None);
    assert!(cache.commit_fill(USER, &second, &[edge(1, 1, true, 100), edge(2, 1, true, 100)], None).await?);
    assert_eq!(list(&cache).await?, Some(vec![2, 1]));
    Ok(())
}

#[tokio::test]
async fn pages_follow_the_database_order_through_ties_and_removals() -> anyhow::Result<()> {
    let (cache, _) = fresh().await?;
    // Ten follows at one instant and ids above 255 and 65535, so byte order matters.
    let ids: Vec<i64> = vec![1, 2, 255, 256, 257, 65_535, 65_536, 70_000, 1 << 40, 9];
    let mut rows: Vec<CachedEdge> = ids.iter().map(|&id| edge(id, 1, true, 5_000)).collect();
    rows.push(edge(77, 1, true, 6_000));
    rows.push(edge(78, 1, true, 4_000));
    let nonce = cache.begin_fill(USER).await?.expect("a fill starts");
    assert!(cache.commit_fill(USER, &nonce, &rows, None).await?);
    let mut want: Vec<(i64, i64)> = rows.iter().map(|e| (e.followed_at_ms, e.peer_id)).collect();
    want.sort_by(|a, b| b.cmp(a));
    let want: Vec<i64> = want.into_iter().map(|(_, id)| id).collect();

    let (mut got, mut after, mut removed) = (Vec::new(), None, 0);
    loop {
        let PageRead::Hit(page) = cache.page(USER, after, 3).await? else { panic!("cached") };
        if page.is_empty() {
            break;
        }
        let &(id, ms) = page.last().expect("non-empty");
        got.extend(page.iter().map(|(id, _)| *id));
        // The entry under the cursor is unfollowed between pages: nothing is skipped or repeated.
        removed += cache.apply(&[(USER, edge(id, 2, false, ms))], None).await?;
        after = Some((ms, id));
    }
    assert_eq!(got, want, "followed_at desc, then followee id desc");
    assert_eq!(cache.count(USER).await?, Some(want.len() as i64 - removed as i64));
    Ok(())
}

#[tokio::test]
async fn a_list_marked_too_long_is_neither_filled_nor_applied_to() -> anyhow::Result<()> {
    let (cache, keys) = fresh().await?;
    let nonce = cache.begin_fill(USER).await?.expect("a fill starts");
    cache.apply(&[(USER, edge(1, 1, true, 100))], None).await?;
    cache.mark_too_long(USER).await?;
    assert!(!cache.commit_fill(USER, &nonce, &[edge(1, 1, true, 100)], None).await?, "the fill under way is void");
    assert_eq!(cache.begin_fill(USER).await?, None, "no new fill");
    assert_eq!(cache.apply(&[(USER, edge(2, 1, true, 200))], None).await?, 0, "events skip it");
    assert_eq!(list(&cache).await?, None);
    assert!(!exists(&keys.following(USER)).await?, "no entries are kept");
    Ok(())
}

/// Restriction summaries, filled under memcached-style leases: a fill that read the database
/// before a write is refused once the write deleted the key, a second reader during a fill asks
/// the database, and a lease that expired lets the next reader fill.
#[tokio::test]
async fn a_restriction_summary_read_before_a_write_is_never_stored_after_it() -> anyhow::Result<()> {
    use socialgraph_cache::restrictions::{Held, Kind, RestrictionCache, SummaryRead};
    let (_, keys) = fresh().await?;
    let pool = socialgraph_cache::pool(&cache_redis_url(), 2, Duration::from_secs(5))?;
    let cache = RestrictionCache::new(pool, keys.clone(), Duration::from_secs(600), Duration::from_secs(5));
    let block = Held { kind: Kind::Block, owner: USER, target: 7 };
    let SummaryRead::Lease(stale) = cache.read(USER).await? else { panic!("a missing summary hands out the lease") };
    assert_eq!(cache.read(USER).await?, SummaryRead::Database, "a second reader while a fill runs asks the database");
    // A write commits (USER blocks 7) and deletes the summary, lease included.
    cache.forget(&[USER]).await?;
    assert!(!cache.commit(USER, &stale, Some(&[])).await?, "the fill read before the write: refused");
    let SummaryRead::Lease(fresh_lease) = cache.read(USER).await? else { panic!("the refused fill left no summary") };
    assert!(cache.commit(USER, &fresh_lease, Some(&[block])).await?);
    assert_eq!(cache.read(USER).await?, SummaryRead::Hit(vec![block]));
    assert!(!cache.commit(USER, &fresh_lease, Some(&[])).await?, "a lease is used once");
    // Too many restrictions: remembered as such, and read from the database.
    cache.forget(&[USER]).await?;
    let SummaryRead::Lease(n) = cache.read(USER).await? else { panic!("forgotten") };
    assert!(cache.commit(USER, &n, None).await?);
    assert_eq!(cache.read(USER).await?, SummaryRead::Database);
    // A lease given back is free for the next reader at once.
    cache.forget(&[USER]).await?;
    let SummaryRead::Lease(given_back) = cache.read(USER).await? else { panic!("forgotten") };
    cache.release(USER, &given_back).await?;
    assert!(matches!(cache.read(USER).await?, SummaryRead::Lease(_)), "a released lease is taken by the next read");
    // A lease whose fill died expires, and the next reader fills.
    cache.forget(&[USER]).await?;
    let SummaryRead::Lease(_) = cache.read(USER).await? else { panic!("forgotten") };
    tokio::time::sleep(socialgraph_cache::restrictions::LEASE + Duration::from_millis(100)).await;
    assert!(matches!(cache.read(USER).await?, SummaryRead::Lease(_)), "an expired lease is taken over");
    // A malformed value is dropped, not served.
    let _: () = redis::AsyncCommands::set(&mut redis_conn(&cache_redis_url()).await?, keys.restrictions(USER), "b:1").await?;
    assert_eq!(cache.read(USER).await?, SummaryRead::Database);
    assert!(!exists(&keys.restrictions(USER)).await?, "the malformed summary was deleted");
    Ok(())
}

/// One call carrying several changes of the same edge, in any order, ends at the newest of
/// them, with the member count right (the merge reads every stored version at once, so it must
/// also order the changes within the call).
#[tokio::test]
async fn several_changes_of_one_edge_in_one_call_end_at_the_newest() -> anyhow::Result<()> {
    let (cache, _) = fresh().await?;
    let nonce = cache.begin_fill(USER).await?.expect("a fill starts");
    assert!(cache.commit_fill(USER, &nonce, &[edge(1, 1, true, 100), edge(2, 1, true, 200)], None).await?);
    // 1: v3 unfollowed, then a late copy of v2 followed; 3: followed twice (v1, v2, newer time).
    let changes = [(USER, edge(1, 3, false, 100)), (USER, edge(1, 2, true, 100)), (USER, edge(3, 1, true, 300)), (USER, edge(3, 2, true, 400))];
    assert_eq!(cache.apply(&changes, None).await?, 2, "two members changed");
    assert_eq!(cache.page(USER, None, 10).await?, PageRead::Hit(vec![(3, 400), (2, 200)]));
    assert_eq!(cache.count(USER).await?, Some(2), "the member count follows the set");
    Ok(())
}

#[tokio::test]
async fn a_set_started_by_an_event_expires_with_its_hash() -> anyhow::Result<()> {
    let (cache, keys) = fresh().await?;
    let nonce = cache.begin_fill(USER).await?.expect("a fill starts");
    assert!(cache.commit_fill(USER, &nonce, &[], None).await?, "an empty list is cached whole");
    cache.apply(&[(USER, edge(5, 1, true, 500))], None).await?;
    assert_eq!(list(&cache).await?, Some(vec![5]));
    let [set, versions, _] = keys.list(true, USER);
    let mut conn = redis_conn(&cache_redis_url()).await?;
    let (set_ttl, hash_ttl): (i64, i64) = redis::pipe().pttl(&set).pttl(&versions).query_async(&mut conn).await?;
    assert!(set_ttl > 0 && (set_ttl - hash_ttl).abs() < 1000, "the set expires with its hash: {set_ttl} ms, hash {hash_ttl} ms");
    Ok(())
}

#[tokio::test]
async fn a_join_of_two_whole_lists_is_their_intersection_in_the_first_lists_order_and_nothing_else_answers() -> anyhow::Result<()> {
    let (cache, keys) = fresh().await?;
    let (other, windowed) = (USER + 1, USER + 2);
    let fill = |user: i64, edges: Vec<CachedEdge>, boundary: Option<(i64, i64)>| {
        let cache = cache.clone();
        async move {
            let nonce = cache.begin_fill(user).await?.expect("a fill starts");
            anyhow::ensure!(cache.commit_fill(user, &nonce, &edges, boundary).await?, "the fill of {user} committed");
            anyhow::Ok(())
        }
    };
    assert_eq!(cache.intersect(USER, &cache, other, None, 10).await?, None, "neither list is cached");
    // USER follows 1-5 (3 and 4 at the same time) and unfollowed 6.
    let mine = vec![edge(1, 1, true, 100), edge(2, 1, true, 200), edge(3, 1, true, 300), edge(4, 1, true, 300), edge(5, 1, true, 500)];
    fill(USER, [mine, vec![edge(6, 2, false, 600)]].concat(), None).await?;
    assert_eq!(cache.intersect(USER, &cache, other, None, 10).await?, None, "the other list is not cached");
    fill(other, vec![edge(2, 1, true, 5), edge(3, 1, true, 6), edge(4, 1, true, 7), edge(6, 1, true, 8), edge(9, 1, true, 9)], None).await?;
    assert_eq!(
        cache.intersect(USER, &cache, other, None, 10).await?,
        Some(vec![(4, 300), (3, 300), (2, 200)]),
        "both follow 2, 3 and 4: the first list's followed_at desc, then id desc; 6 is unfollowed on the first side"
    );
    assert_eq!(cache.intersect(USER, &cache, other, Some((300, 4)), 1).await?, Some(vec![(3, 300)]), "strictly after the cursor, cut at the limit");
    assert_eq!(cache.intersect(other, &cache, USER, None, 10).await?, Some(vec![(4, 7), (3, 6), (2, 5)]), "in the other's order");
    cache.apply(&[(other, edge(3, 2, false, 6))], None).await?;
    assert_eq!(cache.intersect(USER, &cache, other, None, 10).await?, Some(vec![(4, 300), (2, 200)]), "an unfollow on either side shows");
    // A window (a list longer than the cache keeps) cannot say what it does not hold.
    fill(windowed, vec![edge(4, 1, true, 900)], Some((800, 2))).await?;
    assert_eq!(cache.intersect(USER, &cache, windowed, None, 10).await?, None, "a window on one side");
    // Two lists longer than JOIN_MAX are not joined in Redis; one short side is enough.
    let (long_a, long_b) = (USER + 3, USER + 4);
    let long = |from: i64| (from..from + JOIN_MAX as i64 + 1).map(|p| edge(p, 1, true, p)).collect::<Vec<_>>();
    fill(long_a, long(1), None).await?;
    fill(long_b, long(2), None).await?;
    assert_eq!(cache.intersect(long_a, &cache, long_b, None, 10).await?, None, "both longer than JOIN_MAX");
    let both = cache.intersect(USER, &cache, long_a, None, 10).await?;
    assert_eq!(both, Some(vec![(5, 500), (4, 300), (3, 300), (2, 200), (1, 100)]), "a short list against a long one");
    // One key of a list evicted: no answer from what is left.
    for evicted in [keys.following(other), keys.following_versions(other)] {
        del(std::slice::from_ref(&evicted)).await?;
        assert_eq!(cache.intersect(USER, &cache, other, None, 10).await?, None, "after evicting {evicted}");
        del(&[keys.following(other), keys.following_versions(other)]).await?;
        fill(other, vec![edge(2, 1, true, 5)], None).await?;
        assert_eq!(cache.intersect(USER, &cache, other, None, 10).await?, Some(vec![(2, 200)]), "filled again after evicting {evicted}");
    }
    Ok(())
}
