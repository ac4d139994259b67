//! `consumer_offset`: (consumer, topic, partition) → next offset, written in the same
//! transaction as the projection rows it covers.
use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum ConsumerOffset {
    Table,
    Consumer,
    Topic,
    Partition,
    NextOffset,
    LastEventMs,
    UpdatedAtMs,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(ConsumerOffset::Table)
                    .if_not_exists()
                    .col(ColumnDef::new(ConsumerOffset::Consumer).string_len(128).not_null())
                    .col(ColumnDef::new(ConsumerOffset::Topic).string_len(255).not_null())
                    .col(ColumnDef::new(ConsumerOffset::Partition).integer().not_null())
                    .col(ColumnDef::new(ConsumerOffset::NextOffset).big_integer().not_null())
                    .col(ColumnDef::new(ConsumerOffset::LastEventMs).big_integer().null())
                    .col(ColumnDef::new(ConsumerOffset::UpdatedAtMs).big_integer().not_null())
                    .primary_key(Index::create().col(ConsumerOffset::Consumer).col(ConsumerOffset::Topic).col(ConsumerOffset::Partition))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.drop_table(Table::drop().table(ConsumerOffset::Table).to_owned()).await
    }
}
