//! The like/fav outbox and its relay. The toggle script appends each fact change to the
//! entity's outbox list (`sg:obx:{etype:eid}`) in the same atomic step as the change, and the
//! entity is indexed in `sg:pending:entities` just before. The relay publishes every indexed
//! outbox to `sg.counter.v1` in sequence order (key = `etype:eid`, so one partition per
//! entity), trims what the broker acknowledged, and drops an entity from the index once its
//! outbox is empty and it has been quiet for `quiet_ms`. While the broker is down nothing is
//! trimmed: the events wait, the toggles keep answering. A crash between the acknowledgement
//! and the trim publishes some events twice, which every consumer ignores.
//!
//! The index holds an entity from its first toggle until it has been quiet for `quiet_ms`, so
//! under load most members are entities already drained, and its order (last toggle first
//! to last) puts an entity liked without pause at the end. A round reads up to
//! [`INDEX_PER_ROUND`] members from where the last round stopped and skips each member whose
//! score is the one this relay saw when it last found its outbox empty (no toggle since, so
//! nothing to publish); it reads the outboxes of at most [`ENTITIES_PER_ROUND`] of the rest,
//! oldest toggle first, and the next round goes on after the last member it looked at until
//! the sweep reaches the end of the index and starts again. So every indexed entity is read
//! once per sweep however many others were liked meanwhile. (Reading only the 500 oldest
//! members, as the relay once did, published nothing of a post liked every 20 ms while 600
//! other entities were indexed.) A toggle whose index write keeps the score the relay saw
//! (the same millisecond, or another replica's clock) and whose append lands after the relay
//! found the outbox empty waits until that score is `quiet_ms` old on the relay's clock, when
//! the member is read again before it may leave the index.
//!
//! A round removes from an outbox only what it published ([`socialgraph_cache::outbox_scripts::TRIM`]),
//! never a count alone: a relay whose produce outlived its lease, while the next leaseholder
//! trimmed and new toggles appended, would otherwise remove events nobody published.
//!
//! One relay publishes at a time: replicas take a lease in Redis (`sg:relay:counter`), renewed
//! every round; a round whose produce outlives the lease may overlap the next leaseholder's,
//! which publishes some events twice and, with the trim above, loses none.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use prometheus::IntCounter;
use prost::Message;
use redis::Value;
use socialgraph_events::{KafkaLog, KeyedRecord};
use socialgraph_proto::counter::v1 as pb;
use socialgraph_proto::events::v1::Metric;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::entities::{action_event, now_ms};
use crate::store::{Store, parse_member};

/// Most index members read per round, from where the last round stopped.
const INDEX_PER_ROUND: usize = 10_000;
/// Most entities whose outboxes are read per round, oldest toggle first.
const ENTITIES_PER_ROUND: usize = 500;
/// Events taken from one entity's outbox per round.
const EVENTS_PER_ENTITY: isize = 200;
/// Lease of the relay (ms); renewed every round.
const LEASE_MS: u64 = 10_000;

/// The outbox entry of one toggle without its sequence (the script prepends `seq|`):
/// `actor|owner|metric|delta|time_ms|traceparent` (traceparent of the current span, W3C).
pub fn entry_template(actor_id: i64, owner_id: i64, metric: Metric, delta: i32, at_ms: i64) -> String {
    let mut headers = BTreeMap::new();
    socialgraph_telemetry::inject_headers(&tracing::Span::current(), &mut headers);
    let tp = headers.remove(socialgraph_events::headers::TRACEPARENT).unwrap_or_default();
    format!("{actor_id}|{owner_id}|{}|{delta}|{at_ms}|{tp}", metric as i32)
}

/// One parsed outbox entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The entity's toggle sequence of the change.
    pub seq: i64,
    /// Who acted.
    pub actor_id: i64,
    /// The entity's owner as given (0 = unknown).
    pub owner_id: i64,
    /// Like or fav.
    pub metric: Metric,
    /// +1 or -1.
    pub delta: i32,
    /// When the toggle happened (ms).
    pub at_ms: i64,
    /// W3C traceparent of the toggle's span ('' when none).
    pub traceparent: String,
}

/// Parses `seq|actor|owner|metric|delta|time_ms|traceparent`; `None` when malformed.
pub fn parse_entry(text: &str) -> Option<Entry> {
    let mut it = text.splitn(7, '|');
    let mut num = || it.next()?.parse::<i64>().ok();
    let (seq, actor_id, owner_id, metric, delta, at_ms) = (num()?, num()?, num()?, num()?, num()?, num()?);
    let traceparent = it.next().unwrap_or_default().to_owned();
    Some(Entry { seq, actor_id, owner_id, metric: Metric::try_from(metric as i32).ok()?, delta: delta as i32, at_ms, traceparent })
}

/// The relay of the like/fav outboxes.
pub struct Relay {
    /// Redis.
    pub store: Store,
    /// Topic of action events.
    pub topic: String,
    /// The broker (connected on first use).
    pub producer: Arc<KafkaLog>,
    /// Woken by toggles.
    pub wake: Arc<Notify>,
    /// How long an entity stays indexed after its last toggle.
    pub quiet_ms: i64,
    /// Events acknowledged by the broker.
    pub published: IntCounter,
    /// Rounds that could not publish (broker down): the events wait.
    pub failures: IntCounter,
    /// This replica's lease holder id.
    pub holder: String,
    /// Where the sweep of the index stands.
    pub sweep: Sweep,
}

/// Where a relay's sweep of the index stands. Empty at start.
#[derive(Default)]
pub struct Sweep {
    /// Where the next round reads on while the sweep has not reached the end of the index: a
    /// score and how many members of that score the sweep has looked at (ties are counted, not
    /// compared, so any number of members of one score is crossed).
    after: Option<Cursor>,
    /// Index score at which this relay last found each member's outbox empty; a member whose
    /// score is unchanged (and not yet quiet) is not read again. An entry goes when a round
    /// sees the member at another score, and after a window that held the index whole when
    /// the member was not in it; past twice [`INDEX_PER_ROUND`] entries those already quiet
    /// go, and if that is not enough the memory starts afresh.
    drained: HashMap<String, i64>,
}

/// A score of the index and how many of its members a sweep has looked at.
type Cursor = (i64, usize);

/// Takes or renews the lease; true while this replica holds it.
const LEASE: &str = r"
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end
if not cur then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end
return 0
";

/// Gives the lease up if this replica holds it.
const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
";

impl Relay {
    async fn lease(&self) -> Result<bool, socialgraph_cache::CacheError> {
        let mut pipe = redis::pipe();
        pipe.cmd("EVAL").arg(LEASE).arg(1).arg(self.store.keys.relay_lease()).arg(&self.holder).arg(LEASE_MS);
        let v = self.store.query(&pipe).await?.into_iter().next().unwrap_or(Value::Nil);
        Ok(redis::from_redis_value::<i64>(v).unwrap_or(0) == 1)
    }

    /// One round: publishes what the indexed outboxes hold; returns how many events the broker
    /// acknowledged.
    ///
    /// # Errors
    /// Redis or the broker failed (nothing was trimmed that was not acknowledged).
    pub async fn round(&mut self) -> Result<usize, Box<dyn std::error::Error + Send + Sync>> {
        let index = self.store.keys.pending_entities();
        let mut pipe = redis::pipe();
        let min = self.sweep.after.map_or_else(|| "-inf".to_owned(), |(score, _)| score.to_string());
        let skip = self.sweep.after.map_or(0, |(_, looked_at)| looked_at);
        pipe.cmd("ZRANGEBYSCORE").arg(&index).arg(min).arg("+inf").arg("WITHSCORES").arg("LIMIT").arg(skip).arg(INDEX_PER_ROUND);
        let members: Vec<(String, i64)> =
            self.store.query(&pipe).await?.into_iter().next().map(redis::from_redis_value).transpose()?.unwrap_or_default();
        let quiet_before = now_ms() - self.quiet_ms;
        let (entities, after) = self.sweep.next(members, quiet_before);
        if entities.is_empty() {
            self.sweep.after = after;
            return Ok(0);
        }
        let mut pipe = redis::pipe();
        for (_, _, (t, id)) in &entities {
            pipe.lrange(self.store.keys.entity(t, *id).outbox(), 0, EVENTS_PER_ENTITY - 1);
        }
        let outboxes: Vec<Vec<String>> = self.store.query(&pipe).await?.into_iter().map(|v| redis::from_redis_value(v).unwrap_or_default()).collect();
        let mut records = Vec::new();
        for ((_, _, (t, id)), entries) in entities.iter().zip(&outboxes) {
            let entity = pb::EntityRef { entity_type: t.clone(), entity_id: *id };
            for text in entries {
                // A malformed entry is published nowhere but still trimmed below.
                if let Some(e) = parse_entry(text) {
                    records.push(self.record(&entity, &e));
                }
            }
        }
        if !records.is_empty() {
            let producer = &self.producer;
            let n = records.len();
            let span = tracing::info_span!("relay", otel.name = "counter.relay.publish", otel.kind = "producer", messaging.batch.message_count = n);
            socialgraph_telemetry::adopt_records(&span, records.iter().map(|r| &r.headers));
            if let Some(e) = producer.produce(records).instrument(span).await.error {
                return Err(Box::new(e));
            }
            self.published.inc_by(n as u64);
        }
        // Remove what was published; drop quiet entities whose outbox is now empty, remember
        // the score of the others that are empty.
        let mut pipe = redis::pipe();
        for ((_, _, (t, id)), entries) in entities.iter().zip(&outboxes) {
            trim_published(&mut pipe, &self.store.entity_scripts.trim, &self.store.keys.entity(t, *id).outbox(), entries);
        }
        let lengths: Vec<i64> = self.store.query(&pipe).await?.into_iter().map(|v| redis::from_redis_value(v).unwrap_or(1)).collect();
        let mut pipe = redis::pipe();
        for ((member, score, _), len) in entities.into_iter().zip(lengths) {
            if len != 0 {
                continue;
            }
            if score < quiet_before {
                let mut inv = self.store.entity_scripts.unpend.prepare_invoke();
                inv.key(&index).arg(&member).arg(score);
                pipe.invoke_script(&inv).ignore();
            } else {
                self.sweep.drained.insert(member, score);
            }
        }
        self.store.query(&pipe).await?;
        self.sweep.after = after;
        Ok(outboxes.iter().map(Vec::len).sum())
    }

    fn record(&self, entity: &pb::EntityRef, e: &Entry) -> KeyedRecord {
        let (event, mut headers) = action_event(entity, e.actor_id, e.owner_id, e.metric, e.delta, e.seq, e.at_ms);
        if e.traceparent.is_empty() {
            headers.remove(socialgraph_events::headers::TRACEPARENT);
        } else {
            headers.insert(socialgraph_events::headers::TRACEPARENT.to_owned(), e.traceparent.clone());
        }
        KeyedRecord {
            topic: self.topic.clone(),
            key: format!("{}:{}", entity.entity_type, entity.entity_id).into_bytes(),
            value: event.encode_to_vec(),
            headers: headers.into_iter().map(|(k, v)| (k, v.into_bytes())).collect(),
            timestamp_ms: e.at_ms,
        }
    }

    /// Runs rounds until `cancel` fires: at once after a toggle, a round that read events or
    /// one that left its sweep under way; every 200 ms when idle; backing off up to 5 s while
    /// the broker or Redis fails. On the way out the lease is given up, so that a replica
    /// stopped gracefully (a rolling restart) hands the relay over at once instead of after the
    /// lease's 10 s.
    pub async fn run(mut self, cancel: CancellationToken) {
        let mut failures = 0u32;
        while !cancel.is_cancelled() {
            let pause = match self.lease().await {
                Ok(true) => match self.round().await {
                    Ok(n) => {
                        failures = 0;
                        if n > 0 || self.sweep.after.is_some() { Duration::ZERO } else { Duration::from_millis(200) }
                    }
                    Err(e) => {
                        failures += 1;
                        self.failures.inc();
                        tracing::debug!(error = %e, "like/fav outbox not relayed; retrying");
                        Duration::from_millis((50u64 << failures.min(7)).min(5_000))
                    }
                },
                Ok(false) => {
                    self.sweep = Sweep::default();
                    Duration::from_millis(LEASE_MS / 4)
                }
                Err(e) => {
                    tracing::debug!(error = %e, "relay lease unavailable");
                    Duration::from_secs(1)
                }
            };
            if !pause.is_zero() {
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = self.wake.notified(), if failures == 0 => {}
                    _ = cancel.cancelled() => {}
                }
            }
        }
        let mut pipe = redis::pipe();
        pipe.cmd("EVAL").arg(RELEASE).arg(1).arg(self.store.keys.relay_lease()).arg(&self.holder);
        if let Err(e) = self.store.query(&pipe).await {
            tracing::debug!(error = %e, "relay lease not given up; it expires by itself");
        }
    }
}

type Member = (String, i64, (String, i64));

impl Sweep {
    /// The members of one window of the index (ascending score, read from where the sweep
    /// stands) whose outboxes this round reads: at most [`ENTITIES_PER_ROUND`], skipping those
    /// drained at their current score unless that score is older than `quiet_before`; and
    /// where the sweep goes on after this round (past the last member looked at, or `None`,
    /// back to the start, once the window reached the end of the index). The caller stores
    /// the cursor once the round succeeded, so a failed round is read again.
    fn next(&mut self, members: Vec<(String, i64)>, quiet_before: i64) -> (Vec<Member>, Option<Cursor>) {
        let full_window = members.len() >= INDEX_PER_ROUND;
        self.prune((self.after.is_none() && !full_window).then_some(&members), quiet_before);
        let looked_at_before = |score: i64| match self.after {
            Some((s, n)) if s == score => n,
            _ => 0,
        };
        let mut at: Option<Cursor> = None;
        let mut picked = Vec::new();
        for (m, score) in members {
            if picked.len() == ENTITIES_PER_ROUND {
                // More to read than one round takes: the next round goes on from here.
                return (picked, at);
            }
            at = Some(match at {
                Some((s, n)) if s == score => (s, n + 1),
                _ => (score, looked_at_before(score) + 1),
            });
            match self.drained.get(&m) {
                Some(d) if *d == score && score >= quiet_before => continue,
                Some(_) => {
                    self.drained.remove(&m);
                }
                None => {}
            }
            if let Some(e) = parse_member(&m) {
                picked.push((m, score, e));
            }
        }
        // A full window: the index goes on past it. Otherwise the sweep starts again.
        (picked, if full_window { at } else { None })
    }

    /// Keeps the drained memory to members of `whole` (the index, when one window held it)
    /// at their current score; else bounds it.
    fn prune(&mut self, whole: Option<&Vec<(String, i64)>>, quiet_before: i64) {
        if let Some(members) = whole {
            let scores: HashMap<&str, i64> = members.iter().map(|(m, s)| (m.as_str(), *s)).collect();
            self.drained.retain(|m, s| scores.get(m.as_str()) == Some(s));
        } else if self.drained.len() > 2 * INDEX_PER_ROUND {
            self.drained.retain(|_, s| *s >= quiet_before);
            if self.drained.len() > 2 * INDEX_PER_ROUND {
                self.drained.clear();
            }
        }
    }
}

/// Adds to `pipe` the removal of `read` (the entries a relay read from the head of `outbox`,
/// oldest first) once the broker acknowledged them, answering the outbox's length after; an
/// empty `read` only asks the length. Removes nothing another relay or a FLUSHALL put in their
/// place ([`socialgraph_cache::outbox_scripts::TRIM`]).
pub fn trim_published(pipe: &mut redis::Pipeline, trim: &redis::Script, outbox: &str, read: &[String]) {
    let Some(last) = read.last() else {
        pipe.llen(outbox);
        return;
    };
    let highest = read.iter().filter_map(|t| t.split_once('|')?.0.parse::<i64>().ok()).max().unwrap_or(0);
    let mut inv = trim.prepare_invoke();
    inv.key(outbox).arg(read.len()).arg(last.as_str()).arg(highest);
    pipe.invoke_script(&inv);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An index of `n` posts scored `score(i)`, ordered as Redis orders it (score, then the
    /// member's bytes).
    fn index(n: usize, score: impl Fn(usize) -> i64) -> Vec<(String, i64)> {
        let mut index: Vec<(String, i64)> = (0..n).map(|i| (format!("post:{}", i + 1), score(i))).collect();
        index.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
        index
    }

    /// What the round's ZRANGEBYSCORE answers: from the sweep's score on, past the members of
    /// that score it looked at.
    fn window(index: &[(String, i64)], sweep: &Sweep) -> Vec<(String, i64)> {
        let (from, skip) = sweep.after.unwrap_or((i64::MIN, 0));
        index.iter().filter(|(_, s)| *s >= from).skip(skip).take(INDEX_PER_ROUND).cloned().collect()
    }

    /// One sweep from the start to the end of `index`: the members picked, round by round
    /// (a sweep that would take more than a round per 100 members fails the test).
    fn sweep_once(sweep: &mut Sweep, index: &[(String, i64)], quiet_before: i64) -> Vec<Vec<String>> {
        let mut rounds = Vec::new();
        loop {
            assert!(rounds.len() <= 10 + index.len() / 100, "the sweep does not reach the end of {} members", index.len());
            let (picked, after) = sweep.next(window(index, sweep), quiet_before);
            sweep.after = after;
            rounds.push(picked.into_iter().map(|(m, _, _)| m).collect());
            if sweep.after.is_none() {
                return rounds;
            }
        }
    }

    #[test]
    fn a_sweep_reads_every_member_once_and_reaches_the_newest_past_both_limits() {
        // Distinct scores, a few shared, and one score for all (ties of more than a window).
        let scores: [fn(usize) -> i64; 3] = [|i| 1_000 + i as i64, |i| 1_000 + (i / 7) as i64, |_| 1_000];
        for n in [1, 499, 500, 501, 1_200, INDEX_PER_ROUND + 50] {
            for score in scores {
                let index = index(n, score);
                let rounds = sweep_once(&mut Sweep::default(), &index, 0);
                assert!(rounds.iter().all(|r| r.len() <= ENTITIES_PER_ROUND));
                let all: Vec<String> = rounds.concat();
                assert_eq!(all, index.iter().map(|(m, _)| m.clone()).collect::<Vec<_>>(), "{n} members");
                assert_eq!(rounds.len(), n.div_ceil(ENTITIES_PER_ROUND).max(1), "{n} members");
            }
        }
    }

    #[test]
    fn members_drained_at_their_score_are_skipped_until_rescored_or_quiet() {
        // Past one window: the second sweep crosses a window of skipped members only.
        let n = INDEX_PER_ROUND + 200;
        let mut index = index(n, |i| 1_000 + (i / 3) as i64);
        let mut sweep = Sweep::default();
        let scores: HashMap<String, i64> = index.iter().cloned().collect();
        for m in sweep_once(&mut sweep, &index, 0).concat() {
            sweep.drained.insert(m.clone(), scores[&m]);
        }
        assert_eq!(sweep_once(&mut sweep, &index, 0).concat(), Vec::<String>::new(), "nothing toggled since the drain");
        // A post liked again moves to the end with a new score: the next sweep reads it alone.
        let hot = index.remove(10);
        index.push((hot.0.clone(), 50_000));
        assert_eq!(sweep_once(&mut sweep, &index, 0).concat(), vec![hot.0]);
        // Once their scores are quiet, every member is read again (to leave the index).
        assert_eq!(sweep_once(&mut sweep, &index, 100_000).concat().len(), n);
    }

    #[test]
    fn entries_round_trip_with_and_without_trace_context() {
        let tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let e = parse_entry(&format!("7|42|9|2|-1|1700000000000|{tp}")).unwrap();
        assert_eq!((e.seq, e.actor_id, e.owner_id, e.metric, e.delta, e.at_ms), (7, 42, 9, Metric::Fav, -1, 1_700_000_000_000));
        assert_eq!(e.traceparent, tp);
        assert_eq!(parse_entry("1|2|0|1|1|5|").unwrap().traceparent, "");
        assert_eq!(parse_entry("1|2|0|9|1|5|"), None, "unknown metric");
        assert_eq!(parse_entry("garbage"), None);
    }
}
