//! User counters against real Redis, the broker, relation-svc and projection-svc: exact after
//! random workloads with crashes, forced rebuilds, deleted keys and FLUSHALL; replay-proof;
//! edge cases never negative; bad input refused.

use std::collections::HashMap;
use std::time::Duration;

use prost::Message;
use rand::{Rng, SeedableRng, rngs::StdRng};
use rskafka::client::partition::{Compression, UnknownTopicHandling};
use rskafka::record::Record;
use socialgraph_cache::counters::{Stored, rest_clock_now};
use socialgraph_integration_tests::*;
use socialgraph_proto::counter::v1::counter_service_client::CounterServiceClient;
use socialgraph_proto::counter::v1::*;
use socialgraph_proto::events::v1::{ContentEvent, ContentEventKind};
use socialgraph_proto::relation::v1::{FollowRequest, UnfollowRequest};
use socialgraph_testkit::{kafka, process};
use tonic::Code;

const SETTLE: Duration = Duration::from_secs(240);

/// Exact followings and followers per user from the following table.
async fn exact_counts(m: &Mesh) -> anyhow::Result<HashMap<i64, (u64, u64)>> {
    let (following, _) = both_tables(&m.db).await?;
    let mut out: HashMap<i64, (u64, u64)> = HashMap::new();
    for e in following.iter().filter(|e| e.state.as_i16() == 1) {
        out.entry(e.follower_id).or_default().0 += 1;
        out.entry(e.followee_id).or_default().1 += 1;
    }
    Ok(out)
}

async fn read_all(m: &Mesh, users: i64) -> anyhow::Result<HashMap<i64, (u64, u64)>> {
    let mut c = m.counter.counter().await?;
    let ids: Vec<i64> = (1..=users).collect();
    let mut out = HashMap::new();
    // Cold counters are rebuilt one by one from projection-svc: keep requests small.
    for chunk in ids.chunks(100) {
        // UNAVAILABLE is retryable by contract (a cold batch waits on projection-svc and Redis).
        let mut attempt = 0;
        let r = loop {
            match c.batch_get_user_counters(BatchGetUserCountersRequest { user_ids: chunk.to_vec(), ..Default::default() }).await {
                Ok(r) => break r.into_inner(),
                Err(e) if e.code() == Code::Unavailable && attempt < 20 => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => return Err(e.into()),
            }
        };
        for u in r.counters {
            out.insert(u.user_id, (u.followings, u.followers));
        }
    }
    Ok(out)
}

async fn assert_exact(m: &Mesh, users: i64) -> anyhow::Result<()> {
    let exact = exact_counts(m).await?;
    let got = read_all(m, users).await?;
    for u in 1..=users {
        assert_eq!(got[&u], exact.get(&u).copied().unwrap_or_default(), "followings/followers of user {u}");
    }
    Ok(())
}

/// Waits until `workload` has written `rows` rows into relation-svc's `following` table, and
/// asserts it is still running: what a test does then happens mid-workload however fast the
/// services are.
async fn mid_workload(m: &Mesh, rows: i64, workload: &tokio::task::JoinHandle<anyhow::Result<usize>>) -> anyhow::Result<()> {
    use sea_orm::ConnectionTrait;
    let count = sea_orm::Statement::from_string(m.db.conn.get_database_backend(), "SELECT COUNT(*) FROM following");
    socialgraph_testkit::eventually(SETTLE, &format!("the workload to write {rows} edges"), || async {
        let row = m.db.conn.query_one_raw(count.clone()).await?.ok_or_else(|| anyhow::anyhow!("COUNT(*) returned no row"))?;
        Ok((row.try_get_by_index::<i64>(0)? >= rows).then_some(()))
    })
    .await?;
    assert!(!workload.is_finished(), "the workload ended before {rows} edges: raise its size");
    println!("{rows} edges written; the workload goes on");
    Ok(())
}

/// Deletes one user's counters (its field of the bucket), as an eviction or an operator would.
async fn delete_counter(redis_url: &str, keys: &socialgraph_cache::keys::Keys, user_id: i64) -> anyhow::Result<()> {
    let mut conn = redis_conn(redis_url).await?;
    let _: i64 = redis::AsyncCommands::hdel(&mut conn, keys.user_counters(user_id), user_id).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn user_counters_stay_exact_through_crashes_forced_rebuilds_deleted_keys_and_replay() -> anyhow::Result<()> {
    let mut m = Mesh::start(&socialgraph_testkit::redis_url()).await?;
    const USERS: i64 = 500;
    read_all(&m, USERS).await?;

    let stop = tokio_util::sync::CancellationToken::new();
    let keys = socialgraph_cache::keys::Keys::new(m.prefix.clone());
    let counter_addr = std::sync::Arc::new(std::sync::Mutex::new(m.counter.addr));
    let chaos = {
        let (stop, counter_addr, redis_url, keys) = (stop.clone(), counter_addr.clone(), m.redis_url.clone(), keys.clone());
        tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(11);
            let mut rounds = 0;
            while !stop.is_cancelled() {
                let u = rng.random_range(1..=USERS);
                if rng.random_bool(0.5) {
                    let addr = *counter_addr.lock().expect("lock");
                    // counter-svc is being restarted now and then: a refused connection is fine.
                    if let Ok(mut c) = CounterServiceClient::connect(format!("http://{addr}")).await {
                        let _ = c.rebuild_user_counters(admin(RebuildUserCountersRequest { user_id: u })).await;
                    }
                } else {
                    delete_counter(&redis_url, &keys, u).await?;
                }
                rounds += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            anyhow::Ok(rounds)
        })
    };
    let workload = tokio::spawn(random_workload(m.relation.addr, 20_000, USERS, 21));
    // Kill counter-svc twice mid-workload (about a quarter and half of the ~11,700 edges the
    // 20,000 changes write), without any shutdown, and start it again.
    for rows in [3_000, 6_000] {
        mid_workload(&m, rows, &workload).await?;
        m.counter.kill().await;
        m.counter = spawn_counter(m.counter_config()).await?;
        *counter_addr.lock().expect("lock") = m.counter.addr;
    }
    workload.await??;
    stop.cancel();
    let chaos_rounds = chaos.await??;
    assert!(chaos_rounds > 20, "rebuilds and deletions ran during the workload ({chaos_rounds})");
    m.settle(SETTLE).await?;
    assert_exact(&m, USERS).await?;

    // Replay every partition from the earliest offset: nothing changes.
    let before = read_all(&m, USERS).await?;
    m.counter.shutdown.cancel();
    (&mut m.counter.task).await??;
    let _: i64 = redis::AsyncCommands::del(&mut redis_conn(&m.redis_url).await?, keys.consumer_offsets("counter")).await?;
    m.counter = spawn_counter(m.counter_config()).await?;
    m.settle(SETTLE).await?;
    assert_eq!(read_all(&m, USERS).await?, before, "replay changes no counter");
    m.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn user_counters_are_exact_after_a_flushall_of_redis_mid_workload() -> anyhow::Result<()> {
    let redis = process::redis(0).await?;
    let url = format!("redis://127.0.0.1:{}", redis.port);
    let m = Mesh::start(&url).await?;
    read_all(&m, 200).await?;
    let workload = tokio::spawn(random_workload(m.relation.addr, 6000, 200, 31));
    // About a third of the ~3,400 edges the 6,000 changes write.
    mid_workload(&m, 1_200, &workload).await?;
    let mut conn = redis_conn(&url).await?;
    let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await?;
    workload.await??;
    m.settle(SETTLE).await?;
    assert_exact(&m, 200).await?;
    m.stop().await
}

async fn publish_content(topic: &str, events: &[(ContentEventKind, i64, i64)]) -> anyhow::Result<()> {
    let client = kafka::connect(&kafka::brokers()).await?;
    for (kind, entity_id, author_id) in events {
        let e = ContentEvent {
            event_id: format!("{entity_id}"),
            kind: *kind as i32,
            entity_type: "post".into(),
            entity_id: *entity_id,
            author_id: *author_id,
            occurred_at: None,
        };
        let key = author_id.to_be_bytes();
        let p = socialgraph_events::kafka_partition(&key, 4);
        let pc = client.partition_client(topic, p, UnknownTopicHandling::Retry).await?;
        let record =
            Record { key: Some(key.to_vec()), value: Some(e.encode_to_vec()), headers: Default::default(), timestamp: rskafka::chrono::Utc::now() };
        pc.produce(vec![record], Compression::Lz4).await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unknown_unfollows_unknown_deletes_and_bursts_leave_counts_exact_and_never_negative() -> anyhow::Result<()> {
    let m = Mesh::start(&socialgraph_testkit::redis_url()).await?;
    let mut c = m.counter.counter().await?;
    let mut rc = m.relation.client().await?;
    read_all(&m, 10).await?;
    // An unfollow of an edge that never existed.
    assert!(!rc.unfollow(UnfollowRequest { follower_id: 1, followee_id: 2 }).await?.into_inner().changed);
    // A burst of follow/unfollow/follow within milliseconds.
    for _ in 0..5 {
        rc.follow(FollowRequest { follower_id: 3, followee_id: 4 }).await?;
        rc.unfollow(UnfollowRequest { follower_id: 3, followee_id: 4 }).await?;
        rc.follow(FollowRequest { follower_id: 3, followee_id: 4 }).await?;
    }
    // Content: a delete of a post never published, a post published twice, one deleted.
    use ContentEventKind::{Deleted, Published};
    publish_content(
        &m.topics.content,
        &[(Deleted, 900, 5), (Published, 901, 5), (Published, 901, 5), (Published, 902, 5), (Deleted, 902, 5), (Deleted, 902, 5)],
    )
    .await?;
    m.settle(SETTLE).await?;
    let get = |u: i64| {
        let mut c = c.clone();
        async move {
            anyhow::Ok(
                c.get_user_counters(GetUserCountersRequest { user_id: u, ..Default::default() }).await?.into_inner().counters.unwrap_or_default(),
            )
        }
    };
    let (u1, u2, u3, u4, u5) = (get(1).await?, get(2).await?, get(3).await?, get(4).await?, get(5).await?);
    assert_eq!((u1.followings, u2.followers), (0, 0), "an unfollow of a missing edge changes nothing");
    assert_eq!((u3.followings, u4.followers), (1, 1), "the burst ends following, counted once");
    assert_eq!(u5.posts, 1, "only the post still published counts");
    // The same after forcing a rebuild from the facts.
    let r = c.rebuild_user_counters(admin(RebuildUserCountersRequest { user_id: 5 })).await?.into_inner().counters.unwrap_or_default();
    assert_eq!(r.posts, 1);
    let r = c.rebuild_user_counters(admin(RebuildUserCountersRequest { user_id: 3 })).await?.into_inner().counters.unwrap_or_default();
    assert_eq!(r.followings, 1);
    m.stop().await
}

fn fields(status: &tonic::Status) -> Vec<String> {
    use tonic_types::StatusExt;
    status.get_error_details().bad_request().map(|b| b.field_violations.iter().map(|v| v.field.clone()).collect()).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_input_on_user_counter_rpcs_gets_invalid_argument() -> anyhow::Result<()> {
    let m = Mesh::start(&socialgraph_testkit::redis_url()).await?;
    let mut c = m.counter.counter().await?;
    let e = c.get_user_counters(GetUserCountersRequest { user_id: 0, ..Default::default() }).await.unwrap_err();
    assert_eq!((e.code(), fields(&e)), (Code::InvalidArgument, vec!["user_id".to_owned()]));
    let e = c.batch_get_user_counters(BatchGetUserCountersRequest { user_ids: vec![1; 1001], ..Default::default() }).await.unwrap_err();
    assert_eq!((e.code(), fields(&e)), (Code::InvalidArgument, vec!["user_ids".to_owned()]));
    let e = c.batch_get_user_counters(BatchGetUserCountersRequest { user_ids: vec![], ..Default::default() }).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = c.batch_get_user_counters(BatchGetUserCountersRequest { user_ids: vec![1, -3], ..Default::default() }).await.unwrap_err();
    assert_eq!(fields(&e), ["user_ids[1]"]);
    let e = c.rebuild_user_counters(admin(RebuildUserCountersRequest { user_id: -1 })).await.unwrap_err();
    assert_eq!((e.code(), fields(&e)), (Code::InvalidArgument, vec!["user_id".to_owned()]));
    let e = c.rebuild_user_counters(RebuildUserCountersRequest { user_id: 1 }).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    m.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replayed_batch_whose_users_are_all_through_is_skipped_without_stalling() -> anyhow::Result<()> {
    let mut m = Mesh::start(&socialgraph_testkit::redis_url()).await?;
    read_all(&m, 3).await?;
    let mut rc = m.relation.client().await?;
    rc.follow(FollowRequest { follower_id: 1, followee_id: 2 }).await?;
    m.settle(SETTLE).await?;
    // Forget the consumer's offsets but keep the users' guards: the replayed batch has nothing
    // to do for any user, and the restarted consumer must move on.
    m.counter.shutdown.cancel();
    (&mut m.counter.task).await??;
    let mut conn = redis_conn(&m.redis_url).await?;
    let _: i64 = redis::AsyncCommands::del(&mut conn, socialgraph_cache::keys::Keys::new(m.prefix.clone()).consumer_offsets("counter")).await?;
    m.counter = spawn_counter(m.counter_config()).await?;
    rc.follow(FollowRequest { follower_id: 3, followee_id: 2 }).await?;
    m.settle(Duration::from_secs(30)).await?;
    let got = read_all(&m, 3).await?;
    assert_eq!((got[&1], got[&2], got[&3]), ((1, 0), (0, 2), (1, 0)));
    m.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_sampled_check_repairs_drift_after_the_rest_period_and_counts_it() -> anyhow::Result<()> {
    let mut m = Mesh::start(&socialgraph_testkit::redis_url()).await?;
    m.counter.shutdown.cancel();
    (&mut m.counter.task).await??;
    let mut config = m.counter_config();
    // Rest periods are stored in whole seconds: 1 s could end a moment after it starts, and
    // a loaded machine then checks (and repairs) before the drift below is read back. The
    // period must also outlast the wait below for the first check to finish.
    config.counters.check_interval_secs = 8;
    m.counter = spawn_counter(config).await?;
    let mut rc = m.relation.client().await?;
    rc.follow(FollowRequest { follower_id: 1, followee_id: 2 }).await?;
    rc.follow(FollowRequest { follower_id: 3, followee_id: 2 }).await?;
    m.settle(SETTLE).await?;
    assert_eq!(read_all(&m, 3).await?[&2], (0, 2));

    // The first read rebuilt user 2 from the facts, which starts its rest period: no check
    // runs until the period is over.
    let keys = socialgraph_cache::keys::Keys::new(m.prefix.clone());
    let mut conn = redis_conn(&m.redis_url).await?;
    // The consumer created user 2's counters, so that first read ran its check (in the
    // background, off the read path), which started the rest period: wait for it to be set.
    let mut rest_s: i64 = -1;
    // Up to 10 s: the background task may wait for a core on a loaded machine.
    for _ in 0..2_000 {
        let raw: Vec<u8> = redis::AsyncCommands::hget(&mut conn, keys.user_counters(2), 2).await?;
        let stored = Stored::decode(&raw).expect("a well-formed value");
        if stored.rest_until_s > 0 {
            rest_s = stored.rest_until_s as i64 - rest_clock_now() as i64;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!((6..=10).contains(&rest_s), "a rebuilt user rests one interval plus jitter (rest ends in {rest_s} s)");
    // The rest period is set first and the check runs after it (a projection round trip): let
    // that check finish, or it could overwrite the drift made below before it is read back.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // Drift: followers of user 2 overwritten by hand, guard version untouched.
    let raw: Vec<u8> = redis::AsyncCommands::hget(&mut conn, keys.user_counters(2), 2).await?;
    let mut stored = Stored::decode(&raw).expect("a well-formed value");
    stored.counters.0[1] = 7;
    let _: () = redis::AsyncCommands::hset(&mut conn, keys.user_counters(2), 2, stored.encode()).await?;
    assert_eq!(read_all(&m, 3).await?[&2], (0, 7), "reads serve the stored value");

    let mut c = m.counter.counter().await?;
    socialgraph_testkit::eventually(Duration::from_secs(30), "the sampled check to repair user 2", || {
        let mut c = c.clone();
        async move {
            let got =
                c.get_user_counters(GetUserCountersRequest { user_id: 2, ..Default::default() }).await?.into_inner().counters.unwrap_or_default();
            tokio::time::sleep(Duration::from_millis(200)).await;
            Ok((got.followers == 2).then_some(()))
        }
    })
    .await?;
    let repairs = metric(&m.counter.metrics().await?, "sg_counter_repairs_total");
    assert_eq!(repairs, 1.0, "one repair counted");
    // Counters that agree with the facts are left alone by later checks (one is due after the
    // rest period the repair started).
    tokio::time::sleep(Duration::from_millis(10_500)).await;
    c.batch_get_user_counters(BatchGetUserCountersRequest { user_ids: vec![1, 2, 3], ..Default::default() }).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(metric(&m.counter.metrics().await?, "sg_counter_repairs_total"), 1.0);
    m.stop().await
}
