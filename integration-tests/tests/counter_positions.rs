//! counter-svc's relation consumer copies follow counts only once projection-svc has applied the
//! batch, and a batch of more than 1,000 users asks for them in several BatchGetEdgeCounts
//! calls, each its own snapshot. Here projection-svc is a stand-in whose answers are staged:
//! the first call is read before the projection stored any position of the batch's partition
//! (counts from before the batch, no offset), every later one after it applied the batch. The
//! consumer must ask again rather than copy the first call's counts (the Slashdot acceptance
//! test once lost 14 follower counts that way). Redis is real.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use prometheus::{IntCounter, IntCounterVec, Opts};
use prost::Message;
use rskafka::record::{Record, RecordAndOffset};
use socialgraph_cache::counters::field;
use socialgraph_counter::consume::{ConsumerMetrics, RelationCounter};
use socialgraph_counter::store::Store;
use socialgraph_counter::users::{CHECK_SLOTS, Counters, resting_cache};
use socialgraph_domain::timestamp_from_ms;
use socialgraph_events::consumer::BatchHandler;
use socialgraph_proto::events::v1::{RelationEvent, RelationEventKind};
use socialgraph_proto::projection::v1::projection_service_client::ProjectionServiceClient;
use socialgraph_proto::projection::v1::projection_service_server::{ProjectionService, ProjectionServiceServer};
use socialgraph_proto::projection::v1::*;
use tonic::{Request, Response, Status};

const TOPIC: &str = "sg.relation.v1";
const PARTITION: i32 = 0;
/// The follower of the batch; it follows users 2..=FOLLOWEES + 1, so the batch has 1,001 users.
const FOLLOWER: i64 = 1;
const FOLLOWEES: i64 = 1_000;

/// A projection-svc whose first BatchGetEdgeCounts answer was read before the batch was
/// applied and before any position of the partition was stored; every later answer after.
#[derive(Default)]
struct Staged {
    calls: AtomicUsize,
}

/// Counts as the projection holds them before (version 1: nobody follows anybody) or after
/// (version 2) the batch.
fn counts(user_id: i64, applied: bool) -> UserEdgeCounts {
    let (followings, followers) = match (applied, user_id == FOLLOWER) {
        (false, _) => (0, 0),
        (true, true) => (FOLLOWEES, 0),
        (true, false) => (0, 1),
    };
    UserEdgeCounts { user_id, followings, followers, version: if applied { 2 } else { 1 } }
}

#[tonic::async_trait]
impl ProjectionService for Staged {
    async fn batch_get_edge_counts(&self, req: Request<BatchGetEdgeCountsRequest>) -> Result<Response<BatchGetEdgeCountsResponse>, Status> {
        let applied = self.calls.fetch_add(1, Ordering::SeqCst) > 0;
        let offsets = if applied { vec![PartitionOffset { topic: TOPIC.into(), partition: PARTITION, next_offset: FOLLOWEES }] } else { vec![] };
        let counts = req.into_inner().user_ids.iter().map(|u| counts(*u, applied)).collect();
        Ok(Response::new(BatchGetEdgeCountsResponse { counts, offsets }))
    }

    async fn list_followers(&self, _: Request<ListFollowersRequest>) -> Result<Response<ListFollowersResponse>, Status> {
        Err(Status::unimplemented("not staged"))
    }

    async fn batch_check_followers(&self, _: Request<BatchCheckFollowersRequest>) -> Result<Response<BatchCheckFollowersResponse>, Status> {
        Err(Status::unimplemented("not staged"))
    }

    async fn count_followers(&self, _: Request<CountFollowersRequest>) -> Result<Response<CountFollowersResponse>, Status> {
        Err(Status::unimplemented("not staged"))
    }

    async fn get_edge_counts(&self, _: Request<GetEdgeCountsRequest>) -> Result<Response<GetEdgeCountsResponse>, Status> {
        Err(Status::unimplemented("not staged"))
    }

    async fn get_projection_status(&self, _: Request<GetProjectionStatusRequest>) -> Result<Response<GetProjectionStatusResponse>, Status> {
        Err(Status::unimplemented("not staged"))
    }

    async fn rebuild(&self, _: Request<RebuildRequest>) -> Result<Response<RebuildResponse>, Status> {
        Err(Status::unimplemented("not staged"))
    }
}

/// The batch: FOLLOWER follows each followee, at offsets 0..FOLLOWEES.
fn batch() -> Vec<RecordAndOffset> {
    (0..FOLLOWEES)
        .map(|i| {
            let followee_id = i + 2;
            let e = RelationEvent {
                event_id: format!("e{followee_id}"),
                kind: RelationEventKind::Followed as i32,
                follower_id: FOLLOWER,
                followee_id,
                version: 1,
                occurred_at: Some(timestamp_from_ms(1_000)),
                followed_at: Some(timestamp_from_ms(1_000)),
            };
            let record = Record {
                key: Some(FOLLOWER.to_be_bytes().to_vec()),
                value: Some(e.encode_to_vec()),
                headers: BTreeMap::new(),
                timestamp: rskafka::chrono::Utc::now(),
            };
            RecordAndOffset { record, offset: i }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_more_than_1000_users_waits_until_every_answer_reflects_it() -> anyhow::Result<()> {
    let staged = Arc::new(Staged::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tonic::transport::Server::builder()
        .add_service(ProjectionServiceServer::from_arc(Arc::clone(&staged)))
        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
    let server = tokio::spawn(server);
    let projection = ProjectionServiceClient::connect(format!("http://{addr}")).await?;

    let url = socialgraph_testkit::redis_url();
    let pool = socialgraph_cache::pool(&url, 4, Duration::from_secs(2))?;
    let store = Store {
        pool,
        keys: socialgraph_cache::keys::Keys::new(socialgraph_testkit::unique("sgpos")),
        scripts: Default::default(),
        entity_scripts: Default::default(),
        timeout: Duration::from_secs(5),
    };
    let counters = Arc::new(Counters {
        store,
        projection,
        check_interval_secs: 0,
        rebuilds: IntCounter::new("rebuilds", "test")?,
        repairs: IntCounter::new("repairs", "test")?,
        check_slots: Arc::new(tokio::sync::Semaphore::new(CHECK_SLOTS)),
        resting: resting_cache(0),
    });
    let consumer = RelationCounter {
        counters: Arc::clone(&counters),
        consumer: "counter".into(),
        metrics: ConsumerMetrics {
            applied: IntCounter::new("applied", "test")?,
            skipped: IntCounterVec::new(Opts::new("skipped", "test"), &["reason"])?,
        },
        projection_wait: Duration::from_secs(10),
    };

    consumer.apply(TOPIC, PARTITION, &batch(), FOLLOWEES).await.map_err(|e| anyhow::anyhow!("{e} (is Redis up? `make deps` starts it)"))?;

    let calls = staged.calls.load(Ordering::SeqCst);
    assert!(calls >= 4, "two calls of the first round, then a second round of both: {calls} calls");
    let users: Vec<i64> = (FOLLOWER..=FOLLOWEES + 1).collect();
    let read = counters.store.read(&users).await?;
    for (u, s) in users.iter().zip(read) {
        let s = s.unwrap_or_else(|| panic!("user {u} has no counters"));
        let want = counts(*u, true);
        let got = (i64::from(s.0[field::FOLLOWINGS]), i64::from(s.0[field::FOLLOWERS]));
        assert_eq!(got, (want.followings, want.followers), "user {u}: followings and followers after the batch");
    }
    assert_eq!(counters.store.load_offset("counter", TOPIC, PARTITION).await?, Some(FOLLOWEES), "the batch's offset is stored after its writes");
    server.abort();
    Ok(())
}
