//! The push worker: takes the oldest queued pushes of the partitions this replica consumes and
//! reaches their authors' current followers, `feed.fanout_batch` inbox rows per transaction
//! (inbox rows, inbox bounds and the pushes' cursors together), so a crash resumes at the last
//! committed cursors and re-adding a row that exists is a no-op. A delete of the post ends its
//! push.

use std::sync::Arc;
use std::time::Duration;

use socialgraph_storage::feed::{self, FeedEntry, FeedKey};
use tokio_util::sync::CancellationToken;

use super::Feed;

/// How often an idle worker looks for pushes queued by a consumer it was not woken by.
const IDLE_POLL: Duration = Duration::from_millis(500);

/// Retries of one batch transaction that lost a race.
const MAX_RETRIES: usize = 10;

/// Pushes taken per transaction.
const JOBS_PER_BATCH: usize = 100;

/// One transaction of pushes: the oldest queued pushes of `partitions`, each continued from its
/// cursor until `fanout_batch` inbox rows are written in all. Returns how many pushes it
/// touched (0: nothing queued).
///
/// # Errors
/// Database errors.
async fn batch(feed: &Feed, partitions: &[i32]) -> Result<usize, sea_orm::DbErr> {
    let txn = socialgraph_storage::begin_write(&feed.db).await?;
    let jobs = feed::next_fanouts(&txn, partitions, JOBS_PER_BATCH).await?;
    let mut budget = feed.settings.fanout_batch;
    let mut rows: Vec<(i64, FeedEntry)> = Vec::new();
    let mut touched = 0;
    for job in &jobs {
        if budget == 0 {
            break;
        }
        let followers = feed::followers_after(&txn, job.entry.author_id, job.next_follower_id, budget).await?;
        let more = followers.len() >= budget;
        budget -= followers.len();
        rows.extend(followers.iter().map(|f| (*f, job.entry)));
        feed::advance_fanout(&txn, job.entry.key.post_id, if more { followers.last().copied() } else { None }).await?;
        touched += 1;
    }
    let over = feed::inbox_add(&txn, &rows, feed.settings.trim_bound()).await?;
    for user in &over {
        feed::trim(&txn, *user, feed.settings.inbox_size, FeedKey::MIN).await?;
    }
    txn.commit().await?;
    feed.metrics.inbox_writes.with_label_values(&["fanout"]).inc_by(rows.len() as u64);
    feed.metrics.trims.inc_by(over.len() as u64);
    if touched > 0 {
        feed.metrics.fanout_batches.inc();
    }
    Ok(touched)
}

/// Runs pushes of `partitions` (the content partitions this replica consumes) until `cancel`.
/// Failures are logged and retried after a pause; nothing is skipped.
pub async fn run(feed: Arc<Feed>, partitions: Vec<i32>, cancel: CancellationToken) {
    let mut failures = 0u32;
    while !cancel.is_cancelled() {
        let step = async {
            let backlog = feed::fanout_backlog(&feed.db).await?;
            feed.metrics.fanout_backlog.set(backlog);
            let mut worked = false;
            while !cancel.is_cancelled() && socialgraph_storage::retry_tx(MAX_RETRIES, || batch(&feed, &partitions)).await? > 0 {
                worked = true;
            }
            Ok::<_, sea_orm::DbErr>(worked)
        };
        match step.await {
            Ok(true) => failures = 0,
            Ok(false) => {
                failures = 0;
                tokio::select! {
                    _ = feed.fanout_wake.notified() => {},
                    _ = tokio::time::sleep(IDLE_POLL) => {},
                    _ = cancel.cancelled() => {},
                }
            }
            Err(e) => {
                failures += 1;
                let wait = Duration::from_millis((50u64 << failures.min(6)).min(5_000));
                tracing::warn!(error = %e, retry_in_ms = wait.as_millis() as u64, "fan-out failed; retrying");
                tokio::select! { _ = tokio::time::sleep(wait) => {}, _ = cancel.cancelled() => {} }
            }
        }
    }
}
