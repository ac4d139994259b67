//! Timeline pages, post lists, the post entry point and inbox rebuilds.
//!
//! A timeline page after cursor `c` is the merge of three parts, each read newest first and
//! strictly older than `c` ([`socialgraph_storage::feed::Part`]): the inbox at or above the
//! user's floor, the pulled posts of followed authors at or above the floor, and, when those
//! two do not fill the page, every live post of followed authors below the floor. The parts
//! are disjoint (a post is pushed or pulled, above or below the floor), so the merge neither
//! repeats nor misses an entry, and the keyset cursor (`created_at_ms`, `post_id`) makes pages
//! stable while posts arrive.

use socialgraph_domain::{Cursor, ListKind, PageToken, validate_user_id};
use socialgraph_proto::events::v1::{ContentEvent, ContentEventKind};
use socialgraph_proto::relation::v1::ListMutesRequest;
use socialgraph_server::paging::page_request;
use socialgraph_server::{ApiError, ApiResult, db_error};
use socialgraph_storage::feed::{self, FeedEntry, FeedKey, Part};

use super::Feed;

/// How far in the future a publish may date its post (clock skew between callers).
pub const MAX_FUTURE_MS: i64 = 5 * 60 * 1000;

/// Most mutes of a viewer a timeline leaves out (ten pages of ListMutes).
pub const MAX_MUTES: usize = 10_000;

/// Reads of a timeline page while trims keep moving the inbox floor under it.
const MAX_FLOOR_RETRIES: usize = 5;

/// Rows of a rebuild of every inbox per round.
const REBUILD_ROUND: usize = 500;

/// One page of posts, newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostPage {
    /// The posts.
    pub posts: Vec<FeedEntry>,
    /// Token of the next page; empty on the last.
    pub next_page_token: String,
}

fn finish(feed: &Feed, mut posts: Vec<FeedEntry>, size: usize, kind: ListKind, owner: i64) -> PostPage {
    if posts.len() <= size {
        return PostPage { posts, next_page_token: String::new() };
    }
    posts.truncate(size);
    let last = posts[size - 1].key;
    let cursor = Cursor { followed_at_ms: last.created_at_ms, peer_id: last.post_id };
    PostPage { posts, next_page_token: feed.token_key.encode(&PageToken { kind, a: owner, b: 0, cursor }) }
}

fn key_of(c: Option<Cursor>) -> Option<FeedKey> {
    c.map(|c| FeedKey { created_at_ms: c.followed_at_ms, post_id: c.peer_id })
}

impl Feed {
    /// The accounts `user_id` mutes (at most [`MAX_MUTES`]), from relation-svc.
    async fn mutes(&self, user_id: i64) -> ApiResult<Vec<i64>> {
        let mut client = self.relation.clone();
        let (mut out, mut token) = (Vec::new(), String::new());
        loop {
            let page = client.list_mutes(ListMutesRequest { user_id, page_size: 1000, page_token: token }).await.map_err(|e| {
                tracing::warn!(code = ?e.code(), message = e.message(), "relation-svc did not list mutes");
                ApiError::unavailable(socialgraph_server::REASON_PEER, "relation-svc did not answer (the viewer's mutes); retry")
            })?;
            let page = page.into_inner();
            out.extend(page.accounts.iter().map(|a| a.user_id));
            if page.next_page_token.is_empty() || out.len() >= MAX_MUTES {
                return Ok(out);
            }
            token = page.next_page_token;
        }
    }

    /// One page of `user_id`'s home timeline (see the module documentation).
    ///
    /// # Errors
    /// INVALID_ARGUMENT for a bad id, size or token; UNAVAILABLE when the database or
    /// relation-svc fails.
    pub async fn timeline(&self, user_id: i64, page_size: i32, token: &str) -> ApiResult<PostPage> {
        let req = page_request(&self.token_key, ListKind::Timeline, &[("user_id", user_id)], page_size, token)?;
        let before = key_of(req.after);
        let want = req.size + 1;
        // The viewer's mutes (relation-svc) and inbox floor (database) at once, then the two
        // parts above the floor at once. A trim that commits between the floor and the parts
        // moves the floor up and deletes the rows it passed, which neither part then shows:
        // the floor is read again after the parts, and the page is read again if it moved.
        let (muted, state) = tokio::join!(self.mutes(user_id), feed::inbox_state(&self.db, user_id));
        let (muted, mut state) = (muted?, state.map_err(db_error)?);
        let mut attempts = 0;
        let mut posts = loop {
            let (inbox, pulled) = tokio::join!(
                feed::timeline_part(&self.db, Part::Inbox, user_id, state.floor, before, &muted, want),
                feed::timeline_part(&self.db, Part::Pulled, user_id, state.floor, before, &muted, want),
            );
            let mut posts = inbox.map_err(db_error)?;
            posts.extend(pulled.map_err(db_error)?);
            let now = feed::inbox_state(&self.db, user_id).await.map_err(db_error)?;
            attempts += 1;
            if now.floor == state.floor || attempts >= MAX_FLOOR_RETRIES {
                break posts;
            }
            state = now;
        };
        posts.sort_by_key(|e| std::cmp::Reverse(e.key));
        posts.dedup_by_key(|e| e.key);
        posts.truncate(want);
        if posts.len() < want && state.floor != FeedKey::MIN {
            let older = feed::timeline_part(&self.db, Part::BelowFloor, user_id, state.floor, before, &muted, want - posts.len());
            posts.extend(older.await.map_err(db_error)?);
        }
        Ok(finish(self, posts, req.size, ListKind::Timeline, user_id))
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
        Ok(finish(self, posts, req.size, ListKind::AuthorPosts, author_id))
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
