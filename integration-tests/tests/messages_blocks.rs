//! Blocks stop private messages (relation-svc's blocks, asked by message-svc on PostgreSQL):
//! in both directions, into an existing conversation and before the first one, with nothing
//! written; a retried send of an earlier message still answers; groups go on; unblocking lets
//! messages through again; and with relation-svc down private sends are UNAVAILABLE, never let
//! through unchecked.

use socialgraph_integration_tests::messages::{message_client, message_on, send_request};
use socialgraph_integration_tests::reason;
use socialgraph_proto::message::v1::{CreateGroupRequest, ListConversationsRequest, ListMessagesRequest};
use socialgraph_proto::relation::v1::{BlockRequest, UnblockRequest};
use socialgraph_testkit::Backend;
use tonic::Code;

#[tokio::test]
async fn a_block_either_way_stops_private_messages_and_nothing_else() -> anyhow::Result<()> {
    let (db, svc, _, relation) = message_on(Backend::Postgres, false).await?;
    let mut c = message_client(&svc).await?;
    let mut r = relation.client().await?;
    let first = c.send_message(send_request(1, 2, 0, "before")).await?.into_inner().message.unwrap_or_default();
    let group = c.create_group(CreateGroupRequest { creator_id: 1, member_ids: vec![2, 3], title: "g".into() }).await?.into_inner().conversation_id;
    r.block(BlockRequest { blocker_id: 2, blocked_id: 1 }).await?;

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
    let refused = c.send_message(send_request(4, 3, 0, "hello")).await.unwrap_err();
    assert_eq!(reason(&refused), "BLOCKED");
    let listed = c.list_conversations(ListConversationsRequest { user_id: 4, ..Default::default() }).await?.into_inner();
    assert!(listed.conversations.is_empty(), "no conversation was created");

    r.unblock(UnblockRequest { blocker_id: 2, blocked_id: 1 }).await?;
    let after = c.send_message(send_request(1, 2, 0, "after")).await?.into_inner().message.unwrap_or_default();
    assert_eq!((after.conversation_id, after.seq), (first.conversation_id, 2), "unblocked: the pair's conversation goes on");

    relation.stop().await?;
    let down = c.send_message(send_request(1, 2, 0, "while down")).await.unwrap_err();
    assert_eq!((down.code(), reason(&down)), (Code::Unavailable, "PEER_UNAVAILABLE".into()), "never sent unchecked");
    c.send_message(send_request(2, 0, group, "group while down")).await?;
    svc.stop().await?;
    db.drop_db().await
}
