//! `account`: the lifecycle of accounts that are not plainly active (deactivated, suspended,
//! being deleted) and the progress of the batched job that hides, restores or ends their
//! edges. An id without a row is an active account. Also `following_followee`, the index of
//! `following` by followee, which the job needs to find an account's followers.
use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(Clone, Copy, DeriveIden)]
enum Account {
    Table,
    UserId,
    Status,
    Job,
    EdgesDone,
    StatusXid,
    ChangedAtMs,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(Account::Table)
                    .if_not_exists()
                    .col(ColumnDef::new(Account::UserId).big_integer().not_null().primary_key())
                    .col(ColumnDef::new(Account::Status).small_integer().not_null())
                    .col(ColumnDef::new(Account::Job).small_integer().not_null())
                    .col(ColumnDef::new(Account::EdgesDone).big_integer().not_null())
                    .col(ColumnDef::new(Account::StatusXid).big_integer().not_null())
                    .col(ColumnDef::new(Account::ChangedAtMs).big_integer().not_null())
                    .to_owned(),
            )
            .await?;
        manager.create_index(Index::create().if_not_exists().name("account_job").table(Account::Table).col(Account::Job).to_owned()).await?;
        // The same index the embedded mode has had since 000004 (IF NOT EXISTS there too).
        crate::m20261201_000004_create_following_followee_index::Migration.up(manager).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.drop_table(Table::drop().table(Account::Table).to_owned()).await
    }
}
