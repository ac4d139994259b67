//! `outbox`: events written in the same transaction as the change they describe; the relay
//! publishes them in id order and deletes them once the broker acknowledged.
use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Outbox {
    Table,
    Id,
    Topic,
    PartitionKey,
    Payload,
    Headers,
    CreatedAtMs,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(Outbox::Table)
                    .if_not_exists()
                    .col(ColumnDef::new(Outbox::Id).big_integer().not_null().auto_increment().primary_key())
                    .col(ColumnDef::new(Outbox::Topic).string_len(255).not_null())
                    .col(ColumnDef::new(Outbox::PartitionKey).big_integer().not_null())
                    .col(ColumnDef::new(Outbox::Payload).blob().not_null())
                    .col(ColumnDef::new(Outbox::Headers).text().not_null())
                    .col(ColumnDef::new(Outbox::CreatedAtMs).big_integer().not_null())
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.drop_table(Table::drop().table(Outbox::Table).to_owned()).await
    }
}
