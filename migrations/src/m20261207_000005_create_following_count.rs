//! `following_count` (relation-svc): how many accounts each user follows ("following" edges
//! of `following`) with a per-user `version` one up on every change. Written in the
//! transaction of every change of the user's edges, whose RelationEvents carry the count and
//! its version, so counter-svc keeps followings fresh from relation events alone, with
//! projection-svc out of the path (docs/src/architecture/counters.md#where-follow-counts-come-from).
//!
//! The migration counts the edges that exist (version 1).
use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::ConnectionTrait;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum FollowingCount {
    Table,
    UserId,
    Followings,
    Version,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.has_table("following_count").await? {
            return Ok(());
        }
        manager
            .create_table(
                Table::create()
                    .table(FollowingCount::Table)
                    .col(ColumnDef::new(FollowingCount::UserId).big_integer().not_null().primary_key())
                    .col(ColumnDef::new(FollowingCount::Followings).big_integer().not_null())
                    .col(ColumnDef::new(FollowingCount::Version).big_integer().not_null())
                    .to_owned(),
            )
            .await?;
        manager
            .get_connection()
            .execute_unprepared(
                "INSERT INTO following_count (user_id, followings, version) \
                 SELECT follower_id, COUNT(*), 1 FROM following WHERE state = 1 GROUP BY follower_id",
            )
            .await
            .map(|_| ())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.drop_table(Table::drop().table(FollowingCount::Table).to_owned()).await
    }
}
