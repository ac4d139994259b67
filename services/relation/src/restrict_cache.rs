//! The restriction summaries of the cache Redis as relation-svc uses them
//! ([`socialgraph_cache::restrictions`]): relationship reads take the user's blocks, mutes and
//! requests from its summary; a miss is answered from the database and fills the summary in
//! the background under the lease the read took. Every transaction that changes a restriction
//! marks both users in `cache_stale` ([`Relations::restrictions_changed`]) and, once committed,
//! deletes their summaries ([`Relations::forget_restrictions`]); the stale drain repeats the
//! deletion for marks whose deletion failed or never ran.

use std::collections::HashSet;

use sea_orm::{DatabaseConnection, DatabaseTransaction};
use socialgraph_cache::restrictions::{Held, Kind, MAX_ENTRIES, SummaryRead};
use socialgraph_storage::restrictions::{self, Restriction};
use socialgraph_storage::stale;

use crate::cache::{Ahead, Caches};
use crate::service::{Relations, now_ms};

fn kind_of(r: Restriction) -> Kind {
    match r {
        Restriction::Block => Kind::Block,
        Restriction::Mute => Kind::Mute,
        Restriction::Request => Kind::Request,
    }
}

fn restriction_of(k: Kind) -> Restriction {
    match k {
        Kind::Block => Restriction::Block,
        Kind::Mute => Restriction::Mute,
        Kind::Request => Restriction::Request,
    }
}

impl Relations {
    /// `user_id`'s restrictions as (kind, owner, target) from its cached summary (read ahead
    /// when `ahead` holds it), counted under `rpc`; `None` when the database must answer (a
    /// miss also starts a fill).
    pub(crate) async fn cached_restrictions(&self, rpc: &str, user_id: i64, ahead: Ahead<SummaryRead>) -> Option<HashSet<(Restriction, i64, i64)>> {
        let c = self.caches.as_ref()?;
        let read = match ahead {
            None => c.restrictions.read(user_id).await,
            Some(read) => read,
        };
        let label = match &read {
            Ok(SummaryRead::Hit(_)) => "hit",
            Ok(SummaryRead::Lease(_)) => "miss",
            Ok(SummaryRead::Database) => "uncached",
            Err(_) => "fallback",
        };
        c.metrics.requests.with_label_values(&["restrictions", rpc, label]).inc();
        match read {
            Ok(SummaryRead::Hit(held)) => Some(held.into_iter().map(|h| (restriction_of(h.kind), h.owner, h.target)).collect()),
            Ok(SummaryRead::Lease(nonce)) => {
                spawn_fill(c, &self.db, user_id, nonce);
                None
            }
            Ok(SummaryRead::Database) => None,
            Err(e) => {
                tracing::debug!(error = %e, rpc, "cache unavailable: reading restrictions from the database");
                None
            }
        }
    }

    /// Marks `users` stale in `txn`, a transaction that changes a restriction between them, when
    /// caches are on: if their summaries are not deleted after the commit, the drain will.
    ///
    /// # Errors
    /// Database errors.
    pub(crate) async fn restrictions_changed(&self, txn: &DatabaseTransaction, users: &[i64]) -> Result<(), sea_orm::DbErr> {
        if self.caches.is_none() || users.is_empty() {
            return Ok(());
        }
        // One row per user, in id order, so two transactions marking the same users wait for
        // each other instead of deadlocking.
        let mut users = users.to_vec();
        users.sort_unstable();
        users.dedup();
        stale::mark(txn, &users, now_ms()).await
    }

    /// The whole cache, for the stale drain; `None` without caches.
    pub fn cache_for_drain(&self) -> Option<socialgraph_cache::lists::ListCaches> {
        self.caches.as_ref().map(|c| c.all.clone())
    }

    /// Deletes the cached summaries of `users` after a committed change of their restrictions,
    /// so the caller reads its own change at once; a failure is left to the stale drain.
    pub(crate) async fn forget_restrictions(&self, users: &[i64]) {
        let Some(c) = self.caches.as_ref().filter(|_| !users.is_empty()) else { return };
        let result = match c.restrictions.forget(users).await {
            Ok(()) => "ok",
            Err(e) => {
                tracing::debug!(error = %e, "could not delete restriction summaries; the stale drain will");
                "failed"
            }
        };
        c.metrics.writes.with_label_values(&["restrictions", result]).inc();
    }
}

/// Fills `user_id`'s summary under the lease `nonce` when a fill slot is free; else gives the
/// lease back at once, so the next read takes it instead of reading the database for 2 s.
fn spawn_fill(c: &Caches, db: &DatabaseConnection, user_id: i64, nonce: String) {
    let slot = c.restriction_fills.try_start(user_id);
    let (c, db) = (c.clone(), db.clone());
    let Ok(slot) = slot else {
        tokio::spawn(async move {
            let result = match c.restrictions.release(user_id, &nonce).await {
                Ok(()) => "skipped",
                Err(_) => "failed",
            };
            c.metrics.fills.with_label_values(&["restrictions", result]).inc();
        });
        return;
    };
    tokio::spawn(async move {
        let _slot = slot;
        let result = async {
            let rows = restrictions::of_user(&db, user_id, MAX_ENTRIES).await?;
            let held: Option<Vec<Held>> =
                rows.map(|rows| rows.into_iter().map(|(kind, owner, target)| Held { kind: kind_of(kind), owner, target }).collect());
            let stored = c.restrictions.commit(user_id, &nonce, held.as_deref()).await?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(match (stored, held.is_some()) {
                (false, _) => "raced",
                (true, true) => "cached",
                (true, false) => "too_long",
            })
        }
        .await
        .unwrap_or_else(|e| {
            tracing::debug!(user_id, error = %e, "restriction summary fill failed");
            "failed"
        });
        c.metrics.fills.with_label_values(&["restrictions", result]).inc();
    });
}
