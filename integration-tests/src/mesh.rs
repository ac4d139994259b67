//! The three-service mesh of the integration tests: topics, configurations, start, settle.

use std::net::SocketAddr;
use std::time::Duration;

use socialgraph_testkit::{Backend, TestDb};

use crate::*;

/// RPCs `svc` served (of `method`, or of every method), from its metrics.
///
/// # Errors
/// The admin endpoint did not answer.
pub async fn rpcs_served(svc: &Svc, method: Option<&str>) -> anyhow::Result<f64> {
    let text = svc.metrics().await?;
    let wanted = method.map(|m| format!("grpc_method=\"{m}\""));
    Ok(text
        .lines()
        .filter(|l| l.starts_with("grpc_server_started_total") && wanted.as_ref().is_none_or(|w| l.contains(w.as_str())))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// The account topic of a test mesh whose relation topic is `relation_topic` (each mesh has its
/// own, so one test's account deletions never reach another's message-svc).
pub fn account_topic_of(relation_topic: &str) -> String {
    format!("{relation_topic}.account")
}

/// The follow-count topic of a test mesh whose relation topic is `relation_topic`.
pub fn edge_count_topic_of(relation_topic: &str) -> String {
    format!("{relation_topic}.edge_count")
}

/// Topic names of one test mesh.
#[derive(Debug, Clone)]
pub struct Topics {
    /// Relation events.
    pub relation: String,
    /// Content events.
    pub content: String,
    /// Action events.
    pub counter: String,
    /// Follow counts (projection-svc's outbox → counter-svc).
    pub edge_count: String,
}

impl Topics {
    /// Fresh names.
    pub fn fresh() -> Self {
        let id = socialgraph_testkit::unique("");
        let relation = format!("sg.relation.t{id}");
        let edge_count = crate::edge_count_topic_of(&relation);
        Self { relation, content: format!("sg.content.t{id}"), counter: format!("sg.counter.t{id}"), edge_count }
    }
}

/// A counter-svc configuration for tests: shared Redis under `key_prefix`, the given topics,
/// projection-svc at `projection`.
pub fn counter_config(redis_url: &str, key_prefix: &str, topics: &Topics, projection: SocketAddr) -> CounterConfig {
    counter_config_on(redis_url, key_prefix, topics, projection, &socialgraph_testkit::kafka::brokers())
}

/// [`counter_config`] against the broker at `brokers`.
pub fn counter_config_on(redis_url: &str, key_prefix: &str, topics: &Topics, projection: SocketAddr, brokers: &[String]) -> CounterConfig {
    let mut c = CounterConfig::default();
    c.redis.url = redis_url.to_owned();
    c.redis.key_prefix = key_prefix.to_owned();
    // Tests share 2 cores with databases and a broker: allow slow round trips.
    c.redis.timeout_ms = 5_000;
    c.kafka.brokers = brokers.to_vec();
    c.kafka.relation_topic = topics.relation.clone();
    c.kafka.content_topic = topics.content.clone();
    c.kafka.counter_topic = topics.counter.clone();
    c.kafka.edge_count_topic = topics.edge_count.clone();
    c.kafka.partitions = 4;
    c.projection.url = format!("http://{projection}");
    c.auth.admin_token = Some(ADMIN_TOKEN.into());
    c
}

/// Waits until counter-svc's stored offsets (Redis hash `sg:coff:{counter}` under
/// `key_prefix`) equal the high watermarks of every partition of `topics`.
///
/// # Errors
/// Timed out.
pub async fn counter_caught_up(redis_url: &str, key_prefix: &str, topics: &[&str], deadline: Duration) -> anyhow::Result<()> {
    counter_caught_up_on(&socialgraph_testkit::kafka::brokers(), redis_url, key_prefix, topics, deadline).await
}

/// [`counter_caught_up`] against the broker at `brokers`.
///
/// # Errors
/// Timed out.
pub async fn counter_caught_up_on(brokers: &[String], redis_url: &str, key_prefix: &str, topics: &[&str], deadline: Duration) -> anyhow::Result<()> {
    let kafka = socialgraph_testkit::kafka::connect(brokers).await?;
    let watermarks: Vec<_> = topics.iter().map(|t| (*t, socialgraph_testkit::kafka::Watermarks::new(&kafka, t))).collect();
    let redis = redis_conn(redis_url).await?;
    let key = socialgraph_cache::keys::Keys::new(key_prefix).consumer_offsets("counter");
    socialgraph_testkit::eventually(deadline, "counter-svc to reach the high watermarks", || {
        let (watermarks, mut redis, key) = (&watermarks, redis.clone(), &key);
        async move {
            let stored: std::collections::HashMap<String, i64> = redis::AsyncCommands::hgetall(&mut redis, key).await?;
            for (t, w) in watermarks {
                for (p, hw) in w.read().await? {
                    if hw > 0 && stored.get(&format!("{t}/{p}")) != Some(&hw) {
                        return Ok(None);
                    }
                }
            }
            Ok(Some(()))
        }
    })
    .await
}

/// relation-svc, projection-svc and counter-svc on one fresh database, topics and key prefix.
pub struct Mesh {
    /// The database.
    pub db: TestDb,
    /// Topics.
    pub topics: Topics,
    /// Redis URL of counter-svc.
    pub redis_url: String,
    /// Key prefix of counter-svc.
    pub prefix: String,
    /// relation-svc.
    pub relation: Svc,
    /// projection-svc (replica 0 when there are more).
    pub projection: Svc,
    /// Further projection-svc replicas, each reporting only the partitions it owns: settling
    /// waits for all of them (empty unless a test adds some).
    pub projection_replicas: Vec<Svc>,
    /// counter-svc.
    pub counter: Svc,
    /// The broker every service of this mesh uses.
    pub brokers: Vec<String>,
}

impl Mesh {
    /// Starts the three services; counter-svc uses Redis at `redis_url`.
    ///
    /// # Errors
    /// A dependency is missing.
    pub async fn start(redis_url: &str) -> anyhow::Result<Self> {
        Self::start_on(Backend::Postgres, redis_url, &socialgraph_testkit::kafka::brokers()).await
    }

    /// Starts the three services on a fresh database of `backend`, counter-svc on Redis at
    /// `redis_url`, all against the broker at `brokers`.
    ///
    /// # Errors
    /// A dependency is missing.
    pub async fn start_on(backend: Backend, redis_url: &str, brokers: &[String]) -> anyhow::Result<Self> {
        Self::start_tuned(backend, redis_url, brokers, |_| {}).await
    }

    /// [`Self::start_on`] with the cache settings of relation-svc and projection-svc changed by
    /// `tune` (the restart configurations below do not carry the change).
    ///
    /// # Errors
    /// A dependency is missing.
    pub async fn start_tuned(
        backend: Backend,
        redis_url: &str,
        brokers: &[String],
        tune: impl Fn(&mut socialgraph_server::CacheSettings),
    ) -> anyhow::Result<Self> {
        let db = TestDb::create(backend).await?;
        let topics = Topics::fresh();
        let mut rc = relation_config(&db.url, &topics.relation);
        rc.kafka.brokers = brokers.to_vec();
        tune(&mut rc.cache);
        let relation = spawn_relation(rc).await?;
        let mut pc = projection_config(&db.url, &topics.relation, relation.addr);
        pc.kafka.brokers = brokers.to_vec();
        pc.kafka.content_topic = topics.content.clone();
        tune(&mut pc.cache);
        let projection = spawn_projection(pc).await?;
        let prefix = socialgraph_testkit::unique("c") + ":";
        let counter = spawn_counter(counter_config_on(redis_url, &prefix, &topics, projection.addr, brokers)).await?;
        let (redis_url, brokers, projection_replicas) = (redis_url.to_owned(), brokers.to_vec(), Vec::new());
        Ok(Self { db, topics, redis_url, prefix, relation, projection, projection_replicas, counter, brokers })
    }

    /// The relation-svc configuration of this mesh (to restart it on the same database and
    /// topic).
    pub fn relation_config(&self) -> RelationConfig {
        let mut c = relation_config(&self.db.url, &self.topics.relation);
        c.kafka.brokers = self.brokers.clone();
        c
    }

    /// The projection-svc configuration of this mesh (to restart it on the same database).
    pub fn projection_config(&self) -> ProjectionConfig {
        let mut c = projection_config(&self.db.url, &self.topics.relation, self.relation.addr);
        c.kafka.brokers = self.brokers.clone();
        c.kafka.content_topic = self.topics.content.clone();
        c
    }

    /// The counter-svc configuration of this mesh (to restart it).
    pub fn counter_config(&self) -> CounterConfig {
        counter_config_on(&self.redis_url, &self.prefix, &self.topics, self.projection.addr, &self.brokers)
    }

    /// Waits until the outbox is drained and projection-svc and counter-svc applied everything:
    /// the outbox again once the projection caught up, since its batches write the follow
    /// counts there.
    ///
    /// # Errors
    /// Timed out.
    pub async fn settle(&self, deadline: Duration) -> anyhow::Result<()> {
        outbox_drained(&self.db, deadline).await?;
        self.likes_relayed(deadline).await?;
        let projections: Vec<&Svc> = std::iter::once(&self.projection).chain(&self.projection_replicas).collect();
        projection_replicas_caught_up(&projections, &self.brokers, &self.topics.relation, deadline).await?;
        projection_replicas_caught_up(&projections, &self.brokers, &crate::account_topic_of(&self.topics.relation), deadline).await?;
        outbox_drained(&self.db, deadline).await?;
        let topics = [self.topics.relation.as_str(), self.topics.edge_count.as_str(), self.topics.content.as_str(), self.topics.counter.as_str()];
        counter_caught_up_on(&self.brokers, &self.redis_url, &self.prefix, &topics, deadline).await
    }

    /// Waits until counter-svc's like/fav outboxes are empty (every event handed to the broker).
    ///
    /// # Errors
    /// Timed out.
    pub async fn likes_relayed(&self, deadline: Duration) -> anyhow::Result<()> {
        let keys = socialgraph_cache::keys::Keys::new(self.prefix.clone());
        socialgraph_testkit::eventually(deadline, "counter-svc's like/fav outboxes to drain", || {
            let (keys, url) = (&keys, &self.redis_url);
            async move {
                let mut conn = redis_conn(url).await?;
                let members: Vec<String> = redis::AsyncCommands::zrange(&mut conn, keys.pending_entities(), 0, -1).await?;
                for m in members {
                    let Some((t, id)) = m.rsplit_once(':') else { continue };
                    let len: i64 = redis::AsyncCommands::llen(&mut conn, keys.entity(t, id.parse()?).outbox()).await?;
                    if len > 0 {
                        return Ok(None);
                    }
                }
                Ok(Some(()))
            }
        })
        .await
    }

    /// Settles the mesh, then checks every view against the `following` table: the follower
    /// table is the same rows transposed (an edge hidden by an inactive account is "not
    /// following" there), the counters of `users` are the exact counts, and their cached
    /// following lists (those cached) are the table's.
    ///
    /// # Errors
    /// Timed out, or an RPC or the database failed; a difference panics with both sides.
    pub async fn assert_views_exact(&self, users: &[i64], deadline: Duration) -> anyhow::Result<()> {
        self.settle(deadline).await?;
        let (following, follower) = both_tables(&self.db).await?;
        assert_eq!(follower, projected(following), "the follower table holds exactly the source's edges");
        let exact = crate::model::Model::default().users(&self.db, users).await?;
        for (u, counts) in &exact {
            let row = socialgraph_storage::following_counts::get(&self.db.conn, *u).await?;
            assert_eq!(row.map_or(0, |r| r.followings), counts.0 as i64, "relation-svc's following_count of {u} equals its edges");
        }
        let served = crate::model::served_users(&mut self.counter.counter().await?, users).await?;
        assert_eq!(served, exact, "counters equal the exact counts of the following table");
        let cache = crate::cache_settings(&self.topics.relation);
        for following in [true, false] {
            crate::cache::assert_cached_exact(&self.db, &cache.url, &cache.key_prefix, following, users).await?;
        }
        Ok(())
    }

    /// Re-derives the follower table from the source (a projection Rebuild of everything must
    /// write and delete nothing), then replays every event into the counters from the earliest
    /// offset (counter-svc restarted without its offsets) and checks that no counter of `users`
    /// moved.
    ///
    /// # Errors
    /// Timed out, or an RPC, Redis or the restart failed; a difference panics.
    pub async fn assert_rebuild_and_replay_change_nothing(&mut self, users: &[i64], deadline: Duration) -> anyhow::Result<()> {
        use socialgraph_proto::projection::v1::{RebuildRequest, rebuild_request};
        let mut pc = self.projection.projection().await?;
        let r = pc.rebuild(admin(RebuildRequest { target: Some(rebuild_request::Target::All(true)) })).await?.into_inner();
        assert_eq!((r.rows_written, r.rows_deleted), (0, 0), "a rebuild from the source agrees with the incremental result");
        let before = crate::model::served_users(&mut self.counter.counter().await?, users).await?;
        self.counter.shutdown.cancel();
        (&mut self.counter.task).await??;
        let keys = socialgraph_cache::keys::Keys::new(self.prefix.clone());
        let _: i64 = redis::AsyncCommands::del(&mut redis_conn(&self.redis_url).await?, keys.consumer_offsets("counter")).await?;
        self.counter = spawn_counter(self.counter_config()).await?;
        self.settle(deadline).await?;
        assert_eq!(crate::model::served_users(&mut self.counter.counter().await?, users).await?, before, "a full replay changes no counter");
        Ok(())
    }

    /// Stops everything and drops the database, each step within [`STOP_WITHIN`].
    ///
    /// # Errors
    /// A service ended with an error, or a step did not end in time (named).
    pub async fn stop(self) -> anyhow::Result<()> {
        let url = self.db.url.clone();
        bounded(&url, "counter-svc", self.counter.stop()).await?;
        bounded(&url, "projection-svc", self.projection.stop()).await?;
        for p in self.projection_replicas {
            bounded(&url, "a projection replica", p.stop()).await?;
        }
        bounded(&url, "relation-svc", self.relation.stop()).await?;
        bounded(&url, "dropping the database", self.db.drop_db()).await
    }
}

/// The follower table the `following` rows imply: the same edges, with one hidden by an
/// inactive account "not following".
pub fn projected(following: Vec<socialgraph_domain::Edge>) -> Vec<socialgraph_domain::Edge> {
    use socialgraph_domain::EdgeState;
    following
        .into_iter()
        .map(|e| if e.state == EdgeState::Hidden { socialgraph_domain::Edge { state: EdgeState::NotFollowing, ..e } } else { e })
        .collect()
}

/// How long one service may take to stop gracefully in a test (drain, final commits) before the
/// test fails naming it, instead of hanging until the CI's limit. A step slower than
/// [`SLOW_STOP`] prints the database's sessions (seen once in CI: projection-svc on MariaDB took
/// over 60 s to stop after relation-svc was killed mid-relay, under a loaded machine).
pub const STOP_WITHIN: Duration = Duration::from_secs(120);
/// See [`STOP_WITHIN`].
pub const SLOW_STOP: Duration = Duration::from_secs(30);

async fn bounded(db_url: &str, what: &str, f: impl std::future::Future<Output = anyhow::Result<()>>) -> anyhow::Result<()> {
    let sessions = || async { socialgraph_testkit::sessions(db_url).await.unwrap_or_else(|e| format!("(sessions unreadable: {e})")) };
    tokio::pin!(f);
    if let Ok(done) = tokio::time::timeout(SLOW_STOP, &mut f).await {
        return done;
    }
    println!("{what} has not stopped after {SLOW_STOP:?}; database sessions:\n{}", sessions().await);
    match tokio::time::timeout(STOP_WITHIN - SLOW_STOP, f).await {
        Ok(done) => done,
        Err(_) => Err(anyhow::anyhow!("{what} did not stop within {STOP_WITHIN:?}; database sessions:\n{}", sessions().await)),
    }
}
