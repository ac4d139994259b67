//! Load generation shared by the parts: the closed-loop driver, reproducible ids and edges, and
//! gRPC connections to spread workers over.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng, rngs::StdRng};
use socialgraph_integration_tests::Svc;
use tonic::transport::Channel;

use crate::report::{Run, hist};

/// gRPC connections a load generator spreads its workers over.
pub(crate) const CHANNELS: usize = 8;

/// Runs `op(worker, i)` for i = 0.. from `concurrency` workers until `max_ops` ops were started
/// or `max_time` passed; each worker waits for its op before starting the next (closed loop).
pub(crate) async fn closed_loop<F, Fut>(concurrency: usize, max_ops: usize, max_time: Duration, op: F) -> Run
where
    F: Fn(usize, usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let op = Arc::new(op);
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let deadline = start + max_time;
    let mut tasks = Vec::new();
    for w in 0..concurrency.max(1) {
        let (op, next) = (Arc::clone(&op), Arc::clone(&next));
        tasks.push(tokio::spawn(async move {
            let (mut lat, mut errors, mut first_error) = (hist(), 0u64, None);
            while Instant::now() < deadline {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= max_ops {
                    break;
                }
                let t = Instant::now();
                match op(w, i).await {
                    Ok(()) => lat.saturating_record(t.elapsed().as_micros() as u64),
                    Err(e) => {
                        errors += 1;
                        first_error.get_or_insert_with(|| format!("{e:#}"));
                    }
                }
            }
            (lat, errors, first_error)
        }));
    }
    let mut run = Run { ok: 0, errors: 0, first_error: None, elapsed: Duration::ZERO, lat: hist() };
    for t in tasks {
        match t.await {
            Ok((lat, errors, first_error)) => {
                let _ = run.lat.add(&lat);
                run.errors += errors;
                if run.first_error.is_none() {
                    run.first_error = first_error;
                }
            }
            Err(e) => {
                run.errors += 1;
                run.first_error.get_or_insert_with(|| format!("worker panicked: {e}"));
            }
        }
    }
    run.elapsed = start.elapsed();
    run.ok = run.lat.len();
    run
}

/// splitmix64: cheap, reproducible pseudo-random ids derived from an op index.
pub(crate) fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// `n` distinct directed edges among users `1..=users`, no self-loops.
pub(crate) fn distinct_edges(n: usize, users: i64, seed: u64) -> Vec<(i64, i64)> {
    assert!((users as f64) * (users as f64 - 1.0) > 2.0 * n as f64, "too few users for {n} distinct edges");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut seen = HashSet::with_capacity(n);
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let (a, b) = (rng.random_range(1..=users), rng.random_range(1..=users));
        if a != b && seen.insert((a, b)) {
            out.push((a, b));
        }
    }
    out
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or_default()
}

/// `n` distinct gRPC connections to `svc`.
pub(crate) async fn channels(svc: &Svc, n: usize) -> anyhow::Result<Vec<Channel>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        // Distinct connections: a Channel's clones share one HTTP/2 connection.
        out.push(svc.channel().await?);
    }
    Ok(out)
}
