//! The background fills of one service instance: at most a fixed number at once (a burst of
//! misses, such as a flushed cache, costs the database that many list reads at a time), and at
//! most one per list.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Background fills running at once per instance and cache, by default.
pub const FILL_SLOTS: usize = 8;

/// The fill slots of one cache in one instance. Cheap to clone.
#[derive(Clone)]
pub struct FillSlots {
    slots: Arc<Semaphore>,
    running: Arc<Mutex<HashSet<i64>>>,
}

/// A running fill of one user's list; dropping it frees the slot.
pub struct FillSlot {
    _permit: OwnedSemaphorePermit,
    running: Arc<Mutex<HashSet<i64>>>,
    user_id: i64,
}

impl Default for FillSlots {
    fn default() -> Self {
        Self::new(FILL_SLOTS)
    }
}

impl FillSlots {
    /// At most `slots` fills at once.
    pub fn new(slots: usize) -> Self {
        Self { slots: Arc::new(Semaphore::new(slots)), running: Arc::default() }
    }

    /// A slot for filling `user_id`'s list, unless every slot is taken or that list's fill
    /// already runs here (the read that missed is answered from the database anyway; a later
    /// miss tries again).
    pub fn try_start(&self, user_id: i64) -> Option<FillSlot> {
        let permit = Arc::clone(&self.slots).try_acquire_owned().ok()?;
        if !self.running.lock().unwrap_or_else(PoisonError::into_inner).insert(user_id) {
            return None;
        }
        Some(FillSlot { _permit: permit, running: Arc::clone(&self.running), user_id })
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
        assert!(slots.try_start(1).is_none(), "the list's fill already runs");
        let _b = slots.try_start(2).expect("a second slot");
        assert!(slots.try_start(3).is_none(), "both slots taken");
        drop(a);
        assert!(slots.try_start(1).is_some(), "a finished fill frees its list and its slot");
    }
}
