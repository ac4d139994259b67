//! Local caches of hot accounts: the follower pages of an account read more than
//! `cache.hot_reads_per_sec` times in a second are kept in this instance's memory for at most
//! `cache.hot_staleness_ms`, so a celebrity whose followers millions of clients look at costs
//! the cache Redis one read per page per instance per staleness period.
//!
//! Staleness is bounded twice: every entry expires after `hot_staleness_ms`, and the batches
//! this instance applies drop the pages of their followees at once (before the batch commits).
//! Batches of partitions another replica consumes reach this instance only through the expiry,
//! and a page read from the cache Redis just before a batch's drop may be stored just after it:
//! both are within the staleness bound. Reads that carry a consistency token skip every cache.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use socialgraph_domain::{Cursor, ListEntry};

/// Most hot accounts held per instance.
pub const HOT_ACCOUNTS: u64 = 10_000;

/// The pages of one hot account by (cursor, size).
type Pages = Mutex<HashMap<(Option<(i64, i64)>, usize), Arc<Vec<ListEntry>>>>;

/// The local caches of one instance.
pub struct Hot {
    /// Reads per account in the current second (an entry lives one second from its first read).
    reads: moka::sync::Cache<i64, Arc<AtomicU32>>,
    /// Pages of hot accounts (an entry lives `staleness` from its first page).
    pages: moka::sync::Cache<i64, Arc<Pages>>,
    threshold: u32,
}

fn key(after: Option<Cursor>, size: usize) -> (Option<(i64, i64)>, usize) {
    (after.map(|c| (c.followed_at_ms, c.peer_id)), size)
}

impl Hot {
    /// Local caches holding accounts read more than `reads_per_sec` times a second (0: none)
    /// for at most `staleness`.
    pub fn new(reads_per_sec: u32, staleness: Duration) -> Self {
        Self {
            reads: moka::sync::Cache::builder().max_capacity(HOT_ACCOUNTS * 10).time_to_live(Duration::from_secs(1)).build(),
            pages: moka::sync::Cache::builder().max_capacity(HOT_ACCOUNTS).time_to_live(staleness.max(Duration::from_millis(1))).build(),
            threshold: reads_per_sec,
        }
    }

    /// The page of `user_id` after `after` of `size` entries (with the lookahead entry) if it
    /// is held here.
    pub fn page(&self, user_id: i64, after: Option<Cursor>, size: usize) -> Option<Arc<Vec<ListEntry>>> {
        let pages = self.pages.get(&user_id)?;
        pages.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(&key(after, size)).cloned()
    }

    /// Counts a read of `user_id` and, once the account is hot, keeps `entries` (a page just
    /// read from the cache Redis).
    pub fn offer(&self, user_id: i64, after: Option<Cursor>, size: usize, entries: &[ListEntry]) {
        if self.threshold == 0 {
            return;
        }
        let reads = self.reads.get_with(user_id, || Arc::new(AtomicU32::new(0)));
        if reads.fetch_add(1, Ordering::Relaxed) < self.threshold {
            return;
        }
        let pages = self.pages.get_with(user_id, || Arc::new(Mutex::new(HashMap::new())));
        pages.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(key(after, size), Arc::new(entries.to_vec()));
    }

    /// Drops the pages of `users` (their follower lists changed).
    pub fn invalidate(&self, users: impl IntoIterator<Item = i64>) {
        for u in users {
            self.pages.invalidate(&u);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(n: i64) -> Vec<ListEntry> {
        (1..=n).map(|user_id| ListEntry { user_id, followed_at_ms: user_id }).collect()
    }

    #[test]
    fn an_account_is_held_only_past_its_read_rate_and_until_it_changes_or_expires() {
        let hot = Hot::new(3, Duration::from_millis(200));
        for _ in 0..3 {
            hot.offer(1, None, 2, &entries(3));
            assert!(hot.page(1, None, 2).is_none(), "not hot yet");
        }
        hot.offer(1, None, 2, &entries(3));
        assert_eq!(hot.page(1, None, 2).as_deref(), Some(&entries(3)), "the fourth read in a second makes it hot");
        assert!(hot.page(1, None, 3).is_none(), "another page size is another page");
        hot.invalidate([1]);
        assert!(hot.page(1, None, 2).is_none(), "a change of the list drops it");
        hot.offer(1, None, 2, &entries(2));
        assert_eq!(hot.page(1, None, 2).as_deref(), Some(&entries(2)));
        std::thread::sleep(Duration::from_millis(300));
        assert!(hot.page(1, None, 2).is_none(), "expired after the staleness bound");
        let off = Hot::new(0, Duration::from_secs(1));
        for _ in 0..10 {
            off.offer(2, None, 2, &entries(3));
        }
        assert!(off.page(2, None, 2).is_none(), "a threshold of 0 turns it off");
    }
}
