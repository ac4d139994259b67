//! Redis for socialgraph: the bb8 pool, the key schema ([`keys`], the one place keys are
//! spelled) and the Lua scripts.

pub mod counters;
pub mod entities;
pub mod keys;
pub mod rate_limit;

use std::time::Duration;

pub use bb8_redis::RedisConnectionManager;

/// A pool of multiplexed Redis connections.
pub type Pool = bb8::Pool<RedisConnectionManager>;

/// A Redis failure: unreachable, timed out, or an error reply.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// No connection could be had from the pool in time.
    #[error("redis unavailable: {0}")]
    Unavailable(String),
    /// The command failed or returned an unexpected reply.
    #[error("redis command failed: {0}")]
    Command(#[from] redis::RedisError),
    /// A reply did not have the expected shape.
    #[error("unexpected redis reply: {0}")]
    Reply(#[from] redis::ParsingError),
    /// The command took longer than allowed.
    #[error("redis command timed out")]
    Timeout,
}

/// Builds a pool for `url` without connecting yet, so a service starts while Redis is down;
/// each checkout waits at most `connect_timeout`.
///
/// # Errors
/// The URL is malformed.
pub fn pool(url: &str, max_size: u32, connect_timeout: Duration) -> Result<Pool, CacheError> {
    let manager = RedisConnectionManager::new(url)?;
    Ok(bb8::Pool::builder().max_size(max_size).connection_timeout(connect_timeout).build_unchecked(manager))
}
