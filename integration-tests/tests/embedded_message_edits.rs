//! The embedded mode (`socialgraph dev`, one SQLite file) after a conversation changes: a group
//! left counts 0 unread in MessageService and CounterService alike (the two used to disagree
//! there), the CLI's delete-message, edit-message and rename-group do what the mesh does, and an
//! account being deleted leaves its conversations.

use socialgraph_integration_tests::spawn_dev;
use socialgraph_proto::counter::v1 as cpb;
use socialgraph_proto::counter::v1::counter_service_client::CounterServiceClient;
use socialgraph_proto::message::v1::message_service_client::MessageServiceClient;
use socialgraph_proto::message::v1::*;

/// `user`'s unread total from (message-svc, counter-svc).
async fn both(dev: &socialgraph_integration_tests::DevSvc, user: i64) -> anyhow::Result<(i64, i64)> {
    let mut m = MessageServiceClient::connect(dev.message.clone()).await?;
    let mut c = CounterServiceClient::connect(dev.counter.clone()).await?;
    let exact = m.get_unread_counts(GetUnreadCountsRequest { user_id: user }).await?.into_inner().total_unread;
    let counted = c.get_unread_counts(cpb::GetUnreadCountsRequest { user_id: user }).await?.into_inner().total_unread;
    Ok((exact, counted))
}

#[tokio::test]
async fn in_the_embedded_mode_leaving_deleting_editing_and_renaming_keep_both_apis_in_step() -> anyhow::Result<()> {
    let data = std::env::temp_dir().join(format!("{}.sqlite", socialgraph_testkit::unique("sg_dev_edits_")));
    let dev = spawn_dev(&data).await?;
    let mut m = MessageServiceClient::connect(dev.message.clone()).await?;
    let g = m.create_group(CreateGroupRequest { creator_id: 2, member_ids: vec![1, 3], title: "g".into() }).await?.into_inner().conversation_id;
    let send = |id: &str| SendMessageRequest { sender_id: 2, recipient_id: 0, conversation_id: g, client_message_id: id.into(), body: id.into() };
    m.send_message(send("m1")).await?;
    let m2 = m.send_message(send("m2")).await?.into_inner().message.unwrap_or_default();
    assert_eq!((both(&dev, 1).await?, both(&dev, 3).await?), ((2, 2), (2, 2)));
    m.leave(LeaveRequest { user_id: 1, conversation_id: g }).await?;
    assert_eq!(both(&dev, 1).await?, (0, 0), "a group left counts nothing, in both APIs");

    let e = dev.endpoints();
    socialgraph_cli::messages::delete(&e, 2, m2.message_id, true).await?;
    assert_eq!(both(&dev, 3).await?, (1, 1), "the deleted message leaves 3's unread");
    let page = m.list_messages(ListMessagesRequest { user_id: 3, conversation_id: g, page_size: 10, page_token: String::new() }).await?.into_inner();
    let first = page.messages.first().cloned().unwrap_or_default();
    assert_eq!(page.messages.len(), 1);
    socialgraph_cli::messages::edit(&e, 2, first.message_id, "m1, edited".into(), true).await?;
    socialgraph_cli::messages::rename(&e, 3, g, "renamed".into(), true).await?;
    let page = m.list_messages(ListMessagesRequest { user_id: 3, conversation_id: g, page_size: 10, page_token: String::new() }).await?.into_inner();
    assert_eq!((page.messages[0].body.as_slice(), page.messages[0].edited_at.is_some()), (b"m1, edited".as_slice(), true));
    let list = m.list_conversations(ListConversationsRequest { user_id: 3, page_size: 10, page_token: String::new() }).await?.into_inner();
    assert_eq!((list.conversations[0].title.as_str(), list.conversations[0].unread_count), ("renamed", 1));
    assert_eq!(both(&dev, 3).await?, (1, 1), "an edit and a rename move no count");
    let refused = socialgraph_cli::messages::delete(&e, 3, first.message_id, true).await.unwrap_err();
    assert!(refused.to_string().contains("NOT_THE_SENDER"), "{refused}");

    // An account being deleted leaves its conversations here too: 7's private messages to 3 stop
    // counting for 3 once relation-svc's account event is applied from the log.
    let private = |id: &str| SendMessageRequest { sender_id: 7, recipient_id: 3, conversation_id: 0, client_message_id: id.into(), body: id.into() };
    m.send_message(private("p1")).await?;
    assert_eq!(both(&dev, 3).await?, (2, 2));
    let mut r = socialgraph_proto::relation::v1::relation_service_client::RelationServiceClient::connect(dev.relation.clone()).await?;
    r.delete_account(socialgraph_proto::relation::v1::DeleteAccountRequest { user_id: 7 }).await?;
    socialgraph_testkit::eventually(std::time::Duration::from_secs(30), "the deleted account's conversation to end", || async {
        Ok((both(&dev, 3).await? == (1, 1)).then_some(()))
    })
    .await?;
    dev.stop().await?;
    std::fs::remove_file(&data).ok();
    Ok(())
}
