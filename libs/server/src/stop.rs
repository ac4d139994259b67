//! The steps of a service's stop after its gRPC server drained, each bounded in time.
//!
//! A service stops in order: the gRPC server drains (`server.drain_timeout_ms`), then the loops
//! (consumers, relays, jobs, cache drains) finish the batch in hand, the admin server closes its
//! connections and the database pool closes. Each of those later steps waits at most the same
//! `drain_timeout_ms`; a step past it is logged with its name and given up, so one stuck step
//! (a consumer waiting on a peer, a database connection still checked out, so that the pool's
//! close waits for it) cannot keep the process from exiting. Giving a step up loses nothing stored: consumers commit their offsets with each
//! batch and the relays delete outbox rows only after the broker acknowledged them.

use std::future::Future;
use std::time::Duration;

use tokio::task::JoinHandle;

/// Awaits `step` for at most `limit`: `Some(output)`, or `None` after a warning naming `what`.
pub async fn within<T>(what: &str, limit: Duration, step: impl Future<Output = T>) -> Option<T> {
    match tokio::time::timeout(limit, step).await {
        Ok(out) => Some(out),
        Err(_) => {
            tracing::warn!(step = what, limit_ms = limit.as_millis() as u64, "stop step did not finish in time; giving it up");
            None
        }
    }
}

/// Awaits the spawned `task` for at most `limit` as [`within`] does, then aborts it: `Some`
/// with its output when it finished (`None` also when it panicked or was cancelled).
pub async fn join_within<T>(what: &str, limit: Duration, mut task: JoinHandle<T>) -> Option<T> {
    match within(what, limit, &mut task).await {
        Some(joined) => joined.ok(),
        None => {
            task.abort();
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_finished_task_gives_its_output_and_a_stuck_one_is_aborted_at_the_limit() {
        let limit = Duration::from_millis(200);
        assert_eq!(join_within("quick", limit, tokio::spawn(async { 7 })).await, Some(7));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let stuck = tokio::spawn(async move {
            std::future::pending::<()>().await;
            drop(tx);
        });
        let started = std::time::Instant::now();
        assert_eq!(join_within("stuck", limit, stuck).await, None);
        assert!(started.elapsed() >= limit, "waited the whole limit");
        assert!(rx.await.is_err(), "the stuck task was aborted: its sender is gone");
    }
}
