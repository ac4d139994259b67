//! Per-user counters, packed many users to a Redis hash, and the Lua scripts that change them.
//!
//! Layout (docs/src/architecture/counters.md#user-counters-bucketed): the users are spread over
//! [`USER_BUCKETS`] hashes `sg:uc:{u:B}` by [`user_bucket`]; in its bucket each user is one
//! field (the id in decimal) whose value is [`Stored`]: seven or eight LEB128 varints, the five
//! counters (followings, followers, posts, likes_received, favs_received), the guard version
//! plus one, the end of the sampled check's rest period and, once a relation event brought one,
//! the version of the followings plus one. A bucket of up to 128 small fields stays in
//! Redis's listpack encoding, so a user costs its field and value plus a share of one key
//! instead of three keys of its own (README, operations: memory). Decrements floor at 0,
//! increments saturate at u32::MAX.
//!
//! Effectively-once without per-offset bookkeeping: every script writes absolute values or
//! per-item states, never blind deltas.
//! - Followers are copied from projection-svc's `edge_count` row together with its version; the
//!   value keeps the newest version copied ([`SYNC_EDGES`]).
//! - Followings are copied from relation-svc's `following_count` row as its RelationEvents carry
//!   it, newest version per user ([`SYNC_FOLLOWINGS`]); until the first of those arrives they come
//!   from the projection's row with the followers.
//! - Likes and favourites received are the sums of the owner's recv hash, which holds each
//!   owned entity's counts with the entity's toggle sequence ([`OWNER_SYNC`]).
//! - Posts follow the posts set; each entity keeps the time of its last content event
//!   ([`APPLY_CONTENT`]).
//!
//! A duplicate at a new offset, a replayed range or a late copy therefore changes nothing.

use redis::Script;

/// Number of counters in an SDS.
pub const FIELDS: usize = 5;

/// Hashes the users' counters are spread over. Part of the layout: a bucket keeps its compact
/// encoding while it holds at most `hash-max-listpack-entries` users (128 by default), so the
/// default fits about 8 million users (README, operations: memory, for more).
pub const USER_BUCKETS: u64 = 65_536;

/// The bucket of `user_id`: xxh3-64 of its 8 big-endian bytes modulo [`USER_BUCKETS`], so
/// that sequential and snowflake-like ids spread alike.
pub fn user_bucket(user_id: i64) -> u64 {
    xxhash_rust::xxh3::xxh3_64(&user_id.to_be_bytes()) % USER_BUCKETS
}

/// Start of the clock of [`Stored::rest_until_s`]: 2025-01-01T00:00:00Z in Unix seconds (a
/// recent epoch keeps the varint at 4 bytes).
pub const REST_EPOCH_S: u64 = 1_735_689_600;

/// Seconds since [`REST_EPOCH_S`] now (0 before it).
pub fn rest_clock_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or_default().saturating_sub(REST_EPOCH_S)
}
/// Indexes of the counters inside an SDS.
pub mod field {
    /// Accounts the user follows.
    pub const FOLLOWINGS: usize = 0;
    /// Accounts following the user.
    pub const FOLLOWERS: usize = 1;
    /// Published entities.
    pub const POSTS: usize = 2;
    /// Likes received on the user's entities.
    pub const LIKES_RECEIVED: usize = 3;
    /// Favourites received.
    pub const FAVS_RECEIVED: usize = 4;
}

/// The decoded counters of one user.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sds(pub [u32; FIELDS]);

impl Sds {
    /// Adds `delta` to each counter, flooring at 0 and saturating at u32::MAX (the scripts'
    /// rule, for tests and in-memory mirrors).
    pub fn apply(&mut self, delta: [i64; FIELDS]) {
        for (v, d) in self.0.iter_mut().zip(delta) {
            *v = (i64::from(*v) + d).clamp(0, i64::from(u32::MAX)) as u32;
        }
    }
}

/// One user's value in its bucket: the counters, the version of the projection's follow counts
/// copied into them (the guard; -1 before any copy), the end of the sampled check's rest
/// period (seconds since [`REST_EPOCH_S`], 0 = none) and the version of relation-svc's
/// followings copied into them (-1: none yet; followings then come from the projection).
///
/// Encoded as unsigned LEB128 varints in that order (the versions plus one), the last left out
/// while it is -1, nothing after them: 9–45 bytes, about 12–16 for a typical user. Values
/// written before the followings version existed are seven varints and read as "none".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stored {
    /// The counters.
    pub counters: Sds,
    /// Version of the follow counts copied in (-1: none yet).
    pub version: i64,
    /// End of the check rest period (seconds since [`REST_EPOCH_S`]).
    pub rest_until_s: u64,
    /// Version of the followings copied from relation events (-1: none yet).
    pub followings_version: i64,
}

impl Stored {
    /// Decodes a value; `None` when malformed (a truncated varint, a counter over u32::MAX,
    /// trailing bytes).
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let mut it = bytes.iter().peekable();
        let mut next = |optional: bool| {
            if optional && it.peek().is_none() {
                return Some(None);
            }
            let mut v: u64 = 0;
            for shift in (0..64).step_by(7) {
                let b = *it.next()?;
                v |= u64::from(b & 0x7f) << shift;
                if b < 0x80 {
                    return Some(Some(v));
                }
            }
            None
        };
        let mut counters = [0u32; FIELDS];
        for c in &mut counters {
            *c = u32::try_from(next(false)??).ok()?;
        }
        let version = i64::try_from(next(false)??).ok()? - 1;
        let rest_until_s = next(false)??;
        let followings_version = match next(true)? {
            None => -1,
            // Written only once there is one: never 0.
            Some(v) => i64::try_from(v).ok().filter(|v| *v > 0)? - 1,
        };
        // Nothing may follow the last varint.
        next(true)?.is_none().then_some(Self { counters: Sds(counters), version, rest_until_s, followings_version })
    }

    /// Encodes as [`Self::decode`] reads it.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16);
        let mut put = |mut v: u64| loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(b);
                break;
            }
            out.push(b | 0x80);
        };
        for c in self.counters.0 {
            put(u64::from(c));
        }
        put(u64::try_from(self.version.saturating_add(1)).unwrap_or_default());
        put(self.rest_until_s);
        if self.followings_version >= 0 {
            put(u64::try_from(self.followings_version.saturating_add(1)).unwrap_or_default());
        }
        out
    }
}

/// Shared Lua: clamp and the value's varints (Lua numbers are doubles: exact below 2^53, which
/// every counter, version and time stays under).
const LUA_SDS: &str = concat!(
    lua_varint!(),
    r"
local function clamp(x)
  if x < 0 then return 0 end
  if x > 4294967295 then return 4294967295 end
  return x
end
-- the user's value: {followings, followers, posts, likes, favs, version + 1, rest until,
-- followings version + 1 (0: none)} or nil
local function rd(s)
  if not s then return nil end
  local out, i = {}, 1
  for k = 1, 8 do
    -- the eighth is left out while there is none
    if k == 8 and i > #s then out[8] = 0; break end
    local v, mul = 0, 1
    repeat
      local b = string.byte(s, i)
      if not b then return nil end
      i = i + 1
      v = v + (b % 128) * mul
      mul = mul * 128
    until b < 128
    out[k] = v
  end
  if i ~= #s + 1 then return nil end
  for k = 1, 5 do if out[k] > 4294967295 then return nil end end
  return out
end
local function wr(v)
  local out = {}
  for k = 1, 7 do venc(v[k], out) end
  if v[8] > 0 then venc(v[8], out) end
  return table.concat(out)
end
"
);

/// Sums of an owner's likes and favourites received: the `recv` hash holds, per entity, the
/// entity's `seq:likes:favs` as last copied.
const LUA_RECV: &str = r"
local function parse_recv(x)
  local q, l, f = string.match(x, '^(%-?%d+):(%d+):(%d+)$')
  return tonumber(q), tonumber(l), tonumber(f)
end
local function recv_sums(key)
  local likes, favs = 0, 0
  local all = redis.call('HGETALL', key)
  for i = 2, #all, 2 do
    local _, l, f = parse_recv(all[i])
    likes = likes + (l or 0)
    favs = favs + (f or 0)
  end
  return likes, favs
end
-- keys: bucket, posts set, recv hash. A fresh value from the facts in this slot.
local function fresh(keys)
  local likes, favs = recv_sums(keys[3])
  return {0, 0, clamp(redis.call('SCARD', keys[2])), clamp(likes), clamp(favs), 0, 0, 0}
end
";

/// KEYS: bucket, posts set, recv hash. ARGV: user id, followings, followers, version (of the
/// projection's `edge_count` row), force ('1' | '0').
///
/// Copies absolute follow counts, keeping only the newest version: a value whose version is at
/// or below the stored one changes nothing (unless forced at an equal version), so duplicated,
/// replayed and reordered events cannot move a counter twice. Followings are taken only while
/// no relation event brought them ([`SYNC_FOLLOWINGS`]): those are fresher, and of another
/// version space. A missing or malformed value is created from the facts of this slot (posts
/// set, recv hash) and takes the given version. Returns {written (0|1), previous value or
/// false}.
const SYNC_EDGES: &str = r"
local ver = math.max(tonumber(ARGV[4]) + 1, 0)
local s = redis.call('HGET', KEYS[1], ARGV[1])
local v = rd(s)
if v and (ver < v[6] or (ver == v[6] and ARGV[5] ~= '1')) then return {0, s} end
if not v then v = fresh(KEYS) end
if v[8] == 0 then v[1] = clamp(tonumber(ARGV[2])) end
v[2] = clamp(tonumber(ARGV[3]))
v[6] = ver
redis.call('HSET', KEYS[1], ARGV[1], wr(v))
return {1, s or false}
";

/// KEYS: bucket, posts set, recv hash. ARGV: user id, followings, followers, version.
///
/// The sampled check. Follow counts at the same version as the stored one must be equal; if
/// they differ the counter drifted and is rewritten. A newer version is copied (the counter was
/// merely behind). Posts must equal the posts set and likes/favs received the sums of the recv
/// hash, whatever the version. Returns {drift (0|1), written (0|1)}; {-1, 0} when there is no
/// value (the next read creates it).
const CHECK: &str = r"
local v = rd(redis.call('HGET', KEYS[1], ARGV[1]))
if not v then return {-1, 0} end
local ver = math.max(tonumber(ARGV[4]) + 1, 0)
local f, r = clamp(tonumber(ARGV[2])), clamp(tonumber(ARGV[3]))
local drift, write = 0, 0
-- followings copied from relation events are of another version space: not compared here
if v[8] > 0 then f = v[1] end
if ver >= v[6] and (v[1] ~= f or v[2] ~= r) then
  if ver == v[6] then drift = 1 end
  v[1], v[2], write = f, r, 1
end
if ver > v[6] then v[6], write = ver, 1 end
local want = fresh(KEYS)
for i = 3, 5 do
  if v[i] ~= want[i] then v[i], drift, write = want[i], 1, 1 end
end
if write == 1 then redis.call('HSET', KEYS[1], ARGV[1], wr(v)) end
return {drift, write}
";

/// KEYS: bucket. ARGV: user id, followings, version (of relation-svc's `following_count` row,
/// > 0).
///
/// Copies the followings a RelationEvent carries when its version is above the stored one, so
/// duplicated, replayed and reordered events change nothing. A user without a value is left
/// alone: its first read or projection event creates the value with both counts, and the next
/// relation event brings the followings. Returns 1 when it wrote, else 0.
const SYNC_FOLLOWINGS: &str = r"
local v = rd(redis.call('HGET', KEYS[1], ARGV[1]))
local ver = tonumber(ARGV[3]) + 1
if not v or ver <= v[8] then return 0 end
v[1] = clamp(tonumber(ARGV[2]))
v[8] = ver
redis.call('HSET', KEYS[1], ARGV[1], wr(v))
return 1
";

/// KEYS: bucket, recv hash. ARGV: user id, then quads (member `etype:eid`, seq, likes, favs):
/// the entity's current counts read together with its toggle sequence.
///
/// Copies each entity's counts into the owner's recv hash when its sequence is newer than the
/// stored one, and moves likes/favs received by the difference (if the value exists; a missing
/// one is later created from the hash). Re-sending the same or an older state changes nothing.
/// Returns {likes delta, favs delta}.
const OWNER_SYNC: &str = r"
local dl, df = 0, 0
for i = 2, #ARGV, 4 do
  local q, l, f = tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
  local old = redis.call('HGET', KEYS[2], ARGV[i])
  local oq, ol, of = -1, 0, 0
  if old then oq, ol, of = parse_recv(old) end
  if q > oq then
    dl = dl + l - ol
    df = df + f - of
    redis.call('HSET', KEYS[2], ARGV[i], string.format('%d:%d:%d', q, l, f))
  end
end
local v = rd(redis.call('HGET', KEYS[1], ARGV[1]))
if v and (dl ~= 0 or df ~= 0) then
  v[4] = clamp(v[4] + dl)
  v[5] = clamp(v[5] + df)
  redis.call('HSET', KEYS[1], ARGV[1], wr(v))
end
return {dl, df}
";

/// KEYS: bucket, posts set, post times hash. ARGV: user id, then triples (op '+' published |
/// '-' deleted, member `etype:eid`, event time ms), in log order.
///
/// Each entity keeps the time of the last content event applied to it (negative for a
/// deletion); an event applies only when it is newer (at equal times a deletion wins), so a
/// duplicate, a replay or a late copy of an older event changes nothing. The posts counter
/// moves by what SADD/SREM changed. Returns the posts delta.
const APPLY_CONTENT: &str = r"
local d = 0
for i = 2, #ARGV, 3 do
  local t = tonumber(ARGV[i + 2])
  local last = redis.call('HGET', KEYS[3], ARGV[i + 1])
  local apply = true
  if last then
    local lt = tonumber(last)
    local at, deleted = math.abs(lt), string.sub(last, 1, 1) == '-'
    if t < at or (t == at and (deleted or ARGV[i] == '+')) then apply = false end
  end
  if apply then
    if ARGV[i] == '+' then
      d = d + redis.call('SADD', KEYS[2], ARGV[i + 1])
      redis.call('HSET', KEYS[3], ARGV[i + 1], t)
    else
      d = d - redis.call('SREM', KEYS[2], ARGV[i + 1])
      redis.call('HSET', KEYS[3], ARGV[i + 1], '-' .. t)
    end
  end
end
local v = rd(redis.call('HGET', KEYS[1], ARGV[1]))
if v and d ~= 0 then
  v[3] = clamp(v[3] + d)
  redis.call('HSET', KEYS[1], ARGV[1], wr(v))
end
return d
";

/// Copies unread counts into `KEYS[1]` (a user's `sg:unread` hash). `ARGV`: triples of
/// conversation id, version, count. A triple applies only when its version is newer than the
/// stored one (the membership's version, which grows with every change of it), and moves the
/// total `t` by the difference, floored at 0. Returns how many applied.
const SYNC_UNREAD: &str = r"
local total = tonumber(redis.call('HGET', KEYS[1], 't') or '0')
local applied = 0
for i = 1, #ARGV, 3 do
  local cur = redis.call('HGET', KEYS[1], ARGV[i])
  local v, c = 0, 0
  if cur then
    local sep = string.find(cur, ':', 1, true)
    v = tonumber(string.sub(cur, 1, sep - 1))
    c = tonumber(string.sub(cur, sep + 1))
  end
  local nv, nc = tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  if nv > v then
    redis.call('HSET', KEYS[1], ARGV[i], nv .. ':' .. nc)
    total = total + nc - c
    applied = applied + 1
  end
end
if total < 0 then total = 0 end
redis.call('HSET', KEYS[1], 't', total)
return applied
";

/// A user's whole unread hash from message-svc's states (KEYS[1] = the hash, ARGV = triples
/// conversation, version, count): each state at least as new as the stored one is written (an
/// equal version rewrites the same state, which also repairs a damaged count), a newer stored
/// one is kept (an event batch applied meanwhile is never undone); then the total `t` is the
/// sum over every conversation and `b` marks the hash as built. Returns the total.
const REBUILD_UNREAD: &str = r"
for i = 1, #ARGV, 3 do
  local cur = redis.call('HGET', KEYS[1], ARGV[i])
  local v = -1
  if cur then
    v = tonumber(string.sub(cur, 1, string.find(cur, ':', 1, true) - 1))
  end
  if tonumber(ARGV[i + 1]) >= v then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1] .. ':' .. ARGV[i + 2])
  end
end
local total = 0
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  if all[i] ~= 't' and all[i] ~= 'b' then
    local sep = string.find(all[i + 1], ':', 1, true)
    total = total + tonumber(string.sub(all[i + 1], sep + 1))
  end
end
redis.call('HSET', KEYS[1], 't', total, 'b', 1)
return total
";

/// KEYS: bucket. ARGV: now (seconds since [`REST_EPOCH_S`]), then pairs (user id, rest
/// seconds) of users of this bucket.
///
/// The users whose check rest period is over: each starts its next period (now + its rest)
/// and is returned, so that concurrent readers and replicas check a user at most once per
/// period. Users without a value are not due (the next read creates them).
const CHECKS_DUE: &str = r"
local now = tonumber(ARGV[1])
local due = {}
for i = 2, #ARGV, 2 do
  local v = rd(redis.call('HGET', KEYS[1], ARGV[i]))
  if v and v[7] <= now then
    v[7] = now + tonumber(ARGV[i + 1])
    redis.call('HSET', KEYS[1], ARGV[i], wr(v))
    due[#due + 1] = ARGV[i]
  end
end
return due
";

/// The compiled scripts (EVALSHA with automatic script load).
#[derive(Clone)]
pub struct Scripts {
    /// Copy follow counts of a newer version ([`SYNC_EDGES`]).
    pub sync_edges: Script,
    /// Copy followings of a newer version ([`SYNC_FOLLOWINGS`]).
    pub sync_followings: Script,
    /// The sampled check.
    pub check: Script,
    /// Copy entity counts into an owner's likes/favs received.
    pub owner_sync: Script,
    /// Content events: the posts set and counter.
    pub apply_content: Script,
    /// Users whose sampled check is due ([`CHECKS_DUE`]).
    pub checks_due: Script,
    /// Copy unread counts of a newer version ([`SYNC_UNREAD`]).
    pub sync_unread: Script,
    /// Rebuild a user's unread hash ([`REBUILD_UNREAD`]).
    pub rebuild_unread: Script,
}

impl Scripts {
    /// Every script, for loading after Redis lost them.
    pub fn all(&self) -> [&Script; 8] {
        [
            &self.sync_edges,
            &self.sync_followings,
            &self.check,
            &self.owner_sync,
            &self.apply_content,
            &self.checks_due,
            &self.sync_unread,
            &self.rebuild_unread,
        ]
    }
}

impl Default for Scripts {
    fn default() -> Self {
        Self {
            sync_edges: Script::new(&format!("{LUA_SDS}{LUA_RECV}{SYNC_EDGES}")),
            sync_followings: Script::new(&format!("{LUA_SDS}{SYNC_FOLLOWINGS}")),
            check: Script::new(&format!("{LUA_SDS}{LUA_RECV}{CHECK}")),
            owner_sync: Script::new(&format!("{LUA_SDS}{LUA_RECV}{OWNER_SYNC}")),
            apply_content: Script::new(&format!("{LUA_SDS}{APPLY_CONTENT}")),
            checks_due: Script::new(&format!("{LUA_SDS}{CHECKS_DUE}")),
            sync_unread: Script::new(SYNC_UNREAD),
            rebuild_unread: Script::new(REBUILD_UNREAD),
        }
    }
}

#[cfg(test)]
mod tests;
