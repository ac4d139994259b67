//! Stores for socialgraph's tables, written with sea-query builders so that one code path runs
//! on PostgreSQL, MySQL/MariaDB and SQLite. No business rules live here: callers decide what to
//! write; these functions say how.
//!
//! Every function takes any [`sea_orm::ConnectionTrait`] (a pool or an open transaction), so
//! callers choose the transaction boundaries.

pub mod accounts;
pub mod block_pairs;
pub mod cas;
pub mod counts;
pub mod edges;
pub mod feed;
pub mod feed_window;
pub mod following_counts;
pub mod leader;
pub mod messages;
pub mod mute_versions;
pub mod offsets;
pub mod outbox;
mod pg_bulk;
pub mod restrictions;
pub mod stale;
pub mod timeline;
pub mod windows;

pub use sea_orm::{DatabaseConnection, DatabaseTransaction, DbBackend, DbErr};

/// Begins a transaction that will write. On SQLite it is `BEGIN IMMEDIATE`: it takes the
/// write lock up front (waiting up to the busy timeout) instead of failing with "database is
/// locked" when a read started inside it must upgrade after another writer committed.
/// Elsewhere the server's default isolation.
///
/// # Errors
/// Database errors.
pub async fn begin_write(db: &DatabaseConnection) -> Result<DatabaseTransaction, DbErr> {
    use sea_orm::TransactionTrait;
    match db.get_database_backend() {
        DbBackend::Sqlite => {
            let options =
                sea_orm::TransactionOptions { sqlite_transaction_mode: Some(sea_orm::SqliteTransactionMode::Immediate), ..Default::default() };
            db.begin_with_options(options).await
        }
        _ => db.begin().await,
    }
}

/// Connects to `url` (`postgres://`, `mysql://`, `sqlite://`) with a pool of at most
/// `max_connections`.
///
/// # Errors
/// The driver's error when the database cannot be reached.
pub async fn connect(url: &str, max_connections: u32) -> Result<DatabaseConnection, DbErr> {
    let mut opts = sea_orm::ConnectOptions::new(url.to_owned());
    opts.max_connections(max_connections).min_connections(1).sqlx_logging(false);
    sea_orm::Database::connect(opts).await
}

/// True for errors a retry of the whole transaction can cure: a unique-key race between two
/// first follows of one edge, a deadlock, or a serialization failure / busy database.
pub fn is_retryable(err: &DbErr) -> bool {
    if matches!(err.sql_err(), Some(sea_orm::SqlErr::UniqueConstraintViolation(_))) {
        return true;
    }
    let text = err.to_string().to_ascii_lowercase();
    // "record has changed since last read": MariaDB ≥ 11.6's innodb_snapshot_isolation.
    ["deadlock", "could not serialize", "lock wait timeout", "database is locked", "busy", "record has changed since last read"]
        .iter()
        .any(|needle| text.contains(needle))
}

/// An error that ends one attempt of a transaction, saying whether a new attempt can cure it.
pub trait RetryableError {
    /// True when a retry of the whole transaction can succeed.
    fn is_retryable(&self) -> bool;
}

impl RetryableError for DbErr {
    /// [`is_retryable`].
    fn is_retryable(&self) -> bool {
        is_retryable(self)
    }
}

/// Runs `attempt`, one whole transaction (begin, body, commit; a failed attempt rolls back),
/// again after a short jittered, growing pause (2 ms, doubling, at most 100 ms) for as long as
/// it fails with an error a retry can cure ([`RetryableError`]: a lost race, a deadlock, a busy
/// database), at most `max_retries` times after the first attempt. Returns the value of the
/// first attempt that succeeds.
///
/// # Errors
/// The first error no retry can cure, or the error of the last attempt.
pub async fn retry_tx<T, E, F, Fut>(max_retries: usize, attempt: F) -> Result<T, E>
where
    E: RetryableError,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    use backon::Retryable;
    let backoff = backon::ExponentialBuilder::default()
        .with_min_delay(std::time::Duration::from_millis(2))
        .with_max_delay(std::time::Duration::from_millis(100))
        .with_jitter()
        .with_max_times(max_retries);
    attempt.retry(backoff).when(E::is_retryable).await
}

/// True for errors of the connection rather than of the statement: the pool could not give a
/// connection, or the server closed, reset or terminated it mid-request (PostgreSQL's
/// `terminating connection due to administrator command`, MySQL's "server has gone away" and
/// "lost connection", an I/O error). A retry on a new connection can succeed, so callers
/// answer UNAVAILABLE.
pub fn is_unavailable(err: &DbErr) -> bool {
    if matches!(err, DbErr::ConnectionAcquire(_) | DbErr::Conn(_)) {
        return true;
    }
    let text = err.to_string().to_ascii_lowercase();
    [
        "terminating connection",
        "connection reset",
        "connection refused",
        "connection closed",
        "broken pipe",
        "server has gone away",
        "lost connection",
        "connection was killed",
        "pool timed out",
        "pool closed",
        "error communicating with database",
        "unexpected eof",
        "io error",
        "shutdown in progress",
        "the database system is",
    ]
    .iter()
    .any(|needle| text.contains(needle))
}

/// A statement written with `?` placeholders (numbered `$1, $2, …` for PostgreSQL), so each
/// text is prepared once per connection and its values travel bound.
pub(crate) fn bound(backend: sea_orm::DbBackend, sql: &str, values: Vec<sea_orm::Value>) -> sea_orm::Statement {
    let sql = if backend == sea_orm::DbBackend::Postgres {
        let mut out = String::with_capacity(sql.len() + 8);
        for (i, part) in sql.split('?').enumerate() {
            if i > 0 {
                out.push_str(&format!("${i}"));
            }
            out.push_str(part);
        }
        out
    } else {
        sql.to_owned()
    };
    sea_orm::Statement::from_sql_and_values(backend, sql, values)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lost_connections_are_unavailable_and_statement_errors_are_not() {
        let lost =
            DbErr::Exec(sea_orm::RuntimeErr::Internal("error returned from database: terminating connection due to administrator command".into()));
        assert!(is_unavailable(&lost));
        assert!(is_unavailable(&DbErr::Conn(sea_orm::RuntimeErr::Internal("x".into()))));
        let syntax = DbErr::Exec(sea_orm::RuntimeErr::Internal("syntax error at or near \"SELEC\"".into()));
        assert!(!is_unavailable(&syntax));
        assert!(is_retryable(&DbErr::Exec(sea_orm::RuntimeErr::Internal("deadlock detected".into()))));
    }

    fn busy() -> DbErr {
        DbErr::Exec(sea_orm::RuntimeErr::Internal("database is locked".into()))
    }

    #[tokio::test]
    async fn a_transaction_is_retried_while_the_database_is_busy_and_at_most_max_retries_times() {
        let attempts = std::sync::atomic::AtomicUsize::new(0);
        let third_succeeds = retry_tx(5, || async {
            let n = attempts.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            if n < 3 { Err(busy()) } else { Ok(n) }
        });
        assert_eq!(third_succeeds.await.ok(), Some(3));

        attempts.store(0, std::sync::atomic::Ordering::Relaxed);
        let always_busy: Result<(), DbErr> = retry_tx(4, || async {
            attempts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Err(busy())
        })
        .await;
        assert!(always_busy.is_err());
        assert_eq!(attempts.load(std::sync::atomic::Ordering::Relaxed), 5, "the first attempt and 4 retries");
    }

    #[tokio::test]
    async fn an_error_no_retry_can_cure_ends_the_transaction_at_once() {
        let attempts = std::sync::atomic::AtomicUsize::new(0);
        let result: Result<(), DbErr> = retry_tx(10, || async {
            attempts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Err(DbErr::Exec(sea_orm::RuntimeErr::Internal("syntax error".into())))
        })
        .await;
        assert!(result.is_err());
        assert_eq!(attempts.load(std::sync::atomic::Ordering::Relaxed), 1);
    }
}
