//! What the counters must equal, computed from the facts the tests create: edges from the
//! following table, likes and favourites from the answers of the toggles (each (actor, entity)
//! pair is toggled by one task, so its last answer is its state), posts from the content
//! events a test produced.

use std::collections::{BTreeMap, HashMap};

use socialgraph_proto::counter::v1::counter_service_client::CounterServiceClient;
use socialgraph_proto::counter::v1::*;
use socialgraph_testkit::TestDb;
use tonic::transport::Channel;

/// A like/fav toggle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Toggle {
    /// Like.
    Like,
    /// Unlike.
    Unlike,
    /// Favourite.
    Fav,
    /// Unfavourite.
    Unfav,
}

/// The five counters of one user.
pub type Five = (u64, u64, u64, u64, u64);

/// Exact counters and entity counts of a test's world.
#[derive(Debug, Clone, Default)]
pub struct Model {
    /// (actor, entity id) → liked.
    pub liked: BTreeMap<(i64, i64), bool>,
    /// (actor, entity id) → faved.
    pub faved: BTreeMap<(i64, i64), bool>,
    /// entity id → owner.
    pub owner: BTreeMap<i64, i64>,
    /// author → published entity ids.
    pub posts: BTreeMap<i64, std::collections::BTreeSet<i64>>,
    /// entity → (time, deleted) of the content event that decided its state.
    pub post_times: BTreeMap<i64, (i64, bool)>,
}

/// Sends one toggle of `post` `entity` (owned by `owner`) and returns the RPC's answer.
///
/// # Errors
/// The RPC failed.
pub async fn toggle(c: &mut CounterServiceClient<Channel>, op: Toggle, actor: i64, entity: i64, owner: i64) -> Result<(bool, bool), tonic::Status> {
    let e = Some(EntityRef { entity_type: "post".into(), entity_id: entity });
    let r = match op {
        Toggle::Like => c.like(LikeRequest { actor_id: actor, entity: e, owner_id: owner }).await?.into_inner(),
        Toggle::Unlike => {
            let r = c.unlike(UnlikeRequest { actor_id: actor, entity: e, owner_id: owner }).await?.into_inner();
            LikeResponse { changed: r.changed, active: r.active }
        }
        Toggle::Fav => {
            let r = c.fav(FavRequest { actor_id: actor, entity: e, owner_id: owner }).await?.into_inner();
            LikeResponse { changed: r.changed, active: r.active }
        }
        Toggle::Unfav => {
            let r = c.unfav(UnfavRequest { actor_id: actor, entity: e, owner_id: owner }).await?.into_inner();
            LikeResponse { changed: r.changed, active: r.active }
        }
    };
    Ok((r.changed, r.active))
}

impl Model {
    /// Records the answer of a successful toggle.
    pub fn record(&mut self, op: Toggle, actor: i64, entity: i64, owner: i64, active: bool) {
        self.owner.insert(entity, owner);
        match op {
            Toggle::Like | Toggle::Unlike => self.liked.insert((actor, entity), active),
            Toggle::Fav | Toggle::Unfav => self.faved.insert((actor, entity), active),
        };
    }

    /// Records a content event: it decides the entity's state only when newer than the last
    /// one that did (at equal times a deletion wins), whatever order the events arrive in.
    pub fn content(&mut self, published: bool, author: i64, entity: i64, at_ms: i64) {
        if let Some((t, deleted)) = self.post_times.get(&entity)
            && (at_ms < *t || (at_ms == *t && (*deleted || published)))
        {
            return;
        }
        self.post_times.insert(entity, (at_ms, !published));
        let posts = self.posts.entry(author).or_default();
        if published {
            posts.insert(entity);
        } else {
            posts.remove(&entity);
        }
    }

    /// (likes, favs) of each entity ever toggled.
    pub fn entity_counts(&self) -> BTreeMap<i64, (u64, u64)> {
        let mut out: BTreeMap<i64, (u64, u64)> = self.owner.keys().map(|e| (*e, (0, 0))).collect();
        for ((_, e), on) in &self.liked {
            out.entry(*e).or_default().0 += u64::from(*on);
        }
        for ((_, e), on) in &self.faved {
            out.entry(*e).or_default().1 += u64::from(*on);
        }
        out
    }

    /// The exact five counters of `users`, with follow counts from the following table.
    ///
    /// # Errors
    /// Database errors.
    pub async fn users(&self, db: &TestDb, users: &[i64]) -> anyhow::Result<BTreeMap<i64, Five>> {
        let (following, _) = crate::both_tables(db).await?;
        let mut follows: HashMap<i64, (u64, u64)> = HashMap::new();
        for e in following.iter().filter(|e| e.state.as_i16() == 1) {
            follows.entry(e.follower_id).or_default().0 += 1;
            follows.entry(e.followee_id).or_default().1 += 1;
        }
        let mut received: HashMap<i64, (u64, u64)> = HashMap::new();
        for (e, (likes, favs)) in self.entity_counts() {
            let r = received.entry(self.owner[&e]).or_default();
            r.0 += likes;
            r.1 += favs;
        }
        Ok(users
            .iter()
            .map(|u| {
                let (fi, fr) = follows.get(u).copied().unwrap_or_default();
                let posts = self.posts.get(u).map_or(0, |p| p.len() as u64);
                let (l, f) = received.get(u).copied().unwrap_or_default();
                (*u, (fi, fr, posts, l, f))
            })
            .collect())
    }
}

/// The five counters of `users` as counter-svc serves them (100 per call).
///
/// # Errors
/// An RPC failed.
pub async fn served_users(c: &mut CounterServiceClient<Channel>, users: &[i64]) -> anyhow::Result<BTreeMap<i64, Five>> {
    let mut out = BTreeMap::new();
    for chunk in users.chunks(100) {
        let r = c.batch_get_user_counters(BatchGetUserCountersRequest { user_ids: chunk.to_vec(), ..Default::default() }).await?.into_inner();
        for u in r.counters {
            out.insert(u.user_id, (u.followings, u.followers, u.posts, u.likes_received, u.favs_received));
        }
    }
    Ok(out)
}

/// (likes, favs) of `entities` (posts) as counter-svc serves them.
///
/// # Errors
/// An RPC failed.
pub async fn served_entities(c: &mut CounterServiceClient<Channel>, entities: &[i64]) -> anyhow::Result<BTreeMap<i64, (u64, u64)>> {
    let mut out = BTreeMap::new();
    for chunk in entities.chunks(500) {
        let refs = chunk.iter().map(|e| EntityRef { entity_type: "post".into(), entity_id: *e }).collect();
        let r = c.batch_get_entity_counts(BatchGetEntityCountsRequest { entities: refs, metrics: vec![] }).await?.into_inner();
        for (e, counts) in chunk.iter().zip(r.counts) {
            let get = |m: i32| counts.counts.iter().find(|c| c.metric == m).map_or(0, |c| c.count);
            out.insert(*e, (get(1), get(2)));
        }
    }
    Ok(out)
}

/// Asserts that every counter of `users` and every toggled entity's counts equal the model.
///
/// # Errors
/// An RPC or database call failed.
pub async fn assert_model(model: &Model, db: &TestDb, c: &mut CounterServiceClient<Channel>, users: &[i64]) -> anyhow::Result<()> {
    let want = model.users(db, users).await?;
    let got = served_users(c, users).await?;
    let wrong: Vec<_> = users.iter().filter(|u| want[u] != got[u]).map(|u| (u, want[u], got[u])).collect();
    if !wrong.is_empty() {
        let off: Vec<i64> = wrong.iter().map(|(u, _, _)| **u).collect();
        panic!("{} users off (user, want, got): {:?}\n{}", wrong.len(), &wrong[..wrong.len().min(10)], layers(db, &off).await?);
    }
    let entities: Vec<i64> = model.owner.keys().copied().collect();
    assert_eq!(served_entities(c, &entities).await?, model.entity_counts(), "entity counts equal the facts");
    Ok(())
}

/// Where the follow counts of `users` stand in each layer under the counters, to tell which one
/// drifted: the projection's `edge_count` rows (with their versions), the counts its follower
/// table implies, and the edges of these users whose follower row differs from the following
/// row (state, version).
async fn layers(db: &TestDb, users: &[i64]) -> anyhow::Result<String> {
    let (following, follower) = crate::both_tables(db).await?;
    let rows = socialgraph_storage::counts::get_many(&db.conn, users).await?;
    let mut out = String::new();
    for (u, row) in users.iter().zip(rows) {
        let projected = |e: &&socialgraph_domain::Edge| e.state.as_i16() == 1;
        let fi = follower.iter().filter(projected).filter(|e| e.follower_id == *u).count();
        let fr = follower.iter().filter(projected).filter(|e| e.followee_id == *u).count();
        out.push_str(&format!("user {u}: edge_count ({}, {}) version {}; follower table ({fi}, {fr})\n", row.followings, row.followers, row.version));
    }
    let key = |e: &socialgraph_domain::Edge| (e.follower_id, e.followee_id);
    let projected: HashMap<(i64, i64), &socialgraph_domain::Edge> = follower.iter().map(|e| (key(e), e)).collect();
    for e in following.iter().filter(|e| users.contains(&e.follower_id) || users.contains(&e.followee_id)) {
        let p = projected.get(&key(e));
        if p.is_none_or(|p| p.state != e.state || p.version != e.version) {
            out.push_str(&format!("edge {:?}: following {:?} v{}, follower {:?}\n", key(e), e.state, e.version, p.map(|p| (p.state, p.version))));
        }
    }
    Ok(out)
}
