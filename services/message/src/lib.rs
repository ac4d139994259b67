//! message-svc: private and group conversations, read cursors and unread counts
//! (`conversation`, `conversation_member`, `message`), their transactional outbox, and the
//! relay that publishes it to Kafka topic `sg.message.v1`.
//!
//! [`run`] is the whole service; `main` and the tests call it with their own listeners.

pub mod accounts;
pub mod blocks;
pub mod config;
pub mod edits;
pub mod grpc;
pub mod live;
pub mod reads;
pub mod service;
pub mod subscribe;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use sea_orm_migration::MigratorTrait;
use socialgraph_events::RelayMetrics;
use socialgraph_proto::message::v1::message_service_server::MessageServiceServer;
use socialgraph_server::Readiness;
use socialgraph_server::stop::{join_within, within};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

pub use config::Config;

/// Full gRPC name of the service (health and reflection).
pub const SERVICE_NAME: &str = "socialgraph.message.v1.MessageService";

/// Connects to the configured database and runs pending migrations.
///
/// # Errors
/// The database is unreachable or a migration failed.
pub async fn migrate(config: &Config) -> anyhow::Result<()> {
    let db = socialgraph_storage::connect(&config.database.url, 2).await.context("connecting to the database")?;
    socialgraph_migrations::Migrator::up(&db, None).await.context("running migrations")?;
    Ok(())
}

/// MessageService's routes over `messages`, with Subscribe streams following `hub`.
pub fn routes(messages: Arc<service::Messages>, hub: Arc<live::Hub>) -> tonic::service::Routes {
    tonic::service::Routes::new(MessageServiceServer::new(grpc::MessageGrpc::new(messages, hub)))
}

/// Runs message-svc on `grpc` and `admin` until `shutdown` fires, then drains RPCs, stops the
/// relay at a batch boundary, and returns.
///
/// # Errors
/// Start-up failures (database unreachable, migrations failed) and transport failures.
pub async fn run(config: Config, grpc: TcpListener, admin: TcpListener, shutdown: CancellationToken) -> anyhow::Result<()> {
    let db = socialgraph_storage::connect(&config.database.url, config.database.max_connections).await.context("connecting to the database")?;
    if config.database.migrate_on_start {
        socialgraph_migrations::Migrator::up(&db, None).await.context("running migrations")?;
    }
    let registry = prometheus::Registry::new();
    let relay_metrics = RelayMetrics::register(&registry)?;
    let wake = Arc::new(Notify::new());
    config.relation.warn_if_set();
    let messages = Arc::new(service::Messages::new(db.clone(), config.clone(), Arc::clone(&wake)));
    let loops = CancellationToken::new();
    let topics = vec![config.kafka.message_topic.clone()];
    let relay = config
        .kafka
        .relay_enabled
        .then(|| tokio::spawn(socialgraph_server::relay::relay_task(db.clone(), config.kafka.clone(), topics, wake, relay_metrics, loops.clone())));
    let accounts_task = tokio::spawn(consume_accounts(config.clone(), Arc::clone(&messages), loops.clone()));
    // Subscribe streams end as soon as shutdown fires, so the drain does not wait on them.
    let streams = shutdown.child_token();
    let k = &config.kafka;
    let kafka = socialgraph_events::KafkaLog::connect_on_first_use(k.brokers.clone(), Duration::from_millis(k.request_deadline_ms), k.partitions);
    let message_log = live::TopicLog { log: Arc::new(kafka), topic: k.message_topic.clone() };
    let hub = live::Hub::new(Arc::new(message_log), config.subscribe.hub(), streams.clone());
    let hub_task = tokio::spawn(Arc::clone(&hub).run());
    let readiness = Readiness::default();
    readiness.set(true);
    let serving = socialgraph_server::GrpcServing::new(&[SERVICE_NAME], &[], &config.server, readiness.clone(), &registry)?;
    let admin_task = tokio::spawn(socialgraph_server::serve_admin(admin, registry, readiness.clone(), loops.clone()));
    let served = socialgraph_server::serve_grpc(routes(Arc::clone(&messages), hub), grpc, serving, shutdown).await;
    loops.cancel();
    streams.cancel();
    let limit = Duration::from_millis(config.server.drain_timeout_ms);
    join_within("subscription hub", limit, hub_task).await;
    if let Some(relay) = relay {
        join_within("relay", limit, relay).await;
    }
    join_within("account consumer", limit, accounts_task).await;
    join_within("admin server", limit, admin_task).await;
    within("database pool close", limit, db.close()).await;
    served
}

/// Consumes `kafka.account_topic` ([`accounts::AccountEnder`]) until `cancel`: connects (retrying
/// while the broker is down), then one task per owned partition (`consumer.partitions`), each
/// resuming from the offset stored beside its effects.
async fn consume_accounts(config: Config, messages: Arc<service::Messages>, cancel: CancellationToken) {
    use socialgraph_events::consumer::{Progress, run_partition};
    let k = &config.kafka;
    let topic = k.account_topic.clone();
    let deadline = Duration::from_millis(k.request_deadline_ms);
    let Some((client, counts)) = socialgraph_events::kafka::connect_until_ready(&k.brokers, deadline, &[topic.as_str()], k.partitions, &cancel).await
    else {
        return;
    };
    let (log, progress, activity) = (Arc::new(socialgraph_events::KafkaLog::new(client, k.partitions)), Progress::default(), Arc::new(Notify::new()));
    let handler = Arc::new(accounts::AccountEnder { messages, consumer: config.database.consumer_name.clone() });
    let owned = config.consumer.partitions.partitions(counts.first().copied().unwrap_or(k.partitions));
    let tasks: Vec<_> = owned
        .into_iter()
        .map(|p| {
            let (c, h, prog, a, cc) = (Arc::clone(&log), Arc::clone(&handler), progress.clone(), Arc::clone(&activity), cancel.clone());
            tokio::spawn(run_partition(c, topic.clone(), p, h, prog, config.consumer.clone(), a, cc))
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
}
