//! Acceptance on the embedded mode: SNAP's Wiki-Vote (103,689 edges, 7,115 users) loaded
//! through the CLI library into `socialgraph dev` on a fresh SQLite file, then checked by the
//! CLI's `verify`: every user's counters, the follower lists of 200 random users and the
//! familiar followers of 200 random pairs — the same check the distributed mesh passes on
//! soc-Slashdot0902. A second load of the same file changes nothing.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use sea_orm::ConnectionTrait;
use socialgraph_cli::commands::progress_bar;
use socialgraph_cli::load::{LoadOptions, load_follows};
use socialgraph_cli::verify::{VerifyOptions, verify, wait_caught_up};
use socialgraph_cli::{EdgeFileOptions, EdgeFormat, read_follow_file};
use socialgraph_integration_tests::spawn_dev;

const EDGES: u64 = 103_689;
const USERS: u64 = 7_115;

fn wiki_vote() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/Wiki-Vote.txt");
    assert!(path.exists(), "{} is missing: the data sets live in ../shared/data beside the repository", path.display());
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wiki_vote_loaded_into_socialgraph_dev_matches_the_file() -> anyhow::Result<()> {
    let graph = read_follow_file(&wiki_vote(), EdgeFileOptions { format: EdgeFormat::Auto, id_offset: 0 })?;
    assert_eq!((graph.stats.edge_lines, graph.stats.self_loops, graph.users.len() as u64), (EDGES, 0, USERS));

    let dir = std::env::temp_dir().join(socialgraph_testkit::unique("sg-wiki"));
    std::fs::create_dir_all(&dir)?;
    let dev = spawn_dev(&dir.join("dev.sqlite")).await?;
    let endpoints = dev.endpoints();

    let summary = load_follows(&endpoints, &graph, LoadOptions::default(), &progress_bar(false, "edges")).await?;
    eprintln!("load into socialgraph dev: {} edges in {:.1} s = {:.0} edges/s", summary.edges_loaded, summary.elapsed_secs, summary.edges_per_sec);
    assert_eq!((summary.edges_sent, summary.edges_loaded, summary.already_followed), (EDGES, EDGES, 0));
    let start = Instant::now();
    let caught_up = wait_caught_up(&endpoints, Duration::from_secs(300)).await?;
    eprintln!("projection lag 0 after {:.1} s more ({:.1} s)", caught_up.waited_secs, start.elapsed().as_secs_f64());
    // The log's offsets are outbox ids: one relation event per edge, the projection past the
    // last of them (its own follow-count events take the ids in between).
    let log = socialgraph_storage::connect(&format!("sqlite://{}", dir.join("dev.sqlite").display()), 1).await?;
    let sql = "SELECT COUNT(*), MAX(id) FROM outbox WHERE topic = 'sg.relation.v1'";
    let row = log.query_one_raw(sea_orm::Statement::from_string(sea_orm::DbBackend::Sqlite, sql)).await?.expect("one row");
    let (events, last): (i64, i64) = (row.try_get_by_index(0)?, row.try_get_by_index(1)?);
    log.close().await?;
    assert_eq!((events as u64, caught_up.applied_records), (EDGES, last + 1), "one event per edge, all applied");

    let opts = VerifyOptions { wait: Duration::from_secs(120), ..VerifyOptions::default() };
    let report = verify(&endpoints, &graph, &opts).await?;
    eprintln!(
        "verify: {} users, {} follower lists ({} entries), {} familiar pairs ({} non-empty) in {:.1} s",
        report.users_checked,
        report.follower_lists_checked,
        report.follower_entries_expected,
        report.familiar_pairs_checked,
        report.familiar_pairs_nonempty,
        report.elapsed_secs
    );
    assert_eq!(report.total_mismatches(), 0, "mismatches: {:#?}", report.mismatches);
    assert_eq!((report.users_checked, report.follower_lists_checked, report.familiar_pairs_checked), (USERS, 200, 200));
    assert!(report.familiar_pairs_nonempty >= 150, "most pairs have an answer: {}", report.familiar_pairs_nonempty);

    // Loading the same file again finds every edge followed already and changes nothing.
    let again = load_follows(&endpoints, &graph, LoadOptions::default(), &progress_bar(false, "edges")).await?;
    assert_eq!((again.edges_loaded, again.already_followed), (0, EDGES));
    let report = verify(&endpoints, &graph, &opts).await?;
    assert_eq!(report.total_mismatches(), 0, "after a second load: {:#?}", report.mismatches);

    dev.stop().await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
