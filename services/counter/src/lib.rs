//! counter-svc: per-user counters (followings, followers, posts, likes and favourites
//! received, unread messages) and per-entity like/fav counts in Redis. Consumes
//! `sg.relation.v1`, `sg.edge_count.v1`, `sg.content.v1`, `sg.counter.v1` and (with `message.url`) `sg.message.v1`
//! effectively-once; takes like/fav toggles on bitmap facts
//! and relays their events from a Redis outbox written in the same step as the fact.

pub mod backend;
pub mod config;
pub mod consume;
pub mod entities;
pub mod grpc;
pub mod outbox;
pub mod store;
pub mod unread;
pub mod users;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use prometheus::{IntCounter, IntGaugeVec, Opts, Registry};
use socialgraph_events::consumer::{Progress, run_partition};
use socialgraph_proto::counter::v1::counter_service_server::CounterServiceServer;
use socialgraph_proto::message::v1::message_service_client::MessageServiceClient;
use socialgraph_proto::projection::v1::projection_service_client::ProjectionServiceClient;
use socialgraph_server::Readiness;
use socialgraph_server::stop::join_within;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use config::Config;

/// Full gRPC name of the service.
pub const SERVICE_NAME: &str = "socialgraph.counter.v1.CounterService";
/// Name of this service's consumer offsets in Redis.
pub const CONSUMER: &str = "counter";

fn counter(registry: &Registry, name: &str, help: &str) -> anyhow::Result<IntCounter> {
    let c = IntCounter::new(name, help)?;
    registry.register(Box::new(c.clone()))?;
    Ok(c)
}

/// CounterService's routes over `backend` (Redis here, SQL in the embedded mode); the rebuilds
/// need `Bearer <admin_token>` (unset refuses them).
pub fn routes<B: backend::CounterBackend>(backend: Arc<B>, admin_token: Option<secrecy::SecretString>) -> tonic::service::Routes {
    tonic::service::Routes::new(CounterServiceServer::new(grpc::CounterGrpc::new(backend, admin_token)))
}

/// Runs counter-svc on `grpc` and `admin` until `shutdown` fires.
///
/// # Errors
/// Start-up failures (bad Redis or projection URL) and transport failures.
pub async fn run(mut config: Config, grpc: TcpListener, admin: TcpListener, shutdown: CancellationToken) -> anyhow::Result<()> {
    config.apply_renamed();
    let timeout = Duration::from_millis(config.redis.timeout_ms);
    let pool = socialgraph_cache::pool(&config.redis.url, config.redis.pool_size, timeout).context("redis.url (SG_REDIS__URL)")?;
    let store = store::Store {
        pool,
        keys: socialgraph_cache::keys::Keys::new(config.redis.key_prefix.clone()),
        scripts: Default::default(),
        entity_scripts: Default::default(),
        timeout,
    };
    let registry = Registry::new();
    let metrics = consume::ConsumerMetrics::register(&registry)?;
    let lag = IntGaugeVec::new(Opts::new("sg_counter_lag_records", "Records not yet applied"), &["topic", "partition"])?;
    registry.register(Box::new(lag.clone()))?;
    let channel = tonic::transport::Channel::from_shared(config.projection.url.clone()).context("projection.url")?.connect_lazy();
    let counters = Arc::new(users::Counters {
        store: store.clone(),
        projection: ProjectionServiceClient::new(channel),
        check_interval_secs: config.counters.check_interval_secs,
        rebuilds: counter(&registry, "sg_counter_rebuilds_total", "User counters created or rebuilt from the facts")?,
        repairs: counter(&registry, "sg_counter_repairs_total", "Checks and rebuilds that found drift and repaired it")?,
        check_slots: Arc::new(tokio::sync::Semaphore::new(users::CHECK_SLOTS)),
        resting: users::resting_cache(config.counters.check_interval_secs),
    });
    // Connected on first use and again after a failed attempt: like/fav events wait in their
    // outboxes while the broker is down.
    let deadline = Duration::from_millis(config.kafka.request_deadline_ms);
    let producer = Arc::new(socialgraph_events::KafkaLog::connect_on_first_use(config.kafka.brokers.clone(), deadline, config.kafka.partitions));
    let relay_wake = Arc::new(tokio::sync::Notify::new());
    let entities = Arc::new(entities::Entities { store: store.clone(), relay_wake: Arc::clone(&relay_wake) });
    let relay = outbox::Relay {
        store: store.clone(),
        topic: config.kafka.counter_topic.clone(),
        producer,
        wake: relay_wake,
        quiet_ms: config.counters.relay_quiet_ms as i64,
        published: counter(&registry, "sg_action_events_published_total", "Like/fav outbox events the broker acknowledged")?,
        failures: counter(&registry, "sg_action_publish_failures_total", "Relay rounds of the like/fav outbox that could not publish")?,
        holder: format!("{:016x}", rand::random::<u64>()),
        sweep: Default::default(),
    };

    let readiness = Readiness::default();
    let loops = CancellationToken::new();
    let message = match config.message.url.as_str() {
        "" => None,
        url => Some(MessageServiceClient::new(tonic::transport::Channel::from_shared(url.to_owned()).context("message.url")?.connect_lazy())),
    };
    let ctx = ConsumeCtx { config: config.clone(), store, consume_messages: message.is_some(), metrics, lag, readiness: readiness.clone() };
    let consumers = tokio::spawn(consume_all(ctx, loops.clone()));
    let relay_task = tokio::spawn(relay.run(loops.clone()));
    let serving = socialgraph_server::GrpcServing::new(&[SERVICE_NAME], &[], &config.server, readiness.clone(), &registry)?;
    let admin_task = tokio::spawn(socialgraph_server::serve_admin(admin, registry, readiness.clone(), loops.clone()));
    let backend = backend::RedisCounters { counters, entities: Arc::clone(&entities), message: message.clone() };
    let routes = routes(Arc::new(backend), config.auth.admin_token.clone());
    let served = socialgraph_server::serve_grpc(routes, grpc, serving, shutdown).await;
    loops.cancel();
    let limit = Duration::from_millis(config.server.drain_timeout_ms);
    join_within("consumers", limit, consumers).await;
    join_within("like/fav relay", limit, relay_task).await;
    join_within("admin server", limit, admin_task).await;
    served
}

/// What the consumers need.
struct ConsumeCtx {
    config: Config,
    store: store::Store,
    /// Whether `kafka.message_topic` is consumed (`message.url` is set).
    consume_messages: bool,
    metrics: consume::ConsumerMetrics,
    lag: IntGaugeVec,
    readiness: Readiness,
}

/// Connects to Kafka (retrying while it is down), makes sure the topics exist, starts one
/// consumer per owned partition of each topic, and keeps readiness and lag current.
async fn consume_all(ctx: ConsumeCtx, cancel: CancellationToken) {
    let k = &ctx.config.kafka;
    let deadline = Duration::from_millis(k.request_deadline_ms);
    let mut topics = vec![k.relation_topic.clone(), k.edge_count_topic.clone(), k.content_topic.clone(), k.counter_topic.clone()];
    if ctx.consume_messages {
        topics.push(k.message_topic.clone());
    }
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    let Some((client, counts)) = socialgraph_events::kafka::connect_until_ready(&k.brokers, deadline, &names, k.partitions, &cancel).await else {
        return;
    };
    let log = Arc::new(socialgraph_events::KafkaLog::new(client, k.partitions));
    let progress = Progress::default();
    let edge_counts = Arc::new(consume::EdgeCountCounter { store: ctx.store.clone(), consumer: CONSUMER.into(), metrics: ctx.metrics.clone() });
    let followings = Arc::new(consume::FollowingsCounter { store: ctx.store.clone(), consumer: CONSUMER.into(), metrics: ctx.metrics.clone() });
    let content = Arc::new(consume::ContentCounter { store: ctx.store.clone(), consumer: CONSUMER.into(), metrics: ctx.metrics.clone() });
    let actions = Arc::new(consume::ActionCounter { store: ctx.store.clone(), consumer: CONSUMER.into(), metrics: ctx.metrics.clone() });
    let unread = ctx
        .consume_messages
        .then(|| Arc::new(unread::UnreadCounter { store: ctx.store.clone(), consumer: CONSUMER.into(), metrics: ctx.metrics.clone() }));
    let mut tasks = Vec::new();
    let mut owned = Vec::new();
    let activity = Arc::new(tokio::sync::Notify::new());
    for (t, n) in topics.iter().zip(&counts) {
        for p in ctx.config.consumer.partitions.partitions(*n) {
            owned.push((t.clone(), p));
            let (c, prog, s, a, cc) = (Arc::clone(&log), progress.clone(), ctx.config.consumer.clone(), Arc::clone(&activity), cancel.clone());
            tasks.push(if t == &k.relation_topic {
                tokio::spawn(run_partition(c, t.clone(), p, Arc::clone(&followings), prog, s, a, cc))
            } else if t == &k.edge_count_topic {
                tokio::spawn(run_partition(c, t.clone(), p, Arc::clone(&edge_counts), prog, s, a, cc))
            } else if t == &k.content_topic {
                tokio::spawn(run_partition(c, t.clone(), p, Arc::clone(&content), prog, s, a, cc))
            } else if let Some(unread) = unread.as_ref().filter(|_| t == &k.message_topic) {
                tokio::spawn(run_partition(c, t.clone(), p, Arc::clone(unread), prog, s, a, cc))
            } else {
                tokio::spawn(run_partition(c, t.clone(), p, Arc::clone(&actions), prog, s, a, cc))
            });
        }
    }
    while !cancel.is_cancelled() {
        {
            let map = progress.read().await;
            ctx.readiness.set(owned.iter().all(|key| map.get(key).is_some_and(|s| s.running)));
            for ((t, p), s) in map.iter() {
                ctx.lag.with_label_values(&[t.as_str(), &p.to_string()]).set(s.lag());
            }
        }
        tokio::select! { _ = tokio::time::sleep(Duration::from_millis(200)) => {}, _ = cancel.cancelled() => {} }
    }
    ctx.readiness.set(false);
    for t in tasks {
        let _ = t.await;
    }
}
