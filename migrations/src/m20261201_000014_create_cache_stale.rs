//! `cache_stale`: users whose cached following list may have missed an event because the cache
//! Redis could not be reached when projection-svc applied it (`marks` grows with every mark,
//! `marked_at_ms` is the first). Written in the transaction that
//! stores the batch's offset (so no such user is ever forgotten), drained by projection-svc
//! once the cache Redis answers again: it deletes those users' cached lists, then the rows.
use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum CacheStale {
    Table,
    UserId,
    Marks,
    MarkedAtMs,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(CacheStale::Table)
                    .if_not_exists()
                    .col(ColumnDef::new(CacheStale::UserId).big_integer().not_null().primary_key())
                    .col(ColumnDef::new(CacheStale::Marks).big_integer().not_null())
                    .col(ColumnDef::new(CacheStale::MarkedAtMs).big_integer().not_null())
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.drop_table(Table::drop().table(CacheStale::Table).to_owned()).await
    }
}
