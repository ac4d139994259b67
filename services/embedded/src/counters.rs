//! Counters of the embedded mode in SQL tables, beside the facts they count.
//!
//! - `user_counter` — one row per user: followings and followers with the version each was
//!   copied at, posts, likes and favourites received.
//! - `action_fact` — one row per (entity, metric, actor) that is active: the fact of "who
//!   liked"; `owner_id` as given by the first toggle.
//! - `entity_counter` — like and favourite counts per entity and a per-entity `seq` bumped by
//!   every change (the ActionEvent's `sequence`).
//!
//! Follow counts move by counter-svc's own consumers ([`EdgeCountCounter`](socialgraph_counter::consume::EdgeCountCounter),
//! [`FollowingsCounter`](socialgraph_counter::consume::FollowingsCounter)) over [`SqlFollowCounts`]:
//! the newest version of relation-svc's followings and of projection-svc's followers wins, as in
//! Redis (docs/src/architecture/embedded.md#counters). A toggle changes the fact, the entity's
//! counts, the owner's received count and writes its ActionEvent to the outbox in one
//! transaction, so none of them can drift. A user's row is created only by a rebuild (its first
//! read), which counts every counter from the facts in one transaction, each follow count with
//! the version of the row it comes from; every other writer updates rows that exist.

use std::collections::HashMap;
use std::sync::Arc;

use prost::Message;
use sea_orm::{ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr, Statement, Value};
use socialgraph_cache::counters::{FIELDS, Sds};
use socialgraph_counter::backend::CounterBackend;
use socialgraph_counter::consume::FollowCountStore;
use socialgraph_counter::entities::{FAV, LIKE, Toggled, action_event, entity_counts};
use socialgraph_counter::store::{EdgeCounts, Followings};
use socialgraph_domain::ConsistencyToken;
use socialgraph_events::consumer::BoxError;
use socialgraph_proto::counter::v1 as pb;
use socialgraph_proto::events::v1::Metric;
use socialgraph_server::ApiResult;
use socialgraph_server::db_error;
use socialgraph_storage::offsets::{self, StoredOffset};
use socialgraph_storage::outbox::{self, NewOutboxRow};
use tokio::sync::Notify;

/// Retries of a transaction that met a busy database.
const MAX_RETRIES: usize = 50;
/// Ids per `IN (…)` list.
const CHUNK: usize = 500;

fn stmt(sql: &str, values: Vec<Value>) -> Statement {
    Statement::from_sql_and_values(DbBackend::Sqlite, sql, values)
}

fn placeholders(n: usize) -> String {
    vec!["?"; n].join(", ")
}

/// Runs `body` in a transaction, retrying it while SQLite reports a busy database.
async fn in_tx<T, F>(db: &DatabaseConnection, body: F) -> Result<T, DbErr>
where
    F: for<'t> Fn(&'t DatabaseTransaction) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, DbErr>> + Send + 't>>,
{
    socialgraph_storage::retry_tx(MAX_RETRIES, || async {
        let txn = socialgraph_storage::begin_write(db).await?;
        match body(&txn).await {
            Ok(v) => txn.commit().await.map(|()| v),
            Err(e) => {
                let _ = txn.rollback().await;
                Err(e)
            }
        }
    })
    .await
}

async fn count<C: ConnectionTrait>(conn: &C, sql: &str, values: Vec<Value>) -> Result<i64, DbErr> {
    Ok(conn.query_one_raw(stmt(sql, values)).await?.map(|r| r.try_get_by_index::<i64>(0)).transpose()?.unwrap_or(0))
}

fn clamp(v: i64) -> u32 {
    v.clamp(0, i64::from(u32::MAX)) as u32
}

/// CounterService's backend on SQL tables.
pub struct SqlCounters {
    /// The SQLite database.
    pub db: DatabaseConnection,
    /// Topic name of action events in the log.
    pub counter_topic: String,
    /// Woken after a toggle commits (the embedded mode forwards it to every log reader).
    pub wake: Arc<Notify>,
}

impl SqlCounters {
    async fn read(&self, user_ids: &[i64]) -> Result<HashMap<i64, Sds>, DbErr> {
        let mut out = HashMap::new();
        for chunk in user_ids.chunks(CHUNK) {
            let sql = format!(
                "SELECT user_id, followings, followers, posts, likes_received, favs_received FROM user_counter WHERE user_id IN ({})",
                placeholders(chunk.len())
            );
            for r in self.db.query_all_raw(stmt(&sql, chunk.iter().map(|u| Value::from(*u)).collect())).await? {
                let mut s = [0u32; FIELDS];
                for (i, slot) in s.iter_mut().enumerate() {
                    *slot = clamp(r.try_get_by_index::<i64>(i + 1)?);
                }
                out.insert(r.try_get_by_index::<i64>(0)?, Sds(s));
            }
        }
        Ok(out)
    }

    /// Counts one user's counters from the facts in one transaction and stores them, each follow
    /// count with the version of the row it comes from. Returns what it stored, and the followers
    /// counted from the edges themselves (ahead of the projection's count while it catches up).
    async fn rebuild(&self, user_id: i64) -> Result<(Sds, i64), DbErr> {
        in_tx(&self.db, |txn| {
            Box::pin(async move {
                // A write first: the transaction holds SQLite's write lock from here on, so the
                // facts below and their versions are one consistent state.
                txn.execute_raw(stmt("INSERT INTO user_counter (user_id) VALUES (?) ON CONFLICT (user_id) DO NOTHING", vec![user_id.into()])).await?;
                let edges = |side: &str| format!("SELECT COUNT(*) FROM following WHERE {side} = ? AND state = 1");
                // Each count with the version of its own row: relation-svc's `following_count`
                // and projection-svc's `edge_count`, whose next events are one version up.
                let (followings, followings_version) = match socialgraph_storage::following_counts::get(txn, user_id).await? {
                    Some(c) => (c.followings, c.version),
                    None => (count(txn, &edges("follower_id"), vec![user_id.into()]).await?, 0),
                };
                let edge_followers = count(txn, &edges("followee_id"), vec![user_id.into()]).await?;
                let (followers, followers_version) = match socialgraph_storage::counts::get_many(txn, &[user_id]).await?.first() {
                    Some(c) => (c.followers, c.version),
                    None => (edge_followers, 0),
                };
                let received = "SELECT COUNT(*) FROM action_fact WHERE owner_id = ? AND metric = ?";
                let likes = count(txn, received, vec![user_id.into(), (LIKE as i32).into()]).await?;
                let favs = count(txn, received, vec![user_id.into(), (FAV as i32).into()]).await?;
                // Posts are kept by the feed's consumer with the `post` table in its transactions,
                // so the table's live rows are the count at every commit.
                let posts = count(txn, "SELECT COUNT(*) FROM post WHERE author_id = ? AND deleted = 0", vec![user_id.into()]).await?;
                txn.execute_raw(stmt(
                    "UPDATE user_counter SET followings = ?, followings_version = ?, followers = ?, followers_version = ?, posts = ?, \
                     likes_received = ?, favs_received = ? WHERE user_id = ?",
                    vec![
                        followings.into(),
                        followings_version.into(),
                        followers.into(),
                        followers_version.into(),
                        posts.into(),
                        likes.into(),
                        favs.into(),
                        user_id.into(),
                    ],
                ))
                .await?;
                Ok((Sds([clamp(followings), clamp(followers), clamp(posts), clamp(likes), clamp(favs)]), edge_followers))
            })
        })
        .await
    }
}

#[tonic::async_trait]
impl CounterBackend for SqlCounters {
    /// The write behind `token` is committed, so counting the facts now reflects it: each user's
    /// counters are rebuilt, and the answer carries the followers counted from the edges (the
    /// stored copy keeps the projection's count with its version, which its next event moves).
    async fn user_counters_after(&self, user_ids: &[i64], _token: ConsistencyToken) -> ApiResult<Vec<Sds>> {
        let mut out = Vec::with_capacity(user_ids.len());
        for u in user_ids {
            let (mut s, edge_followers) = self.rebuild(*u).await.map_err(db_error)?;
            s.0[socialgraph_cache::counters::field::FOLLOWERS] = clamp(edge_followers);
            out.push(s);
        }
        Ok(out)
    }

    async fn user_counters(&self, user_ids: &[i64]) -> ApiResult<Vec<Sds>> {
        let mut found = self.read(user_ids).await.map_err(db_error)?;
        let mut out = Vec::with_capacity(user_ids.len());
        for u in user_ids {
            let s = match found.get(u) {
                Some(s) => *s,
                // No row yet: build it from the facts (and remember it for repeats in the batch).
                None => {
                    let (s, _) = self.rebuild(*u).await.map_err(db_error)?;
                    found.insert(*u, s);
                    s
                }
            };
            out.push(s);
        }
        Ok(out)
    }

    async fn rebuild_user_counters(&self, user_id: i64) -> ApiResult<Sds> {
        Ok(self.rebuild(user_id).await.map_err(db_error)?.0)
    }

    async fn toggle(&self, actor_id: i64, entity: &pb::EntityRef, owner_id: i64, metric: Metric, wanted: bool) -> ApiResult<Toggled> {
        let topic = self.counter_topic.clone();
        let changed = in_tx(&self.db, |txn| {
            let (entity, topic) = (entity.clone(), topic.clone());
            Box::pin(async move {
                let key = || vec![Value::from(entity.entity_type.clone()), Value::from(entity.entity_id)];
                txn.execute_raw(stmt("INSERT INTO entity_counter (entity_type, entity_id) VALUES (?, ?) ON CONFLICT DO NOTHING", key())).await?;
                let mut fact_key = key();
                fact_key.extend([Value::from(metric as i32), Value::from(actor_id)]);
                let stored_owner = txn
                    .query_one_raw(stmt(
                        "SELECT owner_id FROM action_fact WHERE entity_type = ? AND entity_id = ? AND metric = ? AND actor_id = ?",
                        fact_key.clone(),
                    ))
                    .await?
                    .map(|r| r.try_get_by_index::<i64>(0))
                    .transpose()?;
                if stored_owner.is_some() == wanted {
                    return Ok(false);
                }
                let owner = stored_owner.unwrap_or(owner_id);
                if wanted {
                    let mut v = fact_key.clone();
                    v.push(owner.into());
                    txn.execute_raw(stmt("INSERT INTO action_fact (entity_type, entity_id, metric, actor_id, owner_id) VALUES (?, ?, ?, ?, ?)", v))
                        .await?;
                } else {
                    txn.execute_raw(stmt(
                        "DELETE FROM action_fact WHERE entity_type = ? AND entity_id = ? AND metric = ? AND actor_id = ?",
                        fact_key,
                    ))
                    .await?;
                }
                let delta: i64 = if wanted { 1 } else { -1 };
                let column = if metric == FAV { "favs" } else { "likes" };
                let mut v = vec![Value::from(delta)];
                v.extend(key());
                txn.execute_raw(stmt(
                    &format!("UPDATE entity_counter SET {column} = MAX(0, {column} + ?), seq = seq + 1 WHERE entity_type = ? AND entity_id = ?"),
                    v,
                ))
                .await?;
                // The owner's received count moves with the fact; an owner without counters gets
                // them counted from the facts on first read.
                if owner > 0 {
                    let received = if metric == FAV { "favs_received" } else { "likes_received" };
                    txn.execute_raw(stmt(
                        &format!("UPDATE user_counter SET {received} = MAX(0, {received} + ?) WHERE user_id = ?"),
                        vec![Value::from(delta), Value::from(owner)],
                    ))
                    .await?;
                }
                let seq = count(txn, "SELECT seq FROM entity_counter WHERE entity_type = ? AND entity_id = ?", key()).await?;
                let now = crate::now_ms();
                let (event, headers) = action_event(&entity, actor_id, owner, metric, delta as i32, seq, now);
                let row = NewOutboxRow {
                    topic,
                    partition_key: entity.entity_id,
                    payload: event.encode_to_vec(),
                    headers: socialgraph_events::headers::encode(&headers),
                    created_at_ms: now,
                };
                outbox::insert(txn, &[row]).await?;
                Ok(true)
            })
        })
        .await
        .map_err(db_error)?;
        if changed {
            self.wake.notify_one();
        }
        Ok(Toggled { changed, active: wanted })
    }

    async fn entity_counts(&self, entities: &[pb::EntityRef], wanted: &[Metric]) -> ApiResult<Vec<pb::EntityCounts>> {
        let mut found: HashMap<(String, i64), (i64, i64)> = HashMap::new();
        for chunk in entities.chunks(CHUNK) {
            let sql = format!(
                "SELECT entity_type, entity_id, likes, favs FROM entity_counter WHERE (entity_type, entity_id) IN (VALUES {})",
                vec!["(?, ?)"; chunk.len()].join(", ")
            );
            let values = chunk.iter().flat_map(|e| [Value::from(e.entity_type.clone()), Value::from(e.entity_id)]).collect();
            for r in self.db.query_all_raw(stmt(&sql, values)).await.map_err(db_error)? {
                let key = (r.try_get_by_index(0).map_err(db_error)?, r.try_get_by_index(1).map_err(db_error)?);
                found.insert(key, (r.try_get_by_index(2).map_err(db_error)?, r.try_get_by_index(3).map_err(db_error)?));
            }
        }
        Ok(entities
            .iter()
            .map(|e| {
                let (likes, favs) = found.get(&(e.entity_type.clone(), e.entity_id)).copied().unwrap_or_default();
                entity_counts(e, wanted, likes.max(0) as u64, favs.max(0) as u64)
            })
            .collect())
    }

    async fn action_states(&self, actor_id: i64, entity_type: &str, ids: &[i64]) -> ApiResult<Vec<pb::ActionState>> {
        let mut active: HashMap<i64, (bool, bool)> = HashMap::new();
        for chunk in ids.chunks(CHUNK) {
            let sql = format!(
                "SELECT entity_id, metric FROM action_fact WHERE entity_type = ? AND actor_id = ? AND entity_id IN ({})",
                placeholders(chunk.len())
            );
            let mut v = vec![Value::from(entity_type.to_owned()), Value::from(actor_id)];
            v.extend(chunk.iter().map(|i| Value::from(*i)));
            for r in self.db.query_all_raw(stmt(&sql, v)).await.map_err(db_error)? {
                let id: i64 = r.try_get_by_index(0).map_err(db_error)?;
                let metric: i32 = r.try_get_by_index(1).map_err(db_error)?;
                let slot = active.entry(id).or_default();
                if metric == FAV as i32 { slot.1 = true } else { slot.0 = true }
            }
        }
        Ok(ids
            .iter()
            .map(|id| {
                let (liked, faved) = active.get(id).copied().unwrap_or_default();
                pb::ActionState { entity_id: *id, liked, faved }
            })
            .collect())
    }

    /// Exact from message-svc's tables in the same file (the embedded mode has no lag to hide).
    async fn unread_counts(&self, user_id: i64) -> ApiResult<(i64, Vec<(i64, i64)>)> {
        let rows = socialgraph_storage::messages::unread_of(&self.db, user_id).await.map_err(db_error)?;
        Ok((rows.iter().map(|m| m.unread_count).sum(), rows.iter().map(|m| (m.conversation_id, m.unread_count)).collect()))
    }

    /// Nothing to rebuild: the counts are read from message-svc's tables.
    async fn rebuild_unread_counts(&self, user_id: i64) -> ApiResult<(i64, Vec<(i64, i64)>)> {
        self.unread_counts(user_id).await
    }

    async fn rebuild_entity_counts(&self, entity: &pb::EntityRef) -> ApiResult<pb::EntityCounts> {
        let (likes, favs) = in_tx(&self.db, |txn| {
            let entity = entity.clone();
            Box::pin(async move {
                let key = || vec![Value::from(entity.entity_type.clone()), Value::from(entity.entity_id)];
                txn.execute_raw(stmt("INSERT INTO entity_counter (entity_type, entity_id) VALUES (?, ?) ON CONFLICT DO NOTHING", key())).await?;
                let facts = "SELECT COUNT(*) FROM action_fact WHERE entity_type = ? AND entity_id = ? AND metric = ?";
                let mut v = key();
                v.push((LIKE as i32).into());
                let likes = count(txn, facts, v).await?;
                let mut v = key();
                v.push((FAV as i32).into());
                let favs = count(txn, facts, v).await?;
                let mut v = vec![Value::from(likes), Value::from(favs)];
                v.extend(key());
                txn.execute_raw(stmt("UPDATE entity_counter SET likes = ?, favs = ? WHERE entity_type = ? AND entity_id = ?", v)).await?;
                Ok((likes, favs))
            })
        })
        .await
        .map_err(db_error)?;
        Ok(entity_counts(entity, &[LIKE, FAV], likes as u64, favs as u64))
    }
}

/// [`FollowCountStore`] on `user_counter`: counter-svc's follow-count consumers run on it in the
/// embedded mode. Each batch is one transaction; the newer version wins as in Redis.
pub struct SqlFollowCounts {
    /// The SQLite database.
    pub db: DatabaseConnection,
}

/// Copies followings of a newer version. A user without a row is left alone: rows are created
/// only by a read counting every counter from the facts, so none starts at a false 0.
const SYNC_FOLLOWINGS: &str = "UPDATE user_counter SET followings = ?1, followings_version = ?2 WHERE user_id = ?3 AND followings_version < ?2";

/// Copies followers of a newer version, and followings while no relation event brought them
/// (their version is still 0); a user without a row is left alone, as above.
const SYNC_FOLLOW_COUNTS: &str = "UPDATE user_counter SET followers = ?2, followers_version = ?3, \
     followings = CASE WHEN followings_version = 0 THEN ?1 ELSE followings END WHERE user_id = ?4 AND followers_version < ?3";

impl SqlFollowCounts {
    /// Runs `sql` once per value list in one transaction; returns how many rows it changed.
    async fn sync(&self, sql: &'static str, rows: Vec<Vec<Value>>) -> Result<usize, BoxError> {
        let rows = Arc::new(rows);
        let written = in_tx(&self.db, |txn| {
            let rows = Arc::clone(&rows);
            Box::pin(async move {
                let mut written = 0;
                for values in rows.iter() {
                    written += txn.execute_raw(stmt(sql, values.clone())).await?.rows_affected() as usize;
                }
                Ok(written)
            })
        })
        .await?;
        Ok(written)
    }
}

impl FollowCountStore for SqlFollowCounts {
    async fn load_offset(&self, consumer: &str, topic: &str, partition: i32) -> Result<Option<i64>, BoxError> {
        Ok(offsets::next_offset(&self.db, consumer, topic, partition).await?)
    }

    async fn store_offset(&self, consumer: &str, topic: &str, partition: i32, next: i64, last_event_ms: Option<i64>) -> Result<(), BoxError> {
        let position = StoredOffset { partition, next_offset: next, last_event_ms };
        Ok(offsets::store(&self.db, consumer, topic, position, crate::now_ms()).await?)
    }

    async fn sync_followings(&self, counts: &[Followings]) -> Result<usize, BoxError> {
        let rows = counts.iter().map(|c| vec![c.followings.into(), c.version.into(), c.user_id.into()]).collect();
        self.sync(SYNC_FOLLOWINGS, rows).await
    }

    async fn sync_follow_counts(&self, counts: &[EdgeCounts]) -> Result<usize, BoxError> {
        let rows = counts.iter().map(|c| vec![c.followings.into(), c.followers.into(), c.version.into(), c.user_id.into()]).collect();
        self.sync(SYNC_FOLLOW_COUNTS, rows).await
    }
}
