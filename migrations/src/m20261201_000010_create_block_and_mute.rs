//! `block` and `mute`: who blocks or mutes whom, owned by relation-svc. Each row is one
//! directed restriction (owner → target) with the time it was made; the primary key answers
//! "does A block B" and the list index serves ListBlocks / ListMutes newest first.
use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(Clone, Copy, DeriveIden)]
enum Block {
    Table,
    BlockerId,
    BlockedId,
    CreatedAtMs,
}

#[derive(Clone, Copy, DeriveIden)]
enum Mute {
    Table,
    MuterId,
    MutedId,
    CreatedAtMs,
}

/// One restriction table: (owner, target) primary key, and the owner's list index.
async fn create<T: Iden + Copy + 'static>(manager: &SchemaManager<'_>, table: T, owner: T, target: T, at: T, index: &str) -> Result<(), DbErr> {
    manager
        .create_table(
            Table::create()
                .table(table)
                .if_not_exists()
                .col(ColumnDef::new(owner).big_integer().not_null())
                .col(ColumnDef::new(target).big_integer().not_null())
                .col(ColumnDef::new(at).big_integer().not_null())
                .primary_key(Index::create().col(owner).col(target))
                .to_owned(),
        )
        .await?;
    manager.create_index(Index::create().if_not_exists().name(index).table(table).col(owner).col(at).col(target).to_owned()).await
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        create(manager, Block::Table, Block::BlockerId, Block::BlockedId, Block::CreatedAtMs, "block_list").await?;
        create(manager, Mute::Table, Mute::MuterId, Mute::MutedId, Mute::CreatedAtMs, "mute_list").await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.drop_table(Table::drop().table(Block::Table).to_owned()).await?;
        manager.drop_table(Table::drop().table(Mute::Table).to_owned()).await
    }
}
