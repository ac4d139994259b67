//! The bulk import (ImportFollows): validated chunks of edges, each written with its events in
//! one transaction of multi-row statements (on PostgreSQL the new edges as arrays).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use sea_orm::{ConnectionTrait, DatabaseTransaction, DbBackend};
use socialgraph_domain::{Edge, EdgeState};
use socialgraph_proto::events::v1::RelationEventKind;
use socialgraph_server::ApiResult;
use socialgraph_storage::edges::{self, EdgeTable};
use socialgraph_storage::outbox;
use socialgraph_storage::{accounts, cas};

use crate::service::{Relations, TxError, in_tx, now_ms};

/// Counts of one import.
#[derive(Debug, Clone, Copy, Default)]
pub struct ImportCounts {
    /// Edges received.
    pub received: i64,
    /// Edges that became "following".
    pub imported: i64,
    /// Self-loops skipped.
    pub skipped_self_loops: i64,
    /// Edges already followed, skipped.
    pub skipped_duplicates: i64,
    /// Edges of a blocked pair, skipped.
    pub skipped_blocked: i64,
    /// Edges of a user whose account is not active, skipped.
    pub skipped_inactive: i64,
}

/// One edge to import: (follower, followee, followed_at_ms).
pub type ImportEdge = (i64, i64, i64);

impl Relations {
    /// Imports one chunk of already validated edges in one transaction.
    ///
    /// # Errors
    /// UNAVAILABLE or INTERNAL on database failure (the chunk is then not written).
    pub async fn import_chunk(&self, chunk: &[ImportEdge]) -> ApiResult<ImportCounts> {
        let (wanted, mut counts) = dedup_import(chunk);
        let (written, dups, blocked, inactive) = in_tx!(self, txn => self.import_tx(&txn, &wanted).await);
        let imported = written.len() as i64;
        counts.imported = imported;
        counts.skipped_duplicates += dups;
        counts.skipped_blocked = blocked;
        counts.skipped_inactive = inactive;
        if imported > 0 {
            self.relay_wake.notify_one();
            self.write_through_edges(&written).await;
        }
        Ok(counts)
    }

    /// Writes one chunk: on PostgreSQL the edges that are new in one array statement first;
    /// then the rest (all of them elsewhere) read and locked, re-follows updated, repeats
    /// counted, blocked pairs (whose rows a block always created) skipped; the events of all in
    /// one multi-row insert, in (follower, followee) order. Edges of inactive accounts are left
    /// out, and checked again after the writes (see `lifecycle`): an account that became
    /// inactive meanwhile makes the transaction run again. Returns (imported, repeats, blocked,
    /// inactive), the first as the edges written.
    async fn import_tx(&self, txn: &DatabaseTransaction, wanted: &BTreeMap<(i64, i64), i64>) -> Result<(Vec<Edge>, i64, i64, i64), TxError> {
        let now = now_ms();
        let users: Vec<i64> = wanted.keys().flat_map(|&(f, e)| [f, e]).collect::<BTreeSet<i64>>().into_iter().collect();
        let inactive = accounts::inactive_among(txn, &users).await?;
        let all = wanted.len();
        let kept: BTreeMap<(i64, i64), i64>;
        let wanted = if inactive.is_empty() {
            wanted
        } else {
            kept = wanted.iter().filter(|((f, e), _)| !inactive.contains(f) && !inactive.contains(e)).map(|(&k, &v)| (k, v)).collect();
            &kept
        };
        let skipped_inactive = (all - wanted.len()) as i64;
        let inserted: HashSet<(i64, i64)> = if txn.get_database_backend() == DbBackend::Postgres {
            let new: Vec<(i64, i64, i64)> = wanted.iter().map(|(&(f, e), &at)| (f, e, at)).collect();
            cas::insert_new_edges(txn, &new, now).await?.into_iter().collect()
        } else {
            HashSet::new()
        };
        let rest: Vec<(i64, i64)> = wanted.keys().filter(|p| !inserted.contains(p)).copied().collect();
        let existing: HashMap<(i64, i64), Edge> =
            edges::get_many(txn, EdgeTable::Following, &rest, true).await?.into_iter().map(|e| ((e.follower_id, e.followee_id), e)).collect();
        let blocked = if rest.is_empty() { HashSet::new() } else { edges::blocked_among(txn, &rest).await? };
        let (mut inserts, mut changes, mut written, mut dups) = (Vec::new(), Vec::new(), Vec::new(), 0_i64);
        for (&(follower_id, followee_id), &at) in wanted {
            if inserted.contains(&(follower_id, followee_id)) {
                let edge = Edge::followed(follower_id, followee_id, None, at, now);
                changes.push((edge, RelationEventKind::Followed));
                written.push(edge);
                continue;
            }
            if blocked.contains(&(follower_id, followee_id)) {
                continue;
            }
            let old = existing.get(&(follower_id, followee_id));
            if old.is_some_and(|e| e.state == EdgeState::Following) {
                dups += 1;
                continue;
            }
            let edge = Edge::followed(follower_id, followee_id, old, at, now);
            match old {
                Some(_) => edges::update(txn, EdgeTable::Following, &edge).await?,
                None => inserts.push(edge),
            }
            changes.push((edge, RelationEventKind::Followed));
            written.push(edge);
        }
        edges::insert(txn, EdgeTable::Following, &inserts).await?;
        let events = self.edge_events(txn, &changes, now).await?;
        outbox::insert(txn, &events).await?;
        if !events.is_empty() && accounts::inactive_among(txn, &users).await?.len() > inactive.len() {
            return Err(TxError::Raced);
        }
        Ok((written, dups, blocked.len() as i64, skipped_inactive))
    }

    /// Import batch size from config.
    pub fn import_batch_size(&self) -> usize {
        self.config.limits.import_batch_size.max(1)
    }
}

/// The edges of one import chunk to write, keyed (follower, followee) → followed_at_ms, and the
/// counts of what was dropped: self-loops, and repeats of an edge (the first occurrence wins,
/// as it does across chunks, where later ones find the row).
pub fn dedup_import(chunk: &[ImportEdge]) -> (BTreeMap<(i64, i64), i64>, ImportCounts) {
    let mut counts = ImportCounts { received: chunk.len() as i64, ..Default::default() };
    let mut wanted: BTreeMap<(i64, i64), i64> = BTreeMap::new();
    for &(fr, fe, at) in chunk {
        if fr == fe {
            counts.skipped_self_loops += 1;
        } else if let std::collections::btree_map::Entry::Vacant(e) = wanted.entry((fr, fe)) {
            e.insert(at);
        } else {
            counts.skipped_duplicates += 1;
        }
    }
    (wanted, counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_import_chunk_drops_self_loops_and_keeps_the_first_of_repeated_edges() {
        let (wanted, counts) = dedup_import(&[(1, 2, 10), (3, 3, 11), (1, 2, 12), (2, 1, 13), (1, 2, 14)]);
        assert_eq!(wanted.into_iter().collect::<Vec<_>>(), [((1, 2), 10), ((2, 1), 13)]);
        assert_eq!((counts.received, counts.skipped_self_loops, counts.skipped_duplicates, counts.imported), (5, 1, 2, 0));
    }
}
