//! Memory per like at the densities the adaptive layout must serve: one very hot entity (a
//! million of the first two million user ids), and random 62-bit actor ids spread over many
//! entities and crowded on one. Each shape goes through the service's own toggle script (the
//! RPC's Redis step, without the gRPC hop) and is measured beside a plain SET of the same ids
//! and, where ids allow, a plain bitmap. Every key of the entity counts: state, bitmap chunks,
//! spill sets (outboxes are emptied first, as the relay does).

use std::collections::BTreeSet;

use rand::{Rng, SeedableRng, rngs::StdRng};
use socialgraph_cache::entities::{EntityScripts, actor_args};
use socialgraph_cache::keys::Keys;

use super::movielens::entity_keys;
use crate::backends::{bench_prefix, delete_prefix, memory_usage, used_memory};
use crate::report::{print_table, progress, row, summarize};

/// One shape: which actors like which entity.
struct Shape {
    name: &'static str,
    /// (entity, actors), actors distinct per entity.
    likes: Vec<(i64, Vec<i64>)>,
    /// Whether a plain bitmap of the ids (SETBIT uid) is possible (ids below 2^32).
    bitmap: bool,
}

fn shapes() -> Vec<Shape> {
    let mut rng = StdRng::seed_from_u64(62);
    let mut hot: Vec<i64> = (1..=2_000_000).collect();
    // A random half, in random order: likes do not arrive sorted.
    for i in (1..hot.len()).rev() {
        hot.swap(i, rng.random_range(0..=i));
    }
    hot.truncate(1_000_000);
    let big = |rng: &mut StdRng, n: usize| -> Vec<i64> {
        let mut s = BTreeSet::new();
        while s.len() < n {
            s.insert(rng.random_range((1i64 << 32)..(1i64 << 62)));
        }
        s.into_iter().collect()
    };
    let sparse_many: Vec<(i64, Vec<i64>)> = (1..=2_000).map(|e| (e, big(&mut rng, 10))).collect();
    vec![
        Shape { name: "dense: 1 entity, 1,000,000 of the first 2,000,000 ids", likes: vec![(1, hot)], bitmap: true },
        Shape { name: "sparse: 2,000 entities x 10 random 62-bit ids", likes: sparse_many, bitmap: false },
        Shape { name: "sparse: 1 entity, 20,000 random 62-bit ids", likes: vec![(1, big(&mut rng, 20_000))], bitmap: false },
    ]
}

/// Measures every shape and prints one table.
pub(crate) async fn run(conn: &mut redis::aio::MultiplexedConnection) -> anyhow::Result<()> {
    let scripts = EntityScripts::default();
    // EVALSHA in pipelines: the script must be loaded first.
    scripts.toggle.prepare_invoke().load_async(&mut *conn).await?;
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    for shape in shapes() {
        progress(&format!("like memory, {}", shape.name));
        let bp = bench_prefix();
        let keys = Keys::new(bp.clone());
        let n_likes: usize = shape.likes.iter().map(|(_, a)| a.len()).sum();
        let before = used_memory(conn).await?;
        for (entity, actors) in &shape.likes {
            load(conn, &scripts, &keys, *entity, actors).await?;
        }
        let ids: Vec<i64> = shape.likes.iter().map(|(e, _)| *e).collect();
        let mut pipe = redis::pipe();
        for e in &ids {
            pipe.del(keys.entity("post", *e).outbox()).ignore();
        }
        pipe.query_async::<()>(&mut *conn).await?;
        let svc_delta = used_memory(conn).await? - before;
        let (by_kind, layout) = entity_keys(conn, &keys, "post", &ids).await?;
        let all: Vec<String> = by_kind.into_iter().flatten().collect();
        let svc: u64 = memory_usage(conn, &all).await?.iter().sum();

        let before = used_memory(conn).await?;
        let mut set_keys = Vec::new();
        let mut bm_keys = Vec::new();
        for (e, actors) in &shape.likes {
            let set = format!("{bp}raw:set:{{{e}}}");
            for part in actors.chunks(10_000) {
                redis::cmd("SADD").arg(&set).arg(part).query_async::<()>(&mut *conn).await?;
            }
            set_keys.push(set);
            if shape.bitmap {
                let bm = format!("{bp}raw:bm:{{{e}}}");
                for part in actors.chunks(10_000) {
                    let mut pipe = redis::pipe();
                    for a in part {
                        pipe.setbit(&bm, *a as usize, true).ignore();
                    }
                    pipe.query_async::<()>(&mut *conn).await?;
                }
                bm_keys.push(bm);
            }
        }
        let raw_delta = used_memory(conn).await? - before;
        let set: u64 = memory_usage(conn, &set_keys).await?.iter().sum();
        let bm: u64 = memory_usage(conn, &bm_keys).await?.iter().sum();
        delete_prefix(conn, &bp).await?;
        let per = |b: u64| b as f64 / n_likes as f64;
        rows.push(row(format!("{}: bytes/like vs SET", shape.name), per(svc), per(set), "B"));
        if shape.bitmap {
            rows.push(row(format!("{}: bytes/like vs bitmap", shape.name), per(svc), per(bm), "B"));
        }
        let better = if shape.bitmap { set.min(bm) } else { set };
        let target = if shape.bitmap { "<= 0.25x of SET" } else { "<= 1x of SET" };
        summarize(format!("Like facts, {} (vs SET)", shape.name), per(svc), per(set), "B", target);
        notes.push(format!(
            "{}: {} entities, {n_likes} likes; service {svc} B, SET {set} B{}; better plain layout {better} B; used_memory \
             delta: service {svc_delta} B, plain SET{} {raw_delta} B; {layout}",
            shape.name,
            ids.len(),
            if shape.bitmap { format!(", bitmap {bm} B") } else { String::new() },
            if shape.bitmap { " and bitmap" } else { "" }
        ));
    }
    notes.push(
        "service = the toggle script from redis-rs (the Like RPC's Redis step), MEMORY USAGE summed over every key of each \
         entity; SET = SADD of the decimal ids, one key per entity; bitmap = SETBIT uid on one key per entity"
            .into(),
    );
    print_table("Memory per like by density (the adaptive layout)", "counter-svc keys", "plain", &rows, &notes);
    Ok(())
}

/// Likes each actor of `entity` through the (loaded) toggle script, 1,000 calls a round trip.
async fn load(conn: &mut redis::aio::MultiplexedConnection, scripts: &EntityScripts, keys: &Keys, entity: i64, actors: &[i64]) -> anyhow::Result<()> {
    let k = keys.entity("post", entity);
    for part in actors.chunks(1_000) {
        let mut pipe = redis::pipe();
        for &actor in part {
            let (small, bytes) = actor_args(actor);
            let mut inv = scripts.toggle.prepare_invoke();
            inv.key(k.state()).key(k.outbox()).key(k.chunk_prefix("like")).key(k.spill("like"));
            inv.arg(1).arg(small).arg(bytes.as_slice()).arg(1).arg(format!("{actor}|0|1|1|0|"));
            pipe.invoke_script(&inv).ignore();
        }
        pipe.query_async::<()>(&mut *conn).await?;
        // Keep the outbox short, as the relay would.
        redis::cmd("DEL").arg(k.outbox()).query_async::<()>(&mut *conn).await?;
    }
    Ok(())
}
