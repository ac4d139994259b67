//! Part 7, idle: what a mesh that receives no traffic costs: CPU of the broker and of this
//! process (which hosts the three services) over a quiet period, with the consumers' deep idle
//! on (the defaults) and off (`deep_idle_ms` = `idle_max_ms`, the earlier behaviour).

use std::time::{Duration, Instant};

use socialgraph_integration_tests::{Mesh, spawn_counter, spawn_projection};

use crate::IdleArgs;
use crate::backends::{TICKS_PER_SEC, broker_pid, cpu_ticks};
use crate::report::{header, print_table, progress, row, summarize};

pub(crate) async fn run(a: &IdleArgs) -> anyhow::Result<()> {
    header("idle: CPU of an idle mesh");
    let Some(broker) = broker_pid() else {
        anyhow::bail!("no broker process (tansu) found: run `make deps`");
    };
    let mut mesh = Mesh::start(&socialgraph_testkit::redis_url()).await?;
    let quiet = Duration::from_secs(a.secs);
    // Past the deep-idle threshold first (10 s by default), then measure.
    progress(&format!("defaults: {} s to go quiet, then {} s measured", 12, a.secs));
    tokio::time::sleep(Duration::from_secs(12)).await;
    let deep = cpu_over(broker, quiet).await;

    progress("deep idle off (deep_idle_ms = idle_max_ms = 50): the consumers restarted");
    let mut pc = mesh.projection_config();
    pc.consumer.deep_idle_ms = pc.consumer.idle_max_ms;
    let proj = spawn_projection(pc).await?;
    std::mem::replace(&mut mesh.projection, proj).stop().await?;
    let mut cc = mesh.counter_config();
    cc.consumer.deep_idle_ms = cc.consumer.idle_max_ms;
    let counter = spawn_counter(cc).await?;
    std::mem::replace(&mut mesh.counter, counter).stop().await?;
    tokio::time::sleep(Duration::from_secs(12)).await;
    let shallow = cpu_over(broker, quiet).await;
    mesh.stop().await?;

    print_table(
        &format!("Idle mesh, {} s measured after 12 s without traffic (cores used)", a.secs),
        "deep idle",
        "no deep idle",
        &[row("broker CPU (cores)", deep.0, shallow.0, ""), row("services' process CPU (cores)", deep.1, shallow.1, "")],
        &[
            "the mesh of the tests: projection-svc on 4 partitions, counter-svc on 3 topics x 4 partitions (16 fetch loops)".into(),
            "deep idle = after 10 s without records a partition fetches once a second (consumer.deep_idle_ms); \
             no deep idle = every 50 ms, as before"
                .into(),
        ],
    );
    summarize("idle mesh: broker CPU, deep idle vs none", deep.0, shallow.0, "cores", "near nothing");
    Ok(())
}

/// Cores used by the broker and by this process over `d`.
async fn cpu_over(broker: u32, d: Duration) -> (f64, f64) {
    let (b0, s0, t) = (cpu_ticks(&broker.to_string()), cpu_ticks("self"), Instant::now());
    tokio::time::sleep(d).await;
    let secs = t.elapsed().as_secs_f64();
    let (b1, s1) = (cpu_ticks(&broker.to_string()), cpu_ticks("self"));
    ((b1 - b0) as f64 / TICKS_PER_SEC / secs, (s1 - s0) as f64 / TICKS_PER_SEC / secs)
}
