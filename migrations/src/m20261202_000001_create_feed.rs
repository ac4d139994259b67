//! The feed tables of projection-svc (FeedService):
//! - `post`: each author's post list, the fact the timelines are built from (one row per post
//!   id; `deleted` = 1 is a tombstone that stays, so a replayed publish cannot revive it;
//!   `pushed` = 1 when the post was fanned out into inboxes, 0 when timelines pull it);
//! - `inbox`: pushed post ids per user, keyed (user_id, created_at_ms, post_id);
//! - `inbox_state`: per user, an upper bound of its inbox rows (`entries`, reset to the exact
//!   count by each trim) and the floor below which its timeline is pulled (`floor_ms`,
//!   `floor_post_id`; `i64::MIN`, 0 before the first trim);
//! - `fanout`: pushes in progress, one per post, resumable at `next_follower_id`, owned by the
//!   replica consuming `content_partition`.
use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[derive(DeriveIden)]
#[allow(clippy::enum_variant_names)] // `post_id` is the column's name
enum Post {
    Table,
    PostId,
    AuthorId,
    CreatedAtMs,
    Pushed,
    Deleted,
    UpdatedAtMs,
}

#[derive(DeriveIden)]
enum Inbox {
    Table,
    UserId,
    CreatedAtMs,
    PostId,
    AuthorId,
}

#[derive(DeriveIden)]
enum InboxState {
    Table,
    UserId,
    Entries,
    FloorMs,
    FloorPostId,
}

#[derive(DeriveIden)]
enum Fanout {
    Table,
    PostId,
    AuthorId,
    CreatedAtMs,
    ContentPartition,
    NextFollowerId,
}

/// A NOT NULL BIGINT column.
fn big(c: impl IntoIden) -> ColumnDef {
    ColumnDef::new(c).big_integer().not_null().to_owned()
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(Post::Table)
                    .if_not_exists()
                    .col(ColumnDef::new(Post::PostId).big_integer().not_null().primary_key())
                    .col(big(Post::AuthorId))
                    .col(big(Post::CreatedAtMs))
                    .col(ColumnDef::new(Post::Pushed).small_integer().not_null())
                    .col(ColumnDef::new(Post::Deleted).small_integer().not_null())
                    .col(big(Post::UpdatedAtMs))
                    .to_owned(),
            )
            .await?;
        // An author's live posts newest first (ListAuthorPosts, the pull below an inbox floor).
        manager
            .create_index(
                Index::create()
                    .if_not_exists()
                    .name("post_author_idx")
                    .table(Post::Table)
                    .col(Post::AuthorId)
                    .col(Post::Deleted)
                    .col(Post::CreatedAtMs)
                    .col(Post::PostId)
                    .to_owned(),
            )
            .await?;
        // An author's pulled (not pushed) live posts newest first (the pull part of a timeline).
        manager
            .create_index(
                Index::create()
                    .if_not_exists()
                    .name("post_author_pulled_idx")
                    .table(Post::Table)
                    .col(Post::AuthorId)
                    .col(Post::Pushed)
                    .col(Post::Deleted)
                    .col(Post::CreatedAtMs)
                    .col(Post::PostId)
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(Inbox::Table)
                    .if_not_exists()
                    .col(big(Inbox::UserId))
                    .col(big(Inbox::CreatedAtMs))
                    .col(big(Inbox::PostId))
                    .col(big(Inbox::AuthorId))
                    .primary_key(Index::create().col(Inbox::UserId).col(Inbox::CreatedAtMs).col(Inbox::PostId))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(InboxState::Table)
                    .if_not_exists()
                    .col(ColumnDef::new(InboxState::UserId).big_integer().not_null().primary_key())
                    .col(big(InboxState::Entries))
                    .col(big(InboxState::FloorMs))
                    .col(big(InboxState::FloorPostId))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(Fanout::Table)
                    .if_not_exists()
                    .col(ColumnDef::new(Fanout::PostId).big_integer().not_null().primary_key())
                    .col(big(Fanout::AuthorId))
                    .col(big(Fanout::CreatedAtMs))
                    .col(ColumnDef::new(Fanout::ContentPartition).integer().not_null())
                    .col(big(Fanout::NextFollowerId))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .if_not_exists()
                    .name("fanout_partition_idx")
                    .table(Fanout::Table)
                    .col(Fanout::ContentPartition)
                    .col(Fanout::PostId)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for t in ["fanout", "inbox_state", "inbox", "post"] {
            manager.drop_table(Table::drop().table(Alias::new(t)).if_exists().to_owned()).await?;
        }
        Ok(())
    }
}
