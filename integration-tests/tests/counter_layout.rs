//! The adaptive layout of like/fav facts: one entity pushed through every representation (small
//! array, bitmap chunks, big array, spill set) and back, alone and under concurrent togglers,
//! with counts, action states, rebuilds and the owner's likes received compared with a model
//! and with the facts after every step.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng, rngs::StdRng};
use socialgraph_cache::entities::{BIG_MAX, SMALL_MAX, UNSPILL_AT};
use socialgraph_cache::keys::EntityKeys;
use socialgraph_integration_tests::*;
use socialgraph_proto::counter::v1::counter_service_client::CounterServiceClient;
use socialgraph_proto::counter::v1::*;
use tokio::sync::Barrier;
use tonic::transport::Channel;

const SETTLE: Duration = Duration::from_secs(240);
const OWNER: i64 = 9;

fn post(id: i64) -> EntityRef {
    EntityRef { entity_type: "post".into(), entity_id: id }
}

/// Likes (`want`) or unlikes each actor, 16 calls at a time (the end state does not depend on
/// their order); every call must change the fact.
async fn toggle_all(c: &mut CounterServiceClient<Channel>, entity: i64, actors: &[i64], want: bool) -> anyhow::Result<()> {
    let calls = actors.iter().map(|&actor_id| {
        let mut c = c.clone();
        async move {
            let changed = if want {
                c.like(LikeRequest { actor_id, entity: Some(post(entity)), owner_id: OWNER }).await?.into_inner().changed
            } else {
                c.unlike(UnlikeRequest { actor_id, entity: Some(post(entity)), owner_id: OWNER }).await?.into_inner().changed
            };
            anyhow::ensure!(changed, "{} of {actor_id} changed nothing", if want { "like" } else { "unlike" });
            anyhow::Ok(())
        }
    });
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(calls).buffer_unordered(16).collect().await;
    results.into_iter().collect()
}

/// The served like count, the rebuilt one, the facts and a sample of action states all equal
/// the model; the sample holds members and non-members.
async fn assert_exact(
    c: &mut CounterServiceClient<Channel>,
    conn: &mut socialgraph_cache::Conn,
    keys: &EntityKeys,
    entity: i64,
    model: &BTreeSet<i64>,
    probes: &[i64],
    step: &str,
) -> anyhow::Result<()> {
    let want = model.len() as u64;
    let served = c.get_entity_counts(GetEntityCountsRequest { entity: Some(post(entity)), metrics: vec![] }).await?.into_inner();
    assert_eq!(served.counts.unwrap_or_default().counts[0].count, want, "{step}: served like count");
    assert_eq!(facts::actors_in_facts(conn, keys, 0).await?, want, "{step}: actors in the facts");
    let rebuilt = c.rebuild_entity_counts(admin(RebuildEntityCountsRequest { entity: Some(post(entity)) })).await?.into_inner();
    assert_eq!(rebuilt.counts.unwrap_or_default().counts[0].count, want, "{step}: rebuilt like count");
    for &actor_id in probes.iter().chain(model.iter().take(50)) {
        let s = c.get_action_states(GetActionStatesRequest { actor_id, entity_type: "post".into(), entity_ids: vec![entity] }).await?.into_inner();
        assert_eq!(s.states[0].liked, model.contains(&actor_id), "{step}: liked state of actor {actor_id}");
        assert!(!s.states[0].faved, "{step}: no fav of actor {actor_id}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_entity_goes_through_every_representation_and_back_exactly() -> anyhow::Result<()> {
    let m = Mesh::start(&socialgraph_testkit::redis_url()).await?;
    let mut c = m.counter.counter().await?;
    let mut conn = redis_conn(&m.redis_url).await?;
    let keys = socialgraph_cache::keys::Keys::new(m.prefix.clone()).entity("post", 1);
    let mut rng = StdRng::seed_from_u64(19);
    let mut model = BTreeSet::new();
    let probes: Vec<i64> = vec![1, 2, 599, 600, 601, 32_768, 1 << 40, i64::MAX];

    // Few actors: in the state's small array.
    let dense: Vec<i64> = (1..=600).collect();
    toggle_all(&mut c, 1, &dense[..20], true).await?;
    model.extend(&dense[..20]);
    let like = facts::layout(&mut conn, &keys).await?.metrics[0].clone();
    assert_eq!((like.small.len(), like.chunks.len()), (20, 0), "20 actors stay in the array");
    assert_exact(&mut c, &mut conn, &keys, 1, &model, &probes, "20 dense").await?;

    // Dense: chunk 0 turns into a bitmap.
    toggle_all(&mut c, 1, &dense[20..], true).await?;
    model.extend(&dense[20..]);
    let like = facts::layout(&mut conn, &keys).await?.metrics[0].clone();
    assert_eq!((like.small.len(), like.chunks.clone()), (0, vec![(0, 600)]), "600 actors of one chunk are a bitmap");
    assert_exact(&mut c, &mut conn, &keys, 1, &model, &probes, "600 dense").await?;

    // Emptied to 10: back into the array, the bitmap key gone.
    toggle_all(&mut c, 1, &dense[..590], false).await?;
    for a in &dense[..590] {
        model.remove(a);
    }
    let like = facts::layout(&mut conn, &keys).await?.metrics[0].clone();
    assert_eq!((like.small.clone(), like.chunks.len()), ((591..=600).collect::<Vec<u64>>(), 0), "10 actors go back to the array");
    let exists: bool = redis::AsyncCommands::exists(&mut conn, keys.chunk("like", 0)).await?;
    assert!(!exists, "the emptied bitmap chunk is deleted");
    assert_exact(&mut c, &mut conn, &keys, 1, &model, &probes, "back to 10").await?;

    // Snowflake-like ids: the big array, then over BIG_MAX the spill set.
    let big: Vec<i64> = (0..BIG_MAX + 88).map(|_| rng.random_range((1i64 << 40)..(1i64 << 62))).collect::<BTreeSet<_>>().into_iter().collect();
    toggle_all(&mut c, 1, &big[..100], true).await?;
    model.extend(&big[..100]);
    let like = facts::layout(&mut conn, &keys).await?.metrics[0].clone();
    assert_eq!((like.big.len(), like.spilled), (100, false), "100 big ids stay whole in the state");
    toggle_all(&mut c, 1, &big[100..], true).await?;
    model.extend(&big[100..]);
    assert!(facts::layout(&mut conn, &keys).await?.metrics[0].spilled, "{} big ids spill", big.len());
    let probes_big: Vec<i64> = probes.iter().copied().chain(big.iter().step_by(37).copied()).collect();
    assert_exact(&mut c, &mut conn, &keys, 1, &model, &probes_big, "spilled").await?;

    // Shrunk to UNSPILL_AT: back into the arrays, the spill set gone.
    let keep = UNSPILL_AT - 20;
    toggle_all(&mut c, 1, &big[keep..], false).await?;
    for a in &big[keep..] {
        model.remove(a);
    }
    let like = facts::layout(&mut conn, &keys).await?.metrics[0].clone();
    assert_eq!((like.spilled, like.big.len(), like.small.len()), (false, keep, 10), "back from the spill set");
    let exists: bool = redis::AsyncCommands::exists(&mut conn, keys.spill("like")).await?;
    assert!(!exists, "the emptied spill set is deleted");
    assert_exact(&mut c, &mut conn, &keys, 1, &model, &probes_big, "unspilled").await?;

    // Small ids spread over many chunks, more than the array holds: no chunk pays as a bitmap,
    // so they spill too; then back.
    let mut spread: Vec<i64> = (0..SMALL_MAX as i64 + 200).map(|i| 1_000_000 + i * 1_000_003).collect();
    spread.shuffle(&mut rng);
    toggle_all(&mut c, 1, &spread, true).await?;
    model.extend(&spread);
    let like = facts::layout(&mut conn, &keys).await?.metrics[0].clone();
    assert!(like.spilled && like.chunks.is_empty(), "spread small ids spill rather than make a bitmap each");
    assert_exact(&mut c, &mut conn, &keys, 1, &model, &spread[..40], "spread spilled").await?;
    toggle_all(&mut c, 1, &spread[10..], false).await?;
    for a in &spread[10..] {
        model.remove(a);
    }
    let like = facts::layout(&mut conn, &keys).await?.metrics[0].clone();
    assert_eq!((like.spilled, like.small.len(), like.big.len()), (false, 20, keep), "back from the spill set at {UNSPILL_AT} actors");
    assert_exact(&mut c, &mut conn, &keys, 1, &model, &spread[..40], "spread shrunk").await?;

    // The owner's likes received follow, once the events are consumed.
    m.settle(SETTLE).await?;
    let owner = c.get_user_counters(GetUserCountersRequest { user_id: OWNER, ..Default::default() }).await?.into_inner();
    assert_eq!(owner.counters.unwrap_or_default().likes_received, model.len() as u64, "likes received of the owner");
    m.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_togglers_crossing_the_thresholds_both_ways_agree_with_the_facts() -> anyhow::Result<()> {
    let m = Mesh::start(&socialgraph_testkit::redis_url()).await?;
    let keys = socialgraph_cache::keys::Keys::new(m.prefix.clone()).entity("post", 2);
    const TASKS: u64 = 8;
    const WAVES: usize = 4;
    let barrier = Arc::new(Barrier::new(TASKS as usize));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let (c, barrier, seen, keys, redis_url) =
            (m.counter.counter().await?, Arc::clone(&barrier), Arc::clone(&seen), keys.clone(), m.redis_url.clone());
        tasks.push(tokio::spawn(async move {
            // Each task owns its actors (ids of chunks 0 and 1, and big ids), so its own record
            // of answers is exact. Waves up like every own actor, waves down unlike nine in ten,
            // in random order and all tasks at once: together they cross the thresholds both
            // ways (2,400 small ids turn chunks into bitmaps, 960 big ids spill; 10 % return).
            let mut rng = StdRng::seed_from_u64(t);
            let mut own: Vec<i64> = (0..300).map(|i| 1 + (i * TASKS + t) as i64 * 20).collect();
            own.extend((0..120).map(|i| (1i64 << 50) + (i * TASKS + t) as i64 * 7_919));
            let mut liked = BTreeSet::new();
            for wave in 0..WAVES {
                let want = wave % 2 == 0;
                own.shuffle(&mut rng);
                let n = if want { own.len() } else { own.len() * 9 / 10 };
                for &actor_id in &own[..n] {
                    let mut c = c.clone();
                    let changed = if want {
                        c.like(LikeRequest { actor_id, entity: Some(post(2)), owner_id: OWNER }).await?.into_inner().changed
                    } else {
                        c.unlike(UnlikeRequest { actor_id, entity: Some(post(2)), owner_id: OWNER }).await?.into_inner().changed
                    };
                    anyhow::ensure!(changed == (liked.contains(&actor_id) != want), "changed flag of actor {actor_id}");
                    if want {
                        liked.insert(actor_id);
                    } else {
                        liked.remove(&actor_id);
                    }
                }
                // Between waves one task looks at the representation while the others wait.
                barrier.wait().await;
                if t == 0 {
                    let like = facts::layout(&mut redis_conn(&redis_url).await?, &keys).await?.metrics[0].clone();
                    seen.lock().expect("lock").push((!like.chunks.is_empty(), like.spilled));
                }
                barrier.wait().await;
            }
            anyhow::Ok(liked)
        }));
    }
    let mut model = BTreeSet::new();
    for t in tasks {
        model.extend(t.await??);
    }
    let seen = seen.lock().expect("lock").clone();
    for (wave, (chunks, spilled)) in seen.iter().enumerate() {
        if wave % 2 == 0 {
            assert!(*chunks && *spilled, "after wave {wave} up: bitmap chunks and a spill set ({seen:?})");
        } else {
            assert!(!*spilled, "after wave {wave} down: back from the spill set ({seen:?})");
        }
    }
    let mut c = m.counter.counter().await?;
    let mut conn = redis_conn(&m.redis_url).await?;
    let probes: Vec<i64> = (0..40).map(|i| 1 + i * 20).chain((0..40).map(|i| (1i64 << 50) + i * 7_919)).collect();
    assert_exact(&mut c, &mut conn, &keys, 2, &model, &probes, "after the waves").await?;
    m.settle(SETTLE).await?;
    let owner = c.get_user_counters(GetUserCountersRequest { user_id: OWNER, ..Default::default() }).await?.into_inner();
    assert_eq!(owner.counters.unwrap_or_default().likes_received, model.len() as u64, "likes received of the owner");
    m.stop().await
}
