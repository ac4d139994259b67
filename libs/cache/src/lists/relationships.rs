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

impl ListCache {
    /// What the cache knows of `user_id`'s edge to each of `others`, in input order: from the
    /// list, else (follower windows) from the relationship hash. Marks nothing.
    ///
    /// # Errors
    /// Redis unreachable, slow or failing.
    pub async fn lookup(&self, user_id: i64, others: &[i64]) -> Result<Vec<Lookup>, CacheError> {
        let answers: Vec<Vec<u8>> = self.run(self.lookup_invocation(user_id, others, "")).await?;
        lookups(&answers)
    }

    /// [`Self::lookup`] that marks the unknown candidates pending for
    /// [`Self::fill_relationships`] and, with `applied_key`, reads the positions applied under
    /// it in the same round trip, after the marks (also on a cluster): the database read that
    /// fills them must cover those positions.
    ///
    /// # Errors
    /// Redis unreachable, slow or failing.
    pub async fn lookup_marking(&self, user_id: i64, others: &[i64], applied_key: Option<&str>) -> Result<(Vec<Lookup>, Marks), CacheError> {
        let nonce = uuid::Uuid::now_v7().simple().to_string();
        let inv = self.lookup_invocation(user_id, others, &nonce);
        let (answers, applied): (Vec<Vec<u8>>, HashMap<i32, i64>) = match applied_key {
            Some(key) => {
                let mut pipe = redis::pipe();
                pipe.invoke_script(&inv).hgetall(self.keys.cache_applied(key));
                crate::query_pipeline_ordered(&self.pool, self.limits.timeout, &pipe, &[&self.scripts.lookup], 1).await?
            }
            None => (self.run(inv).await?, HashMap::new()),
        };
        Ok((lookups(&answers)?, Marks { nonce, applied }))
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
