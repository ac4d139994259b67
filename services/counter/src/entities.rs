//! Likes and favourites: toggles on the facts (the adaptive layout of
//! [`socialgraph_cache::entities`]), entity counts, action states, rebuilds.

use std::collections::BTreeMap;
use std::sync::Arc;

use redis::Value;
use socialgraph_cache::entities::{FAV_INDEX, LIKE_INDEX, actor_args};
use socialgraph_cache::entity_layout::{HEADER_MAX, header};
use socialgraph_cache::keys::EntityKeys;
use socialgraph_domain::{MAX_BATCH, Violation, valid_entity_type, validate_user_id};
use socialgraph_proto::counter::v1 as pb;
use socialgraph_proto::events::v1::{ActionEvent, Metric};
use socialgraph_server::{ApiError, ApiResult};
use tokio::sync::Notify;

use crate::store::Store;
use crate::users::cache_error;

/// The like metric.
pub const LIKE: Metric = Metric::Like;
/// The favourite metric.
pub const FAV: Metric = Metric::Fav;

/// Name of a metric inside keys.
pub fn metric_name(m: Metric) -> &'static str {
    if m == Metric::Fav { "fav" } else { "like" }
}

pub(crate) use socialgraph_domain::now_ms;

/// The entity side of counter-svc.
pub struct Entities {
    /// Redis.
    pub store: Store,
    /// Wakes the outbox relay after a toggle wrote an event.
    pub relay_wake: Arc<Notify>,
}

/// The answer of a toggle (Like, Unlike, Fav, Unfav).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Toggled {
    /// The fact changed and one ActionEvent was emitted; false for a repeat.
    pub changed: bool,
    /// Whether the actor's metric is set on the entity after the call.
    pub active: bool,
}

/// The ActionEvent of one toggle that changed a fact, and its record headers (W3C trace
/// context of the current span, `event-type`, `schema`). `event_id` is `etype:eid:sequence`.
pub fn action_event(
    entity: &pb::EntityRef,
    actor_id: i64,
    owner_id: i64,
    metric: Metric,
    delta: i32,
    sequence: i64,
    now_ms: i64,
) -> (ActionEvent, BTreeMap<String, String>) {
    let event = ActionEvent {
        event_id: format!("{}:{}:{sequence}", entity.entity_type, entity.entity_id),
        metric: metric as i32,
        entity_type: entity.entity_type.clone(),
        entity_id: entity.entity_id,
        actor_id,
        owner_id,
        delta,
        sequence,
        occurred_at: Some(socialgraph_domain::timestamp_from_ms(now_ms)),
    };
    (event, socialgraph_events::headers::event_headers("socialgraph.events.v1.ActionEvent"))
}

/// Validates an entity reference, naming fields under `path` (e.g. `entity`, `entities[3]`),
/// which is formatted only for a violation (a batch of good entities formats no paths).
pub fn validate_entity(path: &dyn std::fmt::Display, e: Option<&pb::EntityRef>) -> Vec<Violation> {
    let Some(e) = e else {
        return vec![Violation::new(path.to_string(), "is required")];
    };
    let mut bad = Vec::new();
    if !valid_entity_type(&e.entity_type) {
        bad.push(Violation::new(format!("{path}.entity_type"), "must be 1..64 bytes of [a-z0-9_]"));
    }
    bad.extend(validate_user_id("", e.entity_id).err().map(|v| v.on(format!("{path}.entity_id"))));
    bad
}

/// [`validate_entity`] as a result.
///
/// # Errors
/// INVALID_ARGUMENT with the field violations.
pub fn validate_entity_ref(path: &str, e: &pb::EntityRef) -> ApiResult<()> {
    let bad = validate_entity(&path, Some(e));
    if bad.is_empty() { Ok(()) } else { Err(bad.into()) }
}

/// Validates a Like/Unlike/Fav/Unfav request; returns the entity.
///
/// # Errors
/// INVALID_ARGUMENT with the field violations (actor_id, entity, owner_id).
pub fn validate_toggle(actor_id: i64, entity: Option<&pb::EntityRef>, owner_id: i64) -> ApiResult<&pb::EntityRef> {
    let mut bad: Vec<Violation> = validate_user_id("actor_id", actor_id).err().into_iter().collect();
    bad.extend(validate_entity(&"entity", entity));
    if owner_id < 0 {
        bad.push(Violation::new("owner_id", "must be >= 0 (0 = unknown)"));
    }
    match entity {
        Some(e) if bad.is_empty() => Ok(e),
        _ => Err(bad.into()),
    }
}

/// Validates an entity-count read (`field` is `entity` for the unary RPC, `entities` for the
/// batch); returns the metrics wanted, in answer order (empty `metrics` = like, fav).
///
/// # Errors
/// INVALID_ARGUMENT (bad entity, unknown metric, 0 or > 1000 entities).
pub fn validate_counts(entities: &[pb::EntityRef], metrics: &[i32], field: &str) -> ApiResult<Vec<Metric>> {
    let mut bad = Vec::new();
    if field == "entities" && (entities.is_empty() || entities.len() > MAX_BATCH) {
        bad.push(Violation::new(field, format!("must hold 1..={MAX_BATCH} entities, got {}", entities.len())));
    }
    for (i, e) in entities.iter().enumerate() {
        bad.extend(if field == "entities" { validate_entity(&format_args!("entities[{i}]"), Some(e)) } else { validate_entity(&field, Some(e)) });
    }
    let wanted: Vec<Metric> =
        if metrics.is_empty() { vec![LIKE, FAV] } else { metrics.iter().map(|m| Metric::try_from(*m).unwrap_or(Metric::Unspecified)).collect() };
    for (i, m) in wanted.iter().enumerate() {
        if *m == Metric::Unspecified {
            bad.push(Violation::new(format!("metrics[{i}]"), "unknown metric: use METRIC_LIKE or METRIC_FAV"));
        } else if wanted[..i].contains(m) {
            bad.push(Violation::new(format!("metrics[{i}]"), "repeats an earlier metric"));
        }
        if bad.len() > 10 {
            break;
        }
    }
    if bad.is_empty() { Ok(wanted) } else { Err(bad.into()) }
}

/// Validates a GetActionStates request.
///
/// # Errors
/// INVALID_ARGUMENT for bad ids, type, or batch size.
pub fn validate_states(actor_id: i64, entity_type: &str, ids: &[i64]) -> ApiResult<()> {
    let mut bad: Vec<Violation> = validate_user_id("actor_id", actor_id).err().into_iter().collect();
    if !valid_entity_type(entity_type) {
        bad.push(Violation::new("entity_type", "must be 1..64 bytes of [a-z0-9_]"));
    }
    if let Err(v) = socialgraph_domain::validate_batch("entity_ids", ids) {
        bad.extend(v);
    }
    if bad.is_empty() { Ok(()) } else { Err(bad.into()) }
}

/// The answer of an entity-count read: the `wanted` metrics of each entity, in order.
pub fn entity_counts(entity: &pb::EntityRef, wanted: &[Metric], likes: u64, favs: u64) -> pb::EntityCounts {
    pb::EntityCounts {
        entity: Some(entity.clone()),
        counts: wanted.iter().map(|m| pb::MetricCount { metric: *m as i32, count: if *m == FAV { favs } else { likes } }).collect(),
    }
}

/// The five keys of an entity's read scripts: state, then chunk prefix and spill set of like
/// and of fav.
pub fn script_keys(k: &EntityKeys) -> [String; 5] {
    [k.state(), k.chunk_prefix("like"), k.spill("like"), k.chunk_prefix("fav"), k.spill("fav")]
}

fn pair(v: Value) -> ApiResult<(u64, u64)> {
    redis::from_redis_value::<(u64, u64)>(v).map_err(ApiError::internal)
}

impl Entities {
    fn keys(&self, e: &pb::EntityRef) -> EntityKeys {
        self.store.keys.entity(&e.entity_type, e.entity_id)
    }

    /// Sets (`wanted`) or clears the actor's `metric` on the entity.
    /// A change moves the entity's count and appends its ActionEvent to the entity's outbox in
    /// the same script, so the answer comes once the fact is stored, whether or not the broker
    /// is up; the relay publishes the event ([`crate::outbox`]).
    ///
    /// Inputs are validated by the caller ([`validate_toggle`]).
    ///
    /// # Errors
    /// UNAVAILABLE when Redis is down.
    pub async fn toggle(&self, actor_id: i64, entity: &pb::EntityRef, owner_id: i64, metric: Metric, wanted: bool) -> ApiResult<Toggled> {
        let k = self.keys(entity);
        let name = metric_name(metric);
        let mut inv = self.store.entity_scripts.toggle.prepare_invoke();
        inv.key(k.state()).key(k.outbox()).key(k.chunk_prefix(name)).key(k.spill(name));
        let (small, bytes) = actor_args(actor_id);
        let index = if metric == FAV { FAV_INDEX } else { LIKE_INDEX };
        let entry = crate::outbox::entry_template(actor_id, owner_id, metric, if wanted { 1 } else { -1 }, now_ms());
        inv.arg(index).arg(small).arg(bytes.as_slice()).arg(u8::from(wanted)).arg(entry);
        // Register the entity in the relay's index before the script (same round trip; on a
        // cluster, where they are different slots, the index entry completes first): a crash in
        // between leaves an index entry with an empty outbox, never an unindexed event.
        let mut pipe = redis::pipe();
        pipe.zadd(self.store.keys.pending_entities(), format!("{}:{}", entity.entity_type, entity.entity_id), now_ms()).ignore();
        pipe.invoke_script(&inv);
        let v = self.store.query_ordered(&pipe, 1).await.map_err(cache_error)?;
        let (changed, _seq) = redis::from_redis_value::<(i64, i64)>(v.into_iter().next().unwrap_or(Value::Nil)).map_err(ApiError::internal)?;
        if changed == 1 {
            self.relay_wake.notify_one();
        }
        Ok(Toggled { changed: changed == 1, active: wanted })
    }

    /// The `wanted` counts of each entity, in request order, in one round trip: a `GETRANGE`
    /// of the first [`HEADER_MAX`] bytes of each state, whose front holds the counts
    /// ([`header`]; a missing state counts 0). Redis does no script work and sends back at most
    /// 31 bytes an entity, whatever the state holds. Inputs are validated by the caller
    /// ([`validate_counts`]).
    ///
    /// # Errors
    /// UNAVAILABLE; INTERNAL for a malformed state (as the toggle and rebuild scripts find it).
    pub async fn counts(&self, entities: &[pb::EntityRef], wanted: &[Metric]) -> ApiResult<Vec<pb::EntityCounts>> {
        let mut pipe = redis::pipe();
        for e in entities {
            pipe.getrange(self.keys(e).state(), 0, HEADER_MAX as isize - 1);
        }
        let fronts = self.store.query(&pipe).await.map_err(cache_error)?;
        entities
            .iter()
            .zip(fronts)
            .map(|(e, v)| {
                let front: Vec<u8> = redis::from_redis_value(v).map_err(ApiError::internal)?;
                let (_, likes, favs) = header(&front)
                    .ok_or_else(|| ApiError::Internal(format!("malformed entity state of {}:{}", e.entity_type, e.entity_id).into()))?;
                Ok(entity_counts(e, wanted, likes, favs))
            })
            .collect()
    }

    /// Recomputes one entity's counts from its facts (admin).
    ///
    /// # Errors
    /// UNAVAILABLE.
    pub async fn rebuild(&self, entity: &pb::EntityRef) -> ApiResult<pb::EntityCounts> {
        let mut inv = self.store.entity_scripts.recount.prepare_invoke();
        for k in script_keys(&self.keys(entity)) {
            inv.key(k);
        }
        let v = self.store.query(redis::pipe().invoke_script(&inv)).await.map_err(cache_error)?;
        let (likes, favs) = pair(v.into_iter().next().unwrap_or(Value::Nil))?;
        Ok(entity_counts(entity, &[LIKE, FAV], likes, favs))
    }

    /// Whether `actor_id` liked / favourited each entity, in request order, in one round trip.
    ///
    /// # Errors
    /// INVALID_ARGUMENT for bad ids, type, or batch size; UNAVAILABLE.
    pub async fn states(&self, actor_id: i64, entity_type: &str, ids: &[i64]) -> ApiResult<Vec<pb::ActionState>> {
        let mut pipe = redis::pipe();
        let (small, bytes) = actor_args(actor_id);
        for id in ids {
            let mut inv = self.store.entity_scripts.has.prepare_invoke();
            for k in script_keys(&self.store.keys.entity(entity_type, *id)) {
                inv.key(k);
            }
            inv.arg(&small).arg(bytes.as_slice());
            pipe.invoke_script(&inv);
        }
        let v = self.store.query(&pipe).await.map_err(cache_error)?;
        ids.iter()
            .zip(v)
            .map(|(id, x)| pair(x).map(|(liked, faved)| pb::ActionState { entity_id: *id, liked: liked == 1, faved: faved == 1 }))
            .collect()
    }
}
