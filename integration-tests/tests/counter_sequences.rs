//! Entity toggle sequences across a flushed counter Redis, and the relay's trims of an
//! outbox by them, on a Redis of the test's own.
//!
//! An owner's likes received are copies of its entities' counts, each kept with the toggle
//! sequence it reflects, newest wins. A consumer that read an entity's state just before a
//! FLUSHALL writes its copy just after it. Sequences that restarted at 1 after the flush would
//! all be older than that late copy, and the owner would keep the lost likes for good (the
//! fault catalogue's flush scenario saw likes_received 17 where the facts said 19).

use std::time::Duration;

use socialgraph_cache::counters::Scripts;
use socialgraph_cache::entities::{EntityScripts, LIKE_INDEX};
use socialgraph_cache::keys::Keys;
use socialgraph_counter::outbox::trim_published;
use socialgraph_counter::store::{EdgeCounts, EntityState, Store};
use socialgraph_integration_tests::redis_conn;
use socialgraph_testkit::process;

const OWNER: i64 = 500;
const POST: i64 = 7;

/// One like of the post by `actor` through the toggle script, as LikeRequest runs it.
async fn like(store: &Store, actor: i64) -> anyhow::Result<i64> {
    let k = store.keys.entity("post", POST);
    let mut inv = store.entity_scripts.toggle.prepare_invoke();
    inv.key(k.state()).key(k.outbox()).key(k.chunk_prefix("like")).key(k.spill("like"));
    inv.arg(LIKE_INDEX).arg(actor.to_string()).arg(actor.to_be_bytes().as_slice()).arg(1).arg(format!("{actor}|{OWNER}|1|1|0|"));
    let mut pipe = redis::pipe();
    pipe.invoke_script(&inv);
    let (changed, seq): (i64, i64) = redis::from_redis_value(store.query(&pipe).await?.remove(0))?;
    assert_eq!(changed, 1, "a new like changes the fact");
    Ok(seq)
}

async fn state(store: &Store) -> anyhow::Result<EntityState> {
    Ok(store.entity_states(&[("post".to_owned(), POST)]).await?.remove(0))
}

/// What a FLUSHALL leaves and a first read does: the owner's counters created again, empty.
async fn flush(store: &Store, url: &str) -> anyhow::Result<()> {
    let _: () = redis::cmd("FLUSHALL").query_async(&mut redis_conn(url).await?).await?;
    store.create(&[EdgeCounts { user_id: OWNER, ..Default::default() }], &[]).await?;
    Ok(())
}

async fn likes_received(store: &Store) -> anyhow::Result<u32> {
    Ok(store.read(&[OWNER]).await?.remove(0).expect("the owner's counters exist").0[3])
}

fn store_on(url: &str) -> anyhow::Result<Store> {
    let pool = socialgraph_cache::pool(url, 2, Duration::from_secs(5))?;
    Ok(Store { pool, keys: Keys::new("sq:"), scripts: Scripts::default(), entity_scripts: EntityScripts::default(), timeout: Duration::from_secs(5) })
}

/// The post's outbox from its head to `stop` (LRANGE: -1 is the tail), oldest first.
async fn outbox(store: &Store, stop: isize) -> anyhow::Result<Vec<String>> {
    let mut pipe = redis::pipe();
    pipe.lrange(store.keys.entity("post", POST).outbox(), 0, stop);
    Ok(redis::from_redis_value(store.query(&pipe).await?.remove(0))?)
}

/// What a relay does once the broker acknowledged `read`: removes it; answers the length left.
async fn trim(store: &Store, read: &[String]) -> anyhow::Result<i64> {
    let mut pipe = redis::pipe();
    trim_published(&mut pipe, &store.entity_scripts.trim, &store.keys.entity("post", POST).outbox(), read);
    Ok(redis::from_redis_value(store.query(&pipe).await?.remove(0))?)
}

#[tokio::test]
async fn a_relay_removes_from_an_outbox_only_what_it_published() -> anyhow::Result<()> {
    let redis = process::redis(0).await?;
    let url = format!("redis://127.0.0.1:{}", redis.port);
    let store = store_on(&url)?;
    for actor in 1..=3 {
        like(&store, actor).await?;
    }
    // The usual round: what was read goes, a like appended since stays.
    let read = outbox(&store, 1).await?;
    like(&store, 4).await?;
    assert_eq!(trim(&store, &read).await?, 2);
    assert_eq!(outbox(&store, -1).await?.len(), 2);

    // Relay X reads two and its produce outlives its lease; relay Y reads all, publishes and
    // trims; two more likes arrive; then X trims what it read. Nothing of Y's unpublished
    // tail may go: trimming by count would have removed both new likes.
    let x = outbox(&store, 1).await?;
    like(&store, 5).await?;
    let y = outbox(&store, -1).await?;
    assert_eq!(y.len(), 3);
    assert_eq!(trim(&store, &y).await?, 0);
    like(&store, 6).await?;
    like(&store, 7).await?;
    let unpublished = outbox(&store, -1).await?;
    assert_eq!(trim(&store, &x).await?, 2, "the late trim removed events nobody published");
    assert_eq!(outbox(&store, -1).await?, unpublished);
    // The other way round: Y read less than X and trimmed first; X's trim removes what X
    // published, one by one, and not the like after it.
    like(&store, 9).await?;
    let y = outbox(&store, 0).await?;
    let x = outbox(&store, -1).await?;
    assert_eq!((y.len(), x.len()), (1, 3));
    assert_eq!(trim(&store, &y).await?, 2);
    like(&store, 10).await?;
    let newest = outbox(&store, -1).await?.pop();
    assert_eq!(trim(&store, &x).await?, 1);
    assert_eq!(outbox(&store, -1).await?.pop(), newest);

    // A FLUSHALL between a relay's read and its trim: the likes after it stay.
    let read = outbox(&store, -1).await?;
    flush(&store, &url).await?;
    like(&store, 8).await?;
    let after = outbox(&store, -1).await?;
    assert_eq!(trim(&store, &read).await?, 1);
    assert_eq!(outbox(&store, -1).await?, after);
    // An empty read only asks the length.
    assert_eq!(trim(&store, &[]).await?, 1);
    Ok(())
}

#[tokio::test]
async fn a_state_read_before_a_flush_never_outlives_the_states_after_it() -> anyhow::Result<()> {
    let redis = process::redis(0).await?;
    let url = format!("redis://127.0.0.1:{}", redis.port);
    let store = store_on(&url)?;
    let mut seqs = Vec::new();
    for actor in 1..=3 {
        seqs.push(like(&store, actor).await?);
    }
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "sequences rise: {seqs:?}");
    let before = state(&store).await?;
    assert_eq!((before.seq, before.likes), (seqs[2], 3));

    // Flushed while a consumer holds `before`; its copy lands afterwards.
    flush(&store, &url).await?;
    store.owner_sync(&[(OWNER, vec![before.clone()])]).await?;
    assert_eq!(likes_received(&store).await?, 3, "a late copy is indistinguishable from a new one when it lands");
    // The first like after the flush is newer than anything read before it.
    let seq = like(&store, 9).await?;
    assert!(seq > before.seq, "a state created again continues above the lost one ({seq} <= {})", before.seq);
    store.owner_sync(&[(OWNER, vec![state(&store).await?])]).await?;
    assert_eq!(likes_received(&store).await?, 1, "the like after the flush replaces the late copy");

    // An entity lost with the flush and never liked again: its missing state (no likes, as of
    // now) is newer than the late copy, so a resync (the sampled check, a rebuild) repairs it.
    flush(&store, &url).await?;
    store.owner_sync(&[(OWNER, vec![before.clone()])]).await?;
    assert_eq!(likes_received(&store).await?, 3);
    let missing = state(&store).await?;
    assert!(missing.seq > before.seq && missing.likes == 0, "a missing state is empty as of now: {missing:?}");
    store.owner_sync(&[(OWNER, vec![missing.clone()])]).await?;
    assert_eq!(likes_received(&store).await?, 0);
    let seq = like(&store, 4).await?;
    assert!(seq > missing.seq, "a like after the missing state was read is newer than it");
    store.owner_sync(&[(OWNER, vec![state(&store).await?, missing])]).await?;
    assert_eq!(likes_received(&store).await?, 1, "the older missing state does not undo the like");
    Ok(())
}
