//! The outbox relay: one active leader across replicas publishes committed outbox rows in id
//! order and deletes them after the sink acknowledged. It wakes at once on a local commit
//! (through a [`Notify`]) and polls every `idle_poll` for commits of other replicas. Sink
//! failures back off exponentially and retry the same rows, so nothing is lost; a row may be
//! published twice (acknowledged, then the delete failed), which consumers absorb. A replica
//! taking the lead first asks the sink which head rows it already holds and deletes those
//! unpublished, so a leader's crash between the acknowledgement and the delete does not
//! publish its last batch again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBuilder};
use prometheus::{IntCounter, IntGauge, Registry};
use sea_orm::DatabaseConnection;
use socialgraph_storage::{leader::LeaderLock, outbox, outbox::OutboxRow};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// What a sink acknowledged of one publish call.
#[derive(Debug)]
pub struct PublishOutcome<E> {
    /// Ids of rows the sink durably accepted; the relay deletes them.
    pub acked: Vec<i64>,
    /// The first failure, if any rows were not accepted.
    pub error: Option<E>,
}

/// Where the relay publishes: Kafka in the distributed mode. Rows arrive in id order; a sink
/// must keep that order among rows of one key.
pub trait EventSink: Send + Sync + 'static {
    /// The sink's failure.
    type Error: std::error::Error + Send + Sync + 'static;
    /// Publishes `rows`, reporting which were acknowledged.
    fn publish(&self, rows: &[OutboxRow]) -> impl std::future::Future<Output = PublishOutcome<Self::Error>> + Send;
    /// The ids among `rows` (the head of the outbox, in id order) that the sink already holds:
    /// published by an earlier leader that died before deleting them. Only ids the sink can
    /// prove may be returned; when in doubt a row is published again (consumers absorb copies).
    fn already_published(&self, rows: &[OutboxRow]) -> impl std::future::Future<Output = Result<Vec<i64>, Self::Error>> + Send;
}

/// Relay settings.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// Rows read and published per round.
    pub batch_size: usize,
    /// How often an idle leader looks for rows committed by other replicas.
    pub idle_poll: Duration,
    /// How often a follower replica retries to become leader.
    pub leader_retry: Duration,
    /// Smallest and largest wait after a failed publish.
    pub backoff_min: Duration,
    /// Largest wait after failed publishes in a row.
    pub backoff_max: Duration,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            batch_size: 1000,
            idle_poll: Duration::from_millis(100),
            leader_retry: Duration::from_secs(2),
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
        }
    }
}

/// The relay's Prometheus metrics.
#[derive(Clone)]
pub struct RelayMetrics {
    /// Rows waiting in the outbox, as of the last round.
    pub backlog: IntGauge,
    /// Age in ms of the oldest waiting row (relay lag), as of the last round.
    pub lag_ms: IntGauge,
    /// Rows published and deleted.
    pub published: IntCounter,
    /// Failed publish or delete rounds.
    pub errors: IntCounter,
    /// 1 while this replica is the relay leader.
    pub leader: IntGauge,
    /// Rows a new leader found already published (by its predecessor) and deleted unpublished.
    pub skipped: IntCounter,
}

impl RelayMetrics {
    /// Creates the metrics and registers them in `registry`.
    ///
    /// # Errors
    /// A metric of the same name is already registered.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let m = Self {
            backlog: IntGauge::new("sg_outbox_backlog_rows", "Outbox rows waiting to be published")?,
            lag_ms: IntGauge::new("sg_relay_lag_ms", "Age of the oldest unpublished outbox row in milliseconds")?,
            published: IntCounter::new("sg_relay_published_total", "Outbox rows published and deleted")?,
            errors: IntCounter::new("sg_relay_errors_total", "Failed relay rounds")?,
            leader: IntGauge::new("sg_relay_leader", "1 while this replica leads the outbox relay")?,
            skipped: IntCounter::new("sg_relay_already_published_total", "Outbox rows a new leader found already published and deleted")?,
        };
        registry.register(Box::new(m.backlog.clone()))?;
        registry.register(Box::new(m.lag_ms.clone()))?;
        registry.register(Box::new(m.published.clone()))?;
        registry.register(Box::new(m.errors.clone()))?;
        registry.register(Box::new(m.leader.clone()))?;
        registry.register(Box::new(m.skipped.clone()))?;
        Ok(m)
    }
}

/// Runs the relay until `cancel` fires: waits for leadership, then publishes. Stops at a batch
/// boundary: a batch in flight is finished (published and deleted) first.
pub async fn run_relay<S: EventSink>(
    db: DatabaseConnection,
    sink: Arc<S>,
    wake: Arc<Notify>,
    config: RelayConfig,
    metrics: RelayMetrics,
    cancel: CancellationToken,
) {
    while !cancel.is_cancelled() {
        let lock = match LeaderLock::try_acquire(&db).await {
            Ok(Some(lock)) => lock,
            Ok(None) => {
                sleep_or_cancel(config.leader_retry, &cancel).await;
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %e, "relay: leader lock unavailable");
                sleep_or_cancel(config.leader_retry, &cancel).await;
                continue;
            }
        };
        metrics.leader.set(1);
        tracing::info!("relay: leading");
        match skip_published(&db, sink.as_ref(), &config).await {
            Ok(0) => {}
            Ok(n) => {
                metrics.skipped.inc_by(n as u64);
                tracing::info!(rows = n, "relay: deleted outbox rows the previous leader had published");
            }
            Err(e) => tracing::warn!(error = %e, "relay: could not check what the previous leader published; its last rows may be published twice"),
        }
        lead(&db, sink.as_ref(), &wake, &config, &metrics, &cancel, &lock).await;
        metrics.leader.set(0);
        if let Err(e) = lock.release().await {
            tracing::warn!(error = %e, "relay: releasing the leader lock failed");
        }
    }
}

/// On taking the lead: deletes the outbox rows at the head that the sink already holds (the
/// previous leader published them and died before its delete). Returns how many.
async fn skip_published<S: EventSink>(
    db: &DatabaseConnection,
    sink: &S,
    config: &RelayConfig,
) -> Result<usize, Box<dyn std::error::Error + Send + Sync>> {
    let mut total = 0;
    loop {
        let rows = outbox::fetch(db, config.batch_size).await?;
        if rows.is_empty() {
            return Ok(total);
        }
        let done = sink.already_published(&rows).await?;
        outbox::delete(db, &done).await?;
        total += done.len();
        if done.len() < rows.len() {
            return Ok(total);
        }
    }
}

async fn sleep_or_cancel(d: Duration, cancel: &CancellationToken) {
    tokio::select! { _ = tokio::time::sleep(d) => {}, _ = cancel.cancelled() => {} }
}

fn backoff(config: &RelayConfig) -> impl Iterator<Item = Duration> {
    ExponentialBuilder::default().with_min_delay(config.backoff_min).with_max_delay(config.backoff_max).with_jitter().without_max_times().build()
}

/// Publishes while leading; returns when cancelled or when the lock is lost.
async fn lead<S: EventSink>(
    db: &DatabaseConnection,
    sink: &S,
    wake: &Notify,
    config: &RelayConfig,
    metrics: &RelayMetrics,
    cancel: &CancellationToken,
    lock: &LeaderLock,
) {
    let mut delays = backoff(config);
    let mut last_check = Instant::now();
    // Counting the backlog scans the outbox index (tens of ms at a million rows): at most
    // once per BACKLOG_EVERY while draining, not after every batch.
    let mut last_count: Option<Instant> = None;
    while !cancel.is_cancelled() {
        if last_check.elapsed() > config.leader_retry {
            if let Err(e) = lock.check().await {
                tracing::warn!(error = %e, "relay: leader lock lost");
                return;
            }
            last_check = Instant::now();
        }
        let count_backlog = last_count.is_none_or(|t| t.elapsed() >= BACKLOG_EVERY);
        if count_backlog {
            last_count = Some(Instant::now());
        }
        match round(db, sink, config, metrics, count_backlog).await {
            Ok(0) => {
                delays = backoff(config);
                tokio::select! {
                    _ = wake.notified() => {},
                    _ = tokio::time::sleep(config.idle_poll) => {},
                    _ = cancel.cancelled() => {},
                }
            }
            Ok(_) => delays = backoff(config),
            Err(e) => {
                metrics.errors.inc();
                let wait = delays.next().unwrap_or(config.backoff_max);
                tracing::warn!(error = %e, retry_in_ms = wait.as_millis() as u64, "relay: round failed");
                sleep_or_cancel(wait, cancel).await;
            }
        }
    }
}

/// How often a draining leader counts the outbox for `sg_outbox_backlog_rows`.
const BACKLOG_EVERY: Duration = Duration::from_secs(1);

/// One round: read a batch, publish it, delete what was acknowledged. Returns the rows read.
/// A full batch updates the backlog gauge with a count of the outbox when `count_backlog`.
async fn round<S: EventSink>(
    db: &DatabaseConnection,
    sink: &S,
    config: &RelayConfig,
    metrics: &RelayMetrics,
    count_backlog: bool,
) -> Result<usize, Box<dyn std::error::Error + Send + Sync>> {
    let rows = outbox::fetch(db, config.batch_size).await?;
    let now_ms = socialgraph_domain::now_ms();
    if rows.is_empty() {
        metrics.backlog.set(0);
        metrics.lag_ms.set(0);
        return Ok(0);
    }
    metrics.lag_ms.set((now_ms - rows[0].row.created_at_ms).max(0));
    // One span per published batch, in the trace of its first row's write and linked to the rest.
    let span = tracing::info_span!("relay", otel.name = "relay.publish", otel.kind = "producer", messaging.batch.message_count = rows.len());
    let headers: Vec<_> = rows.iter().map(|r| crate::headers::decode(&r.row.headers)).collect();
    socialgraph_telemetry::adopt_records(&span, &headers);
    let outcome = sink.publish(&rows).instrument(span.clone()).await;
    outbox::delete(db, &outcome.acked).instrument(span).await?;
    metrics.published.inc_by(outcome.acked.len() as u64);
    if rows.len() == config.batch_size {
        if count_backlog {
            let (count, _) = outbox::backlog(db).await?;
            metrics.backlog.set(count);
        }
    } else {
        metrics.backlog.set((rows.len() - outcome.acked.len()) as i64);
    }
    match outcome.error {
        Some(e) => Err(Box::new(e)),
        None => Ok(rows.len()),
    }
}
