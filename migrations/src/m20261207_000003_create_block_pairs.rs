//! Blocks as pairs with versions, so other services can keep a copy from events:
//! - `block_pair` (relation-svc): per pair of users (smaller id first), whether either blocks
//!   the other, and a version one up on every change of that. Written in the transaction of the
//!   Block, Unblock or account deletion that changed it, with its AccountEvent (kind BLOCK).
//! - `message_block_copy` (message-svc): the same pairs as message-svc last applied them from
//!   those events (the newest version wins); a private send is decided from it, in message-svc's
//!   own transaction, with no call to relation-svc.
//!
//! Both start from the blocks that exist (version 1). On one database, as the chart deploys it
//! by default, that is every block; a message-svc on a database of its own starts from none and
//! learns each pair at its next change (docs/src/operations/scaling.md#upgrading-to-block-copies).
use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(Clone, Copy, DeriveIden)]
enum Pair {
    LowId,
    HighId,
    Blocked,
    Version,
    UpdatedAtMs,
}

async fn create(manager: &SchemaManager<'_>, table: &str) -> Result<(), DbErr> {
    let table = Alias::new(table);
    manager
        .create_table(
            Table::create()
                .table(table.clone())
                .if_not_exists()
                .col(ColumnDef::new(Pair::LowId).big_integer().not_null())
                .col(ColumnDef::new(Pair::HighId).big_integer().not_null())
                .col(ColumnDef::new(Pair::Blocked).boolean().not_null())
                .col(ColumnDef::new(Pair::Version).big_integer().not_null())
                .col(ColumnDef::new(Pair::UpdatedAtMs).big_integer().not_null())
                .primary_key(Index::create().col(Pair::LowId).col(Pair::HighId))
                .to_owned(),
        )
        .await?;
    let copy = format!(
        "INSERT INTO {} (low_id, high_id, blocked, version, updated_at_ms) \
         SELECT CASE WHEN blocker_id < blocked_id THEN blocker_id ELSE blocked_id END, \
                CASE WHEN blocker_id < blocked_id THEN blocked_id ELSE blocker_id END, {}, 1, MAX(created_at_ms) \
         FROM block GROUP BY 1, 2",
        table.to_string(),
        if manager.get_database_backend() == sea_orm::DbBackend::Postgres { "TRUE" } else { "1" }
    );
    manager.get_connection().execute_unprepared(&copy).await.map(|_| ())
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in ["block_pair", "message_block_copy"] {
            if !manager.has_table(table).await? {
                create(manager, table).await?;
            }
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in ["block_pair", "message_block_copy"] {
            manager.drop_table(Table::drop().table(Alias::new(table)).to_owned()).await?;
        }
        Ok(())
    }
}
