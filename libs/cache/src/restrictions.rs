//! The restriction summaries of the cache Redis (`sg:rst:{uid}`): every block, mute and
//! pending follow request a relationship read of `uid` needs (blocks by and of the user, the
//! user's mutes, requests by and to the user), so GetRelationship and BatchGetRelationships
//! answer without the database. Most users have none: their summary is the empty string.
//!
//! The value is one string: entries `kind:owner:target` (kind `b` block, `m` mute, `r`
//! request) joined by `,`; `X` when the user has more than [`MAX_ENTRIES`] (reads then go to
//! the database); `L:<nonce>` while a fill holds the lease.
//!
//! Summaries are not kept by events (restrictions have none): they are deleted after every
//! transaction that changed one, and filled again on the next read, under a lease in the way
//! of memcached's leases (Nishtala et al., "Scaling Memcache at Facebook", NSDI 2013, §3.2.1):
//! - a read of a missing summary sets `L:<nonce>` (`SET NX`) and only then reads the
//!   database; the fill stores its rows only if its lease is still the value. A write that
//!   commits after the read deletes the key (lease included) before it returns, so the read's
//!   older rows are either refused, or stored and then deleted by that write.
//! - a read that finds another fill's lease asks the database and fills nothing.
//! - the writer marks both users in `cache_stale` in the write's own transaction, so a
//!   deletion that failed (the cache Redis unreachable) or never ran (a crash after the
//!   commit) is done by the stale drain once the cache answers; a summary is therefore wrong
//!   only while the cache Redis cannot be reached by the writer, and never longer than its TTL.
//! - an evicted summary is a miss; an evicted lease lets another read fill (its own lease).

use std::sync::Arc;
use std::time::Duration;

use redis::Script;

use crate::keys::Keys;
use crate::{CacheError, Pool};

/// Most entries a summary holds; a user with more is stored as `X` and read from the database.
pub const MAX_ENTRIES: usize = 1000;

/// How long a fill's lease lives: a fill slower than this stores nothing.
pub const LEASE: Duration = Duration::from_secs(2);

/// Kinds of restriction a summary holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A block (owner blocks target).
    Block,
    /// A mute (owner mutes target).
    Mute,
    /// A pending follow request (owner asks to follow target).
    Request,
}

/// One restriction row: `owner` restricts `target` with `kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Held {
    /// Which restriction.
    pub kind: Kind,
    /// Who made it.
    pub owner: i64,
    /// Whom it is about.
    pub target: i64,
}

/// What a summary read found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SummaryRead {
    /// The user's restrictions (all of them that a relationship read of the user needs).
    Hit(Vec<Held>),
    /// Not cached, and this read now holds the lease: read the database, then
    /// [`RestrictionCache::commit`] with this nonce.
    Lease(String),
    /// Another read is filling it, or the user has too many to cache: ask the database.
    Database,
}

/// STORE: KEYS[1] the summary; ARGV = lease value, value, ttl (s). Stores the value only while
/// the lease is still there; returns 1, else 0.
const STORE: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
return 1
";

/// RELEASE: KEYS[1] the summary; ARGV = lease value. Deletes the lease if it is still there.
const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
";

/// The restriction summaries of one cache Redis. Cheap to clone.
#[derive(Clone)]
pub struct RestrictionCache {
    pool: Pool,
    keys: Keys,
    ttl: Duration,
    timeout: Duration,
    store: Arc<Script>,
    release: Arc<Script>,
}

fn encode(entries: &[Held]) -> String {
    let kind = |k: Kind| match k {
        Kind::Block => 'b',
        Kind::Mute => 'm',
        Kind::Request => 'r',
    };
    entries.iter().map(|h| format!("{}:{}:{}", kind(h.kind), h.owner, h.target)).collect::<Vec<_>>().join(",")
}

fn decode(value: &str) -> Option<Vec<Held>> {
    if value.is_empty() {
        return Some(Vec::new());
    }
    value
        .split(',')
        .map(|e| {
            let mut parts = e.splitn(3, ':');
            let kind = match parts.next()? {
                "b" => Kind::Block,
                "m" => Kind::Mute,
                "r" => Kind::Request,
                _ => return None,
            };
            Some(Held { kind, owner: parts.next()?.parse().ok()?, target: parts.next()?.parse().ok()? })
        })
        .collect()
}

impl RestrictionCache {
    /// Summaries over `pool`, keys under `keys`' prefix, each kept `ttl` after its fill, every
    /// call waiting at most `timeout`.
    pub fn new(pool: Pool, keys: Keys, ttl: Duration, timeout: Duration) -> Self {
        Self { pool, keys, ttl, timeout, store: Arc::new(Script::new(STORE)), release: Arc::new(Script::new(RELEASE)) }
    }

    /// Reads `user_id`'s summary; when it is missing, takes the lease to fill it.
    ///
    /// # Errors
    /// The cache Redis is unreachable, slow or failing (the caller reads the database).
    pub async fn read(&self, user_id: i64) -> Result<SummaryRead, CacheError> {
        let mut pipe = redis::pipe();
        let nonce = self.ask(&mut pipe, user_id);
        let (found,): (Option<String>,) = crate::within(self.timeout, async {
            let mut conn = crate::conn(&self.pool).await?;
            Ok(pipe.query_async(&mut conn).await?)
        })
        .await?;
        self.found(user_id, nonce, found).await
    }

    /// Adds the command of [`Self::read`] to `pipe`: `SET … NX GET PX` of a new lease on
    /// `user_id`'s summary (the value comes back; a missing one is now the lease). Returns the
    /// lease's nonce, for [`Self::found`].
    pub(crate) fn ask(&self, pipe: &mut redis::Pipeline, user_id: i64) -> String {
        let nonce = uuid::Uuid::now_v7().simple().to_string();
        let lease = format!("L:{nonce}");
        pipe.cmd("SET").arg(self.keys.restrictions(user_id)).arg(&lease).arg("NX").arg("GET").arg("PX").arg(LEASE.as_millis() as u64);
        nonce
    }

    /// What [`Self::ask`]'s reply `found` means: a miss now holds the lease `nonce`; a
    /// malformed summary is deleted and left to the database.
    ///
    /// # Errors
    /// The deletion of a malformed summary failed.
    pub(crate) async fn found(&self, user_id: i64, nonce: String, found: Option<String>) -> Result<SummaryRead, CacheError> {
        Ok(match found {
            None => SummaryRead::Lease(nonce),
            Some(v) if v == "X" || v.starts_with("L:") => SummaryRead::Database,
            Some(v) => match decode(&v) {
                Some(entries) => SummaryRead::Hit(entries),
                None => {
                    self.forget(&[user_id]).await?;
                    SummaryRead::Database
                }
            },
        })
    }

    /// Stores `entries` (`None`: more than [`MAX_ENTRIES`]) as `user_id`'s summary if the
    /// lease `nonce` still holds it; true when stored.
    ///
    /// # Errors
    /// The cache Redis is unreachable, slow or failing.
    pub async fn commit(&self, user_id: i64, nonce: &str, entries: Option<&[Held]>) -> Result<bool, CacheError> {
        let value = match entries {
            Some(e) if e.len() <= MAX_ENTRIES => encode(e),
            _ => "X".to_string(),
        };
        let mut inv = self.store.key(self.keys.restrictions(user_id));
        inv.arg(format!("L:{nonce}")).arg(value).arg(self.ttl.as_secs().max(1));
        let stored: i64 = crate::within(self.timeout, async {
            let mut conn = crate::conn(&self.pool).await?;
            Ok(inv.invoke_async(&mut conn).await?)
        })
        .await?;
        Ok(stored == 1)
    }

    /// Gives back the lease `nonce` on `user_id`'s summary without filling it (a reader that
    /// cannot fill now); a lease taken over or gone meanwhile is left alone.
    ///
    /// # Errors
    /// The cache Redis is unreachable, slow or failing (the lease then expires after [`LEASE`]).
    pub async fn release(&self, user_id: i64, nonce: &str) -> Result<(), CacheError> {
        let mut inv = self.release.key(self.keys.restrictions(user_id));
        inv.arg(format!("L:{nonce}"));
        crate::within(self.timeout, async {
            let mut conn = crate::conn(&self.pool).await?;
            let _: i64 = inv.invoke_async(&mut conn).await?;
            Ok(())
        })
        .await
    }

    /// Deletes the summaries of `users` (leases included), after a transaction that changed a
    /// restriction of theirs committed.
    ///
    /// # Errors
    /// The cache Redis is unreachable, slow or failing (the stale drain deletes them later).
    pub async fn forget(&self, users: &[i64]) -> Result<(), CacheError> {
        if users.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for u in users {
            pipe.del(self.keys.restrictions(*u)).ignore();
        }
        crate::query_pipeline(&self.pool, self.timeout, &pipe, &[]).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_round_trip() {
        let held = vec![
            Held { kind: Kind::Block, owner: 1, target: 2 },
            Held { kind: Kind::Mute, owner: 1, target: 9_007_199_254_740_993 },
            Held { kind: Kind::Request, owner: 3, target: 1 },
        ];
        assert_eq!(decode(&encode(&held)), Some(held));
        assert_eq!(decode(&encode(&[])), Some(Vec::new()));
        assert_eq!(decode("b:1"), None, "a truncated entry is malformed");
        assert_eq!(decode("q:1:2"), None, "an unknown kind is malformed");
    }
}
