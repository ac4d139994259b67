//! Timelines leave out the viewer's mutes from projection-svc's own copy, kept from
//! relation-svc's AccountEvents (kind MUTE): timelines keep working, mutes included, while
//! relation-svc is down; a copy of an older mute event at a later offset does not undo an
//! unmute; and the time from a Mute's answer to a timeline without the muted account's posts is
//! measured (the window the docs state).

use std::time::{Duration, Instant};

use rskafka::client::partition::{Compression, UnknownTopicHandling};
use socialgraph_integration_tests::feeds::*;
use socialgraph_integration_tests::*;
use socialgraph_projection::feed::FeedSettings;
use socialgraph_proto::feed::v1::GetTimelineRequest;
use socialgraph_proto::relation::v1::{MuteRequest, UnmuteRequest};
use socialgraph_testkit::{Backend, kafka};

const SETTLE: Duration = Duration::from_secs(120);
const T0: i64 = 1_700_000_000_000;

/// From now until user 1's first timeline page shows (`shown`) or hides (`!shown`) author 11,
/// read every 5 ms.
async fn until_author_11(d: &Driver, shown: bool) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let mut feed = d.mesh.feed(0).await?;
    loop {
        let (posts, _) = timeline_page(&mut feed, GetTimelineRequest { user_id: 1, page_size: 50, ..Default::default() }).await?;
        if posts.iter().any(|p| p.1 == 11) == shown {
            return Ok(started.elapsed());
        }
        anyhow::ensure!(started.elapsed() < SETTLE, "the timeline did not follow the mute within {SETTLE:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn mutes_from_the_copy(backend: Backend) -> anyhow::Result<()> {
    let mut d = Driver { mesh: FeedMesh::start(backend, &[FeedSettings::default()]).await?, model: FeedModel::default() };
    for (a, b) in [(1, 10), (1, 11), (2, 10), (2, 11)] {
        d.follow(a, b).await?;
    }
    d.mesh.settle(SETTLE).await?;
    for i in 1..=4 {
        d.post(10, 100 + i, T0 + i * 1000).await?;
        d.post(11, 200 + i, T0 + i * 1000 + 500).await?;
    }
    d.check([1, 2], "before any mute").await?;

    d.mesh.relation.client().await?.mute(MuteRequest { muter_id: 1, muted_id: 11 }).await?;
    let mute_lag = until_author_11(&d, false).await?;
    d.model.mutes.insert((1, 11));
    d.check([1, 2], "a mute filters its muter's timeline only").await?;

    // relation-svc down: the timelines, mutes included, are served from the projection alone.
    d.mesh.relation.shutdown.cancel();
    (&mut d.mesh.relation.task).await??;
    let mut feed = d.mesh.feed(0).await?;
    for u in [1, 2] {
        assert_eq!(whole_timeline(&mut feed, u, 3).await?, d.model.timeline(u), "user {u}'s timeline with relation-svc down");
    }
    d.mesh.relation = spawn_relation(relation_config(&d.mesh.db.url, &d.mesh.topic)).await?;

    d.mesh.relation.client().await?.unmute(UnmuteRequest { muter_id: 1, muted_id: 11 }).await?;
    let unmute_lag = until_author_11(&d, true).await?;
    d.model.mutes.remove(&(1, 11));
    d.check([1, 2], "an unmute brings the posts back, pushed ones included").await?;

    // The mute's event (version 1) again, after the unmute's (version 2): nothing changes.
    let client = kafka::connect(&kafka::brokers()).await?;
    let account_topic = account_topic_of(&d.mesh.topic);
    let old = kafka::read_all(&client, &account_topic).await?;
    assert!(old.len() >= 2, "the mute and the unmute were published ({} records)", old.len());
    for (p, r) in &old {
        client
            .partition_client(account_topic.as_str(), *p, UnknownTopicHandling::Retry)
            .await?
            .produce(vec![r.record.clone()], Compression::NoCompression)
            .await?;
    }
    d.check([1, 2], "after copies of the mute events at later offsets").await?;

    println!("{backend:?}: a mute reached the timeline {mute_lag:?} after its answer, an unmute {unmute_lag:?}");
    d.mesh.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn timelines_filter_mutes_from_their_own_copy_on_postgres() -> anyhow::Result<()> {
    mutes_from_the_copy(Backend::Postgres).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn timelines_filter_mutes_from_their_own_copy_on_mariadb() -> anyhow::Result<()> {
    mutes_from_the_copy(Backend::MariaDb).await
}
