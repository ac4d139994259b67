//! Unread message counts per user and conversation, from `sg.message.v1`. No event is applied
//! as a delta: every message event carries, for each membership it moved, the member's unread
//! count and version after the change (`members`), and Redis keeps the newest version per
//! membership (script `SYNC_UNREAD`). So a replayed range, a copy of an event at a later offset,
//! or batches read in any order leave the counts unchanged, and the total (`t` of the user's
//! hash) is the sum of what the hash holds: it cannot drift. The consumer reads nothing but the
//! records: message-svc may be down while it applies them.
//!
//! A hash Redis lost (flushed, or a failover without it) is rebuilt whole from message-svc on
//! the user's next read ([`read`], [`rebuild`]; also the admin RebuildUnreadCounts): a hash is
//! served only once marked built, and a rebuild keeps the newer version per conversation, so it
//! never undoes a batch the consumer applied meanwhile.

use std::collections::BTreeSet;

use prost::Message;
use rskafka::record::RecordAndOffset;
use socialgraph_cache::CacheError;
use socialgraph_events::consumer::{BatchHandler, BoxError};
use socialgraph_proto::events::v1::MessageEvent;
use socialgraph_proto::message::v1::message_service_client::MessageServiceClient;
use socialgraph_proto::message::v1::{BatchGetMemberStatesRequest, GetUnreadCountsRequest, MemberKey};
use socialgraph_server::{ApiError, ApiResult};
use tonic::transport::Channel;
use tracing::Instrument;

use crate::consume::ConsumerMetrics;
use crate::store::Store;
use crate::users::cache_error;

/// Most memberships asked of message-svc per call (rebuilds only).
const STATES_PER_CALL: usize = 1000;

/// Whether an event of `kind` moves unread counts (and so must carry member states).
fn moves_counts(kind: i32) -> bool {
    use socialgraph_proto::events::v1::MessageEventKind as K;
    matches!(K::try_from(kind), Ok(K::Sent | K::Read | K::MembersAdded | K::MembersRemoved | K::MessageDeleted))
}

/// The membership states a batch's events carry, in record order (the newest version of each
/// wins in Redis whatever the order). An event that moves counts but carries no states was
/// written before events carried them: it is counted as skipped (`no_member_states`), and the
/// next change of each membership it moved, or a rebuild of the hash, sets the count right.
fn carried(records: &[RecordAndOffset], metrics: &ConsumerMetrics) -> Vec<UnreadRow> {
    let mut rows = Vec::new();
    for r in records {
        match MessageEvent::decode(r.record.value.as_deref().unwrap_or_default()) {
            Ok(e) if e.conversation_id > 0 => {
                if e.members.is_empty() && moves_counts(e.kind) {
                    metrics.skipped.with_label_values(&["no_member_states"]).inc();
                }
                rows.extend(e.members.iter().filter(|m| m.user_id > 0 && m.version > 0).map(|m| UnreadRow {
                    user_id: m.user_id,
                    conversation_id: e.conversation_id,
                    version: m.version,
                    count: if m.active { m.unread_count.max(0) } else { 0 },
                }))
            }
            _ => metrics.skipped.with_label_values(&["undecodable"]).inc(),
        }
    }
    rows
}

/// Unread counts from `sg.message.v1`.
pub struct UnreadCounter {
    /// Redis.
    pub store: Store,
    /// Name of this consumer's offsets.
    pub consumer: String,
    /// Metrics.
    pub metrics: ConsumerMetrics,
}

impl BatchHandler for UnreadCounter {
    async fn load_offset(&self, topic: &str, partition: i32) -> Result<Option<i64>, BoxError> {
        Ok(self.store.load_offset(&self.consumer, topic, partition).await?)
    }

    async fn apply(&self, topic: &str, partition: i32, records: &[RecordAndOffset], next_offset: i64) -> Result<(), BoxError> {
        let span = socialgraph_telemetry::batch_span("counter.unread", topic, partition, records.iter().map(|r| &r.record.headers));
        async {
            let rows = carried(records, &self.metrics);
            self.metrics.applied.inc_by(self.store.sync_unread(&rows).await?);
            self.store.store_offset(&self.consumer, topic, partition, next_offset).await?;
            Ok(())
        }
        .instrument(span)
        .await
    }
}

/// One membership's unread count as message-svc gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnreadRow {
    /// The member.
    pub user_id: i64,
    /// The conversation.
    pub conversation_id: i64,
    /// `last_seq + read_seq`.
    pub version: i64,
    /// `last_seq − read_seq`.
    pub count: i64,
}

impl Store {
    /// Writes each row whose version is newer than the stored one, one script per user, in one
    /// round trip; returns how many applied.
    ///
    /// # Errors
    /// Redis errors.
    pub async fn sync_unread(&self, rows: &[UnreadRow]) -> Result<u64, CacheError> {
        let mut by_user: std::collections::BTreeMap<i64, Vec<&UnreadRow>> = Default::default();
        for r in rows {
            by_user.entry(r.user_id).or_default().push(r);
        }
        let mut pipe = redis::pipe();
        for (user, rows) in &by_user {
            let mut inv = self.scripts.sync_unread.prepare_invoke();
            inv.key(self.keys.user_unread(*user));
            for r in rows {
                inv.arg(r.conversation_id).arg(r.version).arg(r.count);
            }
            pipe.invoke_script(&inv);
        }
        let replies = self.query(&pipe).await?;
        Ok(replies.into_iter().filter_map(|v| redis::from_redis_value::<u64>(v).ok()).sum())
    }

    /// A user's unread counts as Redis holds them.
    ///
    /// # Errors
    /// Redis errors.
    pub async fn read_unread(&self, user_id: i64) -> Result<Unread, CacheError> {
        let mut pipe = redis::pipe();
        pipe.hgetall(self.keys.user_unread(user_id));
        let replies = self.query(&pipe).await?;
        let map: std::collections::HashMap<String, String> =
            replies.into_iter().next().and_then(|v| redis::from_redis_value(v).ok()).unwrap_or_default();
        let mut read = Unread { built: map.contains_key("b"), ..Unread::default() };
        for (field, value) in map {
            if field == "t" {
                read.total = value.parse().unwrap_or(0);
            } else if let (Ok(c), Some((_, n))) = (field.parse::<i64>(), value.split_once(':')) {
                let n: i64 = n.parse().unwrap_or(0);
                if n > 0 {
                    read.conversations.push((c, n));
                }
            }
        }
        read.conversations.sort_unstable();
        Ok(read)
    }

    /// Writes `rows` (all `user_id`'s) into the user's hash keeping the newer version of each,
    /// then sets the total to the sum and marks the hash built (script `REBUILD_UNREAD`).
    ///
    /// # Errors
    /// Redis errors.
    pub async fn rebuild_unread(&self, user_id: i64, rows: &[UnreadRow]) -> Result<(), CacheError> {
        let mut inv = self.scripts.rebuild_unread.prepare_invoke();
        inv.key(self.keys.user_unread(user_id));
        for r in rows {
            inv.arg(r.conversation_id).arg(r.version).arg(r.count);
        }
        let mut pipe = redis::pipe();
        pipe.invoke_script(&inv);
        self.query(&pipe).await?;
        Ok(())
    }
}

/// A user's unread counts in Redis.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unread {
    /// The sum over every conversation (field `t`).
    pub total: i64,
    /// (conversation, unread) of each conversation with unread messages, by conversation id.
    pub conversations: Vec<(i64, i64)>,
    /// The hash was built whole from message-svc (field `b`); without it Redis lost the user's
    /// counts (or never had them) and they are rebuilt before they are served.
    pub built: bool,
}

/// UNAVAILABLE (PEER_UNAVAILABLE) for a failed call to message-svc.
fn peer_error(e: tonic::Status) -> ApiError {
    tracing::warn!(code = ?e.code(), message = e.message(), "message-svc did not answer an unread rebuild");
    ApiError::unavailable(socialgraph_server::REASON_PEER, "message-svc did not answer; the unread counts cannot be rebuilt now, retry")
}

/// `user_id`'s unread counts, rebuilt first when Redis does not hold them whole (see
/// [`rebuild`]); with no message-svc configured, what Redis holds.
///
/// # Errors
/// UNAVAILABLE when Redis or (for a rebuild) message-svc is.
pub async fn read(store: &Store, message: Option<&MessageServiceClient<Channel>>, user_id: i64) -> ApiResult<Unread> {
    let held = store.read_unread(user_id).await.map_err(cache_error)?;
    match message {
        Some(message) if !held.built => rebuild_over(store, message, user_id, held).await,
        _ => Ok(held),
    }
}

/// The current (conversation, user) states of `pairs` from message-svc, as unread rows (pairs
/// that are no membership left out), in calls of at most [`STATES_PER_CALL`].
async fn member_states(message: &MessageServiceClient<Channel>, pairs: &[(i64, i64)]) -> Result<Vec<UnreadRow>, tonic::Status> {
    let mut rows = Vec::new();
    for chunk in pairs.chunks(STATES_PER_CALL) {
        let members = chunk.iter().map(|(c, u)| MemberKey { conversation_id: *c, user_id: *u }).collect();
        let states = message.clone().batch_get_member_states(BatchGetMemberStatesRequest { members }).await?.into_inner().states;
        rows.extend(states.into_iter().filter(|s| s.version > 0).map(|s| UnreadRow {
            user_id: s.user_id,
            conversation_id: s.conversation_id,
            version: s.version,
            count: s.unread_count,
        }));
    }
    Ok(rows)
}

/// Rebuilds `user_id`'s unread counts from message-svc: the conversations its GetUnreadCounts
/// lists, plus the current state (BatchGetMemberStates) of every other conversation Redis holds
/// as unread (read since), each kept only if at least as new as what Redis holds; the total is
/// then their sum. Safe beside the consumer: neither ever replaces a newer version.
///
/// # Errors
/// UNAVAILABLE when Redis or message-svc is.
pub async fn rebuild(store: &Store, message: &MessageServiceClient<Channel>, user_id: i64) -> ApiResult<Unread> {
    let held = store.read_unread(user_id).await.map_err(cache_error)?;
    rebuild_over(store, message, user_id, held).await
}

/// [`rebuild`] over `held`, what Redis held for the user when the rebuild started.
async fn rebuild_over(store: &Store, message: &MessageServiceClient<Channel>, user_id: i64, held: Unread) -> ApiResult<Unread> {
    let listed = message.clone().get_unread_counts(GetUnreadCountsRequest { user_id }).await.map_err(peer_error)?.into_inner();
    let mut rows: Vec<UnreadRow> = listed
        .conversations
        .iter()
        .map(|c| UnreadRow { user_id, conversation_id: c.conversation_id, version: c.version, count: c.unread_count })
        .collect();
    let listed: BTreeSet<i64> = rows.iter().map(|r| r.conversation_id).collect();
    let others: Vec<(i64, i64)> = held.conversations.iter().filter(|(c, _)| !listed.contains(c)).map(|(c, _)| (*c, user_id)).collect();
    rows.extend(member_states(message, &others).await.map_err(peer_error)?);
    store.rebuild_unread(user_id, &rows).await.map_err(cache_error)?;
    store.read_unread(user_id).await.map_err(cache_error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use socialgraph_proto::events::v1::{MemberState, MessageEventKind};

    fn record(e: &MessageEvent, offset: i64) -> RecordAndOffset {
        let record =
            rskafka::record::Record { key: None, value: Some(e.encode_to_vec()), headers: Default::default(), timestamp: Default::default() };
        RecordAndOffset { record, offset }
    }

    #[test]
    fn a_batch_yields_the_states_its_events_carry_and_an_inactive_member_counts_zero() {
        let metrics = ConsumerMetrics {
            applied: prometheus::IntCounter::new("applied", "applied").expect("counter"),
            skipped: prometheus::IntCounterVec::new(prometheus::Opts::new("skipped", "skipped"), &["reason"]).expect("counter"),
        };
        let state = |user_id, unread_count, version, active| MemberState { user_id, unread_count, version, active };
        let sent = MessageEvent {
            kind: MessageEventKind::Sent as i32,
            conversation_id: 7,
            actor_id: 1,
            members: vec![state(1, 0, 4, true), state(2, 3, 9, true)],
            ..Default::default()
        };
        let left = MessageEvent {
            kind: MessageEventKind::MembersRemoved as i32,
            conversation_id: 7,
            actor_id: 2,
            members: vec![state(2, 5, 10, false)],
            ..Default::default()
        };
        let old = MessageEvent { kind: MessageEventKind::Read as i32, conversation_id: 7, actor_id: 3, ..Default::default() };
        let rows = carried(&[record(&sent, 0), record(&left, 1), record(&old, 2)], &metrics);
        let row = |user_id, version, count| UnreadRow { user_id, conversation_id: 7, version, count };
        assert_eq!(rows, [row(1, 4, 0), row(2, 9, 3), row(2, 10, 0)]);
        assert_eq!(metrics.skipped.with_label_values(&["no_member_states"]).get(), 1, "an event from before states were carried");
    }
}
