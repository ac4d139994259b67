//! Reads of a cached list answered by one MULTI/EXEC on a single Redis instead of a script:
//! first pages (ZREVRANGE) and relationship lookups (ZMSCORE; in follower windows also HMGET
//! on the relationship hash).
//!
//! Each transaction reads the list's state and `_n` (HMGET) and its ZCARD beside what it asks
//! for. Redis runs a transaction's commands back to back, with no eviction between them (it
//! evicts before a command, and EXEC is one), so the `ZCARD = _n` check of the scripts holds
//! for what was read with it. A served list (`c` or `w`) whose set and hash agree answers; a
//! list with no served state (not cached, being filled, too long) is a miss, as the scripts
//! would answer it without changing anything; a served state whose counts disagree (one key
//! evicted) goes to the script, which deletes both keys. So a miss costs one round trip, not
//! two (the transaction, then a script that found nothing either). A follower
//! window's lookup also reads the relationship hash, which answers what the window does not
//! (as in the script) whether or not the window is served; only a candidate the hash does not
//! know, or that a reader marked pending, goes to the script.
//!
//! What it saves is Lua: a script's time goes mostly into passing members and replies through
//! it. Redis time per call (`INFO commandstats`, Redis 7.0, best of 3 × 300, transaction
//! against script), on complete lists:
//! - lookup of 100 members in a list of 10, 400 or 2,000: 21–27 µs against 65–79; in a list
//!   of 30–128 (a listpack, which ZMSCORE scans per member while the script reads it whole):
//!   45–110 against 61–127; of 10 members: 4–12 against 16–26;
//! - first page of 50: 23–26 µs against 51–60 (lists of 120–2,000), 6.5 against 17 (of 10).
//!
//! GetRelationship and BatchGetRelationships ask three caches of one user (the following list,
//! the follower window with its relationship hash, the restriction summary): on a single Redis
//! their three reads go in one transaction ([`ListCaches::relationships_read`]), decided by the
//! same functions as the reads alone.
//!
//! A cluster connection sends no MULTI (`crate::cluster`), so there every read is the script.

use redis::{FromRedisValue, Pipeline};

use super::{ListCache, ListCaches, Listed, Lookup, PageRead, member};
use crate::restrictions::SummaryRead;
use crate::{CacheError, Conn};

/// A list's state and `_n` (HMGET of the versions hash).
type Head = (Option<Vec<u8>>, Option<i64>);

/// What a transaction found of a list.
enum Served<T> {
    /// Served (state `c`, `complete`, or `w`) with its set and hash in agreement, and the reply
    /// read with them.
    Yes { complete: bool, reply: T },
    /// Not served: no state (not cached, or evicted), being filled (`f:…`) or too long (`x`).
    /// PAGE answers such a list as not cached and changes nothing, and so does LOOKUP unless
    /// it marks candidates.
    No,
    /// The script must decide: a served state whose set and hash disagree (one key was
    /// evicted; the script deletes both), or a cluster connection (no MULTI).
    AskTheScript,
}

impl ListCache {
    /// A connection for commands that need a single Redis (MULTI/EXEC, a script over two
    /// users' keys, [`super::joins`]); `None` on a cluster, whose connection sends no MULTI.
    pub(super) async fn single_conn(&self) -> Result<Option<Conn>, CacheError> {
        let conn = crate::conn(&self.pool).await?;
        Ok(matches!(conn, Conn::Single(_)).then_some(conn))
    }

    /// Runs a transaction of the list's state, `_n`, ZCARD and the commands `ask` adds on the
    /// sorted set (given its key): what the list is ([`Served`]) with the reply of ask's last
    /// command.
    async fn transact<T: FromRedisValue>(&self, user_id: i64, ask: impl FnOnce(&mut Pipeline, &str)) -> Result<Served<T>, CacheError> {
        let Some(mut conn) = self.single_conn().await? else { return Ok(Served::AskTheScript) };
        let [set, versions, _] = self.list_keys(user_id);
        let mut pipe = redis::pipe();
        ask_head(pipe.atomic(), &versions, &set);
        ask(&mut pipe, &set);
        let (head, card, reply): (Head, i64, T) = crate::within(self.limits.timeout, async { Ok(pipe.query_async(&mut conn).await?) }).await?;
        Ok(served(head, card, reply))
    }

    /// What `user_id`'s list itself says of each of `others`: `Some(answer)` for a member of
    /// the list, and for every member when the list is complete (not followed); `None` for a
    /// member a window does not hold. A following list that is not served answers `Unknown`
    /// for all when nothing is to be marked (`marking` false), as the script would: only a
    /// marking lookup writes its relationship hash, so without one it has none. A follower
    /// window also asks its relationship hash in the same transaction ([`Self::window_known`]).
    /// `None` as a whole when the script must look (set and hash disagree, or a list not
    /// served whose candidates are to be marked), when a reply is short, on a cluster, and for
    /// no members.
    pub(super) async fn listed(&self, user_id: i64, others: &[i64], marking: bool) -> Result<Option<Vec<Option<Lookup>>>, CacheError> {
        if others.is_empty() {
            return Ok(None);
        }
        if self.direction == super::Direction::Followers {
            return self.window_known(user_id, others).await;
        }
        let read = self.transact::<Vec<Option<f64>>>(user_id, |pipe, set| ask_scores(pipe, set, others)).await?;
        Ok(listed_of(read, others.len(), marking))
    }

    /// What `user_id`'s follower window and its relationship hash say of each of `others`,
    /// read in one transaction (state, `_n`, ZCARD, ZMSCORE on the window, HMGET on the hash),
    /// decided as the LOOKUP script decides: a member of a served window follows; a member a
    /// complete window lacks does not; anything else is the hash's entry (`version:followed_at`,
    /// version 0 for no edge), and `None` (ask the script, which marks it, then the database)
    /// when the hash has none or a reader's pending mark. `None` as a whole on a cluster.
    ///
    /// This is BatchGetRelationships' followed-by side and BatchCheckFollowers: once warm, the
    /// hash answers them when the window is not cached, and a script spent most of its Redis
    /// time passing 100 members through Lua (see the module doc); the script now runs only for
    /// the members left open, which the database is read for anyway.
    async fn window_known(&self, user_id: i64, others: &[i64]) -> Result<Option<Vec<Option<Lookup>>>, CacheError> {
        let Some(mut conn) = self.single_conn().await? else { return Ok(None) };
        let mut pipe = redis::pipe();
        self.ask_window(pipe.atomic(), user_id, others);
        let read: WindowRead = crate::within(self.limits.timeout, async { Ok(pipe.query_async(&mut conn).await?) }).await?;
        window_answers(read, others.len())
    }

    /// Adds the commands of [`Self::window_known`] to `pipe`: the window's state, `_n`, ZCARD,
    /// ZMSCORE of `others`, then HMGET of `others` on its relationship hash ([`WindowRead`]).
    fn ask_window(&self, pipe: &mut Pipeline, user_id: i64, others: &[i64]) {
        let [set, versions, relationships] = self.list_keys(user_id);
        ask_head(pipe, &versions, &set);
        ask_scores(pipe, &set, others);
        pipe.cmd("HMGET").arg(&relationships);
        for o in others {
            pipe.arg(member(*o).as_slice());
        }
    }

    /// The first `limit` entries of `user_id`'s list, as [`Self::page`] answers them without a
    /// cursor; `None` when the script must read it (set and hash disagree), on a cluster, or for
    /// `limit` 0.
    pub(super) async fn first_page(&self, user_id: i64, limit: usize) -> Result<Option<PageRead>, CacheError> {
        let Some(last) = limit.checked_sub(1) else { return Ok(None) };
        let read = self.transact::<Vec<(Vec<u8>, f64)>>(user_id, |pipe, set| {
            pipe.cmd("ZREVRANGE").arg(set).arg(0).arg(last).arg("WITHSCORES");
        });
        let (complete, pairs) = match read.await? {
            Served::Yes { complete, reply } => (complete, reply),
            Served::No => return Ok(Some(PageRead::Miss)),
            Served::AskTheScript => return Ok(None),
        };
        let entries = pairs.iter().map(|(m, ms)| Ok((super::id_of(m)?, *ms as i64))).collect::<Result<Vec<_>, CacheError>>()?;
        Ok(Some(if !complete && entries.len() < limit { PageRead::PastWindow(entries) } else { PageRead::Hit(entries) }))
    }
}

/// What one transaction read of a user's three cached parts of a relationship read: its
/// following list, its follower window with the relationship hash, and its restriction
/// summary ([`ListCaches::relationships_read`]).
#[derive(Debug)]
pub struct RelationshipsRead {
    /// What the following list says, for [`ListCache::lookup_ahead`] on the following cache.
    pub following: Listed,
    /// What the follower window and its relationship hash say, for
    /// [`ListCache::lookup_marking_ahead`] on the follower cache.
    pub followers: Listed,
    /// The restriction summary (a miss took its lease, as
    /// [`crate::restrictions::RestrictionCache::read`] does).
    pub restrictions: SummaryRead,
}

impl ListCaches {
    /// GetRelationship's and BatchGetRelationships' reads of `user_id`'s caches in one
    /// MULTI/EXEC: the following list's state, `_n`, ZCARD and ZMSCORE of `others` (as
    /// [`ListCache::lookup`] starts), the follower window's and its relationship hash's (as
    /// [`ListCache::lookup_marking`] starts), and the restriction summary's `SET NX GET` (as
    /// [`crate::restrictions::RestrictionCache::read`]). It saves two round trips of the
    /// three, each with its own connection checkout, timer and reply parse; the parts are
    /// decided by the same functions as the three calls, and what a part leaves open goes on
    /// through its own script.
    ///
    /// `None` on a cluster (its connection sends no MULTI) and for no `others`: the caller asks
    /// each cache itself.
    ///
    /// # Errors
    /// The cache Redis is unreachable, slow or failing: all three parts are unknown.
    pub async fn relationships_read(&self, user_id: i64, others: &[i64]) -> Result<Option<RelationshipsRead>, CacheError> {
        if others.is_empty() {
            return Ok(None);
        }
        let Some(mut conn) = self.following.single_conn().await? else { return Ok(None) };
        let [set, versions, _] = self.following.list_keys(user_id);
        let mut pipe = redis::pipe();
        ask_head(pipe.atomic(), &versions, &set);
        ask_scores(&mut pipe, &set, others);
        self.followers.ask_window(&mut pipe, user_id, others);
        let nonce = self.restrictions.ask(&mut pipe, user_id);
        type Read = (Head, i64, Vec<Option<f64>>, Head, i64, Vec<Option<f64>>, Vec<Option<Vec<u8>>>, Option<String>);
        let (head, card, scores, w_head, w_card, w_scores, known, summary): Read =
            crate::within(self.following.limits.timeout, async { Ok(pipe.query_async(&mut conn).await?) }).await?;
        Ok(Some(RelationshipsRead {
            following: Listed(listed_of(served(head, card, scores), others.len(), false)),
            followers: Listed(window_answers((w_head, w_card, w_scores, known), others.len())?),
            restrictions: self.restrictions.found(user_id, nonce, summary).await?,
        }))
    }
}

/// Adds HMGET of a list's state and `_n` ([`Head`]) and its ZCARD to `pipe`.
fn ask_head(pipe: &mut Pipeline, versions: &str, set: &str) {
    pipe.cmd("HMGET").arg(versions).arg("_s").arg("_n").cmd("ZCARD").arg(set);
}

/// Adds ZMSCORE of `others` on the sorted set `set` to `pipe`.
fn ask_scores(pipe: &mut Pipeline, set: &str, others: &[i64]) {
    pipe.cmd("ZMSCORE").arg(set);
    for o in others {
        pipe.arg(member(*o).as_slice());
    }
}

/// What a list read with its [`Head`] and ZCARD `card` is, with `reply`.
fn served<T>((state, n): Head, card: i64, reply: T) -> Served<T> {
    let complete = match state.as_deref() {
        Some(b"c") => true,
        Some(b"w") => false,
        _ => return Served::No,
    };
    if n == Some(card) { Served::Yes { complete, reply } } else { Served::AskTheScript }
}

/// A following list's answers ([`ListCache::listed`]) from the ZMSCORE of `count` members read
/// with its state: scores arrive as f64 (a bulk string, or a double on RESP3) and are cast as
/// `ms_of` casts them.
fn listed_of(read: Served<Vec<Option<f64>>>, count: usize, marking: bool) -> Option<Vec<Option<Lookup>>> {
    match read {
        Served::Yes { complete, reply: scores } if scores.len() == count => {
            Some(scores.into_iter().map(|score| score.map_or(complete.then_some(Lookup::No), |ms| Some(Lookup::Follows(ms as i64)))).collect())
        }
        Served::No if !marking => Some(vec![Some(Lookup::Unknown); count]),
        Served::Yes { .. } | Served::No | Served::AskTheScript => None,
    }
}

/// The replies of [`ListCache::ask_window`]: the window's [`Head`], ZCARD, ZMSCORE and the
/// relationship hash's HMGET.
type WindowRead = (Head, i64, Vec<Option<f64>>, Vec<Option<Vec<u8>>>);

/// A follower window's answers ([`ListCache::window_known`]) for `count` members.
fn window_answers((head, card, scores, known): WindowRead, count: usize) -> Result<Option<Vec<Option<Lookup>>>, CacheError> {
    if scores.len() != count || known.len() != count {
        return Ok(None);
    }
    let (served, complete) = match served(head, card, ()) {
        Served::Yes { complete, .. } => (true, complete),
        Served::No | Served::AskTheScript => (false, false),
    };
    scores
        .into_iter()
        .zip(known)
        .map(|(score, entry)| match (score, entry) {
            (Some(ms), _) if served => Ok(Some(Lookup::Follows(ms as i64))),
            _ if complete => Ok(Some(Lookup::No)),
            (_, Some(entry)) => remembered(&entry),
            (_, None) => Ok(None),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// A relationship hash entry: `version:followed_at` (version 0 or less: no edge) → the answer;
/// a reader's pending mark (`p:<nonce>`) → `None`.
fn remembered(entry: &[u8]) -> Result<Option<Lookup>, CacheError> {
    if entry.first() == Some(&b'p') {
        return Ok(None);
    }
    let malformed = || CacheError::Unavailable("malformed relationship entry".into());
    let at = entry.iter().position(|b| *b == b':').ok_or_else(malformed)?;
    let version: i64 = std::str::from_utf8(&entry[..at]).ok().and_then(|v| v.parse().ok()).ok_or_else(malformed)?;
    Ok(Some(if version > 0 { Lookup::Follows(super::ms_of(&entry[at + 1..])?) } else { Lookup::No }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relationship_entry_reads_as_the_lookup_script_reads_it() {
        assert_eq!(remembered(b"3:1700000000000").ok(), Some(Some(Lookup::Follows(1_700_000_000_000))), "a following edge");
        assert_eq!(remembered(b"0:0").ok(), Some(Some(Lookup::No)), "no edge");
        assert_eq!(remembered(b"-4:1700000000000").ok(), Some(Some(Lookup::No)), "an unfollowed edge");
        assert_eq!(remembered(b"p:0190aa").ok(), Some(None), "a pending mark is not known");
        assert!(remembered(b"garbage").is_err(), "malformed");
    }
}
