//! Edge lookups in a cached list and, for follower windows, in the relationship hash of very
//! large accounts (`…:r`, candidate → `version:followed_at`).
//!
//! A candidate neither the window nor the hash knows is read from the database by the caller.
//! A marking lookup first marks it pending under its own nonce (`p:<nonce>`, taking over
//! another reader's pending mark), and [`ListCache::fill_relationships`] then writes the read
//! only where that mark is still there, or over an older version. An event meanwhile replaces
//! the mark with its own version, so a read older than the event loses to it; a mark evicted or
//! taken over by a later reader stops the earlier read, whose database state may be older than
//! an event applied while no mark was there.
//!
//! On a single Redis a lookup first asks the list itself (and, for a follower window, its
//! relationship hash) in one transaction ([`super::transactions`]); a following list not served
//! answers unknown there. Only what that leaves open (a list whose set and hash disagree, a
//! candidate the hash does not know, anything to be marked) goes through the LOOKUP script,
//! which marks it.

use std::collections::HashMap;

use super::{CachedEdge, ListCache, Lookup, member, ms_of, push_edges};
use crate::CacheError;

/// The pending marks of one [`ListCache::lookup_marking`]: only the
/// [`ListCache::fill_relationships`] given them fills those entries.
#[derive(Debug, Clone)]
pub struct Marks {
    nonce: String,
    /// The positions applied under the key the lookup asked for ([`ListCache::applied`]), read
    /// after the marks were set; empty when none was asked.
    pub applied: HashMap<i32, i64>,
}

/// A list's answers read ahead of a lookup, one per member asked in order: `Some(answer)`
/// where the list (or a follower window's relationship hash) answers, `None` where the
/// LOOKUP script must; `None` as a whole when the script must look at every member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed(pub(super) Option<Vec<Option<Lookup>>>);

impl ListCache {
    /// What the cache knows of `user_id`'s edge to each of `others`, in input order: from the
    /// list, else (follower windows) from the relationship hash. Marks nothing.
    ///
    /// # Errors
    /// Redis unreachable, slow or failing.
    pub async fn lookup(&self, user_id: i64, others: &[i64]) -> Result<Vec<Lookup>, CacheError> {
        Ok(self.lookup_with(user_id, others, "", None, None).await?.0)
    }

    /// [`Self::lookup`] from the list's answers read ahead
    /// ([`super::ListCaches::relationships_read`]): only what they leave open is asked.
    ///
    /// # Errors
    /// Redis unreachable, slow or failing.
    pub async fn lookup_ahead(&self, user_id: i64, others: &[i64], listed: Listed) -> Result<Vec<Lookup>, CacheError> {
        Ok(self.lookup_with(user_id, others, "", None, Some(listed)).await?.0)
    }

    /// [`Self::lookup`] that marks the unknown candidates pending for
    /// [`Self::fill_relationships`] and, with `applied_key`, reads the positions applied under
    /// it in the same round trip, after the marks (also on a cluster): the database read that
    /// fills them must cover those positions.
    ///
    /// # Errors
    /// Redis unreachable, slow or failing.
    pub async fn lookup_marking(&self, user_id: i64, others: &[i64], applied_key: Option<&str>) -> Result<(Vec<Lookup>, Marks), CacheError> {
        self.marking(user_id, others, applied_key, None).await
    }

    /// [`Self::lookup_marking`] (no positions) from the list's answers read ahead
    /// ([`super::ListCaches::relationships_read`]): only what they leave open is asked, and
    /// marked.
    ///
    /// # Errors
    /// Redis unreachable, slow or failing.
    pub async fn lookup_marking_ahead(&self, user_id: i64, others: &[i64], listed: Listed) -> Result<(Vec<Lookup>, Marks), CacheError> {
        self.marking(user_id, others, None, Some(listed)).await
    }

    async fn marking(
        &self,
        user_id: i64,
        others: &[i64],
        applied_key: Option<&str>,
        ahead: Option<Listed>,
    ) -> Result<(Vec<Lookup>, Marks), CacheError> {
        let nonce = uuid::Uuid::now_v7().simple().to_string();
        let (answers, applied) = self.lookup_with(user_id, others, &nonce, applied_key, ahead).await?;
        Ok((answers, Marks { nonce, applied }))
    }

    /// The list's answers ([`Self::listed`], or `ahead` when they were read ahead), then the
    /// LOOKUP script (marking under `nonce` unless it is empty, and reading the positions
    /// applied under `applied_key` after the marks) for the members left open. The positions
    /// are read only when the script runs: a lookup the list answers whole leaves nothing for
    /// the database to fill.
    async fn lookup_with(
        &self,
        user_id: i64,
        others: &[i64],
        nonce: &str,
        applied_key: Option<&str>,
        ahead: Option<Listed>,
    ) -> Result<(Vec<Lookup>, HashMap<i32, i64>), CacheError> {
        let listed = match ahead {
            Some(Listed(listed)) => listed,
            None => self.listed(user_id, others, !nonce.is_empty()).await?,
        };
        let listed = match listed {
            Some(listed) if listed.len() == others.len() => listed,
            _ => vec![None; others.len()],
        };
        let open: Vec<i64> = others.iter().zip(&listed).filter(|(_, l)| l.is_none()).map(|(o, _)| *o).collect();
        if open.is_empty() {
            return Ok((listed.into_iter().flatten().collect(), HashMap::new()));
        }
        let inv = self.lookup_invocation(user_id, &open, nonce);
        let (answers, applied): (Vec<Vec<u8>>, HashMap<i32, i64>) = match applied_key {
            Some(key) => {
                let mut pipe = redis::pipe();
                pipe.invoke_script(&inv).hgetall(self.keys.cache_applied(key));
                crate::query_pipeline_ordered(&self.pool, self.limits.timeout, &pipe, &[&self.scripts.lookup], 1).await?
            }
            None => (self.run(inv).await?, HashMap::new()),
        };
        let mut answers = lookups(&answers)?.into_iter();
        let merged: Option<Vec<Lookup>> = listed.into_iter().map(|l| l.or_else(|| answers.next())).collect();
        let merged = merged.ok_or_else(|| CacheError::Unavailable("LOOKUP answered fewer members than asked".into()))?;
        Ok((merged, applied))
    }

    fn lookup_invocation(&self, user_id: i64, others: &[i64], nonce: &str) -> redis::ScriptInvocation<'_> {
        let mut inv = self.invocation(&self.scripts.lookup, user_id);
        inv.arg(nonce).arg(self.ttl_secs());
        for o in others {
            inv.arg(member(*o).as_slice());
        }
        inv
    }

    /// Remembers the edges of `user_id` read from the database (version 0: no edge) for the
    /// candidates `marks` marked: each where that mark is still pending, or where the hash
    /// holds an older version. The hash is dropped when it grows past `relationship_max`.
    ///
    /// # Errors
    /// Redis unreachable, slow or failing.
    pub async fn fill_relationships(&self, user_id: i64, marks: &Marks, edges: &[CachedEdge]) -> Result<(), CacheError> {
        let mut inv = self.invocation(&self.scripts.rel_fill, user_id);
        inv.arg(&marks.nonce).arg(self.limits.relationship_max).arg(self.ttl_secs());
        push_edges(&mut inv, edges);
        self.run::<i64>(inv).await.map(|_| ())
    }
}

fn lookups(answers: &[Vec<u8>]) -> Result<Vec<Lookup>, CacheError> {
    answers
        .iter()
        .map(|a| match a.as_slice() {
            b"n" => Ok(Lookup::No),
            b"u" => Ok(Lookup::Unknown),
            score => ms_of(score).map(Lookup::Follows),
        })
        .collect()
}
