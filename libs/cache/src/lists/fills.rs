//! The background fills of one service instance: at most a fixed number at once (a burst of
//! misses, such as a flushed cache, costs the database that many list reads at a time), at
//! most one per list, and, when configured, only for a list that missed more than once
//! (admission on the n-th miss, the "doorkeeper" of TinyLFU: Einziger, Friedman and Manes,
//! *TinyLFU: A Highly Efficient Cache Admission Policy*, 2017): a list read once is answered
//! by one page query instead of that query plus a read of the whole list.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Background fills running at once per instance and cache, by default.
pub const FILL_SLOTS: usize = 8;

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
}

/// A running fill of one user's list; dropping it frees the slot.
pub struct FillSlot {
    _permit: OwnedSemaphorePermit,
    running: Arc<Mutex<HashSet<i64>>>,
    user_id: i64,
}

/// Why a miss started no fill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotStarted {
    /// The list has missed fewer than the admission's count of times in
    /// [`ADMISSION_WINDOW`]; this miss was counted.
    Deferred,
    /// Every slot is taken, or that list's fill already runs here; the next miss tries again.
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
        Self { slots: Arc::new(Semaphore::new(slots.max(1))), running: Arc::default(), misses, after_misses }
    }

    /// A slot for filling `user_id`'s list after a miss, unless the list is not admitted yet
    /// or every slot is taken or that list's fill already runs here (the read that missed is
    /// answered from the database anyway; a later miss tries again). A started fill clears the
    /// list's count of misses.
    ///
    /// # Errors
    /// Why no fill started.
    pub fn try_start(&self, user_id: i64) -> Result<FillSlot, NotStarted> {
        if let Some(misses) = &self.misses
            && misses.get_with(user_id, Arc::default).fetch_add(1, Ordering::Relaxed) + 1 < self.after_misses
        {
            return Err(NotStarted::Deferred);
        }
        let permit = Arc::clone(&self.slots).try_acquire_owned().map_err(|_| NotStarted::Busy)?;
        if !self.running.lock().unwrap_or_else(PoisonError::into_inner).insert(user_id) {
            return Err(NotStarted::Busy);
        }
        if let Some(misses) = &self.misses {
            misses.invalidate(&user_id);
        }
        Ok(FillSlot { _permit: permit, running: Arc::clone(&self.running), user_id })
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
