//! Like/fav facts read straight from Redis, beside what counter-svc answers: the decoded entity
//! state, the number of actors a metric's facts hold, and a fault that corrupts a stored count.

use socialgraph_cache::entity_layout::EntityLayout;
use socialgraph_cache::keys::EntityKeys;

/// The entity's decoded state (empty when it has none).
///
/// # Errors
/// Redis failed, or the state is malformed.
pub async fn layout(conn: &mut socialgraph_cache::Conn, keys: &EntityKeys) -> anyhow::Result<EntityLayout> {
    let raw: Option<Vec<u8>> = redis::AsyncCommands::get(conn, keys.state()).await?;
    Ok(raw.map(|r| EntityLayout::decode(&r).ok_or_else(|| anyhow::anyhow!("malformed state of {}", keys.state()))).transpose()?.unwrap_or_default())
}

/// Actors whose `metric` (0 like, 1 fav) is set, counted from the facts themselves: the state's
/// arrays, BITCOUNT of its bitmap chunks and the spill set.
///
/// # Errors
/// Redis failed, or the state is malformed.
pub async fn actors_in_facts(conn: &mut socialgraph_cache::Conn, keys: &EntityKeys, metric: usize) -> anyhow::Result<u64> {
    let name = ["like", "fav"][metric];
    let m = layout(conn, keys).await?.metrics[metric].clone();
    let mut n = (m.small.len() + m.big.len()) as u64;
    for (c, _) in &m.chunks {
        n += redis::AsyncCommands::bitcount::<_, u64>(conn, keys.chunk(name, *c)).await?;
    }
    if m.spilled {
        n += redis::AsyncCommands::scard::<_, u64>(conn, keys.spill(name)).await?;
    }
    Ok(n)
}

/// Adds `by` to the entity's stored like count inside its state, atomically, leaving its facts
/// alone (what a rebuild must repair).
///
/// # Errors
/// Redis failed, or the state is missing or malformed.
pub async fn corrupt_like_count(conn: &mut socialgraph_cache::Conn, keys: &EntityKeys, by: u64) -> anyhow::Result<()> {
    let body = "local st = decode(redis.call('GET', KEYS[1])) st.m[1].count = st.m[1].count + tonumber(ARGV[1]) \
                redis.call('SET', KEYS[1], encode(st)) return 1";
    let script = redis::Script::new(&format!("{}{body}", socialgraph_cache::entities::LUA_STATE));
    let _: i64 = script.key(keys.state()).arg(by).invoke_async(conn).await?;
    Ok(())
}
