//! Private instances of Redis and the broker for tests that kill them.

use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use tokio::process::{Child, Command};

/// A free TCP port on 127.0.0.1 (bound and released; a small race is acceptable in tests).
///
/// # Errors
/// No port could be bound.
pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

async fn wait_port(port: u16, what: &str) -> anyhow::Result<()> {
    for _ in 0..500 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    anyhow::bail!("{what} did not start listening on port {port} within 10 s")
}

/// A child process killed on drop.
pub struct Instance {
    /// The process.
    pub child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

impl Instance {
    /// Kills the process at once (SIGKILL) and waits for it.
    ///
    /// # Errors
    /// The process could not be signalled.
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        self.child.kill().await?;
        Ok(())
    }
}

/// Starts a throw-away `redis-server` on `port` (0 = a free one), keeping nothing on disk.
///
/// # Errors
/// `redis-server` is not installed (`make deps` installs it) or did not start.
pub async fn redis(port: u16) -> anyhow::Result<Instance> {
    redis_on(port, None).await
}

/// Starts `redis-server` on `port` (0 = a free one) with an append-only file in `dir` synced
/// on every write (`appendfsync always`), as counter-svc's Redis of facts should run: started
/// again on the same `dir`, even after a SIGKILL, it has every acknowledged write.
///
/// # Errors
/// `redis-server` is not installed (`make deps` installs it) or did not start.
pub async fn redis_with_aof(port: u16, dir: &std::path::Path) -> anyhow::Result<Instance> {
    std::fs::create_dir_all(dir)?;
    redis_on(port, Some(dir)).await
}

async fn redis_on(port: u16, aof_dir: Option<&std::path::Path>) -> anyhow::Result<Instance> {
    let port = if port == 0 { free_port()? } else { port };
    let mut command = Command::new("redis-server");
    command.args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", ""]);
    match aof_dir {
        Some(dir) => command.args(["--appendonly", "yes", "--appendfsync", "always", "--dir"]).arg(dir),
        None => command.args(["--appendonly", "no"]),
    };
    let child = command.stdout(Stdio::null()).kill_on_drop(true).spawn().context("redis-server is not installed: run `make deps`")?;
    wait_port(port, "redis-server").await?;
    Ok(Instance { child, port })
}

/// Starts a private broker (tansu) on `port` with durable SQLite state in `dir`, the start line
/// of `scripts/tansu.sh`. Restarting on the same `dir` and `port` keeps every record.
///
/// # Errors
/// `tansu` is not installed (`make deps` installs it) or did not start.
pub async fn broker(port: u16, dir: &std::path::Path) -> anyhow::Result<Instance> {
    std::fs::create_dir_all(dir)?;
    let url = format!("tcp://127.0.0.1:{port}");
    let child = Command::new("tansu")
        .args(["broker", "--listener-url", &url, "--advertised-listener-url", &url, "--storage-engine", "sqlite://tansu.db"])
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("the tansu broker is not installed: run `make deps`")?;
    wait_port(port, "tansu").await?;
    add_fetch_index(dir).await?;
    Ok(Instance { child, port })
}

/// Adds the index the broker's SQLite schema lacks (as `scripts/tansu.sh` does): without it
/// every fetch scans all record headers, and a broker holding a few hundred thousand records
/// spends its CPU on that while producers and consumers wait (a soak stalled so).
async fn add_fetch_index(dir: &std::path::Path) -> anyhow::Result<()> {
    const SQL: &str = "create index if not exists header_topition_offset on header(topition, offset_id);";
    let started = std::time::Instant::now();
    loop {
        let out = Command::new("sqlite3")
            .args(["-cmd", ".timeout 10000", "tansu.db", SQL])
            .current_dir(dir)
            .output()
            .await
            .context("sqlite3 is not installed: run `make deps`")?;
        if out.status.success() {
            return Ok(());
        }
        // The broker creates its schema as it starts.
        if started.elapsed() > std::time::Duration::from_secs(10) {
            anyhow::bail!("indexing the broker's record headers failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
