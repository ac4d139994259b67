//! The raw baselines of the cache part: the same reads done straight on the cache Redis and on
//! PostgreSQL, one at a time, timed like the service's calls.

use redis::aio::MultiplexedConnection;
use sea_orm::sqlx::PgPool;

use crate::cache::{none, timed};
use crate::report::Hist;

/// A following page of 50 and its lookahead on PostgreSQL, newest first (`$1` = the follower).
pub(crate) const FOLLOWING_PAGE_SQL: &str = "SELECT followee_id, followed_at_ms FROM following WHERE follower_id = $1 AND state = 1 \
                                             ORDER BY followed_at_ms DESC, followee_id DESC LIMIT 51";

/// `ZREVRANGE key 0 50 WITHSCORES`: a page of 50 of a cached list and its lookahead.
pub(crate) async fn zrevrange<C: redis::aio::ConnectionLike + Send>(conn: &mut C, key: &str) -> redis::RedisResult<()> {
    let _: Vec<(Vec<u8>, f64)> = redis::cmd("ZREVRANGE").arg(key).arg(0).arg(50).arg("WITHSCORES").query_async(conn).await?;
    Ok(())
}

/// [`zrevrange`] on each of `keys`.
pub(crate) async fn pages(conn: &MultiplexedConnection, keys: &[String]) -> anyhow::Result<Hist> {
    timed(keys.len(), none, |i| {
        let (mut conn, key) = (conn.clone(), keys[i].clone());
        async move { Ok(zrevrange(&mut conn, &key).await?) }
    })
    .await
}

/// `ids` as the cached sorted sets hold them: 8-byte big-endian members.
pub(crate) fn members(ids: &[i64]) -> Vec<Vec<u8>> {
    ids.iter().map(|o| o.to_be_bytes().to_vec()).collect()
}

/// `ZMSCORE key ids…` on each of `keys` with the ids of the same index (8-byte members).
pub(crate) async fn scores(conn: &MultiplexedConnection, keys: &[String], ids: &[Vec<i64>]) -> anyhow::Result<Hist> {
    timed(keys.len(), none, |i| {
        let (mut conn, key) = (conn.clone(), keys[i].clone());
        let members = members(&ids[i]);
        async move {
            let _: Vec<Option<f64>> = redis::cmd("ZMSCORE").arg(key).arg(members).query_async(&mut conn).await?;
            anyhow::Ok(())
        }
    })
    .await
}

/// `sql` with `$1` = each of `users` and, when `ids` is given, `$2` = the ids of the same
/// index (an array).
pub(crate) async fn sql(pool: &PgPool, sql: &'static str, users: &[i64], ids: Option<&[Vec<i64>]>) -> anyhow::Result<Hist> {
    timed(users.len(), none, |i| {
        let (pool, user, ids) = (pool.clone(), users[i], ids.map(|ids| ids[i].clone()));
        async move {
            let q = sea_orm::sqlx::query(sql).bind(user);
            match ids {
                Some(ids) => q.bind(ids).fetch_all(&pool).await?,
                None => q.fetch_all(&pool).await?,
            };
            anyhow::Ok(())
        }
    })
    .await
}

/// The four raw baselines of one direction's reads of `users`: a page from the cached set and
/// from PostgreSQL, and the membership of `ids` in both (`following`: the following lists in
/// `following`, else the follower lists in `follower`). Returns (page on Redis, membership on
/// Redis, page on PostgreSQL, membership on PostgreSQL).
pub(crate) async fn baselines(
    conn: &MultiplexedConnection,
    pool: &PgPool,
    keys: &socialgraph_cache::keys::Keys,
    following: bool,
    users: &[i64],
    ids: &[Vec<i64>],
) -> anyhow::Result<(Hist, Hist, Hist, Hist)> {
    let set_keys: Vec<String> = users.iter().map(|u| keys.list(following, *u)[0].clone()).collect();
    let (page_sql, ids_sql) = if following {
        (FOLLOWING_PAGE_SQL, "SELECT followee_id, followed_at_ms FROM following WHERE follower_id = $1 AND followee_id = ANY($2) AND state = 1")
    } else {
        (
            "SELECT follower_id, followed_at_ms FROM follower WHERE followee_id = $1 AND state = 1 \
             ORDER BY followed_at_ms DESC, follower_id DESC LIMIT 51",
            "SELECT follower_id, followed_at_ms FROM follower WHERE followee_id = $1 AND follower_id = ANY($2) AND state = 1",
        )
    };
    Ok((
        pages(conn, &set_keys).await?,
        scores(conn, &set_keys, ids).await?,
        sql(pool, page_sql, users, None).await?,
        sql(pool, ids_sql, users, Some(ids)).await?,
    ))
}
