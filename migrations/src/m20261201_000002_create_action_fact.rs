//! `action_fact` (embedded mode only, [`crate::EmbeddedMigrator`]): one row per (entity,
//! metric, actor) that is active, the fact of "who liked"; `owner_id` as given by the first
//! toggle.
use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum ActionFact {
    Table,
    EntityType,
    EntityId,
    Metric,
    ActorId,
    OwnerId,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(ActionFact::Table)
                    .if_not_exists()
                    .col(ColumnDef::new(ActionFact::EntityType).text().not_null())
                    .col(ColumnDef::new(ActionFact::EntityId).big_integer().not_null())
                    .col(ColumnDef::new(ActionFact::Metric).integer().not_null())
                    .col(ColumnDef::new(ActionFact::ActorId).big_integer().not_null())
                    .col(ColumnDef::new(ActionFact::OwnerId).big_integer().not_null())
                    .primary_key(
                        Index::create().col(ActionFact::EntityType).col(ActionFact::EntityId).col(ActionFact::Metric).col(ActionFact::ActorId),
                    )
                    .to_owned(),
            )
            .await?;
        // Likes and favourites received by a user (a counter rebuild).
        manager
            .create_index(
                Index::create()
                    .if_not_exists()
                    .name("action_fact_owner")
                    .table(ActionFact::Table)
                    .col(ActionFact::OwnerId)
                    .col(ActionFact::Metric)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.drop_table(Table::drop().table(ActionFact::Table).to_owned()).await
    }
}
