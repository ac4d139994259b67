//! `following`: the source of truth for edges, keyed (follower_id, followee_id).
use crate::{EdgeCol, edge_table};
use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let mut table = edge_table("following");
        table.primary_key(Index::create().col(EdgeCol::FollowerId).col(EdgeCol::FolloweeId));
        manager.create_table(table).await?;
        // Covers the newest-first following list and the following count.
        manager
            .create_index(
                Index::create()
                    .if_not_exists()
                    .name("following_list_idx")
                    .table(Alias::new("following"))
                    .col(EdgeCol::FollowerId)
                    .col(EdgeCol::State)
                    .col(EdgeCol::FollowedAtMs)
                    .col(EdgeCol::FolloweeId)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.drop_table(Table::drop().table(Alias::new("following")).to_owned()).await
    }
}
