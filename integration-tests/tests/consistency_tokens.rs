//! Read-your-writes across services: the consistency token of a Follow, Unfollow or
//! RemoveFollower makes projection-svc's follower reads and counter-svc's counters reflect that
//! change at once, in the distributed mesh and in the embedded mode; a malformed token is
//! refused, and a token of a change that never lands ends in a bounded wait.

use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng, rngs::StdRng};
use socialgraph_integration_tests::*;
use socialgraph_proto::counter::v1::GetUserCountersRequest;
use socialgraph_proto::counter::v1::counter_service_client::CounterServiceClient;
use socialgraph_proto::projection::v1::projection_service_client::ProjectionServiceClient;
use socialgraph_proto::projection::v1::{CountFollowersRequest, ListFollowersRequest};
use socialgraph_proto::relation::v1::relation_service_client::RelationServiceClient;
use socialgraph_proto::relation::v1::*;
use socialgraph_testkit::redis_url;
use tonic::Code;
use tonic::transport::Channel;

struct Clients {
    relation: RelationServiceClient<Channel>,
    projection: ProjectionServiceClient<Channel>,
    counter: CounterServiceClient<Channel>,
}

/// Follows and unfollows among a few users, each write followed at once by the followee's
/// follower list and count and both users' counters read with the write's token; every answer
/// must show the write. Returns the rounds that wrote.
async fn rounds(c: &mut Clients, rounds: usize, seed: u64) -> anyhow::Result<usize> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut model = std::collections::BTreeSet::new();
    let mut written = 0;
    for _ in 0..rounds {
        let (a, b) = (rng.random_range(1..=6i64), rng.random_range(7..=9i64));
        let (token, following) = if model.contains(&(a, b)) && rng.random_bool(0.5) {
            model.remove(&(a, b));
            if rng.random_bool(0.5) {
                (c.relation.unfollow(UnfollowRequest { follower_id: a, followee_id: b }).await?.into_inner().consistency_token, false)
            } else {
                (c.relation.remove_follower(RemoveFollowerRequest { user_id: b, follower_id: a }).await?.into_inner().consistency_token, false)
            }
        } else {
            let changed = model.insert((a, b));
            let r = c.relation.follow(FollowRequest { follower_id: a, followee_id: b }).await?.into_inner();
            assert_eq!(r.consistency_token.is_empty(), !changed, "a token exactly when the edge changed");
            (r.consistency_token, true)
        };
        if token.is_empty() {
            continue;
        }
        written += 1;
        let page = c
            .projection
            .list_followers(ListFollowersRequest { user_id: b, page_size: 100, page_token: String::new(), consistency_token: token.clone() })
            .await?
            .into_inner();
        assert_eq!(page.followers.iter().any(|f| f.user_id == a), following, "ListFollowers({b}) with the token of {a}→{b}");
        let followers_of_b = model.iter().filter(|(_, e)| *e == b).count() as i64;
        let count = c.projection.count_followers(CountFollowersRequest { user_id: b, consistency_token: token.clone() }).await?.into_inner().count;
        assert_eq!(count, followers_of_b, "CountFollowers({b})");
        let cb = c.counter.get_user_counters(GetUserCountersRequest { user_id: b, consistency_token: token.clone() }).await?.into_inner();
        assert_eq!(cb.counters.map(|s| s.followers as i64), Some(followers_of_b), "followers counter of {b}");
        let ca = c.counter.get_user_counters(GetUserCountersRequest { user_id: a, consistency_token: token }).await?.into_inner();
        let followings_of_a = model.iter().filter(|(f, _)| *f == a).count() as u64;
        assert_eq!(ca.counters.map(|s| s.followings), Some(followings_of_a), "followings counter of {a}");
    }
    Ok(written)
}

async fn bad_tokens(c: &mut Clients) -> anyhow::Result<()> {
    let refused = c
        .projection
        .list_followers(ListFollowersRequest { user_id: 7, page_size: 10, page_token: String::new(), consistency_token: "not-a-token".into() })
        .await
        .expect_err("a malformed token is refused");
    assert_eq!(refused.code(), Code::InvalidArgument);
    let refused =
        c.counter.get_user_counters(GetUserCountersRequest { user_id: 7, consistency_token: "djEuMS4y".into() }).await.expect_err("refused");
    assert_eq!(refused.code(), Code::InvalidArgument);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reads_with_a_write_token_show_the_write_in_the_mesh() -> anyhow::Result<()> {
    let m = Mesh::start(&redis_url()).await?;
    let mut c = Clients { relation: m.relation.client().await?, projection: m.projection.projection().await?, counter: m.counter.counter().await? };
    let started = Instant::now();
    let written = rounds(&mut c, 200, 1).await?;
    println!("{written} writes, each read back through two other services with its token, in {:.1} s", started.elapsed().as_secs_f64());
    assert!(written > 100);
    bad_tokens(&mut c).await?;

    // A token of a change that never lands (a version the edge will not reach soon): bounded wait.
    let follow = c.relation.follow(FollowRequest { follower_id: 20, followee_id: 21 }).await?.into_inner();
    let forged =
        socialgraph_domain::ConsistencyToken { follower_id: 20, followee_id: 21, version: follow.version + 100, followings_version: 0 }.encode();
    let started = Instant::now();
    let waited = c
        .projection
        .list_followers(ListFollowersRequest { user_id: 21, page_size: 10, page_token: String::new(), consistency_token: forged.clone() })
        .await
        .expect_err("the change never lands");
    assert_eq!((waited.code(), reason(&waited).as_str()), (Code::Unavailable, "NOT_YET_CONSISTENT"));
    assert!(started.elapsed() < Duration::from_secs(5), "the wait is bounded ({:?})", started.elapsed());
    let waited = c.counter.get_user_counters(GetUserCountersRequest { user_id: 21, consistency_token: forged }).await.expect_err("never lands");
    assert_eq!((waited.code(), reason(&waited).as_str()), (Code::Unavailable, "NOT_YET_CONSISTENT"));
    m.assert_views_exact(&(1..=21).collect::<Vec<_>>(), Duration::from_secs(60)).await?;
    m.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reads_with_a_write_token_show_the_write_in_the_embedded_mode() -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(socialgraph_testkit::unique("sg-token"));
    std::fs::create_dir_all(&dir)?;
    let dev = spawn_dev(&dir.join("sg.db")).await?;
    let connect = |url: &str| Channel::from_shared(url.to_owned()).map(|c| c.connect_lazy());
    let mut c = Clients {
        relation: RelationServiceClient::new(connect(&dev.relation)?),
        projection: ProjectionServiceClient::new(connect(&dev.projection)?),
        counter: CounterServiceClient::new(connect(&dev.counter)?),
    };
    socialgraph_testkit::eventually(Duration::from_secs(20), "the embedded mesh to answer", || {
        let mut r = c.relation.clone();
        async move { Ok(r.count_following(CountFollowingRequest { user_id: 1 }).await.ok().map(|_| ())) }
    })
    .await?;
    assert!(rounds(&mut c, 60, 2).await? > 30);
    bad_tokens(&mut c).await?;
    dev.stop().await?;
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
