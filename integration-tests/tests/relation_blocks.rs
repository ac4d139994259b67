//! Blocks, mutes and removed followers through the whole mesh, on PostgreSQL and MariaDB: the
//! edges a block ends, the follows it refuses, and every derived view (follower table,
//! counters) exact afterwards, also under concurrency with a consumer killed mid-way.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use rand::{Rng, SeedableRng, rngs::StdRng};
use sea_orm::{ConnectionTrait, Statement};
use socialgraph_integration_tests::model::served_users;
use socialgraph_integration_tests::*;
use socialgraph_proto::projection::v1::ListFollowersRequest;
use socialgraph_proto::relation::v1::relation_service_client::RelationServiceClient;
use socialgraph_proto::relation::v1::*;
use socialgraph_testkit::{Backend, kafka};
use tonic::Code;
use tonic::transport::Channel;
use tonic_types::StatusExt;

const SETTLE: Duration = Duration::from_secs(240);

async fn follow(c: &mut RelationServiceClient<Channel>, a: i64, b: i64) -> Result<FollowResponse, tonic::Status> {
    c.follow(FollowRequest { follower_id: a, followee_id: b }).await.map(tonic::Response::into_inner)
}

async fn block(c: &mut RelationServiceClient<Channel>, a: i64, b: i64) -> anyhow::Result<BlockResponse> {
    Ok(c.block(BlockRequest { blocker_id: a, blocked_id: b }).await?.into_inner())
}

async fn unblock(c: &mut RelationServiceClient<Channel>, a: i64, b: i64) -> anyhow::Result<bool> {
    Ok(c.unblock(UnblockRequest { blocker_id: a, blocked_id: b }).await?.into_inner().changed)
}

async fn relationship(c: &mut RelationServiceClient<Channel>, a: i64, b: i64) -> anyhow::Result<Relationship> {
    let r = c.get_relationship(GetRelationshipRequest { user_id: a, other_user_id: b }).await?.into_inner();
    r.relationship.ok_or_else(|| anyhow::anyhow!("no relationship in the answer"))
}

async fn assert_views_exact(m: &Mesh, users: &[i64]) -> anyhow::Result<()> {
    m.assert_views_exact(users, SETTLE).await
}

/// Rows of `following` that are "following" although one of the pair blocks the other, and
/// rows whose `blocked` flag disagrees with the `block` table.
async fn block_violations(m: &Mesh) -> anyhow::Result<(Vec<(i64, i64)>, Vec<(i64, i64)>)> {
    let backend = m.db.conn.get_database_backend();
    let q = |sql: &str| Statement::from_string(backend, sql.to_owned());
    let pairs = |rows: Vec<sea_orm::QueryResult>| -> anyhow::Result<Vec<(i64, i64)>> {
        rows.iter().map(|r| Ok((r.try_get_by_index(0)?, r.try_get_by_index(1)?))).collect()
    };
    let blocked_edges =
        m.db.conn
            .query_all_raw(q("SELECT f.follower_id, f.followee_id FROM following f JOIN block b ON \
             (b.blocker_id = f.follower_id AND b.blocked_id = f.followee_id) OR (b.blocker_id = f.followee_id AND b.blocked_id = f.follower_id) \
             WHERE f.state = 1"))
            .await?;
    let bad_flags =
        m.db.conn
            .query_all_raw(q("SELECT f.follower_id, f.followee_id FROM following f WHERE f.blocked <> EXISTS (SELECT 1 FROM block b WHERE \
             (b.blocker_id = f.follower_id AND b.blocked_id = f.followee_id) OR (b.blocker_id = f.followee_id AND b.blocked_id = f.follower_id))"))
            .await?;
    Ok((pairs(blocked_edges)?, pairs(bad_flags)?))
}

async fn a_block_between_mutual_followers(backend: Backend) -> anyhow::Result<()> {
    let m = Mesh::start_on(backend, &socialgraph_testkit::redis_url(), &kafka::brokers()).await?;
    let mut c = m.relation.client().await?;
    for (a, b) in [(1, 2), (2, 1), (3, 1), (1, 4), (2, 5), (3, 2)] {
        follow(&mut c, a, b).await?;
    }
    assert_views_exact(&m, &[1, 2, 3, 4, 5]).await?;

    let r = block(&mut c, 1, 2).await?;
    assert_eq!((r.changed, r.edges_removed), (true, 2), "the block ends both follows");
    let again = block(&mut c, 1, 2).await?;
    assert_eq!((again.changed, again.edges_removed), (false, 0), "a repeated block changes nothing");
    let rel = relationship(&mut c, 1, 2).await?;
    assert_eq!((rel.following, rel.followed_by, rel.blocking, rel.blocked_by), (false, false, true, false));
    let rel = relationship(&mut c, 2, 1).await?;
    assert_eq!((rel.following, rel.followed_by, rel.blocking, rel.blocked_by), (false, false, false, true));
    for (a, b) in [(2, 1), (1, 2)] {
        let e = follow(&mut c, a, b).await.expect_err("a follow across a block is refused");
        assert_eq!((e.code(), reason(&e)), (Code::FailedPrecondition, "BLOCKED".to_owned()), "{a} → {b}");
    }
    // Exact values, never negative: 1 keeps 1 → 4 and 3 → 1; 2 keeps 2 → 5 and 3 → 2.
    assert_views_exact(&m, &[1, 2, 3, 4, 5]).await?;
    let served = served_users(&mut m.counter.counter().await?, &[1, 2]).await?;
    assert_eq!((served[&1].0, served[&1].1, served[&2].0, served[&2].1), (1, 1, 1, 1));
    let followers: Vec<i64> = m
        .projection
        .projection()
        .await?
        .list_followers(ListFollowersRequest { user_id: 1, ..Default::default() })
        .await?
        .into_inner()
        .followers
        .iter()
        .map(|e| e.user_id)
        .collect();
    assert_eq!(followers, [3], "the blocked follower left user 1's follower list");

    // A block both ways needs both lifted; unblocking restores no edge.
    assert!(block(&mut c, 2, 1).await?.changed);
    assert!(unblock(&mut c, 1, 2).await?);
    assert!(!unblock(&mut c, 1, 2).await?, "a repeated unblock changes nothing");
    let e = follow(&mut c, 1, 2).await.expect_err("2 still blocks 1");
    assert_eq!(reason(&e), "BLOCKED");
    assert!(unblock(&mut c, 2, 1).await?);
    let rel = relationship(&mut c, 1, 2).await?;
    assert_eq!((rel.following, rel.followed_by, rel.blocking, rel.blocked_by), (false, false, false, false), "unblock restores nothing");
    let f = follow(&mut c, 2, 1).await?;
    assert_eq!((f.changed, f.version), (true, 3), "followed, unfollowed by the block, followed again");
    assert_eq!(block_violations(&m).await?, (vec![], vec![]));
    assert_views_exact(&m, &[1, 2, 3, 4, 5]).await?;
    m.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_block_between_mutual_followers_ends_both_edges_with_exact_counts_on_postgres() -> anyhow::Result<()> {
    a_block_between_mutual_followers(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_block_between_mutual_followers_ends_both_edges_with_exact_counts_on_mariadb() -> anyhow::Result<()> {
    a_block_between_mutual_followers(Backend::MariaDb).await
}

async fn removing_500_followers(backend: Backend) -> anyhow::Result<()> {
    let m = Mesh::start_on(backend, &socialgraph_testkit::redis_url(), &kafka::brokers()).await?;
    let mut c = m.relation.client().await?;
    let followers: Vec<i64> = (2..=501).collect();
    let edges: Vec<ImportEdge> = followers.iter().map(|&f| ImportEdge { follower_id: f, followee_id: 1, followed_at: None }).collect();
    let imported = c.import_follows(admin(futures::stream::iter([ImportFollowsRequest { edges }]))).await?.into_inner();
    assert_eq!(imported.imported, 500);
    // 1 also follows 100 of them, which the removals must not touch.
    for f in 2..=101 {
        follow(&mut c, 1, f).await?;
    }
    let mut tasks = Vec::new();
    for chunk in followers.chunks(125) {
        let (mut c, chunk) = (m.relation.client().await?, chunk.to_vec());
        tasks.push(tokio::spawn(async move {
            let mut changed = 0;
            for f in chunk {
                changed += i32::from(c.remove_follower(RemoveFollowerRequest { user_id: 1, follower_id: f }).await?.into_inner().changed);
            }
            anyhow::Ok(changed)
        }));
    }
    let mut removed = 0;
    for t in tasks {
        removed += t.await??;
    }
    assert_eq!(removed, 500);
    let repeat = c.remove_follower(RemoveFollowerRequest { user_id: 1, follower_id: 2 }).await?.into_inner();
    assert!(!repeat.changed, "removing a removed follower changes nothing");
    let mut users = vec![1];
    users.extend(&followers);
    assert_views_exact(&m, &users).await?;
    let served = served_users(&mut m.counter.counter().await?, &[1, 2, 150]).await?;
    assert_eq!((served[&1].0, served[&1].1), (100, 0), "user 1: 100 followings, no followers");
    assert_eq!((served[&2].0, served[&2].1, served[&150].0), (0, 1, 0));
    m.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn removing_500_followers_leaves_counts_equal_to_lists_on_postgres() -> anyhow::Result<()> {
    removing_500_followers(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn removing_500_followers_leaves_counts_equal_to_lists_on_mariadb() -> anyhow::Result<()> {
    removing_500_followers(Backend::MariaDb).await
}

/// Follows, unfollows, blocks, unblocks, removals and mutes among `users` from 8 callers;
/// returns how many follows a block refused.
async fn mixed_workload(relation: std::net::SocketAddr, ops: usize, users: i64, seed: u64) -> anyhow::Result<usize> {
    let mut tasks = Vec::new();
    for worker in 0..8 {
        let mut c = RelationServiceClient::connect(format!("http://{relation}")).await?;
        tasks.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(seed * 100 + worker);
            let mut refused = 0;
            for _ in 0..ops / 8 {
                let a = rng.random_range(1..=users);
                let b = (a + rng.random_range(1..users) - 1) % users + 1;
                match rng.random_range(0..100) {
                    0..45 => match follow(&mut c, a, b).await {
                        Ok(_) => {}
                        Err(e) if reason(&e) == "BLOCKED" => refused += 1,
                        Err(e) => return Err(e.into()),
                    },
                    45..65 => drop(c.unfollow(UnfollowRequest { follower_id: a, followee_id: b }).await?),
                    65..77 => drop(block(&mut c, a, b).await?),
                    77..89 => drop(unblock(&mut c, a, b).await?),
                    89..95 => drop(c.remove_follower(RemoveFollowerRequest { user_id: a, follower_id: b }).await?),
                    _ => drop(c.mute(MuteRequest { muter_id: a, muted_id: b }).await?),
                }
            }
            anyhow::Ok(refused)
        }));
    }
    let mut refused = 0;
    for t in tasks {
        refused += t.await??;
    }
    Ok(refused)
}

async fn concurrent_blocks(backend: Backend) -> anyhow::Result<()> {
    const USERS: i64 = 12;
    let mut m = Mesh::start_on(backend, &socialgraph_testkit::redis_url(), &kafka::brokers()).await?;
    let users: Vec<i64> = (1..=USERS).collect();
    let workload = tokio::spawn(mixed_workload(m.relation.addr, 3000, USERS, 7));
    // Kill counter-svc mid-workload without any shutdown, and start it again.
    tokio::time::sleep(Duration::from_secs(3)).await;
    m.counter.kill().await;
    m.counter = spawn_counter(m.counter_config()).await?;
    let refused = workload.await??;
    assert!(refused > 0, "some follows met a block");
    assert_eq!(block_violations(&m).await?, (vec![], vec![]), "no edge stands across a block and every flag agrees with the blocks");
    assert_views_exact(&m, &users).await?;

    m.assert_rebuild_and_replay_change_nothing(&users, SETTLE).await?;
    m.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_follows_blocks_and_removals_leave_no_edge_across_a_block_on_postgres() -> anyhow::Result<()> {
    concurrent_blocks(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_follows_blocks_and_removals_leave_no_edge_across_a_block_on_mariadb() -> anyhow::Result<()> {
    concurrent_blocks(Backend::MariaDb).await
}

async fn walk_restrictions(c: &mut RelationServiceClient<Channel>, blocks: bool, user_id: i64, page_size: i32) -> anyhow::Result<Vec<i64>> {
    let (mut out, mut page_token) = (Vec::new(), String::new());
    loop {
        let (accounts, next) = if blocks {
            let r = c.list_blocks(ListBlocksRequest { user_id, page_size, page_token }).await?.into_inner();
            (r.accounts, r.next_page_token)
        } else {
            let r = c.list_mutes(ListMutesRequest { user_id, page_size, page_token }).await?.into_inner();
            (r.accounts, r.next_page_token)
        };
        out.extend(accounts.iter().map(|a| a.user_id));
        if next.is_empty() {
            return Ok(out);
        }
        page_token = next;
    }
}

async fn mutes_and_block_lists(backend: Backend) -> anyhow::Result<()> {
    let (db, relation, _) = relation_on(backend, |_| {}).await?;
    let mut c = relation.client().await?;
    follow(&mut c, 1, 2).await?;
    for other in 2..=8 {
        assert!(c.mute(MuteRequest { muter_id: 1, muted_id: other }).await?.into_inner().changed);
        block(&mut c, 20, other + 20).await?;
    }
    assert!(!c.mute(MuteRequest { muter_id: 1, muted_id: 2 }).await?.into_inner().changed, "a repeated mute changes nothing");
    let rel = relationship(&mut c, 1, 2).await?;
    assert_eq!((rel.following, rel.muting, rel.blocking), (true, true, false), "a mute changes no edge");
    let newest_first: Vec<i64> = (2..=8).rev().collect();
    assert_eq!(walk_restrictions(&mut c, false, 1, 3).await?, newest_first);
    assert_eq!(walk_restrictions(&mut c, true, 20, 2).await?, newest_first.iter().map(|u| u + 20).collect::<Vec<_>>());
    // A token of one list is refused by another.
    let page = c.list_mutes(ListMutesRequest { user_id: 1, page_size: 2, page_token: String::new() }).await?.into_inner();
    let e = c.list_blocks(ListBlocksRequest { user_id: 1, page_size: 2, page_token: page.next_page_token }).await.unwrap_err();
    assert_eq!((e.code(), reason(&e)), (Code::InvalidArgument, "BAD_PAGE_TOKEN".to_owned()));
    assert!(c.unmute(UnmuteRequest { muter_id: 1, muted_id: 2 }).await?.into_inner().changed);
    assert!(!c.unmute(UnmuteRequest { muter_id: 1, muted_id: 2 }).await?.into_inner().changed);
    assert!(!relationship(&mut c, 1, 2).await?.muting);

    // Bad input: clear statuses, nothing written.
    let e = c.mute(MuteRequest { muter_id: 3, muted_id: 3 }).await.unwrap_err();
    assert_eq!((e.code(), reason(&e)), (Code::InvalidArgument, "SELF_MUTE".to_owned()));
    let e = c.block(BlockRequest { blocker_id: 3, blocked_id: 3 }).await.unwrap_err();
    assert_eq!((e.code(), reason(&e)), (Code::InvalidArgument, "SELF_BLOCK".to_owned()));
    let e = c.block(BlockRequest { blocker_id: 0, blocked_id: -4 }).await.unwrap_err();
    let fields: BTreeSet<String> =
        e.get_error_details().bad_request().map(|b| b.field_violations.iter().map(|v| v.field.clone()).collect()).unwrap_or_default();
    assert_eq!((e.code(), fields), (Code::InvalidArgument, BTreeSet::from(["blocked_id".to_owned(), "blocker_id".to_owned()])));
    let e = c.remove_follower(RemoveFollowerRequest { user_id: 1, follower_id: 0 }).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = c.list_blocks(ListBlocksRequest { user_id: 1, page_size: 1001, page_token: String::new() }).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert_eq!(walk_restrictions(&mut c, true, 3, 0).await?, Vec::<i64>::new());

    // ImportFollows skips blocked pairs; ScanEdges lists no row a block made for a pair that
    // never followed, and refuses negative filters.
    block(&mut c, 40, 41).await?;
    let edges = [(40, 41), (41, 40), (40, 42)].map(|(f, e)| ImportEdge { follower_id: f, followee_id: e, followed_at: None }).to_vec();
    let r = c.import_follows(admin(futures::stream::iter([ImportFollowsRequest { edges }]))).await?.into_inner();
    assert_eq!((r.imported, r.skipped_blocked), (1, 2));
    let mut scan = c.scan_edges(admin(ScanEdgesRequest { follower_id: 41, ..Default::default() })).await?.into_inner();
    let mut scanned = BTreeMap::new();
    while let Some(page) = scan.message().await? {
        scanned.extend(page.edges.iter().map(|e| ((e.follower_id, e.followee_id), e.version)));
    }
    assert!(scanned.is_empty(), "no edge of 41 ever existed: {scanned:?}");
    for req in [ScanEdgesRequest { follower_id: -1, ..Default::default() }, ScanEdgesRequest { followee_id: -7, ..Default::default() }] {
        let e = c.scan_edges(admin(req)).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
    }
    relation.stop().await?;
    db.drop_db().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mutes_and_blocks_are_idempotent_and_listed_newest_first_on_postgres() -> anyhow::Result<()> {
    mutes_and_block_lists(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mutes_and_blocks_are_idempotent_and_listed_newest_first_on_mariadb() -> anyhow::Result<()> {
    mutes_and_block_lists(Backend::MariaDb).await
}

/// Follows of both directions of a pair hammered by several callers while another blocks and
/// unblocks the pair back to back: every time a block stands, no edge of the pair may exist.
async fn follows_racing_blocks(backend: Backend) -> anyhow::Result<()> {
    const PAIRS: i64 = 8;
    const CYCLES: usize = 40;
    let (db, relation, _) = relation_on(backend, |_| {}).await?;
    let stop = tokio_util::sync::CancellationToken::new();
    let mut followers = Vec::new();
    for p in 0..PAIRS {
        let (a, b) = (2 * p + 1, 2 * p + 2);
        for (f, e) in [(a, b), (b, a), (a, b), (b, a)] {
            let (mut c, stop) = (relation.client().await?, stop.clone());
            followers.push(tokio::spawn(async move {
                let mut attempts = 0_u64;
                while !stop.is_cancelled() {
                    match follow(&mut c, f, e).await {
                        Ok(_) => {}
                        Err(s) if reason(&s) == "BLOCKED" => {}
                        Err(s) => return Err(anyhow::Error::from(s)),
                    }
                    attempts += 1;
                }
                anyhow::Ok(attempts)
            }));
        }
    }
    let mut blockers = Vec::new();
    for p in 0..PAIRS {
        let (a, b) = (2 * p + 1, 2 * p + 2);
        let mut c = relation.client().await?;
        blockers.push(tokio::spawn(async move {
            let mut violations = Vec::new();
            for _ in 0..CYCLES {
                unblock(&mut c, a, b).await?;
                block(&mut c, a, b).await?;
                // Follows that were in flight when the block committed have landed by now.
                tokio::time::sleep(Duration::from_millis(15)).await;
                let r = relationship(&mut c, a, b).await?;
                if r.following || r.followed_by {
                    violations.push((a, b, r.following, r.followed_by));
                }
            }
            anyhow::Ok(violations)
        }));
    }
    let mut violations = Vec::new();
    for t in blockers {
        violations.extend(t.await??);
    }
    stop.cancel();
    let mut attempts = 0;
    for t in followers {
        attempts += t.await??;
    }
    assert!(attempts > 200, "the followers kept trying ({attempts} follows)");
    assert_eq!(violations, vec![], "edges standing across a block");
    relation.stop().await?;
    db.drop_db().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn follows_racing_blocks_never_leave_an_edge_across_a_block_on_postgres() -> anyhow::Result<()> {
    follows_racing_blocks(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn follows_racing_blocks_never_leave_an_edge_across_a_block_on_mariadb() -> anyhow::Result<()> {
    follows_racing_blocks(Backend::MariaDb).await
}
