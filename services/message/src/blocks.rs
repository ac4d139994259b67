//! Blocks stop private messages: while either user of a pair blocks the other, neither can send
//! the other a private message (PERMISSION_DENIED, reason BLOCKED). Blocks are relation-svc's
//! facts; message-svc decides from its own copy of them (`message_block_copy`), kept from
//! relation-svc's AccountEvents of kind BLOCK ([`crate::accounts`]), read inside the sending
//! transaction after the conversation's lock: no call to another service, so private sends go on
//! while relation-svc is down, and a slow relation-svc holds no message rows locked.
//!
//! The copy trails the source by the event's delay (the relay's round plus the consumer's poll;
//! measured in the book). A private message accepted in that window stays: it was sent before
//! the block reached the conversation, as a message sent just before a Block would be. Every send
//! that message-svc decides after the block event applied is refused. Groups are not affected: a
//! block stops the pair's private conversation, not the groups both are members of.

use sea_orm::ConnectionTrait;
use socialgraph_server::{ApiError, db_error};
use socialgraph_storage::block_pairs;

/// PERMISSION_DENIED with reason BLOCKED.
pub fn blocked() -> ApiError {
    ApiError::Forbidden { reason: "BLOCKED", message: "one of the two users blocks the other; private messages between them are refused".into() }
}

/// Whether `a` blocks `b` or `b` blocks `a`, as message-svc's copy holds it; `conn` is the
/// sending transaction.
///
/// # Errors
/// UNAVAILABLE (DATABASE_UNAVAILABLE) when the database fails.
pub async fn between<C: ConnectionTrait>(conn: &C, a: i64, b: i64) -> Result<bool, ApiError> {
    block_pairs::copy_blocked(conn, a, b).await.map_err(db_error)
}
