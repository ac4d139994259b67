//! The floor of the bench's ratios: what any tonic service costs on this machine before it
//! does its own work. A bare tonic server (no layers, no span, no metrics, on a 2-worker runtime
//! of its own like each service of the bench) answers `grpc.health.v1.Health/Check` after doing
//! the raw work its part names by the request's `service` field: nothing, a ZREVRANGE, a GET or an
//! MGET (through the services' Redis pool), the cache part's PostgreSQL page, or the relation
//! part's raw Follow transaction. Timed from the same clients beside the same raw work, these
//! rows give the best ratio a gRPC call of that kind can reach here, and (beside a service's own
//! health check) what its layers add.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use redis::aio::MultiplexedConnection;
use sea_orm::sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

use crate::cache::timed;
use crate::report::Hist;

/// The PostgreSQL page of the cache part's cold rows (its raw baseline's statement).
const PAGE_SQL: &str = "SELECT followee_id, followed_at_ms FROM following WHERE follower_id = $1 AND state = 1 \
                        ORDER BY followed_at_ms DESC, followee_id DESC LIMIT 51";

/// The raw work a bare call does before it answers, given the request's `service` field.
pub(crate) type RawOp = Arc<dyn Fn(String) -> Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>> + Send + Sync>;

/// A [`RawOp`] of one Redis command through `pool` (the services' pool): `"zrevrange:<key>"`
/// ZREVRANGE key 0 50 WITHSCORES, `"get:<key>"` GET, `"mget:<k1> <k2> …"` MGET; anything else
/// nothing.
pub(crate) fn redis_op(pool: socialgraph_cache::Pool) -> RawOp {
    Arc::new(move |asked: String| {
        let pool = pool.clone();
        Box::pin(async move {
            let (kind, arg) = asked.split_once(':').unwrap_or((asked.as_str(), ""));
            if !matches!(kind, "zrevrange" | "get" | "mget") {
                return Ok(());
            }
            let mut conn = socialgraph_cache::conn(&pool).await?;
            match kind {
                "zrevrange" => {
                    let _: Vec<(Vec<u8>, f64)> = redis::cmd("ZREVRANGE").arg(arg).arg(0).arg(50).arg("WITHSCORES").query_async(&mut conn).await?;
                }
                "get" => {
                    let _: Option<Vec<u8>> = redis::cmd("GET").arg(arg).query_async(&mut conn).await?;
                }
                _ => {
                    let _: Vec<Option<Vec<u8>>> = redis::cmd("MGET").arg(arg.split(' ').collect::<Vec<_>>()).query_async(&mut conn).await?;
                }
            }
            Ok(())
        })
    })
}

/// A health service whose `check` first does its [`RawOp`] on the request's `service` field.
/// A failed op answers UNAVAILABLE.
#[derive(Clone)]
struct RawRead(RawOp);

#[tonic::async_trait]
impl Health for RawRead {
    async fn check(&self, request: Request<HealthCheckRequest>) -> Result<Response<HealthCheckResponse>, Status> {
        (self.0)(request.into_inner().service).await.map_err(|e| Status::unavailable(format!("{e:#}")))?;
        Ok(Response::new(HealthCheckResponse { status: ServingStatus::Serving as i32 }))
    }

    type WatchStream = tokio_stream::Empty<Result<HealthCheckResponse, Status>>;

    async fn watch(&self, _: Request<HealthCheckRequest>) -> Result<Response<Self::WatchStream>, Status> {
        Err(Status::unimplemented("watch"))
    }
}

/// A bare tonic server serving [`RawRead`] on a 2-worker runtime of its own.
pub(crate) struct Bare {
    runtime: Option<tokio::runtime::Runtime>,
    stop: CancellationToken,
    addr: std::net::SocketAddr,
}

impl Bare {
    /// Serves on a free loopback port; each call does `op` first.
    pub(crate) fn start(op: RawOp) -> anyhow::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_name("bare").enable_all().build()?;
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stop = CancellationToken::new();
        let service = HealthServer::new(RawRead(op));
        let token = stop.clone();
        runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener)?;
            let incoming = tokio_stream::StreamExt::map(tokio_stream::wrappers::TcpListenerStream::new(listener), |tcp| {
                tcp.inspect(|s| {
                    let _ = s.set_nodelay(true);
                })
            });
            tonic::transport::Server::builder().add_service(service).serve_with_incoming_shutdown(incoming, token.cancelled_owned()).await?;
            anyhow::Ok(())
        });
        Ok(Self { runtime: Some(runtime), stop, addr })
    }

    /// A client on a connection of its own.
    pub(crate) async fn client(&self) -> anyhow::Result<HealthClient<Channel>> {
        Ok(HealthClient::new(Channel::from_shared(format!("http://{}", self.addr))?.connect().await?))
    }

    /// `n` clients, each on a connection of its own (a channel's clones share one HTTP/2
    /// connection).
    pub(crate) async fn clients(&self, n: usize) -> anyhow::Result<Vec<HealthClient<Channel>>> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(self.client().await?);
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

/// One call asking for `service`'s raw read.
pub(crate) async fn check(client: &HealthClient<Channel>, service: String) -> anyhow::Result<()> {
    client.clone().check(HealthCheckRequest { service }).await?;
    Ok(())
}

/// The floor rows: (label, the bare server's latencies, the raw read's latencies).
pub(crate) struct Floor {
    pub rows: Vec<(&'static str, Hist, Hist)>,
}

/// The cache part's floor: `users.len()` sequential calls of each kind from one client (the
/// users' cached following sets, `set_keys`, and the same users on PostgreSQL), each beside
/// the same raw reads straight from the bench.
pub(crate) async fn cache_rows(redis: &MultiplexedConnection, url: &str, pg: &PgPool, users: &[i64], set_keys: &[String]) -> anyhow::Result<Floor> {
    let redis_part = redis_op(socialgraph_cache::pool(url, 16, std::time::Duration::from_secs(1))?);
    let pool = pg.clone();
    let op: RawOp = Arc::new(move |asked: String| match asked.strip_prefix("pg:").map(str::parse::<i64>) {
        Some(user) => {
            let pool = pool.clone();
            Box::pin(async move {
                sea_orm::sqlx::query(PAGE_SQL).bind(user?).fetch_all(&pool).await?;
                Ok(())
            })
        }
        None => redis_part(asked),
    });
    let bare = Bare::start(op)?;
    let client = bare.client().await?;
    let none = |_| async { anyhow::Ok(()) };
    let n = users.len();
    let empty = timed(n, none, |_| check(&client, String::new())).await?;
    let ping = timed(n, none, |_| {
        let mut conn = redis.clone();
        async move {
            let _: String = redis::cmd("PING").query_async(&mut conn).await?;
            anyhow::Ok(())
        }
    })
    .await?;
    let bare_redis = timed(n, none, |i| check(&client, format!("zrevrange:{}", set_keys[i]))).await?;
    let raw_redis = crate::raw::pages(redis, set_keys).await?;
    let bare_pg = timed(n, none, |i| check(&client, format!("pg:{}", users[i]))).await?;
    let raw_pg = crate::raw::sql(pg, PAGE_SQL, users, None).await?;
    Ok(Floor {
        rows: vec![
            ("bare tonic server: empty call (raw: Redis PING)", empty, ping),
            ("bare tonic server + ZREVRANGE (raw: ZREVRANGE)", bare_redis, raw_redis),
            ("bare tonic server + PostgreSQL page (raw: the page)", bare_pg, raw_pg),
        ],
    })
}
