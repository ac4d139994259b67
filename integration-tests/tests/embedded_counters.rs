//! The embedded mode's user counters on SQL tables, where counter-svc's follow-count consumers
//! write (`SqlFollowCounts`) beside the toggles, the feed and the rebuild (`SqlCounters`):
//! - a row is created only by a read counting every counter from the facts, so an event about a
//!   user without counters never creates one at a false 0 (a like given before stays counted);
//! - a rebuild stores each follow count with the version of the row it comes from, so a count
//!   read ahead of the projection can never be left behind by a projection batch that nets to
//!   no change (and hence no event).

use std::sync::Arc;

use sea_orm::{ConnectionTrait, DbBackend, Statement};
use sea_orm_migration::MigratorTrait;
use socialgraph_counter::backend::CounterBackend;
use socialgraph_counter::consume::FollowCountStore;
use socialgraph_counter::store::EdgeCounts;
use socialgraph_domain::ConsistencyToken;
use socialgraph_embedded::counters::{SqlCounters, SqlFollowCounts};
use socialgraph_proto::counter::v1::EntityRef;
use socialgraph_proto::events::v1::Metric;
use socialgraph_testkit::{Backend, TestDb};
use tokio::sync::Notify;

async fn embedded_db() -> anyhow::Result<(TestDb, SqlCounters, SqlFollowCounts)> {
    let db = TestDb::create(Backend::Sqlite).await?;
    socialgraph_migrations::EmbeddedMigrator::up(&db.conn, None).await?;
    let counters = SqlCounters { db: db.conn.clone(), counter_topic: socialgraph_events::COUNTER_TOPIC.into(), wake: Arc::new(Notify::new()) };
    let follow = SqlFollowCounts { db: db.conn.clone() };
    Ok((db, counters, follow))
}

/// (followers, followers_version, likes_received) as stored, `None` without a row.
async fn stored(db: &TestDb, user: i64) -> anyhow::Result<Option<(i64, i64, i64)>> {
    let sql = format!("SELECT followers, followers_version, likes_received FROM user_counter WHERE user_id = {user}");
    let row = db.conn.query_one_raw(Statement::from_string(DbBackend::Sqlite, sql)).await?;
    Ok(row.map(|r| Ok::<_, sea_orm::DbErr>((r.try_get_by_index(0)?, r.try_get_by_index(1)?, r.try_get_by_index(2)?))).transpose()?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_about_a_user_without_counters_creates_no_row_at_zero() -> anyhow::Result<()> {
    let (db, counters, follow) = embedded_db().await?;
    let owner = 50;
    let movie = EntityRef { entity_type: "movie".into(), entity_id: 7 };
    // A like for an owner without counters, then the projection's count event for the owner.
    assert!(counters.toggle(1, &movie, owner, Metric::Like, true).await?.changed);
    let written = follow
        .sync_follow_counts(&[EdgeCounts { user_id: owner, followings: 0, followers: 3, version: 1 }])
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    assert_eq!((written, stored(&db, owner).await?), (0, None), "the event leaves a user without counters alone");
    // The first read counts the facts: the like is there.
    let read = counters.user_counters(&[owner]).await?;
    assert_eq!(read[0].0[socialgraph_cache::counters::field::LIKES_RECEIVED], 1, "the like given before the counters existed");
    // From now on the events move the row.
    follow.sync_follow_counts(&[EdgeCounts { user_id: owner, followings: 0, followers: 3, version: 1 }]).await.map_err(|e| anyhow::anyhow!("{e}"))?;
    assert_eq!(stored(&db, owner).await?, Some((3, 1, 1)));
    db.drop_db().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_stores_the_projections_count_with_its_own_version() -> anyhow::Result<()> {
    let (db, counters, follow) = embedded_db().await?;
    let followee = 60;
    // Two follow edges; the projection has applied one of them (edge_count version 4).
    db.conn
        .execute_unprepared(&format!(
            "INSERT INTO following (follower_id, followee_id, state, version, followed_at_ms, updated_at_ms) VALUES \
             (1, {followee}, 1, 1, 1, 1), (2, {followee}, 1, 1, 2, 2)"
        ))
        .await?;
    db.conn.execute_unprepared(&format!("INSERT INTO edge_count (user_id, followings, followers, version) VALUES ({followee}, 0, 1, 4)")).await?;
    // A read holding the second follow's token answers from the edges themselves...
    let token = ConsistencyToken { follower_id: 2, followee_id: followee, version: 1, followings_version: 0 };
    let read = counters.user_counters_after(&[followee], token).await?;
    assert_eq!(read[0].0[socialgraph_cache::counters::field::FOLLOWERS], 2, "read-your-writes");
    // ...but stores the projection's count with the projection's version: were it 2 at version
    // 4, an unfollow netting out with the pending follow in one projection batch (no event)
    // would leave 2 for good.
    assert_eq!(stored(&db, followee).await?, Some((1, 4, 0)), "the stored count belongs to its version");
    follow
        .sync_follow_counts(&[EdgeCounts { user_id: followee, followings: 0, followers: 2, version: 5 }])
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    assert_eq!(stored(&db, followee).await?, Some((2, 5, 0)), "the projection's next count replaces it");
    db.drop_db().await
}
