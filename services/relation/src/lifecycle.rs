//! Account lifecycle: deactivation and suspension (reversible: the account's edges are hidden
//! from every list and count, and come back unchanged), and deletion (irreversible: every edge
//! ends, then its blocks and mutes go, and the id is a fresh account).
//!
//! A status change is one small transaction on the `account` row; the edges then change in
//! the background, in batches of `limits.import_batch_size`, each batch one transaction with
//! its events (UNFOLLOWED when an edge is hidden or ended, FOLLOWED with the old `followed_at`
//! when it comes back). The job keeps no cursor: each batch takes the edges still in the state
//! it changes, so a crash (or several replicas working at once, serialized by the row lock on
//! the account) resumes where the last commit left off. `GetAccount` shows the progress.
//!
//! While an account is not active no follow to or from it is written. How a follow racing the
//! status change is closed: on PostgreSQL the follow is one statement that checks the status;
//! one whose snapshot predates the change may still commit, so a hide or delete job finishes
//! only after every transaction older than a transaction id taken after the change has ended,
//! and then looks for edges once more. On MariaDB and SQLite the follow writes the edge first
//! and reads the status last, in its transaction, and the job's locking reads wait for such
//! writes.

use std::sync::Arc;
use std::time::Duration;

use sea_orm::DatabaseTransaction;
use socialgraph_domain::{Edge, EdgeState, validate_user_id};
use socialgraph_proto::events::v1::RelationEventKind;
use socialgraph_server::{ApiError, ApiResult, db_error};
use socialgraph_storage::accounts::{self, Account, AccountJob, AccountStatus};
use socialgraph_storage::outbox;
use socialgraph_storage::restrictions::{self, Restriction};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::service::{Relations, TxError, in_tx, now_ms};

/// FAILED_PRECONDITION ACCOUNT_INACTIVE: one of the users is deactivated, suspended or being
/// deleted.
pub(crate) fn inactive_error() -> ApiError {
    ApiError::FailedPrecondition {
        reason: "ACCOUNT_INACTIVE",
        message: "one of the accounts is deactivated, suspended or being deleted".into(),
        metadata: Default::default(),
    }
}

/// The time of a status change of `old`'s account, which its event carries as the version: now,
/// but at least one above the previous change, so the versions of one account only grow.
fn next_change_ms(old: &Account) -> i64 {
    now_ms().max(old.changed_at_ms + 1)
}

/// Who asks for a status change: the account's owner (through a BFF) or an administrator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// The owner: may deactivate, reactivate a deactivation, and delete.
    Owner,
    /// An administrator: may also suspend and lift a suspension.
    Admin,
}

/// What one job step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Changed this many edges (more may follow).
    Changed(usize),
    /// Nothing to change yet: older transactions are still running.
    Waiting,
    /// The job finished (or there was none).
    Done,
}

impl Relations {
    /// The account of `user_id` (an id without a row is active with no job).
    ///
    /// # Errors
    /// INVALID_ARGUMENT for a bad id; UNAVAILABLE.
    pub async fn account(&self, user_id: i64) -> ApiResult<Account> {
        validate_user_id("user_id", user_id)?;
        Ok(accounts::get(&self.db, user_id, false).await.map_err(db_error)?.unwrap_or(Account::active(user_id)))
    }

    /// Moves `user_id` to `status` (Active, Deactivated or Suspended) and starts the edge job
    /// it needs; returns the account and whether anything changed.
    ///
    /// # Errors
    /// INVALID_ARGUMENT (bad id); UNAUTHENTICATED CREDENTIALS_MISSING (an owner, who carries
    /// no credentials, suspending or lifting a suspension); FAILED_PRECONDITION ACCOUNT_DELETING (the account is being deleted);
    /// UNAVAILABLE.
    pub async fn set_account_status(&self, user_id: i64, status: AccountStatus, caller: Caller) -> ApiResult<(Account, bool)> {
        validate_user_id("user_id", user_id)?;
        let out = in_tx!(self, txn => async {
            let old = accounts::get(&txn, user_id, true).await?.unwrap_or(Account::active(user_id));
            if old.status == AccountStatus::Deleting {
                return Err(TxError::Api(deleting_error()));
            }
            if caller == Caller::Owner && (status == AccountStatus::Suspended || old.status == AccountStatus::Suspended) {
                // The owner's path carries no credentials, and this change needs the admin's.
                return Err(TxError::Api(socialgraph_server::auth::unauthenticated(
                    socialgraph_server::auth::REASON_CREDENTIALS_MISSING,
                    "suspending an account or lifting a suspension needs the admin bearer token",
                )));
            }
            if old.status == status {
                return Ok((old, false));
            }
            let job = match (old.status, status) {
                (_, AccountStatus::Active) => AccountJob::Restore,
                (AccountStatus::Active, _) => AccountJob::Hide,
                // Deactivated ↔ suspended: the edges stay hidden; a hide in progress goes on.
                _ => old.job,
            };
            let changed_at_ms = next_change_ms(&old);
            let new = Account { status, job, edges_done: if job == old.job { old.edges_done } else { 0 }, status_xid: 0, changed_at_ms, ..old };
            accounts::put(&txn, &new).await?;
            outbox::insert(&txn, &[self.account_event_row(&new)]).await?;
            Ok((new, true))
        }
        .await);
        self.jobs_wake.notify_one();
        Ok(out)
    }

    /// Starts the deletion of `user_id`: irreversible; every edge ends in the background, then
    /// its blocks and mutes go and the id is a fresh account. Returns the account and whether
    /// the deletion is new.
    ///
    /// # Errors
    /// INVALID_ARGUMENT (bad id); UNAVAILABLE.
    pub async fn delete_account(&self, user_id: i64) -> ApiResult<(Account, bool)> {
        validate_user_id("user_id", user_id)?;
        let out = in_tx!(self, txn => async {
            let old = accounts::get(&txn, user_id, true).await?.unwrap_or(Account::active(user_id));
            if old.status == AccountStatus::Deleting {
                return Ok((old, false));
            }
            let changed_at_ms = next_change_ms(&old);
            let new = Account { status: AccountStatus::Deleting, job: AccountJob::Delete, edges_done: 0, status_xid: 0, changed_at_ms, ..old };
            accounts::put(&txn, &new).await?;
            outbox::insert(&txn, &[self.account_event_row(&new)]).await?;
            Ok::<_, TxError>((new, true))
        }
        .await);
        self.jobs_wake.notify_one();
        Ok(out)
    }

    /// One batch of `user_id`'s job.
    ///
    /// # Errors
    /// UNAVAILABLE.
    pub async fn job_step(&self, user_id: i64) -> ApiResult<Step> {
        let Some(acc) = accounts::get(&self.db, user_id, false).await.map_err(db_error)? else { return Ok(Step::Done) };
        // Hide and delete may finish only once no follow that read the account as active can
        // still commit (PostgreSQL; see the module's comment). Checked before the batch's read.
        let settled = match acc.job {
            AccountJob::Hide | AccountJob::Delete if acc.status_xid != 0 => {
                !accounts::older_transactions_running(&self.db, acc.status_xid).await.map_err(db_error)?
            }
            AccountJob::Hide | AccountJob::Delete => false,
            _ => true,
        };
        let batch = self.import_batch_size();
        let (step, written) = in_tx!(self, txn => self.job_tx(&txn, user_id, settled, batch).await.map_err(TxError::Db));
        if !written.is_empty() {
            self.relay_wake.notify_one();
            self.write_through_edges(&written).await;
        }
        Ok(step)
    }

    /// One batch of the job in `txn`: the step and the edges it wrote.
    async fn job_tx(&self, txn: &DatabaseTransaction, user_id: i64, settled: bool, batch: usize) -> Result<(Step, Vec<Edge>), sea_orm::DbErr> {
        let step = |s: Step| Ok((s, Vec::new()));
        let Some(mut acc) = accounts::get(txn, user_id, true).await? else { return step(Step::Done) };
        let (from, to, kind, peer_active): (&[EdgeState], EdgeState, RelationEventKind, bool) = match acc.job {
            AccountJob::None => return step(Step::Done),
            AccountJob::Hide => (&[EdgeState::Following], EdgeState::Hidden, RelationEventKind::Unfollowed, false),
            AccountJob::Restore => (&[EdgeState::Hidden], EdgeState::Following, RelationEventKind::Followed, true),
            AccountJob::Delete => (&[EdgeState::Following, EdgeState::Hidden], EdgeState::NotFollowing, RelationEventKind::Unfollowed, false),
        };
        let now = now_ms();
        let found = accounts::edges_of(txn, user_id, from, peer_active, batch).await?;
        if !found.is_empty() {
            let written = accounts::set_state(txn, &found, to, now).await?;
            let changes: Vec<_> = written.iter().map(|e: &Edge| (*e, kind)).collect();
            let events = self.edge_events(txn, &changes, now).await?;
            outbox::insert(txn, &events).await?;
            acc.edges_done += written.len() as i64;
            accounts::put(txn, &acc).await?;
            return Ok((Step::Changed(written.len()), written));
        }
        if acc.status_xid == 0 && matches!(acc.job, AccountJob::Hide | AccountJob::Delete) {
            // Taken after the status change committed: every transaction still running at or
            // before it must end before the job may finish.
            acc.status_xid = accounts::current_xid(txn).await?;
            if acc.status_xid != 0 {
                accounts::put(txn, &acc).await?;
                return step(Step::Waiting);
            }
        } else if !settled {
            return step(Step::Waiting);
        }
        match acc.job {
            AccountJob::Delete => {
                let mut peers = vec![user_id];
                for kind in [Restriction::Block, Restriction::Mute, Restriction::Request] {
                    peers.extend(restrictions::peers_of(txn, kind, user_id).await?);
                }
                // The stale drain deletes the summaries of everyone the account restricted or
                // was restricted by.
                self.restrictions_changed(txn, &peers).await?;
                // Every pair the account blocks or is blocked in is unblocked, with its event.
                let mut events = Vec::new();
                for (low, high) in socialgraph_storage::block_pairs::blocked_of(txn, user_id).await? {
                    events.extend(self.block_changed(txn, (low, high), false, now).await?);
                }
                // And every mute of or at it, with its event.
                for key in socialgraph_storage::mute_versions::muted_of(txn, user_id).await? {
                    events.push(self.mute_changed(txn, key, false, now).await?);
                }
                outbox::insert(txn, &events).await?;
                restrictions::delete_all_of(txn, Restriction::Block, user_id).await?;
                restrictions::delete_all_of(txn, Restriction::Mute, user_id).await?;
                restrictions::delete_all_of(txn, Restriction::Request, user_id).await?;
                accounts::clear_block_flags(txn, user_id).await?;
                accounts::delete(txn, user_id).await?;
            }
            _ => accounts::put(txn, &Account { job: AccountJob::None, ..acc }).await?,
        }
        step(Step::Done)
    }
}

fn deleting_error() -> ApiError {
    ApiError::FailedPrecondition { reason: "ACCOUNT_DELETING", message: "the account is being deleted".into(), metadata: Default::default() }
}

/// Refuses (FAILED_PRECONDITION ACCOUNT_DELETING) a new block or mute when either user's account
/// is being deleted: the deletion's last step unblocks and unmutes every pair the account is
/// in, and one written after that step read them would outlive the account, with no event to
/// undo it. Read last in the writer's transaction, after its writes, as for follows (see the
/// module's comment): on PostgreSQL the deletion finishes only after every older transaction
/// ended, and on MariaDB its locking reads wait for the writer's rows.
///
/// # Errors
/// ACCOUNT_DELETING; database errors.
pub(crate) async fn refuse_deleting(txn: &DatabaseTransaction, users: &[i64]) -> Result<(), TxError> {
    for user_id in users {
        if accounts::get(txn, *user_id, false).await?.is_some_and(|a| a.status == AccountStatus::Deleting) {
            return Err(TxError::Api(deleting_error()));
        }
    }
    Ok(())
}

/// Runs every account's job until `cancel`: batches back to back while there is work, a poll
/// every `idle` (or on `wake`) otherwise. Errors are logged and retried on the next round.
pub async fn run_jobs(relations: Arc<Relations>, wake: Arc<Notify>, idle: Duration, cancel: CancellationToken) {
    loop {
        let mut busy = false;
        match accounts::with_jobs(&relations.db).await {
            Ok(users) => {
                for user in users {
                    match relations.job_step(user).await {
                        Ok(Step::Changed(_)) => busy = true,
                        Ok(Step::Waiting | Step::Done) => {}
                        Err(e) => tracing::warn!(user, error = %e, "account job step failed; retrying"),
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "reading account jobs failed; retrying"),
        }
        if busy {
            if cancel.is_cancelled() {
                return;
            }
            continue;
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = wake.notified() => {}
            () = tokio::time::sleep(idle) => {}
        }
    }
}
