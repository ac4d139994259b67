//! relation-svc: the source of truth for follow edges (`following`), its transactional outbox,
//! and the relay that publishes the outbox to Kafka topic `sg.relation.v1`.
//!
//! [`run`] is the whole service; `main` and the tests call it with their own listeners.

mod account_events;
pub mod cache;
pub mod config;
mod edge_events;
pub mod grpc;
pub mod import;
mod joins;
pub mod lifecycle;
pub mod requests;
pub mod restrict;
mod restrict_cache;
pub mod service;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use sea_orm_migration::MigratorTrait;
use socialgraph_events::RelayMetrics;
use socialgraph_proto::relation::v1::relation_service_server::RelationServiceServer;
use socialgraph_server::Readiness;
use socialgraph_server::stop::{join_within, within};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

pub use config::Config;

/// Full gRPC name of the service (health and reflection).
pub const SERVICE_NAME: &str = "socialgraph.relation.v1.RelationService";

/// How often the account job runner looks for work when it was not woken.
pub const ACCOUNT_JOB_POLL: Duration = Duration::from_millis(500);

/// Admin methods whose duration grows with the data: exempt from the request timeout.
pub const LONG_RUNNING: &[&str] = &["/socialgraph.relation.v1.RelationService/ImportFollows", "/socialgraph.relation.v1.RelationService/ScanEdges"];

/// Connects to the configured database and runs pending migrations.
///
/// # Errors
/// The database is unreachable or a migration failed.
pub async fn migrate(config: &Config) -> anyhow::Result<()> {
    let db = socialgraph_storage::connect(&config.database.url, 2).await.context("connecting to the database")?;
    socialgraph_migrations::Migrator::up(&db, None).await.context("running migrations")?;
    Ok(())
}

/// Builds relation-svc's service over `db` and, for the follow rate limit, `redis` (`None`: no
/// rate limit, as in the embedded mode); `wake` is notified after every commit that wrote
/// outbox rows. With `with_cache`, reads go through the following-list cache of
/// `config.cache` (unless its `url` is empty). Registers `sg_rate_limit_bypassed_total` and
/// the cache metrics in `registry`. Used by [`run`] and by the embedded mode.
///
/// # Errors
/// A metric of the same name is already registered, or the cache URL is malformed.
pub fn build(
    db: sea_orm::DatabaseConnection,
    redis: Option<socialgraph_cache::Pool>,
    with_cache: bool,
    config: &Config,
    wake: Arc<Notify>,
    registry: &prometheus::Registry,
) -> anyhow::Result<Arc<service::Relations>> {
    let bypassed =
        prometheus::IntCounter::new("sg_rate_limit_bypassed_total", "Follows allowed without a rate-limit check because Redis was unreachable")?;
    registry.register(Box::new(bypassed.clone()))?;
    let caches = match config.cache.list_caches().context("cache.url (SG_CACHE__URL)")? {
        Some(lists) if with_cache => Some(cache::Caches::new(lists, config.cache.fill_slots(), cache::CacheMetrics::register(registry)?)),
        _ => None,
    };
    Ok(Arc::new(service::Relations::new(db, redis, caches, config.clone(), wake, bypassed)))
}

/// RelationService's routes (messages up to 16 MiB for ImportFollows); the admin RPCs need
/// `Bearer <admin_token>` (unset refuses them).
pub fn routes(relations: Arc<service::Relations>, admin_token: Option<secrecy::SecretString>) -> tonic::service::Routes {
    tonic::service::Routes::new(
        RelationServiceServer::new(grpc::RelationGrpc::new(relations, admin_token)).max_decoding_message_size(16 * 1024 * 1024),
    )
}

/// Runs relation-svc on `grpc` and `admin` until `shutdown` fires, then drains RPCs, stops the
/// relay at a batch boundary, and returns.
///
/// # Errors
/// Start-up failures (database unreachable, migrations failed, bad Redis URL) and transport
/// failures.
pub async fn run(config: Config, grpc: TcpListener, admin: TcpListener, shutdown: CancellationToken) -> anyhow::Result<()> {
    let db = socialgraph_storage::connect(&config.database.url, config.database.max_connections).await.context("connecting to the database")?;
    if config.database.migrate_on_start {
        socialgraph_migrations::Migrator::up(&db, None).await.context("running migrations")?;
    }
    let redis = socialgraph_cache::pool(&config.redis.url, config.redis.pool_size, Duration::from_millis(config.redis.timeout_ms))
        .context("redis.url (SG_REDIS__URL)")?;
    let registry = prometheus::Registry::new();
    let relay_metrics = RelayMetrics::register(&registry)?;
    let wake = Arc::new(Notify::new());
    let relations = build(db.clone(), Some(redis), true, &config, Arc::clone(&wake), &registry)?;
    let loops = CancellationToken::new();
    let topics = vec![config.kafka.relation_topic.clone(), config.kafka.account_topic.clone()];
    let relay = config
        .kafka
        .relay_enabled
        .then(|| tokio::spawn(socialgraph_server::relay::relay_task(db.clone(), config.kafka.clone(), topics, wake, relay_metrics, loops.clone())));

    let jobs = tokio::spawn(lifecycle::run_jobs(Arc::clone(&relations), relations.jobs_wake(), ACCOUNT_JOB_POLL, loops.clone()));
    let drain = relations.cache_for_drain().map(|c| tokio::spawn(socialgraph_server::cache_drain::drain_task(db.clone(), c, loops.clone())));

    let readiness = Readiness::default();
    readiness.set(true);
    let serving = socialgraph_server::GrpcServing::new(&[SERVICE_NAME], LONG_RUNNING, &config.server, readiness.clone(), &registry)?;
    let admin_task = tokio::spawn(socialgraph_server::serve_admin(admin, registry, readiness.clone(), loops.clone()));
    let routes = routes(relations, config.auth.admin_token.clone());
    let served = socialgraph_server::serve_grpc(routes, grpc, serving, shutdown).await;
    loops.cancel();
    let limit = Duration::from_millis(config.server.drain_timeout_ms);
    if let Some(relay) = relay {
        join_within("relay", limit, relay).await;
    }
    join_within("account jobs", limit, jobs).await;
    if let Some(drain) = drain {
        join_within("stale cache drain", limit, drain).await;
    }
    join_within("admin server", limit, admin_task).await;
    within("database pool close", limit, db.close()).await;
    served
}
