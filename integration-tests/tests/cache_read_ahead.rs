//! GetRelationship's and BatchGetRelationships' three cache reads in one transaction
//! (`ListCaches::relationships_read`) on the real cache Redis: whatever state the following
//! list, the follower window with its relationship hash and the restriction summary are in,
//! the reads that go on from it answer what the three reads alone answer.

use std::time::Duration;

use socialgraph_cache::keys::Keys;
use socialgraph_cache::lists::{CachedEdge, Direction, Limits, ListCache, ListCaches, Lookup};
use socialgraph_cache::restrictions::{Held, Kind, RestrictionCache, SummaryRead};
use socialgraph_integration_tests::redis_conn;
use socialgraph_testkit::{cache_redis_url, unique};

const USER: i64 = 11;
/// Asked of every state: members of both lists, peers the hash knows (with and without an
/// edge), one pending in the hash, one nobody knows, and one asked twice.
const OTHERS: [i64; 9] = [1, 2, 3, 4, 5, 6, 7, 8, 2];

/// What state a cached list is left in.
#[derive(Debug, Clone, Copy)]
enum List {
    Absent,
    Complete,
    /// A window of 3 of more entries (state `w`).
    Window,
    /// Complete, then its sorted set evicted (set and hash disagree).
    Evicted,
    /// A fill begun and not committed.
    Filling,
}

#[derive(Debug, Clone, Copy)]
enum Summary {
    Absent,
    Held,
    TooMany,
    Leased,
}

fn edge(peer_id: i64, version: i64, following: bool, followed_at_ms: i64) -> CachedEdge {
    CachedEdge { peer_id, version, following, followed_at_ms }
}

/// Caches of one cache Redis under a fresh prefix, every list with a window of 3.
fn caches(url: &str) -> anyhow::Result<(ListCaches, Keys)> {
    let keys = Keys::new(unique("ra") + ":");
    let pool = socialgraph_cache::pool(url, 2, Duration::from_secs(5))?;
    let limits = Limits { window: 3, relationship_max: 100, ttl: Duration::from_secs(600), timeout: Duration::from_secs(5) };
    let list = |direction| ListCache::new(pool.clone(), keys.clone(), direction, limits);
    let restrictions = RestrictionCache::new(pool.clone(), keys.clone(), Duration::from_secs(600), Duration::from_secs(5));
    Ok((
        ListCaches { following: list(Direction::Following), followers: list(Direction::Followers), restrictions, posts: list(Direction::Posts) },
        keys,
    ))
}

/// Leaves `cache`'s list of USER (sorted set `set`) in `state`; a follower list (`followers`)
/// also gets relationship hash entries.
async fn leave(cache: &ListCache, set: String, state: List, followers: bool) -> anyhow::Result<()> {
    let whole = [edge(1, 1, true, 100), edge(3, 2, true, 300), edge(4, 1, true, 400)];
    let newest = [edge(1, 1, true, 500), edge(3, 2, true, 300), edge(4, 1, true, 400)];
    match state {
        List::Absent => {}
        List::Complete | List::Evicted => {
            let nonce = cache.begin_fill(USER).await?.expect("a fill starts");
            assert!(cache.commit_fill(USER, &nonce, &whole, None).await?);
        }
        List::Window => {
            let nonce = cache.begin_fill(USER).await?.expect("a fill starts");
            assert!(cache.commit_fill(USER, &nonce, &newest, Some((200, 9))).await?);
        }
        List::Filling => {
            cache.begin_fill(USER).await?.expect("a fill starts");
        }
    }
    if followers {
        // The relationship hash: 5 follows, 6 does not (both read from the database), 7 pending.
        let (_, marks) = cache.lookup_marking(USER, &[5, 6], None).await?;
        cache.fill_relationships(USER, &marks, &[edge(5, 3, true, 50), edge(6, 0, false, 0)]).await?;
        cache.lookup_marking(USER, &[7], None).await?;
    }
    if let List::Evicted = state {
        let _: i64 = redis::AsyncCommands::del(&mut redis_conn(&cache_redis_url()).await?, set).await?;
    }
    Ok(())
}

async fn build(url: &str, following: List, followers: List, summary: Summary) -> anyhow::Result<ListCaches> {
    let (c, keys) = caches(url)?;
    leave(&c.following, keys.following(USER), following, false).await?;
    leave(&c.followers, keys.followers(USER), followers, true).await?;
    match summary {
        Summary::Absent => {}
        Summary::Held | Summary::TooMany => {
            let SummaryRead::Lease(nonce) = c.restrictions.read(USER).await? else { panic!("a missing summary hands out the lease") };
            let held = [Held { kind: Kind::Block, owner: USER, target: 2 }, Held { kind: Kind::Mute, owner: 8, target: USER }];
            assert!(c.restrictions.commit(USER, &nonce, matches!(summary, Summary::Held).then_some(&held[..])).await?);
        }
        Summary::Leased => {
            c.restrictions.read(USER).await?;
        }
    }
    Ok(c)
}

/// The restriction read with the lease's nonce left out (every lease has its own).
fn kind(read: SummaryRead) -> SummaryRead {
    match read {
        SummaryRead::Lease(_) => SummaryRead::Lease(String::new()),
        other => other,
    }
}

#[tokio::test]
async fn one_transaction_answers_what_the_three_reads_answer_in_every_state() -> anyhow::Result<()> {
    let url = cache_redis_url();
    redis_conn(&url).await.map_err(|e| anyhow::anyhow!("the cache Redis at {url} is not reachable ({e}): run `make deps`"))?;
    let lists = [List::Absent, List::Complete, List::Window, List::Evicted, List::Filling];
    let summaries = [Summary::Absent, Summary::Held, Summary::TooMany, Summary::Leased];
    let mut cases = 0;
    for (i, following) in lists.iter().enumerate() {
        for (j, followers) in lists.iter().enumerate() {
            let summary = summaries[(i + j) % summaries.len()];
            let case = format!("following {following:?}, followers {followers:?}, summary {summary:?}");
            let ahead = build(&url, *following, *followers, summary).await?;
            let read = ahead.relationships_read(USER, &OTHERS).await?.expect("a single Redis reads ahead");
            let one = (
                ahead.following.lookup_ahead(USER, &OTHERS, read.following).await?,
                ahead.followers.lookup_marking_ahead(USER, &OTHERS, read.followers).await?.0,
                kind(read.restrictions),
            );
            let alone = build(&url, *following, *followers, summary).await?;
            let three = (
                alone.following.lookup(USER, &OTHERS).await?,
                alone.followers.lookup_marking(USER, &OTHERS, None).await?.0,
                kind(alone.restrictions.read(USER).await?),
            );
            assert_eq!(one, three, "{case}");
            // What the states mean, so that equal answers are also right ones.
            let (f, w) = (&one.0, &one.1);
            match following {
                List::Complete => {
                    assert_eq!(f[..5], [Lookup::Follows(100), Lookup::No, Lookup::Follows(300), Lookup::Follows(400), Lookup::No], "{case}")
                }
                List::Window => assert_eq!(f[..3], [Lookup::Follows(500), Lookup::Unknown, Lookup::Follows(300)], "{case}"),
                _ => assert!(f.iter().all(|l| *l == Lookup::Unknown), "{case}: nothing cached answers {f:?}"),
            }
            match followers {
                List::Complete => assert!(
                    w[..8] == [1, 2, 3, 4, 5, 6, 7, 8].map(|p| if [1, 3, 4].contains(&p) { Lookup::Follows(p * 100) } else { Lookup::No }),
                    "{case}: {w:?}"
                ),
                List::Absent | List::Window | List::Filling => {
                    assert_eq!(
                        w[4..8],
                        [Lookup::Follows(50), Lookup::No, Lookup::Unknown, Lookup::Unknown],
                        "{case}: the hash answers past the window"
                    )
                }
                List::Evicted => {}
            }
            let expected = match summary {
                Summary::Absent => SummaryRead::Lease(String::new()),
                Summary::Held => {
                    SummaryRead::Hit(vec![Held { kind: Kind::Block, owner: USER, target: 2 }, Held { kind: Kind::Mute, owner: 8, target: USER }])
                }
                Summary::TooMany | Summary::Leased => SummaryRead::Database,
            };
            assert_eq!(one.2, expected, "{case}");
            cases += 1;
        }
    }
    assert_eq!(cases, 25);
    Ok(())
}

#[tokio::test]
async fn no_members_read_nothing_ahead() -> anyhow::Result<()> {
    let url = cache_redis_url();
    redis_conn(&url).await.map_err(|e| anyhow::anyhow!("the cache Redis at {url} is not reachable ({e}): run `make deps`"))?;
    let c = build(&url, List::Complete, List::Complete, Summary::Held).await?;
    assert!(c.relationships_read(USER, &[]).await?.is_none(), "each part asks itself, as it does for no members");
    Ok(())
}
