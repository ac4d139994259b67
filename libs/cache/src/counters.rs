//! Per-user counters: the 20-byte SDS string and the Lua scripts that change it.
//!
//! Layout (DESIGN.md §5): five big-endian u32, in order followings, followers, posts,
//! likes_received, favs_received. Decrements floor at 0, increments saturate at u32::MAX.
//!
//! Effectively-once without per-offset bookkeeping: every script writes absolute values or
//! per-item states, never blind deltas.
//! - Followings and followers are copied from projection-svc's `edge_count` row together with
//!   its version; the user's guard keeps the newest version copied ([`SYNC_EDGES`]).
//! - Likes and favourites received are the sums of the owner's recv hash, which holds each
//!   owned entity's counts with the entity's toggle sequence ([`OWNER_SYNC`]).
//! - Posts follow the posts set; each entity keeps the time of its last content event
//!   ([`APPLY_CONTENT`]).
//!
//! A duplicate at a new offset, a replayed range or a late copy therefore changes nothing.

use redis::Script;

/// Number of counters in an SDS.
pub const FIELDS: usize = 5;
/// Bytes of an SDS.
pub const SDS_LEN: usize = FIELDS * 4;

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
    /// Decodes 20 bytes; anything else is malformed (`None`).
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != SDS_LEN {
            return None;
        }
        let mut out = [0u32; FIELDS];
        for (i, v) in out.iter_mut().enumerate() {
            let mut b = [0u8; 4];
            b.copy_from_slice(&bytes[i * 4..i * 4 + 4]);
            *v = u32::from_be_bytes(b);
        }
        Some(Self(out))
    }

    /// Encodes to 20 bytes.
    pub fn encode(&self) -> [u8; SDS_LEN] {
        let mut out = [0u8; SDS_LEN];
        for (i, v) in self.0.iter().enumerate() {
            out[i * 4..i * 4 + 4].copy_from_slice(&v.to_be_bytes());
        }
        out
    }

    /// Adds `delta` to each counter, flooring at 0 and saturating at u32::MAX (the scripts'
    /// rule, for tests and in-memory mirrors).
    pub fn apply(&mut self, delta: [i64; FIELDS]) {
        for (v, d) in self.0.iter_mut().zip(delta) {
            *v = (i64::from(*v) + d).clamp(0, i64::from(u32::MAX)) as u32;
        }
    }
}

/// Shared Lua: clamp and pack/unpack (Redis bundles the `struct` library).
const LUA_SDS: &str = r"
local function unpack5(s)
  local a, b, c, d, e = struct.unpack('>I4>I4>I4>I4>I4', s)
  return {a, b, c, d, e}
end
local function pack5(v)
  return struct.pack('>I4>I4>I4>I4>I4', v[1], v[2], v[3], v[4], v[5])
end
local function clamp(x)
  if x < 0 then return 0 end
  if x > 4294967295 then return 4294967295 end
  return x
end
";

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
-- keys: sds, guard, posts set, recv hash. A fresh counter from the facts in this slot.
local function fresh(keys)
  local likes, favs = recv_sums(keys[4])
  return {0, 0, clamp(redis.call('SCARD', keys[3])), clamp(likes), clamp(favs)}
end
";

/// KEYS: sds, guard, posts set, recv hash. ARGV: followings, followers, version (of the
/// projection's `edge_count` row), force ('1' | '0').
///
/// Copies absolute follow counts, keeping only the newest version: a value whose version is at
/// or below the stored guard `edges` changes nothing (unless forced at an equal version), so
/// duplicated, replayed and reordered events cannot move a counter twice. A missing or
/// malformed counter is created from the facts of this slot (posts set, recv hash) and takes
/// the given version whatever the guard says. Returns {written (0|1), previous string or
/// false}.
const SYNC_EDGES: &str = r"
local ver = tonumber(ARGV[3])
local cur = tonumber(redis.call('HGET', KEYS[2], 'edges') or '-1')
local s = redis.call('GET', KEYS[1])
local ok = s and #s == 20
if ok and (ver < cur or (ver == cur and ARGV[4] ~= '1')) then return {0, s} end
local v
if ok then v = unpack5(s) else v = fresh(KEYS) end
v[1] = clamp(tonumber(ARGV[1]))
v[2] = clamp(tonumber(ARGV[2]))
redis.call('SET', KEYS[1], pack5(v))
redis.call('HSET', KEYS[2], 'edges', ver)
return {1, s or false}
";

/// KEYS: sds, guard, posts set, recv hash. ARGV: followings, followers, version.
///
/// The sampled check. Follow counts at the same version as the stored guard must be equal; if
/// they differ the counter drifted and is rewritten. A newer version is copied (the counter was
/// merely behind). Posts must equal the posts set and likes/favs received the sums of the recv
/// hash, whatever the version. Returns {drift (0|1), written (0|1)}; {-1, 0} when there is no
/// counter (the next read creates it).
const CHECK: &str = r"
local s = redis.call('GET', KEYS[1])
if (not s) or #s ~= 20 then return {-1, 0} end
local ver = tonumber(ARGV[3])
local cur = tonumber(redis.call('HGET', KEYS[2], 'edges') or '-1')
local v = unpack5(s)
local f, r = clamp(tonumber(ARGV[1])), clamp(tonumber(ARGV[2]))
local drift, write = 0, 0
if ver >= cur and (v[1] ~= f or v[2] ~= r) then
  if ver == cur then drift = 1 end
  v[1], v[2], write = f, r, 1
end
if ver > cur then redis.call('HSET', KEYS[2], 'edges', ver) end
local want = fresh(KEYS)
for i = 3, 5 do
  if v[i] ~= want[i] then v[i], drift, write = want[i], 1, 1 end
end
if write == 1 then redis.call('SET', KEYS[1], pack5(v)) end
return {drift, write}
";

/// KEYS: sds, recv hash. ARGV: quads (member `etype:eid`, seq, likes, favs): the entity's
/// current counts read together with its toggle sequence.
///
/// Copies each entity's counts into the owner's recv hash when its sequence is newer than the
/// stored one, and moves likes/favs received by the difference (if the counter exists; a
/// missing one is later created from the hash). Re-sending the same or an older state changes
/// nothing. Returns {likes delta, favs delta}.
const OWNER_SYNC: &str = r"
local dl, df = 0, 0
for i = 1, #ARGV, 4 do
  local q, l, f = tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
  local old = redis.call('HGET', KEYS[2], ARGV[i])
  local oq, ol, of = -1, 0, 0
  if old then oq, ol, of = parse_recv(old) end
  if q > oq then
    dl = dl + l - ol
    df = df + f - of
    redis.call('HSET', KEYS[2], ARGV[i], q .. ':' .. l .. ':' .. f)
  end
end
local s = redis.call('GET', KEYS[1])
if s and #s == 20 and (dl ~= 0 or df ~= 0) then
  local v = unpack5(s)
  v[4] = clamp(v[4] + dl)
  v[5] = clamp(v[5] + df)
  redis.call('SET', KEYS[1], pack5(v))
end
return {dl, df}
";

/// KEYS: sds, posts set, post times hash. ARGV: triples (op '+' published | '-' deleted,
/// member `etype:eid`, event time ms), in log order.
///
/// Each entity keeps the time of the last content event applied to it (negative for a
/// deletion); an event applies only when it is newer (at equal times a deletion wins), so a
/// duplicate, a replay or a late copy of an older event changes nothing. The posts counter
/// moves by what SADD/SREM changed. Returns the posts delta.
const APPLY_CONTENT: &str = r"
local d = 0
for i = 1, #ARGV, 3 do
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
local s = redis.call('GET', KEYS[1])
if s and #s == 20 and d ~= 0 then
  local v = unpack5(s)
  v[3] = clamp(v[3] + d)
  redis.call('SET', KEYS[1], pack5(v))
end
return d
";

/// The compiled scripts (EVALSHA with automatic script load).
#[derive(Clone)]
pub struct Scripts {
    /// Copy follow counts of a newer version ([`SYNC_EDGES`]).
    pub sync_edges: Script,
    /// The sampled check.
    pub check: Script,
    /// Copy entity counts into an owner's likes/favs received.
    pub owner_sync: Script,
    /// Content events: the posts set and counter.
    pub apply_content: Script,
}

impl Scripts {
    /// Every script, for loading after Redis lost them.
    pub fn all(&self) -> [&Script; 4] {
        [&self.sync_edges, &self.check, &self.owner_sync, &self.apply_content]
    }
}

impl Default for Scripts {
    fn default() -> Self {
        Self {
            sync_edges: Script::new(&format!("{LUA_SDS}{LUA_RECV}{SYNC_EDGES}")),
            check: Script::new(&format!("{LUA_SDS}{LUA_RECV}{CHECK}")),
            owner_sync: Script::new(&format!("{LUA_SDS}{LUA_RECV}{OWNER_SYNC}")),
            apply_content: Script::new(&format!("{LUA_SDS}{APPLY_CONTENT}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sds_round_trips_big_endian() {
        let s = Sds([1, 2, 3, u32::MAX, 0]);
        let bytes = s.encode();
        assert_eq!(&bytes[0..4], &[0, 0, 0, 1]);
        assert_eq!(Sds::decode(&bytes), Some(s));
        assert_eq!(Sds::decode(&bytes[..19]), None);
    }

    #[test]
    fn apply_floors_at_zero_and_saturates() {
        let mut s = Sds([0, 5, u32::MAX - 1, 0, 0]);
        s.apply([-3, -2, 10, 1, 0]);
        assert_eq!(s, Sds([0, 3, u32::MAX, 1, 0]));
    }
}
