//! A cold burst: many readers ask for the first follower page of one large account at once,
//! with its window not cached. Identical misses in flight share one database page read: the
//! database sees one page read (and one cache fill), not one per reader, and every reader gets
//! the page the table holds.
//!
//! The burst is made exact on every run: the test holds a lock on `follower` while the readers
//! arrive, so none of them can finish a database read before all have missed the cache; it lets
//! go once every miss is counted.

use std::time::Duration;

use sea_orm::{ConnectionTrait, DbBackend, Statement, TransactionTrait};
use socialgraph_integration_tests::cache::{flush_prefix, table_lists};
use socialgraph_integration_tests::*;
use socialgraph_proto::projection::v1 as pp;
use socialgraph_proto::relation::v1::{ImportEdge, ImportFollowsRequest};
use socialgraph_testkit::{Backend, kafka, redis_url};

const FOLLOWERS: i64 = 3_000;
const PAGE: i32 = 50;
const DEADLINE: Duration = Duration::from_secs(120);
const T0: i64 = 1_700_000_000_000;

/// Sessions of this test's database waiting on a lock in a statement that reads `follower`.
async fn waiting_on_follower(m: &Mesh) -> anyhow::Result<i64> {
    let (backend, name) = (m.db.conn.get_database_backend(), m.db.url.rsplit('/').next().unwrap_or_default().to_owned());
    let sql = match backend {
        DbBackend::Postgres => "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = 'Lock' AND query LIKE '%follower%'",
        _ => {
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = ? AND STATE LIKE 'Waiting for table metadata lock%' AND INFO LIKE '%follower%'"
        }
    };
    let row = m.db.conn.query_one_raw(Statement::from_sql_and_values(backend, sql, [name.into()])).await?;
    Ok(row.map(|r| r.try_get_by_index::<i64>(0)).transpose()?.unwrap_or(0))
}

/// `readers` concurrent ListFollowers of user 1's first page on `channels` connections while
/// `follower` is locked; returns (pages answered, sessions that waited on the lock).
async fn burst(m: &Mesh, readers: usize, channels: usize) -> anyhow::Result<(Vec<Vec<i64>>, i64)> {
    let lock = m.db.conn.begin().await?;
    let (take, give) = match m.db.conn.get_database_backend() {
        DbBackend::Postgres => ("LOCK TABLE follower IN ACCESS EXCLUSIVE MODE", None),
        _ => ("LOCK TABLES follower WRITE", Some("UNLOCK TABLES")),
    };
    lock.execute_unprepared(take).await?;
    let misses = || async { Ok::<_, anyhow::Error>(metric_sum(&m.projection.metrics().await?, "sg_cache_requests_total", "result=\"miss\"")) };
    let before = misses().await?;
    let mut clients = Vec::new();
    for _ in 0..channels {
        clients.push(m.projection.projection().await?);
    }
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..readers {
        let mut c = clients[i % channels].clone();
        tasks.spawn(async move {
            let req = pp::ListFollowersRequest { user_id: 1, page_size: PAGE, ..Default::default() };
            let page = c.list_followers(req).await?.into_inner();
            Ok::<_, anyhow::Error>(page.followers.iter().map(|f| f.user_id).collect::<Vec<_>>())
        });
    }
    socialgraph_testkit::eventually(DEADLINE, "every reader to miss the cache", || async {
        Ok((misses().await? - before >= readers as f64).then_some(()))
    })
    .await?;
    // Each counted miss goes on to the database read at once; give the last ones that moment.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let waiting = waiting_on_follower(m).await?;
    if let Some(give) = give {
        lock.execute_unprepared(give).await?;
    }
    lock.rollback().await?;
    let mut pages = Vec::new();
    while let Some(page) = tasks.join_next().await {
        pages.push(page??);
    }
    Ok((pages, waiting))
}

async fn one_read_answers_a_cold_burst(backend: Backend) -> anyhow::Result<()> {
    let m = Mesh::start_on(backend, &redis_url(), &kafka::brokers()).await?;
    let edges = (2..=FOLLOWERS + 1)
        .map(|f| ImportEdge { follower_id: f, followee_id: 1, followed_at: Some(socialgraph_domain::timestamp_from_ms(T0 + f)) })
        .collect();
    m.relation.client().await?.import_follows(admin(futures::stream::iter([ImportFollowsRequest { edges }]))).await?;
    m.settle(DEADLINE).await?;
    let want: Vec<i64> = table_lists(&m.db, false, &[1]).await?.remove(&1).unwrap_or_default().iter().take(PAGE as usize).map(|e| e.0).collect();

    for (readers, channels) in [(50, 1), (500, 4)] {
        let reads = |t: &str, result: &str| metric_sum(t, "sg_cache_database_reads_total", &format!("result=\"{result}\""));
        let before = m.projection.metrics().await?;
        let (pages, waiting) = burst(&m, readers, channels).await?;
        let after = m.projection.metrics().await?;
        let (read, shared) = (reads(&after, "read") - reads(&before, "read"), reads(&after, "shared") - reads(&before, "shared"));
        println!("{backend:?}: {readers} cold readers: {read} database page reads, {shared} shared; {waiting} sessions waited on follower");
        assert!(pages.iter().all(|p| *p == want), "every reader gets the table's newest {PAGE}");
        assert_eq!((read, shared), (1.0, readers as f64 - 1.0), "one read answers the burst");
        // The page read and the window's fill: never one session per reader.
        assert!(waiting <= 2, "{waiting} sessions read follower for {readers} readers");
        // The burst filled the window; drop it so the next burst is cold again.
        let cache = cache_settings(&m.topics.relation);
        flush_prefix(&mut redis_conn(&cache.url).await?, &cache.key_prefix).await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cold_burst_of_follower_reads_costs_one_database_page_read_on_postgres() -> anyhow::Result<()> {
    one_read_answers_a_cold_burst(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cold_burst_of_follower_reads_costs_one_database_page_read_on_mariadb() -> anyhow::Result<()> {
    one_read_answers_a_cold_burst(Backend::MariaDb).await
}
