//! Live delivery (MessageService.Subscribe) on PostgreSQL and the broker: a subscriber gets the
//! messages of its conversations (its own sends included) and its read-cursor moves, nothing of
//! other users; a client that drops its stream again and again while messages flow, and resumes
//! with the last token it received (on another message-svc replica too, and after copies of
//! events were produced at later offsets), gets every message exactly once, in order per
//! conversation; bad requests get INVALID_ARGUMENT.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use rskafka::client::partition::{Compression, UnknownTopicHandling};
use socialgraph_integration_tests::messages::{message_client, message_config, message_on, send_request, spawn_message};
use socialgraph_proto::message::v1::{CreateGroupRequest, MarkReadRequest, SubscribeEventKind, SubscribeRequest, SubscribeResponse};
use socialgraph_testkit::{Backend, kafka};
use tonic::Code;

type Client = socialgraph_proto::message::v1::message_service_client::MessageServiceClient<tonic::transport::Channel>;
type Stream = tonic::Streaming<SubscribeResponse>;

/// Opens a stream and checks its first item is SUBSCRIBED with a token.
async fn subscribe(c: &mut Client, user: i64, token: &str) -> anyhow::Result<(Stream, String)> {
    let mut stream = c.subscribe(SubscribeRequest { user_id: user, resume_token: token.into() }).await?.into_inner();
    let hello = next(&mut stream).await?;
    assert_eq!(hello.kind, SubscribeEventKind::Subscribed as i32);
    assert!(!hello.resume_token.is_empty());
    Ok((stream, hello.resume_token))
}

/// The next item, within 20 s.
async fn next(stream: &mut Stream) -> anyhow::Result<SubscribeResponse> {
    match tokio::time::timeout(Duration::from_secs(20), stream.message()).await {
        Ok(item) => item?.ok_or_else(|| anyhow::anyhow!("the stream ended")),
        Err(_) => anyhow::bail!("no item within 20 s"),
    }
}

/// Nothing more arrives within `wait`.
async fn quiet(stream: &mut Stream, wait: Duration) -> anyhow::Result<()> {
    if let Ok(item) = tokio::time::timeout(wait, stream.message()).await {
        anyhow::bail!("unexpected item {:?}", item?);
    }
    Ok(())
}

#[tokio::test]
async fn a_subscriber_gets_its_messages_and_read_moves_and_nothing_else() -> anyhow::Result<()> {
    let (db, svc, _, _relation) = message_on(Backend::Postgres, true).await?;
    let mut c = message_client(&svc).await?;
    let (mut two, _) = subscribe(&mut c, 2, "").await?;
    let a = c.send_message(send_request(1, 2, 0, "a")).await?.into_inner().message.unwrap_or_default();
    c.send_message(send_request(4, 5, 0, "elsewhere")).await?;
    let b = c.send_message(send_request(2, 1, 0, "b")).await?.into_inner().message.unwrap_or_default();
    let group = c.create_group(CreateGroupRequest { creator_id: 3, member_ids: vec![2, 6], title: "g".into() }).await?.into_inner().conversation_id;
    let g = c.send_message(send_request(6, 0, group, "g")).await?.into_inner().message.unwrap_or_default();
    c.mark_read(MarkReadRequest { user_id: 2, conversation_id: group, up_to_message_id: g.message_id }).await?;
    c.mark_read(MarkReadRequest { user_id: 6, conversation_id: group, up_to_message_id: g.message_id }).await?;

    // Order holds per conversation only (its key keeps a conversation on one partition), so the
    // private and the group conversation's items may interleave either way.
    let got = [next(&mut two).await?, next(&mut two).await?, next(&mut two).await?, next(&mut two).await?];
    let at = |id: i64| got.iter().position(|i| i.message.as_ref().is_some_and(|m| m.message_id == id));
    let mut ids: Vec<i64> = got.iter().filter_map(|i| i.message.as_ref().map(|m| m.message_id)).collect();
    ids.sort_unstable();
    assert_eq!(ids, [a.message_id, b.message_id, g.message_id], "its conversations' messages, its own send included: {got:?}");
    assert!(at(a.message_id) < at(b.message_id), "one conversation's messages in order: {got:?}");
    let first = got[at(a.message_id).unwrap_or_default()].message.clone().unwrap_or_default();
    assert_eq!((first.sender_id, first.client_message_id.as_str(), first.body.as_slice(), first.seq), (1, "a", b"a".as_slice(), 1));
    let read = got.iter().position(|i| i.kind == SubscribeEventKind::Read as i32);
    assert!(read > at(g.message_id), "the read follows the message it reads: {got:?}");
    let read = got.iter().find(|i| i.kind == SubscribeEventKind::Read as i32).and_then(|i| i.read);
    assert_eq!(read.map(|r| (r.conversation_id, r.read_seq)), Some((group, 1)), "its own read cursor, not 6's");
    quiet(&mut two, Duration::from_millis(500)).await?;

    for (what, req) in [
        ("user_id 0", SubscribeRequest { user_id: 0, resume_token: String::new() }),
        ("garbage token", SubscribeRequest { user_id: 2, resume_token: "not-a-token".into() }),
        ("another user's token", SubscribeRequest { user_id: 3, resume_token: got[3].resume_token.clone() }),
    ] {
        let e = c.subscribe(req).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{what}: {e:?}");
    }
    drop(two);
    svc.stop().await?;
    db.drop_db().await
}

#[tokio::test]
async fn every_message_arrives_exactly_once_across_reconnects_replicas_and_copies() -> anyhow::Result<()> {
    const MESSAGES: usize = 600;
    let (db, svc, topic, _relation) = message_on(Backend::Postgres, true).await?;
    // A second replica on the same tables and topic (no relay of its own).
    let mut config = message_config(&db.url, &topic);
    config.kafka.relay_enabled = false;
    let other = spawn_message(config).await?;
    let mut c = message_client(&svc).await?;
    let mut d = message_client(&other).await?;

    // User 1 talks with users 2..=9 and in a group; others send in between.
    let group =
        c.create_group(CreateGroupRequest { creator_id: 1, member_ids: (2..=9).collect(), title: "all".into() }).await?.into_inner().conversation_id;
    let (mut stream, mut token) = subscribe(&mut c, 1, "").await?;
    let sender = {
        let c = c.clone();
        tokio::spawn(async move {
            let mut sent = Vec::new();
            for i in 0..MESSAGES {
                let peer = 2 + (i % 8) as i64;
                let req = match i % 3 {
                    0 => send_request(peer, 1, 0, &format!("p{i}")),
                    1 => send_request(1, peer, 0, &format!("o{i}")),
                    _ => send_request(peer, 0, group, &format!("g{i}")),
                };
                let m = c.clone().send_message(req).await?.into_inner().message.unwrap_or_default();
                c.clone().send_message(send_request(10 + peer, 20 + peer, 0, &format!("x{i}"))).await?;
                sent.push(m.message_id);
            }
            Ok::<_, anyhow::Error>(sent)
        })
    };

    let mut got: Vec<(i64, i64, i64)> = Vec::new(); // (message id, conversation, seq)
    let mut reconnects = 0u32;
    let k = kafka::connect(&kafka::brokers()).await?;
    while got.len() < MESSAGES {
        let item = next(&mut stream).await?;
        token = item.resume_token;
        let Some(m) = item.message else { continue };
        got.push((m.message_id, m.conversation_id, m.seq));
        if got.len().is_multiple_of(50) && got.len() < MESSAGES {
            // Drop the stream; every other time copy the newest records at later offsets first;
            // resume on the other replica or this one.
            drop(stream);
            reconnects += 1;
            if reconnects.is_multiple_of(2) {
                let records = kafka::read_all(&k, &topic).await?;
                for (p, r) in &records[records.len().saturating_sub(40)..] {
                    let pc = k.partition_client(topic.as_str(), *p, UnknownTopicHandling::Retry).await?;
                    pc.produce(vec![r.record.clone()], Compression::NoCompression).await?;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            let client = if reconnects.is_multiple_of(3) { &mut c } else { &mut d };
            stream = subscribe(client, 1, &token).await?.0;
        }
    }
    let sent = sender.await??;
    quiet(&mut stream, Duration::from_secs(1)).await?;
    let ids: Vec<i64> = got.iter().map(|g| g.0).collect();
    let unique: HashSet<i64> = ids.iter().copied().collect();
    assert_eq!(unique.len(), ids.len(), "nothing twice");
    assert_eq!(unique, sent.iter().copied().collect::<HashSet<i64>>(), "every message of user 1's conversations");
    let mut per_conversation: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    for (_, conversation, seq) in &got {
        per_conversation.entry(*conversation).or_default().push(*seq);
    }
    for (conversation, seqs) in &per_conversation {
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "conversation {conversation} in sequence order");
    }
    println!("{} messages over {reconnects} reconnects (half after copies), {} conversations", ids.len(), per_conversation.len());

    // A stopped replica ends its streams with UNAVAILABLE; the token resumes elsewhere.
    let (mut on_other, _) = subscribe(&mut d, 1, &token).await?;
    other.stop().await?;
    let ended = tokio::time::timeout(Duration::from_secs(10), on_other.message()).await?;
    assert_eq!(ended.map(|_| ()).unwrap_err().code(), Code::Unavailable);
    let late = c.send_message(send_request(2, 1, 0, "late")).await?.into_inner().message.unwrap_or_default();
    let (mut resumed, _) = subscribe(&mut c, 1, &token).await?;
    assert_eq!(next(&mut resumed).await?.message.map(|m| m.message_id), Some(late.message_id));
    let e = d.subscribe(SubscribeRequest { user_id: 1, resume_token: String::new() }).await;
    assert!(e.is_err(), "the stopped replica answers nothing");
    drop(resumed);
    svc.stop().await?;
    db.drop_db().await
}
