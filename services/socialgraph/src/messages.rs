//! Messages through MessageService: `send`, `conversations`, `messages`, `read` and
//! `load messages FILE`.
//!
//! `load messages` reads `sender recipient unix_seconds` lines (SNAP CollegeMsg), blank lines
//! and `#` comments skipped, gzip or plain, and sends each line as a private message whose
//! client_message_id is `L<line number>`, so a re-run sends nothing twice. Lines are sent from
//! `concurrency` clients at once, each owning the pairs that hash to it and sending their lines
//! in file order, so every conversation receives its messages in file order. Transient
//! failures are retried (exponential backoff, at most 8 times).

use std::path::Path;
use std::time::{Duration, Instant};

use backon::Retryable;
use indicatif::ProgressBar;
use serde::Serialize;
use serde_json::json;
use socialgraph_proto::message::v1 as pb;
use socialgraph_proto::message::v1::message_service_client::MessageServiceClient;
use tonic::Code;
use tonic::transport::Channel;

use crate::commands::Paging;
use crate::endpoints::{Endpoints, MESSAGE};
use crate::error::{CliError, CliResult};
use crate::input::{for_each_line, line_error, open};
use crate::output::{self, print_json};

/// One line of a messages file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Line {
    /// 1-based line number: the send's client_message_id is `L<line>`.
    pub line: usize,
    /// Sender (> 0).
    pub sender_id: i64,
    /// Recipient (> 0, ≠ sender).
    pub recipient_id: i64,
}

/// Reads a messages file (see the module documentation).
///
/// # Errors
/// [`CliError::Io`]; [`CliError::Input`] naming the first bad line.
pub fn read_messages(path: &Path) -> CliResult<Vec<Line>> {
    let name = path.display().to_string();
    let mut out = Vec::new();
    for_each_line(open(path)?, &name, |index, line| {
        let bad = |message: String| line_error(&name, index, message);
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            return Ok(());
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        let id = |s: &str, what: &str| match s.parse::<i64>() {
            Ok(v) if v > 0 => Ok(v),
            _ => Err(bad(format!("{what} {s:?} is not an id > 0"))),
        };
        let [s, r, t] = f.as_slice() else { return Err(bad(format!("expected `sender recipient unix_seconds`, got {line:?}"))) };
        let (sender_id, recipient_id) = (id(s, "sender")?, id(r, "recipient")?);
        if sender_id == recipient_id {
            return Err(bad("a message to oneself".into()));
        }
        t.parse::<i64>().map_err(|_| bad(format!("time {t:?} is not Unix seconds")))?;
        out.push(Line { line: usize::try_from(index + 1).unwrap_or(usize::MAX), sender_id, recipient_id });
        Ok(())
    })?;
    Ok(out)
}

fn transient(s: &tonic::Status) -> bool {
    matches!(s.code(), Code::Unavailable | Code::ResourceExhausted | Code::DeadlineExceeded)
}

/// Sends one message, retrying transient failures (the client_message_id makes a retry safe).
///
/// # Errors
/// [`CliError::Rpc`] for a refusal or a failure that outlived the retries.
pub async fn send_one(client: &MessageServiceClient<Channel>, req: pb::SendMessageRequest) -> CliResult<pb::SendMessageResponse> {
    let backoff =
        backon::ExponentialBuilder::default().with_min_delay(Duration::from_millis(50)).with_max_delay(Duration::from_secs(2)).with_max_times(8);
    let call = || async { client.clone().send_message(req.clone()).await.map(tonic::Response::into_inner) };
    call.retry(backoff).when(transient).await.map_err(|s| CliError::rpc(MESSAGE, s))
}

/// What a messages load did.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct MessageSummary {
    /// Lines sent (a line sent by an earlier run counts, and writes nothing).
    pub messages: u64,
    /// Of those, messages this run created.
    pub created: u64,
    /// Seconds from the first send to the last answer.
    pub elapsed_secs: f64,
    /// `messages / elapsed_secs`.
    pub messages_per_sec: f64,
}

/// Sends `lines` from `concurrency` clients (see the module documentation); `bar` counts lines.
///
/// # Errors
/// [`CliError::Connect`]; [`CliError::Rpc`] for the first line that failed.
pub async fn load_messages(endpoints: &Endpoints, lines: &[Line], concurrency: usize, bar: &ProgressBar) -> CliResult<MessageSummary> {
    let client = endpoints.message().await?;
    bar.set_length(lines.len() as u64);
    let workers = concurrency.max(1);
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..workers {
        let owner = |l: &Line| {
            (l.sender_id.min(l.recipient_id).wrapping_mul(31).wrapping_add(l.sender_id.max(l.recipient_id))).unsigned_abs() as usize % workers
        };
        let mine: Vec<Line> = lines.iter().copied().filter(|l| owner(l) == w).collect();
        let (client, bar) = (client.clone(), bar.clone());
        tasks.spawn(async move {
            let mut created = 0u64;
            for l in mine {
                let req = pb::SendMessageRequest {
                    sender_id: l.sender_id,
                    recipient_id: l.recipient_id,
                    conversation_id: 0,
                    client_message_id: format!("L{}", l.line),
                    body: format!("line {}", l.line).into_bytes(),
                };
                created += u64::from(send_one(&client, req).await?.created);
                bar.inc(1);
            }
            CliResult::Ok(created)
        });
    }
    let mut created = 0;
    while let Some(done) = tasks.join_next().await {
        created += done.map_err(|e| CliError::Usage(format!("a send task failed: {e}")))??;
    }
    bar.finish_and_clear();
    let elapsed_secs = started.elapsed().as_secs_f64();
    let messages = lines.len() as u64;
    Ok(MessageSummary { messages, created, elapsed_secs, messages_per_sec: messages as f64 / elapsed_secs.max(1e-9) })
}

fn sent_at(m: &pb::Message) -> String {
    m.sent_at.as_ref().map(socialgraph_domain::timestamp_to_ms).map(output::rfc3339).unwrap_or_default()
}

fn message_json(m: &pb::Message) -> serde_json::Value {
    let edited_at = m.edited_at.as_ref().map(socialgraph_domain::timestamp_to_ms).map(output::rfc3339);
    json!({
        "message_id": m.message_id, "conversation_id": m.conversation_id, "seq": m.seq, "sender_id": m.sender_id,
        "client_message_id": m.client_message_id, "body": String::from_utf8_lossy(&m.body), "sent_at": sent_at(m),
        "edited_at": edited_at,
    })
}

/// `send FROM (--to USER | --conversation ID) BODY [--client-id KEY]`; without a key, a new
/// UUID (so the command is not idempotent unless one is given).
///
/// # Errors
/// Connection and RPC errors.
pub async fn send(endpoints: &Endpoints, target: (i64, i64), sender_id: i64, client_id: Option<String>, body: String, json: bool) -> CliResult<()> {
    let client_message_id = client_id.unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
    let req = pb::SendMessageRequest { sender_id, recipient_id: target.0, conversation_id: target.1, client_message_id, body: body.into_bytes() };
    let r = send_one(&endpoints.message().await?, req).await?;
    let m = r.message.unwrap_or_default();
    if json {
        print_json(&json!({ "message": message_json(&m), "created": r.created }));
    } else {
        let what = if r.created { "sent" } else { "already sent" };
        out!("{what}: message {} in conversation {} (seq {})", m.message_id, m.conversation_id, m.seq);
    }
    Ok(())
}

/// `conversations USER`: latest activity first, with the unread count.
///
/// # Errors
/// Connection and RPC errors.
pub async fn conversations(endpoints: &Endpoints, user_id: i64, paging: Paging, json: bool) -> CliResult<()> {
    let mut c = endpoints.message().await?;
    let (mut token, mut rows) = (paging.page_token, Vec::new());
    let page_size = paging.page_size.unwrap_or(if paging.all { 1000 } else { 0 });
    loop {
        let req = pb::ListConversationsRequest { user_id, page_size, page_token: token };
        let page = c.list_conversations(req).await.map_err(|s| CliError::rpc(MESSAGE, s))?.into_inner();
        rows.extend(page.conversations);
        token = page.next_page_token;
        if !paging.all || token.is_empty() {
            break;
        }
    }
    if json {
        let items: Vec<_> = rows
            .iter()
            .map(|c| {
                json!({ "conversation_id": c.conversation_id, "peer_id": c.peer_id, "title": c.title, "unread_count": c.unread_count,
                        "active": c.active, "member_count": c.member_count, "last_message": c.last_message.as_ref().map(message_json) })
            })
            .collect();
        print_json(&json!({ "conversations": items, "next_page_token": token }));
        return Ok(());
    }
    for c in &rows {
        let with = if c.peer_id > 0 { format!("with {}", c.peer_id) } else { format!("group {:?} ({} members)", c.title, c.member_count) };
        let last =
            c.last_message.as_ref().map(|m| format!("{} from {}: {}", sent_at(m), m.sender_id, String::from_utf8_lossy(&m.body))).unwrap_or_default();
        out!("{:>12}  {with:<28}  unread {:>5}  {last}", c.conversation_id, c.unread_count);
    }
    if !token.is_empty() {
        out!("next page token: {token}");
    }
    Ok(())
}

/// `messages USER CONVERSATION`: newest first.
///
/// # Errors
/// Connection and RPC errors.
pub async fn messages(endpoints: &Endpoints, user_id: i64, conversation_id: i64, paging: Paging, json: bool) -> CliResult<()> {
    let mut c = endpoints.message().await?;
    let (mut token, mut rows) = (paging.page_token, Vec::new());
    let page_size = paging.page_size.unwrap_or(if paging.all { 1000 } else { 0 });
    loop {
        let req = pb::ListMessagesRequest { user_id, conversation_id, page_size, page_token: token };
        let page = c.list_messages(req).await.map_err(|s| CliError::rpc(MESSAGE, s))?.into_inner();
        rows.extend(page.messages);
        token = page.next_page_token;
        if !paging.all || token.is_empty() {
            break;
        }
    }
    if json {
        print_json(&json!({ "messages": rows.iter().map(message_json).collect::<Vec<_>>(), "next_page_token": token }));
        return Ok(());
    }
    for m in &rows {
        let edited = if m.edited_at.is_some() { " (edited)" } else { "" };
        out!("{:>12}  #{:<6}  {}  from {:>10}: {}{edited}", m.message_id, m.seq, sent_at(m), m.sender_id, String::from_utf8_lossy(&m.body));
    }
    if !token.is_empty() {
        out!("next page token: {token}");
    }
    Ok(())
}

/// `read USER CONVERSATION MESSAGE`: moves the read cursor forward.
///
/// # Errors
/// Connection and RPC errors.
pub async fn read(endpoints: &Endpoints, user_id: i64, conversation_id: i64, up_to_message_id: i64, json: bool) -> CliResult<()> {
    let req = pb::MarkReadRequest { user_id, conversation_id, up_to_message_id };
    let r = endpoints.message().await?.mark_read(req).await.map_err(|s| CliError::rpc(MESSAGE, s))?.into_inner();
    if json {
        print_json(&json!({ "changed": r.changed, "read_seq": r.read_seq, "unread_count": r.unread_count }));
    } else {
        out!("{}: read up to #{}, {} unread", if r.changed { "moved" } else { "unchanged" }, r.read_seq, r.unread_count);
    }
    Ok(())
}

/// Prints whether a change happened (`what` when it did, `unchanged` when it did not).
fn changed(what: &str, changed: bool, json: bool) {
    if json {
        print_json(&json!({ "changed": changed }));
    } else {
        out!("{}", if changed { what } else { "unchanged" });
    }
}

/// `delete-message USER MESSAGE`: USER (its sender) deletes MESSAGE.
///
/// # Errors
/// Connection and RPC errors.
pub async fn delete(endpoints: &Endpoints, user_id: i64, message_id: i64, json: bool) -> CliResult<()> {
    let req = pb::DeleteMessageRequest { user_id, message_id };
    let r = endpoints.message().await?.delete_message(req).await.map_err(|s| CliError::rpc(MESSAGE, s))?.into_inner();
    changed("deleted", r.changed, json);
    Ok(())
}

/// `edit-message USER MESSAGE BODY`: USER (its sender) replaces MESSAGE's body.
///
/// # Errors
/// Connection and RPC errors.
pub async fn edit(endpoints: &Endpoints, user_id: i64, message_id: i64, body: String, json: bool) -> CliResult<()> {
    let req = pb::EditMessageRequest { user_id, message_id, body: body.into_bytes() };
    let r = endpoints.message().await?.edit_message(req).await.map_err(|s| CliError::rpc(MESSAGE, s))?.into_inner();
    if json {
        print_json(&json!({ "changed": r.changed, "message": r.message.as_ref().map(message_json) }));
    } else {
        changed("edited", r.changed, json);
    }
    Ok(())
}

/// `rename-group USER CONVERSATION TITLE`: USER (a member) renames the group.
///
/// # Errors
/// Connection and RPC errors.
pub async fn rename(endpoints: &Endpoints, user_id: i64, conversation_id: i64, title: String, json: bool) -> CliResult<()> {
    let req = pb::RenameGroupRequest { user_id, conversation_id, title };
    let r = endpoints.message().await?.rename_group(req).await.map_err(|s| CliError::rpc(MESSAGE, s))?.into_inner();
    changed("renamed", r.changed, json);
    Ok(())
}
