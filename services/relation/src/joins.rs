//! ListCommonFollowing and ListFamiliarFollowers from the list caches, when they hold what the
//! join needs; otherwise (a list not cached, longer than its window, both sides long, or the
//! cache down) the database's join answers, as before.
//!
//! - **Both lists cached whole, one Redis, the shorter at most
//!   [`socialgraph_cache::lists::JOIN_MAX`] entries**: one script checks both lists and runs
//!   ZINTER there ([`ListCache::intersect`]), so only the answer travels. Redis checks slots
//!   only in cluster mode, so it reads two users' keys; a cluster connection never sends it.
//! - **Otherwise** (a list not cached or a window, two long lists, or a cluster) the join is
//!   done here, and a join never moves a long list: each side is read with a page of
//!   [`SMALL`] + 1 entries, and a side that fills it is long.
//!   - Common following of (a, b): both short: intersected here, in a's list order. One short:
//!     its ids are looked up in the other's cached list (one more round trip), and the matches
//!     are put in a's list order. Both long: the database.
//!   - Familiar followers of (viewer, user): both sides are read at once. Both short (the
//!     user's follower list cached whole): intersected here, in the viewer's order, in that one
//!     round trip. Viewer's rest short, followers long: checked against the user's follower
//!     window and relationship hash; what those do not know is read from `following` (the
//!     source of truth, so no ordering with the event stream is needed). Viewer's list long but
//!     the user's follower list whole and short: its ids are looked up in the viewer's cached
//!     list. Both long: the database.

use std::collections::HashSet;

use socialgraph_cache::lists::{ListCache, Lookup, PageRead, page_of};
use socialgraph_domain::{Cursor, EdgeState, ListEntry};
use socialgraph_server::{ApiResult, db_error};
use socialgraph_storage::edges;

use crate::service::Relations;

/// Longest list a join reads whole from the cache.
pub const SMALL: usize = 256;

fn after_cursor(after: Option<Cursor>) -> Option<(i64, i64)> {
    after.map(|a| (a.followed_at_ms, a.peer_id))
}

fn entries(v: Vec<(i64, i64)>) -> Vec<ListEntry> {
    v.into_iter().map(|(user_id, followed_at_ms)| ListEntry { user_id, followed_at_ms }).collect()
}

/// One side of a join as the cache holds it.
enum Side {
    /// The whole (rest of the) list, at most [`SMALL`] entries, in list order.
    Short(Vec<(i64, i64)>),
    /// Longer than [`SMALL`].
    Long,
}

/// The ids of `ids` that `owner`'s whole cached list holds, with their followed_at there, put
/// in that list's order after `after` and cut at `limit`; `None` when the list cannot say (not
/// whole, or the cache failed).
async fn in_list_order(list: &ListCache, owner: i64, ids: &[i64], after: Option<Cursor>, limit: usize) -> Option<Vec<(i64, i64)>> {
    let looked = list.lookup(owner, ids).await.ok()?;
    if looked.contains(&Lookup::Unknown) {
        return None;
    }
    let found: Vec<(i64, i64)> =
        ids.iter().zip(looked).filter_map(|(id, l)| if let Lookup::Follows(ms) = l { Some((*id, ms)) } else { None }).collect();
    Some(page_of(found, after_cursor(after), limit))
}

impl Relations {
    /// The join of `user_id`'s following list with `other_id`'s list in `other` (named
    /// `other.0` in metrics) in the cache Redis ([`ListCache::intersect`]): `Ok(Some(page))`,
    /// counted as a hit of both caches under `rpc`; `Ok(None)` when the lists are not both
    /// cached whole, both are long, or on a cluster (the caller reads the lists, which also
    /// starts fills); `Err(())` when the cache failed, counted as a fallback of both caches:
    /// the database answers.
    async fn intersected(
        &self,
        rpc: &str,
        user_id: i64,
        other: (&str, &ListCache),
        other_id: i64,
        after: Option<Cursor>,
        limit: usize,
    ) -> Result<Option<Vec<ListEntry>>, ()> {
        let Some(c) = self.caches.as_ref() else { return Ok(None) };
        let both = match c.following.intersect(user_id, other.1, other_id, after_cursor(after), limit).await {
            Ok(both) => both,
            Err(e) => {
                tracing::debug!(error = %e, rpc, "cache unavailable: reading the database");
                for cache in ["following", other.0] {
                    c.metrics.requests.with_label_values(&[cache, rpc, "fallback"]).inc();
                }
                return Err(());
            }
        };
        if both.is_some() {
            for cache in ["following", other.0] {
                c.metrics.requests.with_label_values(&[cache, rpc, "hit"]).inc();
            }
        }
        Ok(both.map(entries))
    }

    /// `user_id`'s following list after `after` from the cache, whole if short; `None` when it
    /// is not cached or not whole (a miss starts a fill).
    async fn following_side(&self, rpc: &str, user_id: i64, after: Option<Cursor>) -> Option<Side> {
        let v = self.cached_following_page(rpc, user_id, after_cursor(after), SMALL + 1).await?;
        Some(if v.len() > SMALL { Side::Long } else { Side::Short(v) })
    }

    /// Up to `limit` accounts both `a` and `b` follow, after `after` in `a`'s list order, from
    /// the cache; `None` when the database must answer.
    pub(crate) async fn cached_common(&self, a: i64, b: i64, after: Option<Cursor>, limit: usize) -> Option<Vec<ListEntry>> {
        let rpc = "ListCommonFollowing";
        let c = self.caches.as_ref()?;
        if let Some(both) = self.intersected(rpc, a, ("following", &c.following), b, after, limit).await.ok()? {
            return Some(both);
        }
        let (rest, other) = tokio::join!(self.following_side(rpc, a, after), self.following_side(rpc, b, None));
        match (rest?, other?) {
            (Side::Short(rest), Side::Short(other)) => {
                let other: HashSet<i64> = other.into_iter().map(|(id, _)| id).collect();
                Some(entries(rest.into_iter().filter(|(id, _)| other.contains(id)).take(limit).collect()))
            }
            (Side::Short(rest), Side::Long) => {
                let ids: Vec<i64> = rest.iter().map(|(id, _)| *id).collect();
                let looked = c.following.lookup(b, &ids).await.ok()?;
                if looked.contains(&Lookup::Unknown) {
                    return None;
                }
                let both = rest.into_iter().zip(looked).filter(|(_, l)| matches!(l, Lookup::Follows(_))).map(|(e, _)| e);
                Some(entries(both.take(limit).collect()))
            }
            (Side::Long, Side::Short(other)) => {
                let ids: Vec<i64> = other.iter().map(|(id, _)| *id).collect();
                in_list_order(&c.following, a, &ids, after, limit).await.map(entries)
            }
            (Side::Long, Side::Long) => None,
        }
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
        match self.intersected(rpc, viewer, ("followers", &c.followers), user, after, limit).await {
            Ok(Some(both)) => return Ok(Some(both)),
            Ok(None) => {}
            Err(()) => return Ok(None),
        }
        // Both sides at once: when both are short (the common case) the join is one round trip.
        let (viewer_side, fans) = tokio::join!(self.following_side(rpc, viewer, after), c.followers.page(user, None, SMALL + 1));
        // The user's followers, if cached whole and short.
        let fans = match fans {
            Ok(PageRead::Hit(fans)) if fans.len() <= SMALL => Some(fans),
            _ => None,
        };
        let rest = match (viewer_side, fans) {
            (Some(Side::Short(rest)), Some(fans)) => {
                c.metrics.requests.with_label_values(&["followers", rpc, "hit"]).inc();
                let fans: HashSet<i64> = fans.into_iter().map(|(id, _)| id).collect();
                return Ok(Some(entries(rest.into_iter().filter(|(id, _)| fans.contains(id)).take(limit).collect())));
            }
            (Some(Side::Short(rest)), None) => rest,
            (Some(Side::Long), Some(fans)) => {
                // The user's short follower list looked up in the viewer's long one.
                c.metrics.requests.with_label_values(&["followers", rpc, "hit"]).inc();
                let ids: Vec<i64> = fans.iter().map(|(id, _)| *id).collect();
                return Ok(in_list_order(&c.following, viewer, &ids, after, limit).await.map(entries));
            }
            (Some(Side::Long), None) | (None, _) => return Ok(None),
        };
        let peers: Vec<i64> = rest.iter().map(|(id, _)| *id).collect();
        let Ok(known) = c.followers.lookup(user, &peers).await else { return Ok(None) };
        let unknown: Vec<i64> = peers.iter().zip(&known).filter(|(_, k)| **k == Lookup::Unknown).map(|(p, _)| *p).collect();
        let label = if unknown.is_empty() { "hit" } else { "partial" };
        c.metrics.requests.with_label_values(&["followers", rpc, label]).inc();
        let read: HashSet<i64> = if unknown.is_empty() {
            HashSet::new()
        } else {
            let rows = edges::between(&self.db, user, &unknown, false).await.map_err(db_error)?;
            rows.into_iter().filter(|e| e.state == EdgeState::Following).map(|e| e.follower_id).collect()
        };
        let familiar = rest.into_iter().zip(&known).filter(|(entry, k)| matches!(k, Lookup::Follows(_)) || read.contains(&entry.0));
        Ok(Some(entries(familiar.map(|(e, _)| e).take(limit).collect())))
    }
}
