//! Like/favourite facts and counts of entities, in an adaptive layout.
//!
//! Each entity has one state string `sg:ent:{etype:eid}` ([`crate::keys::EntityKeys::state`])
//! that holds its toggle sequence, its two counts and, per metric, where each actor's fact
//! lives. Like the containers of compressed-bitmap libraries, the representation follows the
//! density of the actors, and the toggle script converts it in the same step that flips a fact:
//! - **small array**: actors below 2^32 as ascending LEB128 deltas inside the state, while they
//!   are few or spread out (at most [`SMALL_MAX`]);
//! - **bitmap chunks**: a chunk of 32,768 actors (`chunk = uid / 32768`, `bit = uid % 32768`,
//!   4 KiB at most, key `sg:bm:{etype:eid}:{metric}:{chunk}`) once its members cost more in the
//!   array than the bitmap would; back to the array when it empties to a quarter of that;
//! - **big array**: actors at or above 2^32 (snowflake-like ids) as ascending 8-byte
//!   big-endian ids inside the state (at most [`BIG_MAX`]);
//! - **spill set**: `sg:bms:{etype:eid}:{metric}`, members 8-byte big-endian ids, when the arrays
//!   outgrow their bounds and the bitmaps would not pay (a plain set's cost); back into the
//!   arrays when it shrinks to [`UNSPILL_AT`]. Each time the set doubles its chunks are looked at
//!   again, and those dense enough move into bitmaps (a hot entity ends as bitmaps whatever
//!   order its likes came in).
//!
//! So a few likes cost a few bytes inside one key, a dense entity a bit per actor. The toggle
//! script flips the fact, bumps the sequence, moves the count and appends the ActionEvent to the
//! entity's outbox in one atomic step: the count is exact by construction (no consumer applies
//! it, so no duplicate event can move it) and no event is lost when the broker is down.
//!
//! State format, version 1 (LEB128 varints): the byte 1, then seq, like count, fav count; then
//! for like and for fav a shape (bits: 1 spilled, 2 bitmap chunks, 4 small actors, 8 big
//! actors) and only the parts it names: the spill set's size at the last look; the chunk count
//! and per chunk (delta from the previous chunk id, population); the small count and the small
//! actors' deltas; the big count and 8 big-endian bytes per big actor. An empty metric is one
//! byte. Lua numbers are doubles, so big ids stay byte strings there (big-endian order is
//! numeric order).

use redis::Script;

/// Actors per bitmap chunk.
pub const CHUNK_BITS: u64 = 32_768;
/// Actor ids at or above this never go to bitmap chunks (2^32).
pub const SPARSE_FROM: i64 = 1 << 32;
/// Most actors below 2^32 a metric keeps in its small array before chunks turn to bitmaps or
/// the array spills.
pub const SMALL_MAX: usize = 1024;
/// Most actors at or above 2^32 a metric keeps in its big array before it spills (a plain set
/// of 8-byte integers leaves its compact encoding at 512 members, so the array is the smaller
/// up to here).
pub const BIG_MAX: usize = 768;
/// A spilled metric moves back into its arrays when its spill set holds this many (a plain
/// set's compact encoding ends here too, so a spilled metric never costs more than one).
pub const UNSPILL_AT: usize = 512;
/// Index of like in the counts.
pub const LIKE_INDEX: usize = 1;
/// Index of fav in the counts.
pub const FAV_INDEX: usize = 2;

/// Shared Lua of the entity scripts: `decode` / `encode` of the state, membership (`has`),
/// `flip` with its conversions and `recount`. Public so that tools and tests can compose a
/// script that reads or rewrites a state in place, atomically.
pub const LUA_STATE: &str = concat!(
    lua_varint!(),
    r"
local CHUNK, SMALL_MAX, BIG_MAX, UNSPILL_AT = 32768, 1024, 768, 512
local BM_OVERHEAD, CONVERT_MIN, RESCAN_MAX = 96, 96, 131072
local function vlen(x)
  local n = 1
  while x >= 128 do x = math.floor(x / 128); n = n + 1 end
  return n
end
local function reader(s)
  local i = 2
  local r = {}
  function r.v()
    local v, mul = 0, 1
    repeat
      local b = string.byte(s, i)
      if not b then error('truncated') end
      i = i + 1
      v = v + (b % 128) * mul
      mul = mul * 128
    until b < 128
    return v
  end
  function r.bytes(n)
    if i + n - 1 > #s then error('truncated') end
    local x = string.sub(s, i, i + n - 1)
    i = i + n
    return x
  end
  function r.done() return i == #s + 1 end
  return r
end
-- Redis's clock in microseconds: the floor of every new toggle sequence, so that sequences
-- keep rising across a lost or flushed Redis (a state created again starts above every
-- sequence the old one handed out, unless it saw a million toggles a second)
local function clock_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function empty_metric() return {count = 0, spill = false, mark = 0, chunks = {}, small = {}, big = {}} end
-- seq, like count, fav count from the front of a state (0s for a missing one), or nil when
-- it is malformed there: what count reads need, without decoding the actors
local function header(s)
  if not s then return 0, 0, 0 end
  if string.byte(s, 1) ~= 1 then return nil end
  local r = reader(s)
  local ok, q, l, f = pcall(function() return r.v(), r.v(), r.v() end)
  if ok then return q, l, f end
  return nil
end
-- nil for a malformed state; an empty state for a missing one
local function decode(s)
  if not s then return {seq = 0, m = {empty_metric(), empty_metric()}} end
  if string.byte(s, 1) ~= 1 then return nil end
  local r = reader(s)
  local ok, st = pcall(function()
    local st = {seq = r.v(), m = {}}
    local counts = {r.v(), r.v()}
    for k = 1, 2 do
      local m = empty_metric()
      m.count = counts[k]
      local shape = r.v()
      local function part(bit) if math.floor(shape / bit) % 2 == 1 then return r.v() end return 0 end
      m.spill = shape % 2 == 1
      m.mark = part(1)
      local c = 0
      for j = 1, part(2) do c = c + r.v(); m.chunks[j] = {c, r.v()} end
      local x = 0
      for j = 1, part(4) do x = x + r.v(); m.small[j] = x end
      for j = 1, part(8) do m.big[j] = r.bytes(8) end
      st.m[k] = m
    end
    if not r.done() then error('trailing') end
    return st
  end)
  if ok then return st end
  return nil
end
local function encode(st)
  local out = {string.char(1)}
  venc(st.seq, out); venc(st.m[1].count, out); venc(st.m[2].count, out)
  for k = 1, 2 do
    local m = st.m[k]
    local shape = (m.spill and 1 or 0) + (#m.chunks > 0 and 2 or 0) + (#m.small > 0 and 4 or 0) + (#m.big > 0 and 8 or 0)
    venc(shape, out)
    if m.spill then venc(m.mark, out) end
    if #m.chunks > 0 then venc(#m.chunks, out) end
    local c = 0
    for _, ch in ipairs(m.chunks) do venc(ch[1] - c, out); venc(ch[2], out); c = ch[1] end
    if #m.small > 0 then venc(#m.small, out) end
    local x = 0
    for _, a in ipairs(m.small) do venc(a - x, out); x = a end
    if #m.big > 0 then venc(#m.big, out) end
    for _, b in ipairs(m.big) do out[#out + 1] = b end
  end
  return table.concat(out)
end
-- numeric order of two 8-byte big-endian ids (Lua's string < follows the locale)
local function lt8(x, y)
  local xh, xl = struct.unpack('>I4I4', x)
  local yh, yl = struct.unpack('>I4I4', y)
  return xh < yh or (xh == yh and xl < yl)
end
local function lt(x, y) return x < y end
-- first index whose element is not below x (in the order `less`, default <), and whether it is x
local function lower(list, x, less)
  less = less or lt
  local lo, hi = 1, #list + 1
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if less(list[mid], x) then lo = mid + 1 else hi = mid end
  end
  return lo, list[lo] == x
end
local function chunk_at(m, c)
  for j, ch in ipairs(m.chunks) do
    if ch[1] == c then return j end
    if ch[1] > c then return nil end
  end
  return nil
end
local function be8(a) return struct.pack('>I4>I4', math.floor(a / 4294967296), a % 4294967296) end
-- is the actor (number a when small, 8-byte b) set? keys: prefix of chunks, spill set
local function has(m, a, b, prefix, spill)
  if a then
    local c = math.floor(a / CHUNK)
    if chunk_at(m, c) then return redis.call('GETBIT', prefix .. c, a % CHUNK) == 1 end
    if m.spill then return redis.call('SISMEMBER', spill, b) == 1 end
    local _, found = lower(m.small, a)
    return found
  end
  if m.spill then return redis.call('SISMEMBER', spill, b) == 1 end
  local _, found = lower(m.big, b, lt8)
  return found
end
-- the small array's members of chunk c: first index, last index + 1
local function chunk_range(m, c)
  local lo = lower(m.small, c * CHUNK)
  local hi = lower(m.small, (c + 1) * CHUNK)
  return lo, hi
end
local function insert_chunk(m, c, pop)
  local j = 1
  while m.chunks[j] and m.chunks[j][1] < c do j = j + 1 end
  table.insert(m.chunks, j, {c, pop})
end
-- moves the small array's members of chunk c into its bitmap
local function to_bitmap(m, c, prefix)
  local lo, hi = chunk_range(m, c)
  for j = lo, hi - 1 do redis.call('SETBIT', prefix .. c, m.small[j] % CHUNK, 1) end
  for _ = lo, hi - 1 do table.remove(m.small, lo) end
  insert_chunk(m, c, hi - lo)
end
-- after an insert into chunk c of the small array: a bitmap when the members cost more
local function maybe_bitmap(m, c, prefix)
  local lo, hi = chunk_range(m, c)
  if hi - lo < 2 then return end
  local bytes, prev = 0, m.small[lo - 1] or 0
  for j = lo, hi - 1 do bytes = bytes + vlen(m.small[j] - prev); prev = m.small[j] end
  if bytes > BM_OVERHEAD + math.floor((m.small[hi - 1] % CHUNK) / 8) + 1 then to_bitmap(m, c, prefix) end
end
-- after a clear in bitmap chunk j: back to the small array when a quarter of the bitmap's cost
local function maybe_unbitmap(m, j, prefix)
  local c, pop = m.chunks[j][1], m.chunks[j][2]
  local key = prefix .. c
  if pop == 0 then redis.call('DEL', key); table.remove(m.chunks, j); return end
  if m.spill or #m.small + pop > SMALL_MAX then return end
  local bits = redis.call('GET', key) or ''
  if pop * 4 * 2 >= BM_OVERHEAD + #bits then return end
  local at = lower(m.small, c * CHUNK)
  for i = 1, #bits do
    local byte = string.byte(bits, i)
    for bit = 7, 0, -1 do
      local w = 2 ^ bit
      if byte >= w then
        byte = byte - w
        table.insert(m.small, at, c * CHUNK + (i - 1) * 8 + (7 - bit))
        at = at + 1
      end
    end
  end
  redis.call('DEL', key)
  table.remove(m.chunks, j)
end
local function spill_all(m, spill)
  for _, a in ipairs(m.small) do redis.call('SADD', spill, be8(a)) end
  for _, b in ipairs(m.big) do redis.call('SADD', spill, b) end
  m.small, m.big, m.spill = {}, {}, true
  m.mark = redis.call('SCARD', spill)
end
-- a spilled metric that doubled since its last look: chunks whose spilled members now pay as
-- a bitmap (CONVERT_MIN, about a plain set's cost a member) move into bitmaps; amortised O(1)
-- a toggle, and only while the set is at most RESCAN_MAX
local function rescan(m, prefix, spill)
  local n = redis.call('SCARD', spill)
  if n < 2 * math.max(m.mark, SMALL_MAX) or n > RESCAN_MAX then return end
  local per = {}
  for _, b in ipairs(redis.call('SMEMBERS', spill)) do
    local hi, lo = struct.unpack('>I4I4', b)
    if hi == 0 then
      local c = math.floor(lo / CHUNK)
      per[c] = per[c] or {}
      per[c][#per[c] + 1] = lo
    end
  end
  for c, list in pairs(per) do
    if #list >= CONVERT_MIN then
      for _, a in ipairs(list) do
        redis.call('SETBIT', prefix .. c, a % CHUNK, 1)
        redis.call('SREM', spill, be8(a))
      end
      insert_chunk(m, c, #list)
    end
  end
  m.mark = redis.call('SCARD', spill)
end
-- the small array over its bound: dense chunks to bitmaps, then spill what is left
local function rebalance(m, prefix, spill)
  if #m.small > SMALL_MAX then
    local per, order = {}, {}
    for _, a in ipairs(m.small) do
      local c = math.floor(a / CHUNK)
      if not per[c] then per[c] = 0; order[#order + 1] = c end
      per[c] = per[c] + 1
    end
    for _, c in ipairs(order) do
      if per[c] >= CONVERT_MIN then to_bitmap(m, c, prefix) end
    end
  end
  if #m.small > SMALL_MAX or #m.big > BIG_MAX then spill_all(m, spill) end
end
local function unspill(m, spill)
  if redis.call('SCARD', spill) > UNSPILL_AT then return end
  local members = redis.call('SMEMBERS', spill)
  table.sort(members, lt8)
  for _, b in ipairs(members) do
    local hi, lo = struct.unpack('>I4>I4', b)
    if hi == 0 then
      local at = lower(m.small, lo)
      table.insert(m.small, at, lo)
    else
      m.big[#m.big + 1] = b
    end
  end
  redis.call('DEL', spill)
  m.spill, m.mark = false, 0
end
-- sets (want) or clears the actor in metric m, which it is not yet / is; keys as `has`
local function flip(m, a, b, want, prefix, spill)
  m.count = m.count + (want and 1 or -1)
  local j = a and chunk_at(m, math.floor(a / CHUNK))
  if j then
    redis.call('SETBIT', prefix .. m.chunks[j][1], a % CHUNK, want and 1 or 0)
    m.chunks[j][2] = m.chunks[j][2] + (want and 1 or -1)
    if not want then
      maybe_unbitmap(m, j, prefix)
    end
    return
  end
  if m.spill then
    if want then
      redis.call('SADD', spill, b)
      rescan(m, prefix, spill)
    else
      redis.call('SREM', spill, b)
    end
    unspill(m, spill)
    return
  end
  local list, x, less = m.big, b, lt8
  if a then list, x, less = m.small, a, lt end
  local at = lower(list, x, less)
  if want then table.insert(list, at, x) else table.remove(list, at) end
  if a and want then maybe_bitmap(m, math.floor(a / CHUNK), prefix) end
  if want then rebalance(m, prefix, spill) end
end
-- recounts metric m from its facts (chunk populations by BITCOUNT; empty chunks dropped)
local function recount(m, prefix, spill)
  local n = #m.small + #m.big
  if m.spill then n = n + redis.call('SCARD', spill) end
  local kept = {}
  for _, ch in ipairs(m.chunks) do
    local pop = redis.call('BITCOUNT', prefix .. ch[1])
    if pop > 0 then kept[#kept + 1] = {ch[1], pop}; n = n + pop else redis.call('DEL', prefix .. ch[1]) end
  end
  m.chunks, m.count = kept, n
end
local function malformed() return redis.error_reply('ERR socialgraph: malformed entity state') end
",
);

/// KEYS: state, outbox, chunk prefix and spill set of the metric. ARGV: metric index (1 like,
/// 2 fav), the actor as a decimal id when below 2^32 else '', the actor as 8 big-endian bytes,
/// wanted (1 set / 0 clear), the outbox entry without its sequence
/// (`actor|owner|metric|delta|ms|tp`).
///
/// One atomic step: flips the fact (converting the metric's representation when it pays),
/// bumps the sequence (to at least Redis's clock in µs + 1, see `clock_us`), moves the count
/// and appends the event to the entity's outbox. Returns
/// {changed, seq}; an error reply when the state is malformed.
const TOGGLE: &str = r"
local st = decode(redis.call('GET', KEYS[1]))
if not st then return malformed() end
local m = st.m[tonumber(ARGV[1])]
local a = tonumber(ARGV[2])
local want = ARGV[4] == '1'
if has(m, a, ARGV[3], KEYS[3], KEYS[4]) == want then return {0, st.seq} end
flip(m, a, ARGV[3], want, KEYS[3], KEYS[4])
st.seq = math.max(st.seq + 1, clock_us() + 1)
redis.call('SET', KEYS[1], encode(st))
redis.call('RPUSH', KEYS[2], string.format('%d', st.seq) .. '|' .. ARGV[5])
return {1, st.seq}
";

/// KEYS: state, like chunk prefix, like spill set, fav chunk prefix, fav spill set. Recounts
/// both metrics from their facts and stores the counts (the admin rebuild; count reads take
/// the state's front, [`crate::entity_layout::header`]). Returns {like, fav}; a missing state
/// is {0, 0} and stays missing.
const RECOUNT: &str = r"
local s = redis.call('GET', KEYS[1])
if not s then return {0, 0} end
local st = decode(s)
if not st then return malformed() end
recount(st.m[1], KEYS[2], KEYS[3])
recount(st.m[2], KEYS[4], KEYS[5])
redis.call('SET', KEYS[1], encode(st))
return {st.m[1].count, st.m[2].count}
";

/// KEYS: state. Returns {seq, like, fav}: the counts with the toggle sequence they reflect (read
/// from the state's front; the actors are not decoded). A missing state is {now in µs, 0, 0}:
/// no likes as of now, newer than anything a Redis that lost it had said of it and older than
/// any toggle to come (a copy of a state read before a flush cannot outlive this one).
const STATE: &str = r"
local s = redis.call('GET', KEYS[1])
if not s then return {clock_us(), 0, 0} end
local q, l, f = header(s)
if not q then return malformed() end
return {q, l, f}
";

/// KEYS: as [`RECOUNT`]. ARGV: the actor as in [`TOGGLE`] (decimal or '', 8 bytes). Returns
/// {liked (0|1), faved (0|1)}.
const HAS: &str = r"
local st = decode(redis.call('GET', KEYS[1]))
if not st then return malformed() end
local a = tonumber(ARGV[1])
local l = has(st.m[1], a, ARGV[2], KEYS[2], KEYS[3])
local f = has(st.m[2], a, ARGV[2], KEYS[4], KEYS[5])
return {l and 1 or 0, f and 1 or 0}
";

/// The entity scripts.
#[derive(Clone)]
pub struct EntityScripts {
    /// Flip one fact, move the count, append the event to the outbox ([`TOGGLE`]).
    pub toggle: Script,
    /// The two counts recounted from the facts ([`RECOUNT`]).
    pub recount: Script,
    /// Counts with the sequence they reflect ([`STATE`]).
    pub state: Script,
    /// Whether one actor liked / faved ([`HAS`]).
    pub has: Script,
    /// Conditional removal from the pending set.
    pub unpend: Script,
    /// Removal of what a relay published from the head of an outbox ([`crate::outbox_scripts::TRIM`]).
    pub trim: Script,
}

impl EntityScripts {
    /// Every script, for loading after Redis lost them.
    pub fn all(&self) -> [&Script; 6] {
        [&self.toggle, &self.recount, &self.state, &self.has, &self.unpend, &self.trim]
    }
}

impl Default for EntityScripts {
    fn default() -> Self {
        Self {
            toggle: Script::new(&format!("{LUA_STATE}{TOGGLE}")),
            recount: Script::new(&format!("{LUA_STATE}{RECOUNT}")),
            state: Script::new(&format!("{LUA_STATE}{STATE}")),
            has: Script::new(&format!("{LUA_STATE}{HAS}")),
            unpend: Script::new(crate::outbox_scripts::UNPEND),
            trim: Script::new(crate::outbox_scripts::TRIM),
        }
    }
}

/// The two arguments that name an actor to the scripts: its decimal id when below 2^32 (else
/// empty) and its 8 big-endian bytes.
pub fn actor_args(actor_id: i64) -> (String, [u8; 8]) {
    let small = if actor_id < SPARSE_FROM { actor_id.to_string() } else { String::new() };
    (small, actor_id.to_be_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_actors_are_named_by_decimal_and_all_by_their_bytes() {
        assert_eq!(actor_args(7), ("7".to_owned(), [0, 0, 0, 0, 0, 0, 0, 7]));
        assert_eq!(actor_args(SPARSE_FROM - 1).0, "4294967295");
        assert_eq!(actor_args(SPARSE_FROM).0, "");
        assert_eq!(actor_args(1_700_000_000_000_000_000).1, 1_700_000_000_000_000_000i64.to_be_bytes());
    }

    #[test]
    fn the_bounds_in_lua_match_the_constants() {
        let head = format!("local CHUNK, SMALL_MAX, BIG_MAX, UNSPILL_AT = {CHUNK_BITS}, {SMALL_MAX}, {BIG_MAX}, {UNSPILL_AT}");
        assert!(LUA_STATE.contains(&head));
    }
}
