//! Locked accounts and follow requests through the whole mesh, on PostgreSQL and MariaDB: a
//! request is not a follower until approved, and no request is left pending on an account
//! that was unlocked, also under concurrency.

use std::time::Duration;

use socialgraph_integration_tests::model::served_users;
use socialgraph_integration_tests::*;
use socialgraph_proto::projection::v1::ListFollowersRequest;
use socialgraph_proto::relation::v1::relation_service_client::RelationServiceClient;
use socialgraph_proto::relation::v1::*;
use socialgraph_testkit::{Backend, kafka};
use tonic::Code;
use tonic::transport::Channel;

const SETTLE: Duration = Duration::from_secs(240);
type Client = RelationServiceClient<Channel>;

async fn follow(c: &mut Client, a: i64, b: i64) -> Result<FollowResponse, tonic::Status> {
    c.follow(FollowRequest { follower_id: a, followee_id: b }).await.map(tonic::Response::into_inner)
}

async fn set_locked(c: &mut Client, user_id: i64, locked: bool) -> anyhow::Result<SetAccountLockedResponse> {
    Ok(c.set_account_locked(SetAccountLockedRequest { user_id, locked }).await?.into_inner())
}

async fn requests(c: &mut Client, user_id: i64, direction: RequestDirection) -> anyhow::Result<Vec<i64>> {
    let req = ListFollowRequestsRequest { user_id, direction: direction as i32, page_size: 1000, page_token: String::new() };
    Ok(c.list_follow_requests(req).await?.into_inner().accounts.iter().map(|a| a.user_id).collect())
}

async fn followers_of(m: &Mesh, user_id: i64) -> anyhow::Result<Vec<i64>> {
    let r = m.projection.projection().await?.list_followers(ListFollowersRequest { user_id, page_size: 1000, ..Default::default() }).await?;
    let mut ids: Vec<i64> = r.into_inner().followers.iter().map(|e| e.user_id).collect();
    ids.sort_unstable();
    Ok(ids)
}

async fn requests_to_a_locked_account(backend: Backend) -> anyhow::Result<()> {
    let m = Mesh::start_on(backend, &socialgraph_testkit::redis_url(), &kafka::brokers()).await?;
    let mut c = m.relation.client().await?;
    let users: Vec<i64> = (1..=9).collect();
    assert!(set_locked(&mut c, 1, true).await?.changed);
    assert!(!set_locked(&mut c, 1, true).await?.changed, "idempotent");
    let r = follow(&mut c, 2, 1).await?;
    assert_eq!((r.changed, r.requested, r.followed_at), (true, true, None), "a follow of a locked account is a request");
    let again = follow(&mut c, 2, 1).await?;
    assert_eq!((again.changed, again.requested), (false, true), "a repeated request changes nothing");
    for u in 3..=6 {
        assert!(follow(&mut c, u, 1).await?.requested);
    }
    let rel = c.get_relationship(GetRelationshipRequest { user_id: 2, other_user_id: 1 }).await?.into_inner().relationship.unwrap_or_default();
    assert_eq!((rel.following, rel.requested), (false, true));
    let rel = c.get_relationship(GetRelationshipRequest { user_id: 1, other_user_id: 2 }).await?.into_inner().relationship.unwrap_or_default();
    assert_eq!((rel.followed_by, rel.requested_by), (false, true));
    assert_eq!(requests(&mut c, 1, RequestDirection::Incoming).await?, [6, 5, 4, 3, 2]);
    assert_eq!(requests(&mut c, 2, RequestDirection::Outgoing).await?, [1]);
    m.assert_views_exact(&users, SETTLE).await?;
    assert_eq!(followers_of(&m, 1).await?, Vec::<i64>::new(), "requests are not followers");

    let approved = c.approve_follow_requests(ApproveFollowRequestsRequest { user_id: 1, requester_ids: vec![2, 3, 99] }).await?.into_inner();
    assert_eq!(approved.approved, 2, "a requester without a request is ignored");
    assert_eq!(c.reject_follow_requests(RejectFollowRequestsRequest { user_id: 1, requester_ids: vec![4] }).await?.into_inner().rejected, 1);
    let cancel = c.unfollow(UnfollowRequest { follower_id: 5, followee_id: 1 }).await?.into_inner();
    assert_eq!((cancel.changed, cancel.request_cancelled), (false, true), "Unfollow cancels a pending request");
    c.block(BlockRequest { blocker_id: 1, blocked_id: 6 }).await?;
    assert_eq!(requests(&mut c, 1, RequestDirection::Incoming).await?, Vec::<i64>::new(), "a block removes the request");
    m.assert_views_exact(&users, SETTLE).await?;
    assert_eq!(followers_of(&m, 1).await?, [2, 3]);

    // Unlocking approves what is pending; later follows are plain follows.
    follow(&mut c, 7, 1).await?;
    follow(&mut c, 8, 1).await?;
    let unlocked = set_locked(&mut c, 1, false).await?;
    assert_eq!((unlocked.changed, unlocked.approved), (true, 2));
    let direct = follow(&mut c, 9, 1).await?;
    assert_eq!((direct.changed, direct.requested), (true, false));
    m.assert_views_exact(&users, SETTLE).await?;
    assert_eq!(followers_of(&m, 1).await?, [2, 3, 7, 8, 9]);
    let served = served_users(&mut m.counter.counter().await?, &[1]).await?;
    assert_eq!(served[&1].1, 5);
    let e = c.list_follow_requests(ListFollowRequestsRequest { user_id: 1, ..Default::default() }).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "a direction is required");
    let e = c.approve_follow_requests(ApproveFollowRequestsRequest { user_id: 1, requester_ids: vec![] }).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "an empty batch");
    m.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_to_a_locked_account_is_not_a_follower_until_approved_on_postgres() -> anyhow::Result<()> {
    requests_to_a_locked_account(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_to_a_locked_account_is_not_a_follower_until_approved_on_mariadb() -> anyhow::Result<()> {
    requests_to_a_locked_account(Backend::MariaDb).await
}

async fn requests_count_against_the_cap(backend: Backend) -> anyhow::Result<()> {
    let (db, relation, _) = relation_on(backend, |c| c.limits.following_cap = 3).await?;
    let mut c = relation.client().await?;
    set_locked(&mut c, 20, true).await?;
    set_locked(&mut c, 21, true).await?;
    assert!(follow(&mut c, 10, 20).await?.requested);
    assert!(follow(&mut c, 10, 21).await?.requested);
    assert!(!follow(&mut c, 10, 22).await?.requested);
    for target in [23, 24] {
        let e = follow(&mut c, 10, target).await.expect_err("two requests and a follow reach the cap of 3");
        assert_eq!((e.code(), reason(&e)), (Code::FailedPrecondition, "FOLLOWING_LIMIT".to_owned()));
    }
    set_locked(&mut c, 25, true).await?;
    let e = follow(&mut c, 10, 25).await.expect_err("a request counts against the cap too");
    assert_eq!(reason(&e), "FOLLOWING_LIMIT");
    c.reject_follow_requests(RejectFollowRequestsRequest { user_id: 20, requester_ids: vec![10] }).await?;
    assert!(follow(&mut c, 10, 23).await?.changed, "a rejected request frees its place");
    relation.stop().await?;
    db.drop_db().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pending_requests_count_against_the_following_cap_on_postgres() -> anyhow::Result<()> {
    requests_count_against_the_cap(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pending_requests_count_against_the_following_cap_on_mariadb() -> anyhow::Result<()> {
    requests_count_against_the_cap(Backend::MariaDb).await
}

/// Follows of one account by several callers while it is locked and unlocked back to back:
/// right after each unlock, no request to it may be pending.
async fn requests_racing_unlocks(backend: Backend) -> anyhow::Result<()> {
    const CYCLES: usize = 30;
    let (db, relation, _) = relation_on(backend, |_| {}).await?;
    let stop = tokio_util::sync::CancellationToken::new();
    let mut callers = Vec::new();
    for user in 2..=9 {
        let (mut c, stop) = (relation.client().await?, stop.clone());
        callers.push(tokio::spawn(async move {
            let mut attempts = 0_u64;
            // UNAVAILABLE (a transaction that lost its races too often, rolled back) is an
            // answer a caller retries; the check is about what is pending.
            let tolerate = |r: Result<(), tonic::Status>| match r {
                Err(e) if e.code() != Code::Unavailable => Err(e),
                _ => Ok(()),
            };
            while !stop.is_cancelled() {
                tolerate(follow(&mut c, user, 1).await.map(drop))?;
                tolerate(c.unfollow(UnfollowRequest { follower_id: user, followee_id: 1 }).await.map(drop))?;
                attempts += 1;
            }
            anyhow::Ok(attempts)
        }));
    }
    let mut c = relation.client().await?;
    let mut left_pending = Vec::new();
    for cycle in 0..CYCLES {
        set_locked(&mut c, 1, true).await?;
        tokio::time::sleep(Duration::from_millis(10)).await;
        set_locked(&mut c, 1, false).await?;
        tokio::time::sleep(Duration::from_millis(30)).await;
        let pending = requests(&mut c, 1, RequestDirection::Incoming).await?;
        if !pending.is_empty() {
            left_pending.push((cycle, pending));
        }
    }
    stop.cancel();
    let mut attempts = 0;
    for t in callers {
        attempts += t.await??;
    }
    assert!(attempts > 60, "the callers kept following ({attempts})");
    assert_eq!(left_pending, vec![], "(cycle, requests) pending on an unlocked account");
    relation.stop().await?;
    db.drop_db().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_racing_an_unlock_are_never_left_pending_on_postgres() -> anyhow::Result<()> {
    requests_racing_unlocks(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_racing_an_unlock_are_never_left_pending_on_mariadb() -> anyhow::Result<()> {
    requests_racing_unlocks(Backend::MariaDb).await
}
