//! `following.blocked`: true while either user of the pair blocks the other. It lives on the
//! edge row so that a Follow's compare-and-set (and its row lock on the transaction path) sees
//! a block made concurrently: PostgreSQL re-checks a conflicting row's own columns after
//! waiting for its writer, but not other tables. A block writes this flag on both directions'
//! rows, creating them (state 0, version 0) when the pair never followed.
use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
enum Following {
    Table,
    Blocked,
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.has_column("following", "blocked").await? {
            return Ok(());
        }
        manager
            .alter_table(
                Table::alter().table(Following::Table).add_column(ColumnDef::new(Following::Blocked).boolean().not_null().default(false)).to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.alter_table(Table::alter().table(Following::Table).drop_column(Following::Blocked).to_owned()).await
    }
}
