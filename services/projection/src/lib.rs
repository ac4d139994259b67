//! projection-svc: consumes `sg.relation.v1` into the `follower` table (effectively-once:
//! version check per edge, offsets stored in the same transaction) and serves follower-side
//! reads, status and rebuilds.

pub mod apply;
pub mod cache;
pub mod config;
pub mod count_log;
pub mod feed;
pub mod fence;
pub mod grpc;
pub mod hot;
pub mod mutes;
pub mod service;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use prometheus::{IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry};
use sea_orm_migration::MigratorTrait;
use socialgraph_events::consumer::{Progress, run_partition};
use socialgraph_proto::projection::v1::projection_service_server::ProjectionServiceServer;
use socialgraph_proto::relation::v1::relation_service_client::RelationServiceClient;
use socialgraph_server::Readiness;
use socialgraph_server::stop::{join_within, within};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use config::Config;

/// Full gRPC name of the service.
pub const SERVICE_NAME: &str = "socialgraph.projection.v1.ProjectionService";

/// The gRPC services a projection-svc server answers (health reports each).
pub const SERVICE_NAMES: &[&str] = &[SERVICE_NAME, feed::SERVICE_NAME];

/// Admin methods whose duration grows with the data: exempt from the request timeout.
pub const LONG_RUNNING: &[&str] = &["/socialgraph.projection.v1.ProjectionService/Rebuild", "/socialgraph.feed.v1.FeedService/RebuildInboxes"];

pub(crate) use socialgraph_domain::now_ms;

/// projection-svc's parts over an open database: the read side and the consumer's batch
/// handler. Built once by [`build`], for [`run`] and for the embedded mode alike.
pub struct Parts {
    /// Follower-side reads, status and rebuilds.
    pub projection: Arc<service::Projection>,
    /// The effectively-once applier of relation events.
    pub projector: Arc<apply::Projector>,
    /// Home timelines: reads, the post entry point, the push worker's state.
    pub feed: Arc<feed::Feed>,
    /// The effectively-once consumer of content events.
    pub ingest: Arc<feed::ingest::Ingest>,
    /// The copy of the mutes timelines leave out, from the account events.
    pub mutes: Arc<mutes::MuteCopier>,
}

impl Parts {
    /// ProjectionService's and FeedService's routes; Rebuild and RebuildInboxes need `Bearer
    /// <admin_token>` (unset refuses them).
    pub fn routes(&self, admin_token: Option<secrecy::SecretString>) -> tonic::service::Routes {
        tonic::service::Routes::new(ProjectionServiceServer::new(grpc::ProjectionGrpc::new(Arc::clone(&self.projection), admin_token.clone())))
            .add_service(feed::grpc::FeedGrpc::server(Arc::clone(&self.feed), admin_token))
    }
}

/// Where projection-svc writes what it publishes.
pub struct Logs {
    /// Posts published through FeedService.
    pub content: Arc<dyn feed::ContentLog>,
    /// Every change of the follow counts, through the outbox (`None`: not published).
    pub counts: Option<Arc<count_log::CountLog>>,
}

/// Builds projection-svc's [`Parts`] from `config` (consumer name, topic, page-token key,
/// relation-svc's admin token) over `db`, reading the source through `relation` for rebuilds and
/// reporting consumer progress into `progress`, keeping `cache` (the list caches;
/// `None`: none) in step with the events, and publishing to `logs`. Registers
/// `sg_projection_applied_total`, `sg_projection_skipped_total`, `sg_cache_applies_total`
/// and the `sg_feed_*` metrics in `registry`.
///
/// # Errors
/// A metric of the same name is already registered; bad `[feed]` settings.
pub fn build(
    db: sea_orm::DatabaseConnection,
    config: &Config,
    relation: RelationServiceClient<tonic::transport::Channel>,
    progress: Progress,
    cache: Option<socialgraph_cache::lists::ListCaches>,
    logs: Logs,
    registry: &Registry,
) -> anyhow::Result<Parts> {
    config.feed.validate().map_err(anyhow::Error::msg)?;
    let Logs { content: content_log, counts: count_log } = logs;
    let applied = IntCounter::new("sg_projection_applied_total", "Relation events that changed a follower row")?;
    let skipped = IntCounterVec::new(Opts::new("sg_projection_skipped_total", "Records skipped, by reason"), &["reason"])?;
    let cache_applies =
        IntCounterVec::new(Opts::new("sg_cache_applies_total", "Event batches applied to the list caches, by result (ok, failed)"), &["result"])?;
    registry.register(Box::new(applied.clone()))?;
    registry.register(Box::new(skipped.clone()))?;
    registry.register(Box::new(cache_applies.clone()))?;
    let mut posts_cache = None;
    let cache = match cache {
        Some(lists) => {
            let metrics = cache::CacheMetrics::register(registry)?;
            let (consumer, topic) = (&config.database.consumer_name, &config.kafka.content_topic);
            let posts = feed::posts_cache::PostCache::new(lists.posts.clone(), consumer, topic, metrics.requests.clone(), metrics.fills.clone());
            posts_cache = Some(Arc::new(posts));
            let (consumer, topic) = (&config.database.consumer_name, &config.kafka.relation_topic);
            let hot = hot::Hot::new(config.cache.hot_reads_per_sec, Duration::from_millis(config.cache.hot_staleness_ms));
            let fills = config.cache.fill_slots();
            Some(Arc::new(cache::Caches::new(lists, hot, consumer, topic, config.cache.deep_pages_per_sec, fills, metrics)))
        }
        None => None,
    };
    let token_key = socialgraph_server::paging::page_token_key(config.auth.page_token_secret.as_ref());
    let relation = relation.max_decoding_message_size(64 * 1024 * 1024);
    let feed = Arc::new(feed::Feed {
        db: db.clone(),
        settings: config.feed.clone(),
        metrics: feed::FeedMetrics::register(registry)?,
        log: content_log,
        fanout_wake: Arc::new(tokio::sync::Notify::new()),
        token_key: token_key.clone(),
        consumer: config.database.consumer_name.clone(),
        posts_cache,
    });
    let ingest = Arc::new(feed::ingest::Ingest { feed: Arc::clone(&feed), count_posts: false });
    let projection = Arc::new(service::Projection {
        cache: cache.clone(),
        db: db.clone(),
        token_key: token_key.clone(),
        consumer: config.database.consumer_name.clone(),
        topic: config.kafka.relation_topic.clone(),
        progress,
        relation,
        feed: config.feed.clone(),
        relation_token: config.relation.admin_token.clone(),
        count_log: count_log.clone(),
    });
    let projector = Arc::new(apply::Projector {
        db,
        consumer: config.database.consumer_name.clone(),
        applied,
        skipped,
        cache,
        cache_applies,
        feed: config.feed.clone(),
        feed_metrics: Some(feed.metrics.clone()),
        count_log,
    });
    let mutes = Arc::new(mutes::MuteCopier { db: feed.db.clone(), consumer: config.database.consumer_name.clone() });
    Ok(Parts { projection, projector, feed, ingest, mutes })
}

/// Runs projection-svc on `grpc` and `admin` until `shutdown` fires: drains RPCs, then stops
/// the consumers at a batch boundary (their offsets are already stored with each batch).
///
/// # Errors
/// Start-up failures (database unreachable, migrations, bad relation URL) and transport
/// failures.
pub async fn run(config: Config, grpc: TcpListener, admin: TcpListener, shutdown: CancellationToken) -> anyhow::Result<()> {
    let db = socialgraph_storage::connect(&config.database.url, config.database.max_connections).await.context("connecting to the database")?;
    if config.database.migrate_on_start {
        socialgraph_migrations::Migrator::up(&db, None).await.context("running migrations")?;
    }
    let registry = Registry::new();
    let lag = IntGaugeVec::new(Opts::new("sg_projection_lag_records", "Records not yet applied, per topic and partition"), &["topic", "partition"])?;
    registry.register(Box::new(lag.clone()))?;
    let progress: Progress = Progress::default();
    let channel = tonic::transport::Channel::from_shared(config.relation.url.clone()).context("relation.url")?.connect_lazy();
    let cache = config.cache.list_caches().context("cache.url (SG_CACHE__URL)")?;
    let k = &config.kafka;
    let deadline = Duration::from_millis(k.request_deadline_ms);
    let content_log = Arc::new(feed::KafkaContentLog::new(k.brokers.clone(), k.content_topic.clone(), k.partitions, deadline));
    let relay_metrics = socialgraph_events::RelayMetrics::register(&registry)?;
    let wake = Arc::new(tokio::sync::Notify::new());
    let count_log = Arc::new(count_log::CountLog { topic: k.edge_count_topic.clone(), wake: Arc::clone(&wake) });
    let logs = Logs { content: content_log, counts: Some(count_log) };
    let parts = build(db.clone(), &config, RelationServiceClient::new(channel), progress.clone(), cache.clone(), logs, &registry)?;

    let readiness = Readiness::default();
    let loops = CancellationToken::new();
    // The follow counts' outbox rows: several services on one database share one relay leader.
    let topics = vec![config.kafka.edge_count_topic.clone()];
    let relay = config
        .kafka
        .relay_enabled
        .then(|| tokio::spawn(socialgraph_server::relay::relay_task(db.clone(), config.kafka.clone(), topics, wake, relay_metrics, loops.clone())));
    let handlers = Handlers {
        projector: Arc::clone(&parts.projector),
        ingest: Arc::clone(&parts.ingest),
        feed: Arc::clone(&parts.feed),
        mutes: Arc::clone(&parts.mutes),
    };
    let consumers = tokio::spawn(consume(config.clone(), handlers, progress.clone(), lag, readiness.clone(), loops.clone()));
    let drain = cache.map(|cache| tokio::spawn(socialgraph_server::cache_drain::drain_task(db.clone(), cache, loops.clone())));
    let serving = socialgraph_server::GrpcServing::new(SERVICE_NAMES, LONG_RUNNING, &config.server, readiness.clone(), &registry)?;
    let admin_task = tokio::spawn(socialgraph_server::serve_admin(admin, registry, readiness.clone(), loops.clone()));
    let routes = parts.routes(config.auth.admin_token.clone());
    let served = socialgraph_server::serve_grpc(routes, grpc, serving, shutdown).await;
    loops.cancel();
    let limit = Duration::from_millis(config.server.drain_timeout_ms);
    join_within("consumers", limit, consumers).await;
    if let Some(relay) = relay {
        join_within("relay", limit, relay).await;
    }
    if let Some(drain) = drain {
        join_within("stale cache drain", limit, drain).await;
    }
    join_within("admin server", limit, admin_task).await;
    within("database pool close", limit, db.close()).await;
    served
}

/// The consumers' handlers and the push worker's feed.
struct Handlers {
    projector: Arc<apply::Projector>,
    ingest: Arc<feed::ingest::Ingest>,
    feed: Arc<feed::Feed>,
    mutes: Arc<mutes::MuteCopier>,
}

/// Connects to Kafka (retrying while it is down), makes sure the relation, content and account
/// topics exist, starts one consumer per owned partition of each and the push worker of the
/// owned content partitions, and keeps readiness and lag metrics current.
async fn consume(config: Config, handlers: Handlers, progress: Progress, lag: IntGaugeVec, readiness: Readiness, cancel: CancellationToken) {
    let deadline = Duration::from_millis(config.kafka.request_deadline_ms);
    let k = &config.kafka;
    let (relation, content, account) = (k.relation_topic.clone(), k.content_topic.clone(), k.account_topic.clone());
    let topics = [relation.as_str(), content.as_str(), account.as_str()];
    let Some((client, counts)) =
        socialgraph_events::kafka::connect_until_ready(&config.kafka.brokers, deadline, &topics, config.kafka.partitions, &cancel).await
    else {
        return;
    };
    let log = Arc::new(socialgraph_events::KafkaLog::new(client, config.kafka.partitions));
    let mut owned_all = Vec::new();
    let mut tasks = Vec::new();
    let activity = Arc::new(tokio::sync::Notify::new());
    for (i, topic) in topics.iter().enumerate() {
        let total = counts.get(i).copied().unwrap_or(config.kafka.partitions);
        // The cache fills wait for a position of every partition, whoever consumes it.
        let fence = match i {
            0 => handlers.projector.cache.as_ref().map(|c| &c.fence),
            1 => handlers.feed.posts_cache.as_ref().map(|c| &c.fence),
            _ => None,
        };
        if let Some(fence) = fence {
            fence.set_partitions(total);
        }
        let owned = config.consumer.partitions.partitions(total);
        tracing::info!(topic, ?owned, "consuming");
        for p in owned.iter().copied() {
            let (c, t, prog, s, a, cc) =
                (Arc::clone(&log), topic.to_string(), progress.clone(), config.consumer.clone(), Arc::clone(&activity), cancel.clone());
            tasks.push(match i {
                0 => tokio::spawn(run_partition(c, t, p, Arc::clone(&handlers.projector), prog, s, a, cc)),
                1 => tokio::spawn(run_partition(c, t, p, Arc::clone(&handlers.ingest), prog, s, a, cc)),
                _ => tokio::spawn(run_partition(c, t, p, Arc::clone(&handlers.mutes), prog, s, a, cc)),
            });
            owned_all.push((topic.to_string(), p));
        }
        if i == 1 {
            tasks.push(tokio::spawn(feed::fanout::run(Arc::clone(&handlers.feed), owned, cancel.clone())));
        }
    }
    while !cancel.is_cancelled() {
        {
            let map = progress.read().await;
            let running = owned_all.iter().all(|key| map.get(key).is_some_and(|s| s.running));
            readiness.set(running);
            for ((topic, p), s) in map.iter() {
                lag.with_label_values(&[topic, &p.to_string()]).set(s.lag());
            }
        }
        tokio::select! { _ = tokio::time::sleep(Duration::from_millis(200)) => {}, _ = cancel.cancelled() => {} }
    }
    readiness.set(false);
    for t in tasks {
        let _ = t.await;
    }
}

/// Connects to the configured database and runs pending migrations.
///
/// # Errors
/// The database is unreachable or a migration failed.
pub async fn migrate(config: &Config) -> anyhow::Result<()> {
    let db = socialgraph_storage::connect(&config.database.url, 2).await.context("connecting to the database")?;
    socialgraph_migrations::Migrator::up(&db, None).await.context("running migrations")?;
    Ok(())
}
