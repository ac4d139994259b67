//! `block_blocked`: index (blocked_id, blocker_id) of `block`, so the blocks *of* a user are
//! found without a scan: the restriction summaries of the cache Redis read them on every fill,
//! and account deletion reads them to find whose summaries to drop.
use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Block {
    Table,
    BlockerId,
    BlockedId,
}

const NAME: &str = "block_blocked";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_index(Index::create().if_not_exists().name(NAME).table(Block::Table).col(Block::BlockedId).col(Block::BlockerId).to_owned())
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.drop_index(Index::drop().name(NAME).table(Block::Table).to_owned()).await
    }
}
