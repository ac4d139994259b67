//! `user_counter` (embedded mode only): `followings_version` and `followers_version`, the
//! versions the follow counts were copied at (relation-svc's `following_count` and
//! projection-svc's `edge_count`), so the embedded mode keeps the newest of each as counter-svc
//! does in Redis (docs/src/architecture/embedded.md#counters). `guard_offset`, the log
//! position of the delta algorithm this replaces, is dropped.
//!
//! Existing rows start at version 0: the next event of each count replaces them.
use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::ConnectionTrait;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        for column in ["followings_version", "followers_version"] {
            if !manager.has_column("user_counter", column).await? {
                db.execute_unprepared(&format!("ALTER TABLE user_counter ADD COLUMN {column} BIGINT NOT NULL DEFAULT 0")).await?;
            }
        }
        if manager.has_column("user_counter", "guard_offset").await? {
            db.execute_unprepared("ALTER TABLE user_counter DROP COLUMN guard_offset").await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        db.execute_unprepared("ALTER TABLE user_counter ADD COLUMN guard_offset BIGINT NOT NULL DEFAULT -1").await?;
        for column in ["followings_version", "followers_version"] {
            db.execute_unprepared(&format!("ALTER TABLE user_counter DROP COLUMN {column}")).await?;
        }
        Ok(())
    }
}
