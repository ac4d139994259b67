//! Part 8, cache, beside a graph database: the warm reads of the cache part done on FalkorDB
//! (a Redis module answering openCypher) holding the same edges, in the same run, one query at
//! a time from one client: the cache is meant to stay below FalkorDB on every query.
//!
//! FalkorDB is not part of the mesh: `scripts/falkordb.sh` installs and starts it, and the
//! part runs only when `--falkordb-url` (or `SG_BENCH_FALKORDB_URL`) names it. The graph is
//! one node `:U {id}` per account (indexed on `id`) and one `[:F {t}]` relationship per
//! followed edge, `t` = followed_at_ms as PostgreSQL holds it after the load, so pages sort the
//! same way (followed_at descending, then id descending) and the first pages are compared with
//! PostgreSQL's before anything is timed.

use std::time::Instant;

use redis::Value;
use redis::aio::MultiplexedConnection;
use sea_orm::sqlx::PgPool;

use crate::cache::{none, timed};
use crate::report::{Hist, latency_rows, ms, print_table, progress, summarize};

/// The graph's key in FalkorDB.
const GRAPH: &str = "sg_bench";
/// Edges per load query.
const LOAD_BATCH: usize = 5_000;

/// The inputs of the warm reads, the same the service was timed with.
pub(crate) struct Workload<'a> {
    /// Users whose following page and relationship batch were read.
    pub users: &'a [i64],
    /// The 100 accounts of each relationship batch (same index as `users`).
    pub others: &'a [Vec<i64>],
    /// Accounts whose follower page was read.
    pub followed: &'a [i64],
    /// The partner of each common-following read (same index as `users`).
    pub common: &'a [i64],
    /// The user of each familiar-followers read, `users` being the viewers.
    pub familiar: &'a [i64],
}

/// The service's warm latencies of the same reads.
pub(crate) struct Warm<'a> {
    pub following_page: &'a Hist,
    pub follower_page: &'a Hist,
    pub relationships: &'a Hist,
    pub common: &'a Hist,
    pub familiar: &'a Hist,
}

/// `v` as an integer (FalkorDB answers integers as integers, some clients as strings).
fn int(v: &Value) -> anyhow::Result<i64> {
    match v {
        Value::Int(i) => Ok(*i),
        Value::BulkString(b) => Ok(std::str::from_utf8(b)?.parse()?),
        Value::SimpleString(s) => Ok(s.parse()?),
        Value::Nil => Ok(0),
        other => anyhow::bail!("not an integer: {other:?}"),
    }
}

/// The rows of a `GRAPH.RO_QUERY` answer (header, rows, statistics) as integers.
fn rows(answer: &Value) -> anyhow::Result<Vec<Vec<i64>>> {
    let Value::Array(parts) = answer else { anyhow::bail!("unexpected answer: {answer:?}") };
    let Some(Value::Array(rows)) = parts.get(1) else { return Ok(Vec::new()) };
    rows.iter()
        .map(|r| match r {
            Value::Array(cells) => cells.iter().map(int).collect(),
            other => anyhow::bail!("unexpected row: {other:?}"),
        })
        .collect()
}

fn list(ids: &[i64]) -> String {
    let items: Vec<String> = ids.iter().map(i64::to_string).collect();
    format!("[{}]", items.join(","))
}

async fn query(conn: &mut MultiplexedConnection, read_only: bool, q: &str) -> anyhow::Result<Vec<Vec<i64>>> {
    let answer: Value = redis::cmd(if read_only { "GRAPH.RO_QUERY" } else { "GRAPH.QUERY" }).arg(GRAPH).arg(q).query_async(conn).await?;
    rows(&answer)
}

/// Replaces the graph with the followed edges of PostgreSQL's `following` table.
async fn load(conn: &mut MultiplexedConnection, pool: &PgPool) -> anyhow::Result<usize> {
    let edges: Vec<(i64, i64, i64)> =
        sea_orm::sqlx::query_as("SELECT follower_id, followee_id, followed_at_ms FROM following WHERE state = 1").fetch_all(pool).await?;
    let max_id = edges.iter().map(|(a, b, _)| *a.max(b)).max().unwrap_or(0);
    let _: Result<Value, _> = redis::cmd("GRAPH.DELETE").arg(GRAPH).query_async(conn).await;
    query(conn, false, "CREATE INDEX FOR (u:U) ON (u.id)").await?;
    query(conn, false, &format!("UNWIND range(1, {max_id}) AS i CREATE (:U {{id: i}})")).await?;
    for chunk in edges.chunks(LOAD_BATCH) {
        let items: Vec<String> = chunk.iter().map(|(a, b, t)| format!("[{a},{b},{t}]")).collect();
        let q =
            format!("CYPHER es=[{}] UNWIND $es AS e MATCH (a:U {{id: e[0]}}), (b:U {{id: e[1]}}) CREATE (a)-[:F {{t: e[2]}}]->(b)", items.join(","));
        query(conn, false, &q).await?;
    }
    Ok(edges.len())
}

/// The first page of `user`'s following list (ids), from FalkorDB.
fn following_page(user: i64) -> String {
    format!("CYPHER u={user} MATCH (:U {{id: $u}})-[f:F]->(b:U) RETURN b.id, f.t ORDER BY f.t DESC, b.id DESC LIMIT 51")
}

/// A join page of users `a` and `b`: `path` binds `$a`, `$b`, the edge `f` from `a` and the
/// account `x` listed, in `a`'s list order.
fn two_user_page(a: i64, b: i64, path: &str) -> String {
    format!("CYPHER a={a} b={b} MATCH {path} RETURN x.id, f.t ORDER BY f.t DESC, x.id DESC LIMIT 51")
}

/// FalkorDB's latencies of the warm reads.
pub(crate) struct Falkor {
    edges: usize,
    reads: usize,
    pages: Hist,
    follower_pages: Hist,
    relationships: Hist,
    common: Hist,
    familiar: Hist,
}

/// Loads the graph, checks its first pages against PostgreSQL and times the reads of `w`.
pub(crate) async fn run(url: &str, pool: &PgPool, w: &Workload<'_>) -> anyhow::Result<Falkor> {
    let client = redis::Client::open(url)?;
    // A load query of LOAD_BATCH edges takes seconds: no response timeout.
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
    let mut conn = client.get_multiplexed_async_connection_with_config(&config).await.map_err(|e| {
        anyhow::anyhow!("FalkorDB at {url} cannot be reached ({e}): start it with scripts/falkordb.sh, or leave --falkordb-url empty")
    })?;
    progress("FalkorDB: loading the same followed edges");
    let t = Instant::now();
    let n = load(&mut conn, pool).await?;
    progress(&format!("FalkorDB: {n} edges loaded in {:.1} s", t.elapsed().as_secs_f64()));
    for &u in w.users.iter().take(50) {
        let ours: Vec<(i64, i64)> = sea_orm::sqlx::query_as(
            "SELECT followee_id, followed_at_ms FROM following WHERE follower_id = $1 AND state = 1 \
             ORDER BY followed_at_ms DESC, followee_id DESC LIMIT 51",
        )
        .bind(u)
        .fetch_all(pool)
        .await?;
        let theirs: Vec<(i64, i64)> = query(&mut conn, true, &following_page(u)).await?.into_iter().map(|r| (r[0], r[1])).collect();
        anyhow::ensure!(ours == theirs, "FalkorDB's following page of {u} differs from PostgreSQL's");
    }
    let timed_queries = |qs: Vec<String>| {
        let conn = conn.clone();
        async move {
            timed(qs.len(), none, |i| {
                let (mut conn, q) = (conn.clone(), qs[i].clone());
                async move {
                    query(&mut conn, true, &q).await?;
                    anyhow::Ok(())
                }
            })
            .await
        }
    };
    progress("FalkorDB: the warm reads");
    let pages = timed_queries(w.users.iter().map(|&u| following_page(u)).collect()).await?;
    let follower_pages = timed_queries(
        w.followed
            .iter()
            .map(|&u| format!("CYPHER u={u} MATCH (a:U)-[f:F]->(:U {{id: $u}}) RETURN a.id, f.t ORDER BY f.t DESC, a.id DESC LIMIT 51"))
            .collect(),
    )
    .await?;
    let relationships = timed_queries(
        w.users
            .iter()
            .zip(w.others)
            .map(|(&u, others)| {
                format!(
                    "CYPHER u={u} ids={} MATCH (a:U {{id: $u}}) UNWIND $ids AS i MATCH (b:U {{id: i}}) \
                     OPTIONAL MATCH (a)-[o:F]->(b) OPTIONAL MATCH (b)-[n:F]->(a) RETURN i, o.t, n.t",
                    list(others)
                )
            })
            .collect(),
    )
    .await?;
    let common =
        timed_queries(w.users.iter().zip(w.common).map(|(&a, &b)| two_user_page(a, b, "(:U {id: $a})-[f:F]->(x:U)<-[:F]-(:U {id: $b})")).collect())
            .await?;
    let familiar =
        timed_queries(w.users.iter().zip(w.familiar).map(|(&a, &b)| two_user_page(a, b, "(:U {id: $a})-[f:F]->(x:U)-[:F]->(:U {id: $b})")).collect())
            .await?;
    let _: Value = redis::cmd("GRAPH.DELETE").arg(GRAPH).query_async(&mut conn).await?;
    Ok(Falkor { edges: n, reads: w.users.len(), pages, follower_pages, relationships, common, familiar })
}

impl Falkor {
    /// Prints FalkorDB's rows beside the service's `warm` ones, and their summary lines.
    pub(crate) fn report(&self, warm: &Warm<'_>) {
        let pairs = [
            ("following page (50), warm", warm.following_page, &self.pages),
            ("follower page (50), warm", warm.follower_page, &self.follower_pages),
            ("BatchGetRelationships(100), warm", warm.relationships, &self.relationships),
            ("common following (50), warm", warm.common, &self.common),
            ("familiar followers (50), warm", warm.familiar, &self.familiar),
        ];
        print_table(
            &format!("beside FalkorDB ({} edges), {} reads per row, one client", self.edges, self.reads),
            "socialgraph (gRPC)",
            "FalkorDB",
            &latency_rows(&pairs),
            &[
                "FalkorDB = GRAPH.RO_QUERY of the same read in openCypher with parameters, so plans are cached (pages ORDER BY f.t DESC, id DESC LIMIT 51; relationships: \
                 UNWIND of the 100 ids with both directions OPTIONAL MATCHed), same inputs as the service rows"
                    .into(),
                "the first 50 following pages equal PostgreSQL's".into(),
            ],
        );
        for (what, svc, falkor) in pairs {
            summarize(format!("{what}: p99 (vs FalkorDB)"), ms(svc, 0.99), ms(falkor, 0.99), "ms", "below FalkorDB (< 1x)");
        }
    }
}
