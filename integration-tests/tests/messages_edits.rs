//! What members see after a conversation changes under them, on PostgreSQL and MariaDB, in
//! message-svc and in counter-svc's unread counters (kept from the events alone):
//! - a group left, or removed from, counts 0 unread for that member, now and after later sends;
//! - DeleteMessage by the sender takes the message out of the unread counts of those who had
//!   not read it and out of every page, and a conversation whose newest message goes moves back
//!   in the lists; EditMessage and RenameGroup change no count and no order;
//! - the refusals: someone else's message, an unknown or deleted one, a rename by an outsider or
//!   of a private conversation, a retried send of a deleted message;
//! - an account being deleted (relation-svc's AccountEvent) leaves its conversations: its private
//!   ones count 0 unread for the peer, a later message from the id opens them again, and a copy
//!   of the event at a later offset changes nothing.

use std::collections::BTreeSet;
use std::time::Duration;

use socialgraph_integration_tests::messages::{MessageMesh, message_client, message_mesh, send_request, unread_counter_config};
use socialgraph_integration_tests::{Svc, reason, spawn_counter};
use socialgraph_proto::counter::v1 as cpb;
use socialgraph_proto::message::v1::message_service_client::MessageServiceClient;
use socialgraph_proto::message::v1::*;
use socialgraph_testkit::Backend;
use tonic::Code;
use tonic::transport::Channel;

const SETTLE: Duration = Duration::from_secs(60);
type Client = MessageServiceClient<Channel>;

/// (total, per conversation) of `user` from message-svc.
async fn exact(m: &mut Client, user: i64) -> anyhow::Result<(i64, Vec<(i64, i64)>)> {
    let r = m.get_unread_counts(GetUnreadCountsRequest { user_id: user }).await?.into_inner();
    Ok((r.total_unread, r.conversations.iter().map(|u| (u.conversation_id, u.unread_count)).collect()))
}

/// Asserts message-svc's counts of each `(user, total)`, then waits until counter-svc's equal
/// message-svc's for every user of `all`.
async fn assert_unread(msg: &Svc, counter: &Svc, want: &[(i64, i64)], all: &BTreeSet<i64>, what: &str) -> anyhow::Result<()> {
    let mut m = message_client(msg).await?;
    for (user, total) in want {
        assert_eq!(exact(&mut m, *user).await?.0, *total, "user {user}'s unread in message-svc ({what})");
    }
    let c = counter.counter().await?;
    socialgraph_testkit::eventually(SETTLE, &format!("counter-svc's unread to equal message-svc's ({what})"), || {
        let (mut m, mut c) = (m.clone(), c.clone());
        async move {
            for u in all {
                let kept = c.get_unread_counts(cpb::GetUnreadCountsRequest { user_id: *u }).await?.into_inner();
                let kept = (kept.total_unread, kept.conversations.iter().map(|x| (x.conversation_id, x.unread_count)).collect::<Vec<_>>());
                if kept != exact(&mut m, *u).await? {
                    return Ok(None);
                }
            }
            Ok(Some(()))
        }
    })
    .await
}

/// `user`'s conversations in list order: (id, unread, active).
async fn listed(m: &mut Client, user: i64) -> anyhow::Result<Vec<(i64, i64, bool)>> {
    let r = m.list_conversations(ListConversationsRequest { user_id: user, page_size: 100, page_token: String::new() }).await?.into_inner();
    Ok(r.conversations.iter().map(|c| (c.conversation_id, c.unread_count, c.active)).collect())
}

async fn bodies(m: &mut Client, user: i64, conversation: i64) -> anyhow::Result<Vec<String>> {
    let req = ListMessagesRequest { user_id: user, conversation_id: conversation, page_size: 100, page_token: String::new() };
    Ok(m.list_messages(req).await?.into_inner().messages.iter().map(|x| String::from_utf8_lossy(&x.body).into_owned()).collect())
}

async fn send(m: &mut Client, from: i64, to: i64, conversation: i64, id: &str) -> anyhow::Result<Message> {
    Ok(m.send_message(send_request(from, to, conversation, id)).await?.into_inner().message.unwrap_or_default())
}

/// message-svc with its relay, and a counter-svc keeping unread counts from its topic, whose
/// hashes of `users` are built before anything happens.
async fn mesh(backend: Backend, users: &BTreeSet<i64>) -> anyhow::Result<(socialgraph_testkit::TestDb, Svc, Svc, Svc, String)> {
    let MessageMesh { db, message, topic, relation, account_topic } = message_mesh(backend, true).await?;
    let counter = spawn_counter(unread_counter_config(&message, &topic).0).await?;
    let mut c = counter.counter().await?;
    for u in users {
        c.get_unread_counts(cpb::GetUnreadCountsRequest { user_id: *u }).await?;
    }
    Ok((db, message, counter, relation, account_topic))
}

async fn leaving_counts_zero(backend: Backend) -> anyhow::Result<()> {
    let users: BTreeSet<i64> = [1, 2, 3, 4].into();
    let (db, msg, counter, _relation, _) = mesh(backend, &users).await?;
    let mut m = message_client(&msg).await?;
    let g = m.create_group(CreateGroupRequest { creator_id: 2, member_ids: vec![1, 3, 4], title: "g".into() }).await?.into_inner().conversation_id;
    send(&mut m, 2, 0, g, "m1").await?;
    send(&mut m, 2, 0, g, "m2").await?;
    assert_unread(&msg, &counter, &[(1, 2), (3, 2), (4, 2)], &users, "two sent").await?;

    // 1 leaves without reading; 2 (the owner) removes 3 without 3 reading.
    assert!(m.leave(LeaveRequest { user_id: 1, conversation_id: g }).await?.into_inner().changed);
    assert!(m.remove_member(RemoveMemberRequest { actor_id: 2, conversation_id: g, user_id: 3 }).await?.into_inner().changed);
    assert_unread(&msg, &counter, &[(1, 0), (3, 0), (4, 2)], &users, "after a leave and a removal").await?;
    assert_eq!(listed(&mut m, 1).await?, [(g, 0, false)], "listed, inactive, nothing unread");
    send(&mut m, 4, 0, g, "m3").await?;
    assert_unread(&msg, &counter, &[(1, 0), (2, 1), (3, 0), (4, 0)], &users, "a later send reaches members only").await?;
    // Back in: unread counts start from the rejoin.
    m.add_members(AddMembersRequest { actor_id: 2, conversation_id: g, user_ids: vec![1] }).await?;
    send(&mut m, 2, 0, g, "m4").await?;
    assert_unread(&msg, &counter, &[(1, 1), (3, 0), (4, 1)], &users, "after a rejoin").await?;
    drop((msg, counter));
    db.drop_db().await
}

#[tokio::test]
async fn a_group_left_or_removed_from_counts_zero_unread_on_postgres() -> anyhow::Result<()> {
    leaving_counts_zero(Backend::Postgres).await
}

#[tokio::test]
async fn a_group_left_or_removed_from_counts_zero_unread_on_mariadb() -> anyhow::Result<()> {
    leaving_counts_zero(Backend::MariaDb).await
}

async fn deletes_edits_and_renames(backend: Backend) -> anyhow::Result<()> {
    let users: BTreeSet<i64> = [1, 2, 3, 5].into();
    let (db, msg, counter, _relation, _) = mesh(backend, &users).await?;
    let mut m = message_client(&msg).await?;
    let g = m.create_group(CreateGroupRequest { creator_id: 2, member_ids: vec![1, 3], title: "before".into() }).await?.into_inner().conversation_id;
    let m1 = send(&mut m, 2, 0, g, "m1").await?;
    let h = send(&mut m, 5, 1, 0, "h1").await?.conversation_id;
    let m2 = send(&mut m, 2, 0, g, "m2").await?;
    let m3 = send(&mut m, 2, 0, g, "m3").await?;
    m.mark_read(MarkReadRequest { user_id: 1, conversation_id: g, up_to_message_id: m1.message_id }).await?;
    assert_unread(&msg, &counter, &[(1, 3), (3, 3)], &users, "before any change").await?;
    assert_eq!(listed(&mut m, 1).await?.iter().map(|c| c.0).collect::<Vec<_>>(), [g, h], "g's m3 is the newest");

    // A deletion in the middle: gone from pages and from the counts of those who had not read it.
    assert!(m.delete_message(DeleteMessageRequest { user_id: 2, message_id: m2.message_id }).await?.into_inner().changed);
    assert!(!m.delete_message(DeleteMessageRequest { user_id: 2, message_id: m2.message_id }).await?.into_inner().changed, "idempotent");
    assert_eq!(bodies(&mut m, 1, g).await?, ["m3", "m1"]);
    assert_unread(&msg, &counter, &[(1, 2), (3, 2), (2, 0)], &users, "m2 deleted").await?;
    // The newest one: the conversation moves back behind h.
    m.delete_message(DeleteMessageRequest { user_id: 2, message_id: m3.message_id }).await?;
    assert_eq!(listed(&mut m, 1).await?.iter().map(|c| c.0).collect::<Vec<_>>(), [h, g], "g's newest left is m1, older than h1");
    assert_unread(&msg, &counter, &[(1, 1), (3, 1)], &users, "m3 deleted").await?;
    // A read past the deleted ones counts only live messages.
    let read = m.mark_read(MarkReadRequest { user_id: 3, conversation_id: g, up_to_message_id: m1.message_id }).await?.into_inner();
    assert_eq!(read.unread_count, 0);

    // An edit: new body and time, no count moves, no reorder.
    let edited = m.edit_message(EditMessageRequest { user_id: 2, message_id: m1.message_id, body: b"m1, edited".to_vec() }).await?.into_inner();
    assert!(edited.changed && edited.message.as_ref().is_some_and(|x| x.edited_at.is_some()));
    let same = m.edit_message(EditMessageRequest { user_id: 2, message_id: m1.message_id, body: b"m1, edited".to_vec() }).await?.into_inner();
    assert!(!same.changed, "the same body again changes nothing");
    let page = m.list_messages(ListMessagesRequest { user_id: 1, conversation_id: g, page_size: 10, page_token: String::new() }).await?.into_inner();
    assert_eq!((page.messages[0].body.as_slice(), page.messages[0].edited_at.is_some()), (b"m1, edited".as_slice(), true));
    // A rename: no count moves, no reorder.
    assert!(m.rename_group(RenameGroupRequest { user_id: 3, conversation_id: g, title: "after".into() }).await?.into_inner().changed);
    let list = m.list_conversations(ListConversationsRequest { user_id: 1, page_size: 10, page_token: String::new() }).await?.into_inner();
    assert_eq!(list.conversations.iter().map(|c| (c.conversation_id, c.title.as_str())).collect::<Vec<_>>(), [(h, ""), (g, "after")]);
    assert_unread(&msg, &counter, &[(1, 1), (3, 0)], &users, "after an edit and a rename").await?;

    // Refusals.
    let e = m.delete_message(DeleteMessageRequest { user_id: 1, message_id: m1.message_id }).await.unwrap_err();
    assert_eq!((e.code(), reason(&e)), (Code::PermissionDenied, "NOT_THE_SENDER".into()));
    let e = m.edit_message(EditMessageRequest { user_id: 3, message_id: m1.message_id, body: b"x".to_vec() }).await.unwrap_err();
    assert_eq!((e.code(), reason(&e)), (Code::PermissionDenied, "NOT_THE_SENDER".into()));
    let e = m.delete_message(DeleteMessageRequest { user_id: 2, message_id: 1 << 40 }).await.unwrap_err();
    assert_eq!((e.code(), reason(&e)), (Code::NotFound, "UNKNOWN_MESSAGE".into()));
    let e = m.edit_message(EditMessageRequest { user_id: 2, message_id: m2.message_id, body: b"x".to_vec() }).await.unwrap_err();
    assert_eq!((e.code(), reason(&e)), (Code::NotFound, "UNKNOWN_MESSAGE".into()), "a deleted message is not edited");
    let e = m.edit_message(EditMessageRequest { user_id: 2, message_id: m1.message_id, body: Vec::new() }).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = m.rename_group(RenameGroupRequest { user_id: 5, conversation_id: g, title: "mine".into() }).await.unwrap_err();
    assert_eq!((e.code(), reason(&e)), (Code::PermissionDenied, "NOT_A_MEMBER".into()));
    let e = m.rename_group(RenameGroupRequest { user_id: 1, conversation_id: h, title: "pair".into() }).await.unwrap_err();
    assert_eq!((e.code(), reason(&e)), (Code::FailedPrecondition, "NOT_A_GROUP".into()));
    let e = m.rename_group(RenameGroupRequest { user_id: 1, conversation_id: g, title: "t".repeat(201) }).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = m.send_message(send_request(2, 0, g, "m2")).await.unwrap_err();
    assert_eq!((e.code(), reason(&e)), (Code::FailedPrecondition, "MESSAGE_DELETED".into()), "a retried send of a deleted message");
    let e = m.delete_message(DeleteMessageRequest { user_id: 0, message_id: m1.message_id }).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    drop((msg, counter));
    db.drop_db().await
}

#[tokio::test]
async fn deletes_edits_and_renames_keep_pages_orders_and_unread_counts_exact_on_postgres() -> anyhow::Result<()> {
    deletes_edits_and_renames(Backend::Postgres).await
}

#[tokio::test]
async fn deletes_edits_and_renames_keep_pages_orders_and_unread_counts_exact_on_mariadb() -> anyhow::Result<()> {
    deletes_edits_and_renames(Backend::MariaDb).await
}

/// Waits until message-svc's consumer of `topic` (the account events) stored offsets at every
/// partition's high watermark.
async fn accounts_applied(db: &socialgraph_testkit::TestDb, topic: &str) -> anyhow::Result<()> {
    let k = socialgraph_testkit::kafka::connect(&socialgraph_testkit::kafka::brokers()).await?;
    socialgraph_testkit::eventually(SETTLE, "message-svc to apply every account event", || async {
        let ends = socialgraph_testkit::kafka::high_watermarks(&k, topic).await?;
        let stored = socialgraph_storage::offsets::list(&db.conn, "message", topic).await?;
        let done = ends.iter().all(|(p, end)| *end == 0 || stored.iter().any(|o| o.partition == *p && o.next_offset >= *end));
        Ok(done.then_some(()))
    })
    .await
}

async fn a_deleted_account_ends_its_conversations(backend: Backend) -> anyhow::Result<()> {
    use rskafka::client::partition::{Compression, UnknownTopicHandling};
    use socialgraph_proto::relation::v1::DeleteAccountRequest;
    let users: BTreeSet<i64> = [1, 2, 5].into();
    let (db, msg, counter, relation, topic) = mesh(backend, &users).await?;
    let mut m = message_client(&msg).await?;
    let private = send(&mut m, 2, 1, 0, "p1").await?.conversation_id;
    send(&mut m, 2, 1, 0, "p2").await?;
    let g = m.create_group(CreateGroupRequest { creator_id: 5, member_ids: vec![1, 2], title: "g".into() }).await?.into_inner().conversation_id;
    send(&mut m, 2, 0, g, "g1").await?;
    assert_unread(&msg, &counter, &[(1, 3), (5, 1)], &users, "before the deletion").await?;

    relation.client().await?.delete_account(DeleteAccountRequest { user_id: 2 }).await?;
    socialgraph_testkit::eventually(SETTLE, "the deleted account's private conversation to end", || {
        let mut m = m.clone();
        async move { Ok((exact(&mut m, 1).await?.0 == 1).then_some(())) }
    })
    .await?;
    assert_unread(&msg, &counter, &[(1, 1), (5, 1)], &users, "2 is being deleted: only g's message stays unread").await?;
    let list = listed(&mut m, 1).await?;
    assert!(list.contains(&(private, 0, false)) && list.contains(&(g, 1, true)), "{list:?}");
    let e = m.send_message(send_request(2, 0, g, "g2")).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "the deleted account left the group");

    // The id, a fresh account now, writes to 1 again: the conversation opens from the present.
    send(&mut m, 2, 1, 0, "again").await?;
    assert_unread(&msg, &counter, &[(1, 2)], &users, "a new message opens it again").await?;
    assert_eq!(bodies(&mut m, 1, private).await?, ["again"], "history before the deletion stays closed");

    // A copy of the deletion event at a later offset changes nothing.
    let k = socialgraph_testkit::kafka::connect(&socialgraph_testkit::kafka::brokers()).await?;
    let records = socialgraph_testkit::kafka::read_all(&k, &topic).await?;
    assert!(!records.is_empty(), "the deletion was published to {topic}");
    for (p, r) in &records {
        k.partition_client(topic.as_str(), *p, UnknownTopicHandling::Retry)
            .await?
            .produce(vec![r.record.clone()], Compression::NoCompression)
            .await?;
    }
    accounts_applied(&db, &topic).await?;
    assert_unread(&msg, &counter, &[(1, 2)], &users, "after a copy of the deletion").await?;
    drop((msg, counter, relation));
    db.drop_db().await
}

#[tokio::test]
async fn a_deleted_account_ends_its_conversations_on_postgres() -> anyhow::Result<()> {
    a_deleted_account_ends_its_conversations(Backend::Postgres).await
}

#[tokio::test]
async fn a_deleted_account_ends_its_conversations_on_mariadb() -> anyhow::Result<()> {
    a_deleted_account_ends_its_conversations(Backend::MariaDb).await
}
