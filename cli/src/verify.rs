//! `verify`: compares what the mesh answers with what a file says it should, read with the
//! same rules as `load follows` ([`crate::edges`]).
//!
//! 1. Waits until projection-svc has caught up ([`wait_caught_up`]).
//! 2. Counters of every user of the file (BatchGetUserCounters, ≤ 1000 per request):
//!    followings = out-degree, followers = in-degree.
//! 3. ListFollowers, every page, of a random sample of followed users (always including the
//!    most-followed one and, when there is one, a user nobody follows) equals the file's
//!    reverse adjacency, newest first, ties by follower id descending.
//! 4. ListFamiliarFollowers of random (viewer, user) pairs equals brute force. Nine pairs in
//!    ten take the viewer as a follower of a follower of the user, so the answer is rarely
//!    empty; the tenth is uniform (usually empty).
//!
//! counter-svc exposes no consumer position over gRPC, so "counters caught up" is observed on
//! the counters themselves: a check that disagrees is repeated (every 500 ms) until it agrees
//! or the wait runs out, and only then reported. The same holds for the lists.

use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use serde::Serialize;

use crate::edges::FollowGraph;
use crate::endpoints::Endpoints;
use crate::error::{CliError, CliResult};
use crate::graph::{Adjacency, Entry};
use crate::output::rfc3339;
use crate::query::{ListQuery, Listed, projection_status, user_counters};
use crate::rng::{below, sample, seeded};
use socialgraph_proto::counter::v1::UserCounters;
use socialgraph_proto::counter::v1::counter_service_client::CounterServiceClient;
use tonic::transport::Channel;

/// Sample sizes, seed and patience of a verification.
#[derive(Debug, Clone, Copy)]
pub struct VerifyOptions {
    /// Users whose follower lists are compared.
    pub sample_users: usize,
    /// (viewer, user) pairs whose familiar followers are compared.
    pub sample_pairs: usize,
    /// Seed of the samples.
    pub seed: u64,
    /// Longest wait for the projection to catch up, and then again for disagreeing checks to
    /// agree.
    pub wait: Duration,
    /// Users per BatchGetUserCounters request, 1..=1000.
    pub counter_batch: usize,
    /// Requests in flight at once.
    pub concurrency: usize,
    /// Mismatch lines kept in the report (all are counted).
    pub max_reported: usize,
}

impl Default for VerifyOptions {
    /// 200 users, 200 pairs, seed 1, 300 s, batches of 1000, 4 in flight, 20 lines.
    fn default() -> Self {
        Self { sample_users: 200, sample_pairs: 200, seed: 1, wait: Duration::from_secs(300), counter_batch: 1000, concurrency: 4, max_reported: 20 }
    }
}

/// What a verification compared and what disagreed.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// Users whose counters were compared.
    pub users_checked: u64,
    /// Users whose counters disagree.
    pub counter_mismatches: u64,
    /// Follower lists compared.
    pub follower_lists_checked: u64,
    /// Entries of those lists, as expected.
    pub follower_entries_expected: u64,
    /// Follower lists that disagree.
    pub follower_list_mismatches: u64,
    /// (viewer, user) pairs compared.
    pub familiar_pairs_checked: u64,
    /// Of those, pairs whose expected answer is not empty.
    pub familiar_pairs_nonempty: u64,
    /// Familiar-follower entries, as expected.
    pub familiar_entries_expected: u64,
    /// Pairs whose familiar followers disagree.
    pub familiar_mismatches: u64,
    /// The first mismatches, one line each.
    pub mismatches: Vec<String>,
    /// Seconds spent waiting for the projection.
    pub waited_secs: f64,
    /// Seconds of the whole verification.
    pub elapsed_secs: f64,
}

impl Report {
    /// Mismatches of every kind.
    pub fn total_mismatches(&self) -> u64 {
        self.counter_mismatches + self.follower_list_mismatches + self.familiar_mismatches
    }
}

/// How long the projection took to catch up.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct CatchUp {
    /// Seconds waited.
    pub waited_secs: f64,
    /// Partitions projection-svc owns.
    pub partitions: usize,
    /// Records applied over all partitions (sum of next offsets).
    pub applied_records: i64,
}

/// Lag must stay 0 with no new record applied for this long to count as caught up. The
/// projection cannot see rows still waiting in relation-svc's outbox: between two relay rounds
/// it is idle and at lag 0. A round of 1,000 rows takes ~0.3 s here, one of 10,000 over a
/// second under load; this window covers both, and checks that still disagree afterwards are
/// repeated (see the module documentation), so a relay slower still costs time, not a false
/// mismatch.
const QUIET: Duration = Duration::from_secs(3);
const POLL: Duration = Duration::from_millis(100);
const RECHECK: Duration = Duration::from_millis(500);

/// Waits until every partition projection-svc owns reports lag 0 and no record was applied
/// for 3 s (GetProjectionStatus, polled every 100 ms). Events still in relation-svc's outbox
/// are invisible here: the quiet window stands in for them.
///
/// # Errors
/// [`CliError::Timeout`] after `timeout`, with the lag left; [`CliError::Connect`];
/// [`CliError::Rpc`] for non-transient errors.
pub async fn wait_caught_up(endpoints: &Endpoints, timeout: Duration) -> CliResult<CatchUp> {
    let start = Instant::now();
    let deadline = start + timeout;
    let mut stable: Option<(i64, Instant)> = None;
    loop {
        let parts = retry(deadline, || projection_status(endpoints)).await?;
        let lag: i64 = parts.iter().map(|p| p.lag).sum();
        let applied: i64 = parts.iter().map(|p| p.next_offset).sum();
        if !parts.is_empty() && lag == 0 {
            match stable {
                Some((a, since)) if a == applied => {
                    if since.elapsed() >= QUIET {
                        let waited_secs = start.elapsed().as_secs_f64();
                        return Ok(CatchUp { waited_secs, partitions: parts.len(), applied_records: applied });
                    }
                }
                _ => stable = Some((applied, Instant::now())),
            }
        } else {
            stable = None;
        }
        if Instant::now() >= deadline {
            let what = if parts.is_empty() {
                "projection-svc owns no partition yet".to_owned()
            } else {
                format!("projection-svc has {lag} records left to apply")
            };
            return Err(CliError::Timeout(format!("{what} after {:.0}s", timeout.as_secs_f64())));
        }
        tokio::time::sleep(POLL).await;
    }
}

fn transient(e: &CliError) -> bool {
    use tonic::Code::*;
    matches!(e.code(), Some(Unavailable | DeadlineExceeded | ResourceExhausted | Aborted))
}

/// Calls `f` until it succeeds, fails for good, or `deadline` passes (transient codes only).
async fn retry<T, F, Fut>(deadline: Instant, mut f: F) -> CliResult<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = CliResult<T>>,
{
    loop {
        match f().await {
            Err(e) if transient(&e) && Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(250)).await,
            other => return other,
        }
    }
}

/// The random parts of a verification: users whose follower lists are compared and
/// (viewer, user) pairs whose familiar followers are compared.
pub fn sample_checks(graph: &FollowGraph, adj: &Adjacency, opts: &VerifyOptions) -> (Vec<i64>, Vec<(i64, i64)>) {
    let mut rng = seeded(opts.seed);
    let followed = adj.followed_users();
    let mut users = sample(&mut rng, &followed, opts.sample_users);
    if let Some(top) = followed.iter().copied().max_by_key(|u| (adj.followers(*u).len(), std::cmp::Reverse(*u))) {
        match users.iter().position(|u| *u == top) {
            Some(i) => users.swap(0, i),
            None if !users.is_empty() => users[0] = top,
            None => {}
        }
    }
    if let Some(nobody) = graph.users.iter().find(|u| adj.followers(**u).is_empty())
        && users.len() > 1
    {
        users[1] = *nobody;
    }
    let mut pairs = Vec::with_capacity(opts.sample_pairs);
    for i in 0..opts.sample_pairs {
        if followed.is_empty() || graph.users.is_empty() {
            break;
        }
        let uniform = |rng: &mut _| graph.users[below(rng, graph.users.len())];
        if i % 10 == 9 {
            let viewer = uniform(&mut rng);
            pairs.push((viewer, uniform(&mut rng)));
            continue;
        }
        // A follower of a follower of the user: retry a few times for a middle account that
        // has followers of its own, else take a uniform viewer.
        let mut pick = None;
        for _ in 0..8 {
            let user = followed[below(&mut rng, followed.len())];
            let middle = adj.followers(user)[below(&mut rng, adj.followers(user).len())].0;
            let of_middle = adj.followers(middle);
            if !of_middle.is_empty() {
                pick = Some((of_middle[below(&mut rng, of_middle.len())].0, user));
                break;
            }
        }
        let (viewer, user) = match pick {
            Some(p) => p,
            None => (uniform(&mut rng), followed[below(&mut rng, followed.len())]),
        };
        pairs.push((viewer, user));
    }
    (users, pairs)
}

/// One line describing how `got` differs from `expected`, or `None` when they agree.
pub fn compare_list(what: &str, expected: &[Entry], got: &[Listed]) -> Option<String> {
    let got: Vec<Entry> = got.iter().map(|l| (l.user_id, l.followed_at_ms.unwrap_or(i64::MIN))).collect();
    if got == expected {
        return None;
    }
    let show = |e: Option<&Entry>| e.map_or_else(|| "nothing".to_owned(), |(u, t)| format!("{u} @ {}", rfc3339(*t)));
    let at = expected.iter().zip(&got).position(|(a, b)| a != b).unwrap_or(expected.len().min(got.len()));
    Some(format!(
        "{what}: expected {} entries, got {}; first difference at position {at}: expected {}, got {}",
        expected.len(),
        got.len(),
        show(expected.get(at)),
        show(got.get(at)),
    ))
}

/// Counters of `ids` in one request; a request the server cannot answer within its deadline
/// (a cold counter is rebuilt from the projection on its first read, one by one) is split in
/// halves, and transient failures are retried until `deadline`.
async fn read_counters(client: &CounterServiceClient<Channel>, ids: Vec<i64>, deadline: Instant) -> CliResult<Vec<UserCounters>> {
    let mut todo = vec![ids];
    let mut out = Vec::new();
    while let Some(batch) = todo.pop() {
        match user_counters(&mut client.clone(), &batch, batch.len()).await {
            Ok(c) => out.extend(c),
            Err(e) if e.code() == Some(tonic::Code::DeadlineExceeded) && batch.len() > 1 => {
                let (left, right) = batch.split_at(batch.len() / 2);
                todo.push(right.to_vec());
                todo.push(left.to_vec());
            }
            Err(e) if transient(&e) && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(250)).await;
                todo.push(batch);
            }
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

async fn read_batches(
    client: &CounterServiceClient<Channel>,
    users: &[i64],
    opts: &VerifyOptions,
    deadline: Instant,
) -> CliResult<Vec<UserCounters>> {
    let batch = opts.counter_batch.clamp(1, socialgraph_domain::MAX_BATCH);
    let batches: Vec<Vec<i64>> = users.chunks(batch).map(<[i64]>::to_vec).collect();
    let answers: Vec<Vec<UserCounters>> = futures::stream::iter(batches)
        .map(|ids| read_counters(client, ids, deadline))
        .buffer_unordered(opts.concurrency.max(1))
        .try_collect()
        .await?;
    Ok(answers.into_iter().flatten().collect())
}

/// The counters of every user of `users`, in no particular order: `opts.counter_batch` users
/// per request and `opts.concurrency` requests in flight; a request that runs into the
/// server's deadline is split, transient failures are retried for up to `opts.wait`. Reading
/// a missing counter makes counter-svc rebuild it from the projection, so this also creates
/// counters ahead of a verification.
///
/// # Errors
/// [`CliError::Connect`]; [`CliError::Rpc`] for errors that are not transient, or still
/// transient after `opts.wait`.
pub async fn read_user_counters(endpoints: &Endpoints, users: &[i64], opts: &VerifyOptions) -> CliResult<Vec<UserCounters>> {
    let client = endpoints.counter().await?;
    read_batches(&client, users, opts, Instant::now() + opts.wait).await
}

/// Counters of every user of `graph`, re-checking disagreeing users until `deadline`.
/// Returns one line per user that still disagrees.
async fn check_counters(endpoints: &Endpoints, users: &[i64], adj: &Adjacency, opts: &VerifyOptions, deadline: Instant) -> CliResult<Vec<String>> {
    let client = endpoints.counter().await?;
    let mut pending: Vec<i64> = users.to_vec();
    loop {
        let answers = read_batches(&client, &pending, opts, deadline).await?;
        let mut wrong = Vec::new();
        for c in answers {
            let (followings, followers) = adj.degrees(c.user_id);
            if (c.followings, c.followers) != (followings, followers) {
                let line = format!(
                    "counters of user {}: followings {} (expected {followings}), followers {} (expected {followers})",
                    c.user_id, c.followings, c.followers
                );
                wrong.push((c.user_id, line));
            }
        }
        if wrong.is_empty() || Instant::now() >= deadline {
            return Ok(wrong.into_iter().map(|w| w.1).collect());
        }
        pending = wrong.into_iter().map(|w| w.0).collect();
        tokio::time::sleep(RECHECK).await;
    }
}

/// Lists of `queries`, every page, against `expected`, re-checking disagreeing ones until
/// `deadline`. Returns one line per list that still disagrees.
async fn check_lists(endpoints: &Endpoints, checks: Vec<(ListQuery, Vec<Entry>)>, opts: &VerifyOptions, deadline: Instant) -> CliResult<Vec<String>> {
    let Some(first) = checks.first() else {
        return Ok(Vec::new());
    };
    let client = first.0.client(endpoints).await?;
    let mut pending = checks;
    loop {
        let outcomes: Vec<_> = futures::stream::iter(pending)
            .map(|(q, expected)| {
                let client = client.clone();
                async move {
                    let got = retry(deadline, || {
                        let mut c = client.clone();
                        async move { q.all(&mut c, socialgraph_domain::MAX_PAGE_SIZE as i32, String::new()).await }
                    })
                    .await?;
                    CliResult::Ok(compare_list(&describe(q), &expected, &got).map(|line| (q, expected, line)))
                }
            })
            .buffer_unordered(opts.concurrency.max(1))
            .try_collect()
            .await?;
        let wrong: Vec<_> = outcomes.into_iter().flatten().collect();
        if wrong.is_empty() || Instant::now() >= deadline {
            return Ok(wrong.into_iter().map(|w| w.2).collect());
        }
        pending = wrong.into_iter().map(|w| (w.0, w.1)).collect();
        tokio::time::sleep(RECHECK).await;
    }
}

fn describe(q: ListQuery) -> String {
    match q {
        ListQuery::Followers { user_id } => format!("followers of {user_id}"),
        ListQuery::Following { user_id } => format!("following of {user_id}"),
        ListQuery::Common { user_id, other_user_id } => format!("common following of {user_id} and {other_user_id}"),
        ListQuery::Familiar { viewer_id, user_id } => {
            format!("familiar followers of {user_id} for viewer {viewer_id}")
        }
    }
}

/// Verifies the mesh against `graph` (see the module documentation).
///
/// # Errors
/// [`CliError::Timeout`] when the projection does not catch up within `opts.wait`;
/// [`CliError::Connect`]; [`CliError::Rpc`] for errors that are not transient. Mismatches are
/// not errors: they are in the [`Report`].
pub async fn verify(endpoints: &Endpoints, graph: &FollowGraph, opts: &VerifyOptions) -> CliResult<Report> {
    let start = Instant::now();
    let caught_up = wait_caught_up(endpoints, opts.wait).await?;
    let deadline = Instant::now() + opts.wait;
    let adj = Adjacency::new(graph);
    let (users, pairs) = sample_checks(graph, &adj, opts);
    let mut report = Report { waited_secs: caught_up.waited_secs, users_checked: graph.users.len() as u64, ..Default::default() };

    let counters = check_counters(endpoints, &graph.users, &adj, opts, deadline).await?;
    report.counter_mismatches = counters.len() as u64;

    let follower_checks: Vec<_> = users.iter().map(|&u| (ListQuery::Followers { user_id: u }, adj.followers(u).to_vec())).collect();
    report.follower_lists_checked = follower_checks.len() as u64;
    report.follower_entries_expected = follower_checks.iter().map(|c| c.1.len() as u64).sum();
    let lists = check_lists(endpoints, follower_checks, opts, deadline).await?;
    report.follower_list_mismatches = lists.len() as u64;

    let familiar_checks: Vec<_> =
        pairs.iter().map(|&(viewer_id, user_id)| (ListQuery::Familiar { viewer_id, user_id }, adj.familiar(viewer_id, user_id))).collect();
    report.familiar_pairs_checked = familiar_checks.len() as u64;
    report.familiar_pairs_nonempty = familiar_checks.iter().filter(|c| !c.1.is_empty()).count() as u64;
    report.familiar_entries_expected = familiar_checks.iter().map(|c| c.1.len() as u64).sum();
    let familiar = check_lists(endpoints, familiar_checks, opts, deadline).await?;
    report.familiar_mismatches = familiar.len() as u64;

    report.mismatches = counters.into_iter().chain(lists).chain(familiar).take(opts.max_reported).collect();
    report.elapsed_secs = start.elapsed().as_secs_f64();
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::edges::{EdgeFileOptions, EdgeFormat, parse_follows};
    use crate::generator::{GenOptions, generate};

    fn generated() -> FollowGraph {
        let text: String = generate(GenOptions { users: 2000, edges: 20_000, seed: 3 }).unwrap().iter().map(|(a, b)| format!("{a}\t{b}\n")).collect();
        parse_follows(text.as_bytes(), "g", EdgeFileOptions { format: EdgeFormat::Snap, id_offset: 0 }).unwrap()
    }

    #[test]
    fn samples_are_seeded_include_the_top_user_and_mostly_nonempty_pairs() {
        let g = generated();
        let adj = Adjacency::new(&g);
        let opts = VerifyOptions::default();
        let (users, pairs) = sample_checks(&g, &adj, &opts);
        assert_eq!((users.len(), pairs.len()), (200, 200));
        assert_eq!(sample_checks(&g, &adj, &opts), (users.clone(), pairs.clone()), "same seed, same sample");
        let top = adj.followed_users().into_iter().max_by_key(|u| adj.followers(*u).len()).unwrap();
        assert_eq!(adj.followers(users[0]).len(), adj.followers(top).len(), "the most-followed user is checked");
        let nonempty = pairs.iter().filter(|(v, u)| !adj.familiar(*v, *u).is_empty()).count();
        assert!(nonempty >= 150, "most pairs have familiar followers: {nonempty} of 200");
    }

    #[test]
    fn list_differences_are_described_at_their_first_position() {
        let listed = |v: &[(i64, i64)]| v.iter().map(|&(u, t)| Listed { user_id: u, followed_at_ms: Some(t) }).collect::<Vec<_>>();
        assert_eq!(compare_list("x", &[(1, 5), (2, 4)], &listed(&[(1, 5), (2, 4)])), None);
        let d = compare_list("followers of 9", &[(1, 5), (2, 4)], &listed(&[(1, 5), (3, 4)])).unwrap();
        assert!(d.starts_with("followers of 9: expected 2 entries, got 2; first difference at position 1: expected 2 @"), "{d}");
        let d = compare_list("x", &[(1, 5)], &listed(&[])).unwrap();
        assert!(d.contains("position 0") && d.ends_with("got nothing"), "{d}");
    }
}
