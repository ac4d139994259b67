//! `following_followee` (embedded mode only, [`crate::EmbeddedMigrator`]): `following` by
//! followee, for the embedded mode's counter rebuild, which counts a user's followers there.
use crate::EdgeCol;
use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_index(
                Index::create()
                    .if_not_exists()
                    .name("following_followee")
                    .table(Alias::new("following"))
                    .col(EdgeCol::FolloweeId)
                    .col(EdgeCol::State)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.drop_index(Index::drop().name("following_followee").table(Alias::new("following")).to_owned()).await
    }
}
