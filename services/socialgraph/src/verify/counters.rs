//! Step 2 of a verification: every user's followings and followers against the file's degrees.
//! Also [`read_user_counters`], which the acceptance tests use to create counters ahead of a
//! verification.

use std::time::Instant;

use futures::{StreamExt, TryStreamExt};
use socialgraph_proto::counter::v1::UserCounters;
use socialgraph_proto::counter::v1::counter_service_client::CounterServiceClient;
use tonic::transport::Channel;

use super::retry::{BACKOFF, transient};
use super::{RECHECK, VerifyOptions};
use crate::endpoints::Endpoints;
use crate::error::CliResult;
use crate::graph::Adjacency;
use crate::query::user_counters;

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
                tokio::time::sleep(BACKOFF).await;
                todo.push(batch);
            }
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// Counters of `users` in batches of `opts.counter_batch`, `opts.concurrency` in flight, in
/// no particular order.
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
/// [`CliError::Connect`](crate::error::CliError::Connect);
/// [`CliError::Rpc`](crate::error::CliError::Rpc) for errors that are not transient, or still
/// transient after `opts.wait`.
pub async fn read_user_counters(endpoints: &Endpoints, users: &[i64], opts: &VerifyOptions) -> CliResult<Vec<UserCounters>> {
    let client = endpoints.counter().await?;
    read_batches(&client, users, opts, Instant::now() + opts.wait).await
}

/// One line describing how `c` differs from the file's degrees, or `None` when they agree.
fn counter_mismatch(c: &UserCounters, adj: &Adjacency) -> Option<String> {
    let (followings, followers) = adj.degrees(c.user_id);
    if (c.followings, c.followers) == (followings, followers) {
        return None;
    }
    Some(format!(
        "counters of user {}: followings {} (expected {followings}), followers {} (expected {followers})",
        c.user_id, c.followings, c.followers
    ))
}

/// Counters of every user of `users`, re-checking disagreeing users until `deadline`.
/// Returns one line per user that still disagrees.
pub(super) async fn check_counters(
    endpoints: &Endpoints,
    users: &[i64],
    adj: &Adjacency,
    opts: &VerifyOptions,
    deadline: Instant,
) -> CliResult<Vec<String>> {
    let client = endpoints.counter().await?;
    let mut pending: Vec<i64> = users.to_vec();
    loop {
        let answers = read_batches(&client, &pending, opts, deadline).await?;
        let wrong: Vec<(i64, String)> = answers.iter().filter_map(|c| counter_mismatch(c, adj).map(|line| (c.user_id, line))).collect();
        if wrong.is_empty() || Instant::now() >= deadline {
            return Ok(wrong.into_iter().map(|w| w.1).collect());
        }
        pending = wrong.into_iter().map(|w| w.0).collect();
        tokio::time::sleep(RECHECK).await;
    }
}
