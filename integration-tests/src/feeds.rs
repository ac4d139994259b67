//! Feed test helpers: a relation-svc with projection-svc replicas in chosen feed modes, each on
//! its own database, all consuming one relation topic and one content topic; waiting for them;
//! whole timelines and single pages; the brute-force timeline they must equal; and a driver
//! that writes to the mesh and the model together.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use socialgraph_projection::feed::FeedSettings;
use socialgraph_proto::feed::v1::feed_service_client::FeedServiceClient;
use socialgraph_proto::feed::v1::{DeletePostRequest, GetTimelineRequest, PublishPostRequest, TimelinePost};
use socialgraph_proto::relation::v1::{FollowRequest, UnfollowRequest};
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

    /// Waits until the outbox is drained, every replica applied its three topics to their high
    /// watermarks and no push is left.
    ///
    /// # Errors
    /// Timed out.
    pub async fn settle(&self, deadline: Duration) -> anyhow::Result<()> {
        outbox_drained(&self.db, deadline).await?;
        for r in &self.replicas {
            projection_caught_up(&r.svc, &socialgraph_testkit::kafka::brokers(), &self.topic, deadline).await?;
            projection_caught_up(&r.svc, &socialgraph_testkit::kafka::brokers(), &self.content_topic, deadline).await?;
            // The mutes timelines leave out come as account events.
            projection_caught_up(&r.svc, &socialgraph_testkit::kafka::brokers(), &crate::account_topic_of(&self.topic), deadline).await?;
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

/// A listed post as an [`Entry`].
pub fn entry_of(p: &TimelinePost) -> Entry {
    (p.post_id, p.author_id, p.created_at.as_ref().map(socialgraph_domain::timestamp_to_ms).unwrap_or_default())
}

/// One GetTimeline page: its posts and next page token.
///
/// # Errors
/// The RPC failed.
pub async fn timeline_page(client: &mut FeedServiceClient<Channel>, req: GetTimelineRequest) -> Result<(Vec<Entry>, String), tonic::Status> {
    let page = client.get_timeline(req).await?.into_inner();
    Ok((page.posts.iter().map(entry_of).collect(), page.next_page_token))
}

/// Every page of `user_id`'s timeline with pages of `page_size`, newest first.
///
/// # Errors
/// An RPC failed.
pub async fn whole_timeline(client: &mut FeedServiceClient<Channel>, user_id: i64, page_size: i32) -> anyhow::Result<Vec<Entry>> {
    let (mut out, mut token) = (Vec::new(), String::new());
    loop {
        let (posts, next) = timeline_page(client, GetTimelineRequest { user_id, page_size, page_token: token, ..Default::default() }).await?;
        out.extend(posts);
        if next.is_empty() {
            return Ok(out);
        }
        token = next;
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

    /// The entries of `user_id`'s timeline strictly newer than `after` (created ms, post id),
    /// oldest first: what the walk up from a post must list.
    pub fn newer(&self, user_id: i64, after: (i64, i64)) -> Vec<Entry> {
        let mut out: Vec<Entry> = self.timeline(user_id).into_iter().filter(|e| (e.2, e.0) > after).collect();
        out.reverse();
        out
    }
}

/// How long a [`Driver`] waits for the mesh to settle.
const SETTLE: Duration = Duration::from_secs(120);

/// The mesh's write side and the model kept beside it.
pub struct Driver {
    /// The mesh written to.
    pub mesh: FeedMesh,
    /// What its timelines must show.
    pub model: FeedModel,
}

impl Driver {
    /// `a` follows `b`.
    ///
    /// # Errors
    /// The RPC failed.
    pub async fn follow(&mut self, a: i64, b: i64) -> anyhow::Result<()> {
        self.mesh.relation.client().await?.follow(FollowRequest { follower_id: a, followee_id: b }).await?;
        self.model.follows.insert((a, b));
        Ok(())
    }

    /// `a` unfollows `b`.
    ///
    /// # Errors
    /// The RPC failed.
    pub async fn unfollow(&mut self, a: i64, b: i64) -> anyhow::Result<()> {
        self.mesh.relation.client().await?.unfollow(UnfollowRequest { follower_id: a, followee_id: b }).await?;
        self.model.follows.remove(&(a, b));
        Ok(())
    }

    /// `author` publishes post `id` at `at_ms`.
    ///
    /// # Errors
    /// The RPC failed.
    pub async fn post(&mut self, author: i64, id: i64, at_ms: i64) -> anyhow::Result<()> {
        publish(&mut self.mesh.feed(0).await?, author, id, at_ms).await?;
        self.model.posts.insert(id, (author, at_ms));
        Ok(())
    }

    /// `author` deletes post `id`.
    ///
    /// # Errors
    /// The RPC failed.
    pub async fn delete(&mut self, author: i64, id: i64) -> anyhow::Result<()> {
        self.mesh.feed(0).await?.delete_post(DeletePostRequest { author_id: author, post_id: id }).await?;
        self.model.posts.remove(&id);
        Ok(())
    }

    /// Settles, then compares every user's whole timeline, read with several page sizes.
    ///
    /// # Errors
    /// The mesh did not settle or an RPC failed; a difference panics.
    pub async fn check(&self, users: impl IntoIterator<Item = i64>, when: &str) -> anyhow::Result<()> {
        self.mesh.settle(SETTLE).await?;
        let mut client = self.mesh.feed(0).await?;
        for u in users {
            let want = self.model.timeline(u);
            for size in [1, 3, 50] {
                assert_eq!(whole_timeline(&mut client, u, size).await?, want, "{when}: user {u}'s timeline (pages of {size})");
            }
        }
        Ok(())
    }
}
