//! Step 4 of a verification: familiar followers of sampled (viewer, user) pairs against brute
//! force over the file.

use std::time::Instant;

use super::lists::check_lists;
use super::{Report, VerifyOptions};
use crate::endpoints::Endpoints;
use crate::error::CliResult;
use crate::graph::Adjacency;
use crate::query::ListQuery;

/// The familiar followers of each (viewer, user) of `pairs` against `adj`, counted into
/// `report`. Returns one line per pair that still disagrees at `deadline`.
pub(super) async fn check_familiar(
    endpoints: &Endpoints,
    pairs: &[(i64, i64)],
    adj: &Adjacency,
    opts: &VerifyOptions,
    deadline: Instant,
    report: &mut Report,
) -> CliResult<Vec<String>> {
    let checks: Vec<_> =
        pairs.iter().map(|&(viewer_id, user_id)| (ListQuery::Familiar { viewer_id, user_id }, adj.familiar(viewer_id, user_id))).collect();
    report.familiar_pairs_checked = checks.len() as u64;
    report.familiar_pairs_nonempty = checks.iter().filter(|c| !c.1.is_empty()).count() as u64;
    report.familiar_entries_expected = checks.iter().map(|c| c.1.len() as u64).sum();
    let mismatches = check_lists(endpoints, checks, opts, deadline).await?;
    report.familiar_mismatches = mismatches.len() as u64;
    Ok(mismatches)
}
