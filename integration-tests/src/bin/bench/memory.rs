//! Part 5, memory: what counter-svc's Redis holds per user and per like, beside plain Redis
//! layouts of the same data (README, operations: sizing the counter Redis). Needs only Redis.

use crate::MemoryArgs;
use crate::backends::bench_redis;
use crate::report::header;

/// Measures the user counters at `a.users` users and the like facts at three densities.
pub(crate) async fn run(a: &MemoryArgs) -> anyhow::Result<()> {
    header("memory: user counters and like facts in counter-svc's Redis");
    let mut conn = bench_redis().await?;
    crate::counters::memory(&mut conn, a.users).await?;
    crate::likes::density::run(&mut conn).await
}
