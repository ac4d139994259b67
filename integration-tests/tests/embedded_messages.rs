//! MessageService in the embedded mode (`socialgraph dev`, one SQLite file): the first 3,000
//! CollegeMsg messages replayed from four clients give every user the brute-force conversation
//! list and unread counts, and the same after a restart; Subscribe delivers and resumes across
//! the restart; a block stops private messages; the CLI loads a messages file once.

use socialgraph_integration_tests::messages::{college_messages, compare_lists, replay};
use socialgraph_integration_tests::{reason, spawn_dev};
use socialgraph_proto::message::v1::message_service_client::MessageServiceClient;
use socialgraph_proto::message::v1::{
    CreateGroupRequest, GetUnreadCountsRequest, SendMessageRequest, SubscribeEventKind, SubscribeRequest, SubscribeResponse,
};
use socialgraph_proto::relation::v1::BlockRequest;
use socialgraph_proto::relation::v1::relation_service_client::RelationServiceClient;

/// The next item of a Subscribe stream, within 20 s.
async fn next(stream: &mut tonic::Streaming<SubscribeResponse>) -> anyhow::Result<SubscribeResponse> {
    tokio::time::timeout(std::time::Duration::from_secs(20), stream.message()).await??.ok_or_else(|| anyhow::anyhow!("the stream ended"))
}

#[tokio::test]
async fn the_embedded_mesh_serves_messages_on_sqlite_exactly_across_a_restart() -> anyhow::Result<()> {
    let data = std::env::temp_dir().join(format!("{}.sqlite", socialgraph_testkit::unique("sg_dev_messages_")));
    let lines = college_messages(3_000)?;
    let dev = spawn_dev(&data).await?;
    let c = MessageServiceClient::connect(dev.message.clone()).await?;
    let (ids, reads) = replay(&c, &lines, 4).await?;
    assert!(reads > 100, "the replay marked read {reads} times");
    let (users, conversations) = compare_lists(&mut c.clone(), &lines, &ids).await?;
    println!("embedded: {users} users' lists ({conversations} conversations) equal the brute force");
    let mut g = c.clone();
    let group = g
        .create_group(CreateGroupRequest { creator_id: 5001, member_ids: vec![5002, 5003], title: "dev".into() })
        .await?
        .into_inner()
        .conversation_id;
    // Live delivery reads the outbox table here: subscribe, receive, keep the resume token.
    let mut live = g.subscribe(SubscribeRequest { user_id: 5003, resume_token: String::new() }).await?.into_inner();
    assert_eq!(next(&mut live).await?.kind, SubscribeEventKind::Subscribed as i32);
    let req = SendMessageRequest { sender_id: 5002, recipient_id: 0, conversation_id: group, client_message_id: "g".into(), body: b"hi".to_vec() };
    g.send_message(req).await?;
    let item = next(&mut live).await?;
    assert_eq!(item.message.map(|m| m.body), Some(b"hi".to_vec()));
    drop(live);
    // Users outside the file's ids (1..1899), so the lists compared stay the file's.
    let before = g.get_unread_counts(GetUnreadCountsRequest { user_id: 5003 }).await?.into_inner().total_unread;
    dev.stop().await?;

    let dev = spawn_dev(&data).await?;
    let mut c = MessageServiceClient::connect(dev.message.clone()).await?;
    compare_lists(&mut c, &lines, &ids).await?;
    assert_eq!(c.get_unread_counts(GetUnreadCountsRequest { user_id: 5003 }).await?.into_inner().total_unread, before, "the group's unread survives");
    // The token resumes across the restart: the message sent since comes first, and only it.
    let req =
        SendMessageRequest { sender_id: 5001, recipient_id: 0, conversation_id: group, client_message_id: "g2".into(), body: b"again".to_vec() };
    c.send_message(req).await?;
    let mut live = c.subscribe(SubscribeRequest { user_id: 5003, resume_token: item.resume_token }).await?.into_inner();
    assert_eq!(next(&mut live).await?.kind, SubscribeEventKind::Subscribed as i32);
    assert_eq!(next(&mut live).await?.message.map(|m| m.body), Some(b"again".to_vec()));
    drop(live);
    // Blocks stop private messages here too: message-svc's copy follows the block's event in the
    // log within moments (a send in between would still go through).
    let mut r = RelationServiceClient::connect(dev.relation.clone()).await?;
    r.block(BlockRequest { blocker_id: 5001, blocked_id: 5004 }).await?;
    let data_url = format!("sqlite://{}?mode=rw", data.display());
    let db = socialgraph_storage::connect(&data_url, 1).await?;
    socialgraph_testkit::eventually(std::time::Duration::from_secs(30), "the block to reach message-svc's copy", || async {
        Ok(socialgraph_storage::block_pairs::copy_blocked(&db, 5001, 5004).await?.then_some(()))
    })
    .await?;
    db.close().await?;
    let req = SendMessageRequest { sender_id: 5004, recipient_id: 5001, conversation_id: 0, client_message_id: "b".into(), body: b"hi".to_vec() };
    let refused = c.send_message(req).await.unwrap_err();
    assert_eq!((refused.code(), reason(&refused)), (tonic::Code::PermissionDenied, "BLOCKED".into()));
    dev.stop().await?;
    std::fs::remove_file(&data).ok();
    Ok(())
}

#[tokio::test]
async fn the_cli_loads_a_messages_file_once_however_often_it_runs() -> anyhow::Result<()> {
    use socialgraph_cli::commands::progress_bar;
    use socialgraph_cli::messages::{load_messages, read_messages};
    let data = std::env::temp_dir().join(format!("{}.sqlite", socialgraph_testkit::unique("sg_dev_load_messages_")));
    let file = std::env::temp_dir().join(format!("{}.txt", socialgraph_testkit::unique("college_")));
    let text = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/CollegeMsg.txt"))?;
    std::fs::write(&file, format!("# the first 1,500 lines\n{}\n", text.lines().take(1_500).collect::<Vec<_>>().join("\n")))?;
    let lines = read_messages(&file)?;
    assert_eq!(lines.len(), 1_500, "the comment line is skipped");
    let dev = spawn_dev(&data).await?;
    let first = load_messages(&dev.endpoints(), &lines, 4, &progress_bar(false, "messages")).await?;
    assert_eq!((first.messages, first.created), (1_500, 1_500));
    let again = load_messages(&dev.endpoints(), &lines, 4, &progress_bar(false, "messages")).await?;
    assert_eq!((again.messages, again.created), (1_500, 0), "a re-run sends nothing twice");
    let mut c = MessageServiceClient::connect(dev.message.clone()).await?;
    let peers: std::collections::BTreeSet<i64> =
        lines.iter().filter(|l| l.sender_id == 1 || l.recipient_id == 1).map(|l| l.sender_id + l.recipient_id - 1).collect();
    let listed = socialgraph_integration_tests::messages::listed(&mut c, 1, 1000).await?;
    assert_eq!(listed.iter().map(|(p, _, _)| *p).collect::<std::collections::BTreeSet<_>>(), peers, "user 1's conversations");
    dev.stop().await?;
    std::fs::remove_file(&data).ok();
    std::fs::remove_file(&file).ok();
    Ok(())
}
