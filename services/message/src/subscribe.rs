//! One Subscribe stream: catch up from the resume token's positions to where the [`Hub`]'s
//! broadcast stands, reading the log, then follow the broadcast; whenever the stream falls more
//! than `subscribe.buffer` records behind, catch up from the log again. Every record passes its
//! partition's cursor once (records below it are skipped), so nothing is delivered twice by
//! position.
//!
//! Copies of an event at later offsets (a relay that published and died before deleting its
//! outbox rows publishes them again) carry the same conversation sequence, and one
//! conversation's originals appear in sequence order (its key keeps it on one partition and its
//! row lock orders its outbox rows): a message whose sequence is not above the highest one the
//! stream delivered for its conversation, or a read cursor not above the last one, is a copy and
//! is dropped. The resume token carries those marks for the 64 conversations most recently
//! delivered, which covers copies across a reconnect as long as they follow their originals
//! within 64 of the user's conversations (a relay republishes only its last unfinished batch).

use std::collections::HashMap;
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use prost::Message as _;
use socialgraph_domain::Violation;
use socialgraph_proto::events::v1::MessageEventKind;
use socialgraph_proto::message::v1 as pb;
use socialgraph_server::ApiError;
use tokio::sync::{broadcast, mpsc};
use tonic::Status;

use crate::live::{Hub, Logged, decode};

/// How long a Subscribe waits for the instance's hub to reach the log before UNAVAILABLE.
const START_WAIT: std::time::Duration = std::time::Duration::from_secs(5);
/// Conversations whose marks a resume token carries.
const TOKEN_MARKS: usize = 64;
/// Conversations whose marks a stream keeps in memory.
const KEPT_MARKS: usize = 256;

/// The resume token, as protobuf bytes in URL-safe base64 (no padding).
#[derive(Clone, PartialEq, prost::Message)]
struct TokenPb {
    /// The subscriber (a token resumes only its own stream).
    #[prost(int64, tag = "1")]
    user_id: i64,
    /// Next offset per partition.
    #[prost(int64, repeated, tag = "2")]
    positions: Vec<i64>,
    /// Recently delivered conversations.
    #[prost(message, repeated, tag = "3")]
    marks: Vec<MarkPb>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct MarkPb {
    #[prost(int64, tag = "1")]
    conversation_id: i64,
    #[prost(int64, tag = "2")]
    message_seq: i64,
    #[prost(int64, tag = "3")]
    read_seq: i64,
}

/// The highest sequences delivered for one conversation, and when (a stream-local counter).
#[derive(Debug, Clone, Copy, Default)]
struct Mark {
    message_seq: i64,
    read_seq: i64,
    touched: u64,
}

/// A stream's position: next offset per partition and the marks of its conversations.
#[derive(Debug, Clone)]
pub struct Cursor {
    user_id: i64,
    positions: Vec<i64>,
    marks: HashMap<i64, Mark>,
    clock: u64,
}

fn bad_token(description: &str) -> ApiError {
    vec![Violation::new("resume_token", description)].into()
}

impl Cursor {
    /// Decodes `raw` for `user_id`; `None` for an empty token.
    ///
    /// # Errors
    /// INVALID_ARGUMENT for a token that does not decode, names another user or holds a
    /// negative position.
    pub fn decode(raw: &str, user_id: i64) -> Result<Option<Self>, ApiError> {
        if raw.is_empty() {
            return Ok(None);
        }
        let bytes = URL_SAFE_NO_PAD.decode(raw).map_err(|_| bad_token("not a resume token of Subscribe"))?;
        let t = TokenPb::decode(bytes.as_slice()).map_err(|_| bad_token("not a resume token of Subscribe"))?;
        if t.user_id != user_id {
            return Err(bad_token("this resume token belongs to another user's stream"));
        }
        if t.positions.is_empty() || t.positions.iter().any(|p| *p < 0) {
            return Err(bad_token("not a resume token of Subscribe"));
        }
        let marks = t
            .marks
            .iter()
            .enumerate()
            .map(|(i, m)| (m.conversation_id, Mark { message_seq: m.message_seq, read_seq: m.read_seq, touched: i as u64 }))
            .collect();
        Ok(Some(Self { user_id, positions: t.positions, marks, clock: t.marks.len() as u64 }))
    }

    /// A cursor at `positions` with no marks.
    pub fn at(user_id: i64, positions: Vec<i64>) -> Self {
        Self { user_id, positions, marks: HashMap::new(), clock: 0 }
    }

    /// The token of this position.
    pub fn encode(&self) -> String {
        let mut recent: Vec<(&i64, &Mark)> = self.marks.iter().collect();
        recent.sort_unstable_by_key(|(_, m)| m.touched);
        let marks = recent
            .iter()
            .rev()
            .take(TOKEN_MARKS)
            .rev()
            .map(|(c, m)| MarkPb { conversation_id: **c, message_seq: m.message_seq, read_seq: m.read_seq })
            .collect();
        URL_SAFE_NO_PAD.encode(TokenPb { user_id: self.user_id, positions: self.positions.clone(), marks }.encode_to_vec())
    }

    /// Passes `r` through the cursor: the item to deliver, if `r` is past the partition's
    /// position, concerns the user and is no copy of something delivered.
    fn pass(&mut self, r: &Logged) -> Option<pb::SubscribeResponse> {
        let slot = self.positions.get_mut(r.partition as usize)?;
        if r.offset < *slot {
            return None;
        }
        *slot = r.offset + 1;
        let e = &r.event;
        let kind = MessageEventKind::try_from(e.kind).ok()?;
        let concerns = match kind {
            MessageEventKind::Read => e.actor_id == self.user_id,
            MessageEventKind::Sent | MessageEventKind::MessageDeleted | MessageEventKind::MessageEdited | MessageEventKind::GroupRenamed => {
                e.actor_id == self.user_id || e.user_ids.contains(&self.user_id)
            }
            _ => false,
        };
        if !concerns {
            return None;
        }
        self.clock += 1;
        let mark = self.marks.entry(e.conversation_id).or_default();
        mark.touched = self.clock;
        // Messages and read cursors carry the conversation's sequence: a copy is not above
        // what was delivered. Deletions, edits and renames are idempotent and pass as they come.
        let delivered = match kind {
            MessageEventKind::Sent => Some(&mut mark.message_seq),
            MessageEventKind::Read => Some(&mut mark.read_seq),
            _ => None,
        };
        if let Some(delivered) = delivered {
            let newer = e.seq > *delivered;
            *delivered = (*delivered).max(e.seq);
            if !newer {
                return None;
            }
        }
        if self.marks.len() > KEPT_MARKS {
            let oldest = self.marks.iter().min_by_key(|(_, m)| m.touched).map(|(c, _)| *c);
            oldest.map(|c| self.marks.remove(&c));
        }
        let mut item = item_of(kind, e)?;
        item.resume_token = self.encode();
        Some(item)
    }
}

/// The Subscribe item of an event that concerns the subscriber (no resume token yet).
fn item_of(kind: MessageEventKind, e: &socialgraph_proto::events::v1::MessageEvent) -> Option<pb::SubscribeResponse> {
    let message = || pb::Message {
        message_id: e.message_id,
        conversation_id: e.conversation_id,
        seq: e.seq,
        sender_id: e.actor_id,
        client_message_id: e.client_message_id.clone(),
        body: e.body.clone(),
        sent_at: e.occurred_at,
        edited_at: e.edited_at,
    };
    let (kind, message, read, renamed) = match kind {
        MessageEventKind::Sent => (pb::SubscribeEventKind::Message, Some(message()), None, None),
        MessageEventKind::Read => {
            (pb::SubscribeEventKind::Read, None, Some(pb::ReadState { conversation_id: e.conversation_id, read_seq: e.seq }), None)
        }
        MessageEventKind::MessageDeleted => {
            let gone = pb::Message { sent_at: None, ..message() };
            (pb::SubscribeEventKind::MessageDeleted, Some(gone), None, None)
        }
        MessageEventKind::MessageEdited => {
            // The edit's time is not the send's: readers merge it by message id.
            (pb::SubscribeEventKind::MessageEdited, Some(pb::Message { sent_at: None, ..message() }), None, None)
        }
        MessageEventKind::GroupRenamed => {
            let renamed = pb::GroupRenamed { conversation_id: e.conversation_id, title: e.title.clone() };
            (pb::SubscribeEventKind::GroupRenamed, None, None, Some(renamed))
        }
        _ => return None,
    };
    Some(pb::SubscribeResponse { kind: kind as i32, message, read, renamed, ..Default::default() })
}

/// UNAVAILABLE: live delivery cannot read the log.
fn log_down() -> ApiError {
    ApiError::unavailable(socialgraph_server::REASON_BROKER, "live delivery cannot read the message log now; retry")
}

fn expired(reason: &'static str, message: &str) -> ApiError {
    ApiError::FailedPrecondition { reason, message: message.into(), metadata: Default::default() }
}

/// Opens a stream for `user_id` from `token` (now when `None`): checks the token against the
/// log and returns the broadcast receiver and the starting cursor.
///
/// # Errors
/// FAILED_PRECONDITION (RESUME_TOKEN_EXPIRED, CATCH_UP_TOO_LONG), UNAVAILABLE while the log
/// is unreachable (after waiting up to 5 s for the instance to reach it).
pub async fn open(hub: &Hub, user_id: i64, token: Option<Cursor>, max_catch_up: u64) -> Result<(broadcast::Receiver<Arc<Logged>>, Cursor), ApiError> {
    let (rx, now) = hub.subscribe_within(START_WAIT).await.ok_or_else(log_down)?;
    let Some(cursor) = token else {
        return Ok((rx, Cursor::at(user_id, now)));
    };
    if cursor.positions.len() != now.len() {
        return Err(expired("RESUME_TOKEN_EXPIRED", "the message log's partitions changed since this token; resync and subscribe afresh"));
    }
    let mut behind = 0u64;
    for (p, (from, to)) in cursor.positions.iter().zip(&now).enumerate() {
        if from < to {
            let (earliest, _) = hub.log.bounds(p as i32).await.map_err(|_| log_down())?;
            if *from < earliest {
                return Err(expired("RESUME_TOKEN_EXPIRED", "the message log no longer holds this token's position; resync and subscribe afresh"));
            }
            behind += (to - from) as u64;
        }
    }
    if behind > max_catch_up {
        return Err(expired(
            "CATCH_UP_TOO_LONG",
            &format!("{behind} records behind this token (at most {max_catch_up}); resync and subscribe afresh"),
        ));
    }
    Ok((rx, cursor))
}

/// Feeds one stream until the client goes away or the hub stops: the SUBSCRIBED item, the
/// catch-up from the log, then the broadcast.
pub async fn pump(
    hub: Arc<Hub>,
    mut rx: broadcast::Receiver<Arc<Logged>>,
    mut cursor: Cursor,
    tx: mpsc::Sender<Result<pb::SubscribeResponse, Status>>,
) {
    let hello = pb::SubscribeResponse { kind: pb::SubscribeEventKind::Subscribed as i32, resume_token: cursor.encode(), ..Default::default() };
    if tx.send(Ok(hello)).await.is_err() {
        return;
    }
    loop {
        // Catch up from the log to where the broadcast stands.
        let Some(target) = hub.positions() else { return };
        if let Err(e) = catch_up(&hub, &mut cursor, &target, &tx).await {
            let _ = tx.send(Err(e.into())).await;
            return;
        }
        // Then follow the broadcast until the stream falls behind it.
        loop {
            let next = tokio::select! {
                r = rx.recv() => r,
                _ = tx.closed() => return,
                _ = hub.cancel.cancelled() => {
                    let _ = tx.send(Err(Status::unavailable("message-svc is stopping; resubscribe with the last resume_token"))).await;
                    return;
                }
            };
            match next {
                Ok(r) => {
                    if let Some(item) = cursor.pass(&r)
                        && tx.send(Ok(item)).await.is_err()
                    {
                        return;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => break,
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }
}

async fn catch_up(hub: &Hub, cursor: &mut Cursor, target: &[i64], tx: &mpsc::Sender<Result<pb::SubscribeResponse, Status>>) -> Result<(), ApiError> {
    for (p, to) in target.iter().enumerate() {
        while cursor.positions.get(p).is_some_and(|from| from < to) {
            let from = cursor.positions[p];
            let records = hub.log.fetch(p as i32, from).await.map_err(|_| log_down())?;
            if records.first().is_none_or(|(o, _)| o >= to) {
                // Nothing left below the target (offsets may have gaps).
                cursor.positions[p] = *to;
                break;
            }
            for (offset, bytes) in records.into_iter().take_while(|(o, _)| o < to) {
                let Some(r) = decode(p as i32, offset, &bytes) else {
                    cursor.positions[p] = offset + 1;
                    continue;
                };
                if let Some(item) = cursor.pass(&r)
                    && tx.send(Ok(item)).await.is_err()
                {
                    return Ok(());
                }
            }
        }
    }
    Ok(())
}
