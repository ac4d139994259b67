//! Redis IO of counter-svc: counters, their versions, the posts and received facts, consumer
//! offsets. Batches go in
//! one pipeline (one round trip); scripts run by EVALSHA and are loaded again when Redis lost
//! them (NOSCRIPT after a restart).

use std::time::Duration;

use redis::{Pipeline, Value};
use socialgraph_cache::counters::{Scripts, Sds, Stored};
use socialgraph_cache::entities::EntityScripts;
use socialgraph_cache::keys::{Keys, partition_field};
use socialgraph_cache::{CacheError, Pool};

/// One user's follow counts as projection-svc answered them (`edge_count` row).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EdgeCounts {
    /// The user.
    pub user_id: i64,
    /// Accounts the user follows.
    pub followings: i64,
    /// Accounts following the user.
    pub followers: i64,
    /// Version of the row (grows by one on every change).
    pub version: i64,
}

/// One follower's followings as relation-svc counted them (`following_count` row).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Followings {
    /// The follower.
    pub user_id: i64,
    /// Accounts it follows.
    pub followings: i64,
    /// Version of the row (grows by one on every change of the follower's edges).
    pub version: i64,
}

/// One owned entity's counts with the toggle sequence they reflect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntityState {
    /// `etype:eid`.
    pub member: String,
    /// The entity's toggle sequence when the counts were read.
    pub seq: i64,
    /// Likes.
    pub likes: i64,
    /// Favourites.
    pub favs: i64,
}

/// What the sampled check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checked {
    /// No counter stored (the next read creates it).
    Missing,
    /// The counter agreed with the facts (or was only behind and was brought forward when
    /// `written`).
    Agreed {
        /// A newer version was copied.
        written: bool,
    },
    /// The counter disagreed with facts of the version it claims: rewritten.
    Repaired,
}

/// Counter storage in Redis.
#[derive(Clone)]
pub struct Store {
    /// The pool.
    pub pool: Pool,
    /// Key schema.
    pub keys: Keys,
    /// User counter scripts.
    pub scripts: Scripts,
    /// Entity scripts.
    pub entity_scripts: EntityScripts,
    /// Longest wait for one round trip.
    pub timeout: Duration,
}

impl Store {
    /// Runs `pipe` in one round trip; on NOSCRIPT loads every script and retries once.
    /// An empty pipeline answers an empty list without a round trip.
    pub async fn query(&self, pipe: &Pipeline) -> Result<Vec<Value>, CacheError> {
        self.query_ordered(pipe, 0).await
    }

    /// [`Self::query`] where the first `first` commands complete before the others start, on a
    /// Redis Cluster too (see [`socialgraph_cache::query_pipeline_ordered`]).
    pub async fn query_ordered(&self, pipe: &Pipeline, first: usize) -> Result<Vec<Value>, CacheError> {
        if pipe.is_empty() {
            return Ok(Vec::new());
        }
        let scripts: Vec<&redis::Script> = self.scripts.all().into_iter().chain(self.entity_scripts.all()).collect();
        socialgraph_cache::query_pipeline_ordered(&self.pool, self.timeout, pipe, &scripts, first).await
    }

    /// The stored next offset of `consumer` on `topic`/`partition`.
    pub async fn load_offset(&self, consumer: &str, topic: &str, partition: i32) -> Result<Option<i64>, CacheError> {
        let mut pipe = redis::pipe();
        pipe.hget(self.keys.consumer_offsets(consumer), partition_field(topic, partition));
        let v = self.query(&pipe).await?;
        Ok(v.first().and_then(|v| redis::from_redis_value::<Option<i64>>(v.clone()).ok()).flatten())
    }

    /// Stores the next offset of `consumer` on `topic`/`partition`.
    pub async fn store_offset(&self, consumer: &str, topic: &str, partition: i32, next: i64) -> Result<(), CacheError> {
        let mut pipe = redis::pipe();
        pipe.hset(self.keys.consumer_offsets(consumer), partition_field(topic, partition), next).ignore();
        self.query(&pipe).await.map(|_| ())
    }

    /// Deletes every stored offset of `consumer` (the next start consumes from the earliest).
    pub async fn reset_offsets(&self, consumer: &str) -> Result<(), CacheError> {
        let mut pipe = redis::pipe();
        pipe.del(self.keys.consumer_offsets(consumer)).ignore();
        self.query(&pipe).await.map(|_| ())
    }

    /// Copies follow counts into the users' counters in one round trip, keeping the newest
    /// version per user (`force` rewrites an equal version too); returns for each input the
    /// previous counters when it wrote (`Some(None)`: created), `None` when the stored version
    /// was newer or equal.
    pub async fn sync_edges(&self, counts: &[EdgeCounts], force: bool) -> Result<Vec<Option<Option<Sds>>>, CacheError> {
        let mut pipe = redis::pipe();
        for c in counts {
            self.push_sync_edges(&mut pipe, c, force);
        }
        self.query(&pipe)
            .await?
            .into_iter()
            .map(|v| {
                let (written, old): (i64, Value) = redis::from_redis_value(v)?;
                let old = decode_sds(old);
                Ok((written == 1).then_some(old))
            })
            .collect()
    }

    /// Copies followings into the users' counters in one round trip, keeping the newest version
    /// per user; users without counters are left alone (their first read creates them).
    /// Returns how many it wrote.
    pub async fn sync_followings(&self, counts: &[Followings]) -> Result<usize, CacheError> {
        let mut pipe = redis::pipe();
        for c in counts {
            let mut inv = self.scripts.sync_followings.prepare_invoke();
            inv.key(self.keys.user_counters(c.user_id)).arg(c.user_id).arg(c.followings).arg(c.version);
            pipe.invoke_script(&inv);
        }
        let mut written = 0;
        for v in self.query(&pipe).await? {
            written += usize::from(redis::from_redis_value::<i64>(v)? == 1);
        }
        Ok(written)
    }

    /// Creates the counters of users read for the first time, in one round trip: copies their
    /// follow counts (as [`Self::sync_edges`]), starts their check rest periods (`periods`, as
    /// [`Self::checks_due`]; may be empty) and reads them back, in `counts` order.
    pub async fn create(&self, counts: &[EdgeCounts], periods: &[(i64, u64)]) -> Result<Vec<Option<Sds>>, CacheError> {
        let mut pipe = redis::pipe();
        for c in counts {
            self.push_sync_edges(&mut pipe, c, false);
            pipe.ignore();
        }
        let ignored = pipe.len();
        self.push_checks_due(&mut pipe, periods);
        // The sync scripts' replies are ignored; skip the check scripts' replies.
        let n = pipe.len() - ignored;
        for c in counts {
            pipe.hget(self.keys.user_counters(c.user_id), c.user_id);
        }
        Ok(self.query(&pipe).await?.into_iter().skip(n).map(decode_sds).collect())
    }

    /// Appends the `SYNC_EDGES` script for one user's counts to `pipe`.
    fn push_sync_edges(&self, pipe: &mut redis::Pipeline, c: &EdgeCounts, force: bool) {
        let mut inv = self.scripts.sync_edges.prepare_invoke();
        self.user_keys(&mut inv, c.user_id);
        inv.arg(c.followings).arg(c.followers).arg(c.version).arg(if force { "1" } else { "0" });
        pipe.invoke_script(&inv);
    }

    /// Appends to `pipe` one `CHECKS_DUE` script per bucket of `users` ((user, rest seconds));
    /// each answers the users of its bucket whose period it started.
    fn push_checks_due(&self, pipe: &mut redis::Pipeline, users: &[(i64, u64)]) {
        let now = socialgraph_cache::counters::rest_clock_now();
        for (bucket, idx) in self.by_bucket(users.iter().map(|(u, _)| *u)) {
            let mut inv = self.scripts.checks_due.prepare_invoke();
            inv.key(bucket).arg(now);
            for i in idx {
                inv.arg(users[i].0).arg(users[i].1);
            }
            pipe.invoke_script(&inv);
        }
    }

    /// The positions of `users` grouped by the bucket key of each (one slot a group).
    fn by_bucket(&self, users: impl Iterator<Item = i64>) -> std::collections::BTreeMap<String, Vec<usize>> {
        let mut out: std::collections::BTreeMap<String, Vec<usize>> = std::collections::BTreeMap::new();
        for (i, u) in users.enumerate() {
            out.entry(self.keys.user_counters(u)).or_default().push(i);
        }
        out
    }

    /// The keys (bucket, posts set, recv hash) and first argument (the user) of the scripts
    /// that read a user's facts.
    fn user_keys(&self, inv: &mut redis::ScriptInvocation<'_>, user_id: i64) {
        let k = &self.keys;
        inv.key(k.user_counters(user_id)).key(k.user_posts(user_id)).key(k.user_received(user_id)).arg(user_id);
    }

    /// The sampled check of one user against `counts` (see the script).
    pub async fn check(&self, counts: EdgeCounts) -> Result<Checked, CacheError> {
        let mut pipe = redis::pipe();
        let mut inv = self.scripts.check.prepare_invoke();
        self.user_keys(&mut inv, counts.user_id);
        inv.arg(counts.followings).arg(counts.followers).arg(counts.version);
        pipe.invoke_script(&inv);
        let v = self.query(&pipe).await?.into_iter().next().unwrap_or(Value::Nil);
        let (drift, written): (i64, i64) = redis::from_redis_value(v)?;
        Ok(match drift {
            -1 => Checked::Missing,
            1 => Checked::Repaired,
            _ => Checked::Agreed { written: written == 1 },
        })
    }

    /// Copies entity states into each owner's recv hash (newer sequences only), one script per
    /// owner in one round trip; returns each owner's (likes, favs) received change.
    pub async fn owner_sync(&self, owners: &[(i64, Vec<EntityState>)]) -> Result<Vec<(i64, i64)>, CacheError> {
        let mut pipe = redis::pipe();
        for (owner, states) in owners {
            let mut inv = self.scripts.owner_sync.prepare_invoke();
            inv.key(self.keys.user_counters(*owner)).key(self.keys.user_received(*owner)).arg(*owner);
            for st in states {
                inv.arg(&st.member).arg(st.seq).arg(st.likes).arg(st.favs);
            }
            pipe.invoke_script(&inv);
        }
        self.query(&pipe).await?.into_iter().map(|v| Ok(redis::from_redis_value::<(i64, i64)>(v)?)).collect()
    }

    /// The current counts and sequence of each entity (`(etype, eid)`), in one round trip.
    pub async fn entity_states(&self, entities: &[(String, i64)]) -> Result<Vec<EntityState>, CacheError> {
        let mut pipe = redis::pipe();
        for (t, id) in entities {
            let mut inv = self.entity_scripts.state.prepare_invoke();
            inv.key(self.keys.entity(t, *id).state());
            pipe.invoke_script(&inv);
        }
        entities
            .iter()
            .zip(self.query(&pipe).await?)
            .map(|((t, id), v)| {
                let (seq, likes, favs): (i64, i64, i64) = redis::from_redis_value(v)?;
                Ok(EntityState { member: format!("{t}:{id}"), seq, likes, favs })
            })
            .collect()
    }

    /// Up to `limit` entities of the owner's recv hash (all of them when it is smaller).
    pub async fn received_entities(&self, owner: i64, limit: usize) -> Result<Vec<(String, i64)>, CacheError> {
        let mut pipe = redis::pipe();
        pipe.cmd("HRANDFIELD").arg(self.keys.user_received(owner)).arg(limit);
        let v = self.query(&pipe).await?.into_iter().next().unwrap_or(Value::Nil);
        let members: Vec<String> = redis::from_redis_value(v).unwrap_or_default();
        Ok(members.iter().filter_map(|m| parse_member(m)).collect())
    }

    /// Applies each author's content events (`(published, member, time_ms)` in log order),
    /// one script per author in one round trip.
    pub async fn apply_content(&self, authors: &[AuthorContent]) -> Result<(), CacheError> {
        let mut pipe = redis::pipe();
        for (author, ops) in authors {
            let mut inv = self.scripts.apply_content.prepare_invoke();
            inv.key(self.keys.user_counters(*author)).key(self.keys.user_posts(*author)).key(self.keys.user_post_times(*author)).arg(*author);
            for (published, member, ms) in ops {
                inv.arg(if *published { "+" } else { "-" }).arg(member).arg(*ms);
            }
            pipe.invoke_script(&inv).ignore();
        }
        self.query(&pipe).await.map(|_| ())
    }

    /// Reads the counters of `users` in one round trip, in order: `None` for missing or
    /// malformed. One HGET per user, pipelined (on a Redis Cluster the pipeline is split by
    /// slot, see `socialgraph_cache::cluster`). Not one HMGET per bucket: the 100 users of a
    /// batch fall in about 100 of the 65,536 buckets anyway, and a pipeline of 100 one-entry
    /// array replies took redis-rs about 1.5 times as long to parse as 100 plain ones.
    pub async fn read(&self, users: &[i64]) -> Result<Vec<Option<Sds>>, CacheError> {
        let mut pipe = redis::pipe();
        for u in users {
            pipe.hget(self.keys.user_counters(*u), *u);
        }
        Ok(self.query(&pipe).await?.into_iter().map(decode_sds).collect())
    }

    /// The whole stored value of `user_id` (counters and versions), if any.
    pub async fn read_stored(&self, user_id: i64) -> Result<Option<Stored>, CacheError> {
        let mut pipe = redis::pipe();
        pipe.hget(self.keys.user_counters(user_id), user_id);
        let v = self.query(&pipe).await?.into_iter().next().unwrap_or(Value::Nil);
        Ok(redis::from_redis_value::<Option<Vec<u8>>>(v).ok().flatten().and_then(|b| Stored::decode(&b)))
    }

    /// Starts the sampled-check rest period of every user in `users` whose period is over, in
    /// one round trip (one script per bucket); returns those users: their check is due now.
    /// `rest_secs` gives each user's period (callers add jitter so that users first read
    /// together do not fall due together). Users without counters are never due.
    pub async fn checks_due(&self, users: &[(i64, u64)]) -> Result<Vec<i64>, CacheError> {
        let mut pipe = redis::pipe();
        self.push_checks_due(&mut pipe, users);
        let mut due = Vec::new();
        for v in self.query(&pipe).await? {
            due.extend(redis::from_redis_value::<Vec<i64>>(v)?);
        }
        Ok(due)
    }
}

/// One author's content events of a batch: (author, [(published, `etype:eid`, time ms)]), in
/// log order.
pub type AuthorContent = (i64, Vec<(bool, String, i64)>);

/// An HGET reply → the counters it holds (`None`: missing or malformed).
fn decode_sds(v: Value) -> Option<Sds> {
    redis::from_redis_value::<Option<Vec<u8>>>(v).ok().flatten().and_then(|b| Stored::decode(&b)).map(|s| s.counters)
}

/// `etype:eid` → (etype, eid).
pub fn parse_member(m: &str) -> Option<(String, i64)> {
    let (t, id) = m.rsplit_once(':')?;
    Some((t.to_owned(), id.parse().ok()?))
}
