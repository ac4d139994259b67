//! `socialgraph dev` (the embedded mode) against a real SQLite file: the same APIs converge on
//! the exact answers, state survives a restart, and replaying the whole log changes nothing.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use socialgraph_domain::Edge;
use socialgraph_integration_tests::{DevSvc, random_workload, spawn_dev};
use socialgraph_proto::counter::v1::counter_service_client::CounterServiceClient;
use socialgraph_proto::counter::v1::*;
use socialgraph_proto::projection::v1::projection_service_client::ProjectionServiceClient;
use socialgraph_proto::projection::v1::{GetProjectionStatusRequest, RebuildRequest, rebuild_request};
use socialgraph_storage::edges::{EdgeTable, ScanFilter, scan};
use tonic::Code;

const SETTLE: Duration = Duration::from_secs(120);

struct Dev(DevSvc);

async fn start(data: &Path) -> anyhow::Result<Dev> {
    Ok(Dev(spawn_dev(data).await?))
}

impl Dev {
    async fn stop(self) -> anyhow::Result<()> {
        self.0.stop().await
    }

    fn relation_addr(&self) -> std::net::SocketAddr {
        self.0.relation.trim_start_matches("http://").parse().expect("address")
    }

    async fn counter(&self) -> anyhow::Result<CounterServiceClient<tonic::transport::Channel>> {
        Ok(CounterServiceClient::connect(self.0.counter.clone()).await?)
    }

    /// Waits until the projection has applied the whole log and the counters equal `exact`.
    async fn settle(&self, exact: &HashMap<i64, (u64, u64)>, users: i64) -> anyhow::Result<()> {
        let mut pc = ProjectionServiceClient::connect(self.0.projection.clone()).await?;
        let mut cc = self.counter().await?;
        socialgraph_testkit::eventually(SETTLE, "the embedded projection and counters to catch up", || {
            let (mut pc, mut cc) = (pc.clone(), cc.clone());
            async move {
                let status = pc.get_projection_status(GetProjectionStatusRequest {}).await?.into_inner();
                if status.partitions.is_empty() || status.partitions.iter().any(|p| p.lag > 0) {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    return Ok(None);
                }
                let ids: Vec<i64> = (1..=users).collect();
                let got =
                    cc.batch_get_user_counters(BatchGetUserCountersRequest { user_ids: ids, ..Default::default() }).await?.into_inner().counters;
                let same = got.iter().all(|c| exact.get(&c.user_id).copied().unwrap_or_default() == (c.followings, c.followers));
                if !same {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Ok(same.then_some(()))
            }
        })
        .await?;
        pc.get_projection_status(GetProjectionStatusRequest {}).await?;
        cc.get_user_counters(GetUserCountersRequest { user_id: 1, ..Default::default() }).await?;
        Ok(())
    }
}

fn temp_file(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(socialgraph_testkit::unique("sg-dev"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name)
}

async fn tables(data: &Path) -> anyhow::Result<(Vec<Edge>, Vec<Edge>)> {
    let db = socialgraph_storage::connect(&format!("sqlite://{}", data.display()), 1).await?;
    let following = scan(&db, EdgeTable::Following, ScanFilter::default(), usize::MAX >> 1).await?;
    let follower = scan(&db, EdgeTable::Follower, ScanFilter::default(), usize::MAX >> 1).await?;
    db.close().await?;
    Ok((following, follower))
}

/// Asserts the follower table holds exactly the edges of the following table (both are
/// scanned in (follower_id, followee_id) order), naming the first differences.
fn assert_projected(following: &[Edge], follower: &[Edge]) {
    let differences: Vec<String> =
        following.iter().zip(follower).filter(|(a, b)| a != b).take(5).map(|(a, b)| format!("following {a:?} vs follower {b:?}")).collect();
    assert!(
        differences.is_empty() && following.len() == follower.len(),
        "the follower table differs from the following table ({} vs {} rows): {differences:#?}",
        following.len(),
        follower.len()
    );
}

/// Waits until the follower table holds exactly `view` of the following table, then asserts it
/// (naming the differences when it never does); returns the following table. GetProjectionStatus
/// reports the lag as of the log reader's last pass, so right after the last writes it can say
/// 0 before the reader has applied them.
async fn assert_projected_soon(data: &Path, view: fn(Vec<Edge>) -> Vec<Edge>) -> anyhow::Result<Vec<Edge>> {
    let started = std::time::Instant::now();
    loop {
        let (following, follower) = tables(data).await?;
        let want = view(following.clone());
        if want == follower || started.elapsed() > SETTLE {
            assert_projected(&want, &follower);
            return Ok(following);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn exact_counts(following: &[Edge]) -> HashMap<i64, (u64, u64)> {
    let mut out: HashMap<i64, (u64, u64)> = HashMap::new();
    for e in following.iter().filter(|e| e.state.as_i16() == 1) {
        out.entry(e.follower_id).or_default().0 += 1;
        out.entry(e.followee_id).or_default().1 += 1;
    }
    out
}

fn movie(id: i64) -> Option<EntityRef> {
    Some(EntityRef { entity_type: "movie".into(), entity_id: id })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_embedded_mesh_converges_survives_a_restart_and_replays_to_the_same_state() -> anyhow::Result<()> {
    const USERS: i64 = 100;
    let data = temp_file("dev.sqlite");
    let dev = start(&data).await?;
    random_workload(dev.relation_addr(), 3_000, USERS, 5).await?;
    let (following, _) = tables(&data).await?;
    dev.settle(&exact_counts(&following), USERS).await?;
    assert_projected_soon(&data, |f| f).await?;

    // Follows keep succeeding while the projection is rebuilt from the source twice over.
    let mut pc = ProjectionServiceClient::connect(dev.0.projection.clone()).await?;
    let rebuilds = tokio::spawn(async move {
        for _ in 0..2 {
            let mut r = tonic::Request::new(RebuildRequest { target: Some(rebuild_request::Target::All(true)) });
            r.metadata_mut().insert("authorization", "Bearer dev-admin-token".parse()?);
            pc.rebuild(r).await?;
        }
        anyhow::Ok(())
    });
    random_workload(dev.relation_addr(), 1_600, USERS, 7).await?;
    rebuilds.await??;
    let (following, _) = tables(&data).await?;
    dev.settle(&exact_counts(&following), USERS).await?;
    let following = assert_projected_soon(&data, |f| f).await?;

    // Likes and favourites: the fact, the entity counts and the owner's received counts.
    let mut c = dev.counter().await?;
    let like = |actor: i64| LikeRequest { actor_id: actor, entity: movie(7), owner_id: 50 };
    assert!(c.like(like(1)).await?.into_inner().changed);
    assert!(!c.like(like(1)).await?.into_inner().changed, "a repeated like is a no-op");
    assert!(c.like(like(2)).await?.into_inner().changed);
    assert!(c.fav(FavRequest { actor_id: 2, entity: movie(7), owner_id: 50 }).await?.into_inner().changed);
    assert!(c.unlike(UnlikeRequest { actor_id: 1, entity: movie(7), owner_id: 0 }).await?.into_inner().changed);
    assert!(!c.unfav(UnfavRequest { actor_id: 3, entity: movie(7), owner_id: 50 }).await?.into_inner().changed);
    let counts = c.get_entity_counts(GetEntityCountsRequest { entity: movie(7), metrics: vec![] }).await?.into_inner().counts.unwrap_or_default();
    let values: Vec<u64> = counts.counts.iter().map(|m| m.count).collect();
    assert_eq!(values, [1, 1], "likes, favs of movie 7");
    let states =
        c.get_action_states(GetActionStatesRequest { actor_id: 2, entity_type: "movie".into(), entity_ids: vec![7, 8] }).await?.into_inner().states;
    assert_eq!(states.iter().map(|s| (s.liked, s.faved)).collect::<Vec<_>>(), [(true, true), (false, false)]);
    socialgraph_testkit::eventually(SETTLE, "likes received by the owner", || {
        let mut c = c.clone();
        async move {
            let u =
                c.get_user_counters(GetUserCountersRequest { user_id: 50, ..Default::default() }).await?.into_inner().counters.unwrap_or_default();
            tokio::time::sleep(Duration::from_millis(50)).await;
            Ok((u.likes_received == 1 && u.favs_received == 1).then_some(()))
        }
    })
    .await?;
    // A rebuild from the facts agrees with the log-derived value.
    let admin = |msg| {
        let mut r = tonic::Request::new(msg);
        r.metadata_mut().insert("authorization", "Bearer dev-admin-token".parse().expect("header"));
        r
    };
    let rebuilt = c.rebuild_user_counters(admin(RebuildUserCountersRequest { user_id: 50 })).await?.into_inner().counters.unwrap_or_default();
    let exact = exact_counts(&following).get(&50).copied().unwrap_or_default();
    assert_eq!((rebuilt.followings, rebuilt.followers, rebuilt.likes_received, rebuilt.favs_received), (exact.0, exact.1, 1, 1));
    // Bad input gets the same answers as counter-svc.
    let e = c.get_user_counters(GetUserCountersRequest { user_id: 0, ..Default::default() }).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = c.batch_get_user_counters(BatchGetUserCountersRequest { user_ids: vec![1; 1001], ..Default::default() }).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    // A metric asked for twice would multiply the answer: refused.
    let e = c.get_entity_counts(GetEntityCountsRequest { entity: movie(7), metrics: vec![1, 2, 1] }).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let before =
        c.batch_get_user_counters(BatchGetUserCountersRequest { user_ids: (1..=USERS).collect(), ..Default::default() }).await?.into_inner().counters;
    dev.stop().await?;

    // State survives a restart, and the mesh keeps going from where it stopped.
    let dev = start(&data).await?;
    let mut c = dev.counter().await?;
    let after =
        c.batch_get_user_counters(BatchGetUserCountersRequest { user_ids: (1..=USERS).collect(), ..Default::default() }).await?.into_inner().counters;
    assert_eq!(after, before, "counters after a restart");
    random_workload(dev.relation_addr(), 800, USERS, 6).await?;
    let (following, _) = tables(&data).await?;
    dev.settle(&exact_counts(&following), USERS).await?;
    let before =
        c.batch_get_user_counters(BatchGetUserCountersRequest { user_ids: (1..=USERS).collect(), ..Default::default() }).await?.into_inner().counters;
    dev.stop().await?;

    // Replay of the whole log (every stored offset deleted) changes nothing.
    let db = socialgraph_storage::connect(&format!("sqlite://{}", data.display()), 1).await?;
    sea_orm::ConnectionTrait::execute_unprepared(&db, "DELETE FROM consumer_offset").await?;
    db.close().await?;
    let dev = start(&data).await?;
    let (following, _) = tables(&data).await?;
    dev.settle(&exact_counts(&following), USERS).await?;
    let mut c = dev.counter().await?;
    let replayed =
        c.batch_get_user_counters(BatchGetUserCountersRequest { user_ids: (1..=USERS).collect(), ..Default::default() }).await?.into_inner().counters;
    assert_eq!(replayed, before, "replaying the log changes no counter");
    assert_projected_soon(&data, |f| f).await?;
    let u = c.get_user_counters(GetUserCountersRequest { user_id: 50, ..Default::default() }).await?.into_inner().counters.unwrap_or_default();
    assert_eq!((u.likes_received, u.favs_received), (1, 1), "received likes survive the replay");
    dev.stop().await?;
    let _ = std::fs::remove_dir_all(data.parent().expect("dir"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_embedded_mesh_applies_blocks_and_removed_followers_exactly() -> anyhow::Result<()> {
    use socialgraph_proto::relation::v1::relation_service_client::RelationServiceClient;
    use socialgraph_proto::relation::v1::{BlockRequest, FollowRequest, RemoveFollowerRequest, UnblockRequest};
    const USERS: i64 = 6;
    let data = temp_file("dev.sqlite");
    let dev = start(&data).await?;
    let mut rc = RelationServiceClient::connect(dev.0.relation.clone()).await?;
    for (a, b) in [(1, 2), (2, 1), (3, 1), (1, 4), (5, 1), (6, 2)] {
        rc.follow(FollowRequest { follower_id: a, followee_id: b }).await?;
    }
    let r = rc.block(BlockRequest { blocker_id: 1, blocked_id: 2 }).await?.into_inner();
    assert_eq!((r.changed, r.edges_removed), (true, 2));
    let e = rc.follow(FollowRequest { follower_id: 2, followee_id: 1 }).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(rc.remove_follower(RemoveFollowerRequest { user_id: 1, follower_id: 5 }).await?.into_inner().changed);
    assert!(rc.unblock(UnblockRequest { blocker_id: 1, blocked_id: 2 }).await?.into_inner().changed);
    assert!(rc.follow(FollowRequest { follower_id: 2, followee_id: 1 }).await?.into_inner().changed);
    let (following, _) = tables(&data).await?;
    let exact = exact_counts(&following);
    // Left: 3 → 1, 1 → 4, 6 → 2, 2 → 1.
    assert_eq!((exact[&1], exact[&2]), ((1, 2), (1, 1)));
    dev.settle(&exact, USERS).await?;
    assert_projected_soon(&data, |f| f).await?;
    dev.stop().await?;
    let _ = std::fs::remove_dir_all(data.parent().expect("dir"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_embedded_mesh_runs_account_jobs_and_follow_requests() -> anyhow::Result<()> {
    use socialgraph_proto::relation::v1::relation_service_client::RelationServiceClient;
    use socialgraph_proto::relation::v1::{
        AccountJob, AccountStatus, DeleteAccountRequest, FollowRequest, GetAccountRequest, SetAccountLockedRequest, SetAccountStatusRequest,
    };
    const USERS: i64 = 5;
    let data = temp_file("dev.sqlite");
    let dev = start(&data).await?;
    let mut rc = RelationServiceClient::connect(dev.0.relation.clone()).await?;
    for (a, b) in [(1, 2), (2, 1), (3, 1), (4, 2)] {
        rc.follow(FollowRequest { follower_id: a, followee_id: b }).await?;
    }
    rc.set_account_status(SetAccountStatusRequest { user_id: 1, status: AccountStatus::Deactivated as i32 }).await?;
    let job_done = |rc: RelationServiceClient<tonic::transport::Channel>, user_id: i64| {
        socialgraph_testkit::eventually(SETTLE, "the account job", move || {
            let mut rc = rc.clone();
            async move {
                let a = rc.get_account(GetAccountRequest { user_id }).await?.into_inner().account.unwrap_or_default();
                tokio::time::sleep(Duration::from_millis(20)).await;
                Ok((a.job == AccountJob::None as i32).then_some(()))
            }
        })
    };
    job_done(rc.clone(), 1).await?;
    let (following, _) = tables(&data).await?;
    let exact = exact_counts(&following);
    assert_eq!((exact.get(&1).copied().unwrap_or_default(), exact[&2]), ((0, 0), (0, 1)), "user 1's follows are hidden");
    dev.settle(&exact, USERS).await?;
    rc.set_account_locked(SetAccountLockedRequest { user_id: 2, locked: true }).await?;
    assert!(rc.follow(FollowRequest { follower_id: 5, followee_id: 2 }).await?.into_inner().requested);
    rc.set_account_status(SetAccountStatusRequest { user_id: 1, status: AccountStatus::Active as i32 }).await?;
    job_done(rc.clone(), 1).await?;
    rc.delete_account(DeleteAccountRequest { user_id: 3 }).await?;
    job_done(rc.clone(), 3).await?;
    let unlocked = rc.set_account_locked(SetAccountLockedRequest { user_id: 2, locked: false }).await?.into_inner();
    assert_eq!(unlocked.approved, 1);
    let (following, _) = tables(&data).await?;
    let exact = exact_counts(&following);
    // 1 → 2 and 2 → 1 back, 3's follow ended, 4 → 2 and the approved 5 → 2.
    assert_eq!((exact[&1], exact[&2], exact.get(&3).copied().unwrap_or_default()), ((1, 1), (1, 3), (0, 0)));
    dev.settle(&exact, USERS).await?;
    // An edge hidden by an inactive account is "not following" in the follower table.
    assert_projected_soon(&data, socialgraph_integration_tests::projected).await?;
    dev.stop().await?;
    let _ = std::fs::remove_dir_all(data.parent().expect("dir"));
    Ok(())
}
