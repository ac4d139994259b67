//! The background fills of one service instance: at most a fixed number at once (a burst of
//! misses, such as a flushed cache, costs the database that many list reads at a time), at
//! most one per list, and, when configured, only for a list that missed more than once
//! (admission on the n-th miss, the "doorkeeper" of TinyLFU: Einziger, Friedman and Manes,
//! *TinyLFU: A Highly Efficient Cache Admission Policy*, 2017): a list read once is answered
//! by one page query instead of that query plus a read of the whole list.
//!
//! With a row budget ([`FillSlots::pacing`]) the fills of one instance and cache write at most
//! that many entries a second between them (a token bucket, [`governor`]'s GCRA): under a burst
//! of misses the fills trail the reads instead of taking the cores and the cache Redis from
//! them, and a miss beyond the slots waits in a bounded queue ([`FillSlots::queueing`]) instead
//! of starting no fill, so every list still gets filled once the burst is over.

use std::collections::HashSet;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Background fills running at once per instance and cache, by default.
pub const FILL_SLOTS: usize = 8;

/// Most fills of one instance and cache waiting for a slot when the fills are queued
/// ([`FillSlots::queueing`]); a miss beyond them starts none (`busy`).
pub const FILL_QUEUE: usize = 1_000;

/// The row budget's least burst and largest step: one fill part.
const PART: NonZeroU32 = match NonZeroU32::new(super::FILL_PART as u32) {
    Some(n) => n,
    None => NonZeroU32::MIN,
};

/// How long an instance remembers a list's misses towards its admission (a list missed again
/// later than this after its last counted miss starts counting afresh).
pub const ADMISSION_WINDOW: Duration = Duration::from_secs(60);

/// Most lists whose misses one instance remembers per cache (about 100 bytes each).
pub const ADMISSION_CAPACITY: u64 = 100_000;

/// The fill slots of one cache in one instance. Cheap to clone.
#[derive(Clone)]
pub struct FillSlots {
    slots: Arc<Semaphore>,
    running: Arc<Mutex<HashSet<i64>>>,
    /// Misses counted per list towards `after_misses`; `None` when every miss fills.
    misses: Option<moka::sync::Cache<i64, Arc<AtomicU32>>>,
    after_misses: u32,
    /// Fills at once (the semaphore's permits).
    size: usize,
    /// Fills that may wait for a slot.
    queue: usize,
    /// The row budget shared by this cache's fills; `None`: unpaced.
    rows: Option<Arc<Budget>>,
}

/// A row budget and the order of the fills waiting on it: the limiter alone would let a fill
/// asking for a small step take cells before one asking for a whole part, so a long list
/// could wait behind a stream of short ones; the FIFO lock hands the budget out in turn.
struct Budget {
    limiter: DefaultDirectRateLimiter,
    turn: tokio::sync::Mutex<()>,
}

/// A fill of one user's list, running or queued (then [`FillSlot::turn`] waits for its slot);
/// dropping it frees the slot and the list.
pub struct FillSlot {
    permit: Option<OwnedSemaphorePermit>,
    slots: Arc<Semaphore>,
    running: Arc<Mutex<HashSet<i64>>>,
    user_id: i64,
    rows: Option<Arc<Budget>>,
}

/// Why a miss started no fill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotStarted {
    /// The list has missed fewer than the admission's count of times in
    /// [`ADMISSION_WINDOW`]; this miss was counted.
    Deferred,
    /// Every slot and place in the queue is taken, or that list's fill already runs or waits
    /// here; the next miss tries again.
    Busy,
}

impl NotStarted {
    /// The `result` label of `sg_cache_fills_total` for a miss that started no fill.
    pub fn label(self) -> &'static str {
        match self {
            Self::Deferred => "deferred",
            Self::Busy => "busy",
        }
    }
}

impl Default for FillSlots {
    fn default() -> Self {
        Self::new(FILL_SLOTS)
    }
}

impl FillSlots {
    /// At most `slots` fills at once (at least 1), every miss admitted.
    pub fn new(slots: usize) -> Self {
        Self::admitting(slots, 1)
    }

    /// At most `slots` fills at once (at least 1); a list is filled from its `after_misses`-th
    /// miss within [`ADMISSION_WINDOW`] (0 and 1: from its first).
    pub fn admitting(slots: usize, after_misses: u32) -> Self {
        let misses = (after_misses > 1).then(|| moka::sync::Cache::builder().max_capacity(ADMISSION_CAPACITY).time_to_idle(ADMISSION_WINDOW).build());
        let size = slots.max(1);
        Self { slots: Arc::new(Semaphore::new(size)), running: Arc::default(), misses, after_misses, size, queue: 0, rows: None }
    }

    /// The same slots with up to `queue` fills waiting for one (0: a miss while every slot is
    /// taken starts none).
    #[must_use]
    pub fn queueing(mut self, queue: usize) -> Self {
        self.queue = queue;
        self
    }

    /// The same slots with their fills writing at most `rows_per_sec` entries a second between
    /// them ([`FillSlot::pace`]; bursts of up to a tenth of a second's budget, and at least one
    /// fill part); 0: unpaced.
    #[must_use]
    pub fn pacing(mut self, rows_per_sec: u32) -> Self {
        self.rows = NonZeroU32::new(rows_per_sec).map(|rate| {
            let burst = NonZeroU32::new(rows_per_sec / 10).map_or(PART, |b| b.max(PART));
            Arc::new(Budget { limiter: RateLimiter::direct(Quota::per_second(rate).allow_burst(burst)), turn: tokio::sync::Mutex::new(()) })
        });
        self
    }

    /// A slot for filling `user_id`'s list after a miss, or a place in the queue for one
    /// (call [`FillSlot::turn`] before the fill), unless the list is not admitted yet, or its
    /// fill already runs or waits here, or every slot and place is taken (the read that missed
    /// is answered from the database anyway; a later miss tries again). A started fill clears
    /// the list's count of misses.
    ///
    /// # Errors
    /// Why no fill started.
    pub fn try_start(&self, user_id: i64) -> Result<FillSlot, NotStarted> {
        if let Some(misses) = &self.misses
            && misses.get_with(user_id, Arc::default).fetch_add(1, Ordering::Relaxed) + 1 < self.after_misses
        {
            return Err(NotStarted::Deferred);
        }
        let permit = Arc::clone(&self.slots).try_acquire_owned().ok();
        {
            let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
            // The set holds the running and the queued fills: the slots taken plus the queue.
            if (permit.is_none() && running.len() >= self.size + self.queue) || !running.insert(user_id) {
                return Err(NotStarted::Busy);
            }
        }
        if let Some(misses) = &self.misses {
            misses.invalidate(&user_id);
        }
        Ok(FillSlot { permit, slots: Arc::clone(&self.slots), running: Arc::clone(&self.running), user_id, rows: self.rows.clone() })
    }
}

impl FillSlot {
    /// Waits until this fill has a slot: at once unless it was queued.
    pub async fn turn(&mut self) {
        if self.permit.is_none() {
            // The semaphore is never closed, so this only fails if it were.
            self.permit = Arc::clone(&self.slots).acquire_owned().await.ok();
        }
    }

    /// Waits until the row budget allows `rows` more entries to be written (at once when the
    /// fills are unpaced). A fill calls it before each part it writes.
    pub async fn pace(&self, rows: usize) {
        let Some(budget) = &self.rows else { return };
        let mut left = u32::try_from(rows).unwrap_or(u32::MAX);
        while let Some(n) = NonZeroU32::new(left) {
            let step = n.min(PART);
            let _turn = budget.turn.lock().await;
            // A step never exceeds the burst (at least one part), so this cannot fail.
            let _ = budget.limiter.until_n_ready(step).await;
            left -= step.get();
        }
    }
}

impl Drop for FillSlot {
    fn drop(&mut self) {
        self.running.lock().unwrap_or_else(PoisonError::into_inner).remove(&self.user_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_fill_per_list_and_at_most_the_slots_at_once() {
        let slots = FillSlots::new(2);
        let a = slots.try_start(1).expect("a free slot");
        assert_eq!(slots.try_start(1).err(), Some(NotStarted::Busy), "the list's fill already runs");
        let _b = slots.try_start(2).expect("a second slot");
        assert_eq!(slots.try_start(3).err(), Some(NotStarted::Busy), "both slots taken");
        drop(a);
        assert!(slots.try_start(1).is_ok(), "a finished fill frees its list and its slot");
    }

    #[tokio::test]
    async fn a_queued_fill_waits_for_a_slot_and_the_queue_is_bounded() {
        let slots = FillSlots::new(1).queueing(1);
        let running = slots.try_start(1).expect("a free slot");
        let mut queued = slots.try_start(2).expect("a place in the queue");
        assert_eq!(slots.try_start(2).err(), Some(NotStarted::Busy), "that list already waits");
        assert_eq!(slots.try_start(3).err(), Some(NotStarted::Busy), "the slot and the queue are taken");
        let waited = tokio::time::timeout(Duration::from_millis(50), queued.turn()).await;
        assert!(waited.is_err(), "no turn while the slot is taken");
        drop(running);
        tokio::time::timeout(Duration::from_secs(1), queued.turn()).await.expect("the freed slot goes to the queued fill");
        let _third = slots.try_start(3).expect("the queued fill now holds the slot, and the queue has room again");
        assert_eq!(slots.try_start(4).err(), Some(NotStarted::Busy), "the slot and the queue are taken again");
    }

    #[tokio::test]
    async fn paced_fills_write_no_faster_than_the_budget() {
        let slots = FillSlots::new(2).pacing(2_000);
        let (a, b) = (slots.try_start(1).expect("a slot"), slots.try_start(2).expect("a slot"));
        let start = std::time::Instant::now();
        // 1,200 rows against a burst of 200 and 2,000 a second: at least 0.5 s, shared by both.
        tokio::join!(a.pace(600), b.pace(600));
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(450), "1,200 rows at 2,000/s took {took:?}");
        let unpaced = FillSlots::new(1).try_start(3).expect("a slot");
        let start = std::time::Instant::now();
        unpaced.pace(1_000_000).await;
        assert!(start.elapsed() < Duration::from_millis(100), "no budget: no wait");
    }

    #[test]
    fn a_list_is_filled_from_its_admitting_miss_and_counts_afresh_after_a_fill() {
        let slots = FillSlots::admitting(1, 2);
        assert_eq!(slots.try_start(1).err(), Some(NotStarted::Deferred), "the first miss is only counted");
        assert_eq!(slots.try_start(2).err(), Some(NotStarted::Deferred), "each list counts its own");
        let a = slots.try_start(1).expect("the second miss fills");
        assert_eq!(slots.try_start(2).err(), Some(NotStarted::Busy), "admitted, but the one slot is taken");
        drop(a);
        assert!(slots.try_start(2).is_ok(), "a busy miss kept its count: the next one fills");
        assert_eq!(slots.try_start(1).err(), Some(NotStarted::Deferred), "a fill cleared the list's count");
    }
}
