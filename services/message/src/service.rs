//! MessageService's rules over message-svc's tables. Every change is one transaction that
//! writes its MessageEvent to the outbox (topic `kafka.message_topic`, key = conversation id);
//! writes of one conversation take its row lock first, so its sequence is a total order.

use std::sync::Arc;

use prost::Message as _;
use sea_orm::{AccessMode, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr, IsolationLevel, TransactionTrait};
use socialgraph_domain::{PageTokenKey, Violation, now_ms, timestamp_from_ms, validate_user_id};
use socialgraph_events::headers;
use socialgraph_proto::events::v1::{MemberState as EventMemberState, MessageEvent, MessageEventKind};
use socialgraph_server::{ApiError, ApiResult, db_error};
use socialgraph_storage::messages::{self as store, MemberRow, MessageRow, NewConversation, NewMessage};
use socialgraph_storage::outbox::{self, NewOutboxRow};
use tokio::sync::Notify;

use crate::Config;
use crate::blocks::blocked;

/// Attempts of a transaction that lost a race (a concurrent first message of a pair, a
/// concurrent retry of one send, a deadlock).
pub(crate) const RETRIES: usize = 8;
/// Longest group title, bytes.
pub const MAX_TITLE_BYTES: usize = 200;
/// Longest client_message_id, bytes.
pub const MAX_CLIENT_ID_BYTES: usize = 64;

/// A failed attempt of a transaction: a rule's verdict, or a database error (retried when a new
/// attempt can cure it).
pub(crate) enum TxError {
    Db(DbErr),
    Api(ApiError),
}

impl From<DbErr> for TxError {
    fn from(e: DbErr) -> Self {
        Self::Db(e)
    }
}

impl From<ApiError> for TxError {
    fn from(e: ApiError) -> Self {
        Self::Api(e)
    }
}

impl socialgraph_storage::RetryableError for TxError {
    fn is_retryable(&self) -> bool {
        matches!(self, Self::Db(e) if socialgraph_storage::is_retryable(e))
    }
}

impl TxError {
    pub(crate) fn into_api(self) -> ApiError {
        match self {
            Self::Api(e) => e,
            Self::Db(e) => db_error(e),
        }
    }
}

/// Runs `$body` (a block that may use `?` on database errors and return a [`TxError`]) in a
/// transaction bound to `$tx`, again while it loses races, commits, and wakes the relay;
/// evaluates to the block's value as an [`ApiResult`].
macro_rules! in_tx {
    ($svc:expr, $tx:ident => $body:block) => {{
        let svc = $svc;
        let value = socialgraph_storage::retry_tx($crate::service::RETRIES, || async {
            let owned = svc.begin().await?;
            let $tx = &owned;
            let value: Result<_, $crate::service::TxError> = async { $body }.await;
            let value = value?;
            owned.commit().await?;
            Ok::<_, $crate::service::TxError>(value)
        })
        .await
        .map_err($crate::service::TxError::into_api)?;
        svc.wake.notify_one();
        Ok(value)
    }};
}
pub(crate) use in_tx;

/// Where a message goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The private conversation with this user.
    Recipient(i64),
    /// This conversation.
    Conversation(i64),
}

/// A validated SendMessage.
#[derive(Debug, Clone)]
pub struct Send {
    /// The sender.
    pub sender_id: i64,
    /// Where to.
    pub target: Target,
    /// Idempotency key.
    pub client_message_id: String,
    /// Opaque bytes.
    pub body: Vec<u8>,
}

/// The result of a send.
#[derive(Debug, Clone)]
pub struct Sent {
    /// The message (the first send's on a retry).
    pub message: MessageRow,
    /// False for a retry.
    pub created: bool,
}

pub(crate) fn not_a_member() -> ApiError {
    ApiError::Forbidden { reason: "NOT_A_MEMBER", message: "the user is not a member of this conversation".into() }
}

pub(crate) fn not_a_group() -> ApiError {
    ApiError::FailedPrecondition {
        reason: "NOT_A_GROUP",
        message: "a private conversation has no member changes".into(),
        metadata: Default::default(),
    }
}

fn member_limit(limit: i32) -> ApiError {
    ApiError::FailedPrecondition {
        reason: "GROUP_MEMBER_LIMIT",
        message: format!("a group has at most {limit} members"),
        metadata: [("limit".to_owned(), limit.to_string())].into(),
    }
}

/// Checks the fields of a SendMessage.
///
/// # Errors
/// INVALID_ARGUMENT naming every bad field (reason SELF_MESSAGE for a message to oneself).
pub fn validate_send(
    sender_id: i64,
    recipient_id: i64,
    conversation_id: i64,
    client_message_id: &str,
    body: &[u8],
    max_body: usize,
) -> ApiResult<Target> {
    let mut bad: Vec<Violation> = Vec::new();
    bad.extend(validate_user_id("sender_id", sender_id).err());
    let target = match (recipient_id, conversation_id) {
        (0, 0) => Err(Violation::new("recipient_id", "set recipient_id or conversation_id")),
        (r, 0) => validate_user_id("recipient_id", r).map(|_| Target::Recipient(r)),
        (0, c) => validate_user_id("conversation_id", c).map(|_| Target::Conversation(c)),
        _ => Err(Violation::new("conversation_id", "set recipient_id or conversation_id, not both")),
    };
    if let Err(v) = &target {
        bad.push(v.clone());
    }
    let id_ok = (1..=MAX_CLIENT_ID_BYTES).contains(&client_message_id.len()) && client_message_id.bytes().all(|b| (0x20..=0x7e).contains(&b));
    if !id_ok {
        bad.push(Violation::new("client_message_id", format!("must be 1 to {MAX_CLIENT_ID_BYTES} printable ASCII characters")));
    }
    if body.is_empty() || body.len() > max_body {
        bad.push(Violation::new("body", format!("must hold 1 to {max_body} bytes, holds {}", body.len())));
    }
    if !bad.is_empty() {
        return Err(bad.into());
    }
    match target {
        Ok(Target::Recipient(r)) if r == sender_id => Err(ApiError::InvalidArgument {
            reason: "SELF_MESSAGE",
            violations: vec![Violation::new("recipient_id", "cannot send a message to oneself")],
        }),
        Ok(t) => Ok(t),
        Err(v) => Err(v.into()),
    }
}

/// A membership's state as events carry it.
fn member_state(m: &MemberRow) -> EventMemberState {
    EventMemberState { user_id: m.user_id, unread_count: m.unread_count, version: m.version, active: m.active }
}

/// message-svc's state: the database, its limits, and the relay's wake-up.
pub struct Messages {
    pub(crate) db: DatabaseConnection,
    pub(crate) config: Config,
    pub(crate) wake: Arc<Notify>,
    pub(crate) tokens: PageTokenKey,
}

impl Messages {
    /// Serves over `db`; `wake` is notified after each commit that wrote outbox rows.
    pub fn new(db: DatabaseConnection, config: Config, wake: Arc<Notify>) -> Self {
        let tokens = socialgraph_server::paging::page_token_key(config.auth.page_token_secret.as_ref());
        Self { db, config, wake, tokens }
    }

    pub(crate) async fn begin(&self) -> Result<DatabaseTransaction, DbErr> {
        // Read committed everywhere (PostgreSQL's default; MySQL's is repeatable read), so reads
        // after the conversation's lock see the writes committed before it.
        match self.db.get_database_backend() {
            DbBackend::Sqlite => socialgraph_storage::begin_write(&self.db).await,
            DbBackend::Postgres => self.db.begin().await,
            _ => self.db.begin_with_config(Some(IsolationLevel::ReadCommitted), Some(AccessMode::ReadWrite)).await,
        }
    }

    /// An event of `conversation_id` carrying the states of the memberships it moved.
    pub(crate) fn event(
        &self,
        kind: MessageEventKind,
        conversation_id: i64,
        actor_id: i64,
        user_ids: Vec<i64>,
        moved: &[MemberRow],
        now: i64,
    ) -> MessageEvent {
        MessageEvent {
            event_id: uuid::Uuid::now_v7().to_string(),
            kind: kind as i32,
            conversation_id,
            actor_id,
            user_ids,
            occurred_at: Some(timestamp_from_ms(now)),
            members: moved.iter().map(member_state).collect(),
            ..MessageEvent::default()
        }
    }

    pub(crate) async fn publish<C: sea_orm::ConnectionTrait>(&self, conn: &C, event: &MessageEvent, now: i64) -> Result<(), DbErr> {
        let row = NewOutboxRow {
            topic: self.config.kafka.message_topic.clone(),
            partition_key: event.conversation_id,
            payload: event.encode_to_vec(),
            headers: headers::encode(&headers::event_headers("socialgraph.events.v1.MessageEvent")),
            created_at_ms: now,
        };
        outbox::insert(conn, &[row]).await
    }

    /// Sends a validated message ([`validate_send`]); idempotent by (sender, client_message_id).
    ///
    /// # Errors
    /// PERMISSION_DENIED (NOT_A_MEMBER; BLOCKED for a private message while either user blocks
    /// the other, see [`crate::blocks`]), FAILED_PRECONDITION (CLIENT_MESSAGE_ID_REUSED),
    /// UNAVAILABLE when the database is.
    pub async fn send(&self, s: &Send) -> ApiResult<Sent> {
        in_tx!(self, tx => { self.send_in(tx, s).await })
    }

    async fn send_in(&self, tx: &DatabaseTransaction, s: &Send) -> Result<Sent, TxError> {
        let now = now_ms();
        let pair = |r: i64| (s.sender_id.min(r), s.sender_id.max(r));
        if let Some(m) = store::by_client_id(tx, s.sender_id, &s.client_message_id).await? {
            if m.deleted_at_ms.is_some() {
                return Err(ApiError::FailedPrecondition {
                    reason: "MESSAGE_DELETED",
                    message: "the message sent with this client_message_id was deleted".into(),
                    metadata: Default::default(),
                }
                .into());
            }
            let same_target = match s.target {
                Target::Conversation(c) => m.conversation_id == c,
                Target::Recipient(r) => store::find_private(tx, pair(r).0, pair(r).1).await? == Some(m.conversation_id),
            };
            if same_target && m.body == s.body {
                return Ok(Sent { message: m, created: false });
            }
            return Err(ApiError::FailedPrecondition {
                reason: "CLIENT_MESSAGE_ID_REUSED",
                message: "this client_message_id was used by the sender for another message".into(),
                metadata: Default::default(),
            }
            .into());
        }
        let conversation_id = match s.target {
            Target::Conversation(c) => c,
            Target::Recipient(r) => {
                let (low, high) = pair(r);
                match store::find_private(tx, low, high).await? {
                    Some(c) => c,
                    None => {
                        let new = NewConversation {
                            kind: store::PRIVATE,
                            direct: Some((low, high)),
                            owner_id: s.sender_id,
                            title: String::new(),
                            members: vec![low, high],
                            now_ms: now,
                        };
                        store::create(tx, &new).await?.0
                    }
                }
            }
        };
        // The sequence first: it locks the conversation, so its members cannot change before
        // the commit (a failed check rolls the sequence back).
        let conversation = store::next_seq(tx, conversation_id, now).await?.ok_or_else(not_a_member)?;
        let seq = conversation.last_seq;
        let mut active = store::active_members(tx, conversation_id).await?;
        if !active.iter().any(|m| m.user_id == s.sender_id) {
            // A private conversation whose members are not active was ended by an account's
            // deletion (crate::accounts); a new message to the id opens it again from here.
            match (s.target, conversation.direct) {
                (Target::Recipient(_), Some(pair)) => active = self.reopen(tx, conversation_id, pair, seq, s.sender_id, now).await?,
                _ => return Err(not_a_member().into()),
            }
        }
        let recipients: Vec<i64> = active.iter().map(|m| m.user_id).filter(|u| *u != s.sender_id).collect();
        if let Some((low, high)) = conversation.direct {
            let peer = if low == s.sender_id { high } else { low };
            if crate::blocks::between(tx, s.sender_id, peer).await? {
                return Err(blocked().into());
            }
        }
        let new = NewMessage { conversation_id, seq, sender_id: s.sender_id, client_message_id: &s.client_message_id, body: &s.body, now_ms: now };
        let (id, moved) = store::append(tx, &new, &active).await?;
        let mut event = self.event(MessageEventKind::Sent, conversation_id, s.sender_id, recipients, &moved, now);
        (event.seq, event.message_id, event.body, event.client_message_id) = (seq, id, s.body.clone(), s.client_message_id.clone());
        self.publish(tx, &event, now).await?;
        let message = MessageRow {
            id,
            conversation_id,
            seq,
            sender_id: s.sender_id,
            client_message_id: s.client_message_id.clone(),
            body: s.body.clone(),
            sent_at_ms: now,
            edited_at_ms: None,
            deleted_at_ms: None,
        };
        Ok(Sent { message, created: true })
    }

    /// Opens again private conversation `conversation_id` of `pair` (ended by an account's
    /// deletion) for a message at `seq` by `sender_id`: its inactive members join as of the
    /// message before it (MEMBERS_ADDED). Returns the active members' rows after.
    async fn reopen(
        &self,
        tx: &DatabaseTransaction,
        conversation_id: i64,
        pair: (i64, i64),
        seq: i64,
        sender_id: i64,
        now: i64,
    ) -> Result<Vec<MemberRow>, TxError> {
        let active: Vec<i64> = store::active_members(tx, conversation_id).await?.iter().map(|m| m.user_id).collect();
        let ended: Vec<i64> = [pair.0, pair.1].into_iter().filter(|u| !active.contains(u)).collect();
        let last_message_id = store::message_id_at(tx, conversation_id, seq - 1).await?;
        let joined = store::join(tx, conversation_id, &ended, seq - 1, last_message_id, now).await?;
        store::add_member_count(tx, conversation_id, ended.len() as i32).await?;
        self.publish(tx, &self.event(MessageEventKind::MembersAdded, conversation_id, sender_id, ended, &joined, now), now).await?;
        Ok(store::active_members(tx, conversation_id).await?)
    }

    /// Moves `user_id`'s read cursor forward to `message_id`; returns (changed, member row after).
    ///
    /// # Errors
    /// INVALID_ARGUMENT (UNKNOWN_MESSAGE), PERMISSION_DENIED (NOT_A_MEMBER).
    pub async fn mark_read(&self, user_id: i64, conversation_id: i64, message_id: i64) -> ApiResult<(bool, MemberRow)> {
        in_tx!(self, tx => {
            let now = now_ms();
            // The conversation's lock orders the recount with sends and deletions.
            store::lock_conversation(tx, conversation_id, now).await?.ok_or_else(not_a_member)?;
            let me = store::member_of(tx, conversation_id, user_id).await?.ok_or_else(not_a_member)?;
            let unknown = || ApiError::InvalidArgument {
                reason: "UNKNOWN_MESSAGE",
                violations: vec![Violation::new("up_to_message_id", "no message of this conversation visible to the user has this id")],
            };
            let m = store::by_ids(tx, &[message_id]).await?.into_iter().next().filter(|m| m.conversation_id == conversation_id).ok_or_else(unknown)?;
            if m.seq <= me.joined_seq || m.seq > me.last_seq {
                return Err(unknown().into());
            }
            match store::mark_read(tx, &me, m.seq, now).await? {
                Some(after) => {
                    let mut event = self.event(MessageEventKind::Read, conversation_id, user_id, vec![user_id], &[after], now);
                    event.seq = m.seq;
                    self.publish(tx, &event, now).await?;
                    Ok((true, after))
                }
                None => Ok((false, me)),
            }
        })
    }

    /// Creates a group of `creator_id` and `members` (deduplicated); returns (id, member count).
    ///
    /// # Errors
    /// FAILED_PRECONDITION (GROUP_MEMBER_LIMIT).
    pub async fn create_group(&self, creator_id: i64, members: &[i64], title: &str) -> ApiResult<(i64, i32)> {
        let mut all = vec![creator_id];
        all.extend(members.iter().filter(|m| **m != creator_id));
        all.sort_unstable();
        all.dedup();
        let cap = self.config.messages.max_group_members;
        if all.len() > cap as usize {
            return Err(member_limit(cap));
        }
        in_tx!(self, tx => {
            let now = now_ms();
            let new = NewConversation { kind: store::GROUP, direct: None, owner_id: creator_id, title: title.to_owned(), members: all.clone(), now_ms: now };
            let (id, joined) = store::create(tx, &new).await?;
            self.publish(tx, &self.event(MessageEventKind::MembersAdded, id, creator_id, all.clone(), &joined, now), now).await?;
            Ok((id, all.len() as i32))
        })
    }

    /// Adds `users` to a group as `actor_id`; returns (added, member count).
    ///
    /// # Errors
    /// PERMISSION_DENIED (NOT_A_MEMBER), FAILED_PRECONDITION (NOT_A_GROUP, GROUP_MEMBER_LIMIT).
    pub async fn add_members(&self, actor_id: i64, conversation_id: i64, users: &[i64]) -> ApiResult<(i32, i32)> {
        let cap = self.config.messages.max_group_members;
        in_tx!(self, tx => {
            let now = now_ms();
            let c = store::lock_conversation(tx, conversation_id, now).await?.ok_or_else(not_a_member)?;
            if !store::member_of(tx, conversation_id, actor_id).await?.is_some_and(|m| m.active) {
                return Err(not_a_member().into());
            }
            if c.kind != store::GROUP {
                return Err(not_a_group().into());
            }
            let active: Vec<i64> = store::members(tx, conversation_id, users).await?.iter().filter(|m| m.active).map(|m| m.user_id).collect();
            let mut new: Vec<i64> = users.iter().copied().filter(|u| !active.contains(u)).collect();
            new.sort_unstable();
            new.dedup();
            let count = c.member_count + new.len() as i32;
            if count > cap {
                return Err(member_limit(cap).into());
            }
            if !new.is_empty() {
                let last_message_id = store::message_id_at(tx, conversation_id, c.last_seq).await?;
                let joined = store::join(tx, conversation_id, &new, c.last_seq, last_message_id, now).await?;
                store::add_member_count(tx, conversation_id, new.len() as i32).await?;
                self.publish(tx, &self.event(MessageEventKind::MembersAdded, conversation_id, actor_id, new.clone(), &joined, now), now).await?;
            }
            Ok((new.len() as i32, count))
        })
    }

    /// Removes `user_id` from a group: by its owner, or by the member itself (Leave). Returns
    /// whether it was an active member.
    ///
    /// # Errors
    /// PERMISSION_DENIED (NOT_A_MEMBER, NOT_THE_OWNER), FAILED_PRECONDITION (NOT_A_GROUP).
    pub async fn remove(&self, actor_id: i64, conversation_id: i64, user_id: i64) -> ApiResult<bool> {
        in_tx!(self, tx => {
            let now = now_ms();
            let c = store::lock_conversation(tx, conversation_id, now).await?.ok_or_else(not_a_member)?;
            if store::member_of(tx, conversation_id, actor_id).await?.is_none() {
                return Err(not_a_member().into());
            }
            if c.kind != store::GROUP {
                return Err(not_a_group().into());
            }
            if actor_id != user_id && actor_id != c.owner_id {
                return Err(ApiError::Forbidden { reason: "NOT_THE_OWNER", message: "only the group's owner removes other members".into() }.into());
            }
            let Some(left) = store::leave(tx, conversation_id, user_id, now).await? else { return Ok(false) };
            store::add_member_count(tx, conversation_id, -1).await?;
            self.publish(tx, &self.event(MessageEventKind::MembersRemoved, conversation_id, actor_id, vec![user_id], &[left], now), now).await?;
            Ok(true)
        })
    }
}
