//! The cache part's throughput rows: warm BatchGetRelationships(100) from 32 callers for a
//! fixed time, beside ZMSCORE of the same 100 ids on the same cached sorted sets from 32
//! callers on one redis-rs connection, and beside a bare tonic server doing that ZMSCORE (the
//! floor, [`crate::floor`]). One client at a time shows latency, set by the round trips; this
//! shows the work each read costs the service and the cache Redis (connection checkouts,
//! timers, reply parses, the transaction of three caches), which one client hides. Each run
//! also reads the cores the cache Redis and this process (the services and the clients) used.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use socialgraph_integration_tests::Svc;
use socialgraph_proto::relation::v1::BatchGetRelationshipsRequest;
use socialgraph_proto::relation::v1::relation_service_client::RelationServiceClient;

use crate::backends::{Cores, Cpu};
use crate::floor::RawOp;
use crate::load::{CHANNELS, channels, closed_loop};
use crate::report::{Row, Run, progress, row};

/// Callers of each throughput run.
const CALLERS: usize = 32;

/// One throughput run and the cores used during it.
pub(crate) struct Measured {
    pub(crate) run: Run,
    cores: Cores,
}

impl Measured {
    /// Microseconds of the cache Redis's CPU per read.
    fn redis_us(&self) -> f64 {
        self.cores.store * 1e6 / self.run.rate().max(1e-9)
    }

    /// Microseconds of this process's CPU per read (the services, the bench's clients).
    fn process_us(&self) -> f64 {
        self.cores.process * 1e6 / self.run.rate().max(1e-9)
    }
}

/// The three runs: the service, the raw ZMSCORE and the bare tonic server doing it.
pub(crate) struct Throughput {
    pub(crate) svc: Measured,
    pub(crate) raw: Measured,
    pub(crate) bare: Measured,
}

/// What the runs read: the users' cached following sets and, per user, the 100 ids asked.
pub(crate) struct Reads<'a> {
    /// Each user's following-list key on the cache Redis.
    pub set_keys: &'a [String],
    /// The users, in the order of `set_keys`.
    pub users: &'a [i64],
    /// The ids asked of each user.
    pub others: &'a [Vec<i64>],
}

/// Runs `f` between two CPU readings of the cache Redis behind `conn` and this process.
async fn measured<F: std::future::Future<Output = anyhow::Result<Run>>>(conn: &MultiplexedConnection, f: F) -> anyhow::Result<Measured> {
    let mut c = conn.clone();
    let start = Cpu::with_redis(&mut c).await?;
    let run = f.await?;
    let cores = Cpu::with_redis(&mut c).await?.since(&start);
    Ok(Measured { run, cores })
}

/// Runs the three throughput runs of `secs` seconds each, with the cache warm: `svc` (relation-svc
/// with its cache), the cache Redis behind `conn` (URL `cache_url`), the same reads.
///
/// # Errors
/// A connection or the bare server could not be opened; a call's failure is counted in its run.
pub(crate) async fn run(svc: &Svc, conn: &MultiplexedConnection, cache_url: &str, reads: Reads<'_>, secs: u64) -> anyhow::Result<Throughput> {
    progress(&format!("throughput: warm BatchGetRelationships(100) from {CALLERS} callers, {secs} s, beside ZMSCORE and the bare server"));
    let n = reads.users.len();
    let asked: Arc<Vec<(i64, Vec<i64>)>> = Arc::new(reads.users.iter().copied().zip(reads.others.iter().cloned()).collect());
    let raw_args: Arc<Vec<(String, Vec<Vec<u8>>)>> =
        Arc::new(reads.set_keys.iter().cloned().zip(reads.others.iter().map(|o| crate::raw::members(o))).collect());
    let time = Duration::from_secs(secs);

    let clients: Vec<_> = channels(svc, CHANNELS).await?.into_iter().map(RelationServiceClient::new).collect();
    let svc_asked = Arc::clone(&asked);
    let svc_run = measured(conn, async move {
        Ok(closed_loop(CALLERS, usize::MAX, time, move |w, i| {
            let mut c = clients[w % clients.len()].clone();
            let (user_id, other_user_ids) = svc_asked[i % n].clone();
            async move {
                let r = c.batch_get_relationships(BatchGetRelationshipsRequest { user_id, other_user_ids }).await?.into_inner();
                anyhow::ensure!(r.relationships.len() == 100, "{} relationships for 100 ids", r.relationships.len());
                Ok(())
            }
        })
        .await)
    })
    .await?;

    let raw_conn = conn.clone();
    let args = Arc::clone(&raw_args);
    let raw_run = measured(conn, async move {
        Ok(closed_loop(CALLERS, usize::MAX, time, move |_, i| {
            let (mut c, (key, members)) = (raw_conn.clone(), args[i % n].clone());
            async move {
                let _: Vec<Option<f64>> = redis::cmd("ZMSCORE").arg(key).arg(members).query_async(&mut c).await?;
                Ok(())
            }
        })
        .await)
    })
    .await?;

    let url = cache_url.to_owned();
    let bare_run = measured(conn, async move {
        let make = move || async move {
            let redis = socialgraph_cache::pool(&url, CALLERS as u32, Duration::from_secs(2))?;
            let op: RawOp = Arc::new(move |asked: String| {
                let (redis, args) = (redis.clone(), Arc::clone(&raw_args));
                Box::pin(async move {
                    let (key, members) = &args[asked.parse::<usize>()? % n];
                    let mut c = socialgraph_cache::conn(&redis).await?;
                    let _: Vec<Option<f64>> = redis::cmd("ZMSCORE").arg(key).arg(members).query_async(&mut c).await?;
                    Ok(())
                })
            });
            Ok(op)
        };
        crate::floor::closed_loop(make, CALLERS, usize::MAX, time, |i| i.to_string()).await
    })
    .await?;
    Ok(Throughput { svc: svc_run, raw: raw_run, bare: bare_run })
}

impl Throughput {
    /// The table's rows: reads a second (service, bare) against the raw ZMSCORE's, and the
    /// CPU per read of the cache Redis and this process.
    pub(crate) fn rows(&self) -> Vec<Row> {
        let mut rows = Vec::new();
        for (what, m) in [("BatchGetRelationships(100), warm", &self.svc), ("bare tonic server + ZMSCORE", &self.bare)] {
            rows.push(row(format!("{what}: reads/s, {CALLERS} callers (raw: ZMSCORE)"), m.run.rate(), self.raw.run.rate(), "/s"));
            rows.push(row(format!("{what}: cache Redis CPU per read"), m.redis_us(), self.raw.redis_us(), "µs"));
            rows.push(row(format!("{what}: this process's CPU per read"), m.process_us(), self.raw.process_us(), "µs"));
        }
        rows
    }

    /// `n ok in t s` of each run, errors included.
    pub(crate) fn notes(&self) -> Vec<String> {
        vec![
            self.svc.run.describe("service"),
            self.bare.run.describe("bare server"),
            self.raw.run.describe("raw ZMSCORE"),
            format!(
                "raw = ZMSCORE of the same 100 ids on the same cached sorted set from {CALLERS} callers on one multiplexed redis-rs connection \
                 (which pipelines concurrent callers' commands); the service's warm read is one MULTI/EXEC of three caches on the cache Redis"
            ),
        ]
    }
}
