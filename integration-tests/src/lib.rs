//! Shared helpers of the integration tests: spawning services on free ports with test
//! configuration, and gRPC clients for them.

use std::net::SocketAddr;
use std::time::Duration;

use socialgraph_proto::relation::v1::relation_service_client::RelationServiceClient;
use socialgraph_testkit::{Backend, TestDb};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

pub use socialgraph_relation::Config as RelationConfig;

/// Admin token the test configurations use.
pub const ADMIN_TOKEN: &str = "test-admin-token";

/// A relation-svc running inside the test process.
pub struct RelationSvc {
    /// gRPC address.
    pub addr: SocketAddr,
    /// Admin HTTP address.
    pub admin_addr: SocketAddr,
    /// Fires graceful shutdown.
    pub shutdown: CancellationToken,
    /// The service task; ends after shutdown.
    pub task: JoinHandle<anyhow::Result<()>>,
}

impl RelationSvc {
    /// A connected client.
    ///
    /// # Errors
    /// The server does not accept connections.
    pub async fn client(&self) -> anyhow::Result<RelationServiceClient<Channel>> {
        let ch = Channel::from_shared(format!("http://{}", self.addr))?.connect().await?;
        Ok(RelationServiceClient::new(ch).max_decoding_message_size(64 * 1024 * 1024))
    }

    /// Stops the service and waits for it.
    ///
    /// # Errors
    /// The service ended with an error.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        self.task.await?
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

/// A relation-svc configuration for tests: the given database, a fresh topic and Redis key
/// prefix, generous rate limits, an admin token, fast relay polling.
pub fn relation_config(db_url: &str, topic: &str) -> RelationConfig {
    let mut c = RelationConfig::default();
    c.database.url = db_url.to_owned();
    c.database.max_connections = 40;
    c.redis.url = socialgraph_testkit::redis_url();
    c.redis.key_prefix = socialgraph_testkit::unique("t") + ":";
    c.kafka.brokers = socialgraph_testkit::kafka::brokers();
    c.kafka.relation_topic = topic.to_owned();
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
    socialgraph_telemetry::init_for_tests();
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let admin = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let (addr, admin_addr) = (grpc.local_addr()?, admin.local_addr()?);
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(socialgraph_relation::run(config, grpc, admin, shutdown.clone()));
    let svc = RelationSvc { addr, admin_addr, shutdown, task };
    socialgraph_testkit::eventually(Duration::from_secs(20), "relation-svc to accept connections", || async {
        Ok(tokio::net::TcpStream::connect(addr).await.ok().map(|_| ()))
    })
    .await?;
    Ok(svc)
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
        let (n, _) = socialgraph_storage::outbox::backlog(&db.conn).await?;
        Ok((n == 0).then_some(()))
    })
    .await
}
