//! Where the CPU of a Like run goes, and the Like run with the event flow held: the broker
//! stopped (SIGSTOP) for the run and let go (SIGCONT) after it, so the relay publishes the
//! run's events afterwards. On this machine the development broker shares the two cores with
//! the services; the held run shows what the Like path itself reaches beside its raw toggle.

use std::time::Instant;

use redis::aio::MultiplexedConnection;

use crate::backends::{TICKS_PER_SEC, broker_pid, cpu_ticks};

/// CPU seconds used so far by the broker, the counter Redis and this process (which hosts the
/// services and the bench's clients), and when they were read.
pub(crate) struct Cpu {
    broker: f64,
    redis: f64,
    process: f64,
    at: Instant,
}

impl Cpu {
    /// Reads the three now; the broker counts 0 when no broker process is found.
    pub(crate) async fn now(conn: &mut MultiplexedConnection) -> anyhow::Result<Self> {
        let info: String = redis::cmd("INFO").arg("cpu").query_async(conn).await?;
        // `used_cpu_sys:` and `used_cpu_user:` in seconds; the `_children` and `_main_thread`
        // lines are other counts.
        let redis = info
            .lines()
            .filter_map(|l| l.strip_prefix("used_cpu_sys:").or_else(|| l.strip_prefix("used_cpu_user:")))
            .filter_map(|v| v.trim().parse::<f64>().ok())
            .sum();
        let broker = broker_pid().map_or(0, |p| cpu_ticks(&p.to_string()));
        Ok(Self { broker: broker as f64 / TICKS_PER_SEC, redis, process: cpu_ticks("self") as f64 / TICKS_PER_SEC, at: Instant::now() })
    }

    /// The cores each used from `start` to `self`.
    pub(crate) fn since(&self, start: &Self) -> Cores {
        let secs = self.at.duration_since(start.at).as_secs_f64().max(1e-9);
        Cores {
            broker: (self.broker - start.broker) / secs,
            redis: (self.redis - start.redis) / secs,
            process: (self.process - start.process) / secs,
        }
    }
}

/// Cores used over a run by the broker, the counter Redis and this process.
pub(crate) struct Cores {
    broker: f64,
    redis: f64,
    process: f64,
}

impl Cores {
    /// One line of the table's notes.
    pub(crate) fn describe(&self) -> String {
        format!("broker {:.2} cores, Redis {:.2}, this process (the services and the clients) {:.2}", self.broker, self.redis, self.process)
    }

    /// CPU per operation at `rate` ops/s, and the rate the same work without the broker's
    /// share would reach on this machine's cores: cores / ((Redis + this process) CPU per
    /// op). Arithmetic on the measured CPU, not a run: it assumes the cores are the limit.
    pub(crate) fn per_op(&self, rate: f64) -> String {
        let rate = rate.max(1e-9);
        let us = |cores: f64| cores / rate * 1e6;
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get) as f64;
        let without = cores / ((self.redis + self.process) / rate).max(1e-12);
        format!(
            "CPU per Like: broker {:.0} µs, Redis {:.0}, this process {:.0}; without the broker's share the same work \
             would fit {without:.0}/s on {cores} cores (arithmetic, not a run)",
            us(self.broker),
            us(self.redis),
            us(self.process)
        )
    }
}
