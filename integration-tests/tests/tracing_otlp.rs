//! Traces end to end: the mesh (PostgreSQL, the broker, Redis) exports its spans over OTLP/gRPC
//! to a receiver in this process. One Follow is one trace from relation-svc's RPC through the
//! relay's produce to projection-svc's apply, and from there through the follow counts it
//! writes to its own outbox to counter-svc's apply, joined by the `traceparent` record header; one Like is one trace from counter-svc's RPC through its relay to its apply.
//! Sampling is parent-based with a root ratio of 0: a caller's sampled trace is kept whole, an
//! unsampled one and a root leave no span anywhere, also not in the consumers; a batch whose
//! first record is unsampled still joins the sampled trace of a record behind it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use socialgraph_integration_tests::*;
use socialgraph_proto::counter::v1::{EntityRef, LikeRequest};
use socialgraph_proto::relation::v1::FollowRequest;

const SETTLE: Duration = Duration::from_secs(120);
/// The caller's span id in every `traceparent` this test sends.
const CALLER_SPAN: u64 = 0x00f0_67aa_0ba9_02b7;
const FOLLOW_TRACE: u128 = 0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736;
const LIKE_TRACE: u128 = 0x0af7_6519_16cd_43dd_8448_eb21_1c80_319c;
const UNSAMPLED_TRACE: u128 = 0x5b8a_a5a2_d2c8_72e8_321c_f37a_31f0_5e4d;
/// A sampled event behind an unsampled one in the same record batch.
const BEHIND_TRACE: u128 = 0x7c1e_0b2d_4a93_48f1_9e2a_6d5c_3b8f_1a07;
const UNSAMPLED_AHEAD_TRACE: u128 = 0x1d4f_8e6a_2b7c_4e19_a5d3_0c8b_7f2e_9a64;

/// An OTLP/gRPC trace receiver keeping every span it is sent.
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<Span>>>,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(&self, req: tonic::Request<ExportTraceServiceRequest>) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().expect("spans");
        for resource in req.into_inner().resource_spans {
            for scope in resource.scope_spans {
                spans.extend(scope.spans);
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

impl Receiver {
    /// Serves on a free port; returns the receiver and its endpoint URL.
    async fn start() -> anyhow::Result<(Self, String)> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let endpoint = format!("http://{}", listener.local_addr()?);
        let receiver = Self::default();
        let server = tonic::transport::Server::builder().add_service(TraceServiceServer::new(receiver.clone()));
        tokio::spawn(server.serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)));
        Ok((receiver, endpoint))
    }

    /// The spans received so far, by trace id.
    fn traces(&self) -> HashMap<u128, Vec<Span>> {
        let mut out: HashMap<u128, Vec<Span>> = HashMap::new();
        for s in self.spans.lock().expect("spans").iter() {
            out.entry(id128(&s.trace_id)).or_default().push(s.clone());
        }
        out
    }
}

fn id128(bytes: &[u8]) -> u128 {
    bytes.iter().fold(0, |acc, b| (acc << 8) | u128::from(*b))
}

/// `msg` sent as part of the caller's trace `trace` (W3C `traceparent`, sampled or not).
fn traced<T>(msg: T, trace: u128, sampled: bool) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    let header = format!("00-{trace:032x}-{CALLER_SPAN:016x}-{:02x}", u8::from(sampled));
    req.metadata_mut().insert("traceparent", header.parse().expect("ascii"));
    req
}

fn names(spans: &[Span]) -> HashSet<&str> {
    spans.iter().map(|s| s.name.as_str()).collect()
}

fn int_attribute(span: &Span, key: &str) -> Option<i64> {
    span.attributes.iter().find(|a| a.key == key).and_then(|a| match a.value.as_ref()?.value.as_ref()? {
        Value::IntValue(v) => Some(*v),
        _ => None,
    })
}

/// Every span of `spans` hangs off the caller's span or off another span of the same trace:
/// one tree, joined across the broker by the record headers.
fn assert_one_tree(spans: &[Span]) {
    let ids: HashSet<u64> = spans.iter().map(|s| id128(&s.span_id) as u64).collect();
    for s in spans {
        let parent = id128(&s.parent_span_id) as u64;
        assert!(parent == CALLER_SPAN || ids.contains(&parent), "span {} has parent {parent:016x}, outside the trace: {:?}", s.name, names(spans));
    }
}

/// Produces two follow events into partition 0 of the relation topic in one record batch: the
/// first with an unsampled `traceparent`, the second with a sampled one.
async fn produce_pair(m: &Mesh) -> anyhow::Result<()> {
    use prost::Message;
    use socialgraph_proto::events::v1::{RelationEvent, RelationEventKind};
    let client = socialgraph_testkit::kafka::connect(&m.brokers).await?;
    let pc = client.partition_client(m.topics.relation.as_str(), 0, rskafka::client::partition::UnknownTopicHandling::Retry).await?;
    let at = socialgraph_domain::timestamp_from_ms(socialgraph_domain::now_ms());
    let record = |follower: i64, trace: u128, sampled: bool| {
        let event = RelationEvent {
            event_id: format!("pair-{follower}"),
            kind: RelationEventKind::Followed as i32,
            follower_id: follower,
            followee_id: follower + 1,
            version: 1,
            occurred_at: Some(at),
            followed_at: Some(at),
            ..Default::default()
        };
        let traceparent = format!("00-{trace:032x}-{CALLER_SPAN:016x}-{:02x}", u8::from(sampled));
        rskafka::record::Record {
            key: Some(follower.to_be_bytes().to_vec()),
            value: Some(event.encode_to_vec()),
            headers: [("traceparent".to_owned(), traceparent.into_bytes())].into(),
            timestamp: rskafka::chrono::Utc::now(),
        }
    };
    let pair = vec![record(21, UNSAMPLED_AHEAD_TRACE, false), record(23, BEHIND_TRACE, true)];
    pc.produce(pair, rskafka::client::partition::Compression::Lz4).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_and_a_like_are_each_one_trace_across_the_mesh_and_sampling_holds_end_to_end() -> anyhow::Result<()> {
    let (receiver, endpoint) = Receiver::start().await?;
    let _telemetry = socialgraph_telemetry::init_for_tests_exporting(&endpoint, 0.0)?;
    let m = Mesh::start(&socialgraph_testkit::redis_url()).await?;
    let mut relation = m.relation.client().await?;
    let mut counter = m.counter.counter().await?;

    // Each write settles before the next, so no consumer batch mixes two of them.
    relation.follow(traced(FollowRequest { follower_id: 11, followee_id: 12 }, FOLLOW_TRACE, true)).await?;
    m.settle(SETTLE).await?;
    relation.follow(traced(FollowRequest { follower_id: 13, followee_id: 14 }, UNSAMPLED_TRACE, false)).await?;
    m.settle(SETTLE).await?;
    relation.follow(FollowRequest { follower_id: 15, followee_id: 16 }).await?;
    m.settle(SETTLE).await?;
    let post = EntityRef { entity_type: "post".into(), entity_id: 7 };
    counter.like(traced(LikeRequest { actor_id: 13, entity: Some(post), owner_id: 12 }, LIKE_TRACE, true)).await?;
    m.settle(SETTLE).await?;
    // One record batch, as a relay would publish it: an unsampled event, then a sampled one.
    // Each consumer applies it as one batch, which must join the sampled trace.
    produce_pair(&m).await?;
    m.settle(SETTLE).await?;

    let follow_path = ["RelationService.Follow", "relay.publish", "counter.followings", "projection.apply", "counter.edge_count"];
    let like_path = ["CounterService.Like", "counter.relay.publish", "counter.action"];
    let traces = socialgraph_testkit::eventually(Duration::from_secs(30), "both traces to arrive whole", || {
        let traces = receiver.traces();
        let whole = |trace: u128, path: &[&str]| traces.get(&trace).is_some_and(|spans| path.iter().all(|n| names(spans).contains(n)));
        let done =
            whole(FOLLOW_TRACE, &follow_path) && whole(LIKE_TRACE, &like_path) && whole(BEHIND_TRACE, &["projection.apply", "counter.edge_count"]);
        async move { Ok(done.then_some(())) }
    })
    .await;
    let got = receiver.traces();
    let seen: HashMap<String, HashSet<&str>> = got.iter().map(|(t, s)| (format!("{t:032x}"), names(s))).collect();
    traces.map_err(|e| anyhow::anyhow!("{e}; received: {seen:?}"))?;

    let follow = &got[&FOLLOW_TRACE];
    assert_one_tree(follow);
    let rpc = follow.iter().find(|s| s.name == "RelationService.Follow").expect("the RPC span");
    assert_eq!(id128(&rpc.parent_span_id) as u64, CALLER_SPAN, "the RPC is a child of the caller's span");
    assert_eq!((int_attribute(rpc, "socialgraph.follower_id"), int_attribute(rpc, "socialgraph.followee_id")), (Some(11), Some(12)));
    let like = &got[&LIKE_TRACE];
    assert_one_tree(like);
    let rpc = like.iter().find(|s| s.name == "CounterService.Like").expect("the RPC span");
    assert_eq!(int_attribute(rpc, "socialgraph.actor_id"), Some(13));
    assert_eq!(int_attribute(rpc, "socialgraph.owner_id"), Some(12));
    assert_eq!(int_attribute(rpc, "socialgraph.entity_id"), Some(7));
    // projection-svc's apply is the consumer of the pair; counter-svc's follows, from the counts
    // that apply wrote, in the same trace.
    assert_one_tree(&got[&BEHIND_TRACE]);
    for s in got[&BEHIND_TRACE].iter().filter(|s| s.name == "projection.apply") {
        assert_eq!(id128(&s.parent_span_id) as u64, CALLER_SPAN, "{} is a child of the sampled record's producer", s.name);
        let linked: Vec<u128> = s.links.iter().map(|l| id128(&l.trace_id)).collect();
        assert_eq!(linked, [UNSAMPLED_AHEAD_TRACE], "{} links the unsampled record ahead of it", s.name);
    }

    // The unsampled follow and the root follow were settled before the like was sent; after a
    // few more export rounds, nothing but the two sampled traces has arrived, from any service.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let traces: HashSet<String> = receiver.traces().keys().map(|t| format!("{t:032x}")).collect();
    let expected: HashSet<String> = [FOLLOW_TRACE, LIKE_TRACE, BEHIND_TRACE].iter().map(|t| format!("{t:032x}")).collect();
    assert_eq!(traces, expected, "spans outside the sampled traces: the unsampled follow's or a root's");
    m.stop().await
}
