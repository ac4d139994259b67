//! Mutes with versions, so projection-svc can keep a copy from events:
//! - `mute_version` (relation-svc): per (muter, muted), whether the muter mutes the other, and a
//!   version one up on every change of that. Written in the transaction of the Mute, Unmute or
//!   account deletion that changed it, with its AccountEvent (kind MUTE).
//! - `timeline_mute_copy` (projection-svc): the same rows as projection-svc last applied them
//!   from those events (the newest version wins); timelines are filtered by it, with no call to
//!   relation-svc.
//!
//! Both start from the mutes that exist (version 1). On one database, as the chart deploys it
//! by default, that is every mute; a projection-svc on a database of its own starts from none
//! and learns each mute at its next change.
//!
//! An account's deletion reads every pair it is in, either side, with a locking read: indexes
//! on `mute_version (muted_id)` and `block_pair (high_id)` let that read lock the account's
//! rows rather than scan (and, on MariaDB, lock) the whole table.
use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(Clone, Copy, DeriveIden)]
enum Mute {
    MuterId,
    MutedId,
    Muted,
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
                .col(ColumnDef::new(Mute::MuterId).big_integer().not_null())
                .col(ColumnDef::new(Mute::MutedId).big_integer().not_null())
                .col(ColumnDef::new(Mute::Muted).boolean().not_null())
                .col(ColumnDef::new(Mute::Version).big_integer().not_null())
                .col(ColumnDef::new(Mute::UpdatedAtMs).big_integer().not_null())
                .primary_key(Index::create().col(Mute::MuterId).col(Mute::MutedId))
                .to_owned(),
        )
        .await?;
    let copy = format!(
        "INSERT INTO {} (muter_id, muted_id, muted, version, updated_at_ms) SELECT muter_id, muted_id, {}, 1, created_at_ms FROM mute",
        table.to_string(),
        if manager.get_database_backend() == sea_orm::DbBackend::Postgres { "TRUE" } else { "1" }
    );
    manager.get_connection().execute_unprepared(&copy).await.map(|_| ())
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in ["mute_version", "timeline_mute_copy"] {
            if !manager.has_table(table).await? {
                create(manager, table).await?;
            }
        }
        for (name, table, column) in [("idx_mute_version_muted", "mute_version", "muted_id"), ("idx_block_pair_high", "block_pair", "high_id")] {
            if !manager.has_index(table, name).await? {
                let index = Index::create().name(name).table(Alias::new(table)).col(Alias::new(column)).to_owned();
                manager.create_index(index).await?;
            }
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.drop_index(Index::drop().name("idx_block_pair_high").table(Alias::new("block_pair")).to_owned()).await?;
        for table in ["mute_version", "timeline_mute_copy"] {
            manager.drop_table(Table::drop().table(Alias::new(table)).to_owned()).await?;
        }
        Ok(())
    }
}
