//! Account lifecycle through the whole mesh, on PostgreSQL and MariaDB: deactivation and
//! suspension hide an account's edges from every list and count and bring them back
//! unchanged; deletion ends them for good, in batches that survive a crash, and the id starts
//! from zero.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

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

const SETTLE: Duration = Duration::from_secs(300);
type Client = RelationServiceClient<Channel>;

async fn follow(c: &mut Client, a: i64, b: i64) -> Result<FollowResponse, tonic::Status> {
    c.follow(FollowRequest { follower_id: a, followee_id: b }).await.map(tonic::Response::into_inner)
}

async fn set_status(c: &mut Client, user_id: i64, status: AccountStatus, as_admin: bool) -> Result<SetAccountStatusResponse, tonic::Status> {
    let msg = SetAccountStatusRequest { user_id, status: status as i32 };
    let req = if as_admin { admin(msg) } else { tonic::Request::new(msg) };
    c.set_account_status(req).await.map(tonic::Response::into_inner)
}

async fn account(c: &mut Client, user_id: i64) -> anyhow::Result<Account> {
    c.get_account(GetAccountRequest { user_id }).await?.into_inner().account.ok_or_else(|| anyhow::anyhow!("no account in the answer"))
}

/// Waits until every one of `users` has no edge job in progress.
async fn jobs_done(c: &Client, users: &[i64]) -> anyhow::Result<()> {
    socialgraph_testkit::eventually(SETTLE, "account jobs to finish", || {
        let mut c = c.clone();
        async move {
            for &u in users {
                if account(&mut c, u).await?.job != AccountJob::None as i32 {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    return Ok(None);
                }
            }
            Ok(Some(()))
        }
    })
    .await
}

/// (follower, followee) → (state, followed_at_ms) of every row of `following`.
async fn rows(m: &Mesh) -> anyhow::Result<BTreeMap<(i64, i64), (i16, i64)>> {
    let backend = m.db.conn.get_database_backend();
    let sql = "SELECT follower_id, followee_id, state, followed_at_ms FROM following";
    let rows = m.db.conn.query_all_raw(Statement::from_string(backend, sql.to_owned())).await?;
    rows.iter().map(|r| Ok(((r.try_get_by_index(0)?, r.try_get_by_index(1)?), (r.try_get_by_index(2)?, r.try_get_by_index(3)?)))).collect()
}

async fn followers_of(m: &Mesh, user_id: i64) -> anyhow::Result<Vec<i64>> {
    let r = m.projection.projection().await?.list_followers(ListFollowersRequest { user_id, page_size: 1000, ..Default::default() }).await?;
    Ok(r.into_inner().followers.iter().map(|e| e.user_id).collect())
}

async fn deactivation_and_restore(backend: Backend) -> anyhow::Result<()> {
    let m = Mesh::start_on(backend, &socialgraph_testkit::redis_url(), &kafka::brokers()).await?;
    let mut c = m.relation.client().await?;
    let users: Vec<i64> = (1..=7).collect();
    for (a, b) in [(1, 2), (2, 1), (3, 1), (1, 4), (5, 1), (2, 3), (6, 7)] {
        follow(&mut c, a, b).await?;
    }
    m.assert_views_exact(&users, SETTLE).await?;
    let before = rows(&m).await?;

    let r = set_status(&mut c, 1, AccountStatus::Deactivated, false).await?;
    assert!(r.changed);
    assert!(!set_status(&mut c, 1, AccountStatus::Deactivated, false).await?.changed, "idempotent");
    jobs_done(&c, &[1]).await?;
    let acc = account(&mut c, 1).await?;
    assert_eq!((acc.status, acc.edges_done), (AccountStatus::Deactivated as i32, 5), "five edges of user 1 hidden");
    for (a, b) in [(4, 1), (1, 5)] {
        let e = follow(&mut c, a, b).await.expect_err("no follow to or from a deactivated account");
        assert_eq!((e.code(), reason(&e)), (Code::FailedPrecondition, "ACCOUNT_INACTIVE".to_owned()));
    }
    m.assert_views_exact(&users, SETTLE).await?;
    let served = served_users(&mut m.counter.counter().await?, &[1, 2, 3]).await?;
    assert_eq!((served[&1].0, served[&1].1), (0, 0), "a deactivated account counts nothing");
    assert_eq!((served[&2].0, served[&2].1, served[&3].0), (1, 0, 0), "nor is it counted by others");
    assert_eq!(followers_of(&m, 2).await?, Vec::<i64>::new());

    // Suspension is an administrator's; so is lifting it.
    // Without credentials the call is the owner's, and these need the admin's: UNAUTHENTICATED.
    let e = set_status(&mut c, 1, AccountStatus::Suspended, false).await.expect_err("owners do not suspend");
    assert_eq!((e.code(), reason(&e)), (Code::Unauthenticated, "CREDENTIALS_MISSING".to_owned()));
    assert!(set_status(&mut c, 1, AccountStatus::Suspended, true).await?.changed);
    let e = set_status(&mut c, 1, AccountStatus::Active, false).await.expect_err("owners do not lift a suspension");
    assert_eq!((e.code(), reason(&e)), (Code::Unauthenticated, "CREDENTIALS_MISSING".to_owned()));
    // 2 deactivates too; when 1 comes back, the edges between them wait for 2.
    set_status(&mut c, 2, AccountStatus::Deactivated, false).await?;
    jobs_done(&c, &[1, 2]).await?;
    set_status(&mut c, 1, AccountStatus::Active, true).await?;
    jobs_done(&c, &[1]).await?;
    let now = rows(&m).await?;
    assert_eq!((now[&(1, 2)].0, now[&(2, 1)].0, now[&(3, 1)].0), (2, 2, 1), "edges to the still inactive 2 stay hidden");
    set_status(&mut c, 2, AccountStatus::Active, false).await?;
    jobs_done(&c, &[2]).await?;
    let after = rows(&m).await?;
    assert_eq!(after, before, "every edge came back unchanged, with its followed_at");
    m.assert_views_exact(&users, SETTLE).await?;
    let e = set_status(&mut c, 1, AccountStatus::Unspecified, true).await.expect_err("no status given");
    assert_eq!(e.code(), Code::InvalidArgument);
    m.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deactivation_hides_every_edge_and_reactivation_restores_them_unchanged_on_postgres() -> anyhow::Result<()> {
    deactivation_and_restore(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deactivation_hides_every_edge_and_reactivation_restores_them_unchanged_on_mariadb() -> anyhow::Result<()> {
    deactivation_and_restore(Backend::MariaDb).await
}

async fn deletion(backend: Backend) -> anyhow::Result<()> {
    let m = Mesh::start_on(backend, &socialgraph_testkit::redis_url(), &kafka::brokers()).await?;
    let mut c = m.relation.client().await?;
    let users: Vec<i64> = (1..=9).collect();
    for (a, b) in [(1, 2), (2, 1), (3, 1), (1, 4), (5, 1), (2, 3)] {
        follow(&mut c, a, b).await?;
    }
    c.block(BlockRequest { blocker_id: 1, blocked_id: 8 }).await?;
    c.mute(MuteRequest { muter_id: 1, muted_id: 9 }).await?;
    c.block(BlockRequest { blocker_id: 7, blocked_id: 1 }).await?;
    let r = c.delete_account(DeleteAccountRequest { user_id: 1 }).await?.into_inner();
    assert_eq!((r.changed, r.account.map(|a| a.status)), (true, Some(AccountStatus::Deleting as i32)));
    jobs_done(&c, &[1]).await?;
    let acc = account(&mut c, 1).await?;
    assert_eq!(acc.status, AccountStatus::Active as i32, "a deleted id is a new account");
    let left: Vec<_> = rows(&m).await?.into_iter().filter(|((f, e), (state, _))| (*f == 1 || *e == 1) && *state != 0).collect();
    assert_eq!(left, vec![], "every edge of the deleted account ended");
    m.assert_views_exact(&users, SETTLE).await?;
    let served = served_users(&mut m.counter.counter().await?, &[1, 2]).await?;
    assert_eq!((served[&1].0, served[&1].1, served[&2].0, served[&2].1), (0, 0, 1, 0));
    let blocks = c.list_blocks(ListBlocksRequest { user_id: 1, ..Default::default() }).await?.into_inner().accounts;
    let mutes = c.list_mutes(ListMutesRequest { user_id: 1, ..Default::default() }).await?.into_inner().accounts;
    assert!(blocks.is_empty() && mutes.is_empty(), "its blocks and mutes went with it");
    // The new account with the same id starts from zero, and nobody blocks it.
    assert!(follow(&mut c, 1, 2).await?.changed);
    assert!(follow(&mut c, 7, 1).await?.changed);
    m.assert_views_exact(&users, SETTLE).await?;
    let served = served_users(&mut m.counter.counter().await?, &[1]).await?;
    assert_eq!((served[&1].0, served[&1].1), (1, 1));
    m.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deleted_account_leaves_every_list_and_count_and_its_id_starts_from_zero_on_postgres() -> anyhow::Result<()> {
    deletion(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deleted_account_leaves_every_list_and_count_and_its_id_starts_from_zero_on_mariadb() -> anyhow::Result<()> {
    deletion(Backend::MariaDb).await
}

/// Deletes user 1 with `followers` followers (imported), killing relation-svc once mid-way.
async fn large_deletion(backend: Backend, followers: i64) -> anyhow::Result<()> {
    let mut m = Mesh::start_on(backend, &socialgraph_testkit::redis_url(), &kafka::brokers()).await?;
    let mut c = m.relation.client().await?;
    let ids: Vec<i64> = (2..=followers + 1).collect();
    let msgs: Vec<ImportFollowsRequest> = ids
        .chunks(10_000)
        .map(|chunk| ImportFollowsRequest {
            edges: chunk.iter().map(|&f| ImportEdge { follower_id: f, followee_id: 1, followed_at: None }).collect(),
        })
        .collect();
    let started = Instant::now();
    assert_eq!(c.import_follows(admin(futures::stream::iter(msgs))).await?.into_inner().imported, followers);
    m.settle(SETTLE).await?;
    println!("imported {followers} followers of user 1 and settled in {:.1} s", started.elapsed().as_secs_f64());

    let started = Instant::now();
    c.delete_account(DeleteAccountRequest { user_id: 1 }).await?;
    let crash_at = followers / 3;
    socialgraph_testkit::eventually(SETTLE, "a third of the deletion", || {
        let mut c = c.clone();
        async move {
            let done = account(&mut c, 1).await?.edges_done;
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok((done >= crash_at).then_some(done))
        }
    })
    .await?;
    m.relation.kill().await;
    let crashed_after = started.elapsed();
    m.relation = spawn_relation(m.relation_config()).await?;
    let mut c = m.relation.client().await?;
    let progress_after_restart = account(&mut c, 1).await?;
    assert_eq!(progress_after_restart.status, AccountStatus::Deleting as i32, "the deletion survives the crash");
    assert!(progress_after_restart.edges_done >= crash_at, "its progress too");
    jobs_done(&c, &[1]).await?;
    let deleted_in = started.elapsed();
    m.settle(SETTLE).await?;
    let settled_in = started.elapsed();
    let batch = m.relation_config().limits.import_batch_size;
    println!(
        "deleted an account with {followers} followers in {:.1} s ({} batches of {batch}; relation-svc killed after {:.1} s at {} edges), lag 0 after {:.1} s",
        deleted_in.as_secs_f64(),
        (followers as usize).div_ceil(batch),
        crashed_after.as_secs_f64(),
        progress_after_restart.edges_done,
        settled_in.as_secs_f64()
    );
    let mut users = vec![1];
    users.extend(&ids);
    let served = served_users(&mut m.counter.counter().await?, &users).await?;
    let wrong: Vec<_> = served.iter().filter(|(_, v)| v.0 != 0 || v.1 != 0).take(5).collect();
    assert_eq!(wrong, Vec::<(&i64, &_)>::new(), "every follow ended: all counts zero");
    assert_eq!(followers_of(&m, 1).await?, Vec::<i64>::new());
    let standing: i64 =
        m.db.conn
            .query_one_raw(Statement::from_string(m.db.conn.get_database_backend(), "SELECT count(*) FROM following WHERE state <> 0".to_owned()))
            .await?
            .map_or(Ok(-1), |r| r.try_get_by_index(0))?;
    assert_eq!(standing, 0);
    m.stop().await
}

/// Followers of the deleted account: `SG_TEST_DELETION_FOLLOWERS` (200,000 for the full
/// measurement), else `default`, small enough for `make test` on 2 cores.
fn deletion_size(default: i64) -> i64 {
    std::env::var("SG_TEST_DELETION_FOLLOWERS").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deleting_an_account_with_many_followers_survives_a_crash_and_ends_exact_on_postgres() -> anyhow::Result<()> {
    large_deletion(Backend::Postgres, deletion_size(50_000)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deleting_an_account_with_many_followers_survives_a_crash_and_ends_exact_on_mariadb() -> anyhow::Result<()> {
    large_deletion(Backend::MariaDb, deletion_size(50_000) / 5).await
}

/// Accepts the answer of one random operation: success, one of the refusals the rules allow
/// (`reasons`), or UNAVAILABLE (a transaction that lost its races too often was rolled back and
/// may be retried: the invariants must hold all the same).
fn allowed<T>(r: Result<T, tonic::Status>, reasons: &[&str]) -> anyhow::Result<bool> {
    match r {
        Ok(_) => Ok(false),
        Err(e) if reasons.contains(&reason(&e).as_str()) || e.code() == Code::Unavailable => Ok(true),
        Err(e) => Err(e.into()),
    }
}

/// One caller's share of the mixed workload: every kind of change among `users` accounts,
/// half of the others picked from the 20 first so that pairs meet. Returns the refusals.
async fn mixed_ops(mut c: Client, users: i64, ops: usize, seed: u64) -> anyhow::Result<usize> {
    const INACTIVE: &[&str] = &["ACCOUNT_INACTIVE", "ACCOUNT_DELETING"];
    let mut rng = StdRng::seed_from_u64(seed);
    let mut refused = 0;
    for _ in 0..ops {
        let a = rng.random_range(1..=users);
        let mut b = if rng.random_bool(0.5) { rng.random_range(1..=20) } else { rng.random_range(1..=users) };
        if a == b {
            b = a % users + 1;
        }
        let r = match rng.random_range(0..100) {
            0..40 => allowed(follow(&mut c, a, b).await, &["ACCOUNT_INACTIVE", "BLOCKED"])?,
            40..52 => allowed(c.unfollow(UnfollowRequest { follower_id: a, followee_id: b }).await, &[])?,
            52..57 => allowed(c.block(BlockRequest { blocker_id: a, blocked_id: b }).await, &["ACCOUNT_DELETING"])?,
            57..62 => allowed(c.unblock(UnblockRequest { blocker_id: a, blocked_id: b }).await, &[])?,
            62..66 => allowed(c.remove_follower(RemoveFollowerRequest { user_id: a, follower_id: b }).await, &[])?,
            66..68 => allowed(c.mute(MuteRequest { muter_id: a, muted_id: b }).await, &["ACCOUNT_DELETING"])?,
            68..73 => allowed(c.set_account_locked(SetAccountLockedRequest { user_id: b, locked: rng.random_bool(0.6) }).await, INACTIVE)?,
            73..80 => {
                let req =
                    ListFollowRequestsRequest { user_id: b, direction: RequestDirection::Incoming as i32, page_size: 20, page_token: String::new() };
                let pending: Vec<i64> = c.list_follow_requests(req).await?.into_inner().accounts.iter().map(|x| x.user_id).collect();
                if pending.is_empty() {
                    false
                } else if rng.random_bool(0.8) {
                    allowed(c.approve_follow_requests(ApproveFollowRequestsRequest { user_id: b, requester_ids: pending }).await, INACTIVE)?
                } else {
                    allowed(c.reject_follow_requests(RejectFollowRequestsRequest { user_id: b, requester_ids: pending }).await, &[])?
                }
            }
            80..88 => allowed(set_status(&mut c, a, AccountStatus::Deactivated, false).await, INACTIVE)?,
            88..97 => allowed(set_status(&mut c, a, AccountStatus::Active, false).await, INACTIVE)?,
            _ => allowed(c.delete_account(DeleteAccountRequest { user_id: a }).await, &[])?,
        };
        refused += usize::from(r);
    }
    Ok(refused)
}

/// Follows, unfollows, blocks, removals, mutes, locks, requests, approvals, rejections,
/// deactivations, reactivations and deletions among 200 accounts from 8 callers, counter-svc
/// killed mid-way. Then: no "following" edge touches an inactive account or crosses a block,
/// no request waits on an unlocked account, every view is exact, a rebuild of the projection
/// and a full replay of the counters change nothing.
async fn mixed_lifecycle(backend: Backend) -> anyhow::Result<()> {
    const USERS: i64 = 200;
    let mut m = Mesh::start_on(backend, &socialgraph_testkit::redis_url(), &kafka::brokers()).await?;
    let mut tasks = Vec::new();
    for worker in 0..8_u64 {
        tasks.push(tokio::spawn(mixed_ops(m.relation.client().await?, USERS, 300, 40 + worker)));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    m.counter.kill().await;
    m.counter = spawn_counter(m.counter_config()).await?;
    let mut refused = 0;
    for t in tasks {
        refused += t.await??;
    }
    assert!(refused > 0, "some changes met an inactive account or a block");
    let users: Vec<i64> = (1..=USERS).collect();
    let c = m.relation.client().await?;
    jobs_done(&c, &users).await?;
    let kind = m.db.conn.get_database_backend();
    for (what, sql) in [
        (
            "following edges touching an inactive account",
            "SELECT f.follower_id FROM following f JOIN account a ON a.user_id IN (f.follower_id, f.followee_id) WHERE f.state = 1 AND a.status <> 0",
        ),
        (
            "following edges across a block",
            "SELECT f.follower_id FROM following f JOIN block b ON (b.blocker_id = f.follower_id AND b.blocked_id = f.followee_id) \
             OR (b.blocker_id = f.followee_id AND b.blocked_id = f.follower_id) WHERE f.state = 1",
        ),
        (
            "requests pending on an unlocked account",
            "SELECT r.requester_id FROM follow_request r LEFT JOIN account a ON a.user_id = r.target_id WHERE a.locked IS NULL OR NOT a.locked",
        ),
    ] {
        let bad = m.db.conn.query_all_raw(Statement::from_string(kind, sql.to_owned())).await?;
        assert_eq!(bad.len(), 0, "{what}");
    }
    m.assert_views_exact(&users, SETTLE).await?;
    m.assert_rebuild_and_replay_change_nothing(&users, SETTLE).await?;
    m.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mixed_workload_of_every_kind_of_change_keeps_every_view_exact_on_postgres() -> anyhow::Result<()> {
    mixed_lifecycle(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mixed_workload_of_every_kind_of_change_keeps_every_view_exact_on_mariadb() -> anyhow::Result<()> {
    mixed_lifecycle(Backend::MariaDb).await
}

/// Follows to and from one account hammered by several callers while it is deactivated and
/// reactivated back to back: whenever its hide job has finished, none of its edges may be
/// "following".
async fn follows_racing_deactivation(backend: Backend) -> anyhow::Result<()> {
    const TARGET: i64 = 1;
    const CYCLES: usize = 15;
    let (db, relation, _) = relation_on(backend, |_| {}).await?;
    let stop = tokio_util::sync::CancellationToken::new();
    let mut callers = Vec::new();
    for other in 2..=9 {
        let (mut c, stop) = (relation.client().await?, stop.clone());
        callers.push(tokio::spawn(async move {
            let mut attempts = 0_u64;
            while !stop.is_cancelled() {
                let (a, b) = if attempts.is_multiple_of(2) { (other, TARGET) } else { (TARGET, other) };
                match follow(&mut c, a, b).await {
                    Ok(_) => {}
                    Err(e) if reason(&e) == "ACCOUNT_INACTIVE" => {}
                    Err(e) => return Err(anyhow::Error::from(e)),
                }
                if attempts % 5 == 4 {
                    c.unfollow(UnfollowRequest { follower_id: a, followee_id: b }).await?;
                }
                attempts += 1;
            }
            anyhow::Ok(attempts)
        }));
    }
    let mut c = relation.client().await?;
    let (mut violations, mut layers) = (Vec::new(), Vec::new());
    for cycle in 0..CYCLES {
        set_status(&mut c, TARGET, AccountStatus::Active, false).await?;
        tokio::time::sleep(Duration::from_millis(30)).await;
        set_status(&mut c, TARGET, AccountStatus::Deactivated, false).await?;
        jobs_done(&c, &[TARGET]).await?;
        let rel = c.batch_get_relationships(BatchGetRelationshipsRequest { user_id: TARGET, other_user_ids: (2..=9).collect() }).await?.into_inner();
        let standing: Vec<_> = rel.relationships.iter().filter(|r| r.following || r.followed_by).map(|r| (cycle, r.other_user_id)).collect();
        if !standing.is_empty() {
            let answered: Vec<_> = rel.relationships.iter().map(|r| (r.other_user_id, r.following, r.followed_by)).collect();
            // Which layer: the `following` table itself, or the cache it was answered from.
            let sql =
                format!("SELECT follower_id, followee_id, state, version FROM following WHERE follower_id = {TARGET} OR followee_id = {TARGET}");
            let rows = db.conn.query_all_raw(Statement::from_string(db.conn.get_database_backend(), sql)).await?;
            let rows: Vec<(i64, i64, i16, i64)> = rows
                .iter()
                .map(|r| Ok((r.try_get_by_index(0)?, r.try_get_by_index(1)?, r.try_get_by_index(2)?, r.try_get_by_index(3)?)))
                .collect::<Result<_, sea_orm::DbErr>>()?;
            let text = relation.metrics().await?;
            let failed = metric_sum(&text, "sg_cache_writes_total", "result=\"failed\"") as i64;
            layers.push(format!(
                "cycle {cycle}: answered (other, following, followed_by) {answered:?}; table rows (follower, followee, state, version) {rows:?}; \
                 failed cache write-throughs {failed}"
            ));
        }
        violations.extend(standing);
    }
    stop.cancel();
    let mut attempts = 0;
    for t in callers {
        attempts += t.await??;
    }
    assert!(attempts > 100, "the callers kept following ({attempts})");
    assert_eq!(violations, vec![], "(cycle, user) with an edge standing after the hide job finished; {layers:?}");
    relation.stop().await?;
    db.drop_db().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn follows_racing_a_deactivation_never_outlive_its_hide_job_on_postgres() -> anyhow::Result<()> {
    follows_racing_deactivation(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn follows_racing_a_deactivation_never_outlive_its_hide_job_on_mariadb() -> anyhow::Result<()> {
    follows_racing_deactivation(Backend::MariaDb).await
}

/// A follow held up (by a row lock the test takes) from before a deactivation until after it:
/// it must either be refused or land before the hide job finishes, so the job hides it.
async fn stalled_follow_across_a_deactivation(backend: Backend) -> anyhow::Result<()> {
    use sea_orm::TransactionTrait;
    let (db, relation, _) = relation_on(backend, |_| {}).await?;
    let mut c = relation.client().await?;
    follow(&mut c, 2, 1).await?;
    c.unfollow(UnfollowRequest { follower_id: 2, followee_id: 1 }).await?;
    let other = socialgraph_storage::connect(&db.url, 1).await?;
    let txn = other.begin().await?;
    socialgraph_storage::edges::get_following(&txn, 2, 1, true).await?;
    let stalled = {
        let mut c = c.clone();
        tokio::spawn(async move { follow(&mut c, 2, 1).await })
    };
    if backend == Backend::Postgres {
        // The follow's statement must have read the account as active and be waiting on the
        // test's row lock before the deactivation commits (a fixed pause was not enough on a
        // loaded machine). On MariaDB a follow that starts late is refused all the same.
        let waiting = "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'";
        socialgraph_testkit::eventually(Duration::from_secs(20), "the follow to wait on the row lock", || async {
            let rows = db.conn.query_all_raw(Statement::from_string(db.conn.get_database_backend(), waiting.to_owned())).await?;
            Ok((!rows.is_empty()).then_some(()))
        })
        .await?;
    } else {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    set_status(&mut c, 1, AccountStatus::Deactivated, false).await?;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let waiting = account(&mut c, 1).await?.job;
    txn.rollback().await?;
    let outcome = stalled.await?;
    if backend == Backend::Postgres {
        // Its statement read the account as active before the change, so it may land; the
        // job must have waited for it.
        assert_eq!(waiting, AccountJob::Hide as i32, "the hide job waits for the older follow");
        assert!(outcome.is_ok_and(|r| r.changed));
    } else {
        let e = outcome.expect_err("the follow reads the status after writing, and is refused");
        assert_eq!(reason(&e), "ACCOUNT_INACTIVE");
    }
    jobs_done(&c, &[1]).await?;
    let rel = c.get_relationship(GetRelationshipRequest { user_id: 1, other_user_id: 2 }).await?.into_inner().relationship.unwrap_or_default();
    assert!(!rel.followed_by, "no edge of the deactivated account stands once its job is done");
    other.close().await?;
    relation.stop().await?;
    db.drop_db().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follow_stalled_across_a_deactivation_is_hidden_by_its_job_on_postgres() -> anyhow::Result<()> {
    stalled_follow_across_a_deactivation(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follow_stalled_across_a_deactivation_is_refused_on_mariadb() -> anyhow::Result<()> {
    stalled_follow_across_a_deactivation(Backend::MariaDb).await
}
