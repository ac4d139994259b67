//! `edge_count`: each user's followings and followers per the projection, kept by
//! projection-svc in the transaction that applies the events (so the counts are exact at every
//! stored offset), with a per-user `version` bumped on every change. counter-svc copies these
//! absolute values into Redis and keeps only the newest version, so a duplicated, replayed or
//! reordered event can never move a counter twice. The migration backfills the table from the
//! `follower` rows already present.
use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::ConnectionTrait;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum EdgeCount {
    Table,
    UserId,
    Followings,
    Followers,
    Version,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(EdgeCount::Table)
                    .if_not_exists()
                    .col(ColumnDef::new(EdgeCount::UserId).big_integer().not_null().primary_key())
                    .col(ColumnDef::new(EdgeCount::Followings).big_integer().not_null())
                    .col(ColumnDef::new(EdgeCount::Followers).big_integer().not_null())
                    .col(ColumnDef::new(EdgeCount::Version).big_integer().not_null())
                    .to_owned(),
            )
            .await?;
        // One statement that every backend accepts: the counts of the rows already projected.
        manager
            .get_connection()
            .execute_unprepared(
                "INSERT INTO edge_count (user_id, followings, followers, version) \
                 SELECT user_id, SUM(fi), SUM(fr), 1 FROM ( \
                   SELECT follower_id AS user_id, 1 AS fi, 0 AS fr FROM follower WHERE state = 1 \
                   UNION ALL \
                   SELECT followee_id AS user_id, 0 AS fi, 1 AS fr FROM follower WHERE state = 1 \
                 ) t GROUP BY user_id",
            )
            .await
            .map(|_| ())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.drop_table(Table::drop().table(EdgeCount::Table).to_owned()).await
    }
}
