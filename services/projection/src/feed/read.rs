//! Timeline pages, post lists, the post entry point and inbox rebuilds.
//!
//! A timeline page is the merge of three parts, each read inside the page's
//! [`Window`] (strictly between two keys, newest or oldest first): the inbox at or above the
//! user's floor, the pulled posts of followed authors at or above the floor, and every live
//! post of followed authors below the floor. The parts are disjoint (a post is pushed or
//! pulled, above or below the floor), so the merge neither repeats nor misses an entry. A page
//! newest first reads the two parts above the floor first and goes below it only when they do
//! not fill the page; a page oldest first (the walk up from a post, [`Walk::UpFrom`]) starts
//! below the floor when its window reaches there. The keyset cursor (`created_at_ms`,
//! `post_id`) of the last entry makes pages stable while posts arrive: the next page lies
//! strictly beyond it in the walk's direction.

use socialgraph_domain::{Cursor, ListKind, PageToken, Violation, validate_user_id};
use socialgraph_proto::events::v1::{ContentEvent, ContentEventKind};
use socialgraph_server::paging::page_request;
use socialgraph_server::{ApiError, ApiResult, db_error};
use socialgraph_storage::feed::{self, FeedEntry, FeedKey, InboxState};
use socialgraph_storage::timeline::{Part, Window, timeline_part};

use super::Feed;
use super::walk::Walk;

/// How far in the future a publish may date its post (clock skew between callers).
pub const MAX_FUTURE_MS: i64 = 5 * 60 * 1000;

/// Most mutes of a viewer a timeline leaves out (ten pages of ListMutes).
pub const MAX_MUTES: usize = 10_000;

/// Reads of a timeline page while trims keep moving the inbox floor under it.
const MAX_FLOOR_RETRIES: usize = 5;

/// Rows of a rebuild of every inbox per round.
const REBUILD_ROUND: usize = 500;

/// One page of posts, in the order of the walk that read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostPage {
    /// The posts.
    pub posts: Vec<FeedEntry>,
    /// Token of the next page; empty on the last.
    pub next_page_token: String,
}

/// Cuts `posts` (one more than `size` when there is a next page) to the page, whose token binds
/// the list (`kind`, owners `a`, `b`) and continues strictly beyond its last post.
fn finish(feed: &Feed, mut posts: Vec<FeedEntry>, size: usize, kind: ListKind, a: i64, b: i64) -> PostPage {
    if posts.len() <= size {
        return PostPage { posts, next_page_token: String::new() };
    }
    posts.truncate(size);
    let last = posts[size - 1].key;
    let cursor = Cursor { followed_at_ms: last.created_at_ms, peer_id: last.post_id };
    PostPage { posts, next_page_token: feed.token_key.encode(&PageToken { kind, a, b, cursor }) }
}

fn key_of(c: Option<Cursor>) -> Option<FeedKey> {
    c.map(|c| FeedKey { created_at_ms: c.followed_at_ms, post_id: c.peer_id })
}

impl Feed {
    /// The accounts `user_id` mutes (at most [`MAX_MUTES`]), from projection-svc's copy of
    /// the mutes ([`crate::mutes`]).
    async fn mutes(&self, user_id: i64) -> ApiResult<Vec<i64>> {
        socialgraph_storage::mute_versions::copy_muted_by(&self.db, user_id, MAX_MUTES).await.map_err(db_error)
    }

    /// The timeline position of `post_id` (request field `field`): any post the projection
    /// recorded, tombstones included.
    ///
    /// # Errors
    /// INVALID_ARGUMENT (reason UNKNOWN_POST) for a post id never recorded; UNAVAILABLE when
    /// the database fails.
    async fn post_key(&self, field: &str, post_id: i64) -> ApiResult<FeedKey> {
        let rows = feed::get_posts(&self.db, &[post_id]).await.map_err(db_error)?;
        rows.get(&post_id).map(|r| r.entry.key).ok_or_else(|| ApiError::InvalidArgument {
            reason: "UNKNOWN_POST",
            violations: vec![Violation::new(field, format!("no post {post_id} is recorded, so it has no place in the timeline"))],
        })
    }

    /// One page of `user_id`'s home timeline along `walk` (see the module documentation).
    ///
    /// # Errors
    /// INVALID_ARGUMENT for a bad id, size or token, or an unknown bound post (reason
    /// UNKNOWN_POST); UNAVAILABLE when the database fails.
    pub async fn timeline(&self, user_id: i64, walk: Walk, page_size: i32, token: &str) -> ApiResult<PostPage> {
        let mut owners = vec![("user_id", user_id)];
        owners.extend(walk.bound());
        let req = page_request(&self.token_key, walk.kind(), &owners, page_size, token)?;
        let cursor = key_of(req.after);
        // The bound post's position, unless the walk up already continues from a post above it.
        let bound = async {
            match walk.bound() {
                Some((field, id)) if cursor.is_none() || matches!(walk, Walk::DownTo(_)) => self.post_key(field, id).await.map(Some),
                _ => Ok(None),
            }
        };
        let (muted, state, bound) = tokio::join!(self.mutes(user_id), feed::inbox_state(&self.db, user_id), bound);
        let (muted, state, bound) = (muted?, state.map_err(db_error)?, bound?);
        let window = match walk {
            Walk::Down => Window { after: None, before: cursor, ascending: false },
            Walk::UpFrom(_) => Window { after: cursor.or(bound), before: None, ascending: true },
            Walk::DownTo(_) => Window { after: bound, before: cursor, ascending: false },
        };
        let posts = self.window_page(user_id, window, &muted, state, req.size + 1).await?;
        Ok(finish(self, posts, req.size, walk.kind(), user_id, walk.bound().map_or(0, |b| b.1)))
    }

    /// Up to `want` posts of `user_id`'s timeline inside `window`, in its order: the parts on
    /// the window's side of the floor first. A trim that commits between reading the floor
    /// (`state`) and the parts above it moves the floor up and deletes the inbox rows it passed,
    /// which neither part then shows: the floor is read again after those parts, and the page
    /// is read again if it moved. The part below the floor reads `post`, which trims leave alone.
    async fn window_page(&self, user_id: i64, window: Window, muted: &[i64], mut state: InboxState, want: usize) -> ApiResult<Vec<FeedEntry>> {
        let mut attempts = 0;
        loop {
            let floor = state.floor;
            let (mut posts, mut read_above) = (Vec::new(), false);
            for below in if window.ascending { [true, false] } else { [false, true] } {
                let limit = want - posts.len();
                if limit == 0 {
                    break;
                }
                if below && window.reaches_below(floor) {
                    posts.extend(timeline_part(&self.db, Part::BelowFloor, user_id, floor, window, muted, limit).await.map_err(db_error)?);
                } else if !below && window.reaches_above(floor) {
                    read_above = true;
                    let (inbox, pulled) = tokio::join!(
                        timeline_part(&self.db, Part::Inbox, user_id, floor, window, muted, limit),
                        timeline_part(&self.db, Part::Pulled, user_id, floor, window, muted, limit),
                    );
                    let mut above = inbox.map_err(db_error)?;
                    above.extend(pulled.map_err(db_error)?);
                    window.sort(&mut above);
                    above.dedup_by_key(|e| e.key);
                    above.truncate(limit);
                    posts.extend(above);
                }
            }
            attempts += 1;
            if !read_above || attempts >= MAX_FLOOR_RETRIES {
                return Ok(posts);
            }
            let now = feed::inbox_state(&self.db, user_id).await.map_err(db_error)?;
            if now.floor == floor {
                return Ok(posts);
            }
            state = now;
        }
    }

    /// One page of `author_id`'s live posts, newest first: from the cached window of the
    /// author's newest posts when it holds the page, else from the database.
    ///
    /// # Errors
    /// INVALID_ARGUMENT for a bad id, size or token; UNAVAILABLE when the database fails.
    pub async fn author_posts(&self, author_id: i64, page_size: i32, token: &str) -> ApiResult<PostPage> {
        let req = page_request(&self.token_key, ListKind::AuthorPosts, &[("author_id", author_id)], page_size, token)?;
        let (before, want) = (key_of(req.after), req.size + 1);
        let cached = match &self.posts_cache {
            Some(cache) => cache.page(&self.db, author_id, before, want).await,
            None => None,
        };
        let posts = match cached {
            Some(posts) => posts,
            None => feed::author_posts(&self.db, author_id, None, FeedKey::MIN, before, want).await.map_err(db_error)?,
        };
        Ok(finish(self, posts, req.size, ListKind::AuthorPosts, author_id, 0))
    }

    /// Appends a PUBLISHED (`published`) or DELETED event of `post_id` by `author_id` at
    /// `created_at_ms` to the content log. A publish of a post id recorded for another author is
    /// refused; one recorded for this author returns at once.
    ///
    /// # Errors
    /// INVALID_ARGUMENT for bad ids or a time before 1970; FAILED_PRECONDITION
    /// `POST_ID_TAKEN`; UNAVAILABLE when the database or the log fails.
    pub async fn append(&self, author_id: i64, post_id: i64, created_at_ms: i64, published: bool) -> ApiResult<()> {
        let bad: Vec<_> =
            [validate_user_id("author_id", author_id).err(), validate_user_id("post_id", post_id).err()].into_iter().flatten().collect();
        if !bad.is_empty() {
            return Err(bad.into());
        }
        if created_at_ms < 0 {
            return Err(ApiError::invalid("created_at", "must not be before 1970-01-01T00:00:00Z"));
        }
        if created_at_ms > crate::now_ms() + MAX_FUTURE_MS {
            return Err(ApiError::invalid("created_at", "must not be more than 5 minutes in the future"));
        }
        let stored = feed::get_posts(&self.db, &[post_id]).await.map_err(db_error)?;
        if let Some(row) = stored.get(&post_id) {
            if row.entry.author_id != author_id {
                return Err(ApiError::FailedPrecondition {
                    reason: "POST_ID_TAKEN",
                    message: format!("post {post_id} belongs to another author"),
                    metadata: [("post_id".to_owned(), post_id.to_string())].into(),
                });
            }
            if published || row.deleted {
                return Ok(());
            }
        }
        let kind = if published { ContentEventKind::Published } else { ContentEventKind::Deleted };
        let event = ContentEvent {
            event_id: uuid::Uuid::now_v7().to_string(),
            kind: kind as i32,
            entity_type: self.settings.entity_type.clone(),
            entity_id: post_id,
            author_id,
            occurred_at: Some(socialgraph_domain::timestamp_from_ms(created_at_ms)),
        };
        self.log.append(event).await
    }

    /// Rebuilds `user_id`'s inbox from the facts; returns the rows written.
    ///
    /// # Errors
    /// UNAVAILABLE when the database fails.
    pub async fn rebuild_user(&self, user_id: i64) -> ApiResult<i64> {
        let keep = self.settings.inbox_size;
        socialgraph_storage::retry_tx(10, || async {
            let txn = socialgraph_storage::begin_write(&self.db).await?;
            let n = feed::rebuild_inbox(&txn, user_id, keep).await?;
            txn.commit().await?;
            Ok::<_, sea_orm::DbErr>(n)
        })
        .await
        .map_err(db_error)
    }

    /// Rebuilds every inbox (users with one, and followers of authors with pushed posts);
    /// returns (inboxes, rows written).
    ///
    /// # Errors
    /// UNAVAILABLE when the database fails.
    pub async fn rebuild_all(&self) -> ApiResult<(i64, i64)> {
        let (mut after, mut inboxes, mut rows) = (0, 0, 0);
        loop {
            let users = feed::inbox_users(&self.db, after, REBUILD_ROUND).await.map_err(db_error)?;
            for u in &users {
                rows += self.rebuild_user(*u).await?;
                inboxes += 1;
            }
            match users.last() {
                Some(last) if users.len() >= REBUILD_ROUND => after = *last,
                _ => return Ok((inboxes, rows)),
            }
        }
    }
}
