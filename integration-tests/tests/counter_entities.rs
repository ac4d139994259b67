//! Likes and favourites on real data (MovieLens), a hot entity under a like/unlike storm with
//! crashes, corrupted counts and forced rebuilds, replay, sparse actor ids, and bad input.

use std::collections::{BTreeMap, HashMap};
use std::io::BufRead;
use std::time::Duration;

use futures::StreamExt;
use rand::{Rng, SeedableRng, rngs::StdRng};
use socialgraph_integration_tests::*;
use socialgraph_proto::counter::v1::counter_service_client::CounterServiceClient;
use socialgraph_proto::counter::v1::*;
use socialgraph_proto::events::v1::Metric;
use tonic::Code;
use tonic::transport::Channel;

const SETTLE: Duration = Duration::from_secs(240);

fn movie(id: i64) -> EntityRef {
    EntityRef { entity_type: "movie".into(), entity_id: id }
}

/// MovieLens ratings: (user, movie, rating × 10).
fn ratings() -> anyhow::Result<Vec<(i64, i64, u32)>> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/ml-latest-small/ratings.csv.gz");
    let file = std::fs::File::open(&path).map_err(|e| anyhow::anyhow!("{}: {e} (the shared data sets live in ../shared/data)", path.display()))?;
    let mut out = Vec::new();
    for line in std::io::BufReader::new(flate2::read::GzDecoder::new(file)).lines().skip(1) {
        let line = line?;
        let mut f = line.trim_end().split(',');
        let (u, m, r) = (f.next(), f.next(), f.next());
        if let (Some(u), Some(m), Some(r)) = (u, m, r) {
            out.push((u.parse()?, m.parse()?, (r.parse::<f64>()? * 10.0).round() as u32));
        }
    }
    Ok(out)
}

#[derive(Clone, Copy)]
enum Op {
    Like,
    Unlike,
    Fav,
}

async fn act(mut c: CounterServiceClient<Channel>, op: Op, actor: i64, entity: EntityRef, owner: i64) -> anyhow::Result<(bool, bool)> {
    let e = Some(entity);
    Ok(match op {
        Op::Like => {
            let r = c.like(LikeRequest { actor_id: actor, entity: e, owner_id: owner }).await?.into_inner();
            (r.changed, r.active)
        }
        Op::Unlike => {
            let r = c.unlike(UnlikeRequest { actor_id: actor, entity: e, owner_id: owner }).await?.into_inner();
            (r.changed, r.active)
        }
        Op::Fav => {
            let r = c.fav(FavRequest { actor_id: actor, entity: e, owner_id: owner }).await?.into_inner();
            (r.changed, r.active)
        }
    })
}

async fn run_ops(c: &CounterServiceClient<Channel>, ops: Vec<(Op, i64, i64)>, owner: impl Fn(i64) -> i64) -> anyhow::Result<()> {
    let futs = ops.into_iter().map(|(op, user, m)| act(c.clone(), op, user, movie(m), owner(m)));
    let results: Vec<anyhow::Result<(bool, bool)>> = futures::stream::iter(futs).buffer_unordered(32).collect().await;
    for r in results {
        let (changed, _) = r?;
        assert!(changed, "every toggle of the load changes a fact");
    }
    Ok(())
}

async fn counts_of(c: &mut CounterServiceClient<Channel>, movies: &[i64]) -> anyhow::Result<HashMap<i64, (u64, u64)>> {
    let mut out = HashMap::new();
    for chunk in movies.chunks(1000) {
        let req = BatchGetEntityCountsRequest {
            entities: chunk.iter().map(|m| movie(*m)).collect(),
            metrics: vec![Metric::Like as i32, Metric::Fav as i32],
        };
        for e in c.batch_get_entity_counts(req).await?.into_inner().counts {
            out.insert(e.entity.unwrap_or_default().entity_id, (e.counts[0].count, e.counts[1].count));
        }
    }
    Ok(out)
}

fn owner_of(m: i64) -> i64 {
    m % 50 + 1
}

async fn check_file_against_mesh(
    c: &mut CounterServiceClient<Channel>,
    liked: &BTreeMap<(i64, i64), bool>,
    faved: &BTreeMap<(i64, i64), bool>,
    movies: &[i64],
) -> anyhow::Result<()> {
    let mut want: HashMap<i64, (u64, u64)> = movies.iter().map(|m| (*m, (0, 0))).collect();
    for ((_, m), on) in liked {
        want.get_mut(m).expect("movie").0 += u64::from(*on);
    }
    for ((_, m), on) in faved {
        want.get_mut(m).expect("movie").1 += u64::from(*on);
    }
    assert_eq!(counts_of(c, movies).await?, want, "every movie's like and fav counts equal the file's");

    let mut rng = StdRng::seed_from_u64(5);
    let pairs: Vec<(i64, i64)> = liked.keys().copied().collect();
    for i in 0..1000 {
        let (user, m) =
            if i % 2 == 0 { pairs[rng.random_range(0..pairs.len())] } else { (rng.random_range(1..=610), movies[rng.random_range(0..movies.len())]) };
        let s = c.get_action_states(GetActionStatesRequest { actor_id: user, entity_type: "movie".into(), entity_ids: vec![m] }).await?.into_inner();
        let st = &s.states[0];
        assert_eq!(st.liked, liked.get(&(user, m)).copied().unwrap_or(false), "liked({user}, {m})");
        assert_eq!(st.faved, faved.get(&(user, m)).copied().unwrap_or(false), "faved({user}, {m})");
    }
    let mut received: HashMap<i64, (u64, u64)> = HashMap::new();
    for (m, (l, f)) in &want {
        let e = received.entry(owner_of(*m)).or_default();
        e.0 += l;
        e.1 += f;
    }
    let r = c.batch_get_user_counters(BatchGetUserCountersRequest { user_ids: (1..=50).collect(), ..Default::default() }).await?.into_inner();
    for u in r.counters {
        assert_eq!(
            (u.likes_received, u.favs_received),
            received.get(&u.user_id).copied().unwrap_or_default(),
            "likes/favs received by {}",
            u.user_id
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn movielens_likes_and_favs_match_the_file_before_and_after_unliking_half() -> anyhow::Result<()> {
    let m = Mesh::start(&socialgraph_testkit::redis_url()).await?;
    let mut c = m.counter.counter().await?;
    // The owners' counters exist before the load, so their received counts are kept.
    c.batch_get_user_counters(BatchGetUserCountersRequest { user_ids: (1..=50).collect(), ..Default::default() }).await?;
    let data = ratings()?;
    assert_eq!(data.len(), 100_836);
    let mut movies: Vec<i64> = data.iter().map(|r| r.1).collect();
    movies.sort_unstable();
    movies.dedup();
    let mut liked: BTreeMap<(i64, i64), bool> = BTreeMap::new();
    let mut faved: BTreeMap<(i64, i64), bool> = BTreeMap::new();
    let mut ops = Vec::new();
    for (u, mv, r10) in &data {
        if *r10 >= 40 {
            liked.insert((*u, *mv), true);
            ops.push((Op::Like, *u, *mv));
        }
        if *r10 == 50 {
            faved.insert((*u, *mv), true);
            ops.push((Op::Fav, *u, *mv));
        }
    }
    run_ops(&c, ops, owner_of).await?;
    m.settle(SETTLE).await?;
    check_file_against_mesh(&mut c, &liked, &faved, &movies).await?;

    // Unlike every second like, then everything must agree again.
    let half: Vec<(i64, i64)> = liked.keys().copied().step_by(2).collect();
    for k in &half {
        liked.insert(*k, false);
    }
    run_ops(&c, half.iter().map(|(u, mv)| (Op::Unlike, *u, *mv)).collect(), owner_of).await?;
    m.settle(SETTLE).await?;
    check_file_against_mesh(&mut c, &liked, &faved, &movies).await?;
    m.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hot_entity_storm_with_crashes_corrupted_counts_and_rebuilds_ends_equal_to_the_facts_and_replays_unchanged() -> anyhow::Result<()> {
    let mut m = Mesh::start(&socialgraph_testkit::redis_url()).await?;
    let hot = EntityRef { entity_type: "post".into(), entity_id: 1 };
    let addr = std::sync::Arc::new(std::sync::Mutex::new(m.counter.addr));
    let mut actors = Vec::new();
    for actor in 1..=200_i64 {
        let (addr, hot) = (addr.clone(), hot.clone());
        actors.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(actor as u64);
            let mut state = false;
            for _ in 0..15 {
                let like = rng.random_bool(0.6);
                // counter-svc is restarted once during the storm: retry through the new address.
                loop {
                    let a = *addr.lock().expect("lock");
                    let Ok(c) = CounterServiceClient::connect(format!("http://{a}")).await else {
                        // Refused while it restarts: do not spin on the cores the restart needs.
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    };
                    match act(c, if like { Op::Like } else { Op::Unlike }, actor, hot.clone(), 7).await {
                        Ok((_, active)) => {
                            state = active;
                            break;
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                    }
                }
            }
            anyhow::Ok(state)
        }));
    }
    let keys = socialgraph_cache::keys::Keys::new(m.prefix.clone()).entity("post", 1);
    let mut conn = redis_conn(&m.redis_url).await?;
    for round in 0..6 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        facts::corrupt_like_count(&mut conn, &keys, 1_000).await?;
        let mut c = m.counter.counter().await?;
        // Under the storm a rebuild may be shed as UNAVAILABLE (retryable): retry it.
        let mut rebuilt = false;
        for _ in 0..50 {
            match c.rebuild_entity_counts(admin(RebuildEntityCountsRequest { entity: Some(hot.clone()) })).await {
                Ok(_) => {
                    rebuilt = true;
                    break;
                }
                Err(e) if e.code() == Code::Unavailable => tokio::time::sleep(Duration::from_millis(50)).await,
                Err(e) => return Err(e.into()),
            }
        }
        assert!(rebuilt, "a forced rebuild went through during the storm");
        if round == 3 {
            m.counter.kill().await;
            m.counter = spawn_counter(m.counter_config()).await?;
            *addr.lock().expect("lock") = m.counter.addr;
        }
    }
    let mut liked = 0;
    for a in actors {
        liked += u64::from(a.await??);
    }
    m.settle(SETTLE).await?;
    let bitcount = facts::actors_in_facts(&mut conn, &keys, 0).await?;
    assert_eq!(bitcount, liked, "the facts hold each actor's final state");
    let mut c = m.counter.counter().await?;
    let count = |mut c: CounterServiceClient<Channel>, hot: EntityRef| async move {
        anyhow::Ok(
            c.get_entity_counts(GetEntityCountsRequest { entity: Some(hot), metrics: vec![] }).await?.into_inner().counts.unwrap_or_default().counts
                [0]
            .count,
        )
    };
    // A toggle whose publish died with the killed process is repaired from the facts once the
    // entity has been quiet for `counters.relay_quiet_ms`.
    let settled = socialgraph_testkit::eventually(Duration::from_secs(15), "the count to equal the facts", || {
        let (c, hot) = (c.clone(), hot.clone());
        async move { Ok((count(c, hot).await? == bitcount).then_some(())) }
    })
    .await;
    assert!(settled.is_ok(), "the count equals the facts ({bitcount}), got {}", count(c.clone(), hot.clone()).await?);

    // Replay from the earliest offset: no count changes.
    m.counter.shutdown.cancel();
    (&mut m.counter.task).await??;
    let _: i64 = redis::AsyncCommands::del(&mut conn, socialgraph_cache::keys::Keys::new(m.prefix.clone()).consumer_offsets("counter")).await?;
    m.counter = spawn_counter(m.counter_config()).await?;
    m.settle(SETTLE).await?;
    c = m.counter.counter().await?;
    assert_eq!(count(c.clone(), hot.clone()).await?, bitcount, "replay changes no count");
    m.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn snowflake_like_actor_ids_are_kept_whole_in_the_state_not_in_bitmap_chunks() -> anyhow::Result<()> {
    let m = Mesh::start(&socialgraph_testkit::redis_url()).await?;
    let mut c = m.counter.counter().await?;
    let e = EntityRef { entity_type: "post".into(), entity_id: 42 };
    let big = [1_i64 << 40, 1_700_000_000_000_000_001, 3];
    for a in big {
        assert!(c.like(LikeRequest { actor_id: a, entity: Some(e.clone()), owner_id: 0 }).await?.into_inner().changed);
    }
    m.settle(SETTLE).await?;
    let got = c.get_entity_counts(GetEntityCountsRequest { entity: Some(e.clone()), metrics: vec![Metric::Like as i32] }).await?.into_inner();
    assert_eq!(got.counts.unwrap_or_default().counts[0].count, 3);
    let keys = socialgraph_cache::keys::Keys::new(m.prefix.clone()).entity("post", 42);
    let mut conn = redis_conn(&m.redis_url).await?;
    let like = facts::layout(&mut conn, &keys).await?.metrics[0].clone();
    assert_eq!((like.small, like.big, like.chunks), (vec![3], vec![1 << 40, 1_700_000_000_000_000_001], vec![]), "big ids stay whole, in the state");
    let states =
        c.get_action_states(GetActionStatesRequest { actor_id: 1 << 40, entity_type: "post".into(), entity_ids: vec![42, 43] }).await?.into_inner();
    assert_eq!(states.states.iter().map(|s| s.liked).collect::<Vec<_>>(), [true, false]);
    m.stop().await
}

fn fields(status: &tonic::Status) -> Vec<String> {
    use tonic_types::StatusExt;
    status.get_error_details().bad_request().map(|b| b.field_violations.iter().map(|v| v.field.clone()).collect()).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_input_on_entity_rpcs_gets_invalid_argument_with_field_violations() -> anyhow::Result<()> {
    let m = Mesh::start(&socialgraph_testkit::redis_url()).await?;
    let mut c = m.counter.counter().await?;
    let ok = Some(movie(1));
    let e = c.like(LikeRequest { actor_id: 0, entity: ok.clone(), owner_id: 0 }).await.unwrap_err();
    assert_eq!((e.code(), fields(&e)), (Code::InvalidArgument, vec!["actor_id".to_owned()]));
    let e = c.fav(FavRequest { actor_id: 1, entity: Some(EntityRef { entity_type: String::new(), entity_id: 0 }), owner_id: -1 }).await.unwrap_err();
    assert_eq!(fields(&e), ["entity.entity_type", "entity.entity_id", "owner_id"]);
    let e = c.unlike(UnlikeRequest { actor_id: 1, entity: None, owner_id: 0 }).await.unwrap_err();
    assert_eq!(fields(&e), ["entity"]);
    let e =
        c.unfav(UnfavRequest { actor_id: 1, entity: Some(EntityRef { entity_type: "Post!".into(), entity_id: 1 }), owner_id: 0 }).await.unwrap_err();
    assert_eq!(fields(&e), ["entity.entity_type"]);
    let e = c.get_entity_counts(GetEntityCountsRequest { entity: ok.clone(), metrics: vec![0, 9] }).await.unwrap_err();
    assert_eq!((e.code(), fields(&e)), (Code::InvalidArgument, vec!["metrics[0]".to_owned(), "metrics[1]".to_owned()]));
    let e = c.batch_get_entity_counts(BatchGetEntityCountsRequest { entities: vec![movie(1); 1001], metrics: vec![] }).await.unwrap_err();
    assert_eq!(fields(&e), ["entities"]);
    let e = c.batch_get_entity_counts(BatchGetEntityCountsRequest { entities: vec![movie(1), movie(-2)], metrics: vec![] }).await.unwrap_err();
    assert_eq!(fields(&e), ["entities[1].entity_id"]);
    let e = c.get_action_states(GetActionStatesRequest { actor_id: 1, entity_type: "movie".into(), entity_ids: vec![1; 1001] }).await.unwrap_err();
    assert_eq!(fields(&e), ["entity_ids"]);
    let e = c.get_action_states(GetActionStatesRequest { actor_id: -1, entity_type: String::new(), entity_ids: vec![0] }).await.unwrap_err();
    assert_eq!(fields(&e), ["actor_id", "entity_type", "entity_ids[0]"]);
    let e = c.rebuild_entity_counts(admin(RebuildEntityCountsRequest { entity: Some(movie(0)) })).await.unwrap_err();
    assert_eq!(fields(&e), ["entity.entity_id"]);
    // Repeats are no-ops.
    assert!(c.like(LikeRequest { actor_id: 1, entity: ok.clone(), owner_id: 0 }).await?.into_inner().changed);
    let again = c.like(LikeRequest { actor_id: 1, entity: ok.clone(), owner_id: 0 }).await?.into_inner();
    assert!(!again.changed && again.active);
    m.stop().await
}
