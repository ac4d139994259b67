//! The background fill of one cached list after a miss, as relation-svc (following lists) and
//! projection-svc (follower windows) both start it: a slot or a place in the queue from the
//! instance's [`FillSlots`], the pending gauge while it runs or waits, its turn, the fill
//! itself, and its result counted.

use std::fmt::Display;
use std::future::Future;

use socialgraph_cache::lists::{FillSlot, FillSlots};

use prometheus::{IntCounterVec, IntGaugeVec};

/// Starts `fill` for `user_id`'s list in cache `cache` (the metrics' label: `following`,
/// `followers`) in the background when `slots` give it a slot or a place in their queue
/// ([`FillSlots::try_start`]); else counts the miss as `deferred` or `busy` in `fills`
/// (`sg_cache_fills_total`, [`crate::CacheCounters`]) and starts nothing.
///
/// A started fill counts in `pending` (`sg_cache_fills_pending`) until its task ends (also
/// when the task never runs because its runtime stopped), waits for its slot
/// ([`FillSlot::turn`]), and is then given the slot, which it passes to
/// [`socialgraph_cache::lists::ListCache::commit_fill_paced`] for the row budget and drops
/// when done. Its result (`cached`, `raced`, `too_long`, `behind`, `skipped`; an error counts
/// as `failed` and is logged at debug level) goes to `fills`.
pub fn spawn_fill<F, Fut, E>(fills: &IntCounterVec, pending: &IntGaugeVec, slots: &FillSlots, cache: &'static str, user_id: i64, fill: F)
where
    F: FnOnce(FillSlot) -> Fut + Send + 'static,
    Fut: Future<Output = Result<&'static str, E>> + Send + 'static,
    E: Display,
{
    let slot = match slots.try_start(user_id) {
        Ok(slot) => slot,
        Err(not) => {
            fills.with_label_values(&[cache, not.label()]).inc();
            return;
        }
    };
    let fills = fills.clone();
    let pending = pending.with_label_values(&[cache]);
    pending.inc();
    let pending = scopeguard::guard(pending, |p| p.dec());
    tokio::spawn(async move {
        let (mut slot, _pending) = (slot, pending);
        slot.turn().await;
        let result = fill(slot).await.unwrap_or_else(|e| {
            tracing::debug!(user_id, cache, error = %e, "cache fill failed");
            "failed"
        });
        fills.with_label_values(&[cache, result]).inc();
    });
}
