//! Unread counts that messages can leave, and memberships that say so in their events:
//! - `conversation_member.unread_count`: the member's unread messages, kept by every change
//!   (a send adds one for each other active member; a read recounts after the cursor; a deleted
//!   unread message takes one away; leaving or being removed sets 0). `last_seq − read_seq` no
//!   longer tells it once messages can be deleted.
//! - `conversation_member.version`: grows by one with every change of the membership; events
//!   carry it beside the count, and a copy keeps the highest it saw.
//! - `message.deleted_at_ms` and `message.edited_at_ms`: a deleted message stays as a tombstone
//!   (its body emptied) so its id and its sender's idempotency key stay taken.
//!
//! Existing rows: `version` starts at `last_seq + read_seq`, the version they were served with
//! before, so copies already made stay comparable. Members that had left with unread messages
//! get 0 and one version more, so a rebuild of a copy replaces the stale count.
//!
//! message-svc pods of an older release do not keep these columns: none may serve once this has
//! run (docs/src/operations/scaling.md#upgrading-to-stored-unread-counts).
use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum ConversationMember {
    Table,
    UnreadCount,
    Version,
}

#[derive(DeriveIden)]
enum Message {
    Table,
    DeletedAtMs,
    EditedAtMs,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // One column per statement: SQLite adds one at a time.
        let member = |c: ConversationMember| {
            Table::alter().table(ConversationMember::Table).add_column(ColumnDef::new(c).big_integer().not_null().default(0)).to_owned()
        };
        if !manager.has_column("conversation_member", "unread_count").await? {
            manager.alter_table(member(ConversationMember::UnreadCount)).await?;
            manager.alter_table(member(ConversationMember::Version)).await?;
            manager
                .get_connection()
                .execute_unprepared(
                    "UPDATE conversation_member SET \
                     unread_count = CASE WHEN state = 1 AND last_seq > read_seq THEN last_seq - read_seq ELSE 0 END, \
                     version = last_seq + read_seq + CASE WHEN state = 0 AND last_seq > read_seq THEN 1 ELSE 0 END",
                )
                .await?;
        }
        let message = |c: Message| Table::alter().table(Message::Table).add_column(ColumnDef::new(c).big_integer().null()).to_owned();
        if !manager.has_column("message", "deleted_at_ms").await? {
            manager.alter_table(message(Message::DeletedAtMs)).await?;
            manager.alter_table(message(Message::EditedAtMs)).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for c in [ConversationMember::UnreadCount, ConversationMember::Version] {
            manager.alter_table(Table::alter().table(ConversationMember::Table).drop_column(c).to_owned()).await?;
        }
        for c in [Message::DeletedAtMs, Message::EditedAtMs] {
            manager.alter_table(Table::alter().table(Message::Table).drop_column(c).to_owned()).await?;
        }
        Ok(())
    }
}
