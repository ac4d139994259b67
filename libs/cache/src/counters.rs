//! Per-user counters: the 20-byte SDS string and the Lua scripts that change it.
//!
//! Layout (DESIGN.md §5): five big-endian u32, in order followings, followers, posts,
//! likes_received, favs_received. Decrements floor at 0, increments saturate at u32::MAX.
//!
//! Effectively-once: every change carries the log position it covers. A user's guard hash
//! holds, per `topic/partition`, the last offset reflected in the counters; a delta applies
//! only when the caller's expected guard matches (compare-and-set), and a rebuild writes only
//! when no guard is beyond the position its value reflects.

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

/// KEYS: sds, guard. ARGV: field, expected guard ('' = none), new guard, d1..d5.
/// Returns -1 when the guard moved (re-read and retry), 0 when the counters are missing or
/// malformed (guard still advanced: the delta is then covered by the next rebuild), 1 applied.
const APPLY_DELTA: &str = r"
local cur = redis.call('HGET', KEYS[2], ARGV[1])
if (cur or '') ~= ARGV[2] then return -1 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
local s = redis.call('GET', KEYS[1])
if (not s) or #s ~= 20 then return 0 end
local v = unpack5(s)
for i = 1, 5 do v[i] = clamp(v[i] + tonumber(ARGV[3 + i])) end
redis.call('SET', KEYS[1], pack5(v))
return 1
";

/// KEYS: sds, guard, posts set. ARGV: field, expected guard, new guard, then pairs
/// (op, member) with op '+' (published) or '-' (deleted), in log order. The posts counter moves
/// by what SADD/SREM changed, so repeats and deletes of unknown entities change nothing.
/// Returns like [`APPLY_DELTA`].
const APPLY_CONTENT: &str = r"
local cur = redis.call('HGET', KEYS[2], ARGV[1])
if (cur or '') ~= ARGV[2] then return -1 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
local d = 0
for i = 4, #ARGV, 2 do
  if ARGV[i] == '+' then d = d + redis.call('SADD', KEYS[3], ARGV[i + 1])
  else d = d - redis.call('SREM', KEYS[3], ARGV[i + 1]) end
end
local s = redis.call('GET', KEYS[1])
if (not s) or #s ~= 20 then return 0 end
local v = unpack5(s)
v[3] = clamp(v[3] + d)
redis.call('SET', KEYS[1], pack5(v))
return 1
";

/// KEYS: sds, guard, posts set. ARGV: followings, followers, likes_received, favs_received,
/// then pairs (field, last offset reflected) of the log positions the values reflect.
/// Refuses (-1) when any listed guard is beyond the given position (the counters applied an
/// event the value does not hold: retry once the source caught up). Otherwise writes the
/// counters (posts = SCARD of the posts set, the fact) and sets those guards; returns the
/// previous string (false when there was none) so callers can tell a repair from a no-op.
const REBUILD: &str = r"
for i = 5, #ARGV, 2 do
  local cur = redis.call('HGET', KEYS[2], ARGV[i])
  if cur and tonumber(cur) > tonumber(ARGV[i + 1]) then return -1 end
end
local old = redis.call('GET', KEYS[1])
for i = 5, #ARGV, 2 do redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1]) end
local posts = redis.call('SCARD', KEYS[3])
local v = {clamp(tonumber(ARGV[1])), clamp(tonumber(ARGV[2])), clamp(posts), clamp(tonumber(ARGV[3])), clamp(tonumber(ARGV[4]))}
redis.call('SET', KEYS[1], pack5(v))
return {old or false}
";

/// The compiled scripts (EVALSHA with automatic script load).
#[derive(Clone)]
pub struct Scripts {
    /// See the constant of the same purpose.
    pub apply_delta: Script,
    /// Content events: the posts set and counter.
    pub apply_content: Script,
    /// Guarded rebuild write.
    pub rebuild: Script,
}

impl Default for Scripts {
    fn default() -> Self {
        Self {
            apply_delta: Script::new(&format!("{LUA_SDS}{APPLY_DELTA}")),
            apply_content: Script::new(&format!("{LUA_SDS}{APPLY_CONTENT}")),
            rebuild: Script::new(&format!("{LUA_SDS}{REBUILD}")),
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
