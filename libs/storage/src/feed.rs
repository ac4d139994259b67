//! The feed tables (`post`, `inbox`, `inbox_state`, `fanout`; see the migration
//! `m20261202_000001_create_feed` for their shapes). Ids and times are integers, written into
//! the statements, so one text serves PostgreSQL, MySQL/MariaDB and SQLite. Timeline order is
//! (`created_at_ms`, `post_id`): "older" and "newer" below mean lower and higher in it. The reads
//! of a timeline's parts are in [`crate::timeline`].

use std::collections::HashMap;

use sea_orm::{ConnectionTrait, DbBackend, DbErr, QueryResult, Statement};

use crate::edges::MAX_TUPLES_PER_QUERY;

/// A position in timeline order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FeedKey {
    /// Publication time, ms since the epoch.
    pub created_at_ms: i64,
    /// The post.
    pub post_id: i64,
}

impl FeedKey {
    /// Below every real key: the floor of an inbox never trimmed.
    pub const MIN: FeedKey = FeedKey { created_at_ms: i64::MIN, post_id: 0 };
}

/// One post as timelines list it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeedEntry {
    /// Its timeline position.
    pub key: FeedKey,
    /// Its author.
    pub author_id: i64,
}

/// A row of `post`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PostRow {
    /// Post, author and time.
    pub entry: FeedEntry,
    /// Fanned out into inboxes (else pulled at read time).
    pub pushed: bool,
    /// A tombstone.
    pub deleted: bool,
}

/// A row of `fanout`: a push in progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FanoutJob {
    /// The post pushed.
    pub entry: FeedEntry,
    /// The content partition whose consumer owns the job.
    pub partition: i32,
    /// Followers with a greater id are still to be reached.
    pub next_follower_id: i64,
}

/// A user's `inbox_state` (`entries` 0 and floor [`FeedKey::MIN`] without a row).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InboxState {
    /// Upper bound of the user's inbox rows.
    pub entries: i64,
    /// Entries below this key are not in the inbox; the timeline pulls them.
    pub floor: FeedKey,
}

pub(crate) fn ids(values: impl IntoIterator<Item = i64>) -> String {
    values.into_iter().map(|v| v.to_string()).collect::<Vec<_>>().join(", ")
}

/// `col` strictly before `k` in timeline order (older).
pub(crate) fn older_than(alias: &str, k: FeedKey) -> String {
    format!("({alias}.created_at_ms < {ms} OR ({alias}.created_at_ms = {ms} AND {alias}.post_id < {p}))", ms = k.created_at_ms, p = k.post_id)
}

/// `col` strictly after `k` in timeline order (newer).
pub(crate) fn newer_than(alias: &str, k: FeedKey) -> String {
    format!("({alias}.created_at_ms > {ms} OR ({alias}.created_at_ms = {ms} AND {alias}.post_id > {p}))", ms = k.created_at_ms, p = k.post_id)
}

/// `col` at or after `k` in timeline order.
pub(crate) fn not_older_than(alias: &str, k: FeedKey) -> String {
    format!("({alias}.created_at_ms > {ms} OR ({alias}.created_at_ms = {ms} AND {alias}.post_id >= {p}))", ms = k.created_at_ms, p = k.post_id)
}

/// The statement tail that turns an INSERT into insert-if-absent (`col` is any key column).
fn ignore_duplicates(backend: DbBackend, col: &str) -> String {
    match backend {
        DbBackend::MySql => format!(" ON DUPLICATE KEY UPDATE {col} = {col}"),
        _ => " ON CONFLICT DO NOTHING".to_owned(),
    }
}

pub(crate) async fn query<C: ConnectionTrait>(conn: &C, sql: String) -> Result<Vec<QueryResult>, DbErr> {
    conn.query_all_raw(Statement::from_string(conn.get_database_backend(), sql)).await
}

pub(crate) fn entry(r: &QueryResult) -> Result<FeedEntry, DbErr> {
    Ok(FeedEntry { key: FeedKey { created_at_ms: r.try_get_by_index(0)?, post_id: r.try_get_by_index(1)? }, author_id: r.try_get_by_index(2)? })
}

/// Locks the `edge_count` rows of `authors` (creating zero rows, version 0, for authors without
/// one) and returns each author's followers. A transaction applying follows takes the same
/// row locks when it adds to the counts, so a post and a follow of one author are applied one
/// after the other: whichever commits second sees the other (see `projection::feed`).
///
/// # Errors
/// Database errors.
pub async fn lock_authors<C: ConnectionTrait>(conn: &C, authors: &[i64]) -> Result<HashMap<i64, i64>, DbErr> {
    let mut sorted = authors.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let tail = match conn.get_database_backend() {
        DbBackend::MySql => " ON DUPLICATE KEY UPDATE version = version",
        _ => " ON CONFLICT (user_id) DO UPDATE SET version = edge_count.version",
    };
    for chunk in sorted.chunks(MAX_TUPLES_PER_QUERY) {
        let values: Vec<String> = chunk.iter().map(|a| format!("({a}, 0, 0, 0)")).collect();
        conn.execute_unprepared(&format!("INSERT INTO edge_count (user_id, followings, followers, version) VALUES {}{tail}", values.join(", ")))
            .await?;
    }
    Ok(crate::counts::get_many(conn, &sorted).await?.into_iter().map(|c| (c.user_id, c.followers)).collect())
}

/// The `post` rows of `post_ids` that exist.
///
/// # Errors
/// Database errors.
pub async fn get_posts<C: ConnectionTrait>(conn: &C, post_ids: &[i64]) -> Result<HashMap<i64, PostRow>, DbErr> {
    let mut found = HashMap::new();
    for chunk in post_ids.chunks(MAX_TUPLES_PER_QUERY) {
        let sql = format!("SELECT created_at_ms, post_id, author_id, pushed, deleted FROM post WHERE post_id IN ({})", ids(chunk.iter().copied()));
        for r in query(conn, sql).await? {
            let (pushed, deleted): (i16, i16) = (r.try_get_by_index(3)?, r.try_get_by_index(4)?);
            let row = PostRow { entry: entry(&r)?, pushed: pushed != 0, deleted: deleted != 0 };
            found.insert(row.entry.key.post_id, row);
        }
    }
    Ok(found)
}

/// Inserts new `post` rows.
///
/// # Errors
/// Database errors (a post id that exists is a unique violation).
pub async fn insert_posts<C: ConnectionTrait>(conn: &C, rows: &[PostRow], now_ms: i64) -> Result<(), DbErr> {
    for chunk in rows.chunks(MAX_TUPLES_PER_QUERY) {
        let values: Vec<String> = chunk
            .iter()
            .map(|r| {
                let e = r.entry;
                format!("({}, {}, {}, {}, {}, {now_ms})", e.key.post_id, e.author_id, e.key.created_at_ms, i16::from(r.pushed), i16::from(r.deleted))
            })
            .collect();
        let sql = format!("INSERT INTO post (post_id, author_id, created_at_ms, pushed, deleted, updated_at_ms) VALUES {}", values.join(", "));
        conn.execute_unprepared(&sql).await?;
    }
    Ok(())
}

/// Turns existing posts into tombstones and drops their pending pushes.
///
/// # Errors
/// Database errors.
pub async fn mark_deleted<C: ConnectionTrait>(conn: &C, post_ids: &[i64], now_ms: i64) -> Result<(), DbErr> {
    for chunk in post_ids.chunks(MAX_TUPLES_PER_QUERY) {
        let list = ids(chunk.iter().copied());
        conn.execute_unprepared(&format!("UPDATE post SET deleted = 1, updated_at_ms = {now_ms} WHERE post_id IN ({list})")).await?;
        conn.execute_unprepared(&format!("DELETE FROM fanout WHERE post_id IN ({list})")).await?;
    }
    Ok(())
}

/// Queues pushes.
///
/// # Errors
/// Database errors.
pub async fn insert_fanouts<C: ConnectionTrait>(conn: &C, jobs: &[FanoutJob]) -> Result<(), DbErr> {
    for chunk in jobs.chunks(MAX_TUPLES_PER_QUERY) {
        let values: Vec<String> = chunk
            .iter()
            .map(|j| {
                format!("({}, {}, {}, {}, {})", j.entry.key.post_id, j.entry.author_id, j.entry.key.created_at_ms, j.partition, j.next_follower_id)
            })
            .collect();
        let sql = format!(
            "INSERT INTO fanout (post_id, author_id, created_at_ms, content_partition, next_follower_id) VALUES {}{}",
            values.join(", "),
            ignore_duplicates(conn.get_database_backend(), "post_id")
        );
        conn.execute_unprepared(&sql).await?;
    }
    Ok(())
}

/// The oldest `limit` queued pushes of `partitions` (by post time, then post id).
///
/// # Errors
/// Database errors.
pub async fn next_fanouts<C: ConnectionTrait>(conn: &C, partitions: &[i32], limit: usize) -> Result<Vec<FanoutJob>, DbErr> {
    if partitions.is_empty() {
        return Ok(Vec::new());
    }
    let list = partitions.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", ");
    let sql = format!(
        "SELECT created_at_ms, post_id, author_id, content_partition, next_follower_id FROM fanout WHERE content_partition IN ({list}) \
         ORDER BY created_at_ms, post_id LIMIT {limit}"
    );
    query(conn, sql)
        .await?
        .iter()
        .map(|r| Ok(FanoutJob { entry: entry(r)?, partition: r.try_get_by_index(3)?, next_follower_id: r.try_get_by_index(4)? }))
        .collect()
}

/// Moves a push's cursor, or ends it (`next` = `None`).
///
/// # Errors
/// Database errors.
pub async fn advance_fanout<C: ConnectionTrait>(conn: &C, post_id: i64, next: Option<i64>) -> Result<(), DbErr> {
    let sql = match next {
        Some(n) => format!("UPDATE fanout SET next_follower_id = {n} WHERE post_id = {post_id}"),
        None => format!("DELETE FROM fanout WHERE post_id = {post_id}"),
    };
    conn.execute_unprepared(&sql).await.map(|_| ())
}

/// How many pushes are queued (unfinished).
///
/// # Errors
/// Database errors.
pub async fn fanout_backlog<C: ConnectionTrait>(conn: &C) -> Result<i64, DbErr> {
    let rows = query(conn, "SELECT COUNT(*) FROM fanout".to_owned()).await?;
    rows.first().map_or(Ok(0), |r| r.try_get_by_index(0))
}

/// Up to `limit` current followers of `author_id` with an id greater than `after`, ascending.
///
/// # Errors
/// Database errors.
pub async fn followers_after<C: ConnectionTrait>(conn: &C, author_id: i64, after: i64, limit: usize) -> Result<Vec<i64>, DbErr> {
    let sql = format!(
        "SELECT follower_id FROM follower WHERE followee_id = {author_id} AND follower_id > {after} AND state = 1 ORDER BY follower_id LIMIT {limit}"
    );
    query(conn, sql).await?.iter().map(|r| r.try_get_by_index(0)).collect()
}

/// Of `authors`, those with at least one live pushed post.
///
/// # Errors
/// Database errors.
pub async fn authors_with_pushed<C: ConnectionTrait>(conn: &C, authors: &[i64]) -> Result<Vec<i64>, DbErr> {
    let mut out = Vec::new();
    for chunk in authors.chunks(MAX_TUPLES_PER_QUERY) {
        let sql = format!("SELECT DISTINCT author_id FROM post WHERE author_id IN ({}) AND pushed = 1 AND deleted = 0", ids(chunk.iter().copied()));
        for r in query(conn, sql).await? {
            out.push(r.try_get_by_index(0)?);
        }
    }
    Ok(out)
}

/// Adds `(user, entry)` rows to the inboxes (present rows stay) and raises each user's
/// `entries` by its rows; returns the users whose `entries` now exceed `bound`.
///
/// # Errors
/// Database errors.
pub async fn inbox_add<C: ConnectionTrait>(conn: &C, rows: &[(i64, FeedEntry)], bound: i64) -> Result<Vec<i64>, DbErr> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let backend = conn.get_database_backend();
    let mut sorted = rows.to_vec();
    sorted.sort_by_key(|(u, e)| (*u, e.key));
    for chunk in sorted.chunks(MAX_TUPLES_PER_QUERY) {
        let values: Vec<String> = chunk.iter().map(|(u, e)| format!("({u}, {}, {}, {})", e.key.created_at_ms, e.key.post_id, e.author_id)).collect();
        let sql = format!(
            "INSERT INTO inbox (user_id, created_at_ms, post_id, author_id) VALUES {}{}",
            values.join(", "),
            ignore_duplicates(backend, "user_id")
        );
        conn.execute_unprepared(&sql).await?;
    }
    let mut per_user: Vec<(i64, i64)> = Vec::new();
    for (u, _) in &sorted {
        match per_user.last_mut() {
            Some((last, n)) if last == u => *n += 1,
            _ => per_user.push((*u, 1)),
        }
    }
    let tail = match backend {
        DbBackend::MySql => " ON DUPLICATE KEY UPDATE entries = entries + VALUES(entries)".to_owned(),
        _ => " ON CONFLICT (user_id) DO UPDATE SET entries = inbox_state.entries + excluded.entries".to_owned(),
    };
    let mut over = Vec::new();
    for chunk in per_user.chunks(MAX_TUPLES_PER_QUERY) {
        let values: Vec<String> = chunk.iter().map(|(u, n)| format!("({u}, {n}, {}, 0)", i64::MIN)).collect();
        let sql = format!("INSERT INTO inbox_state (user_id, entries, floor_ms, floor_post_id) VALUES {}{tail}", values.join(", "));
        conn.execute_unprepared(&sql).await?;
        let sql = format!("SELECT user_id FROM inbox_state WHERE user_id IN ({}) AND entries > {bound}", ids(chunk.iter().map(|(u, _)| *u)));
        for r in query(conn, sql).await? {
            over.push(r.try_get_by_index(0)?);
        }
    }
    Ok(over)
}

/// `user_id`'s inbox state.
///
/// # Errors
/// Database errors.
pub async fn inbox_state<C: ConnectionTrait>(conn: &C, user_id: i64) -> Result<InboxState, DbErr> {
    let rows = query(conn, format!("SELECT entries, floor_ms, floor_post_id FROM inbox_state WHERE user_id = {user_id}")).await?;
    match rows.first() {
        None => Ok(InboxState { entries: 0, floor: FeedKey::MIN }),
        Some(r) => Ok(InboxState {
            entries: r.try_get_by_index(0)?,
            floor: FeedKey { created_at_ms: r.try_get_by_index(1)?, post_id: r.try_get_by_index(2)? },
        }),
    }
}

/// Cuts `user_id`'s inbox to its newest `keep` rows and at least to `raise_to`: the floor
/// becomes the highest of the old floor, `raise_to` and the `keep`-th newest row, rows below
/// it go, and `entries` becomes the exact count. Returns the new state.
///
/// # Errors
/// Database errors.
pub async fn trim<C: ConnectionTrait>(conn: &C, user_id: i64, keep: usize, raise_to: FeedKey) -> Result<InboxState, DbErr> {
    let old = inbox_state(conn, user_id).await?;
    let sql = format!(
        "SELECT created_at_ms, post_id FROM inbox WHERE user_id = {user_id} ORDER BY created_at_ms DESC, post_id DESC LIMIT 1 OFFSET {}",
        keep.saturating_sub(1)
    );
    let kth =
        query(conn, sql).await?.first().map(|r| Ok::<_, DbErr>(FeedKey { created_at_ms: r.try_get_by_index(0)?, post_id: r.try_get_by_index(1)? }));
    let kth = kth.transpose()?.unwrap_or(FeedKey::MIN);
    let floor = old.floor.max(raise_to).max(kth);
    conn.execute_unprepared(&format!("DELETE FROM inbox WHERE user_id = {user_id} AND {}", older_than("inbox", floor))).await?;
    let count: i64 =
        query(conn, format!("SELECT COUNT(*) FROM inbox WHERE user_id = {user_id}")).await?.first().map_or(Ok(0), |r| r.try_get_by_index(0))?;
    set_state(conn, user_id, InboxState { entries: count, floor }).await?;
    Ok(InboxState { entries: count, floor })
}

async fn set_state<C: ConnectionTrait>(conn: &C, user_id: i64, s: InboxState) -> Result<(), DbErr> {
    let tail = match conn.get_database_backend() {
        DbBackend::MySql => " ON DUPLICATE KEY UPDATE entries = VALUES(entries), floor_ms = VALUES(floor_ms), floor_post_id = VALUES(floor_post_id)",
        _ => " ON CONFLICT (user_id) DO UPDATE SET entries = excluded.entries, floor_ms = excluded.floor_ms, floor_post_id = excluded.floor_post_id",
    };
    let sql = format!(
        "INSERT INTO inbox_state (user_id, entries, floor_ms, floor_post_id) VALUES ({user_id}, {}, {}, {}){tail}",
        s.entries, s.floor.created_at_ms, s.floor.post_id
    );
    conn.execute_unprepared(&sql).await.map(|_| ())
}

/// Removes `author_id`'s posts from `user_id`'s inbox (an unfollow).
///
/// # Errors
/// Database errors.
pub async fn inbox_remove_author<C: ConnectionTrait>(conn: &C, user_id: i64, author_id: i64) -> Result<(), DbErr> {
    conn.execute_unprepared(&format!("DELETE FROM inbox WHERE user_id = {user_id} AND author_id = {author_id}")).await.map(|_| ())
}

/// Up to `limit` live posts of `author_id`, newest first, strictly older than `before` and not
/// older than `floor`; only pushed ones when `pushed` is `Some(true)`, only pulled ones for
/// `Some(false)`.
///
/// # Errors
/// Database errors.
pub async fn author_posts<C: ConnectionTrait>(
    conn: &C,
    author_id: i64,
    pushed: Option<bool>,
    floor: FeedKey,
    before: Option<FeedKey>,
    limit: usize,
) -> Result<Vec<FeedEntry>, DbErr> {
    let mut sql = format!("SELECT p.created_at_ms, p.post_id, p.author_id FROM post p WHERE p.author_id = {author_id} AND p.deleted = 0");
    if let Some(pushed) = pushed {
        sql.push_str(&format!(" AND p.pushed = {}", i16::from(pushed)));
    }
    if floor != FeedKey::MIN {
        sql.push_str(&format!(" AND {}", not_older_than("p", floor)));
    }
    if let Some(b) = before {
        sql.push_str(&format!(" AND {}", older_than("p", b)));
    }
    sql.push_str(&format!(" ORDER BY p.created_at_ms DESC, p.post_id DESC LIMIT {limit}"));
    query(conn, sql).await?.iter().map(entry).collect()
}

/// Rebuilds `user_id`'s inbox from the facts: its newest `keep` live pushed posts of the
/// authors it follows; the floor is the oldest of them when there were `keep` (older ones are
/// pulled), none otherwise. Returns the rows written.
///
/// # Errors
/// Database errors.
pub async fn rebuild_inbox<C: ConnectionTrait>(conn: &C, user_id: i64, keep: usize) -> Result<i64, DbErr> {
    conn.execute_unprepared(&format!("DELETE FROM inbox WHERE user_id = {user_id}")).await?;
    let sql = format!(
        "SELECT p.created_at_ms, p.post_id, p.author_id FROM follower f JOIN post p ON p.author_id = f.followee_id \
         WHERE f.follower_id = {user_id} AND f.state = 1 AND p.pushed = 1 AND p.deleted = 0 \
         ORDER BY p.created_at_ms DESC, p.post_id DESC LIMIT {keep}"
    );
    let entries: Vec<FeedEntry> = query(conn, sql).await?.iter().map(entry).collect::<Result<_, _>>()?;
    set_state(conn, user_id, InboxState { entries: 0, floor: FeedKey::MIN }).await?;
    let rows: Vec<(i64, FeedEntry)> = entries.iter().map(|e| (user_id, *e)).collect();
    inbox_add(conn, &rows, i64::MAX).await?;
    let floor = match entries.last() {
        Some(last) if entries.len() >= keep => last.key,
        _ => FeedKey::MIN,
    };
    set_state(conn, user_id, InboxState { entries: entries.len() as i64, floor }).await?;
    Ok(entries.len() as i64)
}

/// Users with an inbox or an inbox state, ascending, after `after`, at most `limit` (for
/// rebuilding every inbox), together with every follower that has a pushed post to see.
///
/// # Errors
/// Database errors.
pub async fn inbox_users<C: ConnectionTrait>(conn: &C, after: i64, limit: usize) -> Result<Vec<i64>, DbErr> {
    let sql = format!(
        "SELECT user_id FROM (SELECT user_id FROM inbox_state WHERE user_id > {after} \
         UNION SELECT DISTINCT f.follower_id AS user_id FROM follower f JOIN post p ON p.author_id = f.followee_id \
         WHERE f.follower_id > {after} AND f.state = 1 AND p.pushed = 1 AND p.deleted = 0) u ORDER BY user_id LIMIT {limit}"
    );
    query(conn, sql).await?.iter().map(|r| r.try_get_by_index(0)).collect()
}
