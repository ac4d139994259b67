//! Broker and Redis helpers shared by the parts: topics and partition clients on the local
//! broker, the broker's process (its pid, its CPU, stopping it for a run), the bench's own
//! Redis keys, Redis memory figures and `redis-benchmark` runs.

use std::time::{Duration, Instant};

use anyhow::Context;
use rskafka::client::Client;
use rskafka::client::partition::{PartitionClient, UnknownTopicHandling};
use socialgraph_integration_tests::raw_redis_conn;

/// Partitions of the topics the test configurations create.
pub(crate) const PARTITIONS: i32 = 4;

pub(crate) async fn kafka() -> anyhow::Result<Client> {
    socialgraph_testkit::kafka::connect(&socialgraph_testkit::kafka::brokers()).await
}

pub(crate) async fn create_topic(client: &Client, topic: &str, partitions: i32) -> anyhow::Result<()> {
    client.controller_client()?.create_topic(topic, partitions, 1, 5_000).await?;
    Ok(())
}

/// A client for each of the [`PARTITIONS`] partitions of `topic`, in partition order (retries
/// while a fresh topic is not known yet).
pub(crate) async fn partition_clients(client: &Client, topic: &str) -> anyhow::Result<Vec<PartitionClient>> {
    let mut pcs = Vec::new();
    for p in 0..PARTITIONS {
        pcs.push(client.partition_client(topic, p, UnknownTopicHandling::Retry).await?);
    }
    Ok(pcs)
}

/// A patient connection to the shared Redis (long response timeout: big pipelines on a busy
/// machine).
pub(crate) async fn bench_redis() -> anyhow::Result<redis::aio::MultiplexedConnection> {
    raw_redis_conn(&socialgraph_testkit::redis_url()).await
}

/// A key prefix of this run's own Redis keys.
pub(crate) fn bench_prefix() -> String {
    socialgraph_testkit::unique("sgbench:") + ":"
}

/// Deletes every key under `prefix` (SCAN + UNLINK, bounded by the key count).
pub(crate) async fn delete_prefix(conn: &mut redis::aio::MultiplexedConnection, prefix: &str) -> anyhow::Result<u64> {
    let pattern = format!("{prefix}*");
    let mut cursor: u64 = 0;
    let mut deleted = 0u64;
    for _ in 0..1_000_000 {
        let (next, keys): (u64, Vec<String>) =
            redis::cmd("SCAN").arg(cursor).arg("MATCH").arg(&pattern).arg("COUNT").arg(5_000).query_async(conn).await?;
        if !keys.is_empty() {
            deleted += redis::cmd("UNLINK").arg(&keys).query_async::<u64>(conn).await?;
        }
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    Ok(deleted)
}

/// Redis's `used_memory`, in bytes.
pub(crate) async fn used_memory(conn: &mut redis::aio::MultiplexedConnection) -> anyhow::Result<i64> {
    let info: String = redis::cmd("INFO").arg("memory").query_async(conn).await?;
    info.lines().find_map(|l| l.strip_prefix("used_memory:")).and_then(|v| v.trim().parse().ok()).context("INFO memory has no used_memory")
}

/// MEMORY USAGE of each key (0 for a missing key), pipelined.
pub(crate) async fn memory_usage(conn: &mut redis::aio::MultiplexedConnection, keys: &[String]) -> anyhow::Result<Vec<u64>> {
    let mut out = Vec::with_capacity(keys.len());
    for chunk in keys.chunks(1_000) {
        let mut pipe = redis::pipe();
        for k in chunk {
            pipe.cmd("MEMORY").arg("USAGE").arg(k).arg("SAMPLES").arg(0);
        }
        let v: Vec<Option<u64>> = pipe.query_async(conn).await?;
        out.extend(v.into_iter().map(Option::unwrap_or_default));
    }
    Ok(out)
}

/// redis-benchmark's summary of one test (`--csv`).
pub(crate) struct RedisBench {
    pub(crate) rps: f64,
    pub(crate) p50: f64,
    pub(crate) p99: f64,
}

/// Runs `redis-benchmark --csv` against the local Redis with `args` and parses its last line.
pub(crate) async fn redis_benchmark(args: &[String]) -> anyhow::Result<RedisBench> {
    let out = tokio::time::timeout(
        Duration::from_secs(300),
        tokio::process::Command::new("redis-benchmark").args(["-h", "127.0.0.1", "-p", "6379", "--csv"]).args(args).kill_on_drop(true).output(),
    )
    .await
    .context("redis-benchmark took longer than 300 s")?
    .context("redis-benchmark is not installed (it comes with redis-tools)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with('"') && !l.starts_with("\"test\""))
        .with_context(|| format!("no result from redis-benchmark: {} {}", text.trim(), String::from_utf8_lossy(&out.stderr).trim()))?;
    // "test","rps","avg","min","p50","p95","p99","max": the test name may be long, so read from the right.
    let fields: Vec<&str> = line.trim().trim_matches('"').rsplit("\",\"").collect();
    let num = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(f64::NAN);
    Ok(RedisBench { rps: num(6), p50: num(3), p99: num(1) })
}

/// The pid of the broker the tests use: a `tansu` process whose command line names the
/// address of `SG_TEST_KAFKA` (default 127.0.0.1:9092).
pub(crate) fn broker_pid() -> Option<u32> {
    let addr = socialgraph_testkit::kafka::brokers().first()?.clone();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        (comm.trim() == "tansu" && String::from_utf8_lossy(&cmdline).contains(&addr)).then_some(pid)
    })
}

/// Clock ticks per second of `/proc/<pid>/stat` (USER_HZ, 100 on Linux).
pub(crate) const TICKS_PER_SEC: f64 = 100.0;

/// utime + stime of every PostgreSQL process (`comm` "postgres": the server and its
/// backends) in clock ticks; a backend that exits between two readings takes its share along.
pub(crate) fn postgres_ticks() -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc") else { return 0 };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "postgres"))
        .map(|pid| cpu_ticks(&pid.to_string()))
        .sum()
}

/// utime + stime of `pid` in clock ticks (`/proc/<pid>/stat` fields 14 and 15).
pub(crate) fn cpu_ticks(pid: &str) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name (field 2) is in parentheses and may hold spaces: count after it.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest.split_whitespace().map(|x| x.parse().unwrap_or(0)).collect();
    f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0)
}

/// The broker stopped until this is dropped, so that a failed run still lets it go.
pub(crate) struct Broker(u32);

impl Broker {
    /// Stops the broker of the tests (`SG_TEST_KAFKA`).
    ///
    /// # Errors
    /// No broker process found, or `kill` failed.
    pub(crate) fn stop() -> anyhow::Result<Self> {
        let Some(pid) = broker_pid() else { anyhow::bail!("no broker process (tansu) found: run `make deps`") };
        signal(pid, "STOP")?;
        Ok(Self(pid))
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Err(e) = signal(self.0, "CONT") {
            eprintln!("the broker (pid {}) could not be let go: {e}; run `kill -CONT {}`", self.0, self.0);
        }
    }
}

/// Sends `SIG<name>` to `pid` with kill(1).
fn signal(pid: u32, name: &str) -> anyhow::Result<()> {
    let status = std::process::Command::new("kill").arg(format!("-{name}")).arg(pid.to_string()).status()?;
    anyhow::ensure!(status.success(), "kill -{name} {pid}: {status}");
    Ok(())
}

/// CPU seconds used so far by the broker, one store beside it (the counter Redis or
/// PostgreSQL) and this process (which hosts the services and the bench's clients), and when
/// they were read. The broker counts 0 when no broker process is found.
pub(crate) struct Cpu {
    broker: f64,
    store: f64,
    store_name: &'static str,
    process: f64,
    at: Instant,
}

impl Cpu {
    /// The store is the Redis behind `conn`: `used_cpu_sys` + `used_cpu_user` of `INFO cpu`.
    pub(crate) async fn with_redis(conn: &mut redis::aio::MultiplexedConnection) -> anyhow::Result<Self> {
        let info: String = redis::cmd("INFO").arg("cpu").query_async(conn).await?;
        // The `_children` and `_main_thread` lines are other counts.
        let secs = info
            .lines()
            .filter_map(|l| l.strip_prefix("used_cpu_sys:").or_else(|| l.strip_prefix("used_cpu_user:")))
            .filter_map(|v| v.trim().parse::<f64>().ok())
            .sum();
        Ok(Self::read(secs, "Redis"))
    }

    /// The store is PostgreSQL: every process of its ([`postgres_ticks`]).
    pub(crate) fn with_postgres() -> Self {
        Self::read(postgres_ticks() as f64 / TICKS_PER_SEC, "PostgreSQL")
    }

    fn read(store: f64, store_name: &'static str) -> Self {
        let broker = broker_pid().map_or(0, |p| cpu_ticks(&p.to_string()));
        Self { broker: broker as f64 / TICKS_PER_SEC, store, store_name, process: cpu_ticks("self") as f64 / TICKS_PER_SEC, at: Instant::now() }
    }

    /// The cores each used from `start` to `self`.
    pub(crate) fn since(&self, start: &Self) -> Cores {
        let secs = self.at.duration_since(start.at).as_secs_f64().max(1e-9);
        Cores {
            broker: (self.broker - start.broker) / secs,
            store: (self.store - start.store) / secs,
            store_name: self.store_name,
            process: (self.process - start.process) / secs,
        }
    }
}

/// Cores used over a run by the broker, the store and this process ([`Cpu::since`]).
pub(crate) struct Cores {
    pub(crate) broker: f64,
    pub(crate) store: f64,
    store_name: &'static str,
    pub(crate) process: f64,
}

impl Cores {
    /// "broker B cores, <store> S, this process (the services and the clients) P".
    pub(crate) fn describe(&self) -> String {
        format!(
            "broker {:.2} cores, {} {:.2}, this process (the services and the clients) {:.2}",
            self.broker, self.store_name, self.store, self.process
        )
    }
}
