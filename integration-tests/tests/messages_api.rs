//! MessageService's rules on PostgreSQL: idempotent sends, members only, groups (cap, owner,
//! removal), read cursors forward only, stable paging while messages arrive, and clear errors
//! for bad input.

use socialgraph_integration_tests::messages::{message_client, message_on};
use socialgraph_integration_tests::reason;
use socialgraph_proto::message::v1::{
    AddMembersRequest, CreateGroupRequest, GetUnreadCountsRequest, LeaveRequest, ListConversationsRequest, ListMessagesRequest, MarkReadRequest,
    RemoveMemberRequest, SendMessageRequest,
};
use socialgraph_testkit::Backend;
use tonic::Code;

fn to_user(from: i64, to: i64, id: &str, body: &str) -> SendMessageRequest {
    SendMessageRequest { sender_id: from, recipient_id: to, conversation_id: 0, client_message_id: id.into(), body: body.into() }
}

fn to_group(from: i64, group: i64, id: &str, body: &str) -> SendMessageRequest {
    SendMessageRequest { sender_id: from, recipient_id: 0, conversation_id: group, client_message_id: id.into(), body: body.into() }
}

type Client = socialgraph_proto::message::v1::message_service_client::MessageServiceClient<tonic::transport::Channel>;

async fn bodies(c: &mut Client, user: i64, conversation: i64) -> anyhow::Result<Vec<String>> {
    let req = ListMessagesRequest { user_id: user, conversation_id: conversation, page_size: 1000, page_token: String::new() };
    Ok(c.list_messages(req).await?.into_inner().messages.into_iter().map(|m| String::from_utf8_lossy(&m.body).into_owned()).collect())
}

async fn unread(c: &mut Client, user: i64) -> anyhow::Result<i64> {
    Ok(c.get_unread_counts(GetUnreadCountsRequest { user_id: user }).await?.into_inner().total_unread)
}

#[tokio::test]
async fn private_sends_are_idempotent_members_only_and_read_cursors_move_forward_only() -> anyhow::Result<()> {
    let (db, svc, _, _relation) = message_on(Backend::Postgres, false).await?;
    let mut c = message_client(&svc).await?;
    let first = c.send_message(to_user(1, 2, "a", "hello")).await?.into_inner();
    assert!(first.created);
    let m1 = first.message.unwrap_or_default();
    assert_eq!(m1.seq, 1);
    let again = c.send_message(to_user(1, 2, "a", "hello")).await?.into_inner();
    assert_eq!((again.created, again.message.unwrap_or_default().message_id), (false, m1.message_id), "a retry returns the first send");
    let reused = c.send_message(to_user(1, 3, "a", "hello")).await.unwrap_err();
    assert_eq!((reused.code(), reason(&reused)), (Code::FailedPrecondition, "CLIENT_MESSAGE_ID_REUSED".into()));
    let reply = c.send_message(to_user(2, 1, "a", "hi")).await?.into_inner().message.unwrap_or_default();
    assert_eq!((reply.conversation_id, reply.seq), (m1.conversation_id, 2), "the pair has one conversation; client ids are per sender");
    let m3 = c.send_message(to_user(1, 2, "b", "how are you")).await?.into_inner().message.unwrap_or_default();
    assert_eq!((unread(&mut c, 1).await?, unread(&mut c, 2).await?), (0, 1), "sending marks the sender's side read: 2 read up to its reply");
    assert_eq!(bodies(&mut c, 2, m1.conversation_id).await?, ["how are you", "hi", "hello"]);
    let outsider = c.list_messages(ListMessagesRequest { user_id: 3, conversation_id: m1.conversation_id, ..Default::default() }).await.unwrap_err();
    assert_eq!((outsider.code(), reason(&outsider)), (Code::PermissionDenied, "NOT_A_MEMBER".into()));
    let intruder = c.send_message(to_group(3, m1.conversation_id, "x", "let me in")).await.unwrap_err();
    assert_eq!(intruder.code(), Code::PermissionDenied);
    let read = c.mark_read(MarkReadRequest { user_id: 2, conversation_id: m1.conversation_id, up_to_message_id: m3.message_id }).await?.into_inner();
    assert_eq!((read.changed, read.read_seq, read.unread_count), (true, 3, 0));
    let older = c.mark_read(MarkReadRequest { user_id: 2, conversation_id: m1.conversation_id, up_to_message_id: m1.message_id }).await?.into_inner();
    assert_eq!((older.changed, older.read_seq), (false, 3), "an older cursor is a no-op");
    let other = c.send_message(to_user(4, 5, "z", "elsewhere")).await?.into_inner().message.unwrap_or_default();
    let foreign =
        c.mark_read(MarkReadRequest { user_id: 2, conversation_id: m1.conversation_id, up_to_message_id: other.message_id }).await.unwrap_err();
    assert_eq!((foreign.code(), reason(&foreign)), (Code::InvalidArgument, "UNKNOWN_MESSAGE".into()));
    let listed = c.list_conversations(ListConversationsRequest { user_id: 1, ..Default::default() }).await?.into_inner().conversations;
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].peer_id, listed[0].last_message.clone().unwrap_or_default().message_id), (2, m3.message_id));
    svc.stop().await?;
    db.drop_db().await
}

#[tokio::test]
async fn bad_input_gets_invalid_argument_naming_each_field() -> anyhow::Result<()> {
    let (db, svc, _, _relation) = message_on(Backend::Postgres, false).await?;
    let mut c = message_client(&svc).await?;
    let cases = [
        (to_user(0, 2, "a", "x"), "sender_id"),
        (to_user(1, -2, "a", "x"), "recipient_id"),
        (to_user(1, 1, "a", "x"), "recipient_id"),
        (
            SendMessageRequest { sender_id: 1, recipient_id: 2, conversation_id: 3, client_message_id: "a".into(), body: b"x".to_vec() },
            "conversation_id",
        ),
        (to_user(1, 2, "", "x"), "client_message_id"),
        (to_user(1, 2, &"k".repeat(65), "x"), "client_message_id"),
        (to_user(1, 2, "tab\there", "x"), "client_message_id"),
        (SendMessageRequest { body: vec![0; 16 * 1024 + 1], ..to_user(1, 2, "a", "") }, "body"),
    ];
    for (req, field) in cases {
        let e = c.send_message(req).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{field}: {e:?}");
        let details = tonic_types::StatusExt::get_error_details(&e);
        let fields: Vec<String> = details.bad_request().map(|b| b.field_violations.iter().map(|v| v.field.clone()).collect()).unwrap_or_default();
        assert!(fields.contains(&field.to_owned()), "{field} named in {fields:?}");
    }
    let token =
        c.list_messages(ListMessagesRequest { user_id: 1, conversation_id: 1, page_size: 10, page_token: "forged".into() }).await.unwrap_err();
    assert_eq!((token.code(), reason(&token)), (Code::InvalidArgument, "BAD_PAGE_TOKEN".into()));
    let big = c.create_group(CreateGroupRequest { creator_id: 1, member_ids: (2..=1002).collect(), title: String::new() }).await.unwrap_err();
    assert_eq!(big.code(), Code::InvalidArgument, "more than 1000 ids in one request");
    let title = c.create_group(CreateGroupRequest { creator_id: 1, member_ids: vec![2], title: "t".repeat(201) }).await.unwrap_err();
    assert_eq!(title.code(), Code::InvalidArgument);
    assert_eq!(c.get_unread_counts(GetUnreadCountsRequest { user_id: 0 }).await.unwrap_err().code(), Code::InvalidArgument);
    svc.stop().await?;
    db.drop_db().await
}

#[tokio::test]
async fn a_group_keeps_every_members_unread_exact_and_a_removed_member_reads_nothing_later() -> anyhow::Result<()> {
    let (db, svc, _, _relation) = message_on(Backend::Postgres, false).await?;
    let mut c = message_client(&svc).await?;
    let g = c.create_group(CreateGroupRequest { creator_id: 1, member_ids: vec![2, 3, 3, 1], title: "team".into() }).await?.into_inner();
    assert_eq!(g.member_count, 3, "the creator and two others, duplicates ignored");
    let group = g.conversation_id;
    c.send_message(to_group(1, group, "g1", "one")).await?;
    c.send_message(to_group(2, group, "g2", "two")).await?;
    assert_eq!((unread(&mut c, 1).await?, unread(&mut c, 2).await?, unread(&mut c, 3).await?), (1, 0, 2));
    let added = c.add_members(AddMembersRequest { actor_id: 3, conversation_id: group, user_ids: vec![4, 2] }).await?.into_inner();
    assert_eq!((added.added, added.member_count), (1, 4), "current members are skipped");
    c.send_message(to_group(4, group, "g3", "three")).await?;
    assert_eq!(bodies(&mut c, 4, group).await?, ["three"], "a new member sees messages from its joining on");
    let not_owner = c.remove_member(RemoveMemberRequest { actor_id: 2, conversation_id: group, user_id: 3 }).await.unwrap_err();
    assert_eq!((not_owner.code(), reason(&not_owner)), (Code::PermissionDenied, "NOT_THE_OWNER".into()));
    assert!(c.remove_member(RemoveMemberRequest { actor_id: 1, conversation_id: group, user_id: 3 }).await?.into_inner().changed);
    assert!(!c.remove_member(RemoveMemberRequest { actor_id: 1, conversation_id: group, user_id: 3 }).await?.into_inner().changed);
    c.send_message(to_group(1, group, "g4", "four")).await?;
    assert_eq!(bodies(&mut c, 3, group).await?, ["three", "two", "one"], "nothing sent after the removal");
    assert_eq!(unread(&mut c, 3).await?, 0, "a group a member was removed from counts nothing unread");
    let gone = c.send_message(to_group(3, group, "g5", "still here?")).await.unwrap_err();
    assert_eq!(gone.code(), Code::PermissionDenied);
    assert!(c.leave(LeaveRequest { user_id: 2, conversation_id: group }).await?.into_inner().changed);
    let list = c.list_conversations(ListConversationsRequest { user_id: 2, ..Default::default() }).await?.into_inner().conversations;
    assert_eq!((list[0].active, list[0].member_count, list[0].title.as_str()), (false, 2, "team"));
    let rejoin = c.add_members(AddMembersRequest { actor_id: 1, conversation_id: group, user_ids: vec![3] }).await?.into_inner();
    assert_eq!(rejoin.added, 1);
    assert_eq!(unread(&mut c, 3).await?, 0, "added again: read up to the present");
    let capped = c.add_members(AddMembersRequest { actor_id: 1, conversation_id: group, user_ids: (100..1100).collect() }).await.unwrap_err();
    assert_eq!((capped.code(), reason(&capped)), (Code::FailedPrecondition, "GROUP_MEMBER_LIMIT".into()));
    let private = c.send_message(to_user(1, 9, "p", "hi")).await?.into_inner().message.unwrap_or_default().conversation_id;
    let not_group = c.add_members(AddMembersRequest { actor_id: 1, conversation_id: private, user_ids: vec![5] }).await.unwrap_err();
    assert_eq!((not_group.code(), reason(&not_group)), (Code::FailedPrecondition, "NOT_A_GROUP".into()));
    svc.stop().await?;
    db.drop_db().await
}

#[tokio::test]
async fn paging_while_messages_arrive_neither_skips_nor_repeats_and_concurrent_sends_keep_one_order() -> anyhow::Result<()> {
    let (db, svc, _, _relation) = message_on(Backend::Postgres, false).await?;
    let mut c = message_client(&svc).await?;
    let group =
        c.create_group(CreateGroupRequest { creator_id: 1, member_ids: (2..=8).collect(), title: String::new() }).await?.into_inner().conversation_id;
    // Eight senders at once into one conversation: every message gets its own position.
    let mut tasks = Vec::new();
    for sender in 1..=8i64 {
        let mut c = c.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..40 {
                c.send_message(to_group(sender, group, &format!("{sender}-{i}"), &format!("{sender}-{i}"))).await?;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let all =
        c.list_messages(ListMessagesRequest { user_id: 1, conversation_id: group, page_size: 1000, page_token: String::new() }).await?.into_inner();
    let seqs: Vec<i64> = all.messages.iter().map(|m| m.seq).collect();
    assert_eq!(seqs, (1..=320).rev().collect::<Vec<_>>(), "one total order, no gaps");
    for sender in 1..=8 {
        let own: Vec<String> = all.messages.iter().rev().filter(|m| m.sender_id == sender).map(|m| m.client_message_id.clone()).collect();
        assert_eq!(own, (0..40).map(|i| format!("{sender}-{i}")).collect::<Vec<_>>(), "each sender's messages in its order");
    }
    // Page through while new messages arrive: the pages hold exactly the 320 from before.
    let mut seen = Vec::new();
    let mut token = String::new();
    let mut n = 0;
    loop {
        let page = c.list_messages(ListMessagesRequest { user_id: 2, conversation_id: group, page_size: 25, page_token: token }).await?.into_inner();
        seen.extend(page.messages.iter().map(|m| m.seq));
        c.send_message(to_group(3, group, &format!("late-{n}"), "late")).await?;
        n += 1;
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(seen, (1..=320).rev().collect::<Vec<_>>());
    svc.stop().await?;
    db.drop_db().await
}
