//! Part 8, cache, joins: ListCommonFollowing and ListFamiliarFollowers (pages of 50) with the
//! caches warm and off, beside ZINTER of the same two sorted sets (weights 1 0, the first
//! set's order) and the same join on PostgreSQL.

use rand::{Rng, SeedableRng, rngs::StdRng};
use socialgraph_cache::keys::Keys;
use socialgraph_integration_tests::{Mesh, cache_settings, raw_redis_conn};
use socialgraph_proto::projection::v1::ListFollowersRequest;
use socialgraph_proto::projection::v1::projection_service_client::ProjectionServiceClient;
use socialgraph_proto::relation::v1::relation_service_client::RelationServiceClient;
use socialgraph_proto::relation::v1::{ListCommonFollowingRequest, ListFamiliarFollowersRequest};
use tonic::transport::Channel;

use crate::cache::{none, timed};
use crate::report::{Hist, latency_rows, ms, print_table, progress, summarize};

/// The joins' latencies.
pub(crate) struct Joins {
    /// (what, service, raw): common warm, common off, familiar warm, familiar off.
    pub(crate) rows: Vec<(&'static str, Hist, Hist)>,
    /// The partner of each common-following read.
    pub(crate) common_others: Vec<i64>,
    /// The user of each familiar-followers read.
    pub(crate) familiar_others: Vec<i64>,
}

/// Times common-following pages of each of `users` with a random one of `common_partners`
/// and familiar-followers pages with a random one of `familiar_partners`, through `cached` and
/// `plain` (a relation-svc without caches).
pub(crate) async fn run(
    mesh: &Mesh,
    cached: &RelationServiceClient<Channel>,
    plain: &RelationServiceClient<Channel>,
    users: &[i64],
    common_partners: &[i64],
    familiar_partners: &[i64],
) -> anyhow::Result<Joins> {
    let reads = users.len();
    let mut rng = StdRng::seed_from_u64(5);
    let mut pick = |from: &[i64]| users.iter().map(|_| from[rng.random_range(0..from.len())]).collect::<Vec<i64>>();
    let (common_others, familiar_others) = (pick(common_partners), pick(familiar_partners));
    let join = |c: &RelationServiceClient<Channel>, a: i64, b: i64, common: bool| {
        let mut c = c.clone();
        async move {
            if common {
                c.list_common_following(ListCommonFollowingRequest { user_id: a, other_user_id: b, page_size: 50, page_token: String::new() })
                    .await?;
            } else {
                c.list_familiar_followers(ListFamiliarFollowersRequest { viewer_id: a, user_id: b, page_size: 50, page_token: String::new() })
                    .await?;
            }
            anyhow::Ok(())
        }
    };
    progress(&format!("{reads} common-following and familiar-followers pages: warm-up, warm, off, raw"));
    let mut projection = ProjectionServiceClient::new(mesh.projection.channel().await?);
    for i in 0..reads {
        join(cached, users[i], common_others[i], true).await?;
        projection.list_followers(ListFollowersRequest { user_id: familiar_others[i], page_size: 1, ..Default::default() }).await?;
    }
    crate::cache::fills_settled(&mesh.relation).await?;
    crate::cache::fills_settled(&mesh.projection).await?;
    let mut rows = Vec::new();
    for (common, what) in [(true, "common following (50)"), (false, "familiar followers (50)")] {
        let others = if common { &common_others } else { &familiar_others };
        let warm = timed(reads, none, |i| join(cached, users[i], others[i], common)).await?;
        let off = timed(reads, none, |i| join(plain, users[i], others[i], common)).await?;
        let keys = Keys::new(cache_settings(&mesh.topics.relation).key_prefix);
        let conn = raw_redis_conn(&cache_settings(&mesh.topics.relation).url).await?;
        let raw_redis = timed(reads, none, |i| {
            let mut conn = conn.clone();
            let second = if common { keys.following(others[i]) } else { keys.followers(others[i]) };
            let first = keys.following(users[i]);
            async move {
                let _: Vec<(Vec<u8>, f64)> =
                    redis::cmd("ZINTER").arg(2).arg(first).arg(second).arg("WEIGHTS").arg(1).arg(0).arg("WITHSCORES").query_async(&mut conn).await?;
                anyhow::Ok(())
            }
        })
        .await?;
        let pool = mesh.db.conn.get_postgres_connection_pool().clone();
        let sql = if common {
            "SELECT a.followee_id, a.followed_at_ms FROM following a JOIN following b \
             ON b.follower_id = $2 AND b.followee_id = a.followee_id AND b.state = 1 \
             WHERE a.follower_id = $1 AND a.state = 1 ORDER BY a.followed_at_ms DESC, a.followee_id DESC LIMIT 51"
        } else {
            "SELECT a.followee_id, a.followed_at_ms FROM following a JOIN following b \
             ON b.follower_id = a.followee_id AND b.followee_id = $2 AND b.state = 1 \
             WHERE a.follower_id = $1 AND a.state = 1 ORDER BY a.followed_at_ms DESC, a.followee_id DESC LIMIT 51"
        };
        let raw_pg = timed(reads, none, |i| {
            let (pool, a, b) = (pool.clone(), users[i], others[i]);
            async move {
                sea_orm::sqlx::query(sql).bind(a).bind(b).fetch_all(&pool).await?;
                anyhow::Ok(())
            }
        })
        .await?;
        rows.push((what, warm, raw_redis));
        rows.push((if common { "common following (50), cache off" } else { "familiar followers (50), cache off" }, off, raw_pg));
    }
    Ok(Joins { rows, common_others, familiar_others })
}

impl Joins {
    /// Prints the joins' table and summary lines.
    pub(crate) fn report(&self, reads: usize) {
        let pairs: Vec<(&str, &Hist, &Hist)> = self.rows.iter().map(|(w, s, r)| (*w, s, r)).collect();
        let table = latency_rows(&pairs);
        print_table(
            &format!("joins from the caches, {reads} reads per row, one client"),
            "socialgraph (gRPC)",
            "raw",
            &table,
            &[
                "raw = cached rows: ZINTER 2 of the user's following set and the other's following set (common) or the user's follower set \
                 (familiar), WEIGHTS 1 0; cache-off rows: the same join on PostgreSQL (LIMIT 51)"
                    .into(),
                "users: the sampled users of the following rows; partners: random accounts that follow (common) or are followed (familiar)".into(),
            ],
        );
        for (what, svc, raw) in self.rows.iter().filter(|(w, ..)| !w.ends_with("off")) {
            summarize(format!("{what}, warm: p99 (vs raw ZINTER)"), ms(svc, 0.99), ms(raw, 0.99), "ms", "<= 3x raw Redis");
        }
    }
}
