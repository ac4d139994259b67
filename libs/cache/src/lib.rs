//! Redis for socialgraph: the bb8 pool, the key schema ([`keys`], the one place keys are
//! spelled) and the Lua scripts.

/// Lua: `venc(x, out)` appends the unsigned LEB128 varint of `x` (a non-negative integer below
/// 2^53) to the table `out`, one string a byte. A macro so that scripts can `concat!` it.
macro_rules! lua_varint {
    () => {
        r"
local function venc(x, out)
  repeat
    local b = x % 128
    x = (x - b) / 128
    if x > 0 then b = b + 128 end
    out[#out + 1] = string.char(b)
  until x == 0
end
"
    };
}

pub mod cluster;
pub mod counters;
pub mod entities;
pub mod entity_layout;
pub mod keys;
pub mod lists;
pub mod outbox_scripts;
pub mod rate_limit;
pub mod restrictions;

use std::time::Duration;

/// A pool of multiplexed, self-reconnecting Redis connections. Take one with [`conn`].
pub type Pool = bb8::Pool<Manager>;

pub use cluster::Conn;

/// The URL scheme of a Redis Cluster: `redis+cluster://host:port,host:port,…` names some of its
/// nodes (any one that answers gives the slot map).
pub const CLUSTER_SCHEME: &str = "redis+cluster://";

#[derive(Clone, Debug)]
enum Client {
    Single(Box<(redis::Client, redis::aio::ConnectionManagerConfig)>),
    Cluster(cluster::Cluster),
}

/// bb8 manager of multiplexed connections that reconnect by themselves
/// ([`redis::aio::ConnectionManager`]) to one server, or of handles on one [`cluster::Cluster`]
/// client (one such connection per node, shared), with our connect and response timeouts
/// (bb8-redis's manager keeps the client's 500 ms response timeout, below our settings).
#[derive(Clone, Debug)]
pub struct Manager {
    client: Client,
}

impl bb8::ManageConnection for Manager {
    type Connection = Conn;
    type Error = redis::RedisError;

    async fn connect(&self) -> Result<Self::Connection, Self::Error> {
        match &self.client {
            Client::Single(single) => {
                let (client, config) = single.as_ref();
                Ok(Conn::Single(redis::aio::ConnectionManager::new_lazy_with_config(client.clone(), config.clone())?))
            }
            Client::Cluster(cluster) => Ok(Conn::Cluster(cluster.clone(), 0)),
        }
    }

    async fn is_valid(&self, conn: &mut Self::Connection) -> Result<(), Self::Error> {
        redis::cmd("PING").query_async::<String>(conn).await.map(|_| ())
    }

    fn has_broken(&self, _: &mut Self::Connection) -> bool {
        false
    }
}

/// A Redis failure: unreachable, timed out, or an error reply.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// The URL is malformed (nothing was sent).
    #[error("invalid Redis URL: {0}")]
    Url(redis::RedisError),
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

impl CacheError {
    /// True when the failure is Redis being unreachable, slow, dropping the connection or
    /// answering that it cannot serve yet (LOADING its append-only file after a restart, and
    /// the other replies redis-rs says to wait on: TRYAGAIN, MASTERDOWN, CLUSTERDOWN): the
    /// caller should answer UNAVAILABLE and may retry. False for a bug-like failure.
    pub fn is_unavailable(&self) -> bool {
        match self {
            Self::Unavailable(_) | Self::Timeout => true,
            Self::Command(e) => {
                e.is_timeout()
                    || e.is_io_error()
                    || e.is_connection_dropped()
                    || e.is_connection_refusal()
                    || matches!(e.retry_method(), redis::RetryMethod::WaitAndRetry)
            }
            Self::Reply(_) | Self::Url(_) => false,
        }
    }
}

/// Builds a pool for `url` without connecting yet, so a service starts while Redis is down;
/// a connect and a response each wait at most `timeout`. `url` is a single server's
/// (`redis://host:port/db`) or a cluster's ([`CLUSTER_SCHEME`]`host:port,host:port`, a user and
/// password before the first host apply to every node). Connections are not tested on
/// checkout (bb8's default PING would be a second round trip on every call): a connection that
/// breaks fails the calls in flight on it and reconnects by itself for the next ones.
///
/// # Errors
/// The URL is malformed (a cluster's: no node, or a node that is not `HOST:PORT`).
pub fn pool(url: &str, max_size: u32, timeout: Duration) -> Result<Pool, CacheError> {
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout))
        .set_number_of_retries(1)
        .set_max_delay(timeout);
    let client = match url.strip_prefix(CLUSTER_SCHEME) {
        Some(rest) => {
            let (auth, hosts) = rest.rsplit_once('@').map_or((String::new(), rest), |(a, h)| (format!("{a}@"), h));
            Client::Cluster(cluster::Cluster::new(hosts, &auth, config).map_err(CacheError::Url)?)
        }
        None => Client::Single(Box::new((redis::Client::open(url).map_err(CacheError::Url)?, config))),
    };
    Ok(bb8::Pool::builder().max_size(max_size).connection_timeout(timeout).test_on_check_out(false).build_unchecked(Manager { client }))
}

/// Runs `call` (Redis work) for at most `timeout`.
///
/// # Errors
/// [`CacheError::Timeout`] when it took longer; else whatever `call` returned.
pub async fn within<T>(timeout: Duration, call: impl std::future::Future<Output = Result<T, CacheError>>) -> Result<T, CacheError> {
    tokio::time::timeout(timeout, call).await.map_err(|_| CacheError::Timeout)?
}

/// Runs `pipe` on a connection of `pool` in one round trip, within `timeout`. When Redis lost
/// its scripts (NOSCRIPT, after a restart or a flush of the script cache), loads `scripts` and
/// runs the pipeline once more. On a cluster the pipeline is split by slot ([`cluster`]).
///
/// # Errors
/// Unavailable, timed out, an error reply, or a reply that is not a `T`.
pub async fn query_pipeline<T: redis::FromRedisValue>(
    pool: &Pool,
    timeout: Duration,
    pipe: &redis::Pipeline,
    scripts: &[&redis::Script],
) -> Result<T, CacheError> {
    query_pipeline_ordered(pool, timeout, pipe, scripts, 0).await
}

/// [`query_pipeline`] where the first `first` commands complete before the others start, also
/// on a cluster ([`Conn::ordered_first`]; a single server runs a pipeline in order anyway).
///
/// # Errors
/// As [`query_pipeline`].
pub async fn query_pipeline_ordered<T: redis::FromRedisValue>(
    pool: &Pool,
    timeout: Duration,
    pipe: &redis::Pipeline,
    scripts: &[&redis::Script],
    first: usize,
) -> Result<T, CacheError> {
    within(timeout, async {
        let mut conn = conn(pool).await?.ordered_first(first);
        match pipe.query_async::<T>(&mut conn).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                for s in scripts {
                    s.prepare_invoke().load_async(&mut conn).await?;
                }
                Ok(pipe.query_async::<T>(&mut conn).await?)
            }
            other => Ok(other?),
        }
    })
    .await
}

/// A connection of `pool` for any number of commands. The connection is multiplexed, so it is
/// cloned out and the pool slot returned at once: concurrent callers pipeline their commands on
/// the same socket instead of queueing for an exclusive checkout.
///
/// # Errors
/// [`CacheError::Unavailable`] when no connection could be had within the pool's timeout.
pub async fn conn(pool: &Pool) -> Result<Conn, CacheError> {
    Ok(pool.get().await.map_err(|e| CacheError::Unavailable(e.to_string()))?.clone())
}

#[cfg(test)]
mod tests {
    use redis::{ErrorKind, RedisError, ServerErrorKind};

    use super::CacheError;

    fn server(kind: ServerErrorKind) -> CacheError {
        CacheError::Command(RedisError::from((ErrorKind::Server(kind), "reply")))
    }

    #[test]
    fn a_redis_still_loading_its_data_is_unavailable_not_a_bug() {
        for kind in [ServerErrorKind::BusyLoading, ServerErrorKind::TryAgain, ServerErrorKind::MasterDown, ServerErrorKind::ClusterDown] {
            assert!(server(kind).is_unavailable(), "{kind:?}");
        }
        for kind in [ServerErrorKind::ResponseError, ServerErrorKind::NoScript, ServerErrorKind::CrossSlot] {
            assert!(!server(kind).is_unavailable(), "{kind:?}");
        }
    }
}
