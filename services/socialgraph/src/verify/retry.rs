//! Which RPC failures a verification waits out, and the loop that waits them out.

use std::time::{Duration, Instant};

use crate::error::{CliError, CliResult};

/// Pause between two attempts of a call that failed transiently.
pub(super) const BACKOFF: Duration = Duration::from_millis(250);

/// Whether `e` is worth retrying: the server is overloaded, restarting or slow, not wrong.
pub(super) fn transient(e: &CliError) -> bool {
    use tonic::Code::*;
    matches!(e.code(), Some(Unavailable | DeadlineExceeded | ResourceExhausted | Aborted))
}

/// Calls `f` until it succeeds, fails for good, or `deadline` passes (transient codes only).
pub(super) async fn retry<T, F, Fut>(deadline: Instant, mut f: F) -> CliResult<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = CliResult<T>>,
{
    loop {
        match f().await {
            Err(e) if transient(&e) && Instant::now() < deadline => tokio::time::sleep(BACKOFF).await,
            other => return other,
        }
    }
}
