//! `message_account_seen`: message-svc's record, per account, of the newest AccountEvent
//! (relation-svc's `sg.account.v1`) it applied (`version`). Written in the transaction that
//! stores its consumer offset; an event not above it (a replay, a copy at a later offset) changes
//! nothing.
use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum MessageAccountSeen {
    Table,
    UserId,
    Version,
    UpdatedAtMs,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(MessageAccountSeen::Table)
                    .if_not_exists()
                    .col(ColumnDef::new(MessageAccountSeen::UserId).big_integer().not_null().primary_key())
                    .col(ColumnDef::new(MessageAccountSeen::Version).big_integer().not_null())
                    .col(ColumnDef::new(MessageAccountSeen::UpdatedAtMs).big_integer().not_null())
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.drop_table(Table::drop().table(MessageAccountSeen::Table).to_owned()).await
    }
}
