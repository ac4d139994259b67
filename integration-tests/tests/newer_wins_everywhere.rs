//! "The newer version wins" has one definition (`socialgraph_domain::newer_wins`) and one table
//! of cases (`socialgraph_domain::NEWER_WINS`). The Rust paths call the function; the paths that
//! apply the rule where the data lives are checked here against the same table: the
//! conditional upsert of the versioned copy tables on PostgreSQL, MariaDB and SQLite (alone, and
//! behind the Rust check of the block and mute copies), the Lua scripts of counter-svc's Redis
//! that copy follow counts, followings and unread counts, and the SQL of the embedded mode's
//! counters that counter-svc's consumers write there.

use std::time::Duration;

use socialgraph_counter::store::{EdgeCounts, Followings, Store};
use socialgraph_counter::unread::UnreadRow;
use socialgraph_domain::{NEWER_WINS, newer_wins};
use socialgraph_storage::block_pairs::{self, PairTable};
use socialgraph_storage::mute_versions::{self, MuteTable};
use socialgraph_testkit::{Backend, TestDb};

#[test]
fn the_rust_rule_is_its_table() {
    for &(stored, incoming, applies) in NEWER_WINS {
        assert_eq!(newer_wins(stored, incoming), applies, "stored {stored:?}, incoming {incoming}");
    }
}

async fn sql_paths(backend: Backend) -> anyhow::Result<()> {
    let db = TestDb::create(backend).await?;
    let conn = &db.conn;
    for (i, &(stored, incoming, applies)) in NEWER_WINS.iter().enumerate() {
        let case = format!("{backend:?}: stored {stored:?}, incoming {incoming}");
        let key = (i as i64 + 1, i as i64 + 1_000);
        // The statement alone: `put_flag`, the write of every versioned copy table.
        if let Some(s) = stored {
            block_pairs::put_flag(conn, "message_block_copy", ("low_id", "high_id", "blocked"), key, false, s, 1).await?;
        }
        block_pairs::put_flag(conn, "message_block_copy", ("low_id", "high_id", "blocked"), key, true, incoming, 2).await?;
        let row = block_pairs::get(conn, PairTable::MessageCopy, key).await?;
        let expected = if applies { (true, incoming) } else { (false, stored.unwrap_or_default()) };
        assert_eq!(row, Some(expected), "the upsert: {case}");

        // Behind the Rust check: the block copy and the mute copy.
        let key = (i as i64 + 1, i as i64 + 2_000);
        if let Some(s) = stored {
            block_pairs::apply_copy(conn, key, false, s, 1).await?;
            mute_versions::apply_copy(conn, key, false, s, 1).await?;
        }
        assert_eq!(block_pairs::apply_copy(conn, key, true, incoming, 2).await?, applies, "block copy: {case}");
        assert_eq!(block_pairs::get(conn, PairTable::MessageCopy, key).await?, Some(expected), "block copy: {case}");
        assert_eq!(mute_versions::apply_copy(conn, key, true, incoming, 2).await?, applies, "mute copy: {case}");
        assert_eq!(mute_versions::get(conn, MuteTable::TimelineCopy, key, false).await?, Some(expected), "mute copy: {case}");
    }
    db.drop_db().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_versioned_copy_statements_follow_the_table_on_postgres() -> anyhow::Result<()> {
    sql_paths(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_versioned_copy_statements_follow_the_table_on_mariadb() -> anyhow::Result<()> {
    sql_paths(Backend::MariaDb).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_versioned_copy_statements_follow_the_table_on_sqlite() -> anyhow::Result<()> {
    sql_paths(Backend::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_counter_statements_follow_the_table() -> anyhow::Result<()> {
    use sea_orm::ConnectionTrait;
    use sea_orm_migration::MigratorTrait;
    use socialgraph_counter::consume::FollowCountStore;
    let db = TestDb::create(Backend::Sqlite).await?;
    socialgraph_migrations::EmbeddedMigrator::up(&db.conn, None).await?;
    let counts = socialgraph_embedded::counters::SqlFollowCounts { db: db.conn.clone() };
    let read = |user: i64| {
        let conn = db.conn.clone();
        async move {
            let sql = format!("SELECT followings, followings_version, followers, followers_version FROM user_counter WHERE user_id = {user}");
            let row = conn.query_one_raw(sea_orm::Statement::from_string(sea_orm::DbBackend::Sqlite, sql)).await?.expect("the row exists");
            Ok::<_, anyhow::Error>((
                row.try_get_by_index::<i64>(0)?,
                row.try_get_by_index::<i64>(1)?,
                row.try_get_by_index::<i64>(2)?,
                row.try_get_by_index::<i64>(3)?,
            ))
        }
    };
    let fail = |e| anyhow::anyhow!("{e}");
    for (i, &(stored, incoming, applies)) in NEWER_WINS.iter().enumerate() {
        let case = format!("stored {stored:?}, incoming {incoming}");
        // Followers from projection events: a row without them, or one at `stored`.
        let user = i as i64 + 1;
        db.conn.execute_unprepared(&format!("INSERT INTO user_counter (user_id) VALUES ({user})")).await?;
        if let Some(s) = stored {
            counts.sync_follow_counts(&[EdgeCounts { user_id: user, followings: 1, followers: 1, version: s }]).await.map_err(fail)?;
        }
        let written =
            counts.sync_follow_counts(&[EdgeCounts { user_id: user, followings: 2, followers: 2, version: incoming }]).await.map_err(fail)?;
        assert_eq!(written == 1, applies, "followers: {case}");
        let (_, _, followers, version) = read(user).await?;
        let expected = if applies { (2, incoming) } else { (1, stored.unwrap_or_default()) };
        assert_eq!((followers, version), expected, "followers: {case}");

        // Followings from relation events: a row without them, or one at `stored`.
        let user = i as i64 + 1_000;
        db.conn.execute_unprepared(&format!("INSERT INTO user_counter (user_id) VALUES ({user})")).await?;
        if let Some(s) = stored {
            counts.sync_followings(&[Followings { user_id: user, followings: 1, version: s }]).await.map_err(fail)?;
        }
        let written = counts.sync_followings(&[Followings { user_id: user, followings: 2, version: incoming }]).await.map_err(fail)?;
        assert_eq!(written == 1, applies, "followings: {case}");
        let (followings, version, _, _) = read(user).await?;
        let expected = if applies { (2, incoming) } else { (1, stored.unwrap_or_default()) };
        assert_eq!((followings, version), expected, "followings: {case}");
    }
    db.drop_db().await
}

fn store() -> anyhow::Result<Store> {
    let pool = socialgraph_cache::pool(&socialgraph_testkit::redis_url(), 4, Duration::from_secs(2))?;
    Ok(Store {
        pool,
        keys: socialgraph_cache::keys::Keys::new(socialgraph_testkit::unique("sgnw")),
        scripts: Default::default(),
        entity_scripts: Default::default(),
        timeout: Duration::from_secs(5),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lua_scripts_follow_the_table() -> anyhow::Result<()> {
    let store = store()?;
    let redis_down = |e| anyhow::anyhow!("{e} (is Redis up? `make deps` starts it)");
    for (i, &(stored, incoming, applies)) in NEWER_WINS.iter().enumerate() {
        let case = format!("stored {stored:?}, incoming {incoming}");
        // Follow counts from projection events (SYNC_EDGES): no value yet, or one at `stored`.
        let user = i as i64 + 1;
        if let Some(s) = stored {
            store.sync_edges(&[EdgeCounts { user_id: user, followings: 1, followers: 1, version: s }], false).await.map_err(redis_down)?;
        }
        let written = store.sync_edges(&[EdgeCounts { user_id: user, followings: 2, followers: 2, version: incoming }], false).await?;
        assert_eq!(written[0].is_some(), applies, "SYNC_EDGES: {case}");
        let followers = store.read(&[user]).await?[0].map(|s| s.0[1]);
        assert_eq!(followers, Some(if applies { 2 } else { 1 }), "SYNC_EDGES: {case}");

        // Followings from relation events (SYNC_FOLLOWINGS): a value without them, or one at `stored`.
        let user = i as i64 + 1_000;
        store.sync_edges(&[EdgeCounts { user_id: user, followings: 0, followers: 0, version: 1 }], false).await?;
        if let Some(s) = stored {
            store.sync_followings(&[Followings { user_id: user, followings: 1, version: s }]).await?;
        }
        let written = store.sync_followings(&[Followings { user_id: user, followings: 2, version: incoming }]).await?;
        assert_eq!(written == 1, applies, "SYNC_FOLLOWINGS: {case}");
        let stored_value = store.read_stored(user).await?.expect("the value exists");
        let expected = if applies { (2, incoming) } else { (1, stored.unwrap_or(-1)) };
        assert_eq!((stored_value.counters.0[0], stored_value.followings_version), expected, "SYNC_FOLLOWINGS: {case}");

        // Unread counts from message events (SYNC_UNREAD): no membership yet, or one at `stored`.
        let user = i as i64 + 2_000;
        if let Some(s) = stored {
            store.sync_unread(&[UnreadRow { user_id: user, conversation_id: 7, version: s, count: 1 }]).await?;
        }
        let applied = store.sync_unread(&[UnreadRow { user_id: user, conversation_id: 7, version: incoming, count: 2 }]).await?;
        assert_eq!(applied == 1, applies, "SYNC_UNREAD: {case}");
        let total = store.read_unread(user).await?.total;
        assert_eq!(total, if applies { 2 } else { 1 }, "SYNC_UNREAD: {case}");
    }
    Ok(())
}
