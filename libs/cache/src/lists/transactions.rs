//! Reads of a cached list answered by one MULTI/EXEC on a single Redis instead of a script:
//! first pages (ZREVRANGE) and, in following lists, relationship lookups (ZMSCORE).
//!
//! Each transaction reads the list's state and `_n` (HMGET) and its ZCARD beside what it asks
//! for. Redis runs a transaction's commands back to back, with no eviction between them (it
//! evicts before a command, and EXEC is one), so the `ZCARD = _n` check of the scripts holds
//! for what was read with it. Only a served list (`c` or `w`) whose set and hash agree answers;
//! anything else (not cached, being filled, too long, one key evicted) goes to the script, which
//! deletes both keys when a state is there but the counts disagree. That costs a list that is
//! not served one more round trip, beside the database read it needs anyway.
//!
//! What it saves is Lua: a script's time goes mostly into passing members and replies through
//! it. Redis time per call (`INFO commandstats`, Redis 7.0, best of 3 × 300, transaction
//! against script), on complete lists:
//! - lookup of 100 members in a list of 10, 400 or 2,000: 21–27 µs against 65–79; in a list
//!   of 30–128 (a listpack, which ZMSCORE scans per member while the script reads it whole):
//!   45–110 against 61–127; of 10 members: 4–12 against 16–26;
//! - first page of 50: 23–26 µs against 51–60 (lists of 120–2,000), 6.5 against 17 (of 10).
//!
//! A cluster connection sends no MULTI (`crate::cluster`), so there every read is the script.

use redis::{FromRedisValue, Pipeline};

use super::{ListCache, Lookup, PageRead, member};
use crate::{CacheError, Conn};

/// A list's state and `_n` (HMGET of the versions hash).
type Head = (Option<Vec<u8>>, Option<i64>);

impl ListCache {
    /// Runs a transaction of the list's state, `_n`, ZCARD and the commands `ask` adds on the
    /// sorted set (given its key). `Some((complete, reply of ask's last command))` when the
    /// list is served and consistent (`complete`: state `c`, else a window); `None` when it is
    /// not, or on a cluster.
    async fn transact<T: FromRedisValue>(&self, user_id: i64, ask: impl FnOnce(&mut Pipeline, &str)) -> Result<Option<(bool, T)>, CacheError> {
        let mut conn = crate::conn(&self.pool).await?;
        if !matches!(conn, Conn::Single(_)) {
            return Ok(None);
        }
        let [set, versions, _] = self.list_keys(user_id);
        let mut pipe = redis::pipe();
        pipe.atomic().cmd("HMGET").arg(&versions).arg("_s").arg("_n").cmd("ZCARD").arg(&set);
        ask(&mut pipe, &set);
        let ((state, n), card, reply): (Head, i64, T) = crate::within(self.limits.timeout, async { Ok(pipe.query_async(&mut conn).await?) }).await?;
        let complete = match state.as_deref() {
            Some(b"c") => true,
            Some(b"w") => false,
            _ => return Ok(None),
        };
        Ok((n == Some(card)).then_some((complete, reply)))
    }

    /// What `user_id`'s list itself says of each of `others`: `Some(answer)` for a member of
    /// the list, and for every member when the list is complete (not followed); `None` for a
    /// member a window does not hold. `None` as a whole when the list is not served, on a
    /// cluster, for no members, and for follower windows.
    ///
    /// Follower windows are left to the script: when the window is not cached, their
    /// relationship hash answers instead, which the transaction does not read, so it would cost
    /// a round trip for nothing. That is the common case of BatchGetRelationships, whose
    /// followed-by side no reader fills: asking the window first made it slower in the cache
    /// bench (Wiki-Vote, warm p50 0.77 and 0.93 ms against 0.66).
    pub(super) async fn listed(&self, user_id: i64, others: &[i64]) -> Result<Option<Vec<Option<Lookup>>>, CacheError> {
        if others.is_empty() || self.direction == super::Direction::Followers {
            return Ok(None);
        }
        // Scores as f64 (from a bulk string, or a double on RESP3), cast as `ms_of` does.
        let read = self
            .transact::<Vec<Option<f64>>>(user_id, |pipe, set| {
                pipe.cmd("ZMSCORE").arg(set);
                for o in others {
                    pipe.arg(member(*o).as_slice());
                }
            })
            .await?;
        Ok(read.filter(|(_, scores)| scores.len() == others.len()).map(|(complete, scores)| {
            scores.into_iter().map(|score| score.map_or(complete.then_some(Lookup::No), |ms| Some(Lookup::Follows(ms as i64)))).collect()
        }))
    }

    /// The first `limit` entries of `user_id`'s list, as [`Self::page`] answers them without a
    /// cursor; `None` when the list is not served, on a cluster, or for `limit` 0.
    pub(super) async fn first_page(&self, user_id: i64, limit: usize) -> Result<Option<PageRead>, CacheError> {
        let Some(last) = limit.checked_sub(1) else { return Ok(None) };
        let read = self.transact::<Vec<(Vec<u8>, f64)>>(user_id, |pipe, set| {
            pipe.cmd("ZREVRANGE").arg(set).arg(0).arg(last).arg("WITHSCORES");
        });
        let Some((complete, pairs)) = read.await? else { return Ok(None) };
        let entries = pairs.iter().map(|(m, ms)| Ok((super::id_of(m)?, *ms as i64))).collect::<Result<Vec<_>, CacheError>>()?;
        Ok(Some(if !complete && entries.len() < limit { PageRead::PastWindow(entries) } else { PageRead::Hit(entries) }))
    }
}
