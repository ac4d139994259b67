//! Locked accounts and follow requests: `account.locked`, and `follow_request`, a pending
//! follow of a locked account (requester → target, with its time). A request is not an edge:
//! no event, no count. The indexes list a target's incoming and a requester's outgoing
//! requests newest first.
use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(Clone, Copy, DeriveIden)]
enum FollowRequest {
    Table,
    RequesterId,
    TargetId,
    CreatedAtMs,
}

#[derive(Clone, Copy, DeriveIden)]
enum Account {
    Table,
    Locked,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        use FollowRequest::{CreatedAtMs, RequesterId, TargetId};
        manager
            .create_table(
                Table::create()
                    .table(FollowRequest::Table)
                    .if_not_exists()
                    .col(ColumnDef::new(RequesterId).big_integer().not_null())
                    .col(ColumnDef::new(TargetId).big_integer().not_null())
                    .col(ColumnDef::new(CreatedAtMs).big_integer().not_null())
                    .primary_key(Index::create().col(RequesterId).col(TargetId))
                    .to_owned(),
            )
            .await?;
        for (name, owner, peer) in [("follow_request_outgoing", RequesterId, TargetId), ("follow_request_incoming", TargetId, RequesterId)] {
            manager
                .create_index(Index::create().if_not_exists().name(name).table(FollowRequest::Table).col(owner).col(CreatedAtMs).col(peer).to_owned())
                .await?;
        }
        if !manager.has_column("account", "locked").await? {
            manager
                .alter_table(
                    Table::alter().table(Account::Table).add_column(ColumnDef::new(Account::Locked).boolean().not_null().default(false)).to_owned(),
                )
                .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.drop_table(Table::drop().table(FollowRequest::Table).to_owned()).await?;
        manager.alter_table(Table::alter().table(Account::Table).drop_column(Account::Locked).to_owned()).await
    }
}
