//! Part 8, cache: the following-list cache on a real follow graph (soc-Slashdot0902, ids + 1,
//! loaded with ImportFollows into the whole mesh). One gRPC client, one call at a time, as a
//! BFF rendering a page: a following page and BatchGetRelationships(100) with the cache warm,
//! cold (the user's cached list deleted before each call: every call misses, is answered by
//! the database and starts a fill in the background) and off (a
//! relation-svc without a cache on the same database), each beside the same read done raw on
//! the cache Redis (ZREVRANGE, ZMSCORE on the same sorted sets) and on PostgreSQL; the cold
//! rows again on instances with other fill settings (`cache.fill_after_misses` 2, one fill
//! slot, no `cache.fill_rows_per_sec` budget, a budget of 5,000, and the defaults once more,
//! measured last); and warm BatchGetRelationships(100) from 32 callers for `--secs`, beside
//! ZMSCORE and a bare tonic server doing it ([`crate::cache_throughput`]).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng, rngs::StdRng};
use socialgraph_cache::keys::Keys;
use socialgraph_cache::lists::FILL_SLOTS;
use socialgraph_cli::commands::progress_bar;
use socialgraph_cli::load::{LoadOptions, load_follows};
use socialgraph_cli::{EdgeFileOptions, EdgeFormat, read_follow_file};
use socialgraph_integration_tests::{Mesh, Svc, cache_settings, metric, metric_sum, raw_redis_conn, spawn_relation};
use socialgraph_proto::relation::v1::relation_service_client::RelationServiceClient;
use socialgraph_proto::relation::v1::{BatchGetRelationshipsRequest, ListFollowingRequest};
use socialgraph_server::DEFAULT_FILL_ROWS_PER_SEC;
use tonic::transport::Channel;

use crate::CacheArgs;
use crate::report::{Hist, header, hist, latency_rows, ms, print_table, progress, summarize};

/// Latencies of `n` sequential calls of `op(i)`, with `before(i)` run untimed before each.
pub(crate) async fn timed<B, BF, F, Fut>(n: usize, mut before: B, mut op: F) -> anyhow::Result<Hist>
where
    B: FnMut(usize) -> BF,
    BF: std::future::Future<Output = anyhow::Result<()>>,
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let mut h = hist();
    for i in 0..n {
        before(i).await?;
        let t = Instant::now();
        op(i).await?;
        h.record(t.elapsed().as_micros().max(1) as u64)?;
    }
    Ok(h)
}

pub(crate) async fn none(_: usize) -> anyhow::Result<()> {
    Ok(())
}

/// Latencies of `n` sequential gRPC health checks of `svc`: the floor of any of its calls.
async fn health_checks(svc: &Svc, n: usize) -> anyhow::Result<Hist> {
    let health = tonic_health::pb::health_client::HealthClient::new(svc.channel().await?);
    timed(n, none, |_| {
        let mut h = health.clone();
        async move {
            h.check(tonic_health::pb::HealthCheckRequest::default()).await?;
            anyhow::Ok(())
        }
    })
    .await
}

/// Waits until `svc`'s background fills have ended: no fill running or queued
/// (`sg_cache_fills_pending`, following lists and follower windows) and its
/// `sg_cache_fills_total` (every cache and result, restriction summaries too) unchanged over
/// one second, at most 120 s. A fixed pause was too short after the follower warm-up (200
/// windows of 10,000 entries), so the warm rows measured reads queued behind fills; an
/// unchanged counter alone missed paced fills of long lists still under way.
pub(crate) async fn fills_settled(svc: &Svc) -> anyhow::Result<()> {
    let state = |text: String| (metric_sum(&text, "sg_cache_fills_total", ""), metric_sum(&text, "sg_cache_fills_pending", ""));
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last = state(svc.metrics().await?);
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = state(svc.metrics().await?);
        if now == last && now.1 == 0.0 {
            return Ok(());
        }
        last = now;
    }
    anyhow::bail!("fills still running after 120 s")
}

/// The users read: alternately one of the 200 first of `users_by_followings` (by count, most
/// first) and a random one of them.
pub(crate) fn sample(users_by_followings: &[(i64, usize)], n: usize, seed: u64) -> Vec<i64> {
    let mut rng = StdRng::seed_from_u64(seed);
    let top: Vec<i64> = users_by_followings.iter().take(200).map(|(u, _)| *u).collect();
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        out.push(if i % 2 == 0 { top[i / 2 % top.len()] } else { users_by_followings[rng.random_range(0..users_by_followings.len())].0 });
    }
    out
}

pub(crate) async fn run(a: &CacheArgs) -> anyhow::Result<()> {
    header("cache: following lists from the cache Redis, warm, cold and off");
    let path = PathBuf::from(&a.file);
    anyhow::ensure!(path.exists(), "{} is missing: the data sets live in ../shared/data beside the repository", path.display());
    let graph = read_follow_file(&path, EdgeFileOptions { format: EdgeFormat::Auto, id_offset: 1 })?;
    let mut followings: std::collections::HashMap<i64, usize> = std::collections::HashMap::new();
    for e in &graph.edges {
        *followings.entry(e.follower_id).or_default() += 1;
    }
    let mut by_followings: Vec<(i64, usize)> = followings.into_iter().collect();
    by_followings.sort_by(|x, y| y.1.cmp(&x.1).then(x.0.cmp(&y.0)));

    progress(&format!("ImportFollows of {} edges into the mesh", graph.edges.len()));
    let mesh = Mesh::start(&socialgraph_testkit::redis_url()).await?;
    let endpoints = crate::import::endpoints(&mesh);
    load_follows(&endpoints, &graph, LoadOptions::default(), &progress_bar(false, "edges")).await?;
    mesh.settle(Duration::from_secs(1200)).await?;
    // After a bulk load PostgreSQL's autovacuum would run during the measurements, on the same
    // two cores, and the service rows (measured first) would pay for it while the raw rows
    // (measured last) would not: vacuum and analyze now, before anything is timed.
    progress("VACUUM ANALYZE after the load");
    sea_orm::sqlx::query("VACUUM ANALYZE").execute(mesh.db.conn.get_postgres_connection_pool()).await?;
    let mut uncached_config = mesh.relation_config();
    uncached_config.cache.url = String::new();
    uncached_config.kafka.relay_enabled = false;
    let uncached = spawn_relation(uncached_config).await?;

    let cache = cache_settings(&mesh.topics.relation);
    let keys = Keys::new(cache.key_prefix.clone());
    let cache_conn = raw_redis_conn(&cache.url).await?;
    let users = sample(&by_followings, a.reads, 1);
    let others: Vec<Vec<i64>> = {
        let mut rng = StdRng::seed_from_u64(2);
        let all: Vec<i64> = by_followings.iter().map(|(u, _)| *u).collect();
        users.iter().map(|_| (0..100).map(|_| all[rng.random_range(0..all.len())]).collect()).collect()
    };
    let client = RelationServiceClient::new(mesh.relation.channel().await?);
    let plain = RelationServiceClient::new(uncached.channel().await?);
    let page = |c: &RelationServiceClient<Channel>, user: i64| {
        let mut c = c.clone();
        async move {
            c.list_following(ListFollowingRequest { user_id: user, page_size: 50, page_token: String::new() }).await?;
            anyhow::Ok(())
        }
    };
    let batch = |c: &RelationServiceClient<Channel>, user: i64, others: Vec<i64>| {
        let mut c = c.clone();
        async move {
            c.batch_get_relationships(BatchGetRelationshipsRequest { user_id: user, other_user_ids: others }).await?;
            anyhow::Ok(())
        }
    };

    progress(&format!("{} following pages and BatchGetRelationships(100): warm-up, warm, cold, off", a.reads));
    for (i, u) in users.iter().enumerate() {
        page(&client, *u).await?;
        batch(&client, *u, others[i].clone()).await?;
    }
    // Misses fill in the background: let the warm-up's fills finish.
    fills_settled(&mesh.relation).await?;
    let before = mesh.relation.metrics().await?;
    // The floor of any call: a gRPC health check through the same channel, beside a Redis PING.
    let floor = health_checks(&mesh.relation, a.reads).await?;
    let raw_ping = timed(a.reads, none, |_| {
        let mut conn = cache_conn.clone();
        async move {
            let _: String = redis::cmd("PING").query_async(&mut conn).await?;
            anyhow::Ok(())
        }
    })
    .await?;
    let page_warm = timed(a.reads, none, |i| page(&client, users[i])).await?;
    let batch_warm = timed(a.reads, none, |i| batch(&client, users[i], others[i].clone())).await?;
    let after = mesh.relation.metrics().await?;
    let set_keys: Vec<String> = users.iter().map(|u| keys.following(*u)).collect();
    let reads = crate::cache_throughput::Reads { set_keys: &set_keys, users: &users, others: &others };
    let throughput = crate::cache_throughput::run(&mesh.relation, &cache_conn, &cache.url, reads, a.secs).await?;
    let evict = |i: usize| {
        let (mut conn, k) = (cache_conn.clone(), [keys.following(users[i]), keys.following_versions(users[i])]);
        async move {
            let _: i64 = redis::AsyncCommands::del(&mut conn, &k).await?;
            anyhow::Ok(())
        }
    };
    let page_cold = timed(a.reads, &evict, |i| page(&client, users[i])).await?;
    let batch_cold = timed(a.reads, &evict, |i| batch(&client, users[i], others[i].clone())).await?;
    // The cold passes above leave fills running: let them end, so that the variants' reads do
    // not run beside them.
    fills_settled(&mesh.relation).await?;
    // The cold rows again on relation-svc instances with other fill settings (same database
    // and cache Redis, each started with no miss counted): what `cache.fill_slots` and
    // `cache.fill_after_misses` trade.
    let (mut variants, mut relay_off) = (Vec::new(), None);
    let budget = DEFAULT_FILL_ROWS_PER_SEC;
    for (label, slots, after_misses, rows) in [
        ("fills from the 2nd miss", FILL_SLOTS, 2, budget),
        ("1 fill slot", 1, 1, budget),
        ("no fill budget", FILL_SLOTS, 1, 0),
        ("fill budget 5,000 rows/s", FILL_SLOTS, 1, 5_000),
        ("defaults", FILL_SLOTS, 1, budget),
    ] {
        let mut config = mesh.relation_config();
        config.kafka.relay_enabled = false;
        (config.cache.fill_slots, config.cache.fill_after_misses, config.cache.fill_rows_per_sec) = (slots, after_misses, rows);
        let svc = spawn_relation(config).await?;
        let c = RelationServiceClient::new(svc.channel().await?);
        let page_cold = timed(a.reads, &evict, |i| page(&c, users[i])).await?;
        let batch_cold = timed(a.reads, &evict, |i| batch(&c, users[i], others[i].clone())).await?;
        fills_settled(&svc).await?;
        if label == "defaults" {
            // The warm rows again on this instance, whose relay is off and which served no
            // import (the main instance did both).
            let health = health_checks(&svc, a.reads).await?;
            let page_warm = timed(a.reads, none, |i| page(&c, users[i])).await?;
            let batch_warm = timed(a.reads, none, |i| batch(&c, users[i], others[i].clone())).await?;
            relay_off = Some((health, page_warm, batch_warm));
        }
        svc.stop().await?;
        variants.push((format!("following page (50), cold, {label}"), page_cold, format!("BatchGetRelationships(100), cold, {label}"), batch_cold));
    }
    let page_off = timed(a.reads, none, |i| page(&plain, users[i])).await?;
    let batch_off = timed(a.reads, none, |i| batch(&plain, users[i], others[i].clone())).await?;
    for u in &users {
        page(&client, *u).await?;
    }
    let followers = crate::cache_followers::run(&mesh, &graph, a.reads).await?;
    let followed: Vec<i64> = {
        let mut set: Vec<i64> = graph.edges.iter().map(|e| e.followee_id).collect();
        set.sort_unstable();
        set.dedup();
        set
    };
    let familiar_partners = followed;
    let common_partners: Vec<i64> = by_followings.iter().map(|(u, _)| *u).collect();
    let joins = crate::cache_joins::run(&mesh, &client, &plain, &users, &common_partners, &familiar_partners).await?;

    progress("the same reads raw: ZREVRANGE / ZMSCORE on the cached sets, and PostgreSQL");
    let pool = mesh.db.conn.get_postgres_connection_pool().clone();
    let (raw_page_redis, raw_batch_redis, raw_page_pg, raw_batch_pg) =
        crate::raw::baselines(&cache_conn, &pool, &keys, true, &users, &others).await?;
    progress("the floor: a bare tonic server doing the same raw reads");
    let stores = crate::floor::Stores { cache: &cache, db_url: mesh.db.url.clone(), db_pool: mesh.relation_config().database.max_connections };
    let floor_rows = crate::floor::cache_rows(stores, &cache_conn, &pool, &users, &set_keys).await?;
    let falkor = if a.falkordb_url.is_empty() {
        None
    } else {
        let workload = crate::falkordb::Workload {
            users: &users,
            others: &others,
            followed: &followers.users,
            common: &joins.common_others,
            familiar: &joins.familiar_others,
        };
        // A FalkorDB failure costs its rows only, not the part's.
        crate::falkordb::run(&a.falkordb_url, &pool, &workload).await.inspect_err(|e| println!("\n  * FalkorDB failed: {e:#}")).ok()
    };

    // Every cache a warm read asks (the following list, the follower window for followed_by,
    // the restriction summary); every result but a hit read the database.
    let count = |text: &str, results: &[&str]| {
        let mut n = 0.0;
        for cache in ["following", "followers", "restrictions"] {
            for rpc in ["ListFollowing", "BatchGetRelationships"] {
                for result in results {
                    n += metric(text, &format!("sg_cache_requests_total{{cache=\"{cache}\",result=\"{result}\",rpc=\"{rpc}\"}}"));
                }
            }
        }
        n
    };
    let database = ["miss", "partial", "past_window", "uncached", "fallback"];
    let (hits, misses) = (count(&after, &["hit"]) - count(&before, &["hit"]), count(&after, &database) - count(&before, &database));
    let warm_reads = (2 * a.reads) as f64;
    let hit_ratio = hits / (hits + misses).max(1.0);
    let db_per_1000 = misses / warm_reads * 1000.0;
    uncached.stop().await?;
    mesh.stop().await?;

    let mut rows = vec![
        ("floor: gRPC health check (raw: Redis PING)", &floor, &raw_ping),
        ("following page (50), warm", &page_warm, &raw_page_redis),
        ("following page (50), cold (every call misses)", &page_cold, &raw_page_pg),
        ("following page (50), cache off", &page_off, &raw_page_pg),
        ("BatchGetRelationships(100), warm", &batch_warm, &raw_batch_redis),
        ("BatchGetRelationships(100), cold", &batch_cold, &raw_batch_pg),
        ("BatchGetRelationships(100), cache off", &batch_off, &raw_batch_pg),
    ];
    for (page_label, page_cold, batch_label, batch_cold) in &variants {
        rows.extend([(page_label.as_str(), page_cold, &raw_page_pg), (batch_label.as_str(), batch_cold, &raw_batch_pg)]);
    }
    if let Some((health, page_warm, batch_warm)) = &relay_off {
        rows.extend([
            ("floor: gRPC health check, relay off (raw: Redis PING)", health, &raw_ping),
            ("following page (50), warm, relay off", page_warm, &raw_page_redis),
            ("BatchGetRelationships(100), warm, relay off", batch_warm, &raw_batch_redis),
        ]);
    }
    let table = latency_rows(&rows);
    print_table(
        &format!(
            "following-list cache: {} ({} edges), {} reads per row, one client",
            path.file_name().unwrap_or_default().to_string_lossy(),
            graph.edges.len(),
            a.reads
        ),
        "socialgraph (gRPC)",
        "raw",
        &table,
        &[
            "raw = warm rows: ZREVRANGE 0 50 WITHSCORES / ZMSCORE of the 100 ids on the same cached sorted set (redis-rs, one connection); \
             cold and off rows: the same query on PostgreSQL (sqlx: ORDER BY followed_at_ms DESC, followee_id DESC LIMIT 51 / \
             followee_id = ANY($2))"
                .into(),
            "half the reads are of the 200 accounts that follow the most, half of random accounts; the relationship batches ask 100 random accounts"
                .into(),
            format!(
                "after warm-up: hit ratio {:.1} % of {} cache reads (following lists, follower windows and relationship hashes, restriction summaries); \
                 {:.1} database queries per 1,000 warm reads (every read a cache did not answer whole)",
                hit_ratio * 100.0,
                hits + misses,
                db_per_1000
            ),
        ],
    );
    let floor_pairs: Vec<(&str, &Hist, &Hist)> = floor_rows.iter().map(|(what, bare, raw)| (*what, bare, raw)).collect();
    print_table(
        "the floor: a bare tonic server (no layers, no spans) doing the raw read, one client; raw timed right after it",
        "bare tonic",
        "raw",
        &latency_rows(&floor_pairs),
        &["about the best ratio a gRPC read of each kind reaches on this machine; compare the first row with the services' health check above"
            .into()],
    );
    print_table(
        &format!("warm BatchGetRelationships(100), throughput: {} s per run", a.secs),
        "socialgraph (gRPC)",
        "raw",
        &throughput.rows(),
        &throughput.notes(),
    );
    followers.report(&path, graph.edges.len(), a.reads);
    joins.report(a.reads);
    match &falkor {
        Some(f) => f.report(&crate::falkordb::Warm {
            following_page: &page_warm,
            follower_page: &followers.page_warm,
            relationships: &batch_warm,
            common: &joins.rows[0].1,
            familiar: &joins.rows[2].1,
        }),
        None if a.falkordb_url.is_empty() => {
            println!("\n  * FalkorDB not measured: `make bench-falkordb` (or scripts/falkordb.sh and --falkordb-url redis://127.0.0.1:6390)")
        }
        None => {}
    }
    summarize("following page, warm cache: p99 (vs raw ZREVRANGE)", ms(&page_warm, 0.99), ms(&raw_page_redis, 0.99), "ms", "<= 3x raw Redis");
    summarize("BatchGetRelationships(100), warm: p99 (vs raw ZMSCORE)", ms(&batch_warm, 0.99), ms(&raw_batch_redis, 0.99), "ms", "<= 3x raw Redis");
    summarize(
        "BatchGetRelationships(100), warm, 32 callers: reads/s (vs raw ZMSCORE)",
        throughput.svc.run.rate(),
        throughput.raw.run.rate(),
        "/s",
        "no target (the floor: bare tonic + ZMSCORE)",
    );
    summarize("following page, cold cache: p99 (vs raw PostgreSQL)", ms(&page_cold, 0.99), ms(&raw_page_pg, 0.99), "ms", "<= 2x raw PostgreSQL");
    for (label, bare, raw) in &floor_rows[1..] {
        summarize(format!("floor: {label}: p99"), ms(bare, 0.99), ms(raw, 0.99), "ms", "about the least a gRPC read reaches");
    }
    summarize("cache hit ratio after warm-up (following)", hit_ratio * 100.0, 0.0, "%", ">= 95 %");
    Ok(())
}
