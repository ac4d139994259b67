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

/// A private Redis Cluster: primaries only, each a `redis-server --cluster-enabled yes` on a
/// free port (and a free cluster bus port), joined with `redis-cli --cluster create`. Killed
/// and its directory removed on drop.
pub struct RedisCluster {
    /// The nodes, in the order their slot ranges were assigned (0 holds the lowest slots).
    pub nodes: Vec<Instance>,
    dir: std::path::PathBuf,
}

impl RedisCluster {
    /// Its URL as the services take it: `redis+cluster://127.0.0.1:p1,127.0.0.1:p2,…`.
    pub fn url(&self) -> String {
        format!("redis+cluster://{}", self.hosts().join(","))
    }

    /// `127.0.0.1:port` of each node.
    fn hosts(&self) -> Vec<String> {
        self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect()
    }

    /// Moves `slots` hash slots from node `from` to node `to` with `redis-cli --cluster
    /// reshard`, moving each slot's keys in one MIGRATE (`--cluster-pipeline` above any
    /// slot's key count): a slot's keys are never split between two nodes, which the Lua
    /// scripts need for the keys they derive from a declared one (an entity's bitmap chunks).
    ///
    /// # Errors
    /// `redis-cli` failed.
    pub async fn reshard(&self, from: usize, to: usize, slots: u32) -> anyhow::Result<()> {
        let (from_id, to_id) = (self.node_id(from).await?, self.node_id(to).await?);
        let entry = format!("127.0.0.1:{}", self.nodes[from].port);
        let slots = slots.to_string();
        redis_cli(&[
            "--cluster",
            "reshard",
            &entry,
            "--cluster-from",
            &from_id,
            "--cluster-to",
            &to_id,
            "--cluster-slots",
            &slots,
            "--cluster-pipeline",
            "1000000",
            "--cluster-yes",
        ])
        .await?;
        self.wait_ok().await
    }

    /// The number of slots node `i` holds.
    ///
    /// # Errors
    /// `redis-cli` failed.
    pub async fn slots_of(&self, i: usize) -> anyhow::Result<u32> {
        let nodes = redis_cli(&["-p", &self.nodes[i].port.to_string(), "cluster", "nodes"]).await?;
        let line = nodes.lines().find(|l| l.contains("myself")).context("no `myself` line in CLUSTER NODES")?;
        let mut n = 0;
        for range in line.split_whitespace().skip(8).filter(|r| !r.starts_with('[')) {
            n += match range.split_once('-') {
                Some((a, b)) => b.parse::<u32>()? - a.parse::<u32>()? + 1,
                None => 1,
            };
        }
        Ok(n)
    }

    async fn node_id(&self, i: usize) -> anyhow::Result<String> {
        Ok(redis_cli(&["-p", &self.nodes[i].port.to_string(), "cluster", "myid"]).await?.trim().to_owned())
    }

    /// Waits until every node reports `cluster_state:ok` and agrees on the slot map.
    async fn wait_ok(&self) -> anyhow::Result<()> {
        let entry = format!("127.0.0.1:{}", self.nodes[0].port);
        for _ in 0..200 {
            let mut ok = redis_cli(&["--cluster", "check", &entry]).await.is_ok_and(|o| o.contains("[OK] All 16384 slots covered"));
            for n in &self.nodes {
                ok &= redis_cli(&["-p", &n.port.to_string(), "cluster", "info"]).await.is_ok_and(|o| o.contains("cluster_state:ok"));
            }
            if ok {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        anyhow::bail!("the Redis Cluster did not reach cluster_state:ok within 10 s")
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn redis_cli(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("redis-cli").args(args).output().await.context("redis-cli is not installed: run `make deps`")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    anyhow::ensure!(out.status.success() && !text.contains("[ERR]"), "redis-cli {args:?} failed: {text}{}", String::from_utf8_lossy(&out.stderr));
    Ok(text)
}

/// Starts a Redis Cluster of `n` primaries (3 or more, as `redis-cli --cluster create`
/// requires) on free ports, keeping nothing on disk but its node files.
///
/// # Errors
/// `redis-server` or `redis-cli` is not installed (`make deps` installs them), or the cluster
/// did not form.
pub async fn redis_cluster(n: usize) -> anyhow::Result<RedisCluster> {
    let dir = std::env::temp_dir().join(crate::unique("sg-cluster-"));
    std::fs::create_dir_all(&dir)?;
    let mut nodes = Vec::with_capacity(n);
    for _ in 0..n {
        let (port, bus) = (free_port()?, free_port()?);
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--cluster-port", &bus.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--cluster-enabled", "yes", "--cluster-node-timeout", "5000", "--cluster-config-file", &format!("nodes-{port}.conf")])
            .current_dir(&dir)
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("redis-server is not installed: run `make deps`")?;
        wait_port(port, "redis-server").await?;
        nodes.push(Instance { child, port });
    }
    let cluster = RedisCluster { nodes, dir };
    let hosts = cluster.hosts();
    let mut args = vec!["--cluster", "create"];
    args.extend(hosts.iter().map(String::as_str));
    args.extend(["--cluster-replicas", "0", "--cluster-yes"]);
    redis_cli(&args).await?;
    cluster.wait_ok().await?;
    Ok(cluster)
}
