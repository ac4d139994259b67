//! The tables of message-svc (MessageService):
//! - `conversation`: one row per private conversation or group. `last_seq` is the sequence of
//!   its newest message (0 before the first) and its row is the lock that orders a
//!   conversation's sends; `direct_low`/`direct_high` (the pair's ids, smaller first) make a
//!   pair's private conversation unique, NULL for groups. A send bumps `last_seq` first: that
//!   update is the lock.
//! - `conversation_member`: one row per member, kept after removal (`state` 0). `joined_seq` is
//!   the sequence before the member's first visible message; `last_seq` and `last_message_id`
//!   the newest message visible to it (frozen once removed); `read_seq` its read cursor. Unread
//!   = `last_seq − read_seq`; a user's conversations are listed by (`last_message_id`,
//!   `conversation_id`) descending.
//! - `message`: the messages, unique by (`conversation_id`, `seq`) and by (`sender_id`,
//!   `client_message_id`), the idempotency key of a send.
use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Conversation {
    Table,
    Id,
    Kind,
    DirectLow,
    DirectHigh,
    OwnerId,
    Title,
    LastSeq,
    MemberCount,
    CreatedAtMs,
    UpdatedAtMs,
}

#[derive(DeriveIden)]
enum ConversationMember {
    Table,
    ConversationId,
    UserId,
    State,
    JoinedSeq,
    LastSeq,
    LastMessageId,
    ReadSeq,
    UpdatedAtMs,
}

#[derive(DeriveIden)]
enum Message {
    Table,
    Id,
    ConversationId,
    Seq,
    SenderId,
    ClientMessageId,
    Body,
    SentAtMs,
}

/// A NOT NULL BIGINT column.
fn big(c: impl IntoIden) -> ColumnDef {
    ColumnDef::new(c).big_integer().not_null().to_owned()
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(Conversation::Table)
                    .if_not_exists()
                    .col(ColumnDef::new(Conversation::Id).big_integer().not_null().auto_increment().primary_key())
                    .col(ColumnDef::new(Conversation::Kind).small_integer().not_null())
                    .col(ColumnDef::new(Conversation::DirectLow).big_integer().null())
                    .col(ColumnDef::new(Conversation::DirectHigh).big_integer().null())
                    .col(big(Conversation::OwnerId))
                    .col(ColumnDef::new(Conversation::Title).string_len(200).not_null())
                    .col(big(Conversation::LastSeq))
                    .col(ColumnDef::new(Conversation::MemberCount).integer().not_null())
                    .col(big(Conversation::CreatedAtMs))
                    .col(big(Conversation::UpdatedAtMs))
                    .to_owned(),
            )
            .await?;
        // A pair has one private conversation (NULLs, the groups, never collide).
        manager
            .create_index(
                Index::create()
                    .if_not_exists()
                    .unique()
                    .name("conversation_direct_idx")
                    .table(Conversation::Table)
                    .col(Conversation::DirectLow)
                    .col(Conversation::DirectHigh)
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(ConversationMember::Table)
                    .if_not_exists()
                    .col(big(ConversationMember::ConversationId))
                    .col(big(ConversationMember::UserId))
                    .col(ColumnDef::new(ConversationMember::State).small_integer().not_null())
                    .col(big(ConversationMember::JoinedSeq))
                    .col(big(ConversationMember::LastSeq))
                    .col(big(ConversationMember::LastMessageId))
                    .col(big(ConversationMember::ReadSeq))
                    .col(big(ConversationMember::UpdatedAtMs))
                    .primary_key(Index::create().col(ConversationMember::ConversationId).col(ConversationMember::UserId))
                    .to_owned(),
            )
            .await?;
        // A user's conversations, most recent activity first (ListConversations).
        manager
            .create_index(
                Index::create()
                    .if_not_exists()
                    .name("conversation_member_user_idx")
                    .table(ConversationMember::Table)
                    .col(ConversationMember::UserId)
                    .col(ConversationMember::LastMessageId)
                    .col(ConversationMember::ConversationId)
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(Message::Table)
                    .if_not_exists()
                    .col(ColumnDef::new(Message::Id).big_integer().not_null().auto_increment().primary_key())
                    .col(big(Message::ConversationId))
                    .col(big(Message::Seq))
                    .col(big(Message::SenderId))
                    .col(ColumnDef::new(Message::ClientMessageId).string_len(64).not_null())
                    .col(ColumnDef::new(Message::Body).blob().not_null())
                    .col(big(Message::SentAtMs))
                    .to_owned(),
            )
            .await?;
        // A conversation's messages in order (ListMessages), one message per position.
        manager
            .create_index(
                Index::create()
                    .if_not_exists()
                    .unique()
                    .name("message_conversation_seq_idx")
                    .table(Message::Table)
                    .col(Message::ConversationId)
                    .col(Message::Seq)
                    .to_owned(),
            )
            .await?;
        // The idempotency key of SendMessage.
        manager
            .create_index(
                Index::create()
                    .if_not_exists()
                    .unique()
                    .name("message_client_id_idx")
                    .table(Message::Table)
                    .col(Message::SenderId)
                    .col(Message::ClientMessageId)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for t in [Message::Table.into_iden(), ConversationMember::Table.into_iden(), Conversation::Table.into_iden()] {
            manager.drop_table(Table::drop().table(t).to_owned()).await?;
        }
        Ok(())
    }
}
