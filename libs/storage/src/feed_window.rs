//! What a fill of an author's cached post list reads from `post` (see
//! `socialgraph_cache::lists`, direction `Posts`): the newest live posts and the tombstones the
//! window needs, so that a copy of an old publish arriving after the fill cannot bring a deleted
//! post back.

use sea_orm::{ConnectionTrait, DbErr};

use crate::feed::{self, FeedEntry, FeedKey};

/// An author's post window as a fill reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PostWindow {
    /// The newest live posts, at most the window, newest first.
    pub live: Vec<FeedEntry>,
    /// The newest live post left out, `None` when `live` holds every live post.
    pub boundary: Option<FeedKey>,
    /// Deleted posts not older than the boundary (all of them without one).
    pub deleted: Vec<FeedEntry>,
}

/// `author_id`'s newest `window` live posts and the tombstones the window needs; `None` when
/// those tombstones are more than `deleted_max` (the list churns too much to cache).
///
/// # Errors
/// Database errors.
pub async fn author_window<C: ConnectionTrait>(conn: &C, author_id: i64, window: usize, deleted_max: usize) -> Result<Option<PostWindow>, DbErr> {
    let mut live = feed::author_posts(conn, author_id, None, FeedKey::MIN, None, window + 1).await?;
    let boundary = (live.len() > window).then(|| live.pop()).flatten().map(|e| e.key);
    let mut sql = format!("SELECT p.created_at_ms, p.post_id, p.author_id FROM post p WHERE p.author_id = {author_id} AND p.deleted = 1");
    if let Some(b) = boundary {
        sql.push_str(&format!(" AND p.created_at_ms >= {}", b.created_at_ms));
    }
    sql.push_str(&format!(" LIMIT {}", deleted_max + 1));
    let deleted: Vec<FeedEntry> = feed::query(conn, sql).await?.iter().map(feed::entry).collect::<Result<_, _>>()?;
    Ok((deleted.len() <= deleted_max).then_some(PostWindow { live, boundary, deleted }))
}
