//! Scale-out on PostgreSQL, the broker and Redis: two replicas each of projection-svc and
//! counter-svc own half the partitions (`consumer.partitions = {replica={ordinal,count=2}}`),
//! one replica of each is killed (its runtime shut down, nothing drained) mid-workload and
//! started again; afterwards the follower table, the counters and the like counts are exact.

use std::collections::BTreeSet;
use std::time::Duration;

use rand::{Rng, SeedableRng, rngs::StdRng};
use socialgraph_events::consumer::Assignment;
use socialgraph_integration_tests::model::{Model, Toggle, assert_model, toggle};
use socialgraph_integration_tests::*;
use socialgraph_proto::relation::v1::{FollowRequest, UnfollowRequest};

const SETTLE: Duration = Duration::from_secs(240);
const USERS: i64 = 40;
const OPS: usize = 1_200;
const TOGGLES: [Toggle; 4] = [Toggle::Like, Toggle::Like, Toggle::Unlike, Toggle::Fav];

/// The partitions of `topic` a replica's lag gauge `gauge` reports, from its `/metrics`.
async fn owned(svc: &Svc, gauge: &str, topic: &str) -> anyhow::Result<BTreeSet<i32>> {
    let text = svc.metrics().await?;
    let label = format!("topic=\"{topic}\"");
    let mut out = BTreeSet::new();
    for line in text.lines().filter(|l| l.starts_with(gauge) && l.contains(&label)) {
        let p = line.split("partition=\"").nth(1).and_then(|r| r.split('"').next()).and_then(|p| p.parse::<i32>().ok());
        out.extend(p);
    }
    Ok(out)
}

/// The partitions of the relation topic whose projection offset, stored in the database, is
/// below the high watermark (after the outbox drained, so every follow so far is in the log).
async fn partitions_behind(m: &Mesh, consumer: &str) -> anyhow::Result<Vec<i32>> {
    let kafka = socialgraph_testkit::kafka::connect(&m.brokers).await?;
    let stored = socialgraph_storage::offsets::list(&m.db.conn, consumer, &m.topics.relation).await?;
    let mut behind = Vec::new();
    for (p, hw) in socialgraph_testkit::kafka::high_watermarks(&kafka, &m.topics.relation).await? {
        let next = stored.iter().find(|o| o.partition == p).map_or(0, |o| o.next_offset);
        if next < hw {
            behind.push(p);
        }
    }
    Ok(behind)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_of_each_consumer_split_the_partitions_and_a_killed_one_resumes_exactly() -> anyhow::Result<()> {
    let mut m = Mesh::start(&socialgraph_testkit::redis_url()).await?;
    // The single consumers make way for two replicas each.
    for svc in [&mut m.counter, &mut m.projection] {
        svc.shutdown.cancel();
        (&mut svc.task).await??;
    }
    let projection_config = m.projection_config();
    let projection_config_name = projection_config.database.consumer_name.clone();
    let projection_of = move |ordinal| {
        let mut c = projection_config.clone();
        c.consumer.partitions = Assignment::Replica { ordinal, count: 2 };
        c
    };
    m.projection = spawn_projection(projection_of(0)).await?;
    let mut projection_1 = spawn_projection(projection_of(1)).await?;
    let counter_of = |m: &Mesh, ordinal| {
        let mut c = m.counter_config();
        c.consumer.partitions = Assignment::Replica { ordinal, count: 2 };
        c
    };
    m.counter = spawn_counter(counter_of(&m, 0)).await?;
    let mut counter_1 = spawn_counter(counter_of(&m, 1)).await?;

    let (mut rc, mut cc) = (m.relation.client().await?, m.counter.counter().await?);
    let mut rng = StdRng::seed_from_u64(7);
    let mut model = Model::default();
    let mut errors = Vec::new();
    for i in 0..OPS {
        if i == OPS / 3 {
            // Both replicas of ordinal 1 die at once, mid-batch as likely as not.
            projection_1.kill().await;
            counter_1.kill().await;
        }
        if i == OPS * 2 / 3 {
            // What the dead replica owns has waited: once replica 0 has applied its partitions,
            // only odd ones are behind (and some are).
            outbox_drained(&m.db, SETTLE).await?;
            let name = &projection_config_name;
            socialgraph_testkit::eventually(SETTLE, "only the dead replica's partitions to be behind", || async {
                let behind = partitions_behind(&m, name).await?;
                Ok((!behind.is_empty() && behind.iter().all(|p| p % 2 == 1)).then_some(()))
            })
            .await?;
            projection_1 = spawn_projection(projection_of(1)).await?;
            counter_1 = spawn_counter(counter_of(&m, 1)).await?;
        }
        let (a, b) = (rng.random_range(1..=USERS), rng.random_range(1..USERS));
        let b = if b >= a { b + 1 } else { b };
        let r = if rng.random_bool(0.7) {
            rc.follow(FollowRequest { follower_id: a, followee_id: b }).await.map(drop)
        } else {
            rc.unfollow(UnfollowRequest { follower_id: a, followee_id: b }).await.map(drop)
        };
        errors.extend(r.err().map(|s| s.code()));
        let (e, op) = (rng.random_range(1..=30), TOGGLES[rng.random_range(0..TOGGLES.len())]);
        let owner = 100 + e % 5;
        match toggle(&mut cc, op, a, e, owner).await {
            Ok((_, active)) => model.record(op, a, e, owner, active),
            Err(s) => errors.push(s.code()),
        }
    }
    assert!(errors.is_empty(), "the writes never touch the consumers: {errors:?}");
    // Replica 1 of projection-svc reports only its partitions: settling asks both.
    m.projection_replicas.push(projection_1);

    let started = std::time::Instant::now();
    m.assert_views_exact(&(1..=USERS).collect::<Vec<_>>(), SETTLE).await?;
    // The owners' likes and favs received, and every entity's counts, against the toggles.
    assert_model(&model, &m.db, &mut cc, &(1..=USERS).chain(100..105).collect::<Vec<_>>()).await?;
    println!(
        "{OPS} follows/unfollows + {OPS} toggles, two replicas each, ordinal 1 killed for a third: lag 0 and exact {:?} after the last write",
        started.elapsed()
    );

    // Each replica consumed its half of every topic, and only that.
    for (svc, ordinal, gauge, topics) in [
        (&m.projection, 0, "sg_projection_lag_records", vec![&m.topics.relation]),
        (&m.projection_replicas[0], 1, "sg_projection_lag_records", vec![&m.topics.relation]),
        (&m.counter, 0, "sg_counter_lag_records", vec![&m.topics.edge_count, &m.topics.counter]),
        (&counter_1, 1, "sg_counter_lag_records", vec![&m.topics.edge_count, &m.topics.counter]),
    ] {
        for topic in topics {
            let parts = owned(svc, gauge, topic).await?;
            let half: BTreeSet<i32> = (0..4).filter(|p| p % 2 == ordinal).collect();
            assert_eq!(parts, half, "{gauge} of replica {ordinal} on {topic}");
        }
    }
    counter_1.stop().await?;
    m.stop().await
}
