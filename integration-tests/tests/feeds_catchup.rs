//! Catching up on a home timeline on real databases and the broker: the walk up from a post
//! (GetTimeline's `min_post_id`, oldest first) and the walk down to it (`since_post_id`),
//! started from many posts with several page sizes across the inbox floor, every page compared
//! with the brute-force model while posts arrive, get deleted and authors are unfollowed or
//! muted; and the refusals (both fields, bad and unknown ids, tokens of another walk).

use std::collections::BTreeMap;

use socialgraph_integration_tests::feeds::*;
use socialgraph_integration_tests::reason;
use socialgraph_projection::feed::{FeedMode, FeedSettings};
use socialgraph_proto::feed::v1::GetTimelineRequest;
use socialgraph_proto::feed::v1::feed_service_client::FeedServiceClient;
use socialgraph_proto::relation::v1::MuteRequest;
use socialgraph_testkit::Backend;
use tonic::Code;
use tonic::transport::Channel;
use tonic_types::StatusExt;

const SETTLE: std::time::Duration = std::time::Duration::from_secs(120);
const T0: i64 = 1_700_000_000_000;

/// One walk in progress, checked page by page.
struct Walk {
    user: i64,
    /// Up from the bound (`min_post_id`), else down to it (`since_post_id`).
    up: bool,
    bound: i64,
    bound_key: (i64, i64),
    size: i32,
    token: String,
    /// (created ms, post id) of the last post listed.
    last: Option<(i64, i64)>,
    listed: Vec<i64>,
    done: bool,
}

impl Walk {
    fn new(user: i64, up: bool, bound: i64, published: &BTreeMap<i64, (i64, i64)>, size: i32) -> Self {
        let bound_key = (published[&bound].1, bound);
        Self { user, up, bound, bound_key, size, token: String::new(), last: None, listed: Vec::new(), done: false }
    }

    fn request(&self) -> GetTimelineRequest {
        let (min_post_id, since_post_id) = if self.up { (self.bound, 0) } else { (0, self.bound) };
        GetTimelineRequest { user_id: self.user, page_size: self.size, page_token: self.token.clone(), min_post_id, since_post_id }
    }

    /// What the model says the rest of the walk holds, in its order.
    fn rest(&self, model: &FeedModel) -> Vec<Entry> {
        if self.up {
            return model.newer(self.user, self.last.unwrap_or(self.bound_key));
        }
        let below = |e: &Entry| self.last.is_none_or(|l| (e.2, e.0) < l);
        model.timeline(self.user).into_iter().filter(|e| (e.2, e.0) > self.bound_key && below(e)).collect()
    }

    /// Reads the next page and checks it is exactly the model's next posts of the walk, with a
    /// token exactly when more remain.
    async fn step(&mut self, client: &mut FeedServiceClient<Channel>, model: &FeedModel, what: &str) -> anyhow::Result<()> {
        let rest = self.rest(model);
        let (posts, next) = timeline_page(client, self.request()).await?;
        let want = &rest[..rest.len().min(self.size as usize)];
        let walk = format!("{what}: user {}, {} post {}, pages of {}", self.user, if self.up { "up from" } else { "down to" }, self.bound, self.size);
        assert_eq!(posts, want, "{walk}: the page after {:?}", self.last);
        assert_eq!(next.is_empty(), rest.len() <= self.size as usize, "{walk}: a token exactly when posts remain");
        self.listed.extend(posts.iter().map(|e| e.0));
        self.last = posts.last().map(|e| (e.2, e.0)).or(self.last);
        (self.token, self.done) = (next.clone(), next.is_empty());
        Ok(())
    }

    async fn finish(&mut self, client: &mut FeedServiceClient<Channel>, model: &FeedModel, what: &str) -> anyhow::Result<()> {
        while !self.done {
            self.step(client, model, what).await?;
        }
        let mut unique = self.listed.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), self.listed.len(), "{what}: no post listed twice by {:?}", self.listed);
        Ok(())
    }
}

fn settings() -> FeedSettings {
    FeedSettings { mode: FeedMode::Hybrid, pull_threshold: 2, inbox_size: 4, fanout_batch: 2, ..FeedSettings::default() }
}

fn fields(status: &tonic::Status) -> Vec<String> {
    status.get_error_details().bad_request().map(|b| b.field_violations.iter().map(|v| v.field.clone()).collect()).unwrap_or_default()
}

async fn catch_up(backend: Backend) -> anyhow::Result<()> {
    let mut d = Driver { mesh: FeedMesh::start(backend, &[settings()]).await?, model: FeedModel::default() };
    let mut published = BTreeMap::new();
    // 10, 12 and 13 are pushed (at most two followers), 11 pulled (four); user 1's inbox keeps 4
    // rows, so most of its timeline lies below its floor.
    for (a, b) in [(1, 10), (2, 10), (1, 11), (2, 11), (3, 11), (4, 11), (1, 12), (1, 13)] {
        d.follow(a, b).await?;
    }
    d.mesh.settle(SETTLE).await?;
    for i in 1..=24i64 {
        let author = [10, 11, 12, 10, 13, 11][(i % 6) as usize];
        // Every fourth post shares its time with the one before: the post id orders them.
        let at = T0 + (i - i64::from(i % 4 == 0)) * 1000;
        d.post(author, 100 + i, at).await?;
        published.insert(100 + i, (author, at));
    }
    for id in [106, 110, 117] {
        d.delete(published[&id].0, id).await?;
    }
    d.check([1, 2], "before the walks").await?;
    let floor = socialgraph_storage::feed::inbox_state(&d.mesh.replicas[0].db.conn, 1).await?.floor;
    assert!((T0 + 1000..T0 + 24_000).contains(&floor.created_at_ms), "user 1's floor lies inside the posts walked: {floor:?}");
    let mut client = d.mesh.feed(0).await?;

    // From every third post (a deleted one, the oldest, the newest among them) both ways, each
    // with several page sizes; the bound need not be in the user's timeline.
    for bound in (101..=124).step_by(3).chain([106, 124]) {
        for size in [1, 2, 3, 50] {
            for (user, up) in [(1, true), (1, false), (2, true), (2, false)] {
                Walk::new(user, up, bound, &published, size).finish(&mut client, &d.model, "a still timeline").await?;
            }
        }
    }

    // Walks under way while the timeline changes: new posts above and below their positions,
    // deletes of posts listed and not yet listed, an unfollow and a mute.
    let mut walks: Vec<Walk> = [(true, 102, 2), (true, 108, 3), (true, 120, 1), (false, 103, 2), (false, 112, 1)]
        .map(|(up, b, s)| Walk::new(1, up, b, &published, s))
        .into();
    for w in &mut walks {
        w.step(&mut client, &d.model, "first page").await?;
    }
    let changes: [&[(i64, i64, i64)]; 3] = [&[(10, 201, 30), (11, 202, 31), (12, 203, 9)], &[(13, 204, 32), (10, 205, 5)], &[(11, 206, 33)]];
    for (round, posts) in changes.into_iter().enumerate() {
        for &(author, id, secs) in posts {
            d.post(author, id, T0 + secs * 1000).await?;
            published.insert(id, (author, T0 + secs * 1000));
        }
        match round {
            0 => {
                d.delete(published[&122].0, 122).await?;
                d.delete(published[&103].0, 103).await?;
            }
            1 => {
                d.unfollow(1, 12).await?;
                d.mesh.relation.client().await?.mute(MuteRequest { muter_id: 1, muted_id: 13 }).await?;
                d.model.mutes.insert((1, 13));
            }
            _ => d.delete(published[&201].0, 201).await?,
        }
        d.mesh.settle(SETTLE).await?;
        for w in walks.iter_mut().filter(|w| !w.done) {
            w.step(&mut client, &d.model, &format!("after change {round}")).await?;
        }
    }
    for w in &mut walks {
        w.finish(&mut client, &d.model, "to the end while it changed").await?;
    }
    let top = d.model.timeline(1).first().map(|e| e.0);
    assert_eq!(walks[0].listed.last().copied(), top, "the walk up ends at the newest post");
    assert!(walks[0].listed.contains(&206) && !walks[0].listed.contains(&201), "it lists what arrived above it, not what went");
    assert!(!walks[3].listed.contains(&206), "the walk down lists nothing above its first page");

    refusals(&mut client).await?;
    d.mesh.stop().await
}

async fn refusals(client: &mut FeedServiceClient<Channel>) -> anyhow::Result<()> {
    let req = |min_post_id, since_post_id, page_token: &str| GetTimelineRequest {
        user_id: 1,
        page_size: 2,
        page_token: page_token.to_owned(),
        min_post_id,
        since_post_id,
    };
    let err = |s: tonic::Status| (s.code(), reason(&s), fields(&s));
    let invalid = |r: &str, f: &str| (Code::InvalidArgument, r.to_owned(), vec![f.to_owned()]);
    let cases = [
        (req(101, 102, ""), invalid("INVALID_ARGUMENT", "since_post_id")),
        (req(-1, 0, ""), invalid("INVALID_ARGUMENT", "min_post_id")),
        (req(0, -1, ""), invalid("INVALID_ARGUMENT", "since_post_id")),
        (req(999_999, 0, ""), invalid("UNKNOWN_POST", "min_post_id")),
        (req(0, 999_999, ""), invalid("UNKNOWN_POST", "since_post_id")),
    ];
    for (r, want) in cases {
        let what = format!("{r:?}");
        assert_eq!(client.get_timeline(r).await.map(|_| ()).map_err(err), Err(want), "{what}");
    }
    // A token continues only the walk that issued it: same walk, same post, same user.
    let up = timeline_page(client, req(101, 0, "")).await?.1;
    let down_to = timeline_page(client, req(0, 101, "")).await?.1;
    let plain = timeline_page(client, req(0, 0, "")).await?.1;
    assert!(![&up, &down_to, &plain].iter().any(|t| t.is_empty()), "each walk has a second page");
    let mut other_user = req(101, 0, &up);
    other_user.user_id = 2;
    let cases = [req(104, 0, &up), req(0, 101, &up), req(0, 0, &up), req(101, 0, &down_to), req(101, 0, &plain), req(0, 101, &plain), other_user];
    for r in cases {
        let what = format!("{r:?}");
        assert_eq!(client.get_timeline(r).await.map(|_| ()).map_err(err), Err(invalid("BAD_PAGE_TOKEN", "page_token")), "{what}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn walks_up_from_and_down_to_a_post_list_exactly_the_newer_posts_on_postgres() -> anyhow::Result<()> {
    catch_up(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn walks_up_from_and_down_to_a_post_list_exactly_the_newer_posts_on_mariadb() -> anyhow::Result<()> {
    catch_up(Backend::MariaDb).await
}
