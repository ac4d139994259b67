//! List caches in the cache Redis, kept by the event stream as pseudo-replicas
//! (docs/src/architecture/caches.md#list-caches): each user's following list (`sg:flw:{uid}`), the newest followers of each user
//! (`sg:fan:{uid}`) and the newest posts of each author (`sg:pst:{uid}`, a post being an entry
//! whose version is 1 while live and 2 once deleted), each as a window of the newest `window`
//! entries of the list.
//!
//! Three keys per list, all tagged `{uid}`:
//! - the sorted set: member = peer id as 8 big-endian bytes, score = followed_at (ms). Redis
//!   orders equal scores by member bytes, so `ZREVRANGE` is the list order of the database:
//!   (followed_at desc, peer id desc);
//! - `…:v`, a hash: member → the edge's version, negative when the member is not in the set
//!   (unfollowed, hidden, or older than the window), plus `_s` (state: `c` the whole list, `w`
//!   only what is newer than the boundary `_bs`/`_bm`, `f:<nonce>` being filled, `x` too long)
//!   and `_n` (members of the set);
//! - `…:r`, the relationship hash of a very large account: candidate → `version:followed_at`
//!   of its edge (version 0: none; negative: not following), or `p:<nonce>` while the reader
//!   that marked it reads the database; plus `_h`, a long value that keeps the hash a
//!   hashtable (see [`scripts::LOOKUP`]).
//!
//! How the races are closed:
//! - **Replays, copies, reordering**: an entry changes only when its version is higher than the
//!   stored one; a fill stores the versions of the unfollowed and hidden edges newer than the
//!   window's boundary too, so a copy of an old follow that arrives after the fill cannot bring
//!   an edge back. A follow's followed_at never decreases with its version, so a copy of an
//!   edge older than the boundary would land outside the window anyway.
//! - **A fill that read the database before a concurrent write**: a fill first puts a marker
//!   (`_s = f:<nonce>`) and only then reads the database. From the marker on, every event is
//!   applied to the (incomplete) entry, so a write the read missed is already in the cache with
//!   a higher version than the read's, and the merge keeps it. Events applied before the marker
//!   must be in the read: true for following lists (relation-svc commits an edge before its
//!   event exists); for follower lists, read from the projection, which applies a batch to the
//!   cache just before committing it, the fill reads the projection's offsets in the same
//!   snapshot as the rows and commits only if they cover every batch the cache had applied
//!   when the marker was set, in every partition ([`ListCache::applied`]; positions only
//!   grow, so a late or repeated write of an older one changes nothing).
//! - **Eviction** (the cache Redis may evict any key): every script runs atomically and first
//!   checks that the set and the hash agree (`ZCARD = _n`); when one was evicted it deletes the
//!   other and the list counts as not cached. A fill whose marker was evicted or replaced marks
//!   nothing served. A relationship entry that is gone stays gone until asked again, and a
//!   reader fills only the entries it marked itself and that are still pending, or older ones
//!   ([`Marks`]).
//! - **Two fills of one list** (two replicas that both missed it): a fill's marker carries a
//!   lease ([`FILL_LEASE`], renewed by each part it writes), and another fill takes the list
//!   over only once that has run out; the fill taken over marks nothing served.
//! - **Windows**: adding to a window drops its oldest members; what is dropped becomes the
//!   boundary, so the set always holds every followed entry newer than the boundary. Removals
//!   only shrink the window.

mod fills;
mod joins;
mod relationships;
mod scripts;
mod transactions;

pub use fills::{ADMISSION_CAPACITY, ADMISSION_WINDOW, FILL_QUEUE, FILL_SLOTS, FillSlot, FillSlots, NotStarted};
pub use joins::{JOIN_MAX, page_of};
pub use relationships::{Listed, Marks};
pub use transactions::RelationshipsRead;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use redis::Script;

use crate::keys::Keys;
use crate::{CacheError, Pool};

/// Most entries one script call or one round trip of [`ListCache::apply`] carries (an
/// import's batch is split into parts of this size). Redis runs one script at a time and a
/// round trip's commands back to back, so this bounds how long a read waits behind an apply:
/// 1,000 changes to a cached list took about 3 ms of Redis time on an idle machine (2.6–3.1 µs
/// each, `INFO commandstats`) and 10–34 ms under a Slashdot import (SLOWLOG); 250 take about
/// 0.7 ms idle.
pub const CHUNK: usize = 250;

/// Most entries one script call of a fill ([`ListCache::commit_fill`]) carries. Fills run
/// beside reads, and Redis runs one script at a time: a read that arrives during a fill's part
/// waits for it. Parts of 1,000 entries took 2–5 ms each under the bench's load (SLOWLOG,
/// Slashdot's longest following lists and follower windows); parts of this size keep that
/// wait near the cost of a read itself, for a few more round trips per fill. Warm reads beside
/// fills gained (follower page p99 3.95 → 1.82 ms); cold reads' p99 did not move, as the
/// fill's whole cost still shares the cores with them.
pub const FILL_PART: usize = 100;

/// How long a fill holds its list against another fill's takeover (another instance's, or
/// this one's after a failure) from its start and from each part it writes: a paced fill
/// ([`FillSlot::pace`]) of a long list runs for seconds, and without a lease two replicas
/// filling one list took it from each other and each read the whole list again. A fill that
/// stopped (its instance died) blocks its list's fills for at most this long.
pub const FILL_LEASE: Duration = Duration::from_secs(10);

/// Which list of a user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// The accounts the user follows (`sg:flw:{uid}`), owner = follower.
    Following,
    /// The accounts following the user (`sg:fan:{uid}`), owner = followee.
    Followers,
    /// The author's newest posts (`sg:pst:{uid}`), owner = author: peer = post id, score =
    /// created_at (ms), version 1 while the post is live and 2 once deleted
    /// ([`CachedEdge::post`]); no relationship hash.
    Posts,
}

/// One edge as a list cache holds it, seen from the list's owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CachedEdge {
    /// The other end: the followee of a following list, the follower of a follower list.
    pub peer_id: i64,
    /// The edge's version (grows with every change of the edge; 0: no edge at all).
    pub version: i64,
    /// Whether the edge is followed at that version (hidden and unfollowed edges are not).
    pub following: bool,
    /// When the follow happened (ms since the epoch); the list's sort key.
    pub followed_at_ms: i64,
}

impl CachedEdge {
    /// A post as the `Posts` list holds it: version 1 live, 2 deleted (a delete is final, so
    /// a copy of the publish after it changes nothing).
    pub fn post(post_id: i64, created_at_ms: i64, deleted: bool) -> Self {
        CachedEdge { peer_id: post_id, version: if deleted { 2 } else { 1 }, following: !deleted, followed_at_ms: created_at_ms }
    }
}

/// What a page read found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PageRead {
    /// The page, (peer id, followed_at ms) in list order; complete for the request.
    Hit(Vec<(i64, i64)>),
    /// The list is not cached.
    Miss,
    /// The list is cached as a window and the page runs past it (a deep page): the entries
    /// of the page that the window holds.
    PastWindow(Vec<(i64, i64)>),
}

/// What the cache knows of one edge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// Followed since this time (ms).
    Follows(i64),
    /// Not followed.
    No,
    /// Not known here: ask the database.
    Unknown,
}

/// Sizes and times of a list cache.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most entries of a cached list; a longer list keeps its newest ones.
    pub window: usize,
    /// Most candidates remembered per account in the relationship hash.
    pub relationship_max: usize,
    /// Lifetime of a cached list after its fill (the cache Redis may evict it earlier).
    pub ttl: Duration,
    /// Longest wait for one call.
    pub timeout: Duration,
}

/// Where the projection's batch applied to the cache stands: written in the same round trip
/// as the batch, before it, so a fill can tell whether its database read covers it. A
/// partition's position only grows: writing an older one (late, or repeated) changes nothing.
#[derive(Debug, Clone, Copy)]
pub struct AppliedMark<'a> {
    /// Names the consumer and topic (`consumer/topic`).
    pub key: &'a str,
    /// The batch's partition.
    pub partition: i32,
    /// The batch's next offset.
    pub next_offset: i64,
}

struct Scripts {
    apply: Script,
    fill_begin: Script,
    fill_add: Script,
    fill_commit: Script,
    too_long: Script,
    page: Script,
    lookup: Script,
    rel_fill: Script,
    count: Script,
    mark: Script,
    intersect: Script,
}

/// Both list caches of one cache Redis, over one pool.
#[derive(Clone)]
pub struct ListCaches {
    /// Following lists (`sg:flw`), filled by relation-svc from `following`.
    pub following: ListCache,
    /// Follower windows (`sg:fan`), filled by projection-svc from `follower`.
    pub followers: ListCache,
    /// Restriction summaries (`sg:rst`), filled by relation-svc.
    pub restrictions: crate::restrictions::RestrictionCache,
    /// Authors' newest posts (`sg:pst`), kept and filled by projection-svc's feed.
    pub posts: ListCache,
}

impl ListCaches {
    /// Deletes everything cached of `users` (both lists, with their relationship hashes, their
    /// posts and the restriction summaries): what the stale drain does to users marked in
    /// `cache_stale`.
    ///
    /// # Errors
    /// The cache Redis is unreachable, slow or failing.
    pub async fn evict_users(&self, users: &[i64]) -> Result<(), CacheError> {
        // Sent together (one round trip on the shared connection); Ok only when all four were.
        tokio::try_join!(self.following.evict(users), self.followers.evict(users), self.posts.evict(users), self.restrictions.forget(users))?;
        Ok(())
    }
}

/// One list cache (one direction) of one cache Redis. Cheap to clone.
#[derive(Clone)]
pub struct ListCache {
    pool: Pool,
    keys: Keys,
    direction: Direction,
    limits: Limits,
    scripts: Arc<Scripts>,
}

/// The 8-byte member of a peer (big-endian, so byte order is numeric order for ids > 0).
fn member(id: i64) -> [u8; 8] {
    id.to_be_bytes()
}

fn id_of(m: &[u8]) -> Result<i64, CacheError> {
    m.try_into().map(i64::from_be_bytes).map_err(|_| CacheError::Unavailable("malformed cached member".into()))
}

/// (peer id, followed_at ms) of a script's flat reply of (member, score)*.
fn entries_of(flat: &[Vec<u8>]) -> Result<Vec<(i64, i64)>, CacheError> {
    flat.chunks_exact(2).map(|p| Ok((id_of(&p[0])?, ms_of(&p[1])?))).collect()
}

fn ms_of(score: &[u8]) -> Result<i64, CacheError> {
    std::str::from_utf8(score)
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .map(|f| f as i64)
        .ok_or_else(|| CacheError::Unavailable("malformed cached score".into()))
}

impl ListCache {
    /// The `direction` lists of one cache Redis over `pool`, keys under `keys`' prefix.
    pub fn new(pool: Pool, keys: Keys, direction: Direction, limits: Limits) -> Self {
        let s = |body: &str| Script::new(&format!("{}{body}", scripts::COMMON));
        let scripts = Scripts {
            apply: s(scripts::APPLY),
            fill_begin: s(scripts::FILL_BEGIN),
            fill_add: s(scripts::FILL_ADD),
            fill_commit: s(scripts::FILL_COMMIT),
            too_long: s(scripts::TOO_LONG),
            page: s(scripts::PAGE),
            lookup: s(scripts::LOOKUP),
            rel_fill: s(scripts::REL_FILL),
            count: s(scripts::COUNT),
            mark: Script::new(scripts::MARK),
            intersect: Script::new(joins::INTERSECT),
        };
        Self { pool, keys, direction, limits, scripts: Arc::new(scripts) }
    }

    /// The cache's limits.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    fn ttl_secs(&self) -> u64 {
        self.limits.ttl.as_secs().max(1)
    }

    /// The three keys of `user_id`'s list.
    fn list_keys(&self, user_id: i64) -> [String; 3] {
        match self.direction {
            Direction::Following => self.keys.list(true, user_id),
            Direction::Followers => self.keys.list(false, user_id),
            Direction::Posts => Keys::list_of(self.keys.posts(user_id)),
        }
    }

    /// `script` with the three keys of `user_id`'s list.
    fn invocation<'a>(&self, script: &'a Script, user_id: i64) -> redis::ScriptInvocation<'a> {
        let mut inv = script.prepare_invoke();
        for k in self.list_keys(user_id) {
            inv.key(k);
        }
        inv
    }

    async fn run<T: redis::FromRedisValue>(&self, inv: redis::ScriptInvocation<'_>) -> Result<T, CacheError> {
        crate::within(self.limits.timeout, async { Ok(inv.invoke_async::<T>(&mut crate::conn(&self.pool).await?).await?) }).await
    }

    /// Up to `limit` entries (peer id, followed_at ms) of `user_id`'s list in list order,
    /// strictly after `after` = (followed_at ms, peer id) when given. A first page is one
    /// transaction on a single Redis ([`transactions`]), other pages one script call.
    ///
    /// # Errors
    /// Redis unreachable, slow or failing.
    pub async fn page(&self, user_id: i64, after: Option<(i64, i64)>, limit: usize) -> Result<PageRead, CacheError> {
        if after.is_none()
            && let Some(read) = self.first_page(user_id, limit).await?
        {
            return Ok(read);
        }
        let mut inv = self.invocation(&self.scripts.page, user_id);
        match after {
            Some((ms, peer)) => inv.arg(ms).arg(member(peer).as_slice()),
            None => inv.arg("").arg(""),
        };
        inv.arg(limit);
        let flat: Option<Vec<Vec<u8>>> = self.run(inv).await?;
        let Some(flat) = flat else { return Ok(PageRead::Miss) };
        let windowed = flat.first().is_some_and(|s| s.as_slice() == b"w");
        let entries = entries_of(&flat[1..])?;
        Ok(if windowed && entries.len() < limit { PageRead::PastWindow(entries) } else { PageRead::Hit(entries) })
    }

    /// How many entries `user_id`'s list has; `None` unless the whole list is cached.
    ///
    /// # Errors
    /// Redis unreachable, slow or failing.
    pub async fn count(&self, user_id: i64) -> Result<Option<i64>, CacheError> {
        let n: i64 = self.run(self.invocation(&self.scripts.count, user_id)).await?;
        Ok((n >= 0).then_some(n))
    }

    /// Starts filling `user_id`'s list: `None` when it is already served, known to be too long
    /// to cache, or being filled under another fill's lease ([`FILL_LEASE`]), else the fill's
    /// nonce, to pass to [`Self::commit_fill`] with the database read made **after** this call.
    ///
    /// # Errors
    /// Redis unreachable, slow or failing.
    pub async fn begin_fill(&self, user_id: i64) -> Result<Option<String>, CacheError> {
        let nonce = uuid::Uuid::now_v7().simple().to_string();
        let mut inv = self.invocation(&self.scripts.fill_begin, user_id);
        inv.arg(&nonce).arg(self.ttl_secs()).arg(FILL_LEASE.as_millis() as u64);
        let state: String = self.run(inv).await?;
        Ok((state == "f").then_some(nonce))
    }

    /// Remembers for the cache's TTL that `user_id`'s list cannot be cached (its fill would
    /// read too many rows): reads then go to the database without a fill.
    ///
    /// # Errors
    /// Redis unreachable, slow or failing.
    pub async fn mark_too_long(&self, user_id: i64) -> Result<(), CacheError> {
        let mut inv = self.invocation(&self.scripts.too_long, user_id);
        inv.arg(self.ttl_secs());
        self.run::<i64>(inv).await.map(|_| ())
    }

    /// Ends the fill `nonce` of `user_id` with `edges` read from the database after
    /// [`Self::begin_fill`]: the newest followed entries (at most `window`) and every
    /// not-followed edge newer than `boundary`. `boundary` = (followed_at ms, peer id) of the
    /// newest followed entry left out, `None` when the read holds the whole list. True when the
    /// list is now served (false: the marker was evicted or another fill took over).
    ///
    /// # Errors
    /// Redis unreachable, slow or failing.
    pub async fn commit_fill(&self, user_id: i64, nonce: &str, edges: &[CachedEdge], boundary: Option<(i64, i64)>) -> Result<bool, CacheError> {
        self.commit_fill_paced(user_id, nonce, edges, boundary, None).await
    }

    /// [`Self::commit_fill`] within `slot`'s row budget: each part waits for
    /// [`FillSlot::pace`] before it is written (`None`: unpaced).
    ///
    /// # Errors
    /// Redis unreachable, slow or failing.
    pub async fn commit_fill_paced(
        &self,
        user_id: i64,
        nonce: &str,
        edges: &[CachedEdge],
        boundary: Option<(i64, i64)>,
        slot: Option<&FillSlot>,
    ) -> Result<bool, CacheError> {
        // Large reads go in parts ([`FILL_PART`]), each a short script, so reads running
        // beside the fill wait little for Redis; the marker is checked by every part.
        let split = edges.len().saturating_sub(1) / FILL_PART * FILL_PART;
        let (parts, last) = edges.split_at(split);
        let pace = |n: usize| async move {
            if let Some(slot) = slot {
                slot.pace(n).await;
            }
        };
        for part in parts.chunks(FILL_PART) {
            pace(part.len()).await;
            let mut inv = self.invocation(&self.scripts.fill_add, user_id);
            inv.arg(nonce).arg(FILL_LEASE.as_millis() as u64);
            push_edges(&mut inv, part);
            if self.run::<i64>(inv).await? == 0 {
                return Ok(false);
            }
        }
        let edges = last;
        pace(edges.len()).await;
        let mut inv = self.invocation(&self.scripts.fill_commit, user_id);
        inv.arg(nonce).arg(self.ttl_secs()).arg(self.limits.window);
        match boundary {
            Some((ms, peer)) => inv.arg(ms).arg(member(peer).as_slice()),
            None => inv.arg("").arg(""),
        };
        push_edges(&mut inv, edges);
        let done: i64 = self.run(inv).await?;
        Ok(done == 1)
    }

    /// Applies edge changes (owner id, edge) from the event stream or a write, in one round
    /// trip: each one changes a cached (or being-filled) list and relationship entry only when
    /// its version is newer than the cached one, so copies, replays and reordering are
    /// harmless. `mark` (the projection's batches) records the batch's position first. Returns
    /// the list entries changed.
    ///
    /// # Errors
    /// Redis unreachable, slow or failing: the caller must treat those lists as stale.
    pub async fn apply(&self, changes: &[(i64, CachedEdge)], mark: Option<AppliedMark<'_>>) -> Result<u64, CacheError> {
        let mut by_user: BTreeMap<i64, Vec<CachedEdge>> = BTreeMap::new();
        for (owner, e) in changes {
            by_user.entry(*owner).or_default().push(*e);
        }
        // At most CHUNK changes per script call and per round trip, so that a large batch (an
        // import) never holds Redis long nor outlasts the timeout; the mark goes first.
        let mut pipes = vec![(redis::pipe(), 0usize)];
        if let Some(m) = mark {
            let mut inv = self.scripts.mark.prepare_invoke();
            inv.key(self.keys.cache_applied(m.key)).arg(m.partition).arg(m.next_offset);
            pipes[0].0.invoke_script(&inv).ignore();
        }
        for (user, edges) in &by_user {
            for part in edges.chunks(CHUNK) {
                if pipes.last().is_some_and(|(_, n)| *n > 0 && n + part.len() > CHUNK) {
                    pipes.push((redis::pipe(), 0));
                }
                let mut inv = self.invocation(&self.scripts.apply, *user);
                inv.arg(self.limits.window);
                push_edges(&mut inv, part);
                if let Some((pipe, n)) = pipes.last_mut() {
                    pipe.invoke_script(&inv);
                    *n += part.len();
                }
            }
        }
        let mut changed = 0;
        for (i, (pipe, n)) in pipes.iter().enumerate() {
            if *n == 0 && mark.is_none() {
                continue;
            }
            // The mark completes before the scripts also on a cluster (another slot).
            let first = usize::from(i == 0 && mark.is_some());
            let scripts = [&self.scripts.apply, &self.scripts.mark];
            let counts: Vec<u64> = crate::query_pipeline_ordered(&self.pool, self.limits.timeout, pipe, &scripts, first).await?;
            changed += counts.iter().sum::<u64>();
        }
        Ok(changed)
    }

    /// Per partition, the next offset of the last batch applied to the cache under `key`
    /// ([`AppliedMark::key`]).
    ///
    /// # Errors
    /// Redis unreachable, slow or failing.
    pub async fn applied(&self, key: &str) -> Result<HashMap<i32, i64>, CacheError> {
        let key = self.keys.cache_applied(key);
        crate::within(self.limits.timeout, async {
            Ok(redis::AsyncCommands::hgetall::<_, HashMap<i32, i64>>(&mut crate::conn(&self.pool).await?, key).await?)
        })
        .await
    }

    /// Drops the cached lists (and relationship hashes) of `users`; their next read fills them
    /// from the database.
    ///
    /// # Errors
    /// Redis unreachable, slow or failing.
    pub async fn evict(&self, users: &[i64]) -> Result<(), CacheError> {
        if users.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for u in users {
            pipe.del(&self.list_keys(*u)).ignore();
        }
        crate::query_pipeline(&self.pool, self.limits.timeout, &pipe, &[]).await
    }
}

fn push_edges(inv: &mut redis::ScriptInvocation<'_>, edges: &[CachedEdge]) {
    for e in edges {
        let version = if e.following { e.version } else { -e.version };
        inv.arg(member(e.peer_id).as_slice()).arg(version).arg(e.followed_at_ms);
    }
}
