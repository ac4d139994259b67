//! The bulk statements of the storage layer give the same answers on every backend, for lists
//! far longer than one statement's chunk: on PostgreSQL they travel as arrays (`unnest`,
//! `= ANY`), elsewhere as multi-row statements in chunks. Each case here runs on PostgreSQL,
//! MariaDB and SQLite against a fresh migrated database.

use std::collections::{BTreeMap, BTreeSet};

use socialgraph_domain::{Edge, EdgeState};
use socialgraph_storage::accounts::{self, Account, AccountStatus};
use socialgraph_storage::counts::{self, CountDelta};
use socialgraph_storage::edges::{self, EdgeTable};
use socialgraph_storage::offsets::{self, StoredOffset};
use socialgraph_storage::outbox::{self, NewOutboxRow};
use socialgraph_testkit::{Backend, TestDb};

fn edge(follower_id: i64, followee_id: i64, n: i64) -> Edge {
    let state = if n % 3 == 0 { EdgeState::NotFollowing } else { EdgeState::Following };
    Edge { follower_id, followee_id, state, version: n % 7 + 1, followed_at_ms: 1_000 + n, updated_at_ms: 2_000 + n }
}

/// 3,000 edges written in one call read back exactly among 5,000 asked pairs (2,000 absent,
/// some asked twice), from both edge tables, locked or not; the blocked ones are found.
async fn edges_read_back_exactly(backend: Backend) -> anyhow::Result<()> {
    let db = TestDb::create(backend).await?;
    let written: Vec<Edge> = (0..3_000).map(|n| edge(n % 97 + 1, n + 1_000, n)).collect();
    let unique: BTreeMap<(i64, i64), Edge> = written.iter().map(|e| ((e.follower_id, e.followee_id), *e)).collect();
    assert_eq!(unique.len(), written.len(), "the generated edges are distinct pairs");
    let mut asked: Vec<(i64, i64)> = unique.keys().copied().collect();
    asked.extend((0..2_000).map(|n| (n + 50_000, n + 60_000)));
    asked.extend(unique.keys().take(300).copied());
    for table in [EdgeTable::Following, EdgeTable::Follower] {
        edges::insert(&db.conn, table, &written).await?;
        for for_update in [false, true] {
            let mut found = edges::get_many(&db.conn, table, &asked, for_update).await?;
            found.sort_by_key(|e| (e.follower_id, e.followee_id));
            let expected: Vec<Edge> = unique.values().copied().collect();
            assert_eq!(found, expected, "{backend:?} {table:?} for_update={for_update}: every stored edge once, nothing else");
        }
    }
    let blocked: Vec<(i64, i64)> = unique.keys().step_by(11).copied().collect();
    for &(f, e) in &blocked {
        edges::mark_blocked(&db.conn, f, e, true, 5).await?;
    }
    let found = edges::blocked_among(&db.conn, &asked).await?;
    assert_eq!(found, blocked.iter().copied().collect(), "{backend:?}: exactly the blocked pairs");
    db.drop_db().await
}

/// 2,500 outbox rows written in one call come back in the order written (ids ascending);
/// deleting every other id leaves exactly the rest.
async fn outbox_rows_keep_their_order(backend: Backend) -> anyhow::Result<()> {
    let db = TestDb::create(backend).await?;
    let rows: Vec<NewOutboxRow> = (0..2_500)
        .map(|n| NewOutboxRow {
            topic: format!("topic-{}", n % 3),
            partition_key: 7_919 * n % 1_000,
            payload: vec![(n % 256) as u8, (n / 256) as u8, 0, 255],
            headers: format!("event-type: t{n}\nschema: s"),
            created_at_ms: 10_000 - n,
        })
        .collect();
    outbox::insert(&db.conn, &rows).await?;
    let stored = outbox::fetch(&db.conn, 3_000).await?;
    assert!(stored.windows(2).all(|w| w[0].id < w[1].id), "{backend:?}: ids ascend");
    assert_eq!(stored.iter().map(|r| r.row.clone()).collect::<Vec<_>>(), rows, "{backend:?}: rows in the order written");
    let even: Vec<i64> = stored.iter().step_by(2).map(|r| r.id).collect();
    outbox::delete(&db.conn, &even).await?;
    let left: Vec<i64> = outbox::fetch(&db.conn, 3_000).await?.iter().map(|r| r.id).collect();
    assert_eq!(left, stored.iter().skip(1).step_by(2).map(|r| r.id).collect::<Vec<_>>(), "{backend:?}: exactly the other half is left");
    db.drop_db().await
}

/// Count deltas for 1,200 users added twice are doubled, each row's version bumped twice;
/// the inactive accounts among 1,500 users are found exactly.
async fn counts_and_accounts_in_bulk(backend: Backend) -> anyhow::Result<()> {
    let db = TestDb::create(backend).await?;
    let deltas: Vec<CountDelta> = (1..=1_200).rev().map(|u| CountDelta { user_id: u, followings: u % 5, followers: 1 + u % 3 }).collect();
    counts::add(&db.conn, &deltas).await?;
    counts::add(&db.conn, &deltas).await?;
    let users: Vec<i64> = (1..=1_200).collect();
    for c in counts::get_many(&db.conn, &users).await? {
        assert_eq!((c.followings, c.followers, c.version), (2 * (c.user_id % 5), 2 * (1 + c.user_id % 3), 2), "{backend:?} user {}", c.user_id);
    }
    let inactive: BTreeSet<i64> = (1..=1_500).step_by(13).collect();
    for (i, &u) in inactive.iter().enumerate() {
        let status = [AccountStatus::Deactivated, AccountStatus::Suspended, AccountStatus::Deleting][i % 3];
        accounts::put(&db.conn, &Account { status, ..Account::active(u) }).await?;
    }
    accounts::put(&db.conn, &Account { locked: true, ..Account::active(2) }).await?;
    let asked: Vec<i64> = (1..=1_500).collect();
    let found: BTreeSet<i64> = accounts::inactive_among(&db.conn, &asked).await?.into_iter().collect();
    assert_eq!(found, inactive, "{backend:?}: exactly the accounts that are not active");
    db.drop_db().await
}

/// The one-statement read of follower rows and a consumer's positions (PostgreSQL) answers
/// exactly what the two reads answer: the rows of the asked followers of one followee (1,500
/// stored, 2,000 asked, some absent, some twice, none of another followee), and the positions
/// of that consumer on that topic alone, by partition, a missing event time kept missing.
/// Other backends answer `None` (their callers read both in a transaction).
async fn follower_rows_with_positions(backend: Backend) -> anyhow::Result<()> {
    let db = TestDb::create(backend).await?;
    let followee = 7;
    let written: Vec<Edge> = (1..=1_500).map(|f| edge(f, followee, f)).chain((1..=300).map(|f| edge(f, followee + 1, f))).collect();
    edges::insert(&db.conn, EdgeTable::Follower, &written).await?;
    for p in [3, 0, 11, 5] {
        let o = StoredOffset { partition: p, next_offset: 1_000 * i64::from(p) + 1, last_event_ms: (p != 5).then_some(9_000 + i64::from(p)) };
        offsets::store(&db.conn, "projection", "sg.relation.v1", o, 1).await?;
        offsets::store(&db.conn, "counter", "sg.relation.v1", StoredOffset { next_offset: 7, ..o }, 1).await?;
    }
    offsets::store(&db.conn, "projection", "other", StoredOffset { partition: 1, next_offset: 3, last_event_ms: None }, 1).await?;
    let asked: Vec<i64> = (1..=2_000).chain((1..=100).map(|f| f * 3)).collect();
    let got = offsets::with_follower_edges(&db.conn, "projection", "sg.relation.v1", followee, &asked).await?;
    if backend != Backend::Postgres {
        assert!(got.is_none(), "{backend:?}: no one-statement form");
        return db.drop_db().await;
    }
    let (stored, mut found) = got.expect("PostgreSQL reads both in one statement");
    found.sort_by_key(|e| e.follower_id);
    let pairs: Vec<(i64, i64)> = asked.iter().map(|&f| (f, followee)).collect();
    let mut expected = edges::get_many(&db.conn, EdgeTable::Follower, &pairs, false).await?;
    expected.sort_by_key(|e| e.follower_id);
    assert_eq!(expected.len(), 1_500, "the two-read form finds every stored follower once");
    assert_eq!(found, expected, "the same rows as the edge read");
    assert_eq!(stored, offsets::list(&db.conn, "projection", "sg.relation.v1").await?, "the same positions as the offset read");
    assert_eq!(stored.iter().map(|o| o.partition).collect::<Vec<_>>(), [0, 3, 5, 11], "by partition");
    assert_eq!(stored[2].last_event_ms, None, "a missing event time stays missing");
    db.drop_db().await
}

#[tokio::test]
async fn follower_rows_and_positions_in_one_statement_equal_the_two_reads_on_postgres() -> anyhow::Result<()> {
    follower_rows_with_positions(Backend::Postgres).await
}

#[tokio::test]
async fn follower_rows_and_positions_are_left_to_a_transaction_on_mariadb_and_sqlite() -> anyhow::Result<()> {
    follower_rows_with_positions(Backend::MariaDb).await?;
    follower_rows_with_positions(Backend::Sqlite).await
}

#[tokio::test]
async fn bulk_edge_reads_are_exact_on_postgres() -> anyhow::Result<()> {
    edges_read_back_exactly(Backend::Postgres).await
}

#[tokio::test]
async fn bulk_edge_reads_are_exact_on_mariadb() -> anyhow::Result<()> {
    edges_read_back_exactly(Backend::MariaDb).await
}

#[tokio::test]
async fn bulk_edge_reads_are_exact_on_sqlite() -> anyhow::Result<()> {
    edges_read_back_exactly(Backend::Sqlite).await
}

#[tokio::test]
async fn outbox_rows_keep_their_order_on_postgres() -> anyhow::Result<()> {
    outbox_rows_keep_their_order(Backend::Postgres).await
}

#[tokio::test]
async fn outbox_rows_keep_their_order_on_mariadb() -> anyhow::Result<()> {
    outbox_rows_keep_their_order(Backend::MariaDb).await
}

#[tokio::test]
async fn outbox_rows_keep_their_order_on_sqlite() -> anyhow::Result<()> {
    outbox_rows_keep_their_order(Backend::Sqlite).await
}

#[tokio::test]
async fn counts_and_accounts_in_bulk_on_postgres() -> anyhow::Result<()> {
    counts_and_accounts_in_bulk(Backend::Postgres).await
}

#[tokio::test]
async fn counts_and_accounts_in_bulk_on_mariadb() -> anyhow::Result<()> {
    counts_and_accounts_in_bulk(Backend::MariaDb).await
}

#[tokio::test]
async fn counts_and_accounts_in_bulk_on_sqlite() -> anyhow::Result<()> {
    counts_and_accounts_in_bulk(Backend::Sqlite).await
}
