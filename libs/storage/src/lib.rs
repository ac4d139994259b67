//! Stores for socialgraph's tables, written with sea-query builders so that one code path runs
//! on PostgreSQL, MySQL/MariaDB and SQLite. No business rules live here: callers decide what to
//! write; these functions say how.
//!
//! Every function takes any [`sea_orm::ConnectionTrait`] (a pool or an open transaction), so
//! callers choose the transaction boundaries.

pub mod edges;
pub mod leader;
pub mod offsets;
pub mod outbox;

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
            let options = sea_orm::TransactionOptions { sqlite_transaction_mode: Some(sea_orm::SqliteTransactionMode::Immediate), ..Default::default() };
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
    ["deadlock", "could not serialize", "lock wait timeout", "database is locked", "busy"]
        .iter()
        .any(|needle| text.contains(needle))
}
