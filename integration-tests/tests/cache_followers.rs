//! A very large account (50,000 followers from ImportFollows) in a running mesh: follower pages
//! inside the cached window come from the cache, pages past it are rate limited with
//! RESOURCE_EXHAUSTED `DEEP_PAGE_LIMITED` and RetryInfo, and BatchCheckFollowers over candidates
//! inside and outside the window equals the database, before and after changes. With
//! `cache.fill_after_misses` 2, a list read once stays uncached and its second miss fills it;
//! with one fill slot and a small `cache.fill_rows_per_sec`, a burst of misses is answered
//! from the database and every list gets filled, no faster than the budget.

use std::time::Duration;

use socialgraph_integration_tests::cache::{cached_list, table_lists};
use socialgraph_integration_tests::*;
use socialgraph_proto::projection::v1 as pp;
use socialgraph_proto::relation::v1::*;
use socialgraph_testkit::{Backend, kafka, redis_url};
use tonic::Code;
use tonic_types::StatusExt;

const FOLLOWERS: i64 = 50_000;
const SETTLE: Duration = Duration::from_secs(300);
const T0: i64 = 1_700_000_000_000;

/// The truth for `candidates`: when each follows user 1, from the `following` table.
async fn truth(m: &Mesh, candidates: &[i64]) -> anyhow::Result<Vec<Option<i64>>> {
    let list = table_lists(&m.db, false, &[1]).await?.remove(&1).unwrap_or_default();
    let at: std::collections::HashMap<i64, i64> = list.into_iter().collect();
    Ok(candidates.iter().map(|c| at.get(c).copied()).collect())
}

async fn check(
    p: &mut pp::projection_service_client::ProjectionServiceClient<tonic::transport::Channel>,
    candidates: &[i64],
) -> anyhow::Result<Vec<Option<i64>>> {
    let req = pp::BatchCheckFollowersRequest { user_id: 1, candidate_ids: candidates.to_vec(), ..Default::default() };
    let r = p.batch_check_followers(req).await?.into_inner();
    Ok(r.results.iter().map(|r| r.followed_at.as_ref().filter(|_| r.follows).map(socialgraph_domain::timestamp_to_ms)).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_very_large_account_is_served_from_its_window_with_deep_pages_limited_and_checks_exact() -> anyhow::Result<()> {
    let m = Mesh::start_tuned(Backend::Postgres, &redis_url(), &kafka::brokers(), |c| c.deep_pages_per_sec = 2).await?;
    let window = socialgraph_server::CacheSettings::default().followers_window;
    let mut c = m.relation.client().await?;
    let ids: Vec<i64> = (2..=FOLLOWERS + 1).collect();
    let msgs: Vec<ImportFollowsRequest> = ids
        .chunks(10_000)
        .map(|chunk| ImportFollowsRequest {
            edges: chunk
                .iter()
                .map(|&f| ImportEdge { follower_id: f, followee_id: 1, followed_at: Some(socialgraph_domain::timestamp_from_ms(T0 + f)) })
                .collect(),
        })
        .collect();
    assert_eq!(c.import_follows(admin(futures::stream::iter(msgs))).await?.into_inner().imported, FOLLOWERS);
    m.settle(SETTLE).await?;

    // The first read misses and fills the window in the background.
    let mut p = m.projection.projection().await?;
    let page = |token: String| pp::ListFollowersRequest { user_id: 1, page_size: 1000, page_token: token, ..Default::default() };
    p.list_followers(page(String::new())).await?;
    let cache = cache_settings(&m.topics.relation);
    let cached = socialgraph_testkit::eventually(Duration::from_secs(30), "the follower window to be filled", || async {
        cached_list(&cache.url, &cache.key_prefix, false, 1).await
    })
    .await?;
    let newest: Vec<i64> = (FOLLOWERS + 1 - window + 1..=FOLLOWERS + 1).rev().collect();
    assert_eq!(cached.entries.iter().map(|e| e.0).collect::<Vec<_>>(), newest, "the window holds the newest {window}");
    assert_eq!(cached.boundary, Some((T0 + FOLLOWERS + 1 - window, FOLLOWERS + 1 - window)), "bounded by the newest one left out");

    // Every page inside the window comes from the cache; the pages past it are deep.
    let (mut token, mut walked) = (String::new(), Vec::new());
    let before = m.projection.metrics().await?;
    for _ in 0..(window / 1000) {
        let r = p.list_followers(page(token)).await?.into_inner();
        walked.extend(r.followers.iter().map(|f| f.user_id));
        token = r.next_page_token;
    }
    assert_eq!(walked, newest, "pages inside the window, in list order");
    let after = m.projection.metrics().await?;
    let hits = |t: &str| metric_sum(t, "sg_cache_requests_total", "result=\"hit\",rpc=\"ListFollowers\"");
    assert_eq!(hits(&after) - hits(&before), (window / 1000) as f64, "every page inside the window is a cache hit");

    let mut deep = Vec::new();
    let started = std::time::Instant::now();
    let refused = loop {
        match p.list_followers(page(token.clone())).await {
            Ok(r) => {
                let r = r.into_inner();
                deep.extend(r.followers.iter().map(|f| f.user_id));
                token = r.next_page_token;
            }
            Err(e) => break e,
        }
        // A burst of 2, then 2 a second: a loaded machine that takes long per page earns more.
        let allowed = 2.0 + 2.0 * started.elapsed().as_secs_f64();
        assert!(
            (deep.len() / 1000) as f64 <= allowed.floor(),
            "{} deep pages in {:?}: over the limit of 2 a second",
            deep.len() / 1000,
            started.elapsed()
        );
    };
    assert!(deep.len() >= 2_000, "the burst of 2 deep pages is served");
    let deep_end = FOLLOWERS + 1 - window;
    assert_eq!(deep, (deep_end + 1 - deep.len() as i64..=deep_end).rev().collect::<Vec<_>>(), "deep pages continue the list");
    assert_eq!((refused.code(), socialgraph_server::reason_of(&refused).as_deref()), (Code::ResourceExhausted, Some("DEEP_PAGE_LIMITED")));
    let retry = refused.get_error_details().retry_info().and_then(|r| r.retry_delay).expect("RetryInfo");
    assert!(retry > Duration::ZERO && retry <= Duration::from_secs(1), "retry after {retry:?}");
    tokio::time::sleep(retry).await;
    let r = p.list_followers(page(token)).await?.into_inner();
    assert_eq!(r.followers.len(), 1000, "after the wait the next deep page is served");
    let text = m.projection.metrics().await?;
    assert!(metric_sum(&text, "sg_cache_deep_pages_total", "result=\"refused\"") >= 1.0);

    // Checks inside the window, outside it and of accounts that do not follow.
    let mut candidates: Vec<i64> = (FOLLOWERS - 298..=FOLLOWERS + 1).collect();
    candidates.extend(2..=301);
    candidates.extend(100_000..100_300);
    assert_eq!(check(&mut p, &candidates).await?, truth(&m, &candidates).await?, "first check (database for the outside ones)");
    let before = m.projection.metrics().await?;
    assert_eq!(check(&mut p, &candidates).await?, truth(&m, &candidates).await?, "second check (window and relationship hash)");
    let after = m.projection.metrics().await?;
    let checks = |t: &str| metric_sum(t, "sg_cache_requests_total", "result=\"hit\",rpc=\"BatchCheckFollowers\"");
    assert_eq!(checks(&after) - checks(&before), 1.0, "the second check is answered by the cache alone");

    // Events keep the remembered answers: an old follower leaves, a new account follows.
    c.unfollow(UnfollowRequest { follower_id: 2, followee_id: 1 }).await?;
    c.follow(FollowRequest { follower_id: 100_000, followee_id: 1 }).await?;
    m.settle(SETTLE).await?;
    let got = check(&mut p, &candidates).await?;
    assert_eq!(got, truth(&m, &candidates).await?, "after an unfollow outside the window and a new follow");
    assert_eq!((got[300], got[600].is_some()), (None, true));
    m.assert_views_exact(&[1, 2, 100_000], SETTLE).await?;
    m.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hot_account_is_served_from_memory_and_no_staler_than_the_bound_on_a_replica_that_consumes_nothing() -> anyhow::Result<()> {
    const STALENESS_MS: u64 = 1000;
    let m = Mesh::start_tuned(Backend::Postgres, &redis_url(), &kafka::brokers(), |c| {
        c.hot_reads_per_sec = 5;
        c.hot_staleness_ms = STALENESS_MS;
    })
    .await?;
    let mut c = m.relation.client().await?;
    for f in 2..=21 {
        c.follow(FollowRequest { follower_id: f, followee_id: 1 }).await?;
    }
    m.settle(SETTLE).await?;
    // A second projection-svc that consumes no partition: only the expiry refreshes its memory.
    let mut pc = m.projection_config();
    pc.cache.hot_reads_per_sec = 5;
    pc.cache.hot_staleness_ms = STALENESS_MS;
    pc.consumer.partitions = socialgraph_events::consumer::Assignment::List(Vec::new());
    let reader = spawn_projection(pc).await?;
    let mut p = reader.projection().await?;
    let first = || pp::ListFollowersRequest { user_id: 1, page_size: 5, ..Default::default() };
    p.list_followers(first()).await?;
    let cache = cache_settings(&m.topics.relation);
    socialgraph_testkit::eventually(Duration::from_secs(10), "the follower window to be filled", || async {
        cached_list(&cache.url, &cache.key_prefix, false, 1).await
    })
    .await?;
    for _ in 0..20 {
        p.list_followers(first()).await?;
    }
    let text = reader.metrics().await?;
    assert!(metric_sum(&text, "sg_cache_requests_total", "result=\"local\",rpc=\"ListFollowers\"") >= 10.0, "a hot account is read from memory");

    // A new follower: the consuming replica shows it after the projection lag, the other one
    // within the staleness bound.
    let started = std::time::Instant::now();
    c.follow(FollowRequest { follower_id: 99, followee_id: 1 }).await?;
    let mut own = m.projection.projection().await?;
    let (mut seen_own, mut seen_reader) = (None, None);
    while seen_own.is_none() || seen_reader.is_none() {
        assert!(started.elapsed() < Duration::from_secs(10), "the new follower never showed");
        if seen_own.is_none() && own.list_followers(first()).await?.into_inner().followers.first().is_some_and(|f| f.user_id == 99) {
            seen_own = Some(started.elapsed());
        }
        if seen_reader.is_none() && p.list_followers(first()).await?.into_inner().followers.first().is_some_and(|f| f.user_id == 99) {
            seen_reader = Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (own, other) = (seen_own.unwrap_or_default(), seen_reader.unwrap_or_default());
    println!("a new follower of a hot account showed after {own:?} on the consuming replica and {other:?} on the other one");
    assert!(other <= Duration::from_millis(STALENESS_MS) + own + Duration::from_millis(500), "staleness {other:?} within the bound");
    reader.stop().await?;
    m.stop().await
}

/// Settles `m`, then fills the following lists of 1 and 2 and the follower window of 3 (the
/// lists the join tests read) and waits until the cache Redis at `url` holds them.
async fn cache_join_lists(m: &Mesh, url: &str) -> anyhow::Result<()> {
    m.settle(SETTLE).await?;
    let mut c = m.relation.client().await?;
    for u in [1, 2] {
        c.list_following(ListFollowingRequest { user_id: u, page_size: 1, page_token: String::new() }).await?;
    }
    m.projection.projection().await?.list_followers(pp::ListFollowersRequest { user_id: 3, page_size: 1, ..Default::default() }).await?;
    let prefix = cache_settings(&m.topics.relation).key_prefix;
    socialgraph_testkit::eventually(Duration::from_secs(10), "the lists to be cached", || async {
        let (a, b) = (cached_list(url, &prefix, true, 1).await?, cached_list(url, &prefix, true, 2).await?);
        Ok((a.is_some() && b.is_some() && cached_list(url, &prefix, false, 3).await?.is_some()).then_some(()))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn common_and_familiar_lists_come_from_the_cached_sets_and_equal_the_database() -> anyhow::Result<()> {
    let m = Mesh::start(&redis_url()).await?;
    let mut c = m.relation.client().await?;
    // 1 follows 10..=29, 2 follows the even ones of them and 40; 11, 13 and 40 follow 3.
    for f in 10..=29 {
        c.follow(FollowRequest { follower_id: 1, followee_id: f }).await?;
        if f % 2 == 0 {
            c.follow(FollowRequest { follower_id: 2, followee_id: f }).await?;
        }
    }
    c.follow(FollowRequest { follower_id: 2, followee_id: 40 }).await?;
    for f in [11, 13, 40] {
        c.follow(FollowRequest { follower_id: f, followee_id: 3 }).await?;
    }
    cache_join_lists(&m, &cache_settings(&m.topics.relation).url).await?;

    let ids = |v: Vec<FollowEntry>| v.into_iter().map(|e| e.user_id).collect::<Vec<_>>();
    let (mut common, mut token) = (Vec::new(), String::new());
    loop {
        let req = ListCommonFollowingRequest { user_id: 1, other_user_id: 2, page_size: 4, page_token: token };
        let r = c.list_common_following(req).await?.into_inner();
        common.extend(ids(r.accounts));
        if r.next_page_token.is_empty() {
            break;
        }
        token = r.next_page_token;
    }
    assert_eq!(common, (10..=28).rev().step_by(2).collect::<Vec<i64>>(), "accounts both follow, newest of 1's first");
    let r = c.list_familiar_followers(ListFamiliarFollowersRequest { viewer_id: 1, user_id: 3, page_size: 10, page_token: String::new() }).await?;
    assert_eq!(ids(r.into_inner().accounts), vec![13, 11], "accounts 1 follows that follow 3");
    // A change shows at once for the actor: 1 unfollows 12, 13 stops following 3.
    c.unfollow(UnfollowRequest { follower_id: 1, followee_id: 12 }).await?;
    c.unfollow(UnfollowRequest { follower_id: 13, followee_id: 3 }).await?;
    let r = c.list_common_following(ListCommonFollowingRequest { user_id: 1, other_user_id: 2, page_size: 100, page_token: String::new() }).await?;
    assert!(!ids(r.into_inner().accounts).contains(&12));
    let r = c.list_familiar_followers(ListFamiliarFollowersRequest { viewer_id: 1, user_id: 3, page_size: 10, page_token: String::new() }).await?;
    assert_eq!(ids(r.into_inner().accounts), vec![11]);
    let text = m.relation.metrics().await?;
    assert!(metric_sum(&text, "sg_cache_requests_total", "result=\"hit\",rpc=\"ListCommonFollowing\"") >= 6.0, "common pages from the cache");
    assert!(metric_sum(&text, "sg_cache_requests_total", "cache=\"followers\",result=\"hit\",rpc=\"ListFamiliarFollowers\"") >= 2.0);
    m.stop().await
}

/// Pages of `next(token)` until the last, as ids.
async fn all_pages<F, Fut>(mut next: F) -> anyhow::Result<Vec<i64>>
where
    F: FnMut(String) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<(Vec<FollowEntry>, String)>>,
{
    let (mut ids, mut token) = (Vec::new(), String::new());
    loop {
        let (page, next_token) = next(token).await?;
        ids.extend(page.iter().map(|e| e.user_id));
        if next_token.is_empty() {
            return Ok(ids);
        }
        token = next_token;
    }
}

/// On one cache Redis, each join of two whole lists is one script call (ZINTER there).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn joins_of_a_long_list_with_a_short_one_come_from_the_caches_and_equal_the_database() -> anyhow::Result<()> {
    let m = Mesh::start(&redis_url()).await?;
    let url = cache_settings(&m.topics.relation).url;
    long_and_short_joins(m, &url).await
}

/// On a Redis Cluster the two users' lists live in two slots: each side is read on its own and
/// the join is made in relation-svc (a page of each, and lookups of the short side's ids in
/// the long side's list).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_a_redis_cluster_joins_of_a_long_list_with_a_short_one_are_made_in_the_service_and_equal_the_database() -> anyhow::Result<()> {
    let cluster = socialgraph_testkit::process::redis_cluster(3).await?;
    let url = cluster.url();
    let m = Mesh::start_tuned(Backend::Postgres, &redis_url(), &kafka::brokers(), |c| c.url.clone_from(&url)).await?;
    long_and_short_joins(m, &url).await
}

/// Common following and familiar followers of a 400-entry following list with short lists,
/// every page, against what the writes made; all from the cache Redis at `url`.
async fn long_and_short_joins(m: Mesh, url: &str) -> anyhow::Result<()> {
    let mut c = m.relation.client().await?;
    // 1 follows 400 accounts (longer than a join reads whole), in id order, so its list runs
    // newest (highest id) first; 2 follows every 7th of them and 900; every 11th of them and
    // 901 follow 3.
    let long: Vec<i64> = (100..500).collect();
    let imports: Vec<ImportFollowsRequest> = vec![ImportFollowsRequest {
        edges: long
            .iter()
            .map(|&f| ImportEdge {
                follower_id: 1,
                followee_id: f,
                followed_at: Some(prost_types::Timestamp { seconds: 1_700_000_000 + f, nanos: 0 }),
            })
            .collect(),
    }];
    c.import_follows(admin(futures::stream::iter(imports))).await?;
    let sevens: Vec<i64> = long.iter().copied().filter(|f| f % 7 == 0).collect();
    let elevens: Vec<i64> = long.iter().copied().filter(|f| f % 11 == 0).collect();
    for &f in sevens.iter().chain([900].iter()) {
        c.follow(FollowRequest { follower_id: 2, followee_id: f }).await?;
    }
    for &f in elevens.iter().chain([901].iter()) {
        c.follow(FollowRequest { follower_id: f, followee_id: 3 }).await?;
    }
    cache_join_lists(&m, url).await?;
    let before = m.relation.metrics().await?;

    let common = |user_id: i64, other_user_id: i64| {
        let c = c.clone();
        all_pages(move |page_token| {
            let mut c = c.clone();
            async move {
                let r = c.list_common_following(ListCommonFollowingRequest { user_id, other_user_id, page_size: 5, page_token }).await?.into_inner();
                Ok((r.accounts, r.next_page_token))
            }
        })
    };
    let descending = |mut v: Vec<i64>| {
        v.sort_unstable_by(|a, b| b.cmp(a));
        v
    };
    assert_eq!(common(1, 2).await?, descending(sevens.clone()), "long list against a short one, in 1's order");
    assert_eq!(common(2, 1).await?, descending(sevens.clone()), "short list against a long one, in 2's order");
    let familiar = all_pages(|page_token| {
        let mut c = c.clone();
        async move {
            let req = ListFamiliarFollowersRequest { viewer_id: 1, user_id: 3, page_size: 4, page_token };
            let r = c.list_familiar_followers(req).await?.into_inner();
            Ok((r.accounts, r.next_page_token))
        }
    })
    .await?;
    assert_eq!(familiar, descending(elevens.clone()), "a long viewer list against a short follower list, in the viewer's order");
    let after = m.relation.metrics().await?;
    let grew = |label: &str| metric_sum(&after, "sg_cache_requests_total", label) - metric_sum(&before, "sg_cache_requests_total", label);
    let (pages_common, pages_familiar) = (2 * sevens.len().div_ceil(5), elevens.len().div_ceil(4));
    assert!(grew("cache=\"following\",result=\"hit\",rpc=\"ListCommonFollowing\"") >= (2 * pages_common) as f64, "both sides from the cache");
    assert!(grew("cache=\"followers\",result=\"hit\",rpc=\"ListFamiliarFollowers\"") >= pages_familiar as f64, "the follower list from the cache");
    m.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_fill_after_misses_2_a_list_read_once_stays_uncached_and_its_second_miss_fills_it() -> anyhow::Result<()> {
    let m = Mesh::start_tuned(Backend::Postgres, &redis_url(), &kafka::brokers(), |c| c.fill_after_misses = 2).await?;
    let mut c = m.relation.client().await?;
    for f in 2..=4 {
        c.follow(FollowRequest { follower_id: f, followee_id: 1 }).await?;
    }
    m.settle(SETTLE).await?;
    let mut p = m.projection.projection().await?;
    let cache = cache_settings(&m.topics.relation);
    // The first miss of each list is answered from the database and only counted; the second
    // is answered alike and fills the list.
    for round in ["first", "second"] {
        let r = p.list_followers(pp::ListFollowersRequest { user_id: 1, page_size: 10, ..Default::default() }).await?.into_inner();
        assert_eq!(r.followers.iter().map(|e| e.user_id).collect::<Vec<_>>(), vec![4, 3, 2], "the {round} read of the followers");
        let r = c.list_following(ListFollowingRequest { user_id: 2, page_size: 10, page_token: String::new() }).await?.into_inner();
        assert_eq!(r.following.iter().map(|e| e.user_id).collect::<Vec<_>>(), vec![1], "the {round} read of the following list");
        if round == "first" {
            tokio::time::sleep(Duration::from_millis(500)).await;
            assert!(cached_list(&cache.url, &cache.key_prefix, false, 1).await?.is_none(), "a follower window read once is not filled");
            assert!(cached_list(&cache.url, &cache.key_prefix, true, 2).await?.is_none(), "a following list read once is not filled");
            let deferred = |t: &str, cache: &str| metric_sum(t, "sg_cache_fills_total", &format!("cache=\"{cache}\",result=\"deferred\""));
            assert_eq!(deferred(&m.projection.metrics().await?, "followers"), 1.0, "the follower window's first miss is counted");
            assert_eq!(deferred(&m.relation.metrics().await?, "following"), 1.0, "the following list's first miss is counted");
        }
    }
    for (following, user, want) in [(false, 1, vec![4, 3, 2]), (true, 2, vec![1])] {
        let filled = socialgraph_testkit::eventually(Duration::from_secs(10), "the list to be filled on its second miss", || async {
            cached_list(&cache.url, &cache.key_prefix, following, user).await
        })
        .await?;
        assert_eq!(filled.entries.iter().map(|e| e.0).collect::<Vec<_>>(), want, "the filled list equals the table");
    }
    m.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_of_misses_is_answered_from_the_database_and_every_list_filled_within_the_fill_budget() -> anyhow::Result<()> {
    const RATE: u32 = 1_000;
    let m = Mesh::start_tuned(Backend::Postgres, &redis_url(), &kafka::brokers(), |c| (c.fill_slots, c.fill_rows_per_sec) = (1, RATE)).await?;
    // 20 users follow the same 100 accounts: 20 following lists and 100 follower windows of
    // 2,000 entries each way, two seconds of either service's fill budget.
    let (users, followees): (Vec<i64>, Vec<i64>) = ((10..30).collect(), (1000..1100).collect());
    let edges = users.iter().flat_map(|&f| {
        followees.iter().map(move |&e| ImportEdge {
            follower_id: f,
            followee_id: e,
            followed_at: Some(socialgraph_domain::timestamp_from_ms(T0 + f * 1000 + e)),
        })
    });
    let mut c = m.relation.client().await?;
    c.import_follows(admin(futures::stream::iter([ImportFollowsRequest { edges: edges.collect() }]))).await?;
    m.settle(SETTLE).await?;
    let (following, followers) = (table_lists(&m.db, true, &users).await?, table_lists(&m.db, false, &followees).await?);
    let mut p = m.projection.projection().await?;

    // The burst: every read misses and is answered from the database, one slot or not. Each
    // service's side is timed from its own first read.
    let following_start = std::time::Instant::now();
    for &u in &users {
        let r = c.list_following(ListFollowingRequest { user_id: u, page_size: 1000, page_token: String::new() }).await?.into_inner();
        let got: Vec<(i64, i64)> =
            r.following.iter().map(|e| (e.user_id, e.followed_at.as_ref().map_or(0, socialgraph_domain::timestamp_to_ms))).collect();
        assert_eq!(got, following[&u], "user {u}'s following list, read during the burst");
    }
    // The budget cannot have written 2,000 entries within a second: fills are still pending.
    let pending = |text: &str, cache: &str| metric_sum(text, "sg_cache_fills_pending", &format!("cache=\"{cache}\""));
    let text = m.relation.metrics().await?;
    if following_start.elapsed() < Duration::from_secs(1) {
        assert!(pending(&text, "following") >= 1.0, "the following lists' fills are counted as pending while they run");
    }
    let followers_start = std::time::Instant::now();
    for &u in &followees {
        let r = p.list_followers(pp::ListFollowersRequest { user_id: u, page_size: 1000, ..Default::default() }).await?.into_inner();
        let got: Vec<(i64, i64)> =
            r.followers.iter().map(|e| (e.user_id, e.followed_at.as_ref().map_or(0, socialgraph_domain::timestamp_to_ms))).collect();
        assert_eq!(got, followers[&u], "user {u}'s followers, read during the burst");
    }
    // Both sides fill at once: each one's time is when its last list was seen cached.
    let cache = cache_settings(&m.topics.relation);
    let mut sides = [(true, &following, following_start, None), (false, &followers, followers_start, None)];
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while sides.iter().any(|s| s.3.is_none()) {
        anyhow::ensure!(std::time::Instant::now() < deadline, "lists of the burst still not filled after 60 s");
        for (is_following, lists, start, done) in &mut sides {
            if done.is_some() {
                continue;
            }
            let mut all = true;
            for (&u, want) in lists.iter() {
                match cached_list(&cache.url, &cache.key_prefix, *is_following, u).await? {
                    Some(filled) => assert_eq!(&filled.entries, want, "user {u}'s cached list equals the table"),
                    None => all = false,
                }
            }
            if all {
                *done = Some(start.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for (is_following, _, _, done) in sides {
        // 2,000 entries at 1,000 a second, after a burst of one part: paced.
        let took = done.unwrap_or_default();
        assert!(
            took >= Duration::from_millis(1_800),
            "2,000 entries filled in {took:?} (following lists: {is_following}) within a budget of {RATE}/s"
        );
    }
    for (svc, cache, lists) in [(&m.relation, "following", users.len()), (&m.projection, "followers", followees.len())] {
        // The counter moves just after the list is served.
        let fills = |text: &str, result: &str| metric_sum(text, "sg_cache_fills_total", &format!("cache=\"{cache}\",result=\"{result}\""));
        let text = socialgraph_testkit::eventually(Duration::from_secs(10), "every fill to be counted and none pending", || async {
            let text = svc.metrics().await?;
            Ok((fills(&text, "cached") >= lists as f64 && pending(&text, cache) == 0.0).then_some(text))
        })
        .await?;
        assert_eq!(fills(&text, "busy"), 0.0, "{cache}: the misses beyond the one slot waited for it");
        assert_eq!(fills(&text, "cached"), lists as f64, "{cache}: every list filled once");
    }
    m.stop().await
}
