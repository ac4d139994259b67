//! Schema migrations of socialgraph, one per file (`mYYYYMMDD_HHMMSS_verb_noun.rs`). Each runs
//! unchanged on PostgreSQL, MySQL/MariaDB and SQLite. Run them with [`Migrator::up`] (the
//! services do so at start when `database.migrate_on_start` is set, and `relation-svc migrate`
//! runs them on their own).
//!
//! The embedded mode (`socialgraph dev`, one SQLite file) runs [`EmbeddedMigrator`] instead:
//! the same migrations followed by those of its own tables, which the distributed databases
//! never get.

pub use sea_orm_migration::prelude::*;

mod m20261130_000001_create_following;
mod m20261130_000002_create_follower;
mod m20261130_000003_create_outbox;
mod m20261130_000004_create_consumer_offset;
mod m20261130_000005_create_edge_count;
mod m20261201_000001_create_user_counter;
mod m20261201_000002_create_action_fact;
mod m20261201_000003_create_entity_counter;
mod m20261201_000004_create_following_followee_index;
mod m20261201_000010_create_block_and_mute;
mod m20261201_000011_add_following_blocked;
mod m20261201_000012_create_account;
mod m20261201_000013_create_follow_request;
mod m20261201_000014_create_cache_stale;
mod m20261201_000015_create_block_blocked_index;
mod m20261202_000001_create_feed;
mod m20261203_000001_create_messages;
mod m20261207_000001_add_member_unread;
mod m20261207_000002_create_message_account_seen;
mod m20261207_000003_create_block_pairs;
mod m20261207_000004_create_mute_versions;
mod m20261207_000005_create_following_count;
mod m20261207_000006_add_user_counter_versions;
mod m20261207_000007_create_outbox_topic_index;

/// The ordered list of socialgraph migrations.
pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![
            Box::new(m20261130_000001_create_following::Migration),
            Box::new(m20261130_000002_create_follower::Migration),
            Box::new(m20261130_000003_create_outbox::Migration),
            Box::new(m20261130_000004_create_consumer_offset::Migration),
            Box::new(m20261130_000005_create_edge_count::Migration),
            Box::new(m20261201_000010_create_block_and_mute::Migration),
            Box::new(m20261201_000011_add_following_blocked::Migration),
            Box::new(m20261201_000012_create_account::Migration),
            Box::new(m20261201_000013_create_follow_request::Migration),
            Box::new(m20261201_000014_create_cache_stale::Migration),
            Box::new(m20261201_000015_create_block_blocked_index::Migration),
            Box::new(m20261202_000001_create_feed::Migration),
            Box::new(m20261203_000001_create_messages::Migration),
            Box::new(m20261207_000001_add_member_unread::Migration),
            Box::new(m20261207_000002_create_message_account_seen::Migration),
            Box::new(m20261207_000003_create_block_pairs::Migration),
            Box::new(m20261207_000004_create_mute_versions::Migration),
            Box::new(m20261207_000005_create_following_count::Migration),
        ]
    }
}

/// The ordered list of the embedded mode's migrations: every [`Migrator`] migration, in order,
/// followed by the embedded mode's own tables (`user_counter`, `action_fact`,
/// `entity_counter`: its counters in SQL beside the facts), its index of `following` by
/// followee and its index of the outbox by topic (the outbox is its log). Run it only on the
/// embedded mode's SQLite file: the distributed PostgreSQL and
/// MySQL/MariaDB databases run [`Migrator`] and must not get these tables. Its creates are `IF
/// NOT EXISTS`, so a file whose tables an older version made without recording migrations
/// takes them as done.
pub struct EmbeddedMigrator;

#[async_trait::async_trait]
impl MigratorTrait for EmbeddedMigrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        let mut all = Migrator::migrations();
        all.extend([
            Box::new(m20261201_000001_create_user_counter::Migration) as Box<dyn MigrationTrait>,
            Box::new(m20261201_000002_create_action_fact::Migration),
            Box::new(m20261201_000003_create_entity_counter::Migration),
            Box::new(m20261201_000004_create_following_followee_index::Migration),
            Box::new(m20261207_000006_add_user_counter_versions::Migration),
            Box::new(m20261207_000007_create_outbox_topic_index::Migration),
        ]);
        all
    }
}

/// Column names shared by `following` and `follower`.
#[derive(DeriveIden)]
pub(crate) enum EdgeCol {
    FollowerId,
    FolloweeId,
    State,
    Version,
    FollowedAtMs,
    UpdatedAtMs,
}

/// The columns of an edge table, without keys.
pub(crate) fn edge_table(name: &str) -> TableCreateStatement {
    Table::create()
        .table(Alias::new(name))
        .if_not_exists()
        .col(ColumnDef::new(EdgeCol::FollowerId).big_integer().not_null())
        .col(ColumnDef::new(EdgeCol::FolloweeId).big_integer().not_null())
        .col(ColumnDef::new(EdgeCol::State).small_integer().not_null())
        .col(ColumnDef::new(EdgeCol::Version).big_integer().not_null())
        .col(ColumnDef::new(EdgeCol::FollowedAtMs).big_integer().not_null())
        .col(ColumnDef::new(EdgeCol::UpdatedAtMs).big_integer().not_null())
        .to_owned()
}
