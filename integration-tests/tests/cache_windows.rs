//! The list caches' windows and follower-relationship hashes on the real cache Redis: trimming
//! to the newest entries, the boundary a fill sets, late copies of old follows after a fill,
//! relationship entries kept by events and filled by reads, and the applied-batch marks.

use std::time::Duration;

use socialgraph_cache::keys::Keys;
use socialgraph_cache::lists::{AppliedMark, CachedEdge, Direction, Limits, ListCache, Lookup, PageRead};
use socialgraph_integration_tests::redis_conn;
use socialgraph_testkit::{cache_redis_url, unique};

const USER: i64 = 7;

fn edge(peer_id: i64, version: i64, following: bool, followed_at_ms: i64) -> CachedEdge {
    CachedEdge { peer_id, version, following, followed_at_ms }
}

/// A follower cache with a window of `window` under a fresh prefix.
async fn fresh(window: usize, relationship_max: usize) -> anyhow::Result<(ListCache, Keys)> {
    let url = cache_redis_url();
    redis_conn(&url).await.map_err(|e| anyhow::anyhow!("the cache Redis at {url} is not reachable ({e}): run `make deps`"))?;
    let keys = Keys::new(unique("cw") + ":");
    let pool = socialgraph_cache::pool(&url, 2, Duration::from_secs(5))?;
    let limits = Limits { window, relationship_max, ttl: Duration::from_secs(600), timeout: Duration::from_secs(5) };
    Ok((ListCache::new(pool, keys.clone(), Direction::Followers, limits), keys))
}

fn ids(read: PageRead) -> (Vec<i64>, bool) {
    match read {
        PageRead::Hit(v) => (v.into_iter().map(|e| e.0).collect(), false),
        PageRead::PastWindow(v) => (v.into_iter().map(|e| e.0).collect(), true),
        PageRead::Miss => panic!("the list is cached"),
    }
}

#[tokio::test]
async fn a_window_keeps_the_newest_entries_and_sends_pages_past_it_to_the_database() -> anyhow::Result<()> {
    let (cache, _) = fresh(3, 100).await?;
    let nonce = cache.begin_fill(USER).await?.expect("a fill starts");
    // The database read: the newest three of five, the fourth as the boundary.
    let read = [edge(5, 1, true, 500), edge(4, 1, true, 400), edge(3, 1, true, 300)];
    assert!(cache.commit_fill(USER, &nonce, &read, Some((200, 2))).await?);
    assert_eq!(ids(cache.page(USER, None, 3).await?), (vec![5, 4, 3], false));
    assert_eq!(ids(cache.page(USER, None, 4).await?), (vec![5, 4, 3], true), "a fourth entry is past the window");
    assert_eq!(ids(cache.page(USER, Some((400, 4)), 1).await?), (vec![3], false));
    assert_eq!(ids(cache.page(USER, Some((300, 3)), 1).await?), (vec![], true));
    assert_eq!(cache.count(USER).await?, None, "a window does not know the whole count");
    assert_eq!(cache.lookup(USER, &[4, 2, 9]).await?, vec![Lookup::Follows(400), Lookup::Unknown, Lookup::Unknown]);

    // A new follower pushes the oldest out; the window still holds everything newer.
    cache.apply(&[(USER, edge(6, 1, true, 600))], None).await?;
    assert_eq!(ids(cache.page(USER, None, 10).await?), (vec![6, 5, 4], true));
    // An unfollow inside shrinks it; a follow restored with an old time stays outside.
    cache.apply(&[(USER, edge(5, 2, false, 500)), (USER, edge(1, 3, true, 100))], None).await?;
    assert_eq!(ids(cache.page(USER, None, 10).await?), (vec![6, 4], true));
    assert_eq!(cache.lookup(USER, &[5, 1]).await?, vec![Lookup::Unknown, Lookup::Unknown], "outside the window: ask the database");
    // Re-follow: a new time puts it back on top; the late copy of the unfollow changes nothing.
    cache.apply(&[(USER, edge(5, 3, true, 700)), (USER, edge(5, 2, false, 500))], None).await?;
    assert_eq!(ids(cache.page(USER, None, 10).await?), (vec![5, 6, 4], true));
    Ok(())
}

#[tokio::test]
async fn a_fill_drops_what_landed_below_its_boundary_and_stops_late_copies_of_old_follows() -> anyhow::Result<()> {
    let (cache, _) = fresh(2, 100).await?;
    let nonce = cache.begin_fill(USER).await?.expect("a fill starts");
    // During the fill: an old follow restored (time 100) and a new one (time 900).
    cache.apply(&[(USER, edge(1, 4, true, 100)), (USER, edge(9, 1, true, 900))], None).await?;
    // The read: 5 and 4 newest, 3 the boundary; 8 was unfollowed at version 2 after the boundary.
    let read = [edge(5, 1, true, 500), edge(4, 1, true, 400), edge(8, 2, false, 800)];
    assert!(cache.commit_fill(USER, &nonce, &read, Some((300, 3))).await?);
    assert_eq!(ids(cache.page(USER, None, 10).await?), (vec![9, 5], true), "1 is below the boundary, 4 trimmed by 9");
    // A copy of 8's old follow arrives after the fill: its tombstone from the read stops it.
    assert_eq!(cache.apply(&[(USER, edge(8, 1, true, 800))], None).await?, 0);
    assert_eq!(ids(cache.page(USER, None, 10).await?), (vec![9, 5], true));
    Ok(())
}

#[tokio::test]
async fn a_batch_of_many_changes_to_a_small_list_keeps_only_the_newer_versions() -> anyhow::Result<()> {
    // 200 entries at version 2: the versions hash is a listpack, which the script reads whole
    // for a batch of more than 50 changes. 60 unfollows: the even ones at version 3 (newer),
    // the odd ones at version 1 (late copies of older changes).
    let (cache, _) = fresh(1_000, 10).await?;
    let nonce = cache.begin_fill(USER).await?.expect("a fill starts");
    let read: Vec<CachedEdge> = (1..=200).map(|i| edge(i, 2, true, i)).collect();
    assert!(cache.commit_fill(USER, &nonce, &read, None).await?);
    let batch: Vec<(i64, CachedEdge)> = (1..=60).map(|i| (USER, edge(i, if i % 2 == 0 { 3 } else { 1 }, false, i))).collect();
    assert_eq!(cache.apply(&batch, None).await?, 30, "only the newer half changes the list");
    let expect: Vec<i64> = (1..=200).rev().filter(|i| *i > 60 || i % 2 == 1).collect();
    assert_eq!(ids(cache.page(USER, None, 500).await?), (expect, false));
    Ok(())
}

#[tokio::test]
async fn a_read_fills_only_the_pending_marks_it_set_itself() -> anyhow::Result<()> {
    let (cache, keys) = fresh(2, 100).await?;
    // Reader 1 marks 10 and reads the database before a follow of 10 commits.
    let (_, first) = cache.lookup_marking(USER, &[10], None).await?;
    // The hash goes (evicted, flushed, or dropped past its maximum); the follow's event then
    // finds nothing to update; reader 2 marks 10 again.
    let _: i64 = redis::AsyncCommands::del(&mut redis_conn(&cache_redis_url()).await?, &keys.list(false, USER)[2]).await?;
    cache.apply(&[(USER, edge(10, 1, true, 1_000))], None).await?;
    let (looked, second) = cache.lookup_marking(USER, &[10], None).await?;
    assert_eq!(looked, vec![Lookup::Unknown]);
    // Reader 1's older answer lands on reader 2's mark: it is not taken.
    cache.fill_relationships(USER, &first, &[edge(10, 0, false, 0)]).await?;
    assert_eq!(cache.lookup(USER, &[10]).await?, vec![Lookup::Unknown], "a read fills no mark of a later reader");
    cache.fill_relationships(USER, &second, &[edge(10, 1, true, 1_000)]).await?;
    assert_eq!(cache.lookup(USER, &[10]).await?, vec![Lookup::Follows(1_000)]);
    // An older answer never replaces a newer version, whoever marked it.
    cache.fill_relationships(USER, &first, &[edge(10, 0, false, 0)]).await?;
    assert_eq!(cache.lookup(USER, &[10]).await?, vec![Lookup::Follows(1_000)]);
    Ok(())
}

#[tokio::test]
async fn a_partition_position_only_grows() -> anyhow::Result<()> {
    let (cache, _) = fresh(2, 3).await?;
    // The cache's keys have a prefix of their own (`fresh`).
    let key = "projection/topic".to_owned();
    let mark = |next_offset| Some(AppliedMark { key: &key, partition: 0, next_offset });
    cache.apply(&[], mark(40)).await?;
    cache.apply(&[], mark(12)).await?;
    assert_eq!(cache.applied(&key).await?, [(0, 40)].into(), "a late or repeated older position changes nothing");
    cache.apply(&[], mark(41)).await?;
    assert_eq!(cache.applied(&key).await?, [(0, 41)].into());
    Ok(())
}

#[tokio::test]
async fn relationship_entries_are_kept_by_events_and_never_overwritten_by_an_older_read() -> anyhow::Result<()> {
    let (cache, keys) = fresh(2, 3).await?;
    let nonce = cache.begin_fill(USER).await?.expect("a fill starts");
    assert!(cache.commit_fill(USER, &nonce, &[edge(50, 1, true, 5_000), edge(40, 1, true, 4_000)], Some((3_000, 30))).await?);
    // 10 and 20 are outside the window: unknown, and marked while the database is read.
    let (looked, marks) = cache.lookup_marking(USER, &[50, 10, 20], None).await?;
    assert_eq!(looked, vec![Lookup::Follows(5_000), Lookup::Unknown, Lookup::Unknown]);
    // The hash is a hashtable from its first mark: a lookup of many candidates in a listpack
    // would scan it once per candidate.
    let encoding: String =
        redis::cmd("OBJECT").arg("ENCODING").arg(&keys.list(false, USER)[2]).query_async(&mut redis_conn(&cache_redis_url()).await?).await?;
    assert_eq!(encoding, "hashtable");
    // An event for 20 lands between the mark and the read's answer (which predates it).
    cache.apply(&[(USER, edge(20, 3, false, 2_000))], None).await?;
    cache.fill_relationships(USER, &marks, &[edge(10, 1, true, 1_000), edge(20, 2, true, 2_000)]).await?;
    assert_eq!(cache.lookup(USER, &[10, 20]).await?, vec![Lookup::Follows(1_000), Lookup::No], "the event's newer version wins");
    // A candidate with no edge at all is remembered as a miss, until a follow event comes.
    let (looked, marks) = cache.lookup_marking(USER, &[11], None).await?;
    assert_eq!(looked, vec![Lookup::Unknown]);
    cache.fill_relationships(USER, &marks, &[edge(11, 0, false, 0)]).await?;
    assert_eq!(cache.lookup(USER, &[11]).await?, vec![Lookup::No]);
    cache.apply(&[(USER, edge(11, 1, true, 1_100))], None).await?;
    assert_eq!(cache.lookup(USER, &[11]).await?, vec![Lookup::Follows(1_100)]);
    // Past relationship_max entries the hash is dropped, never grown.
    let (looked, marks) = cache.lookup_marking(USER, &[12], None).await?;
    assert_eq!(looked, vec![Lookup::Unknown]);
    cache.fill_relationships(USER, &marks, &[edge(12, 0, false, 0)]).await?;
    let exists: bool = redis::AsyncCommands::exists(&mut redis_conn(&cache_redis_url()).await?, &keys.list(false, USER)[2]).await?;
    assert!(!exists, "four entries are over the maximum of three");
    assert_eq!(cache.lookup(USER, &[10]).await?, vec![Lookup::Unknown]);
    Ok(())
}

#[tokio::test]
async fn a_batch_records_its_position_before_its_changes() -> anyhow::Result<()> {
    let (cache, _) = fresh(10, 10).await?;
    let key = unique("consumer/topic");
    assert!(cache.applied(&key).await?.is_empty());
    cache.apply(&[], Some(AppliedMark { key: &key, partition: 2, next_offset: 40 })).await?;
    cache.apply(&[(USER, edge(1, 1, true, 1))], Some(AppliedMark { key: &key, partition: 0, next_offset: 7 })).await?;
    let applied = cache.applied(&key).await?;
    assert_eq!((applied.get(&0), applied.get(&2), applied.len()), (Some(&7), Some(&40), 2));
    Ok(())
}

#[tokio::test]
async fn fills_and_batches_larger_than_one_part_arrive_whole() -> anyhow::Result<()> {
    let n = 2 * socialgraph_cache::lists::CHUNK as i64 + 500;
    // The fill fits the window; the batch's result (n / 2 + n entries) does not.
    let window = n as usize * 5 / 4;
    let (cache, _) = fresh(window, 10).await?;
    let nonce = cache.begin_fill(USER).await?.expect("a fill starts");
    let read: Vec<CachedEdge> = (1..=n).map(|i| edge(i, 1, true, i)).collect();
    assert!(cache.commit_fill(USER, &nonce, &read, None).await?);
    assert_eq!(ids(cache.page(USER, None, 5_000).await?), ((1..=n).rev().collect(), false));
    // One batch unfollows every even one and adds n more: the window keeps the newest.
    let mut batch: Vec<(i64, CachedEdge)> = (2..=n).step_by(2).map(|i| (USER, edge(i, 2, false, i))).collect();
    batch.extend((n + 1..=2 * n).map(|i| (USER, edge(i, 1, true, i))));
    cache.apply(&batch, None).await?;
    let (got, past) = ids(cache.page(USER, None, 5_000).await?);
    assert!(past, "more than the window");
    assert_eq!(got, (n + 1..=2 * n).rev().chain((1..=n).rev().filter(|i| i % 2 == 1)).take(window).collect::<Vec<_>>());
    Ok(())
}

#[tokio::test]
async fn a_lookup_of_more_members_than_one_slice_answers_each_in_order() -> anyhow::Result<()> {
    // The script reads members in slices of 4,000 (Lua's stack): 9,000 candidates, repeats
    // included, cross two slice boundaries in the window and in the relationship hash.
    lookups_answer_each_in_order(3_000, 4_000, 2_001, (0..9_000).map(|i| 9_000 - i % 8_500).collect()).await
}

#[tokio::test]
async fn a_lookup_of_many_members_in_small_collections_answers_each_in_order() -> anyhow::Result<()> {
    // A window of 100 is small enough to be a listpack, which the script reads whole for more
    // than 50 members (the relationship hash of about 150 entries is a hashtable): 300
    // candidates, repeats included, below the boundary, inside the window and past the newest
    // entry.
    lookups_answer_each_in_order(100, 120, 40, (0..300).map(|i| 260 - i % 250).collect()).await
}

/// Fills a window of `window` from the even ids 2..=2 × `read` with the boundary at
/// `boundary` (only the even ids above it stay), looks `candidates` up marking the unknown
/// ones, remembers every third of those as followed, and looks them up again: each answer, in
/// candidate order, from the window, the relationship hash, or unknown.
async fn lookups_answer_each_in_order(window: usize, read: i64, boundary: i64, candidates: Vec<i64>) -> anyhow::Result<()> {
    let (cache, _) = fresh(window, 20_000).await?;
    let nonce = cache.begin_fill(USER).await?.expect("a fill starts");
    let edges: Vec<CachedEdge> = (1..=read).map(|i| edge(2 * i, 1, true, 2 * i)).collect();
    assert!(cache.commit_fill(USER, &nonce, &edges, Some((boundary, 1))).await?);
    let expect = |c: i64, remembered: bool| match c {
        c if c % 2 == 0 && c > boundary && c <= 2 * read => Lookup::Follows(c),
        c if remembered && c % 3 == 0 => Lookup::Follows(c * 10),
        _ if remembered => Lookup::No,
        _ => Lookup::Unknown,
    };
    let (first, marks) = cache.lookup_marking(USER, &candidates, None).await?;
    assert_eq!(first, candidates.iter().map(|&c| expect(c, false)).collect::<Vec<_>>());
    let mut unknown: Vec<i64> = candidates.iter().zip(&first).filter(|(_, l)| **l == Lookup::Unknown).map(|(c, _)| *c).collect();
    unknown.sort_unstable();
    unknown.dedup();
    let answers: Vec<CachedEdge> = unknown.iter().map(|&c| if c % 3 == 0 { edge(c, 1, true, c * 10) } else { edge(c, 0, false, 0) }).collect();
    cache.fill_relationships(USER, &marks, &answers).await?;
    let second = cache.lookup(USER, &candidates).await?;
    assert_eq!(second, candidates.iter().map(|&c| expect(c, true)).collect::<Vec<_>>(), "every marked candidate was remembered");
    Ok(())
}
