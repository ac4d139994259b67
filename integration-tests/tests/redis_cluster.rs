//! The Redis pool on a Redis Cluster of the test's own: pipelines that span many slots keep
//! working while slots migrate under them, each slot's commands stay in order, and nothing is
//! lost. (The mesh on a cluster through a migration is the fault catalogue's f11.)

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use socialgraph_testkit::process;

/// Writers, each with its own keys.
const WRITERS: u64 = 4;
/// Keys (hash tags) per writer, so that a pipeline spans that many slots.
const KEYS: u64 = 64;

/// One round of writer `w`: for each of its keys, DEL then RPUSH of the round (so the list
/// holds exactly the round only when the two ran in order) and a SET of the round.
fn round(w: u64, r: u64) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    for k in 0..KEYS {
        pipe.del(format!("t:{{w{w}k{k}}}:l")).ignore();
        pipe.rpush(format!("t:{{w{w}k{k}}}:l"), r).ignore();
        pipe.set(format!("t:{{w{w}k{k}}}:s"), r).ignore();
    }
    pipe
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pipelines_across_slots_survive_a_slot_migration() -> anyhow::Result<()> {
    socialgraph_telemetry::init_for_tests();
    let cluster = process::redis_cluster(3).await?;
    let pool = socialgraph_cache::pool(&cluster.url(), 8, Duration::from_secs(2))?;
    let stop = Arc::new(AtomicU64::new(0));
    let (done, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (pool, stop, done, failed) = (pool.clone(), Arc::clone(&stop), Arc::clone(&done), Arc::clone(&failed));
            tokio::spawn(async move {
                let mut last_ok = 0;
                let mut r = 1;
                while stop.load(Ordering::Relaxed) == 0 {
                    match socialgraph_cache::query_pipeline::<()>(&pool, Duration::from_secs(2), &round(w, r), &[]).await {
                        Ok(()) => {
                            last_ok = r;
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            failed.fetch_add(1, Ordering::Relaxed);
                            println!("writer {w} round {r}: {e}");
                        }
                    }
                    r += 1;
                }
                // A round that failed may have been applied in part: write one more that must
                // succeed, so the final state is known.
                socialgraph_cache::query_pipeline::<()>(&pool, Duration::from_secs(2), &round(w, r), &[]).await?;
                anyhow::Ok((last_ok, r))
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let all = cluster.slots_of(0).await?;
    cluster.reshard(0, 1, all).await?;
    cluster.reshard(1, 2, 4_000).await?;
    let migrated = started.elapsed();
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(1, Ordering::Relaxed);
    let mut conn = socialgraph_cache::conn(&pool).await?;
    for (w, t) in writers.into_iter().enumerate() {
        let (_, last) = t.await??;
        for k in 0..KEYS {
            let list: Vec<u64> = redis::AsyncCommands::lrange(&mut conn, format!("t:{{w{w}k{k}}}:l"), 0, -1).await?;
            let set: u64 = redis::AsyncCommands::get(&mut conn, format!("t:{{w{w}k{k}}}:s")).await?;
            assert_eq!((list, set), (vec![last], last), "writer {w} key {k}: one slot's commands ran in order and the last round is whole");
        }
    }
    let (done, failed) = (done.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    println!("{} slot migrations in {migrated:?} under {WRITERS} writers of {KEYS}-slot pipelines: {done} rounds done, {failed} failed", all + 4_000);
    assert!(done > 0, "the writers wrote");
    assert_eq!(failed, 0, "no round fails while slots migrate (MOVED, ASK and TRYAGAIN are followed)");
    Ok(())
}

#[tokio::test]
async fn a_cluster_url_naming_a_single_server_is_unavailable_with_the_reason() -> anyhow::Result<()> {
    let single = process::redis(0).await?;
    let pool = socialgraph_cache::pool(&format!("redis+cluster://127.0.0.1:{}", single.port), 2, Duration::from_secs(2))?;
    let mut pipe = redis::pipe();
    pipe.set("t:{u}:k", 1).ignore();
    let err = socialgraph_cache::query_pipeline::<()>(&pool, Duration::from_secs(2), &pipe, &[]).await.expect_err("a single server serves no slot");
    // UNAVAILABLE for callers (never INTERNAL), the reason in the error for the log.
    assert!(err.is_unavailable(), "{err}");
    assert!(err.to_string().contains("cluster support disabled"), "{err}");
    Ok(())
}
