//! Helpers of the message-svc tests: spawning it, reading the CollegeMsg replay file, and the
//! brute-force model the service's conversation lists and unread counts are checked against.

use std::collections::{BTreeMap, HashMap, HashSet};

use socialgraph_proto::message::v1::message_service_client::MessageServiceClient;
use socialgraph_proto::message::v1::{self as pb, ListConversationsRequest};
use socialgraph_testkit::{Backend, TestDb};
use tonic::transport::Channel;

use crate::{ADMIN_TOKEN, Svc};

pub use socialgraph_message::Config as MessageConfig;

/// A message-svc configuration for tests: the given database and topic, the test secrets.
pub fn message_config(db_url: &str, topic: &str) -> MessageConfig {
    let mut c = MessageConfig::default();
    c.database.url = db_url.to_owned();
    c.database.max_connections = 12;
    c.kafka.brokers = socialgraph_testkit::kafka::brokers();
    c.kafka.message_topic = topic.to_owned();
    c.kafka.account_topic = socialgraph_testkit::unique("sg.account.test.");
    c.kafka.partitions = 4;
    c.kafka.relay_idle_poll_ms = 20;
    c.auth.admin_token = Some(ADMIN_TOKEN.into());
    c.auth.page_token_secret = Some("test-page-token-secret".into());
    c
}

/// Starts message-svc with `config` on free ports and waits until it answers.
///
/// # Errors
/// It did not start.
pub async fn spawn_message(config: MessageConfig) -> anyhow::Result<Svc> {
    crate::spawn(|grpc, admin, shutdown| socialgraph_message::run(config, grpc, admin, shutdown)).await
}

/// A fresh database of `backend`, a relation-svc on it (its relay publishing the account events:
/// blocks, deletions) and a message-svc with a fresh topic; `relay` runs message-svc's outbox
/// relay too. Returns (database, message-svc, its topic, relation-svc); dropping a service kills it.
///
/// # Errors
/// A dependency is missing (the message says how to start it).
pub async fn message_on(backend: Backend, relay: bool) -> anyhow::Result<(TestDb, Svc, String, Svc)> {
    let m = message_mesh(backend, relay).await?;
    Ok((m.db, m.message, m.topic, m.relation))
}

/// What [`message_mesh`] starts.
pub struct MessageMesh {
    /// The database.
    pub db: TestDb,
    /// message-svc.
    pub message: Svc,
    /// Its message topic.
    pub topic: String,
    /// relation-svc.
    pub relation: Svc,
    /// The account topic relation-svc writes and message-svc consumes.
    pub account_topic: String,
}

/// [`message_on`], with the account topic.
///
/// # Errors
/// A dependency is missing (the message says how to start it).
pub async fn message_mesh(backend: Backend, relay: bool) -> anyhow::Result<MessageMesh> {
    let db = TestDb::create(backend).await?;
    let topic = socialgraph_testkit::unique("sg.message.test.");
    // relation-svc's relay publishes the account events (blocks, deletions) message-svc keeps
    // its copy from; on one database it shares the outbox, and the leadership, with
    // message-svc's relay.
    let relation = crate::relation_config(&db.url, &socialgraph_testkit::unique("sg.relation.test."));
    let account_topic = relation.kafka.account_topic.clone();
    let relation = crate::spawn_relation(relation).await?;
    let mut config = message_config(&db.url, &topic);
    config.kafka.account_topic = account_topic.clone();
    config.kafka.relay_enabled = relay;
    let message = spawn_message(config).await?;
    Ok(MessageMesh { db, message, topic, relation, account_topic })
}

/// A counter-svc configuration that keeps unread counts from message-svc `msg` and its topic
/// (on the shared Redis under a fresh key prefix; projection-svc is never dialled, as no relation
/// events flow). Returns the configuration and its key prefix.
pub fn unread_counter_config(msg: &Svc, topic: &str) -> (crate::CounterConfig, String) {
    let prefix = socialgraph_testkit::unique("t") + ":";
    let mut config = crate::counter_config(&socialgraph_testkit::redis_url(), &prefix, &crate::Topics::fresh(), ([127, 0, 0, 1], 9).into());
    config.kafka.message_topic = topic.to_owned();
    config.message.url = format!("http://{}", msg.addr);
    (config, prefix)
}

/// A SendMessage of `id` as client_message_id and body, to `to` (0: none) or into
/// `conversation` (0: none).
pub fn send_request(from: i64, to: i64, conversation: i64, id: &str) -> pb::SendMessageRequest {
    pb::SendMessageRequest {
        sender_id: from,
        recipient_id: to,
        conversation_id: conversation,
        client_message_id: id.into(),
        body: id.as_bytes().to_vec(),
    }
}

/// A MessageService client of `svc`.
///
/// # Errors
/// The server does not accept connections.
pub async fn message_client(svc: &Svc) -> anyhow::Result<MessageServiceClient<Channel>> {
    Ok(MessageServiceClient::new(svc.channel().await?).max_decoding_message_size(64 * 1024 * 1024))
}

/// One line of CollegeMsg: `SRC DST UNIXTS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Line {
    /// Position in the file, from 1 (the send's client_message_id is `L<line>`).
    pub line: usize,
    /// Sender.
    pub src: i64,
    /// Recipient.
    pub dst: i64,
    /// Unix seconds.
    pub ts: i64,
}

/// The first `limit` messages of the data set `CollegeMsg.txt` in time order (file order
/// among equal times).
///
/// # Errors
/// The file is missing or malformed.
pub fn college_messages(limit: usize) -> anyhow::Result<Vec<Line>> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/CollegeMsg.txt");
    let text =
        std::fs::read_to_string(&path).map_err(|e| anyhow::anyhow!("{}: {e} (the shared data sets live beside the checkout)", path.display()))?;
    let mut lines = Vec::new();
    for (i, l) in text.lines().enumerate() {
        let f: Vec<i64> = l.split_whitespace().map(str::parse).collect::<Result<_, _>>()?;
        anyhow::ensure!(f.len() == 3, "line {}: expected SRC DST UNIXTS", i + 1);
        lines.push(Line { line: i + 1, src: f[0], dst: f[1], ts: f[2] });
    }
    lines.sort_by_key(|l| (l.ts, l.line));
    lines.truncate(limit);
    Ok(lines)
}

/// The replay's read rule: a recipient marks its conversation read up to a message it received
/// when that message is its 10th, 20th, … received in file order.
pub const READ_EVERY: usize = 10;

/// The lines after whose send the recipient marks read ([`READ_EVERY`]).
pub fn read_marks(lines: &[Line]) -> HashSet<usize> {
    let mut received: HashMap<i64, usize> = HashMap::new();
    let mut marks = HashSet::new();
    for l in lines {
        let n = received.entry(l.dst).or_default();
        *n += 1;
        if n.is_multiple_of(READ_EVERY) {
            marks.insert(l.line);
        }
    }
    marks
}

/// The pair of a line, smaller id first.
pub fn pair(l: &Line) -> (i64, i64) {
    (l.src.min(l.dst), l.src.max(l.dst))
}

/// What a user's conversation list must show for one peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    /// The other member.
    pub peer_id: i64,
    /// File line of the last message of the pair.
    pub last_line: usize,
    /// Messages of the peer after the user's last read point (its last send or mark).
    pub unread: i64,
}

/// The brute-force model of a replay of `lines` (each pair's lines in file order) with the
/// marks of [`read_marks`]: per user, its conversations with the unread count, counted from the
/// pair's messages after the user's last read point, ordered by the id the service gave each
/// pair's last message (`ids`: line → message id), latest first.
pub fn expected_lists(lines: &[Line], ids: &HashMap<usize, i64>) -> BTreeMap<i64, Vec<Expected>> {
    let marks = read_marks(lines);
    let mut pairs: HashMap<(i64, i64), Vec<Line>> = HashMap::new();
    let mut read_at: HashMap<(i64, (i64, i64)), usize> = HashMap::new();
    for l in lines {
        let key = pair(l);
        let msgs = pairs.entry(key).or_default();
        msgs.push(*l);
        read_at.insert((l.src, key), msgs.len());
        if marks.contains(&l.line) {
            read_at.insert((l.dst, key), msgs.len());
        }
    }
    let mut lists: BTreeMap<i64, Vec<Expected>> = BTreeMap::new();
    for (key, msgs) in &pairs {
        for (me, peer) in [(key.0, key.1), (key.1, key.0)] {
            let from = read_at.get(&(me, *key)).copied().unwrap_or(0);
            let unread = msgs[from..].iter().filter(|m| m.src == peer).count() as i64;
            let last_line = msgs.last().map_or(0, |m| m.line);
            lists.entry(me).or_default().push(Expected { peer_id: peer, last_line, unread });
        }
    }
    for list in lists.values_mut() {
        list.sort_by_key(|e| std::cmp::Reverse(ids.get(&e.last_line).copied().unwrap_or(0)));
    }
    lists
}

/// Every page of `user_id`'s conversation list, as (peer, last message's client id, unread).
///
/// # Errors
/// A call failed.
pub async fn listed(c: &mut MessageServiceClient<Channel>, user_id: i64, page_size: i32) -> anyhow::Result<Vec<(i64, String, i64)>> {
    let mut out = Vec::new();
    let mut token = String::new();
    loop {
        let page = c.list_conversations(ListConversationsRequest { user_id, page_size, page_token: token }).await?.into_inner();
        out.extend(
            page.conversations
                .into_iter()
                .map(|c: pb::Conversation| (c.peer_id, c.last_message.map(|m| m.client_message_id).unwrap_or_default(), c.unread_count)),
        );
        if page.next_page_token.is_empty() {
            return Ok(out);
        }
        token = page.next_page_token;
    }
}

/// The body the replays send for a line.
pub fn body(l: &Line) -> Vec<u8> {
    format!("{}->{}@{}", l.src, l.dst, l.ts).into_bytes()
}

/// Sends `lines` from `workers` clients at once, each owning the pairs that hash to it and
/// sending their lines in file order (so every conversation sees its messages and marks in file
/// order), the recipient marking read after each line of [`read_marks`]. Returns each line's
/// message id and the number of marks.
///
/// # Errors
/// A call failed, or message ids did not grow in send order.
pub async fn replay(c: &MessageServiceClient<Channel>, lines: &[Line], workers: usize) -> anyhow::Result<(HashMap<usize, i64>, usize)> {
    let marks = read_marks(lines);
    let mut tasks = Vec::new();
    for w in 0..workers {
        let mine: Vec<Line> = lines.iter().copied().filter(|l| (pair(l).0 * 31 + pair(l).1) as usize % workers == w).collect();
        let (mut c, marks) = (c.clone(), marks.clone());
        tasks.push(tokio::spawn(async move {
            let (mut ids, mut last_id, mut reads) = (Vec::new(), 0, 0);
            for l in mine {
                let id = format!("L{}", l.line);
                let req = pb::SendMessageRequest { sender_id: l.src, recipient_id: l.dst, conversation_id: 0, client_message_id: id, body: body(&l) };
                let m = c.send_message(req).await?.into_inner().message.unwrap_or_default();
                anyhow::ensure!(m.message_id > last_id, "message ids grow in send order");
                last_id = m.message_id;
                ids.push((l.line, m.message_id));
                if marks.contains(&l.line) {
                    let read = pb::MarkReadRequest { user_id: l.dst, conversation_id: m.conversation_id, up_to_message_id: m.message_id };
                    anyhow::ensure!(c.mark_read(read).await?.into_inner().changed, "a mark at the newest message moves the cursor");
                    reads += 1;
                }
            }
            anyhow::Ok((ids, reads))
        }));
    }
    let (mut ids, mut reads) = (HashMap::new(), 0);
    for t in tasks {
        let (part, r) = t.await??;
        ids.extend(part);
        reads += r;
    }
    Ok((ids, reads))
}

/// Asserts that every user's conversation list (peer, last message, unread; every page) and
/// unread counts equal [`expected_lists`] of a replay of `lines` that gave `ids`. Returns the
/// users and conversations compared.
///
/// # Errors
/// A call failed.
pub async fn compare_lists(c: &mut MessageServiceClient<Channel>, lines: &[Line], ids: &HashMap<usize, i64>) -> anyhow::Result<(usize, usize)> {
    let expected = expected_lists(lines, ids);
    let mut compared = 0;
    for (user, want) in &expected {
        let got = listed(c, *user, 37).await?;
        let want_rows: Vec<(i64, String, i64)> = want.iter().map(|e| (e.peer_id, format!("L{}", e.last_line), e.unread)).collect();
        assert_eq!(got, want_rows, "user {user}: conversations (peer, last message, unread), latest first");
        let counts = c.get_unread_counts(pb::GetUnreadCountsRequest { user_id: *user }).await?.into_inner();
        assert_eq!(counts.total_unread, want.iter().map(|e| e.unread).sum::<i64>(), "user {user}: unread in total");
        assert_eq!(counts.conversations.len(), want.iter().filter(|e| e.unread > 0).count(), "user {user}: conversations with unread messages");
        compared += got.len();
    }
    Ok((expected.len(), compared))
}
