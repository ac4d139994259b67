//! A database lock that elects one active outbox relay among replicas.
//!
//! PostgreSQL: `pg_try_advisory_xact_lock` inside a transaction held open by the leader
//! (advisory locks are per database, so each database has its own leader). MySQL/MariaDB:
//! `GET_LOCK` named after the current database, also held by the leader's open transaction and
//! released explicitly. SQLite: one process owns the file, so the lock is trivial. A leader that
//! crashes loses its connection, and with it the lock.

use sea_orm::{ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr, Statement, TransactionTrait};

/// Key of the relay's PostgreSQL advisory lock (ASCII "sgrelay1").
const PG_LOCK_KEY: i64 = 0x7367_7265_6c61_7931;

/// Held leadership; drop or [`LeaderLock::release`] gives it up.
pub struct LeaderLock {
    txn: Option<DatabaseTransaction>,
    backend: DbBackend,
}

impl LeaderLock {
    /// Tries once to become leader, without waiting. `Ok(None)` when another replica leads.
    ///
    /// # Errors
    /// Database errors.
    pub async fn try_acquire(db: &DatabaseConnection) -> Result<Option<Self>, DbErr> {
        let backend = db.get_database_backend();
        if backend == DbBackend::Sqlite {
            return Ok(Some(Self { txn: None, backend }));
        }
        let txn = db.begin().await?;
        let sql = match backend {
            DbBackend::Postgres => format!("SELECT pg_try_advisory_xact_lock({PG_LOCK_KEY}) AS ok"),
            _ => "SELECT GET_LOCK(CONCAT('sg_outbox_relay:', DATABASE()), 0) AS ok".to_owned(),
        };
        let row = txn.query_one_raw(Statement::from_string(backend, sql)).await?;
        let ok = match (backend, row) {
            (DbBackend::Postgres, Some(r)) => r.try_get_by_index::<bool>(0)?,
            (_, Some(r)) => r.try_get_by_index::<Option<i64>>(0)? == Some(1),
            (_, None) => false,
        };
        if ok {
            Ok(Some(Self { txn: Some(txn), backend }))
        } else {
            txn.rollback().await?;
            Ok(None)
        }
    }

    /// Checks that the connection holding the lock is alive.
    ///
    /// # Errors
    /// The database error that shows the lock is lost.
    pub async fn check(&self) -> Result<(), DbErr> {
        match &self.txn {
            Some(txn) => txn.execute_unprepared("SELECT 1").await.map(|_| ()),
            None => Ok(()),
        }
    }

    /// Gives leadership up.
    ///
    /// # Errors
    /// Database errors (the lock is released anyway when the connection closes).
    pub async fn release(mut self) -> Result<(), DbErr> {
        if let Some(txn) = self.txn.take() {
            if self.backend == DbBackend::MySql {
                txn.execute_unprepared("SELECT RELEASE_LOCK(CONCAT('sg_outbox_relay:', DATABASE()))").await?;
            }
            txn.rollback().await?;
        }
        Ok(())
    }
}
