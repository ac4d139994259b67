//! The stale drain of the cache Redis: users marked in `cache_stale` (by projection-svc when a
//! batch could not reach the cache, by relation-svc in every transaction that changes a
//! restriction) have everything cached of them deleted once the cache answers, and only then
//! are their marks cleared. Both services run it; whichever reaches a mark first clears it.

use std::time::Duration;

use sea_orm::DatabaseConnection;
use socialgraph_cache::lists::ListCaches;
use socialgraph_storage::stale;
use tokio_util::sync::CancellationToken;

/// How often the drain looks for marked users: once the cache Redis answers again, a user's
/// cached state that missed a change is served for at most about this long (a query of the
/// empty table costs next to nothing).
pub const STALE_DRAIN_EVERY: Duration = Duration::from_millis(200);

/// Deletes the cached lists and restriction summaries of every user marked stale, oldest mark
/// first, and clears each mark (unless the user was marked again meanwhile); returns how many
/// marks it cleared. Stops early, leaving the rest marked, while the cache Redis is unreachable.
///
/// # Errors
/// Database errors.
pub async fn drain_stale(db: &DatabaseConnection, caches: &ListCaches) -> Result<usize, sea_orm::DbErr> {
    let mut cleared = 0;
    loop {
        let users = stale::oldest(db, 500).await?;
        if users.is_empty() {
            return Ok(cleared);
        }
        let ids: Vec<i64> = users.iter().map(|u| u.user_id).collect();
        if let Err(e) = caches.evict_users(&ids).await {
            tracing::debug!(error = %e, "cache Redis still unavailable; stale users stay marked");
            return Ok(cleared);
        }
        stale::clear(db, &users).await?;
        cleared += users.len();
    }
}

/// Runs [`drain_stale`] every [`STALE_DRAIN_EVERY`] until `cancel`.
pub async fn drain_task(db: DatabaseConnection, caches: ListCaches, cancel: CancellationToken) {
    while !cancel.is_cancelled() {
        match drain_stale(&db, &caches).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(users = n, "deleted cached state of users marked stale"),
            Err(e) => tracing::warn!(error = %e, "could not drain stale cache marks"),
        }
        tokio::select! { _ = tokio::time::sleep(STALE_DRAIN_EVERY) => {}, _ = cancel.cancelled() => {} }
    }
}
