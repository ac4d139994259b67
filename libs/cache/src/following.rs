//! The following-list cache: each cached user's whole following list in the cache Redis, kept
//! by the event stream as a pseudo-replica (DESIGN.md §5 and §8).
//!
//! Two keys per user, both tagged `{uid}`:
//! - `sg:flw:{uid}` — sorted set, member = followee id as 8 big-endian bytes, score =
//!   followed_at (ms). Redis orders equal scores by member bytes, so `ZREVRANGE` is the list
//!   order of the database: (followed_at desc, followee id desc).
//! - `sg:flw:{uid}:v` — hash, member → the edge's version, negative when the edge is not
//!   followed (a tombstone), plus `_s` (state: `c` complete, `f:<nonce>` being filled) and
//!   `_n` (members of the sorted set).
//!
//! How the races are closed:
//! - **Replays, copies, reordering**: an entry changes only when its version is higher than the
//!   stored one ([`APPLY`]); tombstones keep the version of an unfollow, so an older follow
//!   arriving late cannot bring the edge back.
//! - **A fill that read the database before a concurrent write**: a fill first puts a marker
//!   (`_s = f:<nonce>`) and only then reads the database. From the marker on, every event is
//!   applied to the (incomplete) entry, so a write the read missed is already in the cache with
//!   a higher version than the read's, and the fill's merge keeps it. Events consumed before the
//!   marker were committed before the read, so the read holds them.
//! - **Eviction** (the cache Redis may evict any key): every script runs atomically, and every
//!   script first checks that both keys are there and agree (`ZCARD = _n`); when one of them was
//!   evicted, it deletes the other and the list counts as not cached. A fill whose marker was
//!   evicted or replaced does not mark anything complete.
//!
//! Every read answers `None` when the list is not cached (the caller reads the database).

use std::time::Duration;

use redis::Script;

use crate::keys::Keys;
use crate::{CacheError, Pool};

/// Lua shared by the scripts: `consistent()` is true when the sorted set `KEYS[1]` holds as
/// many members as the hash `KEYS[2]` says, and deletes both otherwise (one was evicted);
/// `ok()` adds that the list is complete; `merge(m, version, score)` merges one entry.
const LUA_COMMON: &str = r"
local function consistent()
  local n = tonumber(redis.call('HGET', KEYS[2], '_n') or '-1')
  if redis.call('ZCARD', KEYS[1]) ~= n then
    redis.call('DEL', KEYS[1], KEYS[2])
    return false
  end
  return true
end
local function ok()
  return redis.call('HGET', KEYS[2], '_s') == 'c' and consistent()
end
local function merge(m, version, score)
  local old = tonumber(redis.call('HGET', KEYS[2], m) or '0')
  if math.abs(version) <= math.abs(old) then return 0 end
  redis.call('HSET', KEYS[2], m, version)
  if version > 0 then
    if old <= 0 then redis.call('HINCRBY', KEYS[2], '_n', 1) end
    redis.call('ZADD', KEYS[1], score, m)
  elseif old > 0 then
    redis.call('HINCRBY', KEYS[2], '_n', -1)
    redis.call('ZREM', KEYS[1], m)
  end
  return 1
end
";

/// APPLY: ARGV = (member, signed version, score)*; merges into a list that is cached or being
/// filled; returns the entries changed (0 when the list is not cached or too long to cache).
const APPLY: &str = r"
local s = redis.call('HGET', KEYS[2], '_s')
if not s or s == 'x' then return 0 end
if not consistent() then return 0 end
local changed = 0
for i = 1, #ARGV, 3 do
  changed = changed + merge(ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2])
end
return changed
";

/// FILL_BEGIN: ARGV = nonce, ttl (s). Returns 'c' when the list is already complete, 'x' when
/// it is known to be too long to cache, else starts (or takes over) a fill under `nonce` and
/// returns 'f'.
const FILL_BEGIN: &str = r"
local s = redis.call('HGET', KEYS[2], '_s')
if s == 'x' then return 'x' end
if s and not consistent() then s = false end
if s == 'c' then return 'c' end
if not s then
  redis.call('DEL', KEYS[1], KEYS[2])
  redis.call('HSET', KEYS[2], '_n', 0)
end
redis.call('HSET', KEYS[2], '_s', 'f:' .. ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[2])
return 'f'
";

/// FILL_COMMIT: ARGV = nonce, ttl (s), (member, version, score)* of the database read. Merges
/// and marks the list complete if the fill's marker is still there; returns 1, else 0.
const FILL_COMMIT: &str = r"
if redis.call('HGET', KEYS[2], '_s') ~= 'f:' .. ARGV[1] then return 0 end
if not consistent() then return 0 end
for i = 3, #ARGV, 3 do
  merge(ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2])
end
redis.call('HSET', KEYS[2], '_s', 'c')
redis.call('EXPIRE', KEYS[2], ARGV[2])
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('EXPIRE', KEYS[1], ARGV[2]) end
return 1
";

/// TOO_LONG: ARGV = ttl (s). Remembers for `ttl` that the list is too long to cache (state
/// `x`, no entries), so reads go to the database without trying to fill it.
const TOO_LONG: &str = r"
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('HSET', KEYS[2], '_s', 'x')
redis.call('EXPIRE', KEYS[2], ARGV[1])
return 1
";

/// PAGE: ARGV = cursor score ('' for the first page), cursor member, limit. Returns false when
/// not cached, else member, score, member, score, … in list order.
const PAGE: &str = r"
if not ok() then return false end
local start = 0
if ARGV[1] ~= '' then
  start = redis.call('ZCOUNT', KEYS[1], '(' .. ARGV[1], '+inf')
  -- Ties at the cursor's score come before it when their member is not below the cursor's
  -- (the cursor's own entry included): compare the 8 bytes in order.
  local c = ARGV[2]
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[1], ARGV[1])) do
    local before = true
    for i = 1, 8 do
      local x, y = string.byte(m, i), string.byte(c, i)
      if x ~= y then
        before = x > y
        break
      end
    end
    if before then start = start + 1 end
  end
end
local limit = tonumber(ARGV[3])
if limit <= 0 then return {} end
return redis.call('ZREVRANGE', KEYS[1], start, start + limit - 1, 'WITHSCORES')
";

/// SCORES: ARGV = members. Returns false when not cached, else the followed_at of each member
/// (false when not followed).
const SCORES: &str = r"
if not ok() then return false end
if #ARGV == 0 then return {} end
return redis.call('ZMSCORE', KEYS[1], unpack(ARGV))
";

/// COUNT: returns -1 when not cached, else the number of accounts followed.
const COUNT: &str = r"
if not ok() then return -1 end
return redis.call('ZCARD', KEYS[1])
";

/// One edge of a following list as the cache holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CachedEdge {
    /// The followee.
    pub followee_id: i64,
    /// The edge's version (grows with every change of the edge).
    pub version: i64,
    /// Whether the edge is followed at that version (hidden and unfollowed edges are not).
    pub following: bool,
    /// When the follow happened (ms since the epoch); the list's sort key.
    pub followed_at_ms: i64,
}

/// The cache's scripts, each with [`LUA_COMMON`] in front.
struct Scripts {
    apply: Script,
    fill_begin: Script,
    fill_commit: Script,
    page: Script,
    scores: Script,
    count: Script,
    too_long: Script,
}

/// The following-list cache of one cache Redis. Cheap to clone.
#[derive(Clone)]
pub struct FollowingCache {
    pool: Pool,
    keys: Keys,
    ttl: Duration,
    timeout: Duration,
    scripts: std::sync::Arc<Scripts>,
}

/// The 8-byte member of a followee (big-endian, so byte order is numeric order for ids > 0).
fn member(id: i64) -> [u8; 8] {
    id.to_be_bytes()
}

fn id_of(m: &[u8]) -> Option<i64> {
    Some(i64::from_be_bytes(m.try_into().ok()?))
}

impl FollowingCache {
    /// A cache over `pool` with keys under `keys`' prefix; a filled list lives `ttl` (the
    /// cache Redis may evict it earlier); each call waits at most `timeout`.
    pub fn new(pool: Pool, keys: Keys, ttl: Duration, timeout: Duration) -> Self {
        let s = |body: &str| Script::new(&format!("{LUA_COMMON}{body}"));
        let scripts = Scripts {
            apply: s(APPLY),
            fill_begin: s(FILL_BEGIN),
            fill_commit: s(FILL_COMMIT),
            page: s(PAGE),
            scores: s(SCORES),
            count: s(COUNT),
            too_long: s(TOO_LONG),
        };
        Self { pool, keys, ttl, timeout, scripts: std::sync::Arc::new(scripts) }
    }

    /// `script` with `user_id`'s two keys.
    fn invocation<'a>(&self, script: &'a Script, user_id: i64) -> redis::ScriptInvocation<'a> {
        let mut inv = script.prepare_invoke();
        inv.key(self.keys.following(user_id)).key(self.keys.following_versions(user_id));
        inv
    }

    async fn run<T: redis::FromRedisValue>(&self, inv: redis::ScriptInvocation<'_>) -> Result<T, CacheError> {
        crate::within(self.timeout, async { Ok(inv.invoke_async::<T>(&mut crate::conn(&self.pool).await?).await?) }).await
    }

    /// Up to `limit` entries (followee id, followed_at ms) of `user_id`'s following list in
    /// list order, strictly after `after` = (followed_at ms, followee id) when given; `None`
    /// when the list is not cached.
    ///
    /// # Errors
    /// Redis unreachable, slow or failing.
    pub async fn page(&self, user_id: i64, after: Option<(i64, i64)>, limit: usize) -> Result<Option<Vec<(i64, i64)>>, CacheError> {
        let mut inv = self.invocation(&self.scripts.page, user_id);
        match after {
            Some((ms, peer)) => inv.arg(ms).arg(member(peer).as_slice()),
            None => inv.arg("").arg(""),
        };
        inv.arg(limit);
        let flat: Option<Vec<(Vec<u8>, i64)>> = self.run(inv).await?;
        let Some(flat) = flat else { return Ok(None) };
        flat.into_iter()
            .map(|(m, ms)| id_of(&m).map(|id| (id, ms)).ok_or_else(|| CacheError::Unavailable("malformed cached member".into())))
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// followed_at (ms) of `user_id`'s edge to each of `others`, in input order (`None`: not
    /// followed); `None` when the list is not cached.
    ///
    /// # Errors
    /// Redis unreachable, slow or failing.
    pub async fn scores(&self, user_id: i64, others: &[i64]) -> Result<Option<Vec<Option<i64>>>, CacheError> {
        let mut inv = self.invocation(&self.scripts.scores, user_id);
        for o in others {
            inv.arg(member(*o).as_slice());
        }
        let scores: Option<Vec<Option<f64>>> = self.run(inv).await?;
        Ok(scores.map(|v| v.into_iter().map(|s| s.map(|s| s as i64)).collect()))
    }

    /// How many accounts `user_id` follows; `None` when the list is not cached.
    ///
    /// # Errors
    /// Redis unreachable, slow or failing.
    pub async fn count(&self, user_id: i64) -> Result<Option<i64>, CacheError> {
        let n: i64 = self.run(self.invocation(&self.scripts.count, user_id)).await?;
        Ok((n >= 0).then_some(n))
    }

    /// Starts filling `user_id`'s list: `None` when it is already complete or known to be too
    /// long to cache, else the fill's nonce, to pass to [`Self::commit_fill`] with the database
    /// read made **after** this call.
    ///
    /// # Errors
    /// Redis unreachable, slow or failing.
    pub async fn begin_fill(&self, user_id: i64) -> Result<Option<String>, CacheError> {
        let nonce = uuid::Uuid::now_v7().simple().to_string();
        let mut inv = self.invocation(&self.scripts.fill_begin, user_id);
        inv.arg(&nonce).arg(self.ttl.as_secs().max(1));
        let state: String = self.run(inv).await?;
        Ok((state == "f").then_some(nonce))
    }

    /// Remembers for the cache's TTL that `user_id`'s list is too long to cache: reads then go
    /// to the database without a fill, and events skip it.
    ///
    /// # Errors
    /// Redis unreachable, slow or failing.
    pub async fn mark_too_long(&self, user_id: i64) -> Result<(), CacheError> {
        let mut inv = self.invocation(&self.scripts.too_long, user_id);
        inv.arg(self.ttl.as_secs().max(1));
        self.run::<i64>(inv).await.map(|_| ())
    }

    /// Ends the fill `nonce` of `user_id` with `edges`, the followed edges read from the
    /// database after [`Self::begin_fill`]; true when the list is now cached (false: the marker
    /// was evicted or another fill took over, and nothing was marked complete).
    ///
    /// # Errors
    /// Redis unreachable, slow or failing.
    pub async fn commit_fill(&self, user_id: i64, nonce: &str, edges: &[CachedEdge]) -> Result<bool, CacheError> {
        let mut inv = self.invocation(&self.scripts.fill_commit, user_id);
        inv.arg(nonce).arg(self.ttl.as_secs().max(1));
        push_edges(&mut inv, edges);
        let done: i64 = self.run(inv).await?;
        Ok(done == 1)
    }

    /// Applies edge changes (follower id, edge) from the event stream or a write, in one round
    /// trip: each one changes a cached (or being-filled) list only when its version is newer
    /// than the cached one, so copies, replays and reordering are harmless. Returns the entries
    /// changed.
    ///
    /// # Errors
    /// Redis unreachable, slow or failing: the caller must treat those lists as stale.
    pub async fn apply(&self, changes: &[(i64, CachedEdge)]) -> Result<u64, CacheError> {
        let mut by_user: std::collections::BTreeMap<i64, Vec<CachedEdge>> = std::collections::BTreeMap::new();
        for (follower, e) in changes {
            by_user.entry(*follower).or_default().push(*e);
        }
        if by_user.is_empty() {
            return Ok(0);
        }
        let mut pipe = redis::pipe();
        for (user, edges) in &by_user {
            let mut inv = self.invocation(&self.scripts.apply, *user);
            push_edges(&mut inv, edges);
            pipe.invoke_script(&inv);
        }
        let counts: Vec<u64> = crate::query_pipeline(&self.pool, self.timeout, &pipe, &[&self.scripts.apply]).await?;
        Ok(counts.iter().sum())
    }

    /// Drops the cached lists of `users` (their next read fills them from the database).
    ///
    /// # Errors
    /// Redis unreachable, slow or failing.
    pub async fn evict(&self, users: &[i64]) -> Result<(), CacheError> {
        if users.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for u in users {
            pipe.del(&[self.keys.following(*u), self.keys.following_versions(*u)]).ignore();
        }
        crate::query_pipeline(&self.pool, self.timeout, &pipe, &[]).await
    }
}

fn push_edges(inv: &mut redis::ScriptInvocation<'_>, edges: &[CachedEdge]) {
    for e in edges {
        let version = if e.following { e.version } else { -e.version };
        inv.arg(member(e.followee_id).as_slice()).arg(version).arg(e.followed_at_ms);
    }
}
