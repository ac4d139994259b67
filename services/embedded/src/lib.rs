//! `socialgraph dev`: relation-svc, projection-svc, counter-svc and message-svc in one process
//! on one SQLite file (docs/src/architecture/embedded.md#embedded-mode).
//!
//! - RelationService is relation-svc's own service code on SQLite, without a rate limit (no
//!   Redis) and without a relay: the outbox table is the event log ([`log`]).
//! - ProjectionService is projection-svc's own service and apply code; its consumer reads the
//!   relation events from the log instead of Kafka (offsets = outbox ids, one partition).
//! - FeedService is projection-svc's feed: PublishPost/DeletePost append content events to the
//!   log, its consumer and push worker run here, and it keeps the posts counter.
//! - CounterService is counter-svc's gRPC layer over counters in SQL tables ([`counters`]),
//!   and counter-svc's follow-count consumers keep them from the relation and edge-count events.
//! - MessageService is message-svc's own service on SQLite, without a relay: its events stay in
//!   the log (live delivery reads them there); its consumer of the account events reads the log.
//!
//! Every consumer is the mesh's own, on the mesh's consumer loop, over the outbox table as the
//! log ([`socialgraph_events::OutboxLog`]). State lives in the SQLite file and survives a
//! restart; consumers resume from the offsets stored in `consumer_offset`.

pub mod counters;
pub mod log;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use sea_orm_migration::MigratorTrait;
use secrecy::SecretString;
use socialgraph_events::OutboxLog;
use socialgraph_events::consumer::Progress;
use socialgraph_proto::relation::v1::relation_service_client::RelationServiceClient;
use socialgraph_server::stop::{join_within, within};
use socialgraph_server::{Readiness, ServerSettings};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Name of the projection's and the counters' offsets in `consumer_offset`.
pub const PROJECTION_CONSUMER: &str = "projection";
/// See [`PROJECTION_CONSUMER`].
pub const COUNTER_CONSUMER: &str = "counter";
/// See [`PROJECTION_CONSUMER`]: MessageService's consumer of the account events.
pub const MESSAGE_CONSUMER: &str = "message";

/// Settings of the embedded mode.
#[derive(Debug, Clone)]
pub struct DevConfig {
    /// The SQLite file (created when missing).
    pub data: PathBuf,
    /// RelationService address (default 127.0.0.1:50051).
    pub relation_addr: SocketAddr,
    /// ProjectionService address (default 127.0.0.1:50052).
    pub projection_addr: SocketAddr,
    /// CounterService address (default 127.0.0.1:50053).
    pub counter_addr: SocketAddr,
    /// MessageService address (default 127.0.0.1:50054).
    pub message_addr: SocketAddr,
    /// Admin HTTP address: `/metrics`, `/ready`, `/live` (default 127.0.0.1:9100).
    pub admin_addr: SocketAddr,
    /// Bearer token of the admin RPCs (ImportFollows, ScanEdges, rebuilds).
    pub admin_token: SecretString,
    /// HMAC key of page tokens; `None`: the fixed development key.
    pub page_token_secret: Option<SecretString>,
    /// SQLite connections (default 16). Writers queue on SQLite's one write lock while holding
    /// a connection, so the pool must leave room for readers (a projection repair reads the
    /// source through RelationService while it holds the lock).
    pub max_connections: u32,
}

impl Default for DevConfig {
    fn default() -> Self {
        Self {
            data: PathBuf::from("socialgraph-dev.sqlite"),
            relation_addr: ([127, 0, 0, 1], 50051).into(),
            projection_addr: ([127, 0, 0, 1], 50052).into(),
            counter_addr: ([127, 0, 0, 1], 50053).into(),
            message_addr: ([127, 0, 0, 1], 50054).into(),
            admin_addr: ([127, 0, 0, 1], 9100).into(),
            admin_token: SecretString::from("dev-admin-token"),
            page_token_secret: None,
            max_connections: 16,
        }
    }
}

/// Listeners of a running embedded mesh (bound before [`run`], so callers may pass port 0).
pub struct Listeners {
    /// RelationService.
    pub relation: TcpListener,
    /// ProjectionService.
    pub projection: TcpListener,
    /// CounterService.
    pub counter: TcpListener,
    /// MessageService.
    pub message: TcpListener,
    /// Admin HTTP.
    pub admin: TcpListener,
}

impl Listeners {
    /// Binds the configured addresses.
    ///
    /// # Errors
    /// An address is in use.
    pub async fn bind(config: &DevConfig) -> anyhow::Result<Self> {
        let bind = |a: SocketAddr| async move { TcpListener::bind(a).await.with_context(|| format!("binding {a}")) };
        Ok(Self {
            relation: bind(config.relation_addr).await?,
            projection: bind(config.projection_addr).await?,
            counter: bind(config.counter_addr).await?,
            message: bind(config.message_addr).await?,
            admin: bind(config.admin_addr).await?,
        })
    }
}

pub(crate) use socialgraph_domain::now_ms;

/// projection-svc's configuration inside the embedded mode: its consumer name, the log's
/// relation topic, the shared page-token key and admin token.
fn projection_config(config: &DevConfig, relation_topic: &str) -> socialgraph_projection::Config {
    let mut c = socialgraph_projection::Config::default();
    c.database.consumer_name = PROJECTION_CONSUMER.into();
    c.kafka.relation_topic = relation_topic.to_owned();
    c.auth.page_token_secret = config.page_token_secret.clone();
    c.relation.admin_token = Some(config.admin_token.clone());
    c
}

/// Runs the four services on `listeners` against `config.data` until `shutdown` fires.
///
/// # Errors
/// The SQLite file cannot be opened or migrated; transport failures.
pub async fn run(config: DevConfig, listeners: Listeners, shutdown: CancellationToken) -> anyhow::Result<()> {
    let url = format!("sqlite://{}?mode=rwc", config.data.display());
    let db = socialgraph_storage::connect(&url, config.max_connections).await.with_context(|| format!("opening {}", config.data.display()))?;
    // Write-ahead logging: readers (a long ScanEdges, list pages) never block the writer.
    // The mode is stored in the file, so this holds for every later connection.
    sea_orm::ConnectionTrait::execute_unprepared(&db, "PRAGMA journal_mode=WAL").await.context("enabling WAL")?;
    socialgraph_migrations::EmbeddedMigrator::up(&db, None).await.context("running migrations")?;

    let relation_addr = listeners.relation.local_addr()?;
    let mut relation_config = socialgraph_relation::Config::default();
    relation_config.database.url = url.clone();
    relation_config.auth.admin_token = Some(config.admin_token.clone());
    relation_config.auth.page_token_secret = config.page_token_secret.clone();
    let relation_topic = relation_config.kafka.relation_topic.clone();
    let counter_topic = socialgraph_events::COUNTER_TOPIC.to_owned();
    let edge_count_topic = socialgraph_events::EDGE_COUNT_TOPIC.to_owned();

    let registry = prometheus::Registry::new();

    // The services' outbox writers wake one waiter of `commits` (in the mesh, their relay); the
    // forwarder turns each wake-up into one of every log reader.
    let commits = Arc::new(Notify::new());
    let log_wake = Arc::new(Notify::new());
    let loops = CancellationToken::new();
    let forward = {
        let (from, to, cancel) = (Arc::clone(&commits), Arc::clone(&log_wake), loops.clone());
        tokio::spawn(async move {
            loop {
                tokio::select! { _ = from.notified() => to.notify_waiters(), _ = cancel.cancelled() => return }
            }
        })
    };
    let relations = socialgraph_relation::build(db.clone(), None, false, &relation_config, Arc::clone(&commits), &registry)?;
    let account_jobs = tokio::spawn(socialgraph_relation::lifecycle::run_jobs(
        Arc::clone(&relations),
        relations.jobs_wake(),
        socialgraph_relation::ACCOUNT_JOB_POLL,
        loops.clone(),
    ));

    let progress = Progress::default();
    let channel = tonic::transport::Channel::from_shared(format!("http://{relation_addr}"))?.connect_lazy();
    let projection_config = projection_config(&config, &relation_topic);
    let content_topic = socialgraph_events::CONTENT_TOPIC.to_owned();
    let outbox_log = Arc::new(OutboxLog { db: db.clone(), wake: Arc::clone(&log_wake) });
    let content_log = Arc::new(log::OutboxContentLog { log: Arc::clone(&outbox_log), topic: content_topic.clone() });
    // The follow counts go to the log as in the mesh: counter-svc's consumer keeps them.
    let count_log = socialgraph_projection::count_log::CountLog { topic: edge_count_topic.clone(), wake: Arc::clone(&commits) };
    let mut projection = socialgraph_projection::build(
        db.clone(),
        &projection_config,
        RelationServiceClient::new(channel),
        progress.clone(),
        None,
        socialgraph_projection::Logs { content: content_log, counts: Some(Arc::new(count_log)) },
        &registry,
    )?;
    // The posts counter lives beside the posts here: the feed's consumer keeps it.
    projection.ingest = Arc::new(socialgraph_projection::feed::ingest::Ingest { feed: Arc::clone(&projection.feed), count_posts: true });
    let content_loop = log::spawn(&outbox_log, &content_topic, Arc::clone(&projection.ingest), progress.clone(), &loops);
    let fanout_loop = tokio::spawn(socialgraph_projection::feed::fanout::run(
        Arc::clone(&projection.feed),
        vec![socialgraph_events::outbox_log::PARTITION],
        loops.clone(),
    ));
    let projector = Arc::clone(&projection.projector);
    let projection_loop = log::spawn(&outbox_log, &relation_topic, projector, progress.clone(), &loops);
    let counter_metrics = socialgraph_counter::consume::ConsumerMetrics::register(&registry)?;
    let follow_counts = || counters::SqlFollowCounts { db: db.clone() };
    let followings = Arc::new(socialgraph_counter::consume::FollowingsCounter {
        store: follow_counts(),
        consumer: COUNTER_CONSUMER.into(),
        metrics: counter_metrics.clone(),
    });
    let edge_counts = Arc::new(socialgraph_counter::consume::EdgeCountCounter {
        store: follow_counts(),
        consumer: COUNTER_CONSUMER.into(),
        metrics: counter_metrics,
    });
    let followings_loop = log::spawn(&outbox_log, &relation_topic, followings, Progress::default(), &loops);
    let edge_count_loop = log::spawn(&outbox_log, &edge_count_topic, edge_counts, Progress::default(), &loops);
    let backend = Arc::new(counters::SqlCounters { db: db.clone(), counter_topic, wake: Arc::clone(&commits) });

    let readiness = Readiness::default();
    readiness.set(true);
    let rpc_metrics = socialgraph_server::RpcMetrics::register(&registry)?;
    let admin = tokio::spawn(socialgraph_server::serve_admin(listeners.admin, registry, readiness.clone(), loops.clone()));
    let settings = ServerSettings::with_ports(0, 0);
    let relation_routes = socialgraph_relation::routes(relations, Some(config.admin_token.clone()));
    let projection_routes = projection.routes(Some(config.admin_token.clone()));
    let counter_routes = socialgraph_counter::routes(backend, Some(config.admin_token.clone()));
    let mut message_config = socialgraph_message::Config::default();
    message_config.database.url = url.clone();
    message_config.auth.page_token_secret = config.page_token_secret.clone();
    let message_log =
        Arc::new(socialgraph_message::live::TopicLog { log: Arc::clone(&outbox_log), topic: message_config.kafka.message_topic.clone() });
    let streams = shutdown.child_token();
    let hub = socialgraph_message::live::Hub::new(message_log, message_config.subscribe.hub(), streams.clone());
    let hub_task = tokio::spawn(Arc::clone(&hub).run());
    let account_topic = message_config.kafka.account_topic.clone();
    let messages = Arc::new(socialgraph_message::service::Messages::new(db.clone(), message_config, Arc::clone(&commits)));
    // Accounts being deleted leave their conversations, as message-svc's consumer does in the mesh.
    let ender = Arc::new(socialgraph_message::accounts::AccountEnder { messages: Arc::clone(&messages), consumer: MESSAGE_CONSUMER.into() });
    let account_loop = log::spawn(&outbox_log, &account_topic, ender, progress.clone(), &loops);
    // Timelines leave out the mutes of the projection's copy, kept from the same account events.
    let mute_loop = log::spawn(&outbox_log, &account_topic, Arc::clone(&projection.mutes), Progress::default(), &loops);
    let message_routes = socialgraph_message::routes(messages, hub);
    let serve = |routes, names: &'static [&'static str], long_running: &'static [&'static str], listener| {
        let serving = socialgraph_server::GrpcServing {
            service_names: names,
            long_running,
            settings: &settings,
            readiness: readiness.clone(),
            metrics: rpc_metrics.clone(),
        };
        socialgraph_server::serve_grpc(routes, listener, serving, shutdown.clone())
    };
    let (r, p, c, m) = tokio::join!(
        serve(relation_routes, &[socialgraph_relation::SERVICE_NAME], socialgraph_relation::LONG_RUNNING, listeners.relation),
        serve(projection_routes, socialgraph_projection::SERVICE_NAMES, socialgraph_projection::LONG_RUNNING, listeners.projection),
        serve(counter_routes, &[socialgraph_counter::SERVICE_NAME], &[], listeners.counter),
        serve(message_routes, &[socialgraph_message::SERVICE_NAME], &[], listeners.message),
    );
    loops.cancel();
    streams.cancel();
    let limit = Duration::from_millis(settings.drain_timeout_ms);
    let _ = tokio::join!(
        join_within("projection consumers", limit, projection_loop),
        join_within("content consumers", limit, content_loop),
        join_within("fan-out", limit, fanout_loop),
        join_within("followings consumer", limit, followings_loop),
        join_within("edge count consumer", limit, edge_count_loop),
        join_within("account consumer", limit, account_loop),
        join_within("mute copy consumer", limit, mute_loop),
        join_within("admin server", limit, admin),
        join_within("event forwarding", limit, forward),
        join_within("account jobs", limit, account_jobs),
        join_within("subscription hub", limit, hub_task),
    );
    within("database pool close", limit, db.close()).await;
    r.and(p).and(c).and(m)
}
