//! Distributed acceptance on a real graph: SNAP's soc-Slashdot0902 (948,464 edges of which
//! 78,303 self-loops, users numbered from 0) loaded through the CLI library into relation-svc
//! on PostgreSQL, projected by projection-svc on PostgreSQL and counted by counter-svc on Redis
//! through the broker — then verified by the CLI's `verify`: every user's counters, the
//! follower lists of 200 random users and the familiar followers of 200 random pairs.
//!
//! Prints load throughput, time to projection lag 0 and verification time (run with
//! `--no-capture` to see them).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use socialgraph_cli::commands::progress_bar;
use socialgraph_cli::load::{LoadOptions, load_follows};
use socialgraph_cli::verify::{VerifyOptions, read_user_counters, verify, wait_caught_up};
use socialgraph_cli::{EdgeFileOptions, EdgeFormat, Endpoints, read_follow_file};
use socialgraph_integration_tests::{ADMIN_TOKEN, Mesh};

const EDGE_LINES: u64 = 948_464;
const SELF_LOOPS: u64 = 78_303;
const USERS: u64 = 82_168;
/// Generous: on 2 cores the relay drains at 2–6k rows/s depending on what else runs.
const CATCH_UP: Duration = Duration::from_secs(1200);

/// The data set soc-Slashdot0902 (`soc-Slashdot0902.txt.gz`, beside the repository).
fn slashdot() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/soc-Slashdot0902.txt.gz");
    assert!(path.exists(), "{} is missing: the data sets live in ../shared/data beside the repository", path.display());
    path
}

/// Prints, every `every`, where the events are: rows waiting in the outbox, records in the
/// topic, records projection-svc applied, counter-svc's lag and rebuilds.
fn spawn_monitor(m: &Mesh, every: Duration) -> (tokio::task::JoinHandle<()>, tokio_util::sync::CancellationToken) {
    let stop = tokio_util::sync::CancellationToken::new();
    let (conn, topic, projection, counter_admin) = (m.db.conn.clone(), m.topics.relation.clone(), m.projection.addr, m.counter.admin_addr);
    let counts_topic = m.topics.edge_count.clone();
    let cancel = stop.clone();
    let task = tokio::spawn(async move {
        let start = Instant::now();
        let Ok(kafka) = socialgraph_testkit::kafka::connect(&socialgraph_testkit::kafka::brokers()).await else {
            return;
        };
        while !cancel.is_cancelled() {
            let outbox = socialgraph_storage::outbox::backlog(&conn).await.map(|b| b.0).unwrap_or(-1);
            let topic_records: i64 = socialgraph_testkit::kafka::high_watermarks(&kafka, &topic).await.map(|h| h.values().sum()).unwrap_or(-1);
            let applied =
                match socialgraph_proto::projection::v1::projection_service_client::ProjectionServiceClient::connect(format!("http://{projection}"))
                    .await
                {
                    Ok(mut c) => c
                        .get_projection_status(socialgraph_proto::projection::v1::GetProjectionStatusRequest {})
                        .await
                        .map(|r| r.into_inner().partitions.iter().filter(|p| p.topic == topic).map(|p| p.next_offset).sum::<i64>())
                        .unwrap_or(-1),
                    Err(_) => -1,
                };
            let metrics = reqwest_metrics(counter_admin).await;
            let counter_lag: f64 = metrics
                .lines()
                .filter(|l| l.starts_with("sg_counter_lag_records") && l.contains(&counts_topic))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum();
            let rebuilds = socialgraph_integration_tests::metric(&metrics, "sg_counter_rebuilds_total");
            eprintln!(
                "[{:>5.0} s] outbox {outbox:>7}  topic {topic_records:>7}  projected {applied:>7}  counter lag {counter_lag:>7}  counter rebuilds {rebuilds:>6}",
                start.elapsed().as_secs_f64()
            );
            tokio::select! { _ = tokio::time::sleep(every) => {}, _ = cancel.cancelled() => {} }
        }
    });
    (task, stop)
}

async fn reqwest_metrics(addr: std::net::SocketAddr) -> String {
    match reqwest::get(format!("http://{addr}/metrics")).await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// Waits until relation-svc's outbox is empty, looking twice a second: counting a large
/// outbox is not free, and the harness's 20 ms polling would slow the relay it waits for.
async fn outbox_empty(m: &Mesh, deadline: Duration) -> anyhow::Result<()> {
    let start = Instant::now();
    while socialgraph_storage::outbox::backlog(&m.db.conn).await?.0 > 0 {
        anyhow::ensure!(start.elapsed() < deadline, "the outbox is not empty after {deadline:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}

fn endpoints(m: &Mesh) -> Endpoints {
    Endpoints {
        relation: format!("http://{}", m.relation.addr),
        projection: format!("http://{}", m.projection.addr),
        counter: format!("http://{}", m.counter.addr),
        message: Endpoints::default().message,
        admin_token: Some(ADMIN_TOKEN.into()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slashdot_loaded_through_the_cli_matches_the_file_in_every_counter_and_sampled_list() -> anyhow::Result<()> {
    let read = Instant::now();
    let graph = read_follow_file(&slashdot(), EdgeFileOptions { format: EdgeFormat::Auto, id_offset: 1 })?;
    let s = graph.stats;
    assert_eq!((s.edge_lines, s.self_loops, s.duplicates, s.skipped_lines), (EDGE_LINES, SELF_LOOPS, 0, 4));
    assert_eq!(graph.users.len() as u64, USERS);
    assert_eq!((graph.users[0], graph.users[graph.users.len() - 1]), (1, USERS as i64), "ids 0.. shifted by one");
    eprintln!("read {} edge lines in {:.1} s", s.edge_lines, read.elapsed().as_secs_f64());

    let mesh = Mesh::start(&socialgraph_testkit::redis_url()).await?;
    let endpoints = endpoints(&mesh);
    let (monitor, stop_monitor) = spawn_monitor(&mesh, Duration::from_secs(10));
    // Users read their counters while the graph loads: each first read makes counter-svc
    // rebuild the counter from the projection, racing the events still in flight, and from
    // then on the consumer keeps it. The verification below checks the outcome.
    let warm = {
        let (endpoints, users) = (endpoints.clone(), graph.users.clone());
        tokio::spawn(async move {
            let start = Instant::now();
            let opts = VerifyOptions { wait: CATCH_UP, ..VerifyOptions::default() };
            read_user_counters(&endpoints, &users, &opts).await.map(|c| (c.len(), start.elapsed()))
        })
    };
    let summary = load_follows(&endpoints, &graph, LoadOptions::default(), &progress_bar(false, "edges")).await?;
    eprintln!(
        "load: {} edges in {:.1} s = {:.0} edges/s ({} streams)",
        summary.edges_loaded,
        summary.elapsed_secs,
        summary.edges_per_sec,
        LoadOptions::default().streams
    );
    assert_eq!(summary.edges_sent, EDGE_LINES - SELF_LOOPS);
    assert_eq!((summary.edges_loaded, summary.already_followed), (EDGE_LINES - SELF_LOOPS, 0));
    assert_eq!(summary.self_loops_skipped, SELF_LOOPS);

    // Time to lag 0, measured on the facts: the outbox is empty and projection-svc (and
    // counter-svc) applied every record up to the broker's high watermarks.
    let lag0 = Instant::now();
    outbox_empty(&mesh, CATCH_UP).await?;
    mesh.settle(CATCH_UP).await?;
    eprintln!("outbox empty and projection lag 0 {:.1} s after the load", lag0.elapsed().as_secs_f64());
    let caught_up = wait_caught_up(&endpoints, CATCH_UP).await?;
    assert_eq!(caught_up.applied_records as u64, EDGE_LINES - SELF_LOOPS, "one event per edge, all applied");
    let (read, took) = warm.await??;
    eprintln!("first read of {read} users' counters (rebuilt while the load ran) took {:.1} s", took.as_secs_f64());

    let opts = VerifyOptions { wait: Duration::from_secs(120), ..VerifyOptions::default() };
    let report = verify(&endpoints, &graph, &opts).await?;
    eprintln!(
        "verify: {} users' counters, {} follower lists ({} entries), {} familiar pairs ({} non-empty, {} entries) in {:.1} s",
        report.users_checked,
        report.follower_lists_checked,
        report.follower_entries_expected,
        report.familiar_pairs_checked,
        report.familiar_pairs_nonempty,
        report.familiar_entries_expected,
        report.elapsed_secs
    );
    stop_monitor.cancel();
    monitor.await?;
    assert_eq!(report.total_mismatches(), 0, "mismatches: {:#?}", report.mismatches);
    assert_eq!(report.users_checked, USERS);
    assert_eq!((report.follower_lists_checked, report.familiar_pairs_checked), (200, 200));
    assert!(report.familiar_pairs_nonempty >= 150, "most pairs have an answer: {}", report.familiar_pairs_nonempty);
    mesh.stop().await
}
