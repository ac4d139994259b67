//! Layered configuration: defaults < TOML file (`--config`) < environment
//! `SG_<SECTION>__<KEY>` (e.g. `SG_DATABASE__URL`). Unknown keys fail start-up, naming the key.

use std::path::Path;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize, de::DeserializeOwned};

/// Loads a `T` from its defaults, the optional TOML `file`, then `SG_*` environment variables.
///
/// # Errors
/// A malformed file, an unknown key, or a value of the wrong type (the message names the key).
pub fn load_config<T: Serialize + DeserializeOwned + Default>(file: Option<&Path>) -> Result<T, Box<figment::Error>> {
    let mut fig = Figment::from(Serialized::defaults(T::default()));
    if let Some(f) = file {
        fig = fig.merge(Toml::file_exact(f));
    }
    // SG_CONFIG names the file, SG_LOG_FORMAT the log format and SG_TRACE_FILTER the span
    // filter: none is a config key.
    let config: T = fig.merge(Env::prefixed("SG_").split("__").ignore(&["log_format", "config", "trace_filter"])).extract().map_err(Box::new)?;
    let value = figment::value::Value::serialize(&config).map_err(Box::new)?;
    check_positive(&value, "").map_err(|e| Box::new(figment::Error::from(e)))?;
    Ok(config)
}

/// Keys that size a pool, a timeout, a limit or a batch: 0 would make a pool or a timer panic,
/// or refuse every request, so it is refused at start-up with the key's name.
const POSITIVE_KEYS: &[&str] = &[
    "pool_size",
    "timeout_ms",
    "max_connections",
    "request_timeout_ms",
    "concurrency_limit",
    "concurrency_limit_per_connection",
    "ttl_secs",
    "import_batch_size",
    "relay_batch_size",
    "partitions",
    "request_deadline_ms",
    "followers_window",
    "posts_window",
    "relationship_max",
    "deep_pages_per_sec",
    "hot_staleness_ms",
    "max_body_bytes",
    "max_group_members",
    "max_header_bytes",
    "channels",
    "connect_timeout_ms",
];

/// Refuses 0 and negative numbers for every [`POSITIVE_KEYS`] key anywhere in `value` (`path`:
/// where it is).
fn check_positive(value: &figment::value::Value, path: &str) -> Result<(), String> {
    let figment::value::Value::Dict(_, dict) = value else { return Ok(()) };
    for (key, v) in dict {
        let at = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
        let n = v.to_i128().or_else(|| v.to_u128().and_then(|u| i128::try_from(u).ok()));
        if let Some(n) = n.filter(|n| *n < 1 && POSITIVE_KEYS.contains(&key.as_str())) {
            return Err(format!("{at} must be at least 1, got {n}"));
        }
        check_positive(v, &at)?;
    }
    Ok(())
}

/// The `[server]` section every service has.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerSettings {
    /// gRPC listen address.
    pub grpc_addr: std::net::SocketAddr,
    /// Admin HTTP listen address (`/metrics`, `/ready`, `/live`).
    pub admin_addr: std::net::SocketAddr,
    /// Per-request deadline; longer RPCs end with DEADLINE_EXCEEDED.
    pub request_timeout_ms: u64,
    /// RPCs in flight across all connections; beyond it requests are shed with
    /// RESOURCE_EXHAUSTED.
    pub concurrency_limit: usize,
    /// RPCs in flight on one connection.
    pub concurrency_limit_per_connection: usize,
    /// How long shutdown waits for in-flight RPCs, in milliseconds, and then again for each
    /// later stop step (see [`crate::stop`]).
    pub drain_timeout_ms: u64,
}

impl ServerSettings {
    /// Defaults with the given ports on 0.0.0.0.
    pub fn with_ports(grpc: u16, admin: u16) -> Self {
        Self {
            grpc_addr: ([0, 0, 0, 0], grpc).into(),
            admin_addr: ([0, 0, 0, 0], admin).into(),
            request_timeout_ms: 10_000,
            concurrency_limit: 1024,
            concurrency_limit_per_connection: 256,
            drain_timeout_ms: 10_000,
        }
    }
}

impl Default for ServerSettings {
    fn default() -> Self {
        Self::with_ports(50051, 9101)
    }
}

/// `[database]`: the SQL database of relation-svc or projection-svc. One section for both;
/// each service's defaults come from [`DatabaseSettings::with_pool`].
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseSettings {
    /// `postgres://…`, `mysql://…` or `sqlite://file?mode=rwc`.
    pub url: String,
    /// Pool size.
    pub max_connections: u32,
    /// Run pending migrations at start.
    pub migrate_on_start: bool,
    /// Name under which a consuming service stores its offsets in `consumer_offset`
    /// (projection-svc; relation-svc consumes nothing and ignores it).
    pub consumer_name: String,
}

impl DatabaseSettings {
    /// The local development database with a pool of `max_connections`.
    pub fn with_pool(max_connections: u32) -> Self {
        Self {
            url: "postgres://postgres@127.0.0.1:5432/socialgraph".into(),
            max_connections,
            migrate_on_start: false,
            consumer_name: "projection".into(),
        }
    }
}

impl Default for DatabaseSettings {
    fn default() -> Self {
        Self::with_pool(16)
    }
}

/// `[redis]`: relation-svc's (rate limits) or counter-svc's (counters and facts). Defaults
/// per service from [`RedisSettings::with_pool`].
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RedisSettings {
    /// `redis://host:port/db`.
    pub url: String,
    /// Prefix of every key (empty in production).
    pub key_prefix: String,
    /// Pool size.
    pub pool_size: u32,
    /// Longest wait for a connection, a command or a script.
    pub timeout_ms: u64,
}

impl RedisSettings {
    /// The local Redis with `pool_size` connections and a `timeout_ms` per round trip.
    pub fn with_pool(pool_size: u32, timeout_ms: u64) -> Self {
        Self { url: "redis://127.0.0.1:6379".into(), key_prefix: String::new(), pool_size, timeout_ms }
    }
}

impl Default for RedisSettings {
    fn default() -> Self {
        Self::with_pool(16, 250)
    }
}

/// `[cache]`: the cache Redis of the list caches (relation-svc reads and fills them,
/// projection-svc keeps them in step with the events). A Redis of its own that may evict
/// (`maxmemory-policy allkeys-lru`); never the counters' Redis, which holds facts. An empty `url`
/// turns the caches off (every read goes to the database).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheSettings {
    /// `redis://host:port/db` of the cache Redis; empty: no caches.
    pub url: String,
    /// Prefix of every key (empty in production); relation-svc and projection-svc must agree.
    pub key_prefix: String,
    /// Pool size (connections are multiplexed: a few serve many callers).
    pub pool_size: u32,
    /// Longest wait for one cache round trip before the read falls back to the database.
    pub timeout_ms: u64,
    /// Lifetime of a cached list after its fill (s); eviction may end it sooner.
    pub ttl_secs: u64,
    /// Most entries of a cached following list; a longer list keeps its newest ones, and pages
    /// and checks past them read the database (relation-svc).
    pub following_max: i64,
    /// Most followers cached per account, newest first (projection-svc); pages past them are
    /// deep pages.
    pub followers_window: i64,
    /// Most posts cached per author, newest first (projection-svc's ListAuthorPosts); pages
    /// past them read the database.
    pub posts_window: i64,
    /// Most candidates remembered per account in the follower-relationship hash that answers
    /// BatchCheckFollowers past the followers window (projection-svc).
    pub relationship_max: i64,
    /// Deep follower pages (past the cached window) one projection-svc instance reads from the
    /// database per second; more are refused with RESOURCE_EXHAUSTED `DEEP_PAGE_LIMITED`.
    pub deep_pages_per_sec: u32,
    /// Reads a second after which an account's follower pages are also held in the instance's
    /// memory (projection-svc); 0 turns the local caches off.
    pub hot_reads_per_sec: u32,
    /// Longest an instance serves a follower page from its memory (ms): the local caches'
    /// staleness bound.
    pub hot_staleness_ms: u64,
    /// Background list fills one instance runs at once per cache (following lists in
    /// relation-svc, follower windows in projection-svc); a miss while every slot is taken
    /// waits in the queue of `fill_rows_per_sec`, or with no budget starts none (a later miss
    /// tries again).
    pub fill_slots: usize,
    /// Which miss of a list, counted per instance within 60 s, starts its fill: 1, the first;
    /// 2 leaves a list read only once uncached, so that cold read costs the database one page
    /// query and not also a read of the whole list.
    pub fill_after_misses: u32,
    /// Entries the fills of one instance write per second between them, per cache (a token
    /// bucket with bursts of a tenth of a second's budget, at least one fill part). A fill reads
    /// its list from the database when it gets a slot, and a slot is held until its fill is
    /// written, so the fills' database reads follow the same pace on average. A miss while
    /// every slot is taken then waits in a queue of [`socialgraph_cache::lists::FILL_QUEUE`].
    /// 0: no budget, and no queue.
    pub fill_rows_per_sec: u32,
}

/// `cache.fill_rows_per_sec` by default (see the README's performance section for how it was
/// chosen).
pub const DEFAULT_FILL_ROWS_PER_SEC: u32 = 20_000;

impl Default for CacheSettings {
    fn default() -> Self {
        Self {
            url: String::new(),
            key_prefix: String::new(),
            pool_size: 4,
            timeout_ms: 100,
            ttl_secs: 3600,
            following_max: 10_000,
            followers_window: 10_000,
            posts_window: 1000,
            relationship_max: 10_000,
            deep_pages_per_sec: 50,
            hot_reads_per_sec: 50,
            hot_staleness_ms: 1000,
            fill_slots: socialgraph_cache::lists::FILL_SLOTS,
            fill_after_misses: 1,
            fill_rows_per_sec: DEFAULT_FILL_ROWS_PER_SEC,
        }
    }
}

impl CacheSettings {
    /// The fill slots of one list cache of one instance: `fill_slots` at once, each list
    /// filled from its `fill_after_misses`-th miss, within `fill_rows_per_sec` (then queued).
    pub fn fill_slots(&self) -> socialgraph_cache::lists::FillSlots {
        use socialgraph_cache::lists::{FILL_QUEUE, FillSlots};
        let queue = if self.fill_rows_per_sec == 0 { 0 } else { FILL_QUEUE };
        FillSlots::admitting(self.fill_slots, self.fill_after_misses).queueing(queue).pacing(self.fill_rows_per_sec)
    }

    /// The list caches of these settings over one pool; `None` when `url` is empty.
    ///
    /// # Errors
    /// The URL is malformed.
    pub fn list_caches(&self) -> Result<Option<socialgraph_cache::lists::ListCaches>, socialgraph_cache::CacheError> {
        use socialgraph_cache::lists::{Direction, Limits, ListCache, ListCaches};
        if self.url.is_empty() {
            return Ok(None);
        }
        let timeout = std::time::Duration::from_millis(self.timeout_ms);
        let pool = socialgraph_cache::pool(&self.url, self.pool_size, timeout)?;
        let keys = socialgraph_cache::keys::Keys::new(self.key_prefix.clone());
        let limits = |window: i64| Limits {
            window: usize::try_from(window).unwrap_or(0),
            relationship_max: usize::try_from(self.relationship_max).unwrap_or(0),
            ttl: std::time::Duration::from_secs(self.ttl_secs),
            timeout,
        };
        Ok(Some(ListCaches {
            following: ListCache::new(pool.clone(), keys.clone(), Direction::Following, limits(self.following_max)),
            followers: ListCache::new(pool.clone(), keys.clone(), Direction::Followers, limits(self.followers_window)),
            posts: ListCache::new(pool.clone(), keys.clone(), Direction::Posts, limits(self.posts_window)),
            restrictions: socialgraph_cache::restrictions::RestrictionCache::new(pool, keys, std::time::Duration::from_secs(self.ttl_secs), timeout),
        }))
    }
}

/// `[kafka]`: brokers, the mesh's topic names, topic creation and the request deadline, for
/// every service; the `relay_*` keys are the outbox relays (relation-svc, message-svc,
/// projection-svc).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaSettings {
    /// Bootstrap brokers, `host:port`.
    pub brokers: Vec<String>,
    /// Topic of relation events (`sg.relation.v1`).
    pub relation_topic: String,
    /// Topic of content events (`sg.content.v1`; counter-svc).
    pub content_topic: String,
    /// Topic of like/fav events (`sg.counter.v1`; counter-svc produces and consumes it).
    pub counter_topic: String,
    /// Topic of conversation events (`sg.message.v1`; message-svc produces it).
    pub message_topic: String,
    /// Topic of account lifecycle events (`sg.account.v1`; relation-svc produces it,
    /// message-svc consumes it).
    pub account_topic: String,
    /// Topic of follow counts (`sg.edge_count.v1`; projection-svc produces it through its
    /// outbox, counter-svc consumes it).
    pub edge_count_topic: String,
    /// Partitions of topics a service creates when they do not exist yet.
    pub partitions: i32,
    /// How long one Kafka request is retried before the caller backs off.
    pub request_deadline_ms: u64,
    /// Outbox rows per relay round (relation-svc, message-svc, projection-svc).
    pub relay_batch_size: usize,
    /// How often an idle relay looks for rows committed by other replicas (relation-svc,
    /// message-svc, projection-svc).
    pub relay_idle_poll_ms: u64,
    /// Run the outbox relay in this process (relation-svc, message-svc, projection-svc).
    pub relay_enabled: bool,
}

impl Default for KafkaSettings {
    fn default() -> Self {
        Self {
            brokers: vec!["127.0.0.1:9092".into()],
            relation_topic: socialgraph_events::RELATION_TOPIC.into(),
            content_topic: socialgraph_events::CONTENT_TOPIC.into(),
            counter_topic: socialgraph_events::COUNTER_TOPIC.into(),
            message_topic: socialgraph_events::MESSAGE_TOPIC.into(),
            account_topic: socialgraph_events::ACCOUNT_TOPIC.into(),
            edge_count_topic: socialgraph_events::EDGE_COUNT_TOPIC.into(),
            partitions: 12,
            request_deadline_ms: 5_000,
            relay_batch_size: 1000,
            relay_idle_poll_ms: 100,
            relay_enabled: true,
        }
    }
}

/// `[auth]`: this service's admin credentials and page-token key.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct AuthSettings {
    /// Bearer token of this service's admin RPCs (imports, scans, rebuilds); unset refuses them.
    #[serde(skip_serializing)]
    pub admin_token: Option<secrecy::SecretString>,
    /// HMAC key of page tokens; all replicas must share it. Unset: a fixed development key
    /// (a warning is logged), fine for one replica, forgeable by anyone who reads the source.
    /// counter-svc has no paged RPC and ignores it.
    #[serde(skip_serializing)]
    pub page_token_secret: Option<secrecy::SecretString>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zero_pool_timeout_or_limit_is_refused_naming_its_key() {
        #[derive(Serialize)]
        struct Svc {
            server: ServerSettings,
            cache: CacheSettings,
            redis: RedisSettings,
        }
        let ok = Svc { server: ServerSettings::with_ports(1, 2), cache: CacheSettings::default(), redis: RedisSettings::default() };
        let check = |s: &Svc| check_positive(&figment::value::Value::serialize(s).expect("serializable"), "");
        assert_eq!(check(&ok), Ok(()));
        let zero_pool = Svc { cache: CacheSettings { pool_size: 0, ..CacheSettings::default() }, ..ok };
        assert_eq!(check(&zero_pool), Err("cache.pool_size must be at least 1, got 0".to_owned()));
        let zero_timeout = Svc { server: ServerSettings { request_timeout_ms: 0, ..ServerSettings::with_ports(1, 2) }, ..zero_pool };
        assert!(check(&zero_timeout).is_err_and(|e| e.contains("request_timeout_ms") || e.contains("pool_size")));
        let zero_redis = Svc {
            server: ServerSettings::with_ports(1, 2),
            cache: CacheSettings::default(),
            redis: RedisSettings { timeout_ms: 0, ..RedisSettings::default() },
        };
        assert_eq!(check(&zero_redis), Err("redis.timeout_ms must be at least 1, got 0".to_owned()));
        let negative_window = Svc { cache: CacheSettings { posts_window: -5, ..CacheSettings::default() }, ..zero_redis };
        assert_eq!(check(&negative_window), Err("cache.posts_window must be at least 1, got -5".to_owned()));
    }
}
