//! Feed test helpers: a relation-svc with projection-svc replicas in chosen feed modes, each on
//! its own database, all consuming one relation topic and one content topic; waiting for them;
//! whole timelines; and the brute-force timeline they must equal.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use socialgraph_projection::feed::FeedSettings;
use socialgraph_proto::feed::v1::feed_service_client::FeedServiceClient;
use socialgraph_proto::feed::v1::{GetTimelineRequest, PublishPostRequest};
use socialgraph_testkit::{Backend, TestDb};
use tonic::transport::Channel;

use crate::*;

/// One projection-svc of a [`FeedMesh`] and its own database.
pub struct FeedReplica {
    /// Its database (the relation tables are unused here).
    pub db: TestDb,
    /// The service.
    pub svc: Svc,
    /// Its configuration (to restart it).
    pub config: ProjectionConfig,
}

/// relation-svc on one database plus projection-svc replicas with their own databases.
pub struct FeedMesh {
    /// relation-svc's database.
    pub db: TestDb,
    /// relation-svc.
    pub relation: Svc,
    /// Relation events.
    pub topic: String,
    /// Content events.
    pub content_topic: String,
    /// The projection replicas, one per requested feed setting.
    pub replicas: Vec<FeedReplica>,
}

impl FeedMesh {
    /// Starts relation-svc on a fresh `backend` database and one projection-svc per entry of
    /// `feeds`, each on a fresh database of the same backend.
    ///
    /// # Errors
    /// A dependency is missing.
    pub async fn start(backend: Backend, feeds: &[FeedSettings]) -> anyhow::Result<Self> {
        Self::start_tuned(backend, feeds, |_, _| {}).await
    }

    /// [`Self::start`] with `tune(i, config)` applied to replica `i`'s configuration.
    ///
    /// # Errors
    /// A dependency is missing.
    pub async fn start_tuned(backend: Backend, feeds: &[FeedSettings], tune: impl Fn(usize, &mut ProjectionConfig)) -> anyhow::Result<Self> {
        let (db, relation, topic) = relation_on(backend, |_| {}).await?;
        let content_topic = format!("{topic}.content");
        let mut replicas = Vec::new();
        for (i, f) in feeds.iter().enumerate() {
            let rdb = TestDb::create(backend).await?;
            let mut config = projection_config(&rdb.url, &topic, relation.addr);
            config.feed = f.clone();
            tune(i, &mut config);
            let svc = spawn_projection(config.clone()).await?;
            replicas.push(FeedReplica { db: rdb, svc, config });
        }
        Ok(Self { db, relation, topic, content_topic, replicas })
    }

    /// A FeedService client of replica `i`.
    ///
    /// # Errors
    /// It does not answer.
    pub async fn feed(&self, i: usize) -> anyhow::Result<FeedServiceClient<Channel>> {
        Ok(FeedServiceClient::new(self.replicas[i].svc.channel().await?))
    }

    /// Restarts replica `i` (after a stop or crash) with its configuration.
    ///
    /// # Errors
    /// It did not start.
    pub async fn restart(&mut self, i: usize) -> anyhow::Result<()> {
        let config = self.replicas[i].config.clone();
        self.replicas[i].svc = spawn_projection(config).await?;
        Ok(())
    }

    /// Waits until the outbox is drained, every replica applied both topics to their high
    /// watermarks and no push is left.
    ///
    /// # Errors
    /// Timed out.
    pub async fn settle(&self, deadline: Duration) -> anyhow::Result<()> {
        outbox_drained(&self.db, deadline).await?;
        for r in &self.replicas {
            projection_caught_up(&r.svc, &socialgraph_testkit::kafka::brokers(), &self.topic, deadline).await?;
            projection_caught_up(&r.svc, &socialgraph_testkit::kafka::brokers(), &self.content_topic, deadline).await?;
            socialgraph_testkit::eventually(deadline, "every push to finish", || async {
                let left = socialgraph_storage::feed::fanout_backlog(&r.db.conn).await?;
                if left > 0 {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Ok((left == 0).then_some(()))
            })
            .await?;
        }
        Ok(())
    }

    /// Stops every service and drops every database.
    ///
    /// # Errors
    /// A service failed or a database could not be dropped.
    pub async fn stop(self) -> anyhow::Result<()> {
        for r in self.replicas {
            r.svc.stop().await?;
            r.db.drop_db().await?;
        }
        self.relation.stop().await?;
        self.db.drop_db().await
    }
}

/// A post of a timeline: (post id, author id, created ms).
pub type Entry = (i64, i64, i64);

/// Every page of `user_id`'s timeline with pages of `page_size`, newest first.
///
/// # Errors
/// An RPC failed.
pub async fn whole_timeline(client: &mut FeedServiceClient<Channel>, user_id: i64, page_size: i32) -> anyhow::Result<Vec<Entry>> {
    let (mut out, mut token) = (Vec::new(), String::new());
    loop {
        let page = client.get_timeline(GetTimelineRequest { user_id, page_size, page_token: token, ..Default::default() }).await?.into_inner();
        let ms = |p: &socialgraph_proto::feed::v1::TimelinePost| p.created_at.as_ref().map(socialgraph_domain::timestamp_to_ms).unwrap_or_default();
        out.extend(page.posts.iter().map(|p| (p.post_id, p.author_id, ms(p))));
        if page.next_page_token.is_empty() {
            return Ok(out);
        }
        token = page.next_page_token;
    }
}

/// Publishes a post (created at `at_ms`).
///
/// # Errors
/// The RPC failed.
pub async fn publish(client: &mut FeedServiceClient<Channel>, author_id: i64, post_id: i64, at_ms: i64) -> anyhow::Result<()> {
    let req = PublishPostRequest { author_id, post_id, created_at: Some(socialgraph_domain::timestamp_from_ms(at_ms)) };
    client.publish_post(req).await?;
    Ok(())
}

/// The brute-force feed: who follows whom, every live post, every mute.
#[derive(Debug, Clone, Default)]
pub struct FeedModel {
    /// (follower, followee) pairs that stand.
    pub follows: BTreeSet<(i64, i64)>,
    /// post id → (author, created ms), live posts only.
    pub posts: BTreeMap<i64, (i64, i64)>,
    /// (muter, muted).
    pub mutes: BTreeSet<(i64, i64)>,
}

impl FeedModel {
    /// `user_id`'s timeline by definition: the live posts of the accounts it follows and does
    /// not mute, by (created, post id) descending.
    pub fn timeline(&self, user_id: i64) -> Vec<Entry> {
        let mut out: Vec<Entry> = self
            .posts
            .iter()
            .filter(|(_, (author, _))| self.follows.contains(&(user_id, *author)) && !self.mutes.contains(&(user_id, *author)))
            .map(|(id, (author, at))| (*id, *author, *at))
            .collect();
        out.sort_by_key(|e| std::cmp::Reverse((e.2, e.0)));
        out
    }
}
