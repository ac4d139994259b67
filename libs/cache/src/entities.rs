//! Like/favourite facts and counts of entities.
//!
//! The fact "who liked" is a bitmap sharded in chunks of 32,768 actors (`chunk = uid / 32768`,
//! `bit = uid % 32768`, 4 KiB a full chunk); actors with ids at or above [`SPARSE_FROM`] are
//! kept in a set instead, so that snowflake-like ids cost one set member (~60 bytes) rather
//! than a 4 KiB chunk each. One toggle script flips the fact, bumps the entity's sequence,
//! moves its 20-byte counter (read, like, fav, comment, repost as big-endian u32) and appends
//! the ActionEvent to the entity's outbox: the count is exact by construction (no consumer
//! applies it, so no duplicate event can move it) and no event is lost when the broker is down.

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
  -- keys: cnt, outbox, seq, like prefix, like chunks, like sparse, fav prefix, fav chunks, fav sparse
  local likes = count_metric(keys[4], keys[5], keys[6])
  local favs = count_metric(keys[7], keys[8], keys[9])
  redis.call('SET', keys[1], struct.pack('>I4I4I4I4I4', 0, likes, favs, 0, 0))
  return {likes, favs}
end
";

/// KEYS: the nine entity keys (see `rebuild`), then the fact key (chunk or sparse set).
/// ARGV: kind ('bit'|'set'), bit or member, wanted (1 set / 0 clear), chunk id, counter index
/// (1 like, 2 fav), the outbox entry without its sequence (`actor|owner|metric|delta|ms|tp`).
///
/// One atomic step: flips the fact, bumps the sequence, moves the count (rebuilding it from the
/// facts when missing), and appends the event to the entity's outbox. Returns {changed, seq}.
const TOGGLE: &str = r"
local fact = KEYS[10]
local idx = tonumber(ARGV[5])
local old
if ARGV[1] == 'bit' then old = redis.call('GETBIT', fact, ARGV[2])
else old = redis.call('SISMEMBER', fact, ARGV[2]) end
if old == tonumber(ARGV[3]) then return {0, 0} end
if ARGV[1] == 'bit' then
  redis.call('SETBIT', fact, ARGV[2], ARGV[3])
  if ARGV[3] == '1' then redis.call('SADD', idx == 1 and KEYS[5] or KEYS[8], ARGV[4]) end
elseif ARGV[3] == '1' then redis.call('SADD', fact, ARGV[2])
else redis.call('SREM', fact, ARGV[2]) end
local seq = redis.call('INCR', KEYS[3])
local s = redis.call('GET', KEYS[1])
if (not s) or #s ~= 20 then
  rebuild(KEYS)
else
  local v = {struct.unpack('>I4I4I4I4I4', s)}
  local x = v[idx + 1] + (ARGV[3] == '1' and 1 or -1)
  if x < 0 then x = 0 elseif x > 4294967295 then x = 4294967295 end
  v[idx + 1] = x
  redis.call('SET', KEYS[1], struct.pack('>I4I4I4I4I4', v[1], v[2], v[3], v[4], v[5]))
end
redis.call('RPUSH', KEYS[2], seq .. '|' .. ARGV[6])
return {1, seq}
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

/// KEYS: as `rebuild`. Returns {seq, like, fav}: the counts with the toggle sequence they
/// reflect, read in one step (rebuilding a missing counter from the facts).
const STATE: &str = r"
local s = redis.call('GET', KEYS[1])
local seq = tonumber(redis.call('GET', KEYS[3]) or '0')
if s and #s == 20 then
  local v = {struct.unpack('>I4I4I4I4I4', s)}
  return {seq, v[2], v[3]}
end
local c = rebuild(KEYS)
return {seq, c[1], c[2]}
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
    /// Flip one fact, move the count, append the event to the outbox.
    pub toggle: Script,
    /// Read, rebuilding if missing (or forced).
    pub read_or_rebuild: Script,
    /// Counts with the sequence they reflect.
    pub state: Script,
    /// Conditional removal from the pending set.
    pub unpend: Script,
}

impl EntityScripts {
    /// Every script, for loading after Redis lost them.
    pub fn all(&self) -> [&Script; 4] {
        [&self.toggle, &self.read_or_rebuild, &self.state, &self.unpend]
    }
}

impl Default for EntityScripts {
    fn default() -> Self {
        Self {
            toggle: Script::new(&format!("{LUA_COUNT}{TOGGLE}")),
            read_or_rebuild: Script::new(&format!("{LUA_COUNT}{READ_OR_REBUILD}")),
            state: Script::new(&format!("{LUA_COUNT}{STATE}")),
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
