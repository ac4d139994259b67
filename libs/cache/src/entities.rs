//! Like/favourite facts and counts of entities.
//!
//! The fact "who liked" is a bitmap sharded in chunks of 32,768 actors (`chunk = uid / 32768`,
//! `bit = uid % 32768`, 4 KiB a full chunk); actors with ids at or above [`SPARSE_FROM`] are
//! kept in a set instead, so that snowflake-like ids cost one set member (~60 bytes) rather
//! than a 4 KiB chunk each. A toggle script flips the fact and bumps the entity's sequence; the
//! count lives in a 20-byte counter (read, like, fav, comment, repost as big-endian u32) kept
//! by the consumer, which skips events already applied (offset guard) and events already in a
//! rebuilt value (sequence at or below the rebuild's base). A rebuild reads the sequence and
//! counts the facts in one script, so it is exact whatever is in flight.

use redis::Script;

/// Actors per bitmap chunk.
pub const CHUNK_BITS: u64 = 32_768;
/// Actor ids at or above this live in the sparse set (2^32).
pub const SPARSE_FROM: i64 = 1 << 32;
/// Index of like and fav in the entity counter.
pub const LIKE_INDEX: usize = 1;
/// Index of fav in the entity counter.
pub const FAV_INDEX: usize = 2;

const LUA_COUNT: &str = r"
local function count_metric(prefix, chunk_set, sparse)
  local n = 0
  for _, c in ipairs(redis.call('SMEMBERS', chunk_set)) do
    n = n + redis.call('BITCOUNT', prefix .. c)
  end
  return n + redis.call('SCARD', sparse)
end
local function rebuild(keys)
  -- keys: cnt, guard, seq, like prefix, like chunks, like sparse, fav prefix, fav chunks, fav sparse
  local seq = tonumber(redis.call('GET', keys[3]) or '0')
  local likes = count_metric(keys[4], keys[5], keys[6])
  local favs = count_metric(keys[7], keys[8], keys[9])
  redis.call('SET', keys[1], struct.pack('>I4I4I4I4I4', 0, likes, favs, 0, 0))
  redis.call('HSET', keys[2], 'base', seq)
  return {likes, favs}
end
";

/// KEYS: fact key (chunk or sparse set), chunk set, seq. ARGV: kind ('bit'|'set'), bit or
/// member, wanted (1 set / 0 clear), chunk id. Returns {changed, seq}.
const TOGGLE: &str = r"
local old
if ARGV[1] == 'bit' then old = redis.call('GETBIT', KEYS[1], ARGV[2])
else old = redis.call('SISMEMBER', KEYS[1], ARGV[2]) end
if old == tonumber(ARGV[3]) then return {0, 0} end
if ARGV[1] == 'bit' then
  redis.call('SETBIT', KEYS[1], ARGV[2], ARGV[3])
  if ARGV[3] == '1' then redis.call('SADD', KEYS[2], ARGV[4]) end
elseif ARGV[3] == '1' then redis.call('SADD', KEYS[1], ARGV[2])
else redis.call('SREM', KEYS[1], ARGV[2]) end
return {1, redis.call('INCR', KEYS[3])}
";

/// KEYS: as `rebuild`. ARGV: last offset of the batch, then quads (offset, seq, index, delta).
/// Rebuilds first when the counter is missing or malformed; skips events at or below the offset
/// guard or the rebuild base; one write per entity. Returns {applied like delta, fav delta}.
const APPLY: &str = r"
local off = tonumber(redis.call('HGET', KEYS[2], 'off') or '-1')
local last = tonumber(ARGV[1])
if off >= last then return {0, 0} end
local s = redis.call('GET', KEYS[1])
if (not s) or #s ~= 20 then rebuild(KEYS); s = redis.call('GET', KEYS[1]) end
local base = tonumber(redis.call('HGET', KEYS[2], 'base') or '0')
local v = {struct.unpack('>I4I4I4I4I4', s)}
local d = {0, 0, 0, 0, 0}
for i = 2, #ARGV, 4 do
  local o, q, idx, delta = tonumber(ARGV[i]), tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
  if o > off and q > base then d[idx + 1] = d[idx + 1] + delta end
end
for i = 1, 5 do
  local x = v[i] + d[i]
  if x < 0 then x = 0 elseif x > 4294967295 then x = 4294967295 end
  v[i] = x
end
redis.call('SET', KEYS[1], struct.pack('>I4I4I4I4I4', v[1], v[2], v[3], v[4], v[5]))
redis.call('HSET', KEYS[2], 'off', last)
return {d[2], d[3]}
";

/// KEYS: as `rebuild`. ARGV: '1' to force. Rebuilds when forced or when the counter is missing
/// or malformed (so concurrent readers of a hot entity rebuild it once); returns {like, fav}.
const READ_OR_REBUILD: &str = r"
local s = redis.call('GET', KEYS[1])
if ARGV[1] ~= '1' and s and #s == 20 then
  local v = {struct.unpack('>I4I4I4I4I4', s)}
  return {v[2], v[3]}
end
return rebuild(KEYS)
";

/// KEYS: pending set. ARGV: member, score read. Removes the member only if no toggle
/// re-registered it since (its score is unchanged).
const UNPEND: &str = r"
local s = redis.call('ZSCORE', KEYS[1], ARGV[1])
if s and tonumber(s) == tonumber(ARGV[2]) then return redis.call('ZREM', KEYS[1], ARGV[1]) end
return 0
";

/// The entity scripts.
#[derive(Clone)]
pub struct EntityScripts {
    /// Flip one fact.
    pub toggle: Script,
    /// Apply a batch of events to one entity.
    pub apply: Script,
    /// Read, rebuilding if missing (or forced).
    pub read_or_rebuild: Script,
    /// Conditional removal from the pending set.
    pub unpend: Script,
}

impl Default for EntityScripts {
    fn default() -> Self {
        Self {
            toggle: Script::new(TOGGLE),
            apply: Script::new(&format!("{LUA_COUNT}{APPLY}")),
            read_or_rebuild: Script::new(&format!("{LUA_COUNT}{READ_OR_REBUILD}")),
            unpend: Script::new(UNPEND),
        }
    }
}

/// Where an actor's fact lives: (`bit` and bit offset in chunk `c`) or (`set` and member).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// Bit `bit` of chunk `chunk`.
    Bit {
        /// Chunk id.
        chunk: u64,
        /// Bit inside the chunk.
        bit: u64,
    },
    /// Member of the sparse set.
    Sparse,
}

/// The slot of `actor_id` (> 0).
pub fn slot(actor_id: i64) -> Slot {
    if actor_id >= SPARSE_FROM {
        Slot::Sparse
    } else {
        let uid = actor_id as u64;
        Slot::Bit { chunk: uid / CHUNK_BITS, bit: uid % CHUNK_BITS }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actors_map_to_chunks_and_sparse_ids_to_the_set() {
        assert_eq!(slot(1), Slot::Bit { chunk: 0, bit: 1 });
        assert_eq!(slot(32_768), Slot::Bit { chunk: 1, bit: 0 });
        assert_eq!(slot(SPARSE_FROM - 1), Slot::Bit { chunk: (SPARSE_FROM as u64 - 1) / CHUNK_BITS, bit: CHUNK_BITS - 1 });
        assert_eq!(slot(1_700_000_000_000_000_000), Slot::Sparse);
    }
}
