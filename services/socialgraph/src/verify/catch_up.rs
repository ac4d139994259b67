//! Step 1 of a verification: waiting until projection-svc has applied everything it can see.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::retry::retry;
use crate::endpoints::Endpoints;
use crate::error::{CliError, CliResult};
use crate::query::projection_status;

/// How long the projection took to catch up.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct CatchUp {
    /// Seconds waited.
    pub waited_secs: f64,
    /// Partitions projection-svc owns.
    pub partitions: usize,
    /// Records applied over all partitions (sum of next offsets).
    pub applied_records: i64,
}

/// Lag must stay 0 with no new record applied for this long to count as caught up. The
/// projection cannot see rows still waiting in relation-svc's outbox: between two relay rounds
/// it is idle and at lag 0. A round of 1,000 rows takes ~0.3 s here, one of 10,000 over a
/// second under load; this window covers both, and checks that still disagree afterwards are
/// repeated (see the [`verify`](super) module documentation), so a relay slower still costs
/// time, not a false mismatch.
const QUIET: Duration = Duration::from_secs(3);
/// How often GetProjectionStatus is asked while waiting.
const POLL: Duration = Duration::from_millis(100);

/// Waits until every partition projection-svc owns reports lag 0 and no record was applied
/// for 3 s (GetProjectionStatus, polled every 100 ms). Events still in relation-svc's outbox
/// are invisible here: the quiet window stands in for them.
///
/// # Errors
/// [`CliError::Timeout`] after `timeout`, with the lag left; [`CliError::Connect`];
/// [`CliError::Rpc`] for non-transient errors.
pub async fn wait_caught_up(endpoints: &Endpoints, timeout: Duration) -> CliResult<CatchUp> {
    let start = Instant::now();
    let deadline = start + timeout;
    let mut stable: Option<(i64, Instant)> = None;
    loop {
        let parts = retry(deadline, || projection_status(endpoints)).await?;
        let lag: i64 = parts.iter().map(|p| p.lag).sum();
        let applied: i64 = parts.iter().map(|p| p.next_offset).sum();
        if !parts.is_empty() && lag == 0 {
            match stable {
                Some((a, since)) if a == applied => {
                    if since.elapsed() >= QUIET {
                        let waited_secs = start.elapsed().as_secs_f64();
                        return Ok(CatchUp { waited_secs, partitions: parts.len(), applied_records: applied });
                    }
                }
                _ => stable = Some((applied, Instant::now())),
            }
        } else {
            stable = None;
        }
        if Instant::now() >= deadline {
            let what = if parts.is_empty() {
                "projection-svc owns no partition yet".to_owned()
            } else {
                format!("projection-svc has {lag} records left to apply")
            };
            return Err(CliError::Timeout(format!("{what} after {:.0}s", timeout.as_secs_f64())));
        }
        tokio::time::sleep(POLL).await;
    }
}
