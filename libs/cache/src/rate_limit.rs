//! A token bucket per key in Redis, checked and charged by one Lua script.
//!
//! Capacity `burst` tokens, refilled continuously at `refill_per_day` tokens a day; each
//! allowed call takes one token. The script reads Redis's own clock (`TIME`), so replicas with
//! skewed clocks agree. The bucket expires once it would be full again.

use std::time::Duration;

use redis::Script;

use crate::{CacheError, Pool};

const TOKEN_BUCKET: &str = r"
local now_t = redis.call('TIME')
local now = tonumber(now_t[1]) * 1000 + math.floor(tonumber(now_t[2]) / 1000)
local burst = tonumber(ARGV[1])
local rate = tonumber(ARGV[2]) / 86400000
local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(state[1]) or burst
local ts = tonumber(state[2]) or now
if now > ts then tokens = math.min(burst, tokens + (now - ts) * rate) end
local allowed, retry_ms = 0, 0
if tokens >= 1 then
  tokens = tokens - 1
  allowed = 1
else
  retry_ms = math.ceil((1 - tokens) / rate)
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil((burst - tokens) / rate) + 1000)
return {allowed, retry_ms}
";

/// A token-bucket limiter.
#[derive(Clone)]
pub struct TokenBucket {
    pool: Pool,
    script: Script,
    burst: u32,
    refill_per_day: u32,
    timeout: Duration,
}

/// The verdict on one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Allowed; one token was taken.
    Allowed,
    /// Refused; a token will be available after this long.
    Limited {
        /// Time until the next token.
        retry_after: Duration,
    },
}

impl TokenBucket {
    /// A limiter of `burst` tokens refilled at `refill_per_day`; each Redis call may take at most
    /// `timeout`.
    pub fn new(pool: Pool, burst: u32, refill_per_day: u32, timeout: Duration) -> Self {
        Self { pool, script: Script::new(TOKEN_BUCKET), burst, refill_per_day: refill_per_day.max(1), timeout }
    }

    /// Takes a token from the bucket at `key`.
    ///
    /// # Errors
    /// Redis is unreachable, slow, or failed; the caller decides to fail open or closed.
    pub async fn take(&self, key: &str) -> Result<Verdict, CacheError> {
        crate::within(self.timeout, async {
            let mut conn = crate::conn(&self.pool).await?;
            let (allowed, retry_ms): (i64, i64) = self.script.key(key).arg(self.burst).arg(self.refill_per_day).invoke_async(&mut conn).await?;
            Ok(if allowed == 1 { Verdict::Allowed } else { Verdict::Limited { retry_after: Duration::from_millis(retry_ms.max(1) as u64) } })
        })
        .await
    }
}
