//! The transport under every RPC: responses of a few hundred entries over loopback must not
//! stall on Nagle's algorithm meeting the client's delayed ACK (about 40 ms a call), which
//! happens when an accepted socket lacks TCP_NODELAY.

use std::time::{Duration, Instant};

use socialgraph_integration_tests::{admin, relation_on};
use socialgraph_proto::relation::v1::{ImportEdge, ImportFollowsRequest, ListFollowingRequest};
use socialgraph_testkit::Backend;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_page_of_hundreds_of_entries_answers_without_a_delayed_ack_stall() -> anyhow::Result<()> {
    let (db, svc, _topic) = relation_on(Backend::Postgres, |_| {}).await?;
    let mut c = svc.client().await?;
    let edges: Vec<ImportEdge> = (0..400)
        .map(|i| ImportEdge { follower_id: 1, followee_id: 1000 + i, followed_at: Some(socialgraph_domain::timestamp_from_ms(1_000 + i)) })
        .collect();
    c.import_follows(admin(futures::stream::iter(vec![ImportFollowsRequest { edges }]))).await?;
    // Pages of 400 (many TCP segments) and of 1 (one segment) in turn: a busy machine slows
    // both alike, a stall only the large one.
    let (mut fastest_large, mut fastest_small) = (Duration::MAX, Duration::MAX);
    let mut times = Vec::new();
    for _ in 0..60 {
        let start = Instant::now();
        let page = c.list_following(ListFollowingRequest { user_id: 1, page_size: 400, page_token: String::new() }).await?.into_inner();
        let took = start.elapsed();
        assert_eq!(page.following.len(), 400);
        fastest_large = fastest_large.min(took);
        times.push(took.as_secs_f64() * 1000.0);
        let start = Instant::now();
        let page = c.list_following(ListFollowingRequest { user_id: 1, page_size: 1, page_token: String::new() }).await?.into_inner();
        assert_eq!(page.following.len(), 1);
        fastest_small = fastest_small.min(start.elapsed());
    }
    times.sort_by(f64::total_cmp);
    println!(
        "ListFollowing(400) over loopback: fastest {:.2} ms, median {:.2} ms; ListFollowing(1): fastest {:.2} ms",
        fastest_large.as_secs_f64() * 1000.0,
        times[30],
        fastest_small.as_secs_f64() * 1000.0
    );
    // A stall costs ~40 ms on every large answer; the fastest of 60 shows whether it is there.
    let extra = fastest_large.saturating_sub(fastest_small);
    assert!(
        extra < Duration::from_millis(30),
        "the fastest page of 400 took {fastest_large:?}, {extra:?} more than a page of 1: accepted sockets need TCP_NODELAY"
    );
    svc.stop().await?;
    db.drop_db().await
}
