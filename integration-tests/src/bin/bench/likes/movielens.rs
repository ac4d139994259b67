//! Memory per liked entity: the MovieLens ratings loaded through the Like and Fav RPCs, the
//! counter-svc keys of every movie measured beside one SET of user ids per movie and metric.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use socialgraph_cache::entity_layout::EntityLayout;
use socialgraph_cache::keys::Keys;
use socialgraph_integration_tests::{Mesh, counter_caught_up};
use socialgraph_proto::counter::v1::counter_service_client::CounterServiceClient;
use socialgraph_proto::counter::v1::{EntityRef, FavRequest, LikeRequest};
use tonic::transport::Channel;

use crate::LikesArgs;
use crate::backends::{delete_prefix, memory_usage, used_memory};
use crate::load::closed_loop;
use crate::report::{Run, print_table, progress, row};

/// The facts of the ratings file: a rating of 4 or more is a like, 5 also a fav.
struct Ratings {
    /// (user, movie, fav) in file order, a like before the fav of the same rating.
    ops: Vec<(i64, i64, bool)>,
    /// The users who like each movie.
    likes: BTreeMap<i64, Vec<i64>>,
    /// The users who fav each movie.
    favs: BTreeMap<i64, Vec<i64>>,
    /// Rating lines read.
    ratings: usize,
}

/// Loads the MovieLens ratings through the RPCs and prints the memory per movie; prints a line
/// and measures nothing when the ratings file cannot be opened.
pub(super) async fn run(
    m: &Mesh,
    a: &LikesArgs,
    clients: &[CounterServiceClient<Channel>],
    bp: &str,
    conn: &mut redis::aio::MultiplexedConnection,
) -> anyhow::Result<()> {
    let file = match std::fs::File::open(&a.movielens) {
        Ok(f) => f,
        Err(e) => {
            println!("\n  MovieLens memory not measured: cannot open {}: {e}", a.movielens);
            return Ok(());
        }
    };
    let Ratings { ops, likes, favs, ratings } = read_ratings(file)?;
    let (n_likes, n_favs) = (likes.values().map(Vec::len).sum::<usize>(), favs.values().map(Vec::len).sum::<usize>());
    progress(&format!("MovieLens: {ratings} ratings → {n_likes} likes and {n_favs} favs through the RPCs"));
    let load = load(a, clients, ops).await;
    counter_caught_up(&m.redis_url, &m.prefix, &[&m.topics.counter], Duration::from_secs(600)).await?;

    let movies: Vec<i64> = likes.keys().chain(favs.keys()).copied().collect::<BTreeSet<_>>().into_iter().collect();
    let keys = Keys::new(m.prefix.clone());
    // The shared set of recently toggled entities: the outbox relay drops each entity once its
    // outbox is empty and it has been quiet for `counters.relay_quiet_ms`; whatever is left
    // is counted with the entities.
    let pending_key = keys.pending_entities();
    let (pending_members, pending_bytes) = pending_after_quiet(conn, &pending_key).await?;
    let (svc_total, breakdown) = svc_memory(conn, &keys, &movies).await?;
    let svc_total = svc_total + pending_bytes;

    let (set_delta, set_total) = set_memory(conn, bp, &likes, &favs).await?;
    let n = movies.len() as f64;
    print_table(
        &format!("Memory per liked entity: MovieLens, {} movies with {n_likes} likes and {n_favs} favs", movies.len()),
        "counter-svc keys",
        "SET of user ids",
        &[row("MEMORY USAGE bytes/movie", svc_total as f64 / n, set_total as f64 / n, "B")],
        &[
            format!("counter-svc per movie: {}", breakdown.join(", ")),
            format!(
                "counted too: the shared pending-entities sorted set, {pending_members} members and {pending_bytes} B when measured \
                 (every toggle adds its entity; the outbox relay removes quiet entities with an empty outbox)"
            ),
            format!(
                "raw = SADD {bp}ml:{{movie:id}}:like / :fav of the user ids (intset encoding); used_memory delta {:.0} B/movie",
                set_delta as f64 / n
            ),
            load.describe("load through Like/Fav RPCs") + &format!(" ({:.0} toggles/s)", load.rate()),
        ],
    );
    Ok(())
}

/// Reads the gzip CSV `userId,movieId,rating,timestamp`, skipping the header and bad lines.
fn read_ratings(file: std::fs::File) -> anyhow::Result<Ratings> {
    let mut text = String::new();
    flate2::read::GzDecoder::new(file).read_to_string(&mut text)?;
    let mut r = Ratings { ops: Vec::new(), likes: BTreeMap::new(), favs: BTreeMap::new(), ratings: 0 };
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        let (Some(u), Some(mv), Some(rating)) = (f.first(), f.get(1), f.get(2)) else {
            continue;
        };
        let (Ok(u), Ok(mv), Ok(rating)) = (u.parse::<i64>(), mv.parse::<i64>(), rating.parse::<f64>()) else {
            continue;
        };
        r.ratings += 1;
        if rating >= 4.0 {
            r.ops.push((u, mv, false));
            r.likes.entry(mv).or_default().push(u);
        }
        if rating >= 5.0 {
            r.ops.push((u, mv, true));
            r.favs.entry(mv).or_default().push(u);
        }
    }
    Ok(r)
}

/// Each of `ops` through the Like or Fav RPC (at most 900 s).
async fn load(a: &LikesArgs, clients: &[CounterServiceClient<Channel>], ops: Vec<(i64, i64, bool)>) -> Run {
    let ops = Arc::new(ops);
    let (cl, oo) = (clients.to_vec(), Arc::clone(&ops));
    closed_loop(a.concurrency, oo.len(), Duration::from_secs(900), move |w, i| {
        let mut c = cl[w % cl.len()].clone();
        let (actor_id, entity_id, fav) = oo[i];
        let entity = Some(EntityRef { entity_type: "movie".into(), entity_id });
        async move {
            let changed = if fav {
                c.fav(FavRequest { actor_id, entity, owner_id: 0 }).await?.into_inner().changed
            } else {
                c.like(LikeRequest { actor_id, entity, owner_id: 0 }).await?.into_inner().changed
            };
            anyhow::ensure!(changed, "toggle changed nothing");
            Ok(())
        }
    })
    .await
}

/// Waits (at most 30 s) for the relay to empty the pending-entities set; returns its members
/// and MEMORY USAGE then.
pub(crate) async fn pending_after_quiet(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> anyhow::Result<(u64, u64)> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let members: u64 = redis::cmd("ZCARD").arg(key).query_async(&mut *conn).await?;
        if members == 0 || std::time::Instant::now() > deadline {
            let bytes = memory_usage(conn, &[key.to_owned()]).await?.first().copied().unwrap_or_default();
            return Ok((members, bytes));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// MEMORY USAGE of every key of every movie with a fact; returns the total in bytes and, per
/// kind of key, the mean bytes per movie and the keys present.
async fn svc_memory(conn: &mut redis::aio::MultiplexedConnection, keys: &Keys, movies: &[i64]) -> anyhow::Result<(u64, Vec<String>)> {
    let (by_kind, layouts) = entity_keys(conn, keys, "movie", movies).await?;
    let kinds = ["state strings", "bitmap chunks and spill sets", "outboxes"];
    let mut svc_total = 0u64;
    let mut breakdown = Vec::new();
    for (kind, ks) in kinds.iter().zip(&by_kind) {
        let usage = memory_usage(conn, ks).await?;
        let sum: u64 = usage.iter().sum();
        let present = usage.iter().filter(|&&u| u > 0).count();
        svc_total += sum;
        breakdown.push(format!("{kind} {:.0} B ({present} keys)", sum as f64 / movies.len() as f64));
    }
    breakdown.push(layouts);
    Ok((svc_total, breakdown))
}

/// The keys of each entity of `etype` in `ids`, by kind (state strings, fact keys the states
/// name, outboxes), and a line that says how the metrics are represented.
pub(crate) async fn entity_keys(
    conn: &mut redis::aio::MultiplexedConnection,
    keys: &Keys,
    etype: &str,
    ids: &[i64],
) -> anyhow::Result<([Vec<String>; 3], String)> {
    let mut by_kind: [Vec<String>; 3] = Default::default();
    let (mut arrays, mut bitmapped, mut spilled) = (0, 0, 0);
    for chunk in ids.chunks(1_000) {
        let mut pipe = redis::pipe();
        for id in chunk {
            pipe.get(keys.entity(etype, *id).state());
        }
        let states: Vec<Option<Vec<u8>>> = pipe.query_async(&mut *conn).await?;
        for (id, state) in chunk.iter().zip(states) {
            let k = keys.entity(etype, *id);
            let layout = state.as_deref().and_then(EntityLayout::decode).unwrap_or_default();
            for m in &layout.metrics {
                arrays += usize::from(!m.small.is_empty() || !m.big.is_empty());
                bitmapped += usize::from(!m.chunks.is_empty());
                spilled += usize::from(m.spilled);
            }
            by_kind[0].push(k.state());
            by_kind[1].extend(layout.fact_keys(&k));
            by_kind[2].push(k.outbox());
        }
    }
    Ok((by_kind, format!("metrics with actors in the state {arrays}, with bitmap chunks {bitmapped}, spilled {spilled}")))
}

/// Raw: the same facts as one SET of user ids per movie and metric, under the bench prefix
/// (deleted afterwards); returns (used_memory delta, sum of MEMORY USAGE) in bytes.
async fn set_memory(
    conn: &mut redis::aio::MultiplexedConnection,
    bp: &str,
    likes: &BTreeMap<i64, Vec<i64>>,
    favs: &BTreeMap<i64, Vec<i64>>,
) -> anyhow::Result<(i64, u64)> {
    let before = used_memory(conn).await?;
    let mut set_keys = Vec::new();
    for (metric, map) in [("like", likes), ("fav", favs)] {
        for chunk in map.iter().collect::<Vec<_>>().chunks(500) {
            let mut pipe = redis::pipe();
            for (mv, users) in chunk {
                let key = format!("{bp}ml:{{movie:{mv}}}:{metric}");
                pipe.sadd(&key, users.as_slice()).ignore();
                set_keys.push(key);
            }
            pipe.query_async::<()>(&mut *conn).await?;
        }
    }
    let set_delta = used_memory(conn).await? - before;
    let set_total: u64 = memory_usage(conn, &set_keys).await?.iter().sum();
    delete_prefix(conn, bp).await?;
    Ok((set_delta, set_total))
}
