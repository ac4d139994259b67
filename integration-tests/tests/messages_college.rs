//! CollegeMsg (59,835 real private messages between 1,899 users) replayed through SendMessage
//! in time order, each recipient marking read at every tenth message it receives; then every
//! user's conversation list (order, last message, unread per conversation) and unread total
//! are compared with a brute-force count over the file.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use prost::Message as _;
use socialgraph_integration_tests::messages::{body, college_messages, compare_lists, message_client, message_on, replay};
use socialgraph_proto::events::v1::{MessageEvent, MessageEventKind};
use socialgraph_proto::message::v1::{ListMessagesRequest, SendMessageRequest};
use socialgraph_testkit::Backend;

/// Concurrent clients of the replay.
const WORKERS: usize = 4;

/// Replays `limit` messages on `backend` and checks every user's list against the model.
async fn replay_and_compare(backend: Backend, limit: usize, relay: bool) -> anyhow::Result<(socialgraph_testkit::TestDb, String, usize)> {
    let lines = college_messages(limit)?;
    let (db, svc, topic, _relation) = message_on(backend, relay).await?;
    let mut c = message_client(&svc).await?;
    let started = Instant::now();
    let (ids, reads) = replay(&c, &lines, WORKERS).await?;
    let took = started.elapsed();
    println!(
        "{backend:?}: {} sends and {reads} marks in {:.1} s = {:.0} sends/s ({WORKERS} clients)",
        lines.len(),
        took.as_secs_f64(),
        lines.len() as f64 / took.as_secs_f64()
    );
    let started = Instant::now();
    let (users, compared) = compare_lists(&mut c, &lines, &ids).await?;
    println!("{backend:?}: {users} users' lists ({compared} conversations) equal the brute force, read in {:.1} s", started.elapsed().as_secs_f64());
    // The busiest pair's messages, every page, newest first.
    let mut by_pair: HashMap<(i64, i64), Vec<usize>> = HashMap::new();
    for l in &lines {
        by_pair.entry((l.src.min(l.dst), l.src.max(l.dst))).or_default().push(l.line);
    }
    let (&(a, b), want) = by_pair.iter().max_by_key(|(k, v)| (v.len(), std::cmp::Reverse(**k))).ok_or_else(|| anyhow::anyhow!("no messages"))?;
    let first = c
        .send_message(SendMessageRequest {
            sender_id: a,
            recipient_id: b,
            client_message_id: format!("L{}", want[0]),
            body: vec![],
            conversation_id: 0,
        })
        .await;
    assert_eq!(first.map(|_| ()).unwrap_err().code(), tonic::Code::InvalidArgument, "an empty body is refused");
    let conversation_id = {
        let l = lines.iter().find(|l| l.line == want[0]).ok_or_else(|| anyhow::anyhow!("line"))?;
        let again = SendMessageRequest {
            sender_id: l.src,
            recipient_id: l.dst,
            conversation_id: 0,
            client_message_id: format!("L{}", l.line),
            body: body(l),
        };
        let r = c.send_message(again).await?.into_inner();
        assert!(!r.created, "a retried send writes nothing");
        r.message.unwrap_or_default().conversation_id
    };
    let mut pages = Vec::new();
    let mut token = String::new();
    loop {
        let req = ListMessagesRequest { user_id: a, conversation_id, page_size: 100, page_token: token };
        let page = c.list_messages(req).await?.into_inner();
        pages.extend(page.messages.into_iter().map(|m| m.client_message_id));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    let want: Vec<String> = want.iter().rev().map(|l| format!("L{l}")).collect();
    assert_eq!(pages, want, "pair ({a}, {b}): every message once, newest first");
    svc.stop().await?;
    Ok((db, topic, lines.len() + reads))
}

#[tokio::test]
async fn college_messages_replayed_on_postgres_give_every_user_the_brute_force_lists_and_unread_counts() -> anyhow::Result<()> {
    let (db, _, _) = replay_and_compare(Backend::Postgres, usize::MAX, false).await?;
    db.drop_db().await
}

#[tokio::test]
async fn college_messages_replayed_on_mariadb_publish_one_event_per_change() -> anyhow::Result<()> {
    let (db, topic, changes) = replay_and_compare(Backend::MariaDb, 6_000, true).await?;
    // Every send and every mark wrote one event in its transaction; the relay publishes them.
    let client = socialgraph_testkit::kafka::connect(&socialgraph_testkit::kafka::brokers()).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let records = loop {
        let records = socialgraph_testkit::kafka::read_all(&client, &topic).await?;
        if records.len() >= changes || Instant::now() > deadline {
            break records;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let events: Vec<MessageEvent> =
        records.iter().map(|(_, r)| MessageEvent::decode(r.record.value.as_deref().unwrap_or_default())).collect::<Result<_, _>>()?;
    let unique: HashMap<&str, &MessageEvent> = events.iter().map(|e| (e.event_id.as_str(), e)).collect();
    assert_eq!(unique.len(), changes, "one event per send and per mark, none lost (copies keep their id)");
    let sent = unique.values().filter(|e| e.kind == MessageEventKind::Sent as i32).count();
    assert_eq!(sent, 6_000, "one SENT event per message");
    for (partition, r) in &records {
        let e = MessageEvent::decode(r.record.value.as_deref().unwrap_or_default())?;
        let key = r.record.key.as_deref().unwrap_or_default();
        assert_eq!(key, e.conversation_id.to_be_bytes(), "keyed by conversation");
        assert_eq!(*partition, socialgraph_events::kafka_partition(key, 4), "Kafka's default partitioner");
    }
    db.drop_db().await
}
