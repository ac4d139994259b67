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
//!
//! The steps live in submodules: [`catch_up`] (step 1), [`counters`] (step 2), [`lists`]
//! (step 3 and the list comparison shared with step 4), [`familiar`] (step 4) and
//! [`sampling`] (which users and pairs steps 3 and 4 look at).

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::edges::FollowGraph;
use crate::endpoints::Endpoints;
use crate::error::CliResult;
use crate::graph::Adjacency;

pub mod catch_up;
pub mod counters;
pub mod familiar;
pub mod lists;
mod retry;
pub mod sampling;

pub use catch_up::{CatchUp, wait_caught_up};
pub use counters::read_user_counters;
pub use lists::compare_list;
pub use sampling::sample_checks;

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

/// How long a disagreeing check waits before it is repeated.
const RECHECK: Duration = Duration::from_millis(500);

/// Verifies the mesh against `graph` (see the module documentation).
///
/// # Errors
/// [`CliError::Timeout`](crate::error::CliError::Timeout) when the projection does not catch
/// up within `opts.wait`; [`CliError::Connect`](crate::error::CliError::Connect);
/// [`CliError::Rpc`](crate::error::CliError::Rpc) for errors that are not transient.
/// Mismatches are not errors: they are in the [`Report`].
pub async fn verify(endpoints: &Endpoints, graph: &FollowGraph, opts: &VerifyOptions) -> CliResult<Report> {
    let start = Instant::now();
    let caught_up = wait_caught_up(endpoints, opts.wait).await?;
    let deadline = Instant::now() + opts.wait;
    let adj = Adjacency::new(graph);
    let (users, pairs) = sample_checks(graph, &adj, opts);
    let mut report = Report { waited_secs: caught_up.waited_secs, users_checked: graph.users.len() as u64, ..Default::default() };

    let counters = counters::check_counters(endpoints, &graph.users, &adj, opts, deadline).await?;
    report.counter_mismatches = counters.len() as u64;
    let lists = lists::check_follower_lists(endpoints, &users, &adj, opts, deadline, &mut report).await?;
    let familiar = familiar::check_familiar(endpoints, &pairs, &adj, opts, deadline, &mut report).await?;

    report.mismatches = counters.into_iter().chain(lists).chain(familiar).take(opts.max_reported).collect();
    report.elapsed_secs = start.elapsed().as_secs_f64();
    Ok(report)
}
