//! The following-list cache in a running mesh on PostgreSQL: cached lists equal the `following`
//! table after concurrent writes, reads that fill, evictions of single keys and flushes, and
//! after replayed and reordered events; the actor reads its own writes at once; a cache Redis
//! that projection-svc cannot reach leaves stale lists only until it can again; a cache Redis
//! that is down costs speed, never answers.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rand::{Rng, SeedableRng, rngs::StdRng};
use rskafka::client::partition::{Compression, UnknownTopicHandling};
use socialgraph_cache::keys::Keys;
use socialgraph_integration_tests::cache::{
    assert_cached_exact, assert_cached_following_exact, cached_following, flush_prefix, following_lists, table_lists,
};
use socialgraph_integration_tests::*;
use socialgraph_proto::projection::v1 as pp;
use socialgraph_proto::projection::v1::projection_service_client::ProjectionServiceClient;
use socialgraph_proto::relation::v1::relation_service_client::RelationServiceClient;
use socialgraph_proto::relation::v1::*;
use socialgraph_testkit::{cache_redis_url, kafka, redis_url};
use tonic::transport::Channel;

const USERS: i64 = 40;
const DEADLINE: Duration = Duration::from_secs(120);
/// Following-list and follower windows of the convergence test.
const WINDOW: i64 = 6;

/// Every page of `user`'s following list, as (followee, followed_at ms).
async fn walk(client: &mut RelationServiceClient<Channel>, user: i64, page_size: i32) -> anyhow::Result<Vec<(i64, i64)>> {
    let (mut out, mut token) = (Vec::new(), String::new());
    loop {
        let r = client.list_following(ListFollowingRequest { user_id: user, page_size, page_token: token }).await?.into_inner();
        out.extend(r.following.iter().map(|e| (e.user_id, e.followed_at.as_ref().map(socialgraph_domain::timestamp_to_ms).unwrap_or_default())));
        if r.next_page_token.is_empty() {
            return Ok(out);
        }
        token = r.next_page_token;
    }
}

/// Every page of `user`'s followers, as (follower, followed_at ms).
async fn walk_followers(client: &mut ProjectionServiceClient<Channel>, user: i64, page_size: i32) -> anyhow::Result<Vec<(i64, i64)>> {
    let (mut out, mut token) = (Vec::new(), String::new());
    loop {
        let req = pp::ListFollowersRequest { user_id: user, page_size, page_token: token, ..Default::default() };
        let r = client.list_followers(req).await?.into_inner();
        out.extend(r.followers.iter().map(|e| (e.user_id, e.followed_at.as_ref().map(socialgraph_domain::timestamp_to_ms).unwrap_or_default())));
        if r.next_page_token.is_empty() {
            return Ok(out);
        }
        token = r.next_page_token;
    }
}

/// Every page (of 3) of the common following of `a` and `b` (`common`), else of the familiar
/// followers of `b` for viewer `a`, as (account, followed_at ms).
async fn walk_join(client: &mut RelationServiceClient<Channel>, a: i64, b: i64, common: bool) -> anyhow::Result<Vec<(i64, i64)>> {
    let (mut out, mut token) = (Vec::new(), String::new());
    loop {
        let (accounts, next) = if common {
            let r =
                client.list_common_following(ListCommonFollowingRequest { user_id: a, other_user_id: b, page_size: 3, page_token: token }).await?;
            let r = r.into_inner();
            (r.accounts, r.next_page_token)
        } else {
            let r =
                client.list_familiar_followers(ListFamiliarFollowersRequest { viewer_id: a, user_id: b, page_size: 3, page_token: token }).await?;
            let r = r.into_inner();
            (r.accounts, r.next_page_token)
        };
        out.extend(accounts.iter().map(|e| (e.user_id, e.followed_at.as_ref().map(socialgraph_domain::timestamp_to_ms).unwrap_or_default())));
        if next.is_empty() {
            return Ok(out);
        }
        token = next;
    }
}

async fn cache_up() -> anyhow::Result<socialgraph_cache::Conn> {
    let url = cache_redis_url();
    redis_conn(&url).await.map_err(|e| anyhow::anyhow!("the cache Redis at {url} is not reachable ({e}): run `make deps`"))
}

/// Waits until every list of `users` is cached (reads fill in the background) and equal to
/// the table.
async fn all_cached(m: &Mesh, users: &[i64]) -> anyhow::Result<()> {
    let cache = cache_settings(&m.topics.relation);
    socialgraph_testkit::eventually(Duration::from_secs(20), "every list read to be cached", || async {
        let cached = assert_cached_following_exact(&m.db, &cache.url, &cache.key_prefix, users).await?;
        Ok((cached == users.len()).then_some(()))
    })
    .await
}

/// Asserts that the service's answers (pages and relationships) for every user equal the table.
async fn assert_served_exact(m: &Mesh) -> anyhow::Result<()> {
    let users: Vec<i64> = (1..=USERS).collect();
    let truth = following_lists(&m.db, &users).await?;
    let mut client = m.relation.client().await?;
    let mut projection = m.projection.projection().await?;
    for (user, list) in &table_lists(&m.db, false, &users).await? {
        let r = client.batch_get_relationships(BatchGetRelationshipsRequest { user_id: *user, other_user_ids: users.clone() }).await?.into_inner();
        let got: Vec<(i64, i64)> = r
            .relationships
            .iter()
            .filter(|r| r.followed_by)
            .map(|r| (r.other_user_id, r.followed_by_at.as_ref().map(socialgraph_domain::timestamp_to_ms).unwrap_or_default()))
            .collect();
        let mut want = list.clone();
        want.sort_unstable();
        assert_eq!(got, want, "BatchGetRelationships of {user}, followed_by");
        assert_eq!(&walk_followers(&mut projection, *user, 4).await?, list, "ListFollowers of {user}");
        let req = pp::BatchCheckFollowersRequest { user_id: *user, candidate_ids: users.clone(), ..Default::default() };
        let r = projection.batch_check_followers(req).await?.into_inner();
        let got: Vec<i64> = r.results.iter().filter(|r| r.follows).map(|r| r.candidate_id).collect();
        let mut want: Vec<i64> = list.iter().map(|(id, _)| *id).collect();
        want.sort_unstable();
        assert_eq!(got, want, "BatchCheckFollowers of {user}");
    }
    let followers = table_lists(&m.db, false, &users).await?;
    for a in (1..=USERS).step_by(3) {
        let b = a % USERS + 1;
        let in_b: std::collections::HashSet<i64> = truth[&b].iter().map(|e| e.0).collect();
        let want: Vec<(i64, i64)> = truth[&a].iter().copied().filter(|e| in_b.contains(&e.0)).collect();
        assert_eq!(walk_join(&mut client, a, b, true).await?, want, "ListCommonFollowing of {a} and {b}");
        let of_b: std::collections::HashSet<i64> = followers[&b].iter().map(|e| e.0).collect();
        let want: Vec<(i64, i64)> = truth[&a].iter().copied().filter(|e| of_b.contains(&e.0)).collect();
        assert_eq!(walk_join(&mut client, a, b, false).await?, want, "ListFamiliarFollowers of viewer {a} and {b}");
    }
    for (user, list) in &truth {
        assert_eq!(&walk(&mut client, *user, 7).await?, list, "ListFollowing of {user}");
        let others: Vec<i64> = (1..=USERS).collect();
        let r = client.batch_get_relationships(BatchGetRelationshipsRequest { user_id: *user, other_user_ids: others.clone() }).await?.into_inner();
        let got: Vec<i64> = r.relationships.iter().filter(|r| r.following).map(|r| r.other_user_id).collect();
        let mut want: Vec<i64> = list.iter().map(|(id, _)| *id).collect();
        want.sort_unstable();
        assert_eq!(got, want, "BatchGetRelationships of {user}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cached_lists_equal_the_table_after_writes_fills_evictions_flushes_replays_and_reordering() -> anyhow::Result<()> {
    let mut cache_conn = cache_up().await?;
    // Small windows, so that lists and follower windows are trimmed, shrink and pass pages to
    // the database all through the workload.
    let m = Mesh::start_tuned(socialgraph_testkit::Backend::Postgres, &redis_url(), &kafka::brokers(), |c| {
        c.following_max = WINDOW;
        c.followers_window = WINDOW;
        c.deep_pages_per_sec = 100_000;
    })
    .await?;
    let cache = cache_settings(&m.topics.relation);
    let keys = Keys::new(cache.key_prefix.clone());
    let done = Arc::new(AtomicBool::new(false));

    let writers = tokio::spawn(random_workload(m.relation.addr, 2_400, USERS, 7));
    let mut readers = Vec::new();
    for seed in 0..2u64 {
        let (mut client, mut projection, done) = (m.relation.client().await?, m.projection.projection().await?, Arc::clone(&done));
        readers.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut reads = 0u64;
            while !done.load(Ordering::Relaxed) {
                let user = rng.random_range(1..=USERS);
                walk(&mut client, user, 5).await?;
                walk_followers(&mut projection, user, 5).await?;
                let others: Vec<i64> = (0..10).map(|_| rng.random_range(1..=USERS)).collect();
                client.batch_get_relationships(BatchGetRelationshipsRequest { user_id: user, other_user_ids: others.clone() }).await?;
                projection
                    .batch_check_followers(pp::BatchCheckFollowersRequest { user_id: user, candidate_ids: others, ..Default::default() })
                    .await?;
                reads += 1;
            }
            anyhow::Ok(reads)
        }));
    }
    let evictor = {
        let (done, keys, prefix, mut conn) = (Arc::clone(&done), keys.clone(), cache.key_prefix.clone(), cache_up().await?);
        tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(99);
            let (mut evictions, mut flushes) = (0u64, 0u64);
            for round in 0u64.. {
                // At least one flush, should the writes end before the first.
                if done.load(Ordering::Relaxed) && flushes > 0 {
                    break;
                }
                let user = rng.random_range(1..=USERS);
                let key = keys.list(rng.random_bool(0.5), user)[rng.random_range(0..3)].clone();
                let _: i64 = redis::AsyncCommands::del(&mut conn, key).await?;
                evictions += 1;
                // The first flush comes about half a second in, then one a second: the writes
                // take 2-4 s on 2 cores, so at least one flush lands among them.
                if round % 100 == 49 {
                    flush_prefix(&mut conn, &prefix).await?;
                    flushes += 1;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            anyhow::Ok((evictions, flushes))
        })
    };
    let changes = writers.await??;
    done.store(true, Ordering::Relaxed);
    let mut reads = 0;
    for r in readers {
        reads += r.await??;
    }
    let (evictions, flushes) = evictor.await??;
    println!("{changes} changes, {reads} read rounds, {evictions} keys evicted, {flushes} flushes");
    assert!(reads > 20 && evictions > 20 && flushes > 0, "the readers and the evictor ran during the writes");

    m.settle(DEADLINE).await?;
    let users: Vec<i64> = (1..=USERS).collect();
    let survived = assert_cached_following_exact(&m.db, &cache.url, &cache.key_prefix, &users).await?;
    println!("{survived} lists were cached at the end of the workload, each equal to the table");
    assert_served_exact(&m).await?;
    all_cached(&m, &users).await?;

    // Replayed and reordered: every event again, each partition's in reverse order.
    let client = kafka::connect(&m.brokers).await?;
    let mut records = kafka::read_all(&client, &m.topics.relation).await?;
    records.reverse();
    for (p, r) in &records {
        let pc = client.partition_client(m.topics.relation.as_str(), *p, UnknownTopicHandling::Retry).await?;
        pc.produce(vec![r.record.clone()], Compression::Lz4).await?;
    }
    m.settle(DEADLINE).await?;
    assert_eq!(
        assert_cached_following_exact(&m.db, &cache.url, &cache.key_prefix, &users).await?,
        USERS as usize,
        "{} events replayed in reverse change no cached list",
        records.len()
    );
    assert_cached_exact(&m.db, &cache.url, &cache.key_prefix, false, &users).await?;

    // A flush of the whole cache Redis costs fills, not answers.
    let _: () = redis::cmd("FLUSHALL").query_async(&mut cache_conn).await?;
    assert_served_exact(&m).await?;
    m.assert_views_exact(&users, DEADLINE).await?;
    m.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_actor_reads_its_own_follows_and_unfollows_at_once_warm_and_cold() -> anyhow::Result<()> {
    let mut cache_conn = cache_up().await?;
    let m = Mesh::start(&redis_url()).await?;
    let cache = cache_settings(&m.topics.relation);
    let keys = Keys::new(cache.key_prefix.clone());
    let mut client = m.relation.client().await?;
    let mut rng = StdRng::seed_from_u64(5);
    for i in 0..1_000 {
        let actor = 1 + i % 10;
        let followee = 100 + rng.random_range(0..30);
        let cold = i % 2 == 0;
        if cold {
            let _: i64 = redis::AsyncCommands::del(&mut cache_conn, &[keys.following(actor), keys.following_versions(actor)]).await?;
        } else {
            walk(&mut client, actor, 1000).await?;
        }
        let unfollow = rng.random_bool(0.4);
        if unfollow {
            client.unfollow(UnfollowRequest { follower_id: actor, followee_id: followee }).await?;
        } else {
            client.follow(FollowRequest { follower_id: actor, followee_id: followee }).await?;
        }
        let list = walk(&mut client, actor, 1000).await?;
        let r = client.get_relationship(GetRelationshipRequest { user_id: actor, other_user_id: followee }).await?.into_inner();
        let listed = list.iter().any(|(id, _)| *id == followee);
        assert_eq!(
            (listed, r.relationship.as_ref().is_some_and(|r| r.following)),
            (!unfollow, !unfollow),
            "round {i} (cold: {cold}): the actor's list and relationship show its write"
        );
    }
    let hits = metric_sum(&m.relation.metrics().await?, "sg_cache_requests_total", "result=\"hit\"");
    let writes = metric_sum(&m.relation.metrics().await?, "sg_cache_writes_total", "result=\"ok\"");
    println!("cache hits {hits}, write-throughs {writes}");
    assert!(hits > 500.0 && writes > 500.0, "warm rounds were answered from the cache after a write-through");
    let users: Vec<i64> = (1..=10).chain(100..130).collect();
    m.assert_views_exact(&users, DEADLINE).await?;
    m.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lists_missed_while_projection_could_not_reach_the_cache_are_dropped_by_the_drain() -> anyhow::Result<()> {
    cache_up().await?;
    let mut m = Mesh::start(&redis_url()).await?;
    let cache = cache_settings(&m.topics.relation);
    let mut reader = m.relation.client().await?;
    // A second relation-svc on the same database without the cache: its writes are seen by the
    // cache only through the events, like an import or an account job.
    let mut rc = m.relation_config();
    rc.cache.url = String::new();
    rc.kafka.relay_enabled = false;
    let writer_svc = spawn_relation(rc).await?;
    let mut writer = writer_svc.client().await?;
    for u in 1..=5 {
        writer.follow(FollowRequest { follower_id: u, followee_id: 50 }).await?;
        walk(&mut reader, u, 100).await?;
    }
    m.settle(DEADLINE).await?;

    // projection-svc loses the cache Redis (a port nobody listens on).
    m.projection.shutdown.cancel();
    (&mut m.projection.task).await??;
    let mut pc = m.projection_config();
    pc.cache.url = format!("redis://127.0.0.1:{}", socialgraph_testkit::process::free_port()?);
    pc.cache.timeout_ms = 200;
    m.projection = spawn_projection(pc).await?;
    for u in 1..=5 {
        writer.follow(FollowRequest { follower_id: u, followee_id: 51 }).await?;
        writer.unfollow(UnfollowRequest { follower_id: u, followee_id: 50 }).await?;
    }
    outbox_drained(&m.db, DEADLINE).await?;
    projection_caught_up(&m.projection, &m.brokers, &m.topics.relation, DEADLINE).await?;
    let failed = metric_sum(&m.projection.metrics().await?, "sg_cache_applies_total", "result=\"failed\"");
    assert!(failed >= 1.0, "projection-svc could not apply its batches to the cache");
    // The batches marked their users stale in the offset's transaction, and relation-svc, which
    // reaches the cache, drains the marks (same database): the stale lists are dropped within
    // about 200 ms (10 s allowed on a loaded machine); projection-svc never reaches the cache
    // again here.
    socialgraph_testkit::eventually(Duration::from_secs(10), "the stale marks to be drained", || async {
        Ok((socialgraph_storage::stale::count(&m.db.conn).await? == 0).then_some(()))
    })
    .await?;
    for u in 1..=5 {
        assert_eq!(walk(&mut reader, u, 100).await?.iter().map(|e| e.0).collect::<Vec<_>>(), vec![51], "user {u} after the drain");
    }
    socialgraph_testkit::eventually(Duration::from_secs(10), "the lists read to be filled again", || async {
        for u in 1..=5 {
            if cached_following(&cache.url, &cache.key_prefix, u).await?.is_none() {
                return Ok(None);
            }
        }
        Ok(Some(()))
    })
    .await?;
    writer_svc.stop().await?;
    m.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cache_redis_that_is_down_costs_speed_never_answers() -> anyhow::Result<()> {
    let (db, svc, _topic) = relation_on(socialgraph_testkit::Backend::Postgres, |c| {
        c.cache.url = format!("redis://127.0.0.1:{}", socialgraph_testkit::process::free_port().expect("a free port"));
        c.cache.timeout_ms = 200;
    })
    .await?;
    let mut client = svc.client().await?;
    for e in [3, 4, 5] {
        client.follow(FollowRequest { follower_id: 1, followee_id: e }).await?;
    }
    client.unfollow(UnfollowRequest { follower_id: 1, followee_id: 4 }).await?;
    assert_eq!(walk(&mut client, 1, 1).await?.iter().map(|e| e.0).collect::<Vec<_>>(), vec![5, 3]);
    let r = client.get_relationship(GetRelationshipRequest { user_id: 1, other_user_id: 3 }).await?.into_inner();
    assert!(r.relationship.is_some_and(|r| r.following));
    let text = svc.metrics().await?;
    assert!(metric_sum(&text, "sg_cache_requests_total", "result=\"fallback\"") >= 3.0, "fallbacks are counted");
    assert!(metric_sum(&text, "sg_cache_writes_total", "result=\"failed\"") >= 4.0, "failed write-throughs are counted");
    svc.stop().await?;
    db.drop_db().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_list_longer_than_the_window_serves_its_newest_entries_and_reads_the_rest_from_the_database() -> anyhow::Result<()> {
    cache_up().await?;
    let (db, svc, topic) = relation_on(socialgraph_testkit::Backend::Postgres, |c| c.cache.following_max = 3).await?;
    let mut client = svc.client().await?;
    for e in 2..=6 {
        client.follow(FollowRequest { follower_id: 1, followee_id: e }).await?;
    }
    assert_eq!(walk(&mut client, 1, 2).await?.iter().map(|e| e.0).collect::<Vec<_>>(), vec![6, 5, 4, 3, 2]);
    let cache = cache_settings(&topic);
    let window = socialgraph_testkit::eventually(Duration::from_secs(10), "the window to be filled", || async {
        socialgraph_integration_tests::cache::cached_list(&cache.url, &cache.key_prefix, true, 1).await
    })
    .await?;
    assert_eq!(window.entries.iter().map(|e| e.0).collect::<Vec<_>>(), vec![6, 5, 4], "the newest three");
    for _ in 0..2 {
        assert_eq!(walk(&mut client, 1, 2).await?.iter().map(|e| e.0).collect::<Vec<_>>(), vec![6, 5, 4, 3, 2]);
    }
    // Past the window: the database answers, and the edge is followed.
    let r = client.batch_get_relationships(BatchGetRelationshipsRequest { user_id: 1, other_user_ids: vec![2, 6, 9] }).await?.into_inner();
    assert_eq!(r.relationships.iter().map(|r| r.following).collect::<Vec<_>>(), vec![true, true, false]);
    // A new follow pushes the oldest cached one out.
    client.follow(FollowRequest { follower_id: 1, followee_id: 7 }).await?;
    assert_eq!(walk(&mut client, 1, 2).await?.iter().map(|e| e.0).collect::<Vec<_>>(), vec![7, 6, 5, 4, 3, 2]);
    let text = svc.metrics().await?;
    assert_eq!(metric_sum(&text, "sg_cache_fills_total", "cache=\"following\",result=\"cached\""), 1.0, "one fill; a window is never refilled");
    // Three walks from the window: the first page of each is a hit, the two after it are past it.
    assert_eq!(metric_sum(&text, "sg_cache_requests_total", "result=\"hit\",rpc=\"ListFollowing\""), 3.0, "first pages come from the window");
    let past = metric_sum(&text, "sg_cache_requests_total", "result=\"past_window\",rpc=\"ListFollowing\"");
    assert!(past >= 6.0, "later pages from the database ({past})");
    svc.stop().await?;
    db.drop_db().await
}
