//! The Lua of the list caches ([`super`]). Every script gets three keys of one user, all
//! tagged `{uid}`: `KEYS[1]` the sorted set, `KEYS[2]` the hash of versions and state,
//! `KEYS[3]` the relationship hash (used by follower windows only).
//!
//! Members are ids as 8 big-endian bytes, so byte order is numeric order for ids > 0 and
//! Redis' order of equal scores (by member bytes) is the database's tie order (peer id).
//! A version in `KEYS[2]` is negative when the member is not in the set at that version
//! (unfollowed, hidden, or older than a window's boundary).

/// Shared by every script:
/// - `consistent()`: the set holds as many members as `_n` says; when not (one of the two keys
///   was evicted) it deletes both and answers false.
/// - `ok()`: the state when the list is served (`c` complete, `w` newest members only).
/// - `newer(a, b)`: member `a` sorts after member `b` (bytewise).
/// - `now_ms()`: the Redis clock (TIME) in ms, for fill leases.
/// - `inwin(score, m)`: `(score, m)` is newer than the window's boundary (always true unless
///   the state is `w`).
/// - `merge_from(i)`: applies the changes `ARGV[i..]` (member, signed version, score)*, each
///   when its version is newer than the stored one and than an earlier change of the same
///   member in the call; a followed entry at or below the boundary is stored as not in the
///   set. One `find` reads the stored versions and one HSET, ZADD and ZREM write the result
///   (in slices of 4,000 arguments, under Lua's stack limit), so a part of 1,000 entries
///   costs a handful of commands instead of four per entry.
/// - `trim(window)`: keeps the newest `window` members; the ones dropped become negative and
///   the newest of them the boundary (`_bs` score, `_bm` member), state `w`.
/// - `rel(m, version, score, nonce)`: updates the relationship hash entry of `m` if one is
///   there: a pending one (`p:<nonce>`; with `nonce`, only its own) or an older version.
/// - `each(cmd, key, members)`: the replies of a per-member command (HMGET, ZMSCORE) in
///   member order, sent in slices of 4,000 like `bulk`, so a lookup of 100 members is one
///   command, not 100 (a LOOKUP of 100 members: 81 µs in Redis instead of 228 on a complete
///   list, 182 instead of 366 on a window with marks, measured with SLOWLOG).
/// - `find(cmd, key, size, members)`: `each` of ZMSCORE or HMGET on a sorted set or hash of
///   `size` entries, except that a collection small enough to be a listpack (Redis' default
///   limits: 128 set members, 512 hash fields) but of more than 16 entries, asked for more
///   than 50 members, is read whole and looked up in a Lua table. A listpack finds each member
///   by a linear scan, about 5 ns per entry and member; the whole read costs about 0.25 µs per
///   entry, so the two meet near 50 members. Measured with `INFO commandstats` on an idle
///   Redis 7.0, a LOOKUP of 100 members: in a 120-member set 139 → 99 µs, in a 500-field
///   relationship hash (a listpack then; it is a hashtable since, see [`LOOKUP`]) 283 → 171
///   µs; a fill of 500 entries in parts of 100 (the versions hash is a listpack until 512)
///   5.0 → 4.1 µs per entry, of 2,500 3.1 → 2.8.
pub const COMMON: &str = r"
local function consistent()
  local n = tonumber(redis.call('HGET', KEYS[2], '_n') or '-1')
  if redis.call('ZCARD', KEYS[1]) ~= n then
    redis.call('DEL', KEYS[1], KEYS[2])
    return false
  end
  return true
end
local function state()
  return redis.call('HGET', KEYS[2], '_s')
end
local function ok()
  local s = state()
  if (s == 'c' or s == 'w') and consistent() then return s end
  return false
end
local function newer(a, b)
  for i = 1, 8 do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x > y end
  end
  return false
end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function inwin(score, m)
  if state() ~= 'w' then return true end
  local s, bs = tonumber(score), tonumber(redis.call('HGET', KEYS[2], '_bs'))
  if s ~= bs then return s > bs end
  return newer(m, redis.call('HGET', KEYS[2], '_bm'))
end
local function bulk(cmd, key, args)
  for i = 1, #args, 4000 do
    redis.call(cmd, key, unpack(args, i, math.min(i + 3999, #args)))
  end
end
local function each(cmd, key, members)
  local replies = {}
  for i = 1, #members, 4000 do
    for _, v in ipairs(redis.call(cmd, key, unpack(members, i, math.min(i + 3999, #members)))) do
      replies[#replies + 1] = v
    end
  end
  return replies
end
local function find(cmd, key, size, members)
  local small = (cmd == 'ZMSCORE' and 128) or 512
  if size == 0 then return {} end
  if size > small or size <= 16 or #members <= 50 then return each(cmd, key, members) end
  local all = (cmd == 'ZMSCORE' and redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')) or redis.call('HGETALL', key)
  local at, out = {}, {}
  for i = 1, #all, 2 do at[all[i]] = all[i + 1] end
  for k, m in ipairs(members) do out[k] = at[m] or false end
  return out
end
local function merge_from(first)
  local members = {}
  for i = first, #ARGV, 3 do members[#members + 1] = ARGV[i] end
  if #members == 0 then return 0 end
  local stored = find('HMGET', KEYS[2], redis.call('HLEN', KEYS[2]), members)
  local windowed = state() == 'w'
  local bs, bm
  if windowed then
    bs, bm = tonumber(redis.call('HGET', KEYS[2], '_bs')), redis.call('HGET', KEYS[2], '_bm')
  end
  -- Per member: the stored version, then the newest change of the batch (in batch order).
  local old, new, order = {}, {}, {}
  for k, m in ipairs(members) do
    if old[m] == nil then
      old[m] = tonumber(stored[k] or '0')
      order[#order + 1] = m
    end
    local i = first + (k - 1) * 3
    local version, score = tonumber(ARGV[i + 1]), ARGV[i + 2]
    local cur = new[m] and new[m][1] or old[m]
    if math.abs(version) > math.abs(cur) then
      if version > 0 and windowed then
        local sc = tonumber(score)
        if not (sc > bs or (sc == bs and newer(m, bm))) then version = -version end
      end
      new[m] = {version, score}
    end
  end
  local hset, zadd, zrem, delta, changed = {}, {}, {}, 0, 0
  for _, m in ipairs(order) do
    local n = new[m]
    if n then
      changed = changed + 1
      hset[#hset + 1] = m
      hset[#hset + 1] = n[1]
      if n[1] > 0 then
        if old[m] <= 0 then delta = delta + 1 end
        zadd[#zadd + 1] = n[2]
        zadd[#zadd + 1] = m
      elseif old[m] > 0 then
        delta = delta - 1
        zrem[#zrem + 1] = m
      end
    end
  end
  bulk('HSET', KEYS[2], hset)
  bulk('ZADD', KEYS[1], zadd)
  bulk('ZREM', KEYS[1], zrem)
  if delta ~= 0 then redis.call('HINCRBY', KEYS[2], '_n', delta) end
  return changed
end
local function drop(m)
  local v = tonumber(redis.call('HGET', KEYS[2], m))
  redis.call('HSET', KEYS[2], m, -math.abs(v))
  redis.call('ZREM', KEYS[1], m)
  redis.call('HINCRBY', KEYS[2], '_n', -1)
end
local function trim(window)
  local over = redis.call('ZCARD', KEYS[1]) - window
  if over <= 0 then return end
  local out = redis.call('ZRANGE', KEYS[1], 0, over - 1, 'WITHSCORES')
  for i = 1, #out, 2 do drop(out[i]) end
  redis.call('HSET', KEYS[2], '_s', 'w', '_bs', out[#out], '_bm', out[#out - 1])
end
local function rel(m, version, score, nonce)
  local cur = redis.call('HGET', KEYS[3], m)
  if not cur then return end
  if string.sub(cur, 1, 1) == 'p' then
    if nonce and cur ~= 'p:' .. nonce then return end
  elseif math.abs(version) <= math.abs(tonumber(string.match(cur, '^(-?%d+)'))) then
    return
  end
  redis.call('HSET', KEYS[3], m, version .. ':' .. score)
end
";

/// APPLY: ARGV = window, (member, signed version, score)*. Updates the relationship hash's
/// entries (when the user has that hash: one EXISTS, not one HGET per change, for the
/// accounts that have none), then merges into a list that is served or being filled and trims
/// it to the window; returns the list entries changed (0 when the list is not cached). A set
/// this call created (the list was empty) gets the hash's lifetime, so it never outlives the
/// hash.
pub const APPLY: &str = r"
if redis.call('EXISTS', KEYS[3]) == 1 then
  for i = 2, #ARGV, 3 do rel(ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2]) end
end
local s = state()
if not s or not (s == 'c' or s == 'w' or string.sub(s, 1, 2) == 'f:') then return 0 end
if not consistent() then return 0 end
local changed = merge_from(2)
if s == 'c' or s == 'w' then trim(tonumber(ARGV[1])) end
if redis.call('PTTL', KEYS[1]) == -1 then
  local ttl = redis.call('PTTL', KEYS[2])
  if ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl) end
end
return changed
";

/// FILL_BEGIN: ARGV = nonce, ttl (s), lease (ms). Returns the state when the list is already
/// served (`c` or `w`), `x` when it is known to be too long to cache, `b` when another fill's
/// lease (`_fl`, a deadline in ms on the Redis clock) has not run out, else starts (or takes
/// over) a fill under `nonce` with a lease of `lease` ms and returns `f`.
pub const FILL_BEGIN: &str = r"
if state() == 'x' then return 'x' end
local served = ok()
if served then return served end
local s = state()
local now = now_ms()
if s and string.sub(s, 1, 2) == 'f:' and consistent() then
  if tonumber(redis.call('HGET', KEYS[2], '_fl') or '0') > now then return 'b' end
else
  redis.call('DEL', KEYS[1], KEYS[2])
  redis.call('HSET', KEYS[2], '_n', 0)
end
redis.call('HSET', KEYS[2], '_s', 'f:' .. ARGV[1], '_fl', now + tonumber(ARGV[3]))
redis.call('EXPIRE', KEYS[2], ARGV[2])
return 'f'
";

/// FILL_ADD: ARGV = nonce, lease (ms), (member, signed version, score)*: merges one part of a
/// fill's database read while the fill's marker is there and renews its lease; returns 1,
/// else 0.
pub const FILL_ADD: &str = r"
if state() ~= 'f:' .. ARGV[1] then return 0 end
if not consistent() then return 0 end
merge_from(3)
redis.call('HSET', KEYS[2], '_fl', now_ms() + tonumber(ARGV[2]))
return 1
";

/// FILL_COMMIT: ARGV = nonce, ttl (s), window, boundary score ('' when the read holds the
/// whole list), boundary member, (member, signed version, score)* of the database read (the
/// newest followed entries and the not-followed ones newer than the boundary). Merges, sets
/// the boundary, drops what is not newer than it, trims, and marks the list served if the
/// fill's marker is still there; returns 1, else 0.
pub const FILL_COMMIT: &str = r"
if state() ~= 'f:' .. ARGV[1] then return 0 end
if not consistent() then return 0 end
merge_from(6)
if ARGV[4] == '' then
  redis.call('HSET', KEYS[2], '_s', 'c')
else
  redis.call('HSET', KEYS[2], '_s', 'w', '_bs', ARGV[4], '_bm', ARGV[5])
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[4])) do
    if not inwin(redis.call('ZSCORE', KEYS[1], m), m) then drop(m) end
  end
end
trim(tonumber(ARGV[3]))
redis.call('EXPIRE', KEYS[2], ARGV[2])
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('EXPIRE', KEYS[1], ARGV[2]) end
return 1
";

/// TOO_LONG: ARGV = ttl (s). Remembers for `ttl` that the list cannot be cached (state `x`, no
/// entries), so reads go to the database without trying to fill it.
pub const TOO_LONG: &str = r"
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('HSET', KEYS[2], '_s', 'x')
redis.call('EXPIRE', KEYS[2], ARGV[1])
return 1
";

/// PAGE: ARGV = cursor score ('' for the first page), cursor member, limit. Returns false when
/// not served, else the state (`c` or `w`) then member, score, … in list order. With state
/// `w`, fewer entries than `limit` means the page runs past the window.
pub const PAGE: &str = r"
local s = ok()
if not s then return false end
local start = 0
if ARGV[1] ~= '' then
  start = redis.call('ZCOUNT', KEYS[1], '(' .. ARGV[1], '+inf')
  -- Ties at the cursor's score come before it when their member is not below the cursor's
  -- (the cursor's own entry included).
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[1], ARGV[1])) do
    if not newer(ARGV[2], m) then start = start + 1 end
  end
end
local limit = tonumber(ARGV[3])
local out = {s}
if limit <= 0 then return out end
for _, v in ipairs(redis.call('ZREVRANGE', KEYS[1], start, start + limit - 1, 'WITHSCORES')) do
  out[#out + 1] = v
end
return out
";

/// LOOKUP: ARGV = nonce ('' marks nothing; else unknown members are marked `p:<nonce>` in the
/// relationship hash, taking over another reader's pending mark), ttl (s), members. Per member:
/// its score when followed, 'n' when not, 'u' when neither the list nor the relationship hash
/// knows (the caller asks the database).
///
/// Every marking also sets the hash's field `_h` to a value longer than Redis' default
/// `hash-max-listpack-value` (64 bytes), so the hash is a hashtable from its first entry (a
/// hash written before this field existed, or a Redis whose limit was raised past 65 bytes,
/// keeps a listpack: slower lookups, the same answers): a
/// lookup of 100 candidates (HMGET, here and in the transaction of
/// [`super::transactions`]) then costs about 5 µs in Redis instead of 42 (a listpack of 100
/// fields, scanned per candidate) to 200 (of 500), for about 2.7 times the memory (8.4 KB
/// instead of 3.1 KB for 100 entries; `INFO commandstats` and `MEMORY USAGE`, Redis 7.0). No
/// member is 2 bytes long, so `_h` never answers a lookup; [`REL_FILL`] leaves it out of the
/// hash's size.
pub const LOOKUP: &str = r"
local s = ok()
local members = {}
for i = 3, #ARGV do members[#members + 1] = ARGV[i] end
local scores = s and find('ZMSCORE', KEYS[1], redis.call('ZCARD', KEYS[1]), members) or {}
local out, asked = {}, {}
for k, m in ipairs(members) do
  if scores[k] then
    out[k] = scores[k]
  elseif s == 'c' then
    out[k] = 'n'
  else
    asked[#asked + 1] = k
  end
end
if #asked == 0 then return out end
local names = {}
for j, k in ipairs(asked) do names[j] = members[k] end
local known, marks = each('HMGET', KEYS[3], names), {}
for j, k in ipairs(asked) do
  local cur = known[j]
  if cur and string.sub(cur, 1, 1) ~= 'p' then
    local v, at = string.match(cur, '^(-?%d+):(.*)$')
    if tonumber(v) > 0 then out[k] = at else out[k] = 'n' end
  else
    out[k] = 'u'
    if ARGV[1] ~= '' then
      marks[#marks + 1] = members[k]
      marks[#marks + 1] = 'p:' .. ARGV[1]
    end
  end
end
if #marks > 0 then
  marks[#marks + 1] = '_h'
  marks[#marks + 1] = string.rep('h', 65)
  bulk('HSET', KEYS[3], marks)
  redis.call('EXPIRE', KEYS[3], ARGV[2])
end
return out
";

/// REL_FILL: ARGV = nonce, max entries, ttl (s), (member, signed version, score)* read from the
/// database after LOOKUP marked them under `nonce` (version 0: no edge). Sets the entries still
/// pending under this nonce, and older versions; an entry that is gone (evicted) or marked by a
/// later reader stays so. Deletes the hash when it holds more than `max` candidates (`_h`, see
/// [`LOOKUP`], is not one).
pub const REL_FILL: &str = r"
for i = 4, #ARGV, 3 do
  rel(ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2], ARGV[1])
end
if redis.call('HLEN', KEYS[3]) - 1 > tonumber(ARGV[2]) then
  redis.call('DEL', KEYS[3])
else
  redis.call('EXPIRE', KEYS[3], ARGV[3])
end
return 1
";

/// MARK: KEYS[1] the mark hash, ARGV = partition, next offset. Stores the position unless the
/// hash holds a later one for the partition (a late or repeated write of an older position
/// changes nothing); not wrapped in [`COMMON`] (its key is not a list's).
pub const MARK: &str = r"
local cur = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '-1')
if tonumber(ARGV[2]) > cur then redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end
return 1
";

/// COUNT: -1 unless the list is complete, else its members.
pub const COUNT: &str = r"
if ok() ~= 'c' then return -1 end
return redis.call('ZCARD', KEYS[1])
";
