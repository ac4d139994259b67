//! Checks of the following-list cache against the source of truth, read straight from the
//! cache Redis (not through the service, which would fill a missing list from the database).

use std::collections::BTreeMap;

use socialgraph_cache::keys::Keys;
use socialgraph_domain::{Edge, EdgeState};

use crate::{TestDb, redis_conn};

/// `user_id`'s cached following list as (followee, followed_at ms) in list order, when it is
/// cached and complete (both keys present and agreeing); `None` otherwise.
///
/// # Errors
/// The cache Redis is not reachable (run `make deps`).
pub async fn cached_following(url: &str, prefix: &str, user_id: i64) -> anyhow::Result<Option<Vec<(i64, i64)>>> {
    let keys = Keys::new(prefix);
    let mut conn = redis_conn(url).await?;
    let (state, n): (Option<String>, Option<i64>) =
        redis::cmd("HMGET").arg(keys.following_versions(user_id)).arg("_s").arg("_n").query_async(&mut conn).await?;
    if state.as_deref() != Some("c") {
        return Ok(None);
    }
    let members: Vec<(Vec<u8>, i64)> =
        redis::cmd("ZREVRANGE").arg(keys.following(user_id)).arg(0).arg(-1).arg("WITHSCORES").query_async(&mut conn).await?;
    if Some(members.len() as i64) != n {
        return Ok(None);
    }
    let list = members.into_iter().map(|(m, ms)| (i64::from_be_bytes(m.as_slice().try_into().expect("8-byte member")), ms)).collect();
    Ok(Some(list))
}

/// The following lists of `users` per the `following` table, in list order.
///
/// # Errors
/// The database failed.
pub async fn following_lists(db: &TestDb, users: &[i64]) -> anyhow::Result<BTreeMap<i64, Vec<(i64, i64)>>> {
    let (following, _) = crate::both_tables(db).await?;
    let mut lists: BTreeMap<i64, Vec<(i64, i64)>> = users.iter().map(|u| (*u, Vec::new())).collect();
    for Edge { follower_id, followee_id, state, followed_at_ms, .. } in following {
        if state == EdgeState::Following
            && let Some(l) = lists.get_mut(&follower_id)
        {
            l.push((followee_id, followed_at_ms));
        }
    }
    for l in lists.values_mut() {
        l.sort_by_key(|e| std::cmp::Reverse((e.1, e.0)));
    }
    Ok(lists)
}

/// Asserts that every cached, complete following list of `users` equals the `following` table;
/// returns how many were cached. Call it once the events are applied (lag 0).
///
/// # Errors
/// The cache Redis or the database failed; a difference panics with both sides.
pub async fn assert_cached_following_exact(db: &TestDb, url: &str, prefix: &str, users: &[i64]) -> anyhow::Result<usize> {
    let truth = following_lists(db, users).await?;
    let mut cached = 0;
    for (user, list) in &truth {
        if let Some(c) = cached_following(url, prefix, *user).await? {
            assert_eq!(&c, list, "cached following list of {user} equals the following table");
            cached += 1;
        }
    }
    Ok(cached)
}
