//! `entity_counter` (embedded mode only, [`crate::EmbeddedMigrator`]): like and favourite
//! counts per entity and a per-entity `seq` bumped by every change (the ActionEvent's
//! `sequence`).
use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum EntityCounter {
    Table,
    EntityType,
    EntityId,
    Likes,
    Favs,
    Seq,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(EntityCounter::Table)
                    .if_not_exists()
                    .col(ColumnDef::new(EntityCounter::EntityType).text().not_null())
                    .col(ColumnDef::new(EntityCounter::EntityId).big_integer().not_null())
                    .col(ColumnDef::new(EntityCounter::Likes).big_integer().not_null().default(0))
                    .col(ColumnDef::new(EntityCounter::Favs).big_integer().not_null().default(0))
                    .col(ColumnDef::new(EntityCounter::Seq).big_integer().not_null().default(0))
                    .primary_key(Index::create().col(EntityCounter::EntityType).col(EntityCounter::EntityId))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.drop_table(Table::drop().table(EntityCounter::Table).to_owned()).await
    }
}
