//! Part 8, cache, follower side: follower pages and BatchCheckFollowers(100) from projection-svc
//! with the follower windows warm and cold (the account's window deleted before each call),
//! beside the same reads raw on the cache Redis (ZREVRANGE / ZMSCORE on the same `sg:fan` sets)
//! and on PostgreSQL (the `follower` table); the cold rows again on a projection-svc with no
//! `cache.fill_rows_per_sec` budget. Half the reads are of the 200 most followed accounts, half
//! of random followed accounts.

use std::path::Path;

use rand::{Rng, SeedableRng, rngs::StdRng};
use socialgraph_cache::keys::Keys;
use socialgraph_cli::FollowGraph;
use socialgraph_integration_tests::{Mesh, cache_settings, metric, raw_redis_conn};
use socialgraph_proto::projection::v1::projection_service_client::ProjectionServiceClient;
use socialgraph_proto::projection::v1::{BatchCheckFollowersRequest, ListFollowersRequest};
use tonic::transport::Channel;

use crate::cache::{none, sample, timed};
use crate::report::{Hist, latency_rows, ms, print_table, progress, summarize};

/// The follower side's latencies and cache counts.
pub(crate) struct Followers {
    /// The accounts whose follower pages were read.
    pub(crate) users: Vec<i64>,
    pub(crate) page_warm: Hist,
    page_cold: Hist,
    check_warm: Hist,
    check_cold: Hist,
    /// The cold rows on a projection-svc with no `cache.fill_rows_per_sec` budget.
    page_cold_unpaced: Hist,
    check_cold_unpaced: Hist,
    raw_page_redis: Hist,
    raw_check_redis: Hist,
    raw_page_pg: Hist,
    raw_check_pg: Hist,
    hit_ratio: f64,
    cache_reads: f64,
    db_per_1000: f64,
}

/// Runs the follower reads against `mesh` (the graph loaded and settled), `reads` of each.
pub(crate) async fn run(mesh: &Mesh, graph: &FollowGraph, reads: usize) -> anyhow::Result<Followers> {
    let mut counts: std::collections::HashMap<i64, usize> = std::collections::HashMap::new();
    for e in &graph.edges {
        *counts.entry(e.followee_id).or_default() += 1;
    }
    let mut by_followers: Vec<(i64, usize)> = counts.into_iter().collect();
    by_followers.sort_by(|x, y| y.1.cmp(&x.1).then(x.0.cmp(&y.0)));
    let users = sample(&by_followers, reads, 3);
    let candidates: Vec<Vec<i64>> = {
        let mut rng = StdRng::seed_from_u64(4);
        users.iter().map(|_| (0..100).map(|_| by_followers[rng.random_range(0..by_followers.len())].0).collect()).collect()
    };
    let cache = cache_settings(&mesh.topics.relation);
    let keys = Keys::new(cache.key_prefix.clone());
    let cache_conn = raw_redis_conn(&cache.url).await?;
    let client = ProjectionServiceClient::new(mesh.projection.channel().await?);
    let page = |c: &ProjectionServiceClient<Channel>, user: i64| {
        let mut c = c.clone();
        async move {
            c.list_followers(ListFollowersRequest { user_id: user, page_size: 50, ..Default::default() }).await?;
            anyhow::Ok(())
        }
    };
    let check = |c: &ProjectionServiceClient<Channel>, user: i64, candidate_ids: Vec<i64>| {
        let mut c = c.clone();
        async move {
            c.batch_check_followers(BatchCheckFollowersRequest { user_id: user, candidate_ids, ..Default::default() }).await?;
            anyhow::Ok(())
        }
    };

    progress(&format!("{reads} follower pages and BatchCheckFollowers(100): warm-up, warm, cold"));
    for (u, c) in users.iter().zip(&candidates) {
        page(&client, *u).await?;
        check(&client, *u, c.clone()).await?;
    }
    crate::cache::fills_settled(&mesh.projection).await?;
    let before = mesh.projection.metrics().await?;
    let page_warm = timed(reads, none, |i| page(&client, users[i])).await?;
    let check_warm = timed(reads, none, |i| check(&client, users[i], candidates[i].clone())).await?;
    let after = mesh.projection.metrics().await?;
    let evict = |i: usize| {
        let (mut conn, k) = (cache_conn.clone(), keys.list(false, users[i]));
        async move {
            let _: i64 = redis::AsyncCommands::del(&mut conn, &k).await?;
            anyhow::Ok(())
        }
    };
    let page_cold = timed(reads, &evict, |i| page(&client, users[i])).await?;
    let check_cold = timed(reads, &evict, |i| check(&client, users[i], candidates[i].clone())).await?;
    crate::cache::fills_settled(&mesh.projection).await?;
    // The cold rows again on a projection-svc whose fills have no row budget (it consumes no
    // partition: it only reads).
    let mut config = mesh.projection_config();
    config.consumer.partitions = socialgraph_events::consumer::Assignment::List(Vec::new());
    config.cache.fill_rows_per_sec = 0;
    let second = socialgraph_integration_tests::spawn_projection(config).await?;
    let c2 = ProjectionServiceClient::new(second.channel().await?);
    let page_cold_unpaced = timed(reads, &evict, |i| page(&c2, users[i])).await?;
    let check_cold_unpaced = timed(reads, &evict, |i| check(&c2, users[i], candidates[i].clone())).await?;
    crate::cache::fills_settled(&second).await?;
    second.stop().await?;
    for u in &users {
        page(&client, *u).await?;
    }
    crate::cache::fills_settled(&mesh.projection).await?;

    progress("the same follower reads raw: ZREVRANGE / ZMSCORE on the cached sets, and PostgreSQL");
    let pool = mesh.db.conn.get_postgres_connection_pool().clone();
    let (raw_page_redis, raw_check_redis, raw_page_pg, raw_check_pg) =
        crate::raw::baselines(&cache_conn, &pool, &keys, false, &users, &candidates).await?;

    let count = |text: &str, result: &str| {
        ["ListFollowers", "BatchCheckFollowers"]
            .iter()
            .map(|rpc| metric(text, &format!("sg_cache_requests_total{{cache=\"followers\",result=\"{result}\",rpc=\"{rpc}\"}}")))
            .sum::<f64>()
    };
    let delta = |result: &str| count(&after, result) - count(&before, result);
    let hits = delta("hit");
    let others = delta("miss") + delta("partial") + delta("past_window") + delta("fallback");
    Ok(Followers {
        users,
        page_warm,
        page_cold,
        check_warm,
        check_cold,
        page_cold_unpaced,
        check_cold_unpaced,
        raw_page_redis,
        raw_check_redis,
        raw_page_pg,
        raw_check_pg,
        hit_ratio: hits / (hits + others).max(1.0),
        cache_reads: hits + others,
        db_per_1000: others / (2 * reads) as f64 * 1000.0,
    })
}

impl Followers {
    /// Prints the follower table and its summary lines.
    pub(crate) fn report(&self, path: &Path, edges: usize, reads: usize) {
        let table = latency_rows(&[
            ("follower page (50), warm", &self.page_warm, &self.raw_page_redis),
            ("follower page (50), cold (every call misses)", &self.page_cold, &self.raw_page_pg),
            ("BatchCheckFollowers(100), warm", &self.check_warm, &self.raw_check_redis),
            ("BatchCheckFollowers(100), cold", &self.check_cold, &self.raw_check_pg),
            ("follower page (50), cold, no fill budget", &self.page_cold_unpaced, &self.raw_page_pg),
            ("BatchCheckFollowers(100), cold, no fill budget", &self.check_cold_unpaced, &self.raw_check_pg),
        ]);
        print_table(
            &format!(
                "follower windows: {} ({edges} edges), {reads} reads per row, one client",
                path.file_name().unwrap_or_default().to_string_lossy()
            ),
            "socialgraph (gRPC)",
            "raw",
            &table,
            &[
                "raw = warm rows: ZREVRANGE 0 50 WITHSCORES / ZMSCORE of the 100 ids on the same sg:fan sorted set; cold rows: the same \
                 query on PostgreSQL's follower table"
                    .into(),
                "half the reads are of the 200 most followed accounts, half of random followed accounts; checks ask 100 random followed accounts"
                    .into(),
                format!(
                    "after warm-up: hit ratio {:.1} % of {} cache reads; {:.1} database queries per 1,000 warm reads",
                    self.hit_ratio * 100.0,
                    self.cache_reads,
                    self.db_per_1000
                ),
            ],
        );
        let (w, r) = (ms(&self.page_warm, 0.99), ms(&self.raw_page_redis, 0.99));
        summarize("follower page, warm cache: p99 (vs raw ZREVRANGE)", w, r, "ms", "<= 3x raw Redis");
        let (w, r) = (ms(&self.check_warm, 0.99), ms(&self.raw_check_redis, 0.99));
        summarize("BatchCheckFollowers(100), warm: p99 (vs raw ZMSCORE)", w, r, "ms", "<= 3x raw Redis");
        let (c, r) = (ms(&self.page_cold, 0.99), ms(&self.raw_page_pg, 0.99));
        summarize("follower page, cold cache: p99 (vs raw PostgreSQL)", c, r, "ms", "<= 2x raw PostgreSQL");
        summarize("cache hit ratio after warm-up (followers)", self.hit_ratio * 100.0, 0.0, "%", ">= 95 %");
    }
}
