//! Checks of the list caches against the source of truth, read straight from the cache Redis
//! (not through the services, which would fill a missing list from the database).

use std::collections::BTreeMap;

use socialgraph_cache::keys::Keys;
use socialgraph_domain::{Edge, EdgeState};

use crate::{TestDb, redis_conn};

/// One cached list as the cache Redis holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedList {
    /// (peer, followed_at ms) in list order.
    pub entries: Vec<(i64, i64)>,
    /// The window's boundary (followed_at ms, peer): every followed entry newer than it is
    /// cached; `None` when the whole list is.
    pub boundary: Option<(i64, i64)>,
}

fn id(m: &[u8]) -> i64 {
    i64::from_be_bytes(m.try_into().expect("8-byte member"))
}

/// `user_id`'s cached list (`following`: its following list, else its followers), when it is
/// served (state `c` or `w`, both keys present and agreeing); `None` otherwise.
///
/// # Errors
/// The cache Redis is not reachable (run `make deps`).
pub async fn cached_list(url: &str, prefix: &str, following: bool, user_id: i64) -> anyhow::Result<Option<CachedList>> {
    cached_set(url, Keys::new(prefix).list(following, user_id)).await
}

/// `author_id`'s cached post list (entries: post id, created_at ms), as [`cached_list`].
///
/// # Errors
/// The cache Redis is not reachable (run `make deps`).
pub async fn cached_posts(url: &str, prefix: &str, author_id: i64) -> anyhow::Result<Option<CachedList>> {
    cached_set(url, Keys::list_of(Keys::new(prefix).posts(author_id))).await
}

async fn cached_set(url: &str, [set, versions, _]: [String; 3]) -> anyhow::Result<Option<CachedList>> {
    let mut conn = redis_conn(url).await?;
    let (state, n, bs, bm): (Option<String>, Option<i64>, Option<f64>, Option<Vec<u8>>) =
        redis::cmd("HMGET").arg(&versions).arg("_s").arg("_n").arg("_bs").arg("_bm").query_async(&mut conn).await?;
    let boundary = match state.as_deref() {
        Some("c") => None,
        Some("w") => Some((bs.expect("a window has a boundary score") as i64, id(&bm.expect("a window has a boundary member")))),
        _ => return Ok(None),
    };
    let members: Vec<(Vec<u8>, f64)> = redis::cmd("ZREVRANGE").arg(&set).arg(0).arg(-1).arg("WITHSCORES").query_async(&mut conn).await?;
    if Some(members.len() as i64) != n {
        return Ok(None);
    }
    Ok(Some(CachedList { entries: members.into_iter().map(|(m, ms)| (id(&m), ms as i64)).collect(), boundary }))
}

/// `user_id`'s cached following list when the whole list is cached.
///
/// # Errors
/// The cache Redis is not reachable (run `make deps`).
pub async fn cached_following(url: &str, prefix: &str, user_id: i64) -> anyhow::Result<Option<Vec<(i64, i64)>>> {
    Ok(cached_list(url, prefix, true, user_id).await?.filter(|l| l.boundary.is_none()).map(|l| l.entries))
}

/// The lists of `users` per the `following` table, in list order: their following lists
/// (`following`) or their follower lists.
///
/// # Errors
/// The database failed.
pub async fn table_lists(db: &TestDb, following: bool, users: &[i64]) -> anyhow::Result<BTreeMap<i64, Vec<(i64, i64)>>> {
    let (rows, _) = crate::both_tables(db).await?;
    let mut lists: BTreeMap<i64, Vec<(i64, i64)>> = users.iter().map(|u| (*u, Vec::new())).collect();
    for Edge { follower_id, followee_id, state, followed_at_ms, .. } in rows {
        let (owner, peer) = if following { (follower_id, followee_id) } else { (followee_id, follower_id) };
        if state == EdgeState::Following
            && let Some(l) = lists.get_mut(&owner)
        {
            l.push((peer, followed_at_ms));
        }
    }
    for l in lists.values_mut() {
        l.sort_by_key(|e| std::cmp::Reverse((e.1, e.0)));
    }
    Ok(lists)
}

/// The following lists of `users` per the `following` table, in list order.
///
/// # Errors
/// The database failed.
pub async fn following_lists(db: &TestDb, users: &[i64]) -> anyhow::Result<BTreeMap<i64, Vec<(i64, i64)>>> {
    table_lists(db, true, users).await
}

/// Asserts that every served list of `users` in one direction equals the table: the whole
/// list, or for a window every entry newer than its boundary; returns how many were cached.
/// Call it once the events are applied (lag 0).
///
/// # Errors
/// The cache Redis or the database failed; a difference panics with both sides.
pub async fn assert_cached_exact(db: &TestDb, url: &str, prefix: &str, following: bool, users: &[i64]) -> anyhow::Result<usize> {
    let truth = table_lists(db, following, users).await?;
    let what = if following { "following list" } else { "follower window" };
    let mut cached = 0;
    for (user, list) in &truth {
        if let Some(c) = cached_list(url, prefix, following, *user).await? {
            let want: Vec<(i64, i64)> = match c.boundary {
                None => list.clone(),
                Some(b) => list.iter().copied().filter(|e| (e.1, e.0) > b).collect(),
            };
            assert_eq!(c.entries, want, "cached {what} of {user} (boundary {:?}) equals the following table", c.boundary);
            cached += 1;
        }
    }
    Ok(cached)
}

/// [`assert_cached_exact`] of the following lists.
///
/// # Errors
/// As [`assert_cached_exact`].
pub async fn assert_cached_following_exact(db: &TestDb, url: &str, prefix: &str, users: &[i64]) -> anyhow::Result<usize> {
    assert_cached_exact(db, url, prefix, true, users).await
}

/// Deletes every cache key under `prefix` (a flush of one mesh's cache, positions included).
///
/// # Errors
/// The cache Redis failed.
pub async fn flush_prefix(conn: &mut socialgraph_cache::Conn, prefix: &str) -> anyhow::Result<()> {
    let keys: Vec<Vec<u8>> = redis::cmd("KEYS").arg(format!("{prefix}*")).query_async(conn).await?;
    if !keys.is_empty() {
        let _: i64 = redis::cmd("DEL").arg(keys).query_async(conn).await?;
    }
    Ok(())
}
