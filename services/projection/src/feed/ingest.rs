//! The feed's writes from the event stream:
//! - [`Ingest`], the effectively-once consumer of `sg.content.v1`: records posts and
//!   tombstones in `post` and queues the pushes, with the partition's next offset, in one
//!   transaction, applying the outcome to the cached post lists before it commits. A post id is recorded once (later publishes of it change nothing) and a
//!   tombstone stays, so copies, replays and a publish arriving after its delete change nothing.
//! - [`on_edges`], called by the projection's relation-event transaction: a new follow
//!   backfills the followee's newest pushed posts into the follower's inbox, an unfollow
//!   removes them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use prost::Message;
use rskafka::record::RecordAndOffset;
use sea_orm::DatabaseTransaction;
use socialgraph_cache::lists::CachedEdge;
use socialgraph_domain::timestamp_to_ms;
use socialgraph_events::consumer::{BatchHandler, BoxError};
use socialgraph_proto::events::v1::{ContentEvent, ContentEventKind};
use socialgraph_storage::feed::{self, FanoutJob, FeedEntry, FeedKey, PostRow};
use socialgraph_storage::offsets::{self, StoredOffset};
use socialgraph_storage::stale;
use tracing::Instrument;

use super::posts_cache::PostChange;
use super::{Feed, FeedSettings};

/// 9999-12-31T23:59:59.999Z: the last time a protobuf Timestamp can carry.
const MAX_TIME_MS: i64 = 253_402_300_799_999;

/// Retries of one batch transaction that lost a race.
const MAX_RETRIES: usize = 10;

/// One content event of a batch, decoded.
#[derive(Debug, Clone, Copy)]
struct Change {
    published: bool,
    entry: FeedEntry,
}

/// The consumer of `sg.content.v1`.
pub struct Ingest {
    /// The feed.
    pub feed: Arc<Feed>,
    /// Also keep `user_counter.posts` (the embedded mode's counters, same database) in the
    /// same transaction: +1 per post recorded live, −1 per live post deleted.
    pub count_posts: bool,
}

impl Ingest {
    fn decode(&self, records: &[RecordAndOffset]) -> Vec<Change> {
        let mut out = Vec::with_capacity(records.len());
        for r in records {
            let Ok(e) = ContentEvent::decode(r.record.value.as_deref().unwrap_or_default()) else {
                tracing::warn!(offset = r.offset, "skipping a record that is not a ContentEvent");
                continue;
            };
            if e.entity_type != self.feed.settings.entity_type || e.entity_id <= 0 || e.author_id <= 0 {
                continue;
            }
            let published = match ContentEventKind::try_from(e.kind) {
                Ok(ContentEventKind::Published) => true,
                Ok(ContentEventKind::Deleted) => false,
                _ => continue,
            };
            let at = e.occurred_at.as_ref().map(timestamp_to_ms).unwrap_or_else(|| r.record.timestamp.timestamp_millis());
            if !(0..=MAX_TIME_MS).contains(&at) {
                tracing::warn!(offset = r.offset, at, "skipping a content event whose time is outside 1970..9999");
                continue;
            }
            out.push(Change { published, entry: FeedEntry { key: FeedKey { created_at_ms: at, post_id: e.entity_id }, author_id: e.author_id } });
        }
        out
    }

    async fn apply_once(
        &self,
        topic: &str,
        changes: &[Change],
        position: StoredOffset,
        sent: &Mutex<Vec<i64>>,
    ) -> Result<(usize, usize), sea_orm::DbErr> {
        let txn = socialgraph_storage::begin_write(&self.feed.db).await?;
        let authors: Vec<i64> = changes.iter().filter(|c| c.published).map(|c| c.entry.author_id).collect();
        let followers = feed::lock_authors(&txn, &authors).await?;
        let ids: Vec<i64> = changes.iter().map(|c| c.entry.key.post_id).collect();
        let stored = feed::get_posts(&txn, &ids).await?;
        // The final state of each post id the batch touches, in first-seen order.
        let mut next: HashMap<i64, PostRow> = HashMap::new();
        let mut order = Vec::new();
        let mut deleted_existing = Vec::new();
        for c in changes {
            let id = c.entry.key.post_id;
            if let Some(old) = stored.get(&id) {
                // Only the post's own author deletes it.
                if !c.published && !old.deleted && old.entry.author_id == c.entry.author_id && !deleted_existing.contains(&id) {
                    deleted_existing.push(id);
                }
                continue;
            }
            match next.get_mut(&id) {
                Some(row) => row.deleted |= !c.published,
                None => {
                    let pushed = c.published && self.feed.settings.pushes(followers.get(&c.entry.author_id).copied().unwrap_or(0));
                    next.insert(id, PostRow { entry: c.entry, pushed, deleted: !c.published });
                    order.push(id);
                }
            }
        }
        let rows: Vec<PostRow> = order.iter().filter_map(|id| next.get(id).copied()).collect();
        let now = crate::now_ms();
        feed::insert_posts(&txn, &rows, now).await?;
        feed::mark_deleted(&txn, &deleted_existing, now).await?;
        let jobs: Vec<FanoutJob> = rows
            .iter()
            .filter(|r| r.pushed && !r.deleted)
            .map(|r| FanoutJob { entry: r.entry, partition: position.partition, next_follower_id: 0 })
            .collect();
        feed::insert_fanouts(&txn, &jobs).await?;
        if self.count_posts {
            let mut per_author: HashMap<i64, i64> = HashMap::new();
            for r in rows.iter().filter(|r| !r.deleted) {
                *per_author.entry(r.entry.author_id).or_default() += 1;
            }
            for id in &deleted_existing {
                if let Some(old) = stored.get(id) {
                    *per_author.entry(old.entry.author_id).or_default() -= 1;
                }
            }
            count_posts(&txn, &per_author).await?;
        }
        self.to_cache(sent, &txn, &rows, &deleted_existing, &stored, position, now).await?;
        offsets::store(&txn, &self.feed.consumer, topic, position, now).await?;
        txn.commit().await?;
        let live = rows.iter().filter(|r| !r.deleted).count();
        Ok((jobs.len(), live - jobs.len()))
    }
}

impl Ingest {
    /// Applies the batch's outcome (`rows` recorded, `deleted` existing posts of `stored`) to
    /// the cached post lists before `txn` commits; when the cache Redis does not take it, marks
    /// the authors stale in `txn` ([`super::posts_cache`]). `sent`: the authors earlier
    /// attempts of the batch gave the cache (marked stale here; this attempt's are added).
    #[allow(clippy::too_many_arguments)]
    async fn to_cache(
        &self,
        sent: &Mutex<Vec<i64>>,
        txn: &DatabaseTransaction,
        rows: &[PostRow],
        deleted: &[i64],
        stored: &HashMap<i64, PostRow>,
        position: StoredOffset,
        now: i64,
    ) -> Result<(), sea_orm::DbErr> {
        let Some(cache) = &self.feed.posts_cache else { return Ok(()) };
        // An earlier attempt of this batch gave the cache an outcome that never committed, and
        // this attempt may decide otherwise (another partition wrote the same post id
        // meanwhile): those authors' lists are dropped by the stale drain.
        let earlier = sent.lock().map(|s| s.clone()).unwrap_or_default();
        if !earlier.is_empty() {
            stale::mark(txn, &earlier, now).await?;
        }
        let recorded = rows.iter().map(|r| (r.entry.author_id, CachedEdge::post(r.entry.key.post_id, r.entry.key.created_at_ms, r.deleted)));
        let removed = deleted
            .iter()
            .filter_map(|id| stored.get(id))
            .map(|r| (r.entry.author_id, CachedEdge::post(r.entry.key.post_id, r.entry.key.created_at_ms, true)));
        let changes: Vec<PostChange> = recorded.chain(removed).collect();
        if changes.is_empty() {
            return Ok(());
        }
        let mut authors: Vec<i64> = changes.iter().map(|(a, _)| *a).collect();
        authors.sort_unstable();
        authors.dedup();
        match cache.apply(&changes, position.partition, position.next_offset).await {
            Ok(()) => {
                if let Ok(mut s) = sent.lock() {
                    s.extend(authors);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cache Redis unavailable: marking the batch's authors stale");
                stale::mark(txn, &authors, now).await?;
            }
        }
        Ok(())
    }
}

impl BatchHandler for Ingest {
    async fn load_offset(&self, topic: &str, partition: i32) -> Result<Option<i64>, BoxError> {
        Ok(offsets::next_offset(&self.feed.db, &self.feed.consumer, topic, partition).await?)
    }

    async fn apply(&self, topic: &str, partition: i32, records: &[RecordAndOffset], next_offset: i64) -> Result<(), BoxError> {
        let span = tracing::info_span!("feed.ingest", partition, offset = next_offset - 1, records = records.len());
        socialgraph_telemetry::adopt_records(&span, records.iter().map(|r| &r.record.headers));
        let changes = self.decode(records);
        let last_event_ms = records.last().map(|r| r.record.timestamp.timestamp_millis());
        let position = StoredOffset { partition, next_offset, last_event_ms };
        let sent = Mutex::new(Vec::new());
        let applied = socialgraph_storage::retry_tx(MAX_RETRIES, || self.apply_once(topic, &changes, position, &sent).instrument(span.clone())).await;
        let (pushed, pulled) = match applied {
            Ok(counts) => counts,
            Err(e) => {
                // The batch will be read again; what its attempts gave the cache never committed.
                let sent = sent.into_inner().unwrap_or_default();
                if let (Some(cache), false) = (&self.feed.posts_cache, sent.is_empty()) {
                    cache.evict(&sent).await;
                }
                return Err(e.into());
            }
        };
        self.feed.metrics.posts.with_label_values(&["pushed"]).inc_by(pushed as u64);
        self.feed.metrics.posts.with_label_values(&["pulled"]).inc_by(pulled as u64);
        if pushed > 0 {
            self.feed.fanout_wake.notify_one();
        }
        Ok(())
    }

    /// Writes the partition's position to the post lists' mark hash again ([`crate::fence`]).
    async fn idle(&self, _topic: &str, partition: i32, next_offset: i64) {
        if let Some(cache) = &self.feed.posts_cache {
            cache.mark_idle(partition, next_offset).await;
        }
    }
}

/// Adds `per_author` to `user_counter.posts` (never below 0) of the authors that have counters;
/// the others get theirs counted from the facts, posts included, on their first read.
async fn count_posts(txn: &DatabaseTransaction, per_author: &HashMap<i64, i64>) -> Result<(), sea_orm::DbErr> {
    use sea_orm::ConnectionTrait;
    for (author, d) in per_author.iter().filter(|(_, d)| **d != 0) {
        let sql = format!("UPDATE user_counter SET posts = MAX(0, posts + {d}) WHERE user_id = {author}");
        txn.execute_unprepared(&sql).await?;
    }
    Ok(())
}

/// Keeps inboxes in step with the follow edges of one projection batch, inside its
/// transaction, after the batch added to the counts (so the followees' `edge_count` rows are
/// locked; `unlocked` are followees whose count did not move and must be locked here):
/// `follows` (follower, followee) that became following get the followee's newest pushed
/// posts (at most `inbox_size`, above the follower's floor; when there may be more, the floor
/// rises to the oldest one taken), `unfollows` lose them. Returns the inbox rows written.
///
/// # Errors
/// Database errors.
pub async fn on_edges(
    txn: &DatabaseTransaction,
    settings: &FeedSettings,
    follows: &[(i64, i64)],
    unfollows: &[(i64, i64)],
    unlocked: &[i64],
) -> Result<u64, sea_orm::DbErr> {
    let mut unfollows = unfollows.to_vec();
    unfollows.sort_unstable();
    for (follower, followee) in unfollows {
        feed::inbox_remove_author(txn, follower, followee).await?;
    }
    if follows.is_empty() {
        return Ok(0);
    }
    if !unlocked.is_empty() {
        feed::lock_authors(txn, unlocked).await?;
    }
    let mut followees: Vec<i64> = follows.iter().map(|(_, b)| *b).collect();
    followees.sort_unstable();
    followees.dedup();
    let with_posts = feed::authors_with_pushed(txn, &followees).await?;
    if with_posts.is_empty() {
        return Ok(0);
    }
    let mut pairs: Vec<(i64, i64)> = follows.iter().copied().filter(|(_, b)| with_posts.contains(b)).collect();
    pairs.sort_unstable();
    let keep = settings.inbox_size;
    let mut written = 0;
    for (follower, followee) in pairs {
        let state = feed::inbox_state(txn, follower).await?;
        let posts = feed::author_posts(txn, followee, Some(true), state.floor, None, keep).await?;
        let rows: Vec<(i64, FeedEntry)> = posts.iter().map(|e| (follower, *e)).collect();
        written += rows.len() as u64;
        let over = feed::inbox_add(txn, &rows, settings.trim_bound()).await?;
        match posts.last() {
            Some(oldest) if posts.len() >= keep => {
                feed::trim(txn, follower, keep, oldest.key).await?;
            }
            _ if !over.is_empty() => {
                feed::trim(txn, follower, keep, FeedKey::MIN).await?;
            }
            _ => {}
        }
    }
    Ok(written)
}
