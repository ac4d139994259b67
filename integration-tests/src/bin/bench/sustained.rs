//! Part 6, sustained: Follow offered at a fixed rate (80 % of what a short closed-loop run
//! sustains) to the whole mesh for minutes, open loop: errors, how far the outbox and the
//! projection fall behind, and this process's resident memory (it hosts the three services) at
//! the start and the end.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use socialgraph_integration_tests::Mesh;
use socialgraph_proto::projection::v1::GetProjectionStatusRequest;
use socialgraph_proto::projection::v1::projection_service_client::ProjectionServiceClient;
use socialgraph_proto::relation::v1::FollowRequest;

use crate::SustainedArgs;
use crate::load::{closed_loop, distinct_edges};
use crate::relation::relation_clients;
use crate::report::{header, print_table, progress, row, summarize};

/// Concurrent callers of the closed-loop run that finds the sustainable rate.
const CALLERS: usize = 32;

/// Most follows in flight in the open loop; beyond it an offered follow is counted as not sent.
const MAX_IN_FLIGHT: usize = 1024;

pub(crate) async fn run(a: &SustainedArgs) -> anyhow::Result<()> {
    header("sustained: Follow at a fixed rate for minutes, open loop");
    let mesh = Mesh::start(&socialgraph_testkit::redis_url()).await?;
    let clients = relation_clients(&mesh.relation).await?;
    let edges = Arc::new(distinct_edges(200_000 + a.secs as usize * 4_000, 2_000_000, 11));

    let rate = if a.rate > 0 {
        a.rate
    } else {
        progress("finding the sustainable rate: 10 s closed loop, 32 callers");
        let (c, e) = (clients.clone(), Arc::clone(&edges));
        let probe = closed_loop(CALLERS, 200_000, Duration::from_secs(10), move |w, i| {
            let mut c = c[w % c.len()].clone();
            let (follower_id, followee_id) = e[i];
            async move {
                c.follow(FollowRequest { follower_id, followee_id }).await?;
                Ok(())
            }
        })
        .await;
        ((probe.rate() * 0.8) as u32).max(1)
    };
    let start_rss = rss_kib();
    progress(&format!("{rate} follows/s for {} s (RSS at start {} MiB)", a.secs, start_rss / 1024));
    let (ok, errors, not_sent) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let in_flight = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
    let mut projection = ProjectionServiceClient::connect(format!("http://{}", mesh.projection.addr)).await?;
    let kafka = socialgraph_testkit::kafka::connect(&mesh.brokers).await?;
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let (mut max_outbox, mut max_lag, mut next_edge) = (0i64, 0i64, 200_000usize);
    for second in 0..a.secs {
        tick.tick().await;
        for k in 0..rate as usize {
            let Ok(permit) = Arc::clone(&in_flight).try_acquire_owned() else {
                not_sent.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            let (follower_id, followee_id) = edges[next_edge % edges.len()];
            next_edge += 1;
            let mut c = clients[k % clients.len()].clone();
            let (ok, errors) = (Arc::clone(&ok), Arc::clone(&errors));
            tokio::spawn(async move {
                let r = c.follow(FollowRequest { follower_id, followee_id }).await;
                (if r.is_ok() { ok } else { errors }).fetch_add(1, Ordering::Relaxed);
                drop(permit);
            });
            // Spread the second's follows over it.
            if k % 16 == 15 {
                tokio::time::sleep(Duration::from_micros(16_000_000 / u64::from(rate.max(1)))).await;
            }
        }
        if second % 10 == 9 {
            let outbox = socialgraph_storage::outbox::backlog(&mesh.db.conn).await.map(|b| b.0).unwrap_or(-1);
            let hw: i64 = socialgraph_testkit::kafka::high_watermarks(&kafka, &mesh.topics.relation).await.map(|h| h.values().sum()).unwrap_or(0);
            let applied: i64 = projection
                .get_projection_status(GetProjectionStatusRequest {})
                .await
                .map(|r| r.into_inner().partitions.iter().filter(|p| p.topic == mesh.topics.relation).map(|p| p.next_offset).sum())
                .unwrap_or(0);
            let lag = hw - applied;
            (max_outbox, max_lag) = (max_outbox.max(outbox), max_lag.max(lag));
            println!(
                "  [{:>4} s] ok {:>8}  errors {:>4}  outbox {outbox:>6}  projection lag {lag:>6}  RSS {} MiB",
                started.elapsed().as_secs(),
                ok.load(Ordering::Relaxed),
                errors.load(Ordering::Relaxed),
                rss_kib() / 1024
            );
        }
    }
    let _ = in_flight.acquire_many(MAX_IN_FLIGHT as u32).await;
    let offered_secs = started.elapsed().as_secs_f64();
    let end_rss = rss_kib();
    mesh.settle(Duration::from_secs(300)).await?;
    let (ok, errors, not_sent) = (ok.load(Ordering::Relaxed), errors.load(Ordering::Relaxed), not_sent.load(Ordering::Relaxed));
    mesh.stop().await?;
    print_table(
        &format!("Sustained Follow: {rate}/s offered for {} s", a.secs),
        "start",
        "end",
        &[row("RSS of the mesh process (MiB)", start_rss as f64 / 1024.0, end_rss as f64 / 1024.0, "")],
        &[
            format!(
                "{ok} follows acknowledged ({:.0}/s), {errors} errors, {not_sent} not sent ({MAX_IN_FLIGHT} in flight)",
                ok as f64 / offered_secs
            ),
            format!("largest outbox backlog seen {max_outbox} rows, largest projection lag {max_lag} records (sampled every 10 s)"),
            "every view settled (outbox empty, projection and counters at lag 0) after the run".into(),
        ],
    );
    summarize(format!("sustained Follow {rate}/s for {} s: errors", a.secs), errors as f64, 0.0, "", "0, lag bounded, RSS flat");
    summarize("sustained: RSS end / start (MiB)", end_rss as f64 / 1024.0, start_rss as f64 / 1024.0, "MiB", "ratio ~1");
    Ok(())
}

/// This process's resident set size in KiB (`VmRSS` of /proc/self/status).
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()))
        .unwrap_or(0)
}
