//! Blocks stop private messages: while either user of a pair blocks the other, neither can send
//! the other a private message (PERMISSION_DENIED, reason BLOCKED). Blocks are relation-svc's
//! facts (docs/src/architecture/messages.md#blocks-stop-private-messages), so the distributed
//! mesh asks relation-svc; the embedded mode, one database
//! for every service, reads the `block` table inside the sending transaction.
//!
//! The check runs inside the send's transaction, after the conversation's row lock and before
//! the message is written. A block that commits while a send is between its check and its commit
//! does not stop that one message (the two are concurrent; either order is a valid history);
//! every send that starts after Block returned is refused. Groups are not affected: a block
//! stops the pair's private conversation, not the groups both are members of.

use sea_orm::ConnectionTrait;
use socialgraph_proto::relation::v1::GetRelationshipRequest;
use socialgraph_proto::relation::v1::relation_service_client::RelationServiceClient;
use socialgraph_server::{ApiError, REASON_PEER, db_error};
use socialgraph_storage::restrictions::{self, Restriction};
use tonic::transport::Channel;

/// Where the blocks between two users are read.
#[derive(Clone)]
pub enum Blocks {
    /// relation-svc's GetRelationship (one loopback round trip per new private message).
    Relation(RelationServiceClient<Channel>),
    /// The `block` table of the same database (the embedded mode).
    Table,
}

/// PERMISSION_DENIED with reason BLOCKED.
pub fn blocked() -> ApiError {
    ApiError::Forbidden { reason: "BLOCKED", message: "one of the two users blocks the other; private messages between them are refused".into() }
}

impl Blocks {
    /// Whether `a` blocks `b` or `b` blocks `a`; `conn` is the sending transaction (read by
    /// [`Blocks::Table`] only).
    ///
    /// # Errors
    /// UNAVAILABLE (reason PEER_UNAVAILABLE) when relation-svc does not answer, so a send is
    /// never let through unchecked; UNAVAILABLE (DATABASE_UNAVAILABLE) from the table.
    pub async fn between<C: ConnectionTrait>(&self, conn: &C, a: i64, b: i64) -> Result<bool, ApiError> {
        match self {
            Self::Relation(client) => {
                let mut client = client.clone();
                let answer = client.get_relationship(GetRelationshipRequest { user_id: a, other_user_id: b }).await.map_err(|e| {
                    tracing::warn!(code = ?e.code(), message = e.message(), "relation-svc did not answer the block check");
                    ApiError::unavailable(REASON_PEER, "relation-svc did not answer whether the users block each other; retry")
                })?;
                let r = answer.into_inner().relationship.unwrap_or_default();
                Ok(r.blocking || r.blocked_by)
            }
            Self::Table => {
                let found = restrictions::between(conn, a, &[b]).await.map_err(db_error)?;
                Ok(found.iter().any(|(kind, _, _)| *kind == Restriction::Block))
            }
        }
    }
}
