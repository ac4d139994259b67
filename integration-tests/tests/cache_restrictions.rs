//! Restriction summaries in the cache Redis, through relation-svc on PostgreSQL: relationship
//! reads take blocks, mutes and follow requests from the cache, every change shows in the very
//! next read of every user it touches (also while summaries are evicted at random), and a summary the
//! writer could not delete is deleted by the stale drain.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng, rngs::StdRng};
use sea_orm::{ConnectionTrait, Statement};
use socialgraph_cache::keys::Keys;
use socialgraph_integration_tests::*;
use socialgraph_proto::relation::v1::relation_service_client::RelationServiceClient;
use socialgraph_proto::relation::v1::*;
use socialgraph_testkit::{Backend, TestDb, cache_redis_url};
use tonic::transport::Channel;

type Client = RelationServiceClient<Channel>;

/// blocking, blocked_by, muting, requested, requested_by.
type Flags = [bool; 5];

fn flags(r: &Relationship) -> Flags {
    [r.blocking, r.blocked_by, r.muting, r.requested, r.requested_by]
}

/// The flags of `user` with each of `others`, from the tables themselves.
async fn truth(db: &TestDb, user: i64, others: &[i64]) -> anyhow::Result<Vec<Flags>> {
    let pairs = |table: &'static str| {
        let conn = db.conn.clone();
        async move {
            let sql = format!("SELECT * FROM {table}");
            let rows = conn.query_all_raw(Statement::from_string(conn.get_database_backend(), sql)).await?;
            rows.iter().map(|r| Ok((r.try_get_by_index(0)?, r.try_get_by_index(1)?))).collect::<anyhow::Result<HashSet<(i64, i64)>>>()
        }
    };
    let (blocks, mutes, requests) = (pairs("block").await?, pairs("mute").await?, pairs("follow_request").await?);
    Ok(others
        .iter()
        .map(|&o| {
            [
                blocks.contains(&(user, o)),
                blocks.contains(&(o, user)),
                mutes.contains(&(user, o)),
                requests.contains(&(user, o)),
                requests.contains(&(o, user)),
            ]
        })
        .collect())
}

async fn read(c: &mut Client, user: i64, others: &[i64]) -> anyhow::Result<Vec<Flags>> {
    let r = c.batch_get_relationships(BatchGetRelationshipsRequest { user_id: user, other_user_ids: others.to_vec() }).await?.into_inner();
    Ok(r.relationships.iter().map(flags).collect())
}

/// One random change between `a` and `b`; refusals (a follow across a block) are answers too.
async fn change(c: &mut Client, rng: &mut StdRng, a: i64, b: i64) -> anyhow::Result<&'static str> {
    let op = rng.random_range(0..10);
    let r = match op {
        0 => c.block(BlockRequest { blocker_id: a, blocked_id: b }).await.map(|_| ()),
        1 => c.unblock(UnblockRequest { blocker_id: a, blocked_id: b }).await.map(|_| ()),
        2 => c.mute(MuteRequest { muter_id: a, muted_id: b }).await.map(|_| ()),
        3 => c.unmute(UnmuteRequest { muter_id: a, muted_id: b }).await.map(|_| ()),
        4 => c.follow(FollowRequest { follower_id: a, followee_id: b }).await.map(|_| ()),
        5 => c.unfollow(UnfollowRequest { follower_id: a, followee_id: b }).await.map(|_| ()),
        6 => c.approve_follow_requests(ApproveFollowRequestsRequest { user_id: b, requester_ids: vec![a] }).await.map(|_| ()),
        7 => c.reject_follow_requests(RejectFollowRequestsRequest { user_id: b, requester_ids: vec![a] }).await.map(|_| ()),
        // Unlocking approves every pending request to b, whoever made it.
        8 => c.set_account_locked(SetAccountLockedRequest { user_id: b, locked: rng.random_bool(0.5) }).await.map(|_| ()),
        _ => c.remove_follower(RemoveFollowerRequest { user_id: b, follower_id: a }).await.map(|_| ()),
    };
    match r {
        Ok(()) => Ok("changed"),
        Err(s) if s.code() == tonic::Code::FailedPrecondition => Ok("refused"),
        Err(s) => Err(s.into()),
    }
}

#[tokio::test]
async fn every_restriction_change_shows_in_the_next_cached_relationship_read() -> anyhow::Result<()> {
    let (db, svc, topic) = relation_on(Backend::Postgres, |_| {}).await?;
    let mut c = svc.client().await?;
    let users: Vec<i64> = (1..=12).collect();
    for locked in 1..=4 {
        c.set_account_locked(SetAccountLockedRequest { user_id: locked, locked: true }).await?;
    }
    // Evictions at random while the changes run: a summary may vanish at any time.
    let keys = Keys::new(cache_settings(&topic).key_prefix);
    let evictor = {
        let (keys, users) = (keys.clone(), users.clone());
        let mut conn = redis_conn(&cache_redis_url()).await?;
        tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(2);
            loop {
                let u = users[rng.random_range(0..users.len())];
                let _: Result<i64, _> = redis::AsyncCommands::del(&mut conn, keys.restrictions(u)).await;
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
        })
    };
    let mut rng = StdRng::seed_from_u64(1);
    for step in 0..250 {
        let a = users[rng.random_range(0..users.len())];
        let b = loop {
            let b = users[rng.random_range(0..users.len())];
            if b != a {
                break b;
            }
        };
        let what = change(&mut c, &mut rng, a, b).await?;
        for &u in &users {
            let others: Vec<i64> = users.iter().copied().filter(|&o| o != u).collect();
            assert_eq!(read(&mut c, u, &others).await?, truth(&db, u, &others).await?, "step {step} ({what}, {a} and {b}): user {u}");
        }
    }
    evictor.abort();
    let text = svc.metrics().await?;
    let hits = metric_sum(&text, "sg_cache_requests_total", "cache=\"restrictions\",result=\"hit\",rpc=\"BatchGetRelationships\"");
    let fallbacks = metric_sum(&text, "sg_cache_requests_total", "cache=\"restrictions\",result=\"fallback\",rpc=\"BatchGetRelationships\"");
    println!("{hits} of 3,000 relationship reads took their restrictions from the cache");
    assert!(hits >= 600.0, "the cache answered many of the 3,000 reads, {hits} did");
    assert_eq!(fallbacks, 0.0, "the cache Redis was up all along");
    Ok(())
}

#[tokio::test]
async fn unlocking_an_account_shows_at_once_to_every_requester() -> anyhow::Result<()> {
    let (_db, svc, _topic) = relation_on(Backend::Postgres, |_| {}).await?;
    let mut c = svc.client().await?;
    c.set_account_locked(SetAccountLockedRequest { user_id: 1, locked: true }).await?;
    let requesters = [2, 3, 4];
    for r in requesters {
        c.follow(FollowRequest { follower_id: r, followee_id: 1 }).await?;
    }
    // Each requester's summary cached with its pending request.
    for _ in 0..2 {
        for r in requesters {
            assert_eq!(read(&mut c, r, &[1]).await?, vec![[false, false, false, true, false]]);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let approved = c.set_account_locked(SetAccountLockedRequest { user_id: 1, locked: false }).await?.into_inner().approved;
    assert_eq!(approved, 3);
    for r in requesters {
        let rel = c.get_relationship(GetRelationshipRequest { user_id: r, other_user_id: 1 }).await?.into_inner().relationship.unwrap_or_default();
        assert_eq!((rel.following, rel.requested), (true, false), "requester {r} reads the approval at once");
    }
    Ok(())
}

#[tokio::test]
async fn a_summary_its_writer_could_not_delete_is_deleted_by_the_stale_drain() -> anyhow::Result<()> {
    let (db, reader, topic) = relation_on(Backend::Postgres, |_| {}).await?;
    // A second instance on the same database whose cache Redis cannot be reached.
    let mut config = relation_config(&db.url, &topic);
    config.cache.url = "redis://127.0.0.1:1".into();
    config.cache.timeout_ms = 100;
    config.kafka.relay_enabled = false;
    let cut_off = spawn_relation(config).await?;
    let (mut r, mut w) = (reader.client().await?, cut_off.client().await?);
    let get = |c: &mut Client| {
        let mut c = c.clone();
        async move {
            let rel = c.get_relationship(GetRelationshipRequest { user_id: 1, other_user_id: 2 }).await?.into_inner().relationship;
            anyhow::Ok(rel.map(|r| flags(&r)).unwrap_or_default())
        }
    };
    assert_eq!(get(&mut r).await?, [false; 5]);
    let hit = |text: &str, result: &str| {
        metric_sum(text, "sg_cache_requests_total", &format!("cache=\"restrictions\",result=\"{result}\",rpc=\"GetRelationship\""))
    };
    // The miss filled the summary in the background; read until a read is served from it (a
    // fixed pause was too short for the fill on a loaded machine).
    let start = Instant::now();
    loop {
        assert_eq!(get(&mut r).await?, [false; 5]);
        let text = reader.metrics().await?;
        if hit(&text, "hit") >= 1.0 {
            assert_eq!(hit(&text, "hit"), 1.0, "one read at a time");
            break;
        }
        let fills: Vec<&str> = text.lines().filter(|l| l.contains("restrictions")).collect();
        assert!(start.elapsed() < Duration::from_secs(10), "no read came from the filled summary: {fills:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    w.block(BlockRequest { blocker_id: 1, blocked_id: 2 }).await?;
    let failed = metric_sum(&cut_off.metrics().await?, "sg_cache_writes_total", "cache=\"restrictions\",result=\"failed\"");
    assert_eq!(failed, 1.0, "the writer could not delete the summary");
    let start = Instant::now();
    while get(&mut r).await? != [true, false, false, false, false] {
        // The drain runs every 200 ms; 10 s leaves room for a loaded machine.
        assert!(start.elapsed() < Duration::from_secs(10), "the stale drain deletes the summary");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!("stale summary served for {:?} after the block", start.elapsed());
    // The drain deletes the summary first and clears the marks in a second statement, so the
    // read above can see the deletion a moment before the marks are gone.
    let marked = || db.conn.query_all_raw(Statement::from_string(db.conn.get_database_backend(), "SELECT user_id FROM cache_stale".to_owned()));
    let start = Instant::now();
    while !marked().await?.is_empty() {
        assert!(start.elapsed() < Duration::from_secs(10), "the drain clears the marks right after deleting the summary");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}
