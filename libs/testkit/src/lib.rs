//! Test helpers for socialgraph's integration tests. Every test gets its own database, topic
//! names and Redis key prefix, so tests run in parallel; tests that destroy shared state (kill
//! Redis or the broker) start private instances on free ports.
//!
//! Services come from `make deps`; a missing one fails the test with how to start it.
//! Overrides: `SG_TEST_POSTGRES_URL`, `SG_TEST_MYSQL_URL`, `SG_TEST_KAFKA`, `SG_TEST_REDIS_URL`.

pub mod kafka;
pub mod process;

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use sea_orm::{ConnectionTrait, DatabaseConnection};
use sea_orm_migration::MigratorTrait;

/// A name unique to this run: `prefix` + 12 hex digits.
pub fn unique(prefix: &str) -> String {
    let id = uuid::Uuid::now_v7().simple().to_string();
    format!("{prefix}{}", &id[id.len() - 12..])
}

/// Which SQL backend a test database uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// PostgreSQL on 127.0.0.1:5432.
    Postgres,
    /// MariaDB/MySQL on 127.0.0.1:3306.
    MariaDb,
    /// A SQLite file in the system temp dir.
    Sqlite,
}

fn server_url(backend: Backend) -> String {
    match backend {
        Backend::Postgres => std::env::var("SG_TEST_POSTGRES_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into()),
        Backend::MariaDb => std::env::var("SG_TEST_MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".into()),
        Backend::Sqlite => String::new(),
    }
}

/// A fresh, migrated database that [`TestDb::drop_db`] removes.
pub struct TestDb {
    /// Connection URL of the database.
    pub url: String,
    /// An open pool on it.
    pub conn: DatabaseConnection,
    backend: Backend,
    name: String,
}

impl TestDb {
    /// Creates and migrates a uniquely named database.
    ///
    /// # Errors
    /// The server is not running (the message says how to start it) or migrations failed.
    pub async fn create(backend: Backend) -> anyhow::Result<Self> {
        let name = unique("sg_test_");
        let url = match backend {
            Backend::Sqlite => {
                let path = std::env::temp_dir().join(format!("{name}.db"));
                format!("sqlite://{}?mode=rwc", path.display())
            }
            _ => {
                let server = server_url(backend);
                let admin_url = match backend {
                    Backend::Postgres => format!("{server}/postgres"),
                    _ => format!("{server}/mysql"),
                };
                let admin = sea_orm::Database::connect(&admin_url)
                    .await
                    .with_context(|| format!("{backend:?} is not reachable at {server}: run `make deps` to install and start it"))?;
                admin.execute_unprepared(&format!("CREATE DATABASE {name}")).await?;
                if backend == Backend::Postgres {
                    // Test databases need no durability across a crash of the server; commits
                    // without an fsync each keep the suite within CI's time on 2 cores.
                    admin.execute_unprepared(&format!("ALTER DATABASE {name} SET synchronous_commit = off")).await?;
                }
                admin.close().await.ok();
                format!("{server}/{name}")
            }
        };
        let mut opts = sea_orm::ConnectOptions::new(url.clone());
        opts.max_connections(4).sqlx_logging(false);
        let conn = sea_orm::Database::connect(opts).await?;
        socialgraph_migrations::Migrator::up(&conn, None).await.context("migrations")?;
        Ok(Self { url, conn, backend, name })
    }

    /// Drops the database (call at the end of a passing test; a failing test leaves it for
    /// inspection).
    ///
    /// # Errors
    /// The server refused.
    pub async fn drop_db(self) -> anyhow::Result<()> {
        self.conn.close().await.ok();
        match self.backend {
            Backend::Sqlite => {
                let path = std::env::temp_dir().join(format!("{}.db", self.name));
                let _ = std::fs::remove_file(path);
            }
            b => {
                let server = server_url(b);
                let admin_url = if b == Backend::Postgres { format!("{server}/postgres") } else { format!("{server}/mysql") };
                let sql = if b == Backend::Postgres {
                    format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name)
                } else {
                    // MariaDB has no FORCE: a connection a killed service left inside a
                    // transaction holds a metadata lock the DROP would wait on for a year
                    // (lock_wait_timeout's default).
                    terminate_connections(&self.url).await?;
                    format!("DROP DATABASE IF EXISTS {}", self.name)
                };
                let admin = sea_orm::Database::connect(&admin_url).await?;
                admin.execute_unprepared(&sql).await?;
            }
        }
        Ok(())
    }
}

/// Redis URL of the shared test instance.
pub fn redis_url() -> String {
    std::env::var("SG_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// Redis URL of the shared test cache instance (the one that may evict; `make deps` starts it
/// on port 6380 with `allkeys-lru`).
pub fn cache_redis_url() -> String {
    std::env::var("SG_TEST_CACHE_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6380".into())
}

/// Polls `check` every 20 ms until it returns `Some`, failing after `deadline` with `what`.
///
/// # Errors
/// The deadline passed, or `check` failed.
pub async fn eventually<T, F, Fut>(deadline: Duration, what: &str, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Option<T>>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = check().await? {
            return Ok(v);
        }
        if start.elapsed() > deadline {
            bail!("timed out after {deadline:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The sessions of the database at `db_url`, one line each (id, state, time, query), and on
/// MariaDB/MySQL the open InnoDB transactions of the server: what a test prints when something
/// waits on the database longer than it should.
///
/// # Errors
/// The server is unreachable.
pub async fn sessions(db_url: &str) -> anyhow::Result<String> {
    use sea_orm::{DbBackend, Statement};
    let (server, name) = db_url.rsplit_once('/').ok_or_else(|| anyhow::anyhow!("no database in {db_url}"))?;
    let (admin, backend, queries) = if db_url.starts_with("postgres") {
        let q = format!(
            "SELECT concat_ws(' | ', pid, state, now() - xact_start, wait_event_type, wait_event, left(query, 200)) FROM pg_stat_activity WHERE datname = '{name}'"
        );
        (sea_orm::Database::connect(format!("{server}/postgres")).await?, DbBackend::Postgres, vec![q])
    } else {
        let q = format!(
            "SELECT CONCAT_WS(' | ', id, command, time, IFNULL(state, ''), LEFT(IFNULL(info, ''), 200)) FROM information_schema.processlist WHERE db = '{name}'"
        );
        let trx = "SELECT CONCAT_WS(' | ', 'trx of', trx_mysql_thread_id, trx_state, trx_started, trx_rows_locked, LEFT(IFNULL(trx_query, ''), 200)) FROM information_schema.innodb_trx".to_owned();
        (sea_orm::Database::connect(format!("{server}/mysql")).await?, DbBackend::MySql, vec![q, trx])
    };
    let mut out = Vec::new();
    for q in queries {
        for r in admin.query_all_raw(Statement::from_string(backend, q)).await? {
            out.push(r.try_get_by_index::<Option<String>>(0).ok().flatten().unwrap_or_default());
        }
    }
    admin.close().await?;
    Ok(out.join("\n"))
}

/// Terminates every connection to the database at `db_url` but the caller's (PostgreSQL
/// `pg_terminate_backend`, MariaDB `KILL`), as a crashed or restarted database would; returns
/// how many were terminated.
///
/// # Errors
/// The server is not reachable.
pub async fn terminate_connections(db_url: &str) -> anyhow::Result<i64> {
    use sea_orm::{DbBackend, Statement};
    let (server, name) = db_url.rsplit_once('/').ok_or_else(|| anyhow::anyhow!("no database in {db_url}"))?;
    if db_url.starts_with("postgres") {
        let admin = sea_orm::Database::connect(format!("{server}/postgres")).await?;
        let sql = format!("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = '{name}' AND pid <> pg_backend_pid()");
        let row = admin.query_one_raw(Statement::from_string(DbBackend::Postgres, sql)).await?;
        admin.close().await?;
        return Ok(row.map(|r| r.try_get_by_index::<i64>(0)).transpose()?.unwrap_or(0));
    }
    let admin = sea_orm::Database::connect(format!("{server}/mysql")).await?;
    let sql = format!("SELECT id FROM information_schema.processlist WHERE db = '{name}' AND id <> CONNECTION_ID()");
    let ids: Vec<i64> = admin
        .query_all_raw(Statement::from_string(DbBackend::MySql, sql))
        .await?
        .iter()
        .filter_map(|r| r.try_get_by_index::<i64>(0).ok().or_else(|| r.try_get_by_index::<u64>(0).ok().map(|v| v as i64)))
        .collect();
    for id in &ids {
        // The connection may have ended on its own meanwhile.
        let _ = admin.execute_unprepared(&format!("KILL {id}")).await;
    }
    admin.close().await?;
    Ok(ids.len() as i64)
}
