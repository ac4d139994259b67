//! Redis IO of counter-svc: counters, guards, the posts facts, consumer offsets. Batches go in
//! one pipeline (one round trip); scripts run by EVALSHA and are loaded again when Redis lost
//! them (NOSCRIPT after a restart).

use std::collections::HashMap;
use std::time::Duration;

use redis::{Pipeline, RedisError, Value};
use socialgraph_cache::counters::{FIELDS, Scripts, Sds};
use socialgraph_cache::entities::EntityScripts;
use socialgraph_cache::keys::{Keys, partition_field};
use socialgraph_cache::{CacheError, Pool};

/// A user's change for one batch: apply `delta` if the guard of the batch's partition still
/// equals `expected`, then set it to `new_guard`.
#[derive(Debug, Clone, Copy)]
pub struct Delta {
    /// The user.
    pub user_id: i64,
    /// The guard read before aggregating (`None`: no guard yet).
    pub expected: Option<i64>,
    /// The last offset of the batch.
    pub new_guard: i64,
    /// Per-counter change.
    pub delta: [i64; FIELDS],
}

/// Outcome of one guarded apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// The guard moved meanwhile: re-read and retry.
    Conflict,
    /// The counters do not exist; the guard advanced (a rebuild will cover it).
    Missing,
    /// Applied.
    Done,
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

fn unavailable(e: impl std::fmt::Display) -> CacheError {
    CacheError::Unavailable(e.to_string())
}

impl Store {
    /// Runs `pipe` in one round trip; on NOSCRIPT loads every script and retries once.
    /// An empty pipeline answers an empty list without a round trip.
    pub async fn query(&self, pipe: &Pipeline) -> Result<Vec<Value>, CacheError> {
        if pipe.is_empty() {
            return Ok(Vec::new());
        }
        let run = async {
            let mut conn = self.pool.get().await.map_err(unavailable)?;
            match pipe.query_async::<Vec<Value>>(&mut *conn).await {
                Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                    let (u, e) = (&self.scripts, &self.entity_scripts);
                    for s in [&u.apply_delta, &u.apply_content, &u.rebuild, &e.toggle, &e.apply, &e.read_or_rebuild, &e.unpend] {
                        s.prepare_invoke().load_async(&mut *conn).await?;
                    }
                    Ok(pipe.query_async::<Vec<Value>>(&mut *conn).await?)
                }
                other => Ok(other?),
            }
        };
        tokio::time::timeout(self.timeout, run).await.map_err(|_| CacheError::Timeout)?
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

    /// The guard of `field` for each user.
    pub async fn guards(&self, users: &[i64], field: &str) -> Result<HashMap<i64, Option<i64>>, CacheError> {
        let mut pipe = redis::pipe();
        for u in users {
            pipe.hget(self.keys.user_guard(*u), field);
        }
        let values = self.query(&pipe).await?;
        Ok(users
            .iter()
            .zip(values)
            .map(|(u, v)| (*u, redis::from_redis_value::<Option<i64>>(v).ok().flatten()))
            .collect())
    }

    fn outcome(v: &Value) -> Result<Applied, CacheError> {
        match redis::from_redis_value::<i64>(v.clone())? {
            -1 => Ok(Applied::Conflict),
            0 => Ok(Applied::Missing),
            _ => Ok(Applied::Done),
        }
    }

    /// Applies guarded deltas in one pipeline; one outcome per input, in order.
    pub async fn apply_deltas(&self, field: &str, deltas: &[Delta]) -> Result<Vec<Applied>, CacheError> {
        let mut pipe = redis::pipe();
        for d in deltas {
            let mut inv = self.scripts.apply_delta.prepare_invoke();
            inv.key(self.keys.user_counters(d.user_id)).key(self.keys.user_guard(d.user_id));
            inv.arg(field).arg(d.expected.map(|g| g.to_string()).unwrap_or_default()).arg(d.new_guard);
            for x in d.delta {
                inv.arg(x);
            }
            pipe.invoke_script(&inv);
        }
        self.query(&pipe).await?.iter().map(Self::outcome).collect()
    }

    /// Applies each author's content operations (`(published, member)` in log order) guarded
    /// like [`Self::apply_deltas`]; one outcome per author, in order.
    pub async fn apply_content(
        &self,
        field: &str,
        authors: &[(i64, Option<i64>, i64, Vec<(bool, String)>)],
    ) -> Result<Vec<Applied>, CacheError> {
        let mut pipe = redis::pipe();
        for (author, expected, new_guard, ops) in authors {
            let mut inv = self.scripts.apply_content.prepare_invoke();
            inv.key(self.keys.user_counters(*author)).key(self.keys.user_guard(*author)).key(self.keys.user_posts(*author));
            inv.arg(field).arg(expected.map(|g| g.to_string()).unwrap_or_default()).arg(*new_guard);
            for (published, member) in ops {
                inv.arg(if *published { "+" } else { "-" }).arg(member);
            }
            pipe.invoke_script(&inv);
        }
        self.query(&pipe).await?.iter().map(Self::outcome).collect()
    }

    /// Reads the counters of `users` in one round trip: `None` for missing or malformed.
    pub async fn read(&self, users: &[i64]) -> Result<Vec<Option<Sds>>, CacheError> {
        let mut pipe = redis::pipe();
        for u in users {
            pipe.get(self.keys.user_counters(*u));
        }
        Ok(self
            .query(&pipe)
            .await?
            .into_iter()
            .map(|v| redis::from_redis_value::<Option<Vec<u8>>>(v).ok().flatten().and_then(|b| Sds::decode(&b)))
            .collect())
    }

    /// The whole guard hash of a user: field → last reflected offset.
    pub async fn guard_map(&self, user_id: i64) -> Result<HashMap<String, i64>, CacheError> {
        let mut pipe = redis::pipe();
        pipe.hgetall(self.keys.user_guard(user_id));
        let v = self.query(&pipe).await?;
        Ok(v.into_iter().next().map(redis::from_redis_value::<HashMap<String, i64>>).transpose()?.unwrap_or_default())
    }

    /// Guarded rebuild write (see the script): `Ok(None)` when refused because a guard is
    /// beyond `positions`; else the previous counters (`Some(None)` when there were none).
    ///
    /// `rest_secs` > 0 also starts the user's sampled-check rest period in the same round trip
    /// (a value just rebuilt from the facts needs no check).
    pub async fn rebuild(
        &self,
        user_id: i64,
        values: RebuildValues,
        positions: &[(String, i64)],
        rest_secs: u64,
    ) -> Result<Option<Option<Sds>>, CacheError> {
        let mut pipe = redis::pipe();
        let mut inv = self.scripts.rebuild.prepare_invoke();
        inv.key(self.keys.user_counters(user_id)).key(self.keys.user_guard(user_id)).key(self.keys.user_posts(user_id));
        inv.arg(values.followings).arg(values.followers).arg(values.likes_received).arg(values.favs_received);
        for (field, last) in positions {
            inv.arg(field).arg(*last);
        }
        pipe.invoke_script(&inv);
        if rest_secs > 0 {
            pipe.cmd("SET").arg(self.keys.user_check(user_id)).arg(1).arg("EX").arg(rest_secs).ignore();
        }
        let v = self.query(&pipe).await?.into_iter().next().unwrap_or(Value::Nil);
        match v {
            Value::Int(-1) => Ok(None),
            Value::Array(items) => {
                let old = items.into_iter().next().and_then(|v| redis::from_redis_value::<Option<Vec<u8>>>(v).ok().flatten());
                Ok(Some(old.and_then(|b| Sds::decode(&b))))
            }
            other => Err(CacheError::Command(RedisError::from((
                redis::ErrorKind::Client,
                "unexpected reply of the rebuild script",
                format!("{other:?}"),
            )))),
        }
    }

    /// Starts the sampled-check rest period of every user in `users` whose period is over, in
    /// one round trip (SET NX EX per user); returns those users: their check is due now.
    /// `rest_secs` gives each user's period (callers add jitter so that users first read
    /// together do not fall due together).
    pub async fn checks_due(&self, users: &[(i64, u64)]) -> Result<Vec<i64>, CacheError> {
        let mut pipe = redis::pipe();
        for (u, rest_secs) in users {
            pipe.cmd("SET").arg(self.keys.user_check(*u)).arg(1).arg("NX").arg("EX").arg(*rest_secs);
        }
        let replies = self.query(&pipe).await?;
        Ok(users
            .iter()
            .zip(replies)
            .filter(|(_, v)| matches!(v, Value::Okay | Value::SimpleString(_)))
            .map(|((u, _), _)| *u)
            .collect())
    }
}

/// Values a rebuild writes (posts come from the posts set inside the script).
#[derive(Debug, Clone, Copy, Default)]
pub struct RebuildValues {
    /// Accounts the user follows.
    pub followings: i64,
    /// Accounts following the user.
    pub followers: i64,
    /// Likes received.
    pub likes_received: i64,
    /// Favourites received.
    pub favs_received: i64,
}
