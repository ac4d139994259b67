//! `follower`: the projection of `following` keyed (followee_id, follower_id).
use crate::{EdgeCol, edge_table};
use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let mut table = edge_table("follower");
        table.primary_key(Index::create().col(EdgeCol::FolloweeId).col(EdgeCol::FollowerId));
        manager.create_table(table).await?;
        // Covers the newest-first follower list and the follower count.
        manager
            .create_index(
                Index::create()
                    .if_not_exists()
                    .name("follower_list_idx")
                    .table(Alias::new("follower"))
                    .col(EdgeCol::FolloweeId)
                    .col(EdgeCol::State)
                    .col(EdgeCol::FollowedAtMs)
                    .col(EdgeCol::FollowerId)
                    .to_owned(),
            )
            .await?;
        // Following counts taken from the projection.
        manager
            .create_index(
                Index::create()
                    .if_not_exists()
                    .name("follower_by_follower_idx")
                    .table(Alias::new("follower"))
                    .col(EdgeCol::FollowerId)
                    .col(EdgeCol::State)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.drop_table(Table::drop().table(Alias::new("follower")).to_owned()).await
    }
}
