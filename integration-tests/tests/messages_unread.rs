//! counter-svc's unread counters, kept from `sg.message.v1`, against message-svc's exact
//! counts: through a kill -9 of counter-svc mid-replay, a full replay of the topic (offsets
//! deleted), copies of events at later offsets, the counter Redis's unread hashes lost
//! (rebuilt on read) and damaged (RebuildUnreadCounts), and a group of 500 members.
//!
//! Every user's counts are read once before the workload: that first read builds the user's
//! hash from message-svc, so what the later reads show is what the consumer kept.

use std::collections::BTreeSet;
use std::time::Duration;

use rskafka::client::partition::{Compression, UnknownTopicHandling};
use socialgraph_integration_tests::messages::{college_messages, message_client, message_on, replay, unread_counter_config};
use socialgraph_integration_tests::{Svc, admin, counter_caught_up, redis_conn, spawn_counter};
use socialgraph_proto::counter::v1 as cpb;
use socialgraph_proto::counter::v1::counter_service_client::CounterServiceClient;
use socialgraph_proto::message::v1::message_service_client::MessageServiceClient;
use socialgraph_proto::message::v1::{CreateGroupRequest, GetUnreadCountsRequest, SendMessageRequest};
use socialgraph_testkit::{Backend, kafka};
use tonic::transport::Channel;

const SETTLE: Duration = Duration::from_secs(120);

/// Each user's (total, per conversation) from message-svc (exact) and from counter-svc.
async fn both(
    m: &mut MessageServiceClient<Channel>,
    c: &mut CounterServiceClient<Channel>,
    user: i64,
) -> anyhow::Result<[(i64, Vec<(i64, i64)>); 2]> {
    let exact = m.get_unread_counts(GetUnreadCountsRequest { user_id: user }).await?.into_inner();
    let kept = c.get_unread_counts(cpb::GetUnreadCountsRequest { user_id: user }).await?.into_inner();
    Ok([
        (exact.total_unread, exact.conversations.iter().map(|u| (u.conversation_id, u.unread_count)).collect()),
        (kept.total_unread, kept.conversations.iter().map(|u| (u.conversation_id, u.unread_count)).collect()),
    ])
}

/// Reads every user's counts from counter-svc once, which builds their hashes (the consumer
/// keeps them from then on).
async fn build_hashes(counter: &Svc, users: &BTreeSet<i64>) -> anyhow::Result<()> {
    let mut c = counter.counter().await?;
    for u in users {
        c.get_unread_counts(cpb::GetUnreadCountsRequest { user_id: *u }).await?;
    }
    Ok(())
}

/// Waits until counter-svc's counts equal message-svc's for every user, then asserts it.
async fn assert_equal(msg: &Svc, counter: &Svc, users: &BTreeSet<i64>, what: &str) -> anyhow::Result<()> {
    let (mut m, mut c) = (message_client(msg).await?, counter.counter().await?);
    socialgraph_testkit::eventually(SETTLE, &format!("counter-svc's unread counts to equal message-svc's ({what})"), || {
        let (mut m, mut c) = (m.clone(), c.clone());
        async move {
            for u in users {
                let [exact, kept] = both(&mut m, &mut c, *u).await?;
                if exact != kept {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    return Ok(None);
                }
            }
            Ok(Some(()))
        }
    })
    .await?;
    let mut unread = 0;
    for u in users {
        let [exact, kept] = both(&mut m, &mut c, *u).await?;
        assert_eq!(kept, exact, "user {u}: unread total and per conversation ({what})");
        unread += exact.0;
    }
    println!("{what}: {} users' unread counts equal message-svc's ({unread} unread in all)", users.len());
    Ok(())
}

#[tokio::test]
async fn unread_counters_stay_exact_through_a_kill_a_full_replay_and_copies_of_events() -> anyhow::Result<()> {
    let (db, msg, topic, _relation) = message_on(Backend::Postgres, true).await?;
    let redis = socialgraph_testkit::redis_url();
    let (config, prefix) = unread_counter_config(&msg, &topic);
    let mut counter = spawn_counter(config.clone()).await?;

    let lines = college_messages(6_000)?;
    let users: BTreeSet<i64> = lines.iter().flat_map(|l| [l.src, l.dst]).collect();
    build_hashes(&counter, &users).await?;
    let client = message_client(&msg).await?;
    let sending = {
        let (client, lines) = (client.clone(), lines.clone());
        tokio::spawn(async move { replay(&client, &lines, 4).await })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    counter.kill().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let counter = spawn_counter(config.clone()).await?;
    let (_, reads) = sending.await??;
    println!("{} sends and {reads} marks, counter-svc killed 3 s in and restarted 3 s later", lines.len());
    counter_caught_up(&redis, &prefix, &[&topic], SETTLE).await?;
    assert_equal(&msg, &counter, &users, "after the kill").await?;

    // Every offset deleted: the next start replays the whole topic.
    counter.stop().await?;
    let mut conn = redis_conn(&redis).await?;
    redis::cmd("DEL").arg(socialgraph_cache::keys::Keys::new(prefix.clone()).consumer_offsets("counter")).query_async::<()>(&mut conn).await?;
    let counter = spawn_counter(config.clone()).await?;
    counter_caught_up(&redis, &prefix, &[&topic], SETTLE).await?;
    assert_equal(&msg, &counter, &users, "after a full replay").await?;

    // Copies of the first 2,000 records at later offsets.
    let k = kafka::connect(&kafka::brokers()).await?;
    let records = kafka::read_all(&k, &topic).await?;
    for (p, r) in records.iter().take(2_000) {
        let pc = k.partition_client(topic.as_str(), *p, UnknownTopicHandling::Retry).await?;
        pc.produce(vec![r.record.clone()], Compression::NoCompression).await?;
    }
    counter_caught_up(&redis, &prefix, &[&topic], SETTLE).await?;
    assert_equal(&msg, &counter, &users, "after 2,000 copies").await?;

    // The counter Redis loses the unread hashes (this test's keys of a flush): each user's next
    // read rebuilds them from message-svc.
    let keys = socialgraph_cache::keys::Keys::new(prefix.clone());
    let lost: Vec<String> = users.iter().map(|u| keys.user_unread(*u)).collect();
    redis::cmd("DEL").arg(&lost).query_async::<()>(&mut conn).await?;
    assert_equal(&msg, &counter, &users, "after the hashes were lost").await?;

    // A damaged hash (a wrong total, a wrong count at the current version) is repaired by the
    // admin rebuild; without the admin token it is refused.
    let (mut m, mut c) = (message_client(&msg).await?, counter.counter().await?);
    let (victim, exact) = {
        let mut found = None;
        for u in &users {
            let [exact, _] = both(&mut m, &mut c, *u).await?;
            if !exact.1.is_empty() {
                found = Some((*u, exact));
                break;
            }
        }
        found.ok_or_else(|| anyhow::anyhow!("no user with unread messages"))?
    };
    let key = keys.user_unread(victim);
    let field = exact.1[0].0.to_string();
    let stored: String = redis::cmd("HGET").arg(&key).arg(&field).query_async(&mut conn).await?;
    let version = stored.split_once(':').map(|(v, _)| v.to_owned()).unwrap_or_default();
    redis::cmd("HSET").arg(&key).arg("t").arg(9_999).arg(&field).arg(format!("{version}:777")).query_async::<()>(&mut conn).await?;
    assert_ne!(both(&mut m, &mut c, victim).await?[1], exact, "damaged");
    let refused = c.rebuild_unread_counts(cpb::RebuildUnreadCountsRequest { user_id: victim }).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    let rebuilt = c.rebuild_unread_counts(admin(cpb::RebuildUnreadCountsRequest { user_id: victim })).await?.into_inner();
    let rebuilt = (rebuilt.total_unread, rebuilt.conversations.iter().map(|u| (u.conversation_id, u.unread_count)).collect::<Vec<_>>());
    assert_eq!(rebuilt, exact, "user {victim} rebuilt from message-svc");
    assert_eq!(both(&mut m, &mut c, victim).await?, [exact.clone(), exact], "and read so");
    counter.stop().await?;
    msg.stop().await?;
    db.drop_db().await
}

#[tokio::test]
async fn a_group_of_500_members_with_2000_messages_keeps_every_members_unread_exact() -> anyhow::Result<()> {
    let (db, msg, topic, _relation) = message_on(Backend::Postgres, true).await?;
    let counter = spawn_counter(unread_counter_config(&msg, &topic).0).await?;
    let mut m = message_client(&msg).await?;
    let members: Vec<i64> = (1001..=1499).collect();
    let group = m.create_group(CreateGroupRequest { creator_id: 1000, member_ids: members.clone(), title: "all".into() }).await?.into_inner();
    assert_eq!(group.member_count, 500);
    build_hashes(&counter, &(1000..=1499).collect()).await?;
    // Senders drawn from the members by a fixed rule; each member's unread is the count of
    // messages after its last own message.
    let everyone: Vec<i64> = (1000..=1499).collect();
    let mut last_sent = std::collections::HashMap::new();
    let started = std::time::Instant::now();
    for i in 0..2_000usize {
        let sender = everyone[(i * 7919) % everyone.len() / 3];
        let req = SendMessageRequest {
            sender_id: sender,
            recipient_id: 0,
            conversation_id: group.conversation_id,
            client_message_id: format!("g{i}"),
            body: vec![b'x'; 16],
        };
        m.send_message(req).await?;
        last_sent.insert(sender, i);
    }
    println!("2,000 messages to 500 members in {:.1} s", started.elapsed().as_secs_f64());
    let users: BTreeSet<i64> = everyone.iter().copied().collect();
    let mut exact = m.clone();
    for u in &users {
        let want = last_sent.get(u).map_or(2_000, |i| 1_999 - i) as i64;
        assert_eq!(exact.get_unread_counts(GetUnreadCountsRequest { user_id: *u }).await?.into_inner().total_unread, want, "member {u}");
    }
    let started = std::time::Instant::now();
    assert_equal(&msg, &counter, &users, "group of 500").await?;
    println!("every member's unread visible in counter-svc {:.1} s after the last send", started.elapsed().as_secs_f64());
    counter.stop().await?;
    msg.stop().await?;
    db.drop_db().await
}
