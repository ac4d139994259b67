//! Part 5, import: a real follow graph (soc-Slashdot0902 by default) loaded with ImportFollows
//! into the whole mesh, as `socialgraph load` does it: edges/s beside a COPY of the same rows
//! into both edge tables, then how long after the import every view is caught up (outbox empty,
//! every consumer at lag 0) and every user's counters are right. The CPU of the broker,
//! PostgreSQL and this process (the services and the loader) is read during the import, and the
//! import runs again into a second mesh with the broker stopped (SIGSTOP) until it ends: what the
//! import path reaches when the event flow does not share the machine's two cores.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use socialgraph_cli::commands::progress_bar;
use socialgraph_cli::load::{LoadOptions, load_follows};
use socialgraph_cli::verify::{VerifyOptions, verify};
use socialgraph_cli::{EdgeFileOptions, EdgeFormat, Endpoints, FollowGraph, read_follow_file};
use socialgraph_integration_tests::{ADMIN_TOKEN, Mesh, rpcs_served};
use socialgraph_testkit::{Backend, TestDb};

use crate::ImportArgs;
use crate::backends::{Broker, Cpu};
use crate::report::{header, print_table, progress, row, summarize};

/// Longest wait for lag 0 and for the counters.
const CATCH_UP: Duration = Duration::from_secs(1200);

pub(crate) async fn run(a: &ImportArgs) -> anyhow::Result<()> {
    header("import: a follow graph through ImportFollows into the whole mesh");
    let path = PathBuf::from(&a.file);
    anyhow::ensure!(path.exists(), "{} is missing: the data sets live in ../shared/data beside the repository", path.display());
    let graph = read_follow_file(&path, EdgeFileOptions { format: EdgeFormat::Auto, id_offset: 1 })?;
    let edges = graph.stats.edge_lines - graph.stats.self_loops - graph.stats.duplicates;

    progress(&format!("raw: COPY of {edges} edges into following and follower of a fresh database"));
    let copy_rate = copy_baseline(&graph).await?;

    progress(&format!("ImportFollows of {edges} edges ({} users) into the mesh", graph.users.len()));
    let mesh = Mesh::start(&socialgraph_testkit::redis_url()).await?;
    let endpoints = endpoints(&mesh);
    let cpu = Cpu::with_postgres();
    let peer_rpcs = rpcs_served(&mesh.projection, None).await?;
    let summary = load_follows(&endpoints, &graph, LoadOptions::default(), &progress_bar(false, "edges")).await?;
    let end = Instant::now();
    let cpu = Cpu::with_postgres().since(&cpu);
    progress("waiting for the outbox to empty and every consumer to reach lag 0");
    let catch_up = Cpu::with_postgres();
    mesh.settle(CATCH_UP).await?;
    let lag0 = end.elapsed().as_secs_f64();
    let catch_up = Cpu::with_postgres().since(&catch_up);
    // From the import's start to lag 0 nobody but counter-svc's consumers could call
    // projection-svc (nothing reads): what they asked of it per 1,000 relation events.
    let peer_rpcs = (rpcs_served(&mesh.projection, None).await? - peer_rpcs) * 1000.0 / summary.edges_loaded.max(1) as f64;
    progress("reading every user's counters until all agree with the file");
    let opts = VerifyOptions { sample_users: 0, sample_pairs: 0, wait: CATCH_UP, ..VerifyOptions::default() };
    let report = verify(&endpoints, &graph, &opts).await?;
    let correct = end.elapsed().as_secs_f64();
    mesh.stop().await?;

    progress("ImportFollows again into a second mesh with the broker stopped until the import ends");
    let mesh = Mesh::start(&socialgraph_testkit::redis_url()).await?;
    let (held, cpu_held) = {
        let _stopped = Broker::stop()?;
        let cpu = Cpu::with_postgres();
        let held = load_follows(&self::endpoints(&mesh), &graph, LoadOptions::default(), &progress_bar(false, "edges")).await?;
        (held, Cpu::with_postgres().since(&cpu))
    };
    anyhow::ensure!(
        held.edges_loaded == summary.edges_loaded,
        "the second import loaded {} edges, the first {}",
        held.edges_loaded,
        summary.edges_loaded
    );
    // Not waited for: the backlog goes with the mesh's database.
    mesh.stop().await?;

    print_table(
        &format!("ImportFollows: {} ({} edges, {} users)", path.file_name().unwrap_or_default().to_string_lossy(), edges, graph.users.len()),
        "socialgraph",
        "raw COPY",
        &[
            row("edges/s", summary.edges_per_sec, copy_rate, "/s"),
            row("edges/s, broker stopped for the import", held.edges_per_sec, copy_rate, "/s"),
            row("import end -> outbox empty, every lag 0", lag0, 0.0, "s"),
            row("import end -> every counter right", correct, 0.0, "s"),
            row("counter-svc RPCs to projection-svc per 1,000 events, import start -> lag 0", peer_rpcs, 0.0, ""),
        ],
        &[
            format!(
                "socialgraph = `socialgraph load` ({} streams of ImportFollows, messages of {} edges) into relation-svc on \
                 PostgreSQL, with projection-svc and counter-svc consuming at the same time",
                LoadOptions::default().streams,
                LoadOptions::default().message_edges
            ),
            "raw = COPY .. FROM STDIN (text format) of the same edges into `following` and then `follower` of a fresh database, \
             one connection, no outbox, no events"
                .into(),
            format!("cores used during the import: {}", cpu.describe()),
            format!("cores used during the import with the broker stopped: {}", cpu_held.describe()),
            format!("cores used from the import's end to lag 0: {}", catch_up.describe()),
            format!(
                "counters: {} users read, {} mismatches (a verify of counters only, started at lag 0)",
                report.users_checked,
                report.total_mismatches()
            ),
        ],
    );
    summarize("ImportFollows (vs COPY into both tables)", summary.edges_per_sec, copy_rate, "edges/s", ">= 50,000 edges/s");
    summarize("ImportFollows, broker stopped for the import", held.edges_per_sec, copy_rate, "edges/s", "the import path alone");
    summarize("end of import -> lag 0", lag0, 0.0, "s", "<= 60 s");
    summarize("end of import -> all counters correct", correct, 0.0, "s", "<= 60 s");
    anyhow::ensure!(report.total_mismatches() == 0, "counters disagree with the file: {:#?}", report.mismatches);
    Ok(())
}

/// The CLI's view of `mesh`, with the admin token.
pub(crate) fn endpoints(mesh: &Mesh) -> Endpoints {
    Endpoints {
        relation: format!("http://{}", mesh.relation.addr),
        projection: format!("http://{}", mesh.projection.addr),
        counter: format!("http://{}", mesh.counter.addr),
        message: Endpoints::default().message,
        admin_token: Some(ADMIN_TOKEN.into()),
    }
}

/// COPY of the graph's edges into `following` and `follower` of a fresh test database;
/// returns edges/s over both COPYs.
async fn copy_baseline(graph: &FollowGraph) -> anyhow::Result<f64> {
    let db = TestDb::create(Backend::Postgres).await?;
    let mut text = String::with_capacity(graph.edges.len() * 40);
    for e in &graph.edges {
        text.push_str(&format!("{}\t{}\t1\t1\t{}\t{}\n", e.follower_id, e.followee_id, e.followed_at_ms, e.followed_at_ms));
    }
    let pool = db.conn.get_postgres_connection_pool();
    let mut conn = pool.acquire().await?;
    let t = Instant::now();
    for table in ["following", "follower"] {
        let mut copy =
            conn.copy_in_raw(&format!("COPY {table} (follower_id, followee_id, state, version, followed_at_ms, updated_at_ms) FROM STDIN")).await?;
        copy.send(text.as_bytes()).await?;
        copy.finish().await?;
    }
    let rate = graph.edges.len() as f64 / t.elapsed().as_secs_f64();
    drop(conn);
    db.drop_db().await?;
    Ok(rate)
}
