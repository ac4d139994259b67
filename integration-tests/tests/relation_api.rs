//! RelationService reads, paging, limits and bad input, on real databases.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use rand::{Rng, SeedableRng, rngs::StdRng};
use socialgraph_domain::{timestamp_from_ms, timestamp_to_ms};
use socialgraph_integration_tests::{admin, relation_config, relation_on, spawn_relation};
use socialgraph_proto::relation::v1::relation_service_client::RelationServiceClient;
use socialgraph_proto::relation::v1::*;
use socialgraph_testkit::Backend;
use tonic::Code;
use tonic::transport::Channel;
use tonic_types::StatusExt;

type Client = RelationServiceClient<Channel>;

async fn import(client: &mut Client, edges: &[(i64, i64, i64)]) -> anyhow::Result<ImportFollowsResponse> {
    let msgs: Vec<ImportFollowsRequest> = edges
        .chunks(500)
        .map(|c| ImportFollowsRequest {
            edges: c.iter().map(|&(f, e, at)| ImportEdge { follower_id: f, followee_id: e, followed_at: Some(timestamp_from_ms(at)) }).collect(),
        })
        .collect();
    Ok(client.import_follows(admin(futures::stream::iter(msgs))).await?.into_inner())
}

async fn walk_following(client: &mut Client, user: i64, page_size: i32) -> anyhow::Result<Vec<i64>> {
    let (mut out, mut token) = (Vec::new(), String::new());
    loop {
        let r = client.list_following(ListFollowingRequest { user_id: user, page_size, page_token: token }).await?.into_inner();
        out.extend(r.following.iter().map(|e| e.user_id));
        if r.next_page_token.is_empty() {
            return Ok(out);
        }
        token = r.next_page_token;
    }
}

async fn walk<F, Fut>(mut page: F) -> anyhow::Result<Vec<i64>>
where
    F: FnMut(String) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<(Vec<FollowEntry>, String)>>,
{
    let (mut out, mut token) = (Vec::new(), String::new());
    loop {
        let (entries, next) = page(token).await?;
        out.extend(entries.iter().map(|e| e.user_id));
        if next.is_empty() {
            return Ok(out);
        }
        token = next;
    }
}

/// Newest first by (followed_at, peer) descending.
fn newest_first(mut v: Vec<(i64, i64)>) -> Vec<i64> {
    v.sort_by(|a, b| b.cmp(a));
    v.into_iter().map(|(_, peer)| peer).collect()
}

async fn reads_match_brute_force(backend: Backend) -> anyhow::Result<()> {
    let (db, svc, topic) = relation_on(backend, |_| {}).await?;
    let mut client = svc.client().await?;
    let mut rng = StdRng::seed_from_u64(42);
    // Few distinct timestamps, so ties between follow times are common.
    let edges: Vec<(i64, i64, i64)> =
        (0..1500).map(|_| (rng.random_range(1..=60), rng.random_range(1..=60), 1_700_000_000_000 + rng.random_range(0..40))).collect();
    let summary = import(&mut client, &edges).await?;

    let mut truth: BTreeMap<(i64, i64), i64> = BTreeMap::new();
    let (mut loops, mut dups) = (0, 0);
    for &(f, e, at) in &edges {
        if f == e {
            loops += 1;
        } else if let std::collections::btree_map::Entry::Vacant(e) = truth.entry((f, e)) {
            e.insert(at);
        } else {
            dups += 1;
        }
    }
    assert_eq!(summary.received, 1500);
    assert_eq!(summary.skipped_self_loops, loops);
    assert_eq!(summary.skipped_duplicates, dups);
    assert_eq!(summary.imported, truth.len() as i64);
    // Importing again changes nothing.
    let again = import(&mut client, &edges).await?;
    assert_eq!((again.imported, again.skipped_duplicates), (0, 1500 - loops));

    let following = |u: i64| -> Vec<(i64, i64)> { truth.iter().filter(|((f, _), _)| *f == u).map(|((_, e), at)| (*at, *e)).collect() };
    for u in 1..=60 {
        assert_eq!(walk_following(&mut client, u, 7).await?, newest_first(following(u)), "following list of {u}");
        let count = client.count_following(CountFollowingRequest { user_id: u }).await?.into_inner().count;
        assert_eq!(count, following(u).len() as i64);
    }
    for _ in 0..30 {
        let (a, b) = (rng.random_range(1..=60), rng.random_range(1..=60));
        let b_follows: BTreeSet<i64> = following(b).into_iter().map(|(_, e)| e).collect();
        let common = newest_first(following(a).into_iter().filter(|(_, e)| b_follows.contains(e)).collect());
        let got = walk(|t| {
            let mut c = client.clone();
            async move {
                let r = c
                    .list_common_following(ListCommonFollowingRequest { user_id: a, other_user_id: b, page_size: 3, page_token: t })
                    .await?
                    .into_inner();
                Ok((r.accounts, r.next_page_token))
            }
        })
        .await?;
        assert_eq!(got, common, "common following of {a} and {b}");

        let familiar = newest_first(following(a).into_iter().filter(|(_, x)| truth.contains_key(&(*x, b))).collect());
        let got = walk(|t| {
            let mut c = client.clone();
            async move {
                let r = c
                    .list_familiar_followers(ListFamiliarFollowersRequest { viewer_id: a, user_id: b, page_size: 4, page_token: t })
                    .await?
                    .into_inner();
                Ok((r.accounts, r.next_page_token))
            }
        })
        .await?;
        assert_eq!(got, familiar, "familiar followers of {b} for viewer {a}");
    }

    // Relationships from the caches, then from the database alone (an instance without the
    // cache Redis: both directions of the batched edge read), each against the truth.
    let mut plain_config = relation_config(&db.url, &topic);
    plain_config.cache.url = String::new();
    let plain = spawn_relation(plain_config).await?;
    let others: Vec<i64> = (1..=60).chain([61, 5, 7]).collect();
    for (source, mut c) in [("cache", client.clone()), ("database", plain.client().await?)] {
        for user in [5, 7] {
            let rels = c.batch_get_relationships(BatchGetRelationshipsRequest { user_id: user, other_user_ids: others.clone() }).await?.into_inner();
            assert_eq!(rels.relationships.len(), others.len());
            for (o, r) in others.iter().zip(&rels.relationships) {
                assert_eq!(r.other_user_id, *o, "request order ({source})");
                assert_eq!(r.following, truth.contains_key(&(user, *o)), "{user} follows {o} ({source})");
                assert_eq!(r.followed_by, truth.contains_key(&(*o, user)), "{o} follows {user} ({source})");
                assert_eq!(r.followed_at.as_ref().map(timestamp_to_ms), truth.get(&(user, *o)).copied(), "{user} → {o} ({source})");
            }
        }
    }
    plain.stop().await?;

    // ScanEdges walks the whole table in key order, resumable from its cursor.
    let mut stream = client.scan_edges(admin(ScanEdgesRequest { page_size: 100, limit: 300, ..Default::default() })).await?.into_inner();
    let mut scanned = Vec::new();
    let mut cursor = None;
    while let Some(page) = stream.message().await? {
        scanned.extend(page.edges.iter().map(|e| (e.follower_id, e.followee_id)));
        cursor = page.cursor;
    }
    assert_eq!(scanned.len(), 300);
    let mut rest = client.scan_edges(admin(ScanEdgesRequest { after: cursor, ..Default::default() })).await?.into_inner();
    while let Some(page) = rest.message().await? {
        scanned.extend(page.edges.iter().map(|e| (e.follower_id, e.followee_id)));
    }
    assert_eq!(scanned, truth.keys().copied().collect::<Vec<_>>(), "scan = table in primary-key order");
    svc.stop().await?;
    db.drop_db().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reads_match_brute_force_on_postgres() -> anyhow::Result<()> {
    reads_match_brute_force(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reads_match_brute_force_on_mariadb() -> anyhow::Result<()> {
    reads_match_brute_force(Backend::MariaDb).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reads_match_brute_force_on_sqlite() -> anyhow::Result<()> {
    reads_match_brute_force(Backend::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refollow_moves_edge_to_top_of_list_and_bumps_version() -> anyhow::Result<()> {
    let (db, svc, _) = relation_on(Backend::Postgres, |_| {}).await?;
    let mut c = svc.client().await?;
    for b in [2, 3, 4] {
        c.follow(FollowRequest { follower_id: 1, followee_id: b }).await?;
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    assert_eq!(walk_following(&mut c, 1, 10).await?, [4, 3, 2]);
    let u = c.unfollow(UnfollowRequest { follower_id: 1, followee_id: 2 }).await?.into_inner();
    assert!(u.changed);
    assert_eq!(u.version, 2);
    assert!(!c.unfollow(UnfollowRequest { follower_id: 1, followee_id: 2 }).await?.into_inner().changed);
    assert_eq!(walk_following(&mut c, 1, 10).await?, [4, 3]);
    let f = c.follow(FollowRequest { follower_id: 1, followee_id: 2 }).await?.into_inner();
    assert!(f.changed);
    assert_eq!(f.version, 3);
    assert_eq!(walk_following(&mut c, 1, 10).await?, [2, 4, 3], "re-follow moves the edge to the top");
    let never = c.unfollow(UnfollowRequest { follower_id: 1, followee_id: 99 }).await?.into_inner();
    assert_eq!((never.changed, never.version), (false, 0));
    let rel = c.get_relationship(GetRelationshipRequest { user_id: 2, other_user_id: 1 }).await?.into_inner().relationship.unwrap_or_default();
    assert!(!rel.following && rel.followed_by);
    svc.stop().await?;
    db.drop_db().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn paging_while_follows_arrive_yields_each_stable_edge_exactly_once() -> anyhow::Result<()> {
    let (db, svc, _) = relation_on(Backend::Postgres, |_| {}).await?;
    let mut client = svc.client().await?;
    let now = socialgraph_domain::timestamp_to_ms(&prost_types::Timestamp::from(std::time::SystemTime::now()));
    // 3,000 stable edges with follow times spread around "now" (every 3 share a time), so the
    // churn below lands in the middle of the list while it is walked.
    let stable: Vec<(i64, i64, i64)> = (0..3000).map(|i| (1, 10_000 + i, now - 1_500_000 + (i / 3) * 1000)).collect();
    import(&mut client, &stable).await?;

    let stop = tokio_util::sync::CancellationToken::new();
    let churn = {
        let (mut c, stop) = (svc.client().await?, stop.clone());
        tokio::spawn(async move {
            let mut n = 0_i64;
            while !stop.is_cancelled() {
                let peer = 50_000 + n % 300;
                c.follow(FollowRequest { follower_id: 1, followee_id: peer }).await?;
                if n % 2 == 0 {
                    c.unfollow(UnfollowRequest { follower_id: 1, followee_id: peer }).await?;
                }
                n += 1;
            }
            anyhow::Ok(n)
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let r = client.list_following(ListFollowingRequest { user_id: 1, page_size: 97, page_token: token }).await?.into_inner();
        seen.extend(r.following.iter().map(|e| e.user_id));
        // Long enough between pages for the churn to run a few rounds on a loaded machine.
        tokio::time::sleep(Duration::from_millis(25)).await;
        if r.next_page_token.is_empty() {
            break;
        }
        token = r.next_page_token;
    }
    stop.cancel();
    let churned = churn.await??;
    assert!(churned > 10, "the churn ran while paging ({churned} rounds)");
    let mut counts: HashMap<i64, usize> = HashMap::new();
    for id in &seen {
        *counts.entry(*id).or_default() += 1;
    }
    assert!(counts.values().all(|&n| n == 1), "no entry repeats");
    for (_, id, _) in &stable {
        assert_eq!(counts.get(id), Some(&1), "stable edge {id} seen exactly once");
    }
    svc.stop().await?;
    db.drop_db().await
}

fn reason(status: &tonic::Status) -> String {
    status.get_error_details().error_info().map(|i| i.reason.clone()).unwrap_or_default()
}

fn fields(status: &tonic::Status) -> Vec<String> {
    status.get_error_details().bad_request().map(|b| b.field_violations.iter().map(|v| v.field.clone()).collect()).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_input_gets_invalid_argument_with_field_violations() -> anyhow::Result<()> {
    let (db, svc, _) = relation_on(Backend::Postgres, |_| {}).await?;
    let mut c = svc.client().await?;

    let e = c.follow(FollowRequest { follower_id: 3, followee_id: 3 }).await.unwrap_err();
    assert_eq!((e.code(), reason(&e)), (Code::InvalidArgument, "SELF_FOLLOW".into()));
    assert_eq!(fields(&e), ["followee_id"]);
    let e = c.follow(FollowRequest { follower_id: 0, followee_id: -4 }).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert_eq!(fields(&e), ["follower_id", "followee_id"]);
    let e = c.unfollow(UnfollowRequest { follower_id: -1, followee_id: 2 }).await.unwrap_err();
    assert_eq!(fields(&e), ["follower_id"]);

    let e = c.list_following(ListFollowingRequest { user_id: 1, page_size: 1001, page_token: String::new() }).await.unwrap_err();
    assert_eq!((e.code(), fields(&e)), (Code::InvalidArgument, vec!["page_size".to_owned()]));
    let e = c.list_following(ListFollowingRequest { user_id: 0, page_size: -1, page_token: String::new() }).await.unwrap_err();
    assert_eq!(fields(&e), ["user_id", "page_size"]);
    let e = c
        .list_common_following(ListCommonFollowingRequest { user_id: 1, other_user_id: 0, page_size: 0, page_token: String::new() })
        .await
        .unwrap_err();
    assert_eq!(fields(&e), ["other_user_id"]);
    let e = c
        .list_familiar_followers(ListFamiliarFollowersRequest { viewer_id: 0, user_id: 1, page_size: 0, page_token: String::new() })
        .await
        .unwrap_err();
    assert_eq!(fields(&e), ["viewer_id"]);

    // Page tokens: edited, foreign, or garbage.
    for b in 2..6 {
        c.follow(FollowRequest { follower_id: 1, followee_id: b }).await?;
    }
    let token = c.list_following(ListFollowingRequest { user_id: 1, page_size: 2, page_token: String::new() }).await?.into_inner().next_page_token;
    assert!(!token.is_empty());
    let mut edited = token.clone().into_bytes();
    edited[5] = if edited[5] == b'A' { b'B' } else { b'A' };
    for bad in [String::from_utf8(edited)?, "garbage!".to_owned(), token[..token.len() - 1].to_owned()] {
        let e = c.list_following(ListFollowingRequest { user_id: 1, page_size: 2, page_token: bad }).await.unwrap_err();
        assert_eq!((e.code(), reason(&e)), (Code::InvalidArgument, "BAD_PAGE_TOKEN".into()));
        assert_eq!(fields(&e), ["page_token"]);
    }
    let e = c.list_following(ListFollowingRequest { user_id: 2, page_size: 2, page_token: token.clone() }).await.unwrap_err();
    assert_eq!(reason(&e), "BAD_PAGE_TOKEN", "a token of another user's list is refused");

    let e = c.batch_get_relationships(BatchGetRelationshipsRequest { user_id: 1, other_user_ids: vec![1; 1001] }).await.unwrap_err();
    assert_eq!((e.code(), fields(&e)), (Code::InvalidArgument, vec!["other_user_ids".to_owned()]));
    let e = c.batch_get_relationships(BatchGetRelationshipsRequest { user_id: 1, other_user_ids: vec![] }).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = c.batch_get_relationships(BatchGetRelationshipsRequest { user_id: 1, other_user_ids: vec![2, 0] }).await.unwrap_err();
    assert_eq!(fields(&e), ["other_user_ids[1]"]);
    let e = c.get_relationship(GetRelationshipRequest { user_id: 1, other_user_id: 0 }).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = c.count_following(CountFollowingRequest { user_id: 0 }).await.unwrap_err();
    assert_eq!(fields(&e), ["user_id"]);

    // Admin RPCs: bad edges refused whole; credentials checked.
    let bad_import = ImportFollowsRequest { edges: vec![ImportEdge { follower_id: 5, followee_id: 0, followed_at: None }] };
    let e = c.import_follows(admin(futures::stream::iter([bad_import.clone()]))).await.unwrap_err();
    assert_eq!((e.code(), fields(&e)), (Code::InvalidArgument, vec!["edges[0].followee_id".to_owned()]));
    let e = c.import_follows(futures::stream::iter([bad_import])).await.unwrap_err();
    assert_eq!((e.code(), reason(&e)), (Code::Unauthenticated, "CREDENTIALS_MISSING".to_owned()));
    // Follow times outside google.protobuf.Timestamp's range are refused, not stored.
    let at = |seconds, nanos| Some(prost_types::Timestamp { seconds, nanos });
    let bad_times = ImportFollowsRequest {
        edges: vec![
            ImportEdge { follower_id: 5, followee_id: 6, followed_at: at(i64::MAX, 0) },
            ImportEdge { follower_id: 5, followee_id: 7, followed_at: at(-62_135_596_801, 0) },
            ImportEdge { follower_id: 5, followee_id: 8, followed_at: at(0, 2_000_000_000) },
            ImportEdge { follower_id: 5, followee_id: 9, followed_at: at(1_600_000_000, 5) },
        ],
    };
    let e = c.import_follows(admin(futures::stream::iter([bad_times]))).await.unwrap_err();
    let expected = ["edges[0].followed_at", "edges[1].followed_at", "edges[2].followed_at"];
    assert_eq!((e.code(), fields(&e)), (Code::InvalidArgument, expected.map(str::to_owned).to_vec()));
    // The bearer scheme is case-insensitive (RFC 7235), the token is not.
    let mut lower = tonic::Request::new(ScanEdgesRequest { page_size: 1, ..Default::default() });
    lower.metadata_mut().insert("authorization", format!("bearer {}", socialgraph_integration_tests::ADMIN_TOKEN).parse()?);
    let mut stream = c.scan_edges(lower).await?.into_inner();
    while stream.message().await?.is_some() {}
    let mut wrong = tonic::Request::new(ScanEdgesRequest::default());
    wrong.metadata_mut().insert("authorization", format!("Bearer {}", socialgraph_integration_tests::ADMIN_TOKEN.to_uppercase()).parse()?);
    let e = c.scan_edges(wrong).await.unwrap_err();
    assert_eq!((e.code(), reason(&e)), (Code::Unauthenticated, "CREDENTIALS_INVALID".to_owned()));
    let e = c.scan_edges(admin(ScanEdgesRequest { page_size: 10_001, ..Default::default() })).await.unwrap_err();
    assert_eq!((e.code(), fields(&e)), (Code::InvalidArgument, vec!["page_size".to_owned()]));
    let e = c.scan_edges(ScanEdgesRequest::default()).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    svc.stop().await?;
    db.drop_db().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn admin_rpcs_are_refused_when_no_admin_token_is_configured() -> anyhow::Result<()> {
    let (db, svc, _) = relation_on(Backend::Postgres, |c| c.auth.admin_token = None).await?;
    // No token can be verified: UNAUTHENTICATED, with or without credentials.
    let e = svc.client().await?.scan_edges(admin(ScanEdgesRequest::default())).await.unwrap_err();
    assert_eq!((e.code(), reason(&e)), (Code::Unauthenticated, "ADMIN_RPCS_DISABLED".to_owned()));
    let e = svc.client().await?.scan_edges(ScanEdgesRequest::default()).await.unwrap_err();
    assert_eq!((e.code(), reason(&e)), (Code::Unauthenticated, "ADMIN_RPCS_DISABLED".to_owned()));
    svc.stop().await?;
    db.drop_db().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn following_cap_trips_at_its_number() -> anyhow::Result<()> {
    let (db, svc, _) = relation_on(Backend::Postgres, |c| c.limits.following_cap = 5).await?;
    let mut c = svc.client().await?;
    for b in 2..=6 {
        assert!(c.follow(FollowRequest { follower_id: 1, followee_id: b }).await?.into_inner().changed);
    }
    let e = c.follow(FollowRequest { follower_id: 1, followee_id: 7 }).await.unwrap_err();
    assert_eq!((e.code(), reason(&e)), (Code::FailedPrecondition, "FOLLOWING_LIMIT".into()));
    assert_eq!(e.get_error_details().error_info().map(|i| i.metadata["limit"].clone()), Some("5".into()));
    // A repeat of an existing follow is still fine, and unfollowing makes room.
    assert!(!c.follow(FollowRequest { follower_id: 1, followee_id: 6 }).await?.into_inner().changed);
    c.unfollow(UnfollowRequest { follower_id: 1, followee_id: 2 }).await?;
    assert!(c.follow(FollowRequest { follower_id: 1, followee_id: 7 }).await?.into_inner().changed);
    svc.stop().await?;
    db.drop_db().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn follow_rate_limit_trips_at_the_burst_with_retry_info() -> anyhow::Result<()> {
    let (db, svc, _) = relation_on(Backend::Postgres, |c| {
        c.limits.follow_burst = 3;
        c.limits.follow_refill_per_day = 400;
    })
    .await?;
    let mut c = svc.client().await?;
    for b in 2..=4 {
        c.follow(FollowRequest { follower_id: 1, followee_id: b }).await?;
    }
    // Repeats take no token.
    c.follow(FollowRequest { follower_id: 1, followee_id: 2 }).await?;
    let e = c.follow(FollowRequest { follower_id: 1, followee_id: 5 }).await.unwrap_err();
    assert_eq!((e.code(), reason(&e)), (Code::ResourceExhausted, "RATE_LIMITED".into()));
    let retry = e.get_error_details().retry_info().and_then(|r| r.retry_delay).unwrap_or_default();
    // 400 a day is one token every 216 s.
    assert!(retry > Duration::from_secs(200) && retry <= Duration::from_secs(216), "retry after {retry:?}");
    // Other followers have their own bucket.
    c.follow(FollowRequest { follower_id: 2, followee_id: 5 }).await?;
    svc.stop().await?;
    db.drop_db().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_of_a_thousand_bad_ids_gets_a_short_invalid_argument() -> anyhow::Result<()> {
    let (db, svc, _topic) = relation_on(Backend::Postgres, |_| {}).await?;
    let mut client = svc.client().await?;
    let e = client
        .batch_get_relationships(BatchGetRelationshipsRequest { user_id: 1, other_user_ids: vec![i64::MIN; 1000] })
        .await
        .expect_err("every id is bad");
    assert_eq!(e.code(), Code::InvalidArgument);
    let violations = e.get_error_details().bad_request().map(|b| b.field_violations.len());
    assert_eq!(violations, Some(10), "at most ten violations are listed");
    assert!(e.message().ends_with("and 990 more"), "the message counts the rest: {}", e.message());
    // Trailers of common clients are limited to 16 KiB (grpc-core's default).
    assert!(e.message().len() + e.details().len() < 4096, "{} + {} bytes", e.message().len(), e.details().len());
    svc.stop().await?;
    db.drop_db().await
}
