//! ListCommonFollowing and ListFamiliarFollowers from the list caches, when they hold what the
//! join needs; otherwise (a list not cached, longer than its window, or the cache down) the
//! database's join answers, as before.
//!
//! - Common following of (a, b): the rest of a's following list after the cursor and b's
//!   whole following list, two reads in one round trip each (in parallel), intersected here,
//!   in a's list order. Both lists must be whole (state `c`).
//! - Familiar followers of (viewer, user): the rest of the viewer's following list, checked
//!   against the user's follower window and relationship hash in chunks of 500, all in one
//!   round trip; what those do not know is read from `following` in one query per chunk (the
//!   source of truth, so no ordering with the event stream is needed), stopping as soon as the
//!   page is full.

use std::collections::HashSet;

use socialgraph_cache::lists::Lookup;
use socialgraph_domain::{Cursor, EdgeState, ListEntry};
use socialgraph_server::{ApiResult, db_error};
use socialgraph_storage::edges;

use crate::service::Relations;

/// Viewer entries checked per round trip in a familiar-followers join.
const CHUNK: usize = 500;

fn after_cursor(after: Option<Cursor>) -> Option<(i64, i64)> {
    after.map(|a| (a.followed_at_ms, a.peer_id))
}

fn entries(v: Vec<(i64, i64)>) -> Vec<ListEntry> {
    v.into_iter().map(|(user_id, followed_at_ms)| ListEntry { user_id, followed_at_ms }).collect()
}

impl Relations {
    /// The whole rest of `user_id`'s following list after `after` from the cache: `None` when
    /// it is not cached whole (a miss starts a fill).
    async fn whole_following(&self, rpc: &str, user_id: i64, after: Option<Cursor>) -> Option<Vec<(i64, i64)>> {
        let all = self.caches.as_ref()?.following.limits().window + 1;
        self.cached_following_page(rpc, user_id, after_cursor(after), all).await
    }

    /// Up to `limit` accounts both `a` and `b` follow, after `after` in `a`'s list order, from
    /// the cache; `None` when the database must answer.
    pub(crate) async fn cached_common(&self, a: i64, b: i64, after: Option<Cursor>, limit: usize) -> Option<Vec<ListEntry>> {
        let rpc = "ListCommonFollowing";
        let (rest, other) = tokio::join!(self.whole_following(rpc, a, after), self.whole_following(rpc, b, None));
        let other: HashSet<i64> = other?.into_iter().map(|(id, _)| id).collect();
        Some(entries(rest?.into_iter().filter(|(id, _)| other.contains(id)).take(limit).collect()))
    }

    /// Up to `limit` accounts `viewer` follows that follow `user`, after `after` in the viewer's
    /// list order, from the caches (and one `following` query per chunk for what they do not
    /// know); `None` when the database's join must answer.
    ///
    /// # Errors
    /// UNAVAILABLE when the database fails.
    pub(crate) async fn cached_familiar(&self, viewer: i64, user: i64, after: Option<Cursor>, limit: usize) -> ApiResult<Option<Vec<ListEntry>>> {
        let rpc = "ListFamiliarFollowers";
        let Some(c) = self.caches.as_ref() else { return Ok(None) };
        let Some(rest) = self.whole_following(rpc, viewer, after).await else { return Ok(None) };
        // Every chunk's lookup at once: the multiplexed connection pipelines them into one
        // round trip; the database is then asked chunk by chunk, only until the page is full.
        let chunks: Vec<Vec<i64>> = rest.chunks(CHUNK).map(|chunk| chunk.iter().map(|(id, _)| *id).collect()).collect();
        let looked = futures::future::join_all(chunks.iter().map(|peers| c.followers.lookup(user, peers, false))).await;
        let Ok(looked) = looked.into_iter().collect::<Result<Vec<_>, _>>() else { return Ok(None) };
        let mut out = Vec::new();
        for ((chunk, peers), known) in rest.chunks(CHUNK).zip(&chunks).zip(looked) {
            let unknown: Vec<i64> = peers.iter().zip(&known).filter(|(_, k)| **k == Lookup::Unknown).map(|(p, _)| *p).collect();
            let label = if unknown.is_empty() { "hit" } else { "partial" };
            c.metrics.requests.with_label_values(&["followers", rpc, label]).inc();
            let read: HashSet<i64> = if unknown.is_empty() {
                HashSet::new()
            } else {
                let rows = edges::between(&self.db, user, &unknown, false).await.map_err(db_error)?;
                rows.into_iter().filter(|e| e.state == EdgeState::Following).map(|e| e.follower_id).collect()
            };
            for (entry, k) in chunk.iter().zip(&known) {
                if matches!(k, Lookup::Follows(_)) || read.contains(&entry.0) {
                    out.push(ListEntry { user_id: entry.0, followed_at_ms: entry.1 });
                    if out.len() == limit {
                        return Ok(Some(out));
                    }
                }
            }
        }
        Ok(Some(out))
    }
}
