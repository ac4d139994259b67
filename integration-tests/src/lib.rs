//! Shared helpers of the integration tests: spawning services on free ports with test
//! configuration, and gRPC clients for them.

use std::net::SocketAddr;
use std::time::Duration;

use socialgraph_proto::relation::v1::relation_service_client::RelationServiceClient;
use socialgraph_testkit::{Backend, TestDb};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

pub mod cache;
pub mod facts;
pub mod faults;
pub mod feeds;
pub mod gateway;
mod mesh;
pub mod messages;
pub mod model;
pub use mesh::*;
mod restart;
pub use restart::*;

pub use socialgraph_counter::Config as CounterConfig;
pub use socialgraph_projection::Config as ProjectionConfig;
use socialgraph_proto::counter::v1::counter_service_client::CounterServiceClient;
use socialgraph_proto::projection::v1::GetProjectionStatusRequest;
use socialgraph_proto::projection::v1::projection_service_client::ProjectionServiceClient;
pub use socialgraph_relation::Config as RelationConfig;
pub use socialgraph_testkit::terminate_connections;

/// Admin token the test configurations use.
pub const ADMIN_TOKEN: &str = "test-admin-token";

/// A service running inside the test process, on a Tokio runtime of its own so that
/// [`Svc::kill`] ends every task it spawned at once, as `kill -9` ends a process.
pub struct Svc {
    /// gRPC address.
    pub addr: SocketAddr,
    /// Admin HTTP address.
    pub admin_addr: SocketAddr,
    /// Fires graceful shutdown.
    pub shutdown: CancellationToken,
    /// The service task; ends after shutdown.
    pub task: JoinHandle<anyhow::Result<()>>,
    /// The service's own runtime (`None` once killed).
    runtime: Option<tokio::runtime::Runtime>,
}

impl Drop for Svc {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// relation-svc in the test process.
pub type RelationSvc = Svc;

impl Svc {
    /// A channel to the gRPC port.
    ///
    /// # Errors
    /// The server does not accept connections.
    pub async fn channel(&self) -> anyhow::Result<Channel> {
        Ok(Channel::from_shared(format!("http://{}", self.addr))?.connect().await?)
    }

    /// A RelationService client.
    ///
    /// # Errors
    /// The server does not accept connections.
    pub async fn client(&self) -> anyhow::Result<RelationServiceClient<Channel>> {
        Ok(RelationServiceClient::new(self.channel().await?).max_decoding_message_size(64 * 1024 * 1024))
    }

    /// A ProjectionService client.
    ///
    /// # Errors
    /// The server does not accept connections.
    pub async fn projection(&self) -> anyhow::Result<ProjectionServiceClient<Channel>> {
        Ok(ProjectionServiceClient::new(self.channel().await?).max_decoding_message_size(64 * 1024 * 1024))
    }

    /// Stops the service and waits for it.
    ///
    /// # Errors
    /// The service ended with an error.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        (&mut self.task).await?
    }

    /// Kills the service: every task of its runtime (servers, consumers, relays) is dropped at
    /// its next await, with no shutdown, drain or final commit; connections close unannounced.
    pub async fn kill(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
            let _ = (&mut self.task).await;
            // A finished stand-in: a JoinHandle must not be polled again after it completed,
            // so a later stop() or kill() finds this one.
            self.task = tokio::spawn(std::future::ready(Ok(())));
        }
    }

    /// A CounterService client.
    ///
    /// # Errors
    /// The server does not accept connections.
    pub async fn counter(&self) -> anyhow::Result<CounterServiceClient<Channel>> {
        Ok(CounterServiceClient::new(self.channel().await?).max_decoding_message_size(64 * 1024 * 1024))
    }

    /// The admin port's `/metrics` text.
    ///
    /// # Errors
    /// The admin port does not answer.
    pub async fn metrics(&self) -> anyhow::Result<String> {
        Ok(reqwest::get(format!("http://{}/metrics", self.admin_addr)).await?.text().await?)
    }
}

/// Value of an unlabelled metric in Prometheus text, 0 when absent.
pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(' '))
        .find(|(n, _)| *n == name)
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// The google.rpc ErrorInfo reason of a status (empty without one).
pub fn reason(status: &tonic::Status) -> String {
    use tonic_types::StatusExt;
    status.get_error_details().error_info().map(|i| i.reason.clone()).unwrap_or_default()
}

/// The cache Redis of a test mesh: the shared one (`SG_TEST_CACHE_REDIS_URL`, default
/// `redis://127.0.0.1:6380`) under a prefix named after the mesh's topic, so relation-svc and
/// projection-svc of one mesh share their cached lists and no other mesh sees them.
pub fn cache_settings(topic: &str) -> socialgraph_server::CacheSettings {
    socialgraph_server::CacheSettings {
        url: socialgraph_testkit::cache_redis_url(),
        key_prefix: format!("{topic}:"),
        timeout_ms: 2_000,
        ..Default::default()
    }
}

/// A relation-svc configuration for tests: the given database, a fresh topic and Redis key
/// prefix, generous rate limits, an admin token, fast relay polling.
pub fn relation_config(db_url: &str, topic: &str) -> RelationConfig {
    let mut c = RelationConfig::default();
    c.database.url = db_url.to_owned();
    // Several meshes run at once against one PostgreSQL (max_connections 100): keep pools small.
    c.database.max_connections = 12;
    c.redis.url = socialgraph_testkit::redis_url();
    c.redis.key_prefix = socialgraph_testkit::unique("t") + ":";
    c.cache = cache_settings(topic);
    c.kafka.brokers = socialgraph_testkit::kafka::brokers();
    c.kafka.relation_topic = topic.to_owned();
    c.kafka.account_topic = account_topic_of(topic);
    c.kafka.partitions = 4;
    c.kafka.relay_idle_poll_ms = 20;
    c.limits.follow_burst = 1_000_000;
    c.limits.follow_refill_per_day = 1_000_000;
    c.auth.admin_token = Some(ADMIN_TOKEN.into());
    c.auth.page_token_secret = Some("test-page-token-secret".into());
    c
}

/// Starts relation-svc with `config` on free ports and waits until it answers.
///
/// # Errors
/// It did not start.
pub async fn spawn_relation(config: RelationConfig) -> anyhow::Result<RelationSvc> {
    spawn(|grpc, admin, shutdown| socialgraph_relation::run(config, grpc, admin, shutdown)).await
}

/// Starts projection-svc with `config` on free ports and waits until it answers.
///
/// # Errors
/// It did not start.
pub async fn spawn_projection(config: ProjectionConfig) -> anyhow::Result<Svc> {
    spawn(|grpc, admin, shutdown| socialgraph_projection::run(config, grpc, admin, shutdown)).await
}

/// Binds `addr`, waiting up to 10 s for a killed predecessor's socket to close.
async fn bind_when_free(addr: SocketAddr) -> anyhow::Result<std::net::TcpListener> {
    let started = std::time::Instant::now();
    loop {
        match std::net::TcpListener::bind(addr) {
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && started.elapsed() < Duration::from_secs(10) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => return Ok(other?),
        }
    }
}

async fn spawn<F, Fut>(run: F) -> anyhow::Result<Svc>
where
    F: FnOnce(tokio::net::TcpListener, tokio::net::TcpListener, CancellationToken) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
{
    spawn_on(None, run).await
}

/// Starts a service on `at` (gRPC and admin addresses; `None`: free ports).
pub(crate) async fn spawn_on<F, Fut>(at: Option<(SocketAddr, SocketAddr)>, run: F) -> anyhow::Result<Svc>
where
    F: FnOnce(tokio::net::TcpListener, tokio::net::TcpListener, CancellationToken) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
{
    socialgraph_telemetry::init_for_tests();
    // Bound here, registered with the service's runtime there (an I/O resource belongs to the
    // runtime whose reactor it was registered with).
    let any: SocketAddr = ([127, 0, 0, 1], 0).into();
    let (grpc, admin) = at.unwrap_or((any, any));
    let (grpc, admin) = (bind_when_free(grpc).await?, bind_when_free(admin).await?);
    let (addr, admin_addr) = (grpc.local_addr()?, admin.local_addr()?);
    grpc.set_nonblocking(true)?;
    admin.set_nonblocking(true)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_name("svc").enable_all().build()?;
    let shutdown = CancellationToken::new();
    let token = shutdown.clone();
    let task = runtime.spawn(async move {
        let (grpc, admin) = (tokio::net::TcpListener::from_std(grpc)?, tokio::net::TcpListener::from_std(admin)?);
        run(grpc, admin, token).await
    });
    let svc = Svc { addr, admin_addr, shutdown, task, runtime: Some(runtime) };
    // Ready means the server answers: its health service says SERVING (a bound port alone
    // accepts connections before the server runs).
    socialgraph_testkit::eventually(Duration::from_secs(20), "the service to answer health checks with SERVING", || async {
        use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient};
        // Each attempt bounded: a connection or an answer that never comes is another try.
        let channel = Channel::from_shared(format!("http://{addr}"))?.connect_timeout(Duration::from_secs(2)).timeout(Duration::from_secs(2));
        let Ok(channel) = channel.connect().await else { return Ok(None) };
        let answer = HealthClient::new(channel).check(HealthCheckRequest { service: String::new() }).await;
        Ok(answer.ok().filter(|r| r.get_ref().status == ServingStatus::Serving as i32).map(|_| ()))
    })
    .await?;
    Ok(svc)
}

/// A projection-svc configuration for tests: the given database and topic, relation-svc at
/// `relation`, the test admin token and page-token secret, fast polling.
pub fn projection_config(db_url: &str, topic: &str, relation: SocketAddr) -> ProjectionConfig {
    let mut c = ProjectionConfig::default();
    c.database.url = db_url.to_owned();
    c.cache = cache_settings(topic);
    c.kafka.brokers = socialgraph_testkit::kafka::brokers();
    c.kafka.relation_topic = topic.to_owned();
    c.kafka.content_topic = format!("{topic}.content");
    c.kafka.edge_count_topic = edge_count_topic_of(topic);
    c.kafka.account_topic = account_topic_of(topic);
    c.kafka.partitions = 4;
    c.kafka.relay_idle_poll_ms = 20;
    c.database.max_connections = 6;
    c.relation.url = format!("http://{relation}");
    c.relation.admin_token = Some(ADMIN_TOKEN.into());
    c.auth.admin_token = Some(ADMIN_TOKEN.into());
    c.auth.page_token_secret = Some("test-page-token-secret".into());
    c
}

/// Waits until the projection has applied every record of every partition of `topic`: its
/// next offsets equal the broker's high watermarks.
///
/// # Errors
/// Timed out, or the broker or projection failed.
pub async fn projection_caught_up(svc: &Svc, brokers: &[String], topic: &str, deadline: Duration) -> anyhow::Result<()> {
    projection_replicas_caught_up(&[svc], brokers, topic, deadline).await
}

/// [`projection_caught_up`] for replicas that divide the partitions: each partition's next
/// offset, as reported by whichever replica owns it, equals the high watermark.
///
/// # Errors
/// Timed out, or the broker or a replica failed.
pub async fn projection_replicas_caught_up(replicas: &[&Svc], brokers: &[String], topic: &str, deadline: Duration) -> anyhow::Result<()> {
    let kafka = socialgraph_testkit::kafka::connect(brokers).await?;
    let mut clients = Vec::new();
    for svc in replicas {
        clients.push(svc.projection().await?);
    }
    let watermarks = socialgraph_testkit::kafka::Watermarks::new(&kafka, topic);
    socialgraph_testkit::eventually(deadline, "the projection to reach the high watermarks", || {
        let (watermarks, clients) = (&watermarks, clients.clone());
        async move {
            let hw = watermarks.read().await?;
            let mut applied = std::collections::BTreeMap::new();
            for mut client in clients {
                let status = client.get_projection_status(GetProjectionStatusRequest {}).await?.into_inner();
                applied.extend(status.partitions.iter().filter(|p| p.topic == topic).map(|p| (p.partition, p.next_offset)));
            }
            Ok((!hw.is_empty() && hw.iter().all(|(p, h)| applied.get(p) == Some(h))).then_some(()))
        }
    })
    .await
}

/// A fresh database of `backend` and a relation-svc on it with a fresh topic.
///
/// # Errors
/// A dependency is missing (the message says how to start it).
pub async fn relation_on(backend: Backend, tweak: impl FnOnce(&mut RelationConfig)) -> anyhow::Result<(TestDb, RelationSvc, String)> {
    let db = TestDb::create(backend).await?;
    let topic = socialgraph_testkit::unique("sg.relation.test.");
    let mut config = relation_config(&db.url, &topic);
    tweak(&mut config);
    let svc = spawn_relation(config).await?;
    Ok((db, svc, topic))
}

/// The sum of the samples of metric `name` whose line contains `label` (e.g.
/// `result="hit"`) in a Prometheus text exposition.
pub fn metric_sum(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(label))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.trim().parse::<f64>().ok()))
        .sum()
}

/// Adds `authorization: Bearer <ADMIN_TOKEN>` to a request.
pub fn admin<T>(msg: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.metadata_mut().insert("authorization", format!("Bearer {ADMIN_TOKEN}").parse().expect("ascii"));
    req
}

/// Waits until the outbox of `db` is empty (everything relayed).
///
/// # Errors
/// Timed out.
pub async fn outbox_drained(db: &TestDb, deadline: Duration) -> anyhow::Result<()> {
    socialgraph_testkit::eventually(deadline, "the outbox to drain", || async {
        // One row is enough to know it is not empty: no COUNT over a large outbox.
        let empty = socialgraph_storage::outbox::fetch(&db.conn, 1).await?.is_empty();
        if !empty {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(empty.then_some(()))
    })
    .await
}

/// Runs `ops` random follows, unfollows and re-follows among users `1..=users` from 8
/// concurrent callers (60% follows); returns the number of real changes.
///
/// # Errors
/// An RPC failed.
pub async fn random_workload(addr: SocketAddr, ops: usize, users: i64, seed: u64) -> anyhow::Result<usize> {
    use rand::{Rng, SeedableRng, rngs::StdRng};
    use socialgraph_proto::relation::v1::{FollowRequest, UnfollowRequest};
    let mut tasks = Vec::new();
    for worker in 0..8u64 {
        let mut client = RelationServiceClient::connect(format!("http://{addr}")).await?;
        tasks.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(seed * 100 + worker);
            let mut changes = 0;
            for _ in 0..ops / 8 {
                let a = rng.random_range(1..=users);
                let mut b = rng.random_range(1..=users);
                if a == b {
                    b = a % users + 1;
                }
                let changed = if rng.random_bool(0.6) {
                    client.follow(FollowRequest { follower_id: a, followee_id: b }).await?.into_inner().changed
                } else {
                    client.unfollow(UnfollowRequest { follower_id: a, followee_id: b }).await?.into_inner().changed
                };
                changes += usize::from(changed);
            }
            anyhow::Ok(changes)
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await??;
    }
    Ok(total)
}

/// Both edge tables in (follower_id, followee_id) order: (following, follower).
///
/// # Errors
/// Database errors.
pub async fn both_tables(db: &TestDb) -> anyhow::Result<(Vec<socialgraph_domain::Edge>, Vec<socialgraph_domain::Edge>)> {
    use socialgraph_storage::edges::{EdgeTable, ScanFilter, scan};
    let following = scan(&db.conn, EdgeTable::Following, ScanFilter::default(), usize::MAX >> 1).await?;
    let follower = scan(&db.conn, EdgeTable::Follower, ScanFilter::default(), usize::MAX >> 1).await?;
    Ok((following, follower))
}

/// Starts counter-svc with `config` on free ports and waits until it answers.
///
/// # Errors
/// It did not start.
pub async fn spawn_counter(config: CounterConfig) -> anyhow::Result<Svc> {
    spawn(|grpc, admin, shutdown| socialgraph_counter::run(config, grpc, admin, shutdown)).await
}

/// A plain multiplexed connection to a single Redis, as a raw baseline client would hold one
/// (no pool, no cluster routing), with the patient timeouts of [`redis_conn`].
///
/// # Errors
/// Redis is not reachable (run `make deps`).
pub async fn raw_redis_conn(url: &str) -> anyhow::Result<redis::aio::MultiplexedConnection> {
    let config =
        redis::AsyncConnectionConfig::new().set_connection_timeout(Some(Duration::from_secs(10))).set_response_timeout(Some(Duration::from_secs(30)));
    Ok(redis::Client::open(url)?.get_multiplexed_async_connection_with_config(&config).await?)
}

/// A Redis connection for test code (a single server's URL or a cluster's, as the services take
/// them), patient enough for a saturated 2-core machine (the client's default response timeout
/// is 500 ms); answered one PING before it is returned.
///
/// # Errors
/// Redis is not reachable (run `make deps`).
pub async fn redis_conn(url: &str) -> anyhow::Result<socialgraph_cache::Conn> {
    let pool = socialgraph_cache::pool(url, 1, Duration::from_secs(30))?;
    let mut conn = socialgraph_cache::conn(&pool).await?;
    let _: String = redis::cmd("PING").query_async(&mut conn).await?;
    Ok(conn)
}

/// `socialgraph dev` (the embedded mode) in the test process, on free ports.
pub struct DevSvc {
    /// RelationService URL (`http://127.0.0.1:port`).
    pub relation: String,
    /// ProjectionService URL.
    pub projection: String,
    /// CounterService URL.
    pub counter: String,
    /// MessageService URL.
    pub message: String,
    /// Fires graceful shutdown.
    pub shutdown: CancellationToken,
    /// The embedded mesh; ends after shutdown.
    pub task: JoinHandle<anyhow::Result<()>>,
}

/// The embedded mode's default admin token, which [`spawn_dev`] keeps.
pub const DEV_ADMIN_TOKEN: &str = "dev-admin-token";

/// Starts `socialgraph dev` on the SQLite file `data` (created when missing).
///
/// # Errors
/// No free port.
pub async fn spawn_dev(data: &std::path::Path) -> anyhow::Result<DevSvc> {
    socialgraph_telemetry::init_for_tests();
    let any: SocketAddr = ([127, 0, 0, 1], 0).into();
    let config = socialgraph_embedded::DevConfig {
        data: data.to_owned(),
        relation_addr: any,
        projection_addr: any,
        counter_addr: any,
        message_addr: any,
        admin_addr: any,
        ..socialgraph_embedded::DevConfig::default()
    };
    let listeners = socialgraph_embedded::Listeners::bind(&config).await?;
    let url = |l: &tokio::net::TcpListener| l.local_addr().map(|a| format!("http://{a}"));
    let (relation, projection, counter, message) =
        (url(&listeners.relation)?, url(&listeners.projection)?, url(&listeners.counter)?, url(&listeners.message)?);
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(socialgraph_embedded::run(config, listeners, shutdown.clone()));
    Ok(DevSvc { relation, projection, counter, message, shutdown, task })
}

impl DevSvc {
    /// The CLI's view of this mesh, with the admin token.
    pub fn endpoints(&self) -> socialgraph_cli::Endpoints {
        socialgraph_cli::Endpoints {
            relation: self.relation.clone(),
            projection: self.projection.clone(),
            counter: self.counter.clone(),
            message: self.message.clone(),
            admin_token: Some(DEV_ADMIN_TOKEN.into()),
        }
    }

    /// Shuts down and waits for the end.
    ///
    /// # Errors
    /// The mesh ended with an error.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        self.task.await?
    }
}
