//! The scripts of counter-svc's like/fav outbox relay: it removes an entity from the index of
//! pending outboxes only when no toggle re-registered it, and removes from an outbox only what
//! it published.

/// KEYS: pending set. ARGV: member, score read. Removes the member only if no toggle
/// re-registered it since (its score is unchanged).
pub const UNPEND: &str = r"
local s = redis.call('ZSCORE', KEYS[1], ARGV[1])
if s and tonumber(s) == tonumber(ARGV[2]) then return redis.call('ZREM', KEYS[1], ARGV[1]) end
return 0
";

/// KEYS: an entity's outbox. ARGV: how many entries the relay read from its head, the last
/// of them as read, the highest sequence among them (0 when none parsed). Removes exactly
/// what the relay read and the broker acknowledged; returns the outbox's length after.
///
/// The entry at the read count's place is the last one read when no other relay trimmed in
/// between (entries are unique: each starts with the entity's sequence), so the head goes in
/// one LTRIM. Otherwise (a relay whose produce outlived its lease, while the next one trimmed
/// and toggles appended; or a FLUSHALL) trimming by count would remove events nobody
/// published; the head goes instead while its sequence is at most the highest read (an entry
/// with no sequence, which is published nowhere, goes too).
pub const TRIM: &str = r"
local n = tonumber(ARGV[1])
if redis.call('LINDEX', KEYS[1], n - 1) == ARGV[2] then
  redis.call('LTRIM', KEYS[1], n, -1)
else
  local last = tonumber(ARGV[3])
  while true do
    local head = redis.call('LINDEX', KEYS[1], 0)
    if not head then break end
    local seq = tonumber(string.match(head, '^(%d+)|'))
    if seq and seq > last then break end
    redis.call('LPOP', KEYS[1])
  end
end
return redis.call('LLEN', KEYS[1])
";
