//! Blocks stop private messages, decided by message-svc from its own copy of relation-svc's
//! blocks (kept from the account events), on PostgreSQL and MariaDB: in both directions, into
//! an existing conversation and before the first one, with nothing written; a retried send of an
//! earlier message still answers; groups go on; unblocking lets messages through again; and with
//! relation-svc stopped, private sends between users who do not block each other go on while
//! those between users who do are still refused. Prints how long a block took to reach
//! message-svc.

use std::time::{Duration, Instant};

use socialgraph_integration_tests::messages::{message_client, message_on, send_request};
use socialgraph_integration_tests::reason;
use socialgraph_proto::message::v1::{CreateGroupRequest, ListConversationsRequest, ListMessagesRequest};
use socialgraph_proto::relation::v1::{BlockRequest, UnblockRequest};
use socialgraph_storage::block_pairs;
use socialgraph_testkit::{Backend, TestDb};
use tonic::Code;

/// Waits until message-svc's copy holds the pair as `blocked`; returns how long that took.
async fn copied(db: &TestDb, a: i64, b: i64, blocked: bool) -> anyhow::Result<Duration> {
    let started = Instant::now();
    socialgraph_testkit::eventually(Duration::from_secs(60), "the block to reach message-svc's copy", || async {
        Ok((block_pairs::copy_blocked(&db.conn, a, b).await? == blocked).then_some(()))
    })
    .await?;
    Ok(started.elapsed())
}

async fn a_block_either_way_stops_private_messages_and_nothing_else(backend: Backend) -> anyhow::Result<()> {
    let (db, svc, _, relation) = message_on(backend, true).await?;
    let mut c = message_client(&svc).await?;
    let mut r = relation.client().await?;
    let first = c.send_message(send_request(1, 2, 0, "before")).await?.into_inner().message.unwrap_or_default();
    let group = c.create_group(CreateGroupRequest { creator_id: 1, member_ids: vec![2, 3], title: "g".into() }).await?.into_inner().conversation_id;
    r.block(BlockRequest { blocker_id: 2, blocked_id: 1 }).await?;
    let took = copied(&db, 1, 2, true).await?;
    println!("{backend:?}: a block reached message-svc {} ms after Block returned", took.as_millis());

    for (what, req) in [
        ("the blocked user to the blocker", send_request(1, 2, 0, "m1")),
        ("the blocker to the blocked user", send_request(2, 1, 0, "m2")),
        ("into the pair's conversation by id", send_request(1, 0, first.conversation_id, "m3")),
    ] {
        let refused = c.send_message(req).await.unwrap_err();
        assert_eq!((refused.code(), reason(&refused)), (Code::PermissionDenied, "BLOCKED".into()), "{what}");
    }
    let retry = c.send_message(send_request(1, 2, 0, "before")).await?.into_inner();
    assert_eq!((retry.created, retry.message.unwrap_or_default().message_id), (false, first.message_id), "a retry of an earlier send answers");
    let page = c.list_messages(ListMessagesRequest { user_id: 2, conversation_id: first.conversation_id, ..Default::default() }).await?;
    assert_eq!(page.into_inner().messages.len(), 1, "nothing refused was written");
    c.send_message(send_request(1, 0, group, "group")).await?;

    // A pair with no conversation yet: the refused first message creates none.
    r.block(BlockRequest { blocker_id: 3, blocked_id: 4 }).await?;
    copied(&db, 3, 4, true).await?;
    let refused = c.send_message(send_request(4, 3, 0, "hello")).await.unwrap_err();
    assert_eq!(reason(&refused), "BLOCKED");
    let listed = c.list_conversations(ListConversationsRequest { user_id: 4, ..Default::default() }).await?.into_inner();
    assert!(listed.conversations.is_empty(), "no conversation was created");

    // Blocked both ways, then lifted one way: still blocked; lifted both ways: messages go on.
    r.block(BlockRequest { blocker_id: 1, blocked_id: 2 }).await?;
    r.unblock(UnblockRequest { blocker_id: 2, blocked_id: 1 }).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(block_pairs::copy_blocked(&db.conn, 1, 2).await?, "1 still blocks 2");
    r.unblock(UnblockRequest { blocker_id: 1, blocked_id: 2 }).await?;
    copied(&db, 1, 2, false).await?;
    let after = c.send_message(send_request(1, 2, 0, "after")).await?.into_inner().message.unwrap_or_default();
    assert_eq!((after.conversation_id, after.seq), (first.conversation_id, 2), "unblocked: the pair's conversation goes on");

    // relation-svc stopped: message-svc asks it nothing, so the copy decides alone.
    relation.stop().await?;
    c.send_message(send_request(1, 2, 0, "while relation-svc is down")).await?;
    let refused = c.send_message(send_request(3, 4, 0, "still blocked")).await.unwrap_err();
    assert_eq!((refused.code(), reason(&refused)), (Code::PermissionDenied, "BLOCKED".into()), "blocked pairs stay refused");
    c.send_message(send_request(2, 0, group, "group while down")).await?;
    svc.stop().await?;
    db.drop_db().await
}

#[tokio::test]
async fn a_block_either_way_stops_private_messages_and_nothing_else_on_postgres() -> anyhow::Result<()> {
    a_block_either_way_stops_private_messages_and_nothing_else(Backend::Postgres).await
}

#[tokio::test]
async fn a_block_either_way_stops_private_messages_and_nothing_else_on_mariadb() -> anyhow::Result<()> {
    a_block_either_way_stops_private_messages_and_nothing_else(Backend::MariaDb).await
}
