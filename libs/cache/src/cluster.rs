//! One connection type for a single Redis and for a Redis Cluster.
//!
//! Every key of socialgraph is hash-tagged by the user or entity it belongs to (`{u}`,
//! `{post:7}`, see [`crate::keys`]), so each Lua script and each command touches one slot. A
//! pipeline, though, often spans many users or entities (a consumer batch, a batch read). On a
//! cluster [`Conn`] therefore splits a pipeline by the slot of each command's first key: the
//! commands of one slot run in their pipeline order, one after the other, and the slots run
//! concurrently; the replies come back in pipeline order, as from a single server.
//!
//! The routing is ours, on top of redis-rs's single-server connections: a slot map read with
//! `CLUSTER SLOTS`, one multiplexed connection per primary, and the redirects of the cluster
//! specification followed per command — MOVED (the slot has a new owner: remember it, resend
//! there), ASK (the key is being migrated: resend to the target after ASKING, once) and
//! TRYAGAIN, CLUSTERDOWN, MASTERDOWN and LOADING (nothing was executed: wait a little, resend).
//! A command whose connection broke is not resent (it may have run); the slot map is read
//! again and the caller sees the error, as on a single server. redis-rs's own cluster client
//! (1.8.1) stopped answering for good after a slot migration under load in our test (its slot
//! refresh never completed), which is why it is not used.
//!
//! What a single server gives and a cluster does not: commands of different slots in one
//! pipeline are not ordered against each other. Where a caller relies on that order it says so
//! with [`Conn::ordered_first`] (an index entry written before the fact it indexes, a position
//! mark before the batch it marks); writes that must follow a whole batch (a consumer's offsets)
//! are sent in a later round trip. A command's keys must share one slot (CROSSSLOT otherwise).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use futures::future::try_join_all;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{Arg, Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult, RetryMethod, ServerErrorKind, Value};

/// Hash slots of a Redis Cluster.
pub const SLOTS: u16 = 16_384;
/// Most sends of one command (redirects and waits included).
const ATTEMPTS: u32 = 16;

/// A connection to a single Redis (self-reconnecting, multiplexed) or to a Redis Cluster
/// (multiplexed per node, following the cluster's slot map). Cheap to clone.
#[derive(Clone)]
pub enum Conn {
    /// One server.
    Single(ConnectionManager),
    /// A cluster, and how many leading commands of each pipeline complete before the rest start.
    Cluster(Cluster, usize),
}

impl Conn {
    /// On a cluster, the first `n` commands of every pipeline sent on this connection complete
    /// before the others start, as on a single server (which runs a pipeline in order anyway).
    /// The cost on a cluster is one more round trip per pipeline.
    #[must_use]
    pub fn ordered_first(self, n: usize) -> Self {
        match self {
            Self::Cluster(c, _) => Self::Cluster(c, n),
            single => single,
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
            Self::Cluster(c, _) => Box::pin(c.run(cmd)),
        }
    }

    fn req_packed_commands<'a>(&'a mut self, pipeline: &'a Pipeline, offset: usize, count: usize) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Self::Cluster(c, first) => Box::pin(c.clone().pipeline(pipeline, offset, count, *first)),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Cluster(..) => 0,
        }
    }
}

/// A Redis Cluster client: the slot map and one connection per node, shared by its clones.
#[derive(Clone)]
pub struct Cluster(Arc<Inner>);

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster").field("seeds", &self.0.seeds).finish_non_exhaustive()
    }
}

struct Inner {
    /// `host:port` of the nodes named in the URL, asked for the slot map when none known is.
    seeds: Vec<String>,
    /// `user:password@` or empty, for every node.
    auth: String,
    config: ConnectionManagerConfig,
    nodes: Mutex<HashMap<String, ConnectionManager>>,
    /// The owner (`host:port`) of each slot.
    slots: RwLock<Vec<Option<Arc<str>>>>,
    /// When the slot map was last read; held while it is read, so one task reads it at a time.
    refreshed: tokio::sync::Mutex<Option<Instant>>,
}

/// Where a command goes.
enum Target {
    Slot(u16),
    /// Any node (no key).
    Any,
    /// Every primary (SCRIPT LOAD and FLUSH, FLUSHALL, FLUSHDB).
    All,
}

impl Cluster {
    /// A client for the nodes `hosts` (`host:port,host:port`), with `auth` (`user:password@`
    /// or empty) for every node and `config` for each node's connection. Connects on first use.
    ///
    /// # Errors
    /// No node, or a node that is not `host:port`.
    pub fn new(hosts: &str, auth: &str, config: ConnectionManagerConfig) -> RedisResult<Self> {
        let seeds: Vec<String> = hosts.trim_end_matches('/').split(',').filter(|h| !h.is_empty()).map(str::to_owned).collect();
        let invalid = |what: String| RedisError::from((ErrorKind::InvalidClientConfig, "invalid Redis Cluster URL", what));
        if seeds.is_empty() {
            return Err(invalid("it names no node (redis+cluster://HOST:PORT,HOST:PORT)".into()));
        }
        for s in &seeds {
            let port = s.rsplit_once(':').and_then(|(h, p)| (!h.is_empty()).then_some(p)).and_then(|p| p.parse::<u16>().ok());
            if port.is_none() || s.contains('/') {
                return Err(invalid(format!("node {s:?} is not HOST:PORT")));
            }
        }
        Ok(Self(Arc::new(Inner {
            seeds,
            auth: auth.to_owned(),
            config,
            nodes: Mutex::new(HashMap::new()),
            slots: RwLock::new(vec![None; usize::from(SLOTS)]),
            refreshed: tokio::sync::Mutex::new(None),
        })))
    }

    fn node(&self, addr: &str) -> RedisResult<ConnectionManager> {
        let mut nodes = self.0.nodes.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(c) = nodes.get(addr) {
            return Ok(c.clone());
        }
        let client = redis::Client::open(format!("redis://{}{addr}", self.0.auth))?;
        let conn = ConnectionManager::new_lazy_with_config(client, self.0.config.clone())?;
        nodes.insert(addr.to_owned(), conn.clone());
        Ok(conn)
    }

    fn owner(&self, slot: u16) -> Option<Arc<str>> {
        self.0.slots.read().unwrap_or_else(std::sync::PoisonError::into_inner)[usize::from(slot)].clone()
    }

    fn primaries(&self) -> Vec<Arc<str>> {
        let slots = self.0.slots.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut out: Vec<Arc<str>> = Vec::new();
        for a in slots.iter().flatten() {
            if !out.contains(a) {
                out.push(Arc::clone(a));
            }
        }
        out
    }

    /// Reads the slot map (`CLUSTER SLOTS`) from the first known node or seed that answers,
    /// unless another task read it in the last 100 ms.
    async fn refresh(&self) -> RedisResult<()> {
        let mut refreshed = self.0.refreshed.lock().await;
        if refreshed.is_some_and(|at| at.elapsed() < Duration::from_millis(100)) {
            return Ok(());
        }
        let mut candidates: Vec<String> = self.primaries().iter().map(|a| a.to_string()).collect();
        candidates.extend(self.0.seeds.iter().filter(|s| !candidates.contains(s)).cloned().collect::<Vec<_>>());
        let mut last = RedisError::from((ErrorKind::Server(ServerErrorKind::ClusterDown), "no node of the cluster is known"));
        for addr in candidates {
            let reply = match self.node(&addr) {
                Ok(mut conn) => redis::cmd("CLUSTER").arg("SLOTS").query_async::<Value>(&mut conn).await,
                Err(e) => Err(e),
            };
            match reply.and_then(|v| slot_map(v, host_of(&addr))) {
                Ok(map) => {
                    *self.0.slots.write().unwrap_or_else(std::sync::PoisonError::into_inner) = map;
                    *refreshed = Some(Instant::now());
                    return Ok(());
                }
                // Unreachable, or not a cluster node at all ("cluster support disabled": the
                // URL names a single server): either way no slot is served, which callers
                // answer as unavailable, with the reason in the log.
                Err(e) if e.is_io_error() || e.is_timeout() || e.is_connection_refusal() || e.is_connection_dropped() => last = e,
                Err(e) => {
                    last = RedisError::from((
                        ErrorKind::Server(ServerErrorKind::ClusterDown),
                        "no slot map from the node of a redis+cluster:// URL",
                        format!("{addr} answered CLUSTER SLOTS with: {e}"),
                    ))
                }
            }
        }
        Err(last)
    }

    async fn owner_or_refresh(&self, slot: u16) -> RedisResult<Arc<str>> {
        if let Some(a) = self.owner(slot) {
            return Ok(a);
        }
        self.refresh().await?;
        self.owner(slot).ok_or_else(|| (ErrorKind::Server(ServerErrorKind::ClusterDown), "no node serves the slot").into())
    }

    /// Sends one command where its key lives, following redirects (see the module doc).
    async fn run(&self, cmd: &Cmd) -> RedisResult<Value> {
        let slot = match target(cmd) {
            Target::Slot(s) => s,
            Target::Any => 0,
            Target::All => return self.broadcast(cmd).await,
        };
        let (mut ask, mut wait) = (None::<String>, Duration::from_millis(5));
        for _ in 0..ATTEMPTS {
            let reply = match ask.take() {
                Some(addr) => {
                    let mut pipe = redis::pipe();
                    pipe.cmd("ASKING").add_command(cmd.clone());
                    self.node(&addr)?.req_packed_commands(&pipe, 0, 2).await.map(|mut v| v.pop().unwrap_or(Value::Nil))
                }
                None => self.node(&self.owner_or_refresh(slot).await?)?.req_packed_command(cmd).await,
            };
            let error = match reply {
                Ok(Value::ServerError(e)) => RedisError::from(e),
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            match error.retry_method() {
                RetryMethod::MovedRedirect | RetryMethod::AskRedirect => {
                    let Some((addr, s)) = error.redirect_node() else { return Err(error) };
                    if error.kind() == ErrorKind::Server(ServerErrorKind::Moved) {
                        self.0.slots.write().unwrap_or_else(std::sync::PoisonError::into_inner)[usize::from(s % SLOTS)] = Some(Arc::from(addr));
                    } else {
                        ask = Some(addr.to_owned());
                    }
                }
                RetryMethod::WaitAndRetry => {
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_millis(200));
                }
                RetryMethod::NoRetry => return Err(error),
                // The connection broke: the command may have run, so it is not resent.
                _ => {
                    let _ = self.refresh().await;
                    return Err(error);
                }
            }
        }
        Err((ErrorKind::Server(ServerErrorKind::TryAgain), "still redirected or busy after 16 sends").into())
    }

    /// Sends `cmd` to every primary; the first error, else the last reply.
    async fn broadcast(&self, cmd: &Cmd) -> RedisResult<Value> {
        if self.primaries().is_empty() {
            self.refresh().await?;
        }
        let mut last = Value::Nil;
        for addr in self.primaries() {
            last = self.node(&addr)?.req_packed_command(cmd).await?.extract_error()?;
        }
        Ok(last)
    }

    /// Runs `count` commands of `pipeline` from `offset` (the whole of it: this project sends no
    /// MULTI on a cluster): the first `first`, then the rest, each part with one slot's
    /// commands in order and the slots concurrently; the replies in pipeline order.
    async fn pipeline(self, pipeline: &Pipeline, offset: usize, count: usize, first: usize) -> RedisResult<Vec<Value>> {
        if pipeline.is_transaction() {
            return Err((ErrorKind::Client, "MULTI/EXEC is not supported on a Redis Cluster by this client").into());
        }
        let cmds: Vec<&Cmd> = pipeline.cmd_iter().skip(offset).take(count).collect();
        let first = first.min(cmds.len());
        let mut out = Vec::with_capacity(cmds.len());
        for part in [&cmds[..first], &cmds[first..]] {
            let runs = try_join_all(slot_groups(part).into_iter().map(|group| {
                let this = self.clone();
                async move {
                    let mut replies = Vec::with_capacity(group.len());
                    for i in group {
                        replies.push((i, this.run(part[i]).await?));
                    }
                    RedisResult::Ok(replies)
                }
            }))
            .await?;
            let mut replies = vec![Value::Nil; part.len()];
            for (i, v) in runs.into_iter().flatten() {
                replies[i] = v;
            }
            out.extend(replies);
        }
        Ok(out)
    }
}

fn host_of(addr: &str) -> &str {
    addr.rsplit_once(':').map_or(addr, |(h, _)| h)
}

/// The owner of each slot from a `CLUSTER SLOTS` reply (`[[start, end, [host, port, id, …],
/// replicas…], …]`); an empty host means the node asked (`asked_host`).
fn slot_map(reply: Value, asked_host: &str) -> RedisResult<Vec<Option<Arc<str>>>> {
    let mut map = vec![None; usize::from(SLOTS)];
    let ranges: Vec<Vec<Value>> = redis::from_redis_value(reply)?;
    for r in ranges {
        let (Some(start), Some(end), Some(primary)) = (r.first(), r.get(1), r.get(2)) else { continue };
        let (start, end): (u16, u16) = (redis::from_redis_value(start.clone())?, redis::from_redis_value(end.clone())?);
        let node: Vec<Value> = redis::from_redis_value(primary.clone())?;
        let (Some(host), Some(port)) = (node.first(), node.get(1)) else { continue };
        let (host, port): (String, u16) = (redis::from_redis_value(host.clone())?, redis::from_redis_value(port.clone())?);
        let host = if host.is_empty() || host == "?" { asked_host.to_owned() } else { host };
        let addr: Arc<str> = Arc::from(format!("{host}:{port}"));
        for s in start..=end.min(SLOTS - 1) {
            map[usize::from(s)] = Some(Arc::clone(&addr));
        }
    }
    Ok(map)
}

/// The slot of `key`: CRC16 (XMODEM) of its hash tag (the part between the first `{` and the
/// next `}`, when not empty) or of the whole key, modulo 16384 (Redis Cluster specification,
/// "Keys distribution model").
pub fn slot_of(key: &[u8]) -> u16 {
    let tag = key
        .iter()
        .position(|b| *b == b'{')
        .and_then(|open| key[open + 1..].iter().position(|b| *b == b'}').filter(|len| *len > 0).map(|len| &key[open + 1..open + 1 + len]));
    crc16::State::<crc16::XMODEM>::calculate(tag.unwrap_or(key)) % SLOTS
}

fn target(cmd: &Cmd) -> Target {
    let args: Vec<&[u8]> = cmd
        .args_iter()
        .filter_map(|a| match a {
            Arg::Simple(s) => Some(s),
            _ => None,
        })
        .collect();
    let name = args.first().map(|n| n.to_ascii_uppercase()).unwrap_or_default();
    let sub = args.get(1).map(|n| n.to_ascii_uppercase()).unwrap_or_default();
    match (name.as_slice(), sub.as_slice()) {
        (b"FLUSHALL" | b"FLUSHDB", _) | (b"SCRIPT", b"LOAD" | b"FLUSH") => Target::All,
        _ => first_key(cmd).map_or(Target::Any, |k| Target::Slot(slot_of(k))),
    }
}

/// The indices of `cmds` grouped by the slot of each command's first key (commands without a
/// key form one group), each group in pipeline order, the groups in order of first appearance.
pub fn slot_groups(cmds: &[&Cmd]) -> Vec<Vec<usize>> {
    let mut at: HashMap<Option<u16>, usize> = HashMap::new();
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (i, cmd) in cmds.iter().enumerate() {
        let slot = first_key(cmd).map(slot_of);
        let g = *at.entry(slot).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[g].push(i);
    }
    groups
}

/// The first key of `cmd`: the argument after `numkeys` for EVAL, EVALSHA and FCALL (none when
/// `numkeys` is 0), none for the keyless commands this project sends (PING, TIME, SCRIPT,
/// CLUSTER, INFO), else the first argument.
fn first_key(cmd: &Cmd) -> Option<&[u8]> {
    let mut args = cmd.args_iter().filter_map(|a| match a {
        Arg::Simple(s) => Some(s),
        _ => None,
    });
    let name = args.next()?.to_ascii_uppercase();
    match name.as_slice() {
        b"EVAL" | b"EVALSHA" | b"EVAL_RO" | b"EVALSHA_RO" | b"FCALL" | b"FCALL_RO" => {
            let _script = args.next()?;
            let numkeys: usize = std::str::from_utf8(args.next()?).ok()?.parse().ok()?;
            if numkeys == 0 { None } else { args.next() }
        }
        b"PING" | b"TIME" | b"SCRIPT" | b"CLUSTER" | b"INFO" | b"FLUSHALL" | b"FLUSHDB" | b"DBSIZE" => None,
        _ => args.next(),
    }
}

#[cfg(test)]
#[path = "cluster_tests.rs"]
mod tests;
