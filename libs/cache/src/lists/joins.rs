//! Joins of two users' cached lists on a single Redis: ListCommonFollowing (two following
//! lists) and ListFamiliarFollowers (the viewer's following list and the user's follower list).
//!
//! One script ([`INTERSECT`]) checks that both lists are cached whole and that the shorter one
//! holds at most [`JOIN_MAX`] entries, and only then runs ZINTER, so only the intersection
//! travels and a join whose lists do not qualify costs Redis two HMGETs and two ZCARDs. The
//! two lists belong to two users, whose keys live in two cluster slots: Redis checks a
//! script's keys against slots only in cluster mode, and a cluster connection never sends
//! this script (the caller joins the lists itself there).

use super::{ListCache, entries_of};
use crate::CacheError;

/// Most entries the shorter list of a join in Redis may hold: ZINTER walks the shorter list
/// and answers at most its length, so this bounds the join's Redis time and reply. Longer
/// pairs are joined by the caller (or the database), a page at a time.
pub const JOIN_MAX: usize = 1_000;

/// INTERSECT: KEYS = the first list's sorted set and versions hash, the second's; ARGV[1] =
/// [`JOIN_MAX`]. Nil unless both lists are complete (`_s` = `c`) with `ZCARD = _n` and the
/// shorter holds at most ARGV[1] members; else `ZINTER 2 … WEIGHTS 1 0 WITHSCORES` (member,
/// the first list's score)*. Changes nothing: a list whose counts disagree is left to the
/// scripts of [`super::scripts`], which delete it.
pub const INTERSECT: &str = r"
local function whole(set, versions)
  local h = redis.call('HMGET', versions, '_s', '_n')
  local n = redis.call('ZCARD', set)
  if h[1] == 'c' and tonumber(h[2]) == n then return n end
  return false
end
local a = whole(KEYS[1], KEYS[2])
if not a then return false end
local b = whole(KEYS[3], KEYS[4])
if not b or math.min(a, b) > tonumber(ARGV[1]) then return false end
return redis.call('ZINTER', 2, KEYS[1], KEYS[3], 'WEIGHTS', 1, 0, 'WITHSCORES')
";

impl ListCache {
    /// The entries (peer id, followed_at ms) of `user_id`'s list whose peer `other_id`'s list in
    /// `other` (a list cache of the same Redis) also holds, in this list's order (followed_at
    /// desc, peer id desc), strictly after `after` = (followed_at ms, peer id), at most `limit`
    /// ([`page_of`] cuts the page from the whole intersection). One script call
    /// ([`INTERSECT`]). `None` when either list is not cached whole or its set and hash
    /// disagree, when both hold more than [`JOIN_MAX`] entries, and on a cluster.
    ///
    /// # Errors
    /// Redis unreachable, slow or failing.
    pub async fn intersect(
        &self,
        user_id: i64,
        other: &ListCache,
        other_id: i64,
        after: Option<(i64, i64)>,
        limit: usize,
    ) -> Result<Option<Vec<(i64, i64)>>, CacheError> {
        let Some(mut conn) = self.single_conn().await? else { return Ok(None) };
        let ([set, versions, _], [other_set, other_versions, _]) = (self.list_keys(user_id), other.list_keys(other_id));
        let mut inv = self.scripts.intersect.prepare_invoke();
        inv.key(set).key(versions).key(other_set).key(other_versions).arg(JOIN_MAX);
        let flat: Option<Vec<Vec<u8>>> = crate::within(self.limits.timeout, async { Ok(inv.invoke_async(&mut conn).await?) }).await?;
        let Some(flat) = flat else { return Ok(None) };
        Ok(Some(page_of(entries_of(&flat)?, after, limit)))
    }
}

/// The entries (peer id, followed_at ms) of `entries`, in any order, that come strictly after
/// `after` = (followed_at ms, peer id) in list order (followed_at desc, peer id desc), sorted
/// so, at most `limit`: a page of a list's subset read out of order.
pub fn page_of(mut entries: Vec<(i64, i64)>, after: Option<(i64, i64)>, limit: usize) -> Vec<(i64, i64)> {
    entries.retain(|&(id, ms)| after.is_none_or(|(a_ms, a_id)| (ms, id) < (a_ms, a_id)));
    entries.sort_unstable_by_key(|&(id, ms)| std::cmp::Reverse((ms, id)));
    entries.truncate(limit);
    entries
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_of_a_subset_is_in_list_order_after_the_cursor() {
        let entries = vec![(5, 100), (9, 300), (2, 300), (7, 200), (1, 50)];
        assert_eq!(page_of(entries.clone(), None, 3), vec![(9, 300), (2, 300), (7, 200)], "followed_at desc, then id desc");
        assert_eq!(page_of(entries.clone(), Some((300, 2)), 10), vec![(7, 200), (5, 100), (1, 50)], "strictly after the cursor");
        assert_eq!(page_of(entries, Some((300, 9)), 1), vec![(2, 300)], "an equal followed_at with a lower id comes after");
    }
}
