//! The floor of the bench's ratios: what any tonic service costs on this machine before it
//! does its own work. A bare tonic server (no layers, no span, no metrics, on a 2-worker runtime
//! of its own like each service of the bench, its store connections opened on that runtime,
//! TCP_NODELAY) answers `grpc.health.v1.Health/Check` after doing the raw work its part names
//! by the request's `service` field: a ZREVRANGE or the PostgreSQL page (cache part), a GET or
//! an MGET of 100 (counters), the raw Follow transaction (relation), the Like toggle pipeline
//! (likes). Timed from the same clients beside the same raw work, these rows give about the best
//! ratio a gRPC call of that kind reaches here, and (beside a service's own health check) what
//! the service's stack adds.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use sea_orm::sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

use crate::cache::{none, timed};
use crate::load::CHANNELS;
use crate::raw::{FOLLOWING_PAGE_SQL, zrevrange};
use crate::report::{Hist, Run};

/// The raw work a bare call does before it answers, given the request's `service` field.
pub(crate) type RawOp = Arc<dyn Fn(String) -> Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>> + Send + Sync>;

/// A health service whose `check` first does its [`RawOp`] on the request's `service` field.
/// A failed op answers UNAVAILABLE.
#[derive(Clone)]
struct RawWork(RawOp);

#[tonic::async_trait]
impl Health for RawWork {
    async fn check(&self, request: Request<HealthCheckRequest>) -> Result<Response<HealthCheckResponse>, Status> {
        (self.0)(request.into_inner().service).await.map_err(|e| Status::unavailable(format!("{e:#}")))?;
        Ok(Response::new(HealthCheckResponse { status: ServingStatus::Serving as i32 }))
    }

    type WatchStream = tokio_stream::Empty<Result<HealthCheckResponse, Status>>;

    async fn watch(&self, _: Request<HealthCheckRequest>) -> Result<Response<Self::WatchStream>, Status> {
        Err(Status::unimplemented("watch"))
    }
}

/// A bare tonic server serving [`RawWork`] on a 2-worker runtime of its own; dropping it stops
/// the server and the runtime.
pub(crate) struct Bare {
    /// The server's runtime (`None` once dropped).
    runtime: Option<tokio::runtime::Runtime>,
    /// Stops the server.
    stop: CancellationToken,
    /// Where it listens (loopback, a free port).
    addr: std::net::SocketAddr,
}

impl Bare {
    /// Serves on a free loopback port the op that `make` builds. `make` runs on the server's
    /// runtime, so the pools and connections it opens are driven there, as a service's are.
    ///
    /// # Errors
    /// The runtime or the listener could not be made, or `make` failed.
    pub(crate) async fn start<F, Fut>(make: F) -> anyhow::Result<Self>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = anyhow::Result<RawOp>> + Send + 'static,
    {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_name("bare").enable_all().build()?;
        let op = runtime.spawn(make()).await??;
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stop = CancellationToken::new();
        let token = stop.clone();
        runtime.spawn(async move {
            let served = async {
                let listener = tokio::net::TcpListener::from_std(listener)?;
                let incoming = tokio_stream::StreamExt::map(tokio_stream::wrappers::TcpListenerStream::new(listener), |tcp| {
                    tcp.inspect(|s| {
                        let _ = s.set_nodelay(true);
                    })
                });
                let server = tonic::transport::Server::builder().add_service(HealthServer::new(RawWork(op)));
                server.serve_with_incoming_shutdown(incoming, token.cancelled_owned()).await?;
                anyhow::Ok(())
            };
            if let Err(e) = served.await {
                println!("\n  * the bare tonic server failed: {e:#}");
            }
        });
        Ok(Self { runtime: Some(runtime), stop, addr })
    }

    /// `n` clients, each on a connection of its own (a channel's clones share one HTTP/2
    /// connection).
    pub(crate) async fn clients(&self, n: usize) -> anyhow::Result<Vec<HealthClient<Channel>>> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(HealthClient::new(Channel::from_shared(format!("http://{}", self.addr))?.connect().await?));
        }
        Ok(out)
    }
}

impl Drop for Bare {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// One call asking for `service`'s raw work.
pub(crate) async fn check(client: &HealthClient<Channel>, service: String) -> anyhow::Result<()> {
    client.clone().check(HealthCheckRequest { service }).await?;
    Ok(())
}

/// The throughput floor: `concurrency` callers on [`CHANNELS`] connections call a bare server
/// serving `make`'s op with `ask(i)` for i = 0.. until `max_ops` or `max_time` (as
/// [`crate::load::closed_loop`]), then stop it.
///
/// # Errors
/// The server could not start or not be reached.
pub(crate) async fn closed_loop<F, Fut, A>(make: F, concurrency: usize, max_ops: usize, max_time: Duration, ask: A) -> anyhow::Result<Run>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = anyhow::Result<RawOp>> + Send + 'static,
    A: Fn(usize) -> String + Send + Sync + 'static,
{
    let bare = Bare::start(make).await?;
    let clients = bare.clients(CHANNELS).await?;
    Ok(crate::load::closed_loop(concurrency, max_ops, max_time, move |w, i| {
        let (c, asked) = (clients[w % clients.len()].clone(), ask(i));
        async move { check(&c, asked).await }
    })
    .await)
}

/// The floor rows of the cache part: (label, the bare server's latencies, the raw work's).
pub(crate) type FloorRows = Vec<(&'static str, Hist, Hist)>;

/// Where the cache part's floor reads: the cache Redis (with relation-svc's pool size and
/// timeout) and the mesh's PostgreSQL (with relation-svc's pool size).
pub(crate) struct Stores<'a> {
    /// The cache Redis.
    pub cache: &'a socialgraph_server::CacheSettings,
    /// The mesh's database URL.
    pub db_url: String,
    /// relation-svc's database pool size.
    pub db_pool: u32,
}

/// The cache part's floor: `users.len()` sequential calls of each kind from one client (an
/// empty call, ZREVRANGE of the users' cached following sets `set_keys`, the PostgreSQL page of
/// the same users), each followed by the same raw work straight from the bench (`redis`, `pg`).
///
/// # Errors
/// The server could not start or a call failed.
pub(crate) async fn cache_rows(
    stores: Stores<'_>,
    redis: &MultiplexedConnection,
    pg: &PgPool,
    users: &[i64],
    set_keys: &[String],
) -> anyhow::Result<FloorRows> {
    let (cache, db_url, db_pool) = (stores.cache.clone(), stores.db_url, stores.db_pool);
    let bare = Bare::start(move || async move {
        let redis = socialgraph_cache::pool(&cache.url, cache.pool_size, Duration::from_millis(cache.timeout_ms))?;
        let pg = sea_orm::sqlx::postgres::PgPoolOptions::new().max_connections(db_pool).connect(&db_url).await?;
        let op: RawOp = Arc::new(move |asked: String| {
            let (redis, pg) = (redis.clone(), pg.clone());
            Box::pin(async move {
                match asked.split_once(':') {
                    Some(("zrevrange", key)) => zrevrange(&mut socialgraph_cache::conn(&redis).await?, key).await?,
                    Some(("pg", user)) => {
                        sea_orm::sqlx::query(FOLLOWING_PAGE_SQL).bind(user.parse::<i64>()?).fetch_all(&pg).await?;
                    }
                    _ => {}
                }
                Ok(())
            })
        });
        Ok(op)
    })
    .await?;
    let client = bare.clients(1).await?.remove(0);
    let n = users.len();
    let empty = timed(n, none, |_| check(&client, String::new())).await?;
    let ping = timed(n, none, |_| {
        let mut conn = redis.clone();
        async move { Ok(redis::cmd("PING").query_async::<String>(&mut conn).await.map(drop)?) }
    })
    .await?;
    let bare_redis = timed(n, none, |i| check(&client, format!("zrevrange:{}", set_keys[i]))).await?;
    let raw_redis = crate::raw::pages(redis, set_keys).await?;
    let bare_pg = timed(n, none, |i| check(&client, format!("pg:{}", users[i]))).await?;
    let raw_pg = crate::raw::sql(pg, FOLLOWING_PAGE_SQL, users, None).await?;
    Ok(vec![
        ("bare tonic server: empty call (raw: Redis PING)", empty, ping),
        ("bare tonic server + ZREVRANGE (raw: ZREVRANGE)", bare_redis, raw_redis),
        ("bare tonic server + PostgreSQL page (raw: the page)", bare_pg, raw_pg),
    ])
}
