//! `outbox (topic, id)` (embedded mode only): the outbox is the embedded mode's event log and is
//! never trimmed there, and each of its readers reads one topic from an offset (an outbox id)
//! on (docs/src/architecture/events.md#one-log-interface). Without this index a reader of a
//! sparse topic walks every later row of the other topics.
use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

const INDEX: &str = "outbox_topic_id";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let index = Index::create().if_not_exists().name(INDEX).table(Alias::new("outbox")).col(Alias::new("topic")).col(Alias::new("id")).to_owned();
        manager.create_index(index).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.drop_index(Index::drop().name(INDEX).table(Alias::new("outbox")).to_owned()).await
    }
}
