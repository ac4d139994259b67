//! counter-svc applies the unread counts each message event carries and asks message-svc
//! nothing while it does (docs/src/architecture/events.md#events-carry-state): with message-svc
//! stopped, the events it had already published are still applied, and every user's counts
//! end equal to what message-svc answered before it stopped.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use socialgraph_integration_tests::messages::{college_messages, message_client, message_on, replay, unread_counter_config};
use socialgraph_integration_tests::{counter_caught_up, outbox_drained, spawn_counter};
use socialgraph_proto::counter::v1 as cpb;
use socialgraph_proto::message::v1::GetUnreadCountsRequest;
use socialgraph_testkit::Backend;

const SETTLE: Duration = Duration::from_secs(120);

type Counts = (i64, Vec<(i64, i64)>);

async fn applied_with_message_svc_stopped(backend: Backend) -> anyhow::Result<()> {
    let (db, msg, topic, relation) = message_on(backend, true).await?;
    let (config, prefix) = unread_counter_config(&msg, &topic);
    let lines = college_messages(1_500)?;
    let users: BTreeSet<i64> = lines.iter().flat_map(|l| [l.src, l.dst]).collect();

    // A user's first read builds the user's counts from message-svc (the request path); from
    // then on only the consumer moves them.
    let counter = spawn_counter(config.clone()).await?;
    let mut c = counter.counter().await?;
    for u in &users {
        c.get_unread_counts(cpb::GetUnreadCountsRequest { user_id: *u }).await?;
    }
    counter.stop().await?;

    // With counter-svc away, message-svc takes the sends and marks and publishes their events.
    let mut m = message_client(&msg).await?;
    let (_, marks) = replay(&m, &lines, 4).await?;
    outbox_drained(&db, SETTLE).await?;
    let mut exact: BTreeMap<i64, Counts> = BTreeMap::new();
    for u in &users {
        let r = m.get_unread_counts(GetUnreadCountsRequest { user_id: *u }).await?.into_inner();
        exact.insert(*u, (r.total_unread, r.conversations.iter().map(|x| (x.conversation_id, x.unread_count)).collect()));
    }
    let unread: i64 = exact.values().map(|(t, _)| t).sum();
    assert!(unread > 0, "the replay left messages unread");

    // message-svc stopped: counter-svc starts, reads the published events and applies them.
    msg.stop().await?;
    let counter = spawn_counter(config).await?;
    counter_caught_up(&socialgraph_testkit::redis_url(), &prefix, &[&topic], SETTLE).await?;
    let mut c = counter.counter().await?;
    for u in &users {
        let r = c.get_unread_counts(cpb::GetUnreadCountsRequest { user_id: *u }).await?.into_inner();
        let kept: Counts = (r.total_unread, r.conversations.iter().map(|x| (x.conversation_id, x.unread_count)).collect());
        assert_eq!(kept, exact[u], "user {u}: counter-svc applied the published events without message-svc");
    }
    println!(
        "{backend:?}: {} sends and {marks} marks published, message-svc stopped; counter-svc applied them alone: {} users, {unread} unread, all exact",
        lines.len(),
        users.len()
    );
    counter.stop().await?;
    relation.stop().await?;
    db.drop_db().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_counts_are_applied_while_message_svc_is_stopped_on_postgres() -> anyhow::Result<()> {
    applied_with_message_svc_stopped(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_counts_are_applied_while_message_svc_is_stopped_on_mariadb() -> anyhow::Result<()> {
    applied_with_message_svc_stopped(Backend::MariaDb).await
}
