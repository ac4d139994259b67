//! `user_counter` (embedded mode only, [`crate::EmbeddedMigrator`]): one row per user with
//! followings, followers, posts, likes and favourites received, and `guard_offset`, the last log
//! offset (outbox id) its values reflect (−1: none yet; dropped by
//! `m20261207_000006_add_user_counter_versions`).
use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum UserCounter {
    Table,
    UserId,
    Followings,
    Followers,
    Posts,
    LikesReceived,
    FavsReceived,
    GuardOffset,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(UserCounter::Table)
                    .if_not_exists()
                    .col(ColumnDef::new(UserCounter::UserId).big_integer().not_null().primary_key())
                    .col(ColumnDef::new(UserCounter::Followings).big_integer().not_null().default(0))
                    .col(ColumnDef::new(UserCounter::Followers).big_integer().not_null().default(0))
                    .col(ColumnDef::new(UserCounter::Posts).big_integer().not_null().default(0))
                    .col(ColumnDef::new(UserCounter::LikesReceived).big_integer().not_null().default(0))
                    .col(ColumnDef::new(UserCounter::FavsReceived).big_integer().not_null().default(0))
                    .col(ColumnDef::new(UserCounter::GuardOffset).big_integer().not_null().default(-1))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.drop_table(Table::drop().table(UserCounter::Table).to_owned()).await
    }
}
