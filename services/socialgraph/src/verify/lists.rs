//! Step 3 of a verification: the follower lists of sampled users, every page, against the
//! file's reverse adjacency; and the list comparison every list check shares.

use std::time::Instant;

use futures::{StreamExt, TryStreamExt};

use super::retry::retry;
use super::{RECHECK, Report, VerifyOptions};
use crate::endpoints::Endpoints;
use crate::error::CliResult;
use crate::graph::{Adjacency, Entry};
use crate::output::rfc3339;
use crate::query::{ListQuery, Listed};

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

/// What a mismatch line calls the list of `q`.
fn describe(q: ListQuery) -> String {
    match q {
        ListQuery::Followers { user_id } => format!("followers of {user_id}"),
        ListQuery::Following { user_id } => format!("following of {user_id}"),
        ListQuery::Common { user_id, other_user_id } => format!("common following of {user_id} and {other_user_id}"),
        ListQuery::Familiar { viewer_id, user_id } => {
            format!("familiar followers of {user_id} for viewer {viewer_id}")
        }
        ListQuery::Blocks { user_id } => format!("blocks of {user_id}"),
        ListQuery::Mutes { user_id } => format!("mutes of {user_id}"),
        ListQuery::Requests { user_id, .. } => format!("follow requests of {user_id}"),
    }
}

/// Lists of `queries`, every page, against `expected`, re-checking disagreeing ones until
/// `deadline`. Returns one line per list that still disagrees.
pub(super) async fn check_lists(
    endpoints: &Endpoints,
    checks: Vec<(ListQuery, Vec<Entry>)>,
    opts: &VerifyOptions,
    deadline: Instant,
) -> CliResult<Vec<String>> {
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

/// The follower lists of `users` against `adj`, counted into `report`. Returns one line per
/// list that still disagrees at `deadline`.
pub(super) async fn check_follower_lists(
    endpoints: &Endpoints,
    users: &[i64],
    adj: &Adjacency,
    opts: &VerifyOptions,
    deadline: Instant,
    report: &mut Report,
) -> CliResult<Vec<String>> {
    let checks: Vec<_> = users.iter().map(|&u| (ListQuery::Followers { user_id: u }, adj.followers(u).to_vec())).collect();
    report.follower_lists_checked = checks.len() as u64;
    report.follower_entries_expected = checks.iter().map(|c| c.1.len() as u64).sum();
    let mismatches = check_lists(endpoints, checks, opts, deadline).await?;
    report.follower_list_mismatches = mismatches.len() as u64;
    Ok(mismatches)
}

#[cfg(test)]
mod tests {
    use super::*;

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
