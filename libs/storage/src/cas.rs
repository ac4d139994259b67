//! One edge change and its outbox row as one PostgreSQL statement: a compare-and-set on the
//! edge's version, so a Follow or Unfollow costs one round trip after its (unlocked) pre-read
//! instead of a transaction's five or six.
//!
//! A statement whose data-modifying CTEs all run is atomic in autocommit: the edge row, the
//! follower's `following_count` row and the outbox row are written together or not at all
//! (docs/src/architecture/events.md#the-outbox). The caller reads the edge and the count row
//! first, builds the event for the versions it will write, and asks for the change only if the
//! rows still hold the versions it read (0: no edge row). The statement locks the count row
//! first, so concurrent changes of one follower's edges take turns and its count moves by one
//! per change. When another writer got there first nothing
//! is written and the caller reads again. PostgreSQL only: MySQL/MariaDB have no
//! data-modifying CTEs and SQLite serializes writers anyway; they keep the transaction.

use sea_orm::{ConnectionTrait, DbBackend, DbErr, Statement, Value};
use socialgraph_domain::{Edge, EdgeState};

use crate::following_counts::FollowingCount;
use crate::outbox::NewOutboxRow;

/// What a compare-and-set did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CasOutcome {
    /// The edge and its outbox row were written.
    Written,
    /// The row no longer held the expected version (or state): nothing was written; read again.
    Conflict,
    /// A follow was refused: the follower already has this many "following" edges (≥ the cap).
    AtCap(i64),
}

/// Writes `edge` (state Following, its new version and times), the follower's
/// `following_count` row as `next` and `event` if the stored row still has version `expected`
/// (0: no row) and is neither following nor blocked, the count row (which must exist, see
/// [`crate::following_counts::ensure`]) still has the version before `next`, and the
/// follower has fewer than `cap` "following" edges and pending follow requests (each counted
/// over at most `cap` index entries).
/// A row written meanwhile by a concurrent writer (a block included) is re-checked by
/// PostgreSQL after that writer commits, so a block that committed first always wins. Nothing
/// is written while either user's account is not active (as of the statement's snapshot; the
/// account job waits out older snapshots).
///
/// # Errors
/// Database errors (a lost connection, a deadlock; a unique race cannot occur).
pub async fn follow<C: ConnectionTrait>(
    conn: &C,
    edge: &Edge,
    expected: i64,
    cap: i64,
    next: FollowingCount,
    event: &NewOutboxRow,
) -> Result<CasOutcome, DbErr> {
    const SQL: &str = "WITH c AS (SELECT version FROM following_count WHERE user_id = $1 FOR UPDATE), cap AS ( \
            SELECT (SELECT count(*) FROM (SELECT 1 FROM following WHERE follower_id = $1 AND state = $3 LIMIT $8) AS f) \
                + (SELECT count(*) FROM (SELECT 1 FROM follow_request WHERE requester_id = $1 LIMIT $8) AS r) AS n \
        ), e AS ( \
            INSERT INTO following AS t (follower_id, followee_id, state, version, followed_at_ms, updated_at_ms) \
            SELECT $1, $2, $3, $4, $5, $6 FROM cap WHERE cap.n < $8 AND (SELECT version FROM c) = $14 \
                AND NOT EXISTS (SELECT 1 FROM account WHERE user_id IN ($1, $2) AND status <> 0) \
            ON CONFLICT (follower_id, followee_id) DO UPDATE SET state = EXCLUDED.state, version = EXCLUDED.version, \
                followed_at_ms = EXCLUDED.followed_at_ms, updated_at_ms = EXCLUDED.updated_at_ms \
            WHERE t.version = $7 AND t.state <> $3 AND NOT t.blocked \
            RETURNING 1 \
        ), u AS ( \
            UPDATE following_count SET followings = $15, version = $14 + 1 WHERE user_id = $1 AND EXISTS (SELECT 1 FROM e) \
        ), o AS ( \
            INSERT INTO outbox (topic, partition_key, payload, headers, created_at_ms) SELECT $9, $10, $11, $12, $13 FROM e RETURNING 1 \
        ) SELECT (SELECT n FROM cap) AS n, (SELECT count(*) FROM o) AS written";
    debug_assert_eq!(edge.state, EdgeState::Following);
    let mut values = edge_values(edge, expected);
    values.push(cap.into());
    values.extend(event_values(event));
    values.extend([(next.version - 1).into(), next.followings.into()]);
    let row = conn.query_one_raw(Statement::from_sql_and_values(DbBackend::Postgres, SQL, values)).await?;
    let (n, written): (i64, i64) = match row {
        Some(r) => (r.try_get_by_index(0)?, r.try_get_by_index(1)?),
        None => (0, 0),
    };
    Ok(if written == 1 {
        CasOutcome::Written
    } else if n >= cap {
        CasOutcome::AtCap(n)
    } else {
        CasOutcome::Conflict
    })
}

/// Writes `edge` (state NotFollowing, its new version and time), the follower's
/// `following_count` row as `next` and `event` if the stored edge is still `old` (its version
/// and state) and the count row still has the version before `next`.
///
/// # Errors
/// Database errors.
pub async fn unfollow<C: ConnectionTrait>(
    conn: &C,
    old: &Edge,
    edge: &Edge,
    next: FollowingCount,
    event: &NewOutboxRow,
) -> Result<CasOutcome, DbErr> {
    // $3 is the new state; the row must hold the other one ("following").
    const SQL: &str = "WITH c AS (SELECT version FROM following_count WHERE user_id = $1 FOR UPDATE), e AS ( \
            UPDATE following SET state = $3, version = $4, followed_at_ms = $5, updated_at_ms = $6 \
            WHERE follower_id = $1 AND followee_id = $2 AND version = $7 AND state = $15 AND (SELECT version FROM c) = $13 \
            RETURNING 1 \
        ), u AS ( \
            UPDATE following_count SET followings = $14, version = $13 + 1 WHERE user_id = $1 AND EXISTS (SELECT 1 FROM e) \
        ), o AS ( \
            INSERT INTO outbox (topic, partition_key, payload, headers, created_at_ms) SELECT $8, $9, $10, $11, $12 FROM e RETURNING 1 \
        ) SELECT count(*) AS written FROM o";
    debug_assert_eq!(edge.state, EdgeState::NotFollowing);
    let mut values = edge_values(edge, old.version);
    values.extend(event_values(event));
    values.extend([(next.version - 1).into(), next.followings.into(), old.state.as_i16().into()]);
    let row = conn.query_one_raw(Statement::from_sql_and_values(DbBackend::Postgres, SQL, values)).await?;
    let written: i64 = match row {
        Some(r) => r.try_get_by_index(0)?,
        None => 0,
    };
    Ok(if written == 1 { CasOutcome::Written } else { CasOutcome::Conflict })
}

/// Inserts the edges of `new` (follower, followee, followed_at_ms) that do not exist yet as
/// "following", version 1, updated at `now_ms`, in one statement of three arrays; returns the
/// pairs it inserted. Rows that exist are left alone (the caller decides about them), and a
/// concurrent insert of the same row is waited for and then left alone too.
///
/// # Errors
/// Database errors.
pub async fn insert_new_edges<C: ConnectionTrait>(conn: &C, new: &[(i64, i64, i64)], now_ms: i64) -> Result<Vec<(i64, i64)>, DbErr> {
    const SQL: &str = "INSERT INTO following (follower_id, followee_id, state, version, followed_at_ms, updated_at_ms) \
        SELECT f, e, $4, 1, at, $5 FROM unnest($1::int8[], $2::int8[], $3::int8[]) AS u(f, e, at) \
        ON CONFLICT (follower_id, followee_id) DO NOTHING RETURNING follower_id, followee_id";
    if new.is_empty() {
        return Ok(Vec::new());
    }
    let followers: Vec<i64> = new.iter().map(|e| e.0).collect();
    let followees: Vec<i64> = new.iter().map(|e| e.1).collect();
    let times: Vec<i64> = new.iter().map(|e| e.2).collect();
    let values: Vec<Value> = vec![followers.into(), followees.into(), times.into(), EdgeState::Following.as_i16().into(), now_ms.into()];
    conn.query_all_raw(Statement::from_sql_and_values(DbBackend::Postgres, SQL, values))
        .await?
        .iter()
        .map(|r| Ok((r.try_get_by_index(0)?, r.try_get_by_index(1)?)))
        .collect()
}

/// `$1..$7`: the edge's columns, then the expected version.
fn edge_values(e: &Edge, expected: i64) -> Vec<Value> {
    let mut values = crate::edges::column_values(e).to_vec();
    values.push(expected.into());
    values
}

fn event_values(r: &NewOutboxRow) -> [Value; 5] {
    [r.topic.clone().into(), r.partition_key.into(), r.payload.clone().into(), r.headers.clone().into(), r.created_at_ms.into()]
}
