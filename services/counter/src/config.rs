//! counter-svc configuration: defaults < `--config` TOML file < `SG_<SECTION>__<KEY>`
//! environment variables.

use serde::{Deserialize, Serialize};
use socialgraph_events::consumer::ConsumerSettings;
pub use socialgraph_server::{AuthSettings, KafkaSettings, RedisSettings, ServerSettings};

/// Everything counter-svc reads.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Listen addresses, timeouts and limits of the gRPC and admin servers.
    pub server: ServerSettings,
    /// Redis holding counters, bitmaps, guards and consumer offsets.
    pub redis: RedisSettings,
    /// Kafka topics and brokers.
    pub kafka: KafkaSettings,
    /// Which partitions this replica consumes and how it fetches.
    pub consumer: ConsumerSettings,
    /// projection-svc, whose edge counts and offsets rebuild the follow counters.
    pub projection: ProjectionSettings,
    /// message-svc, whose membership states the unread counters copy.
    pub message: MessageSettings,
    /// Self-healing.
    pub counters: CounterSettings,
    /// Admin credentials.
    pub auth: AuthSettings,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            server: ServerSettings::with_ports(50053, 9103),
            redis: RedisSettings::with_pool(32, 1000),
            kafka: KafkaSettings::default(),
            consumer: ConsumerSettings::default(),
            projection: ProjectionSettings::default(),
            message: MessageSettings::default(),
            counters: CounterSettings::default(),
            auth: AuthSettings::default(),
        }
    }
}

/// `[projection]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProjectionSettings {
    /// gRPC URL of projection-svc.
    pub url: String,
}

impl Default for ProjectionSettings {
    fn default() -> Self {
        Self { url: "http://127.0.0.1:50052".into() }
    }
}

/// `[message]`
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MessageSettings {
    /// gRPC URL of message-svc; empty (the default) turns the unread counters off: topic
    /// `kafka.message_topic` is not consumed and GetUnreadCounts answers zero.
    pub url: String,
}

/// `[counters]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CounterSettings {
    /// A user's counters are compared with the facts at most once per this many seconds, on
    /// read; 0 turns the sampled check off.
    pub check_interval_secs: u64,
    /// How long an entity's like/fav outbox must stay empty, with no toggle, before the relay
    /// drops the entity from its index.
    pub relay_quiet_ms: u64,
    /// Retired: how long the relation consumer waited for projection-svc (follow counts now
    /// arrive as events); accepted with a warning for one more release, and ignored.
    #[serde(skip_serializing)]
    projection_wait_ms: Option<u64>,
    /// Retired: the name of `projection_wait_ms` up to 0.1.0; accepted with a warning, ignored.
    #[serde(skip_serializing)]
    rebuild_wait_ms: Option<u64>,
    /// The name of `relay_quiet_ms` up to 0.1.0, accepted with a warning for one more release.
    #[serde(skip_serializing)]
    verify_after_ms: Option<u64>,
}

impl Default for CounterSettings {
    fn default() -> Self {
        Self { check_interval_secs: 300, relay_quiet_ms: 2_000, projection_wait_ms: None, rebuild_wait_ms: None, verify_after_ms: None }
    }
}

/// A setting given under a name it no longer has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Renamed {
    /// The old key (`section.key`).
    pub old: &'static str,
    /// The key that replaced it.
    pub new: &'static str,
}

impl Renamed {
    fn env(key: &str) -> String {
        format!("SG_{}", key.to_uppercase().replace('.', "__"))
    }
}

impl std::fmt::Display for Renamed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}) is deprecated and goes away in the next release: use {} ({})",
            self.old,
            Self::env(self.old),
            self.new,
            Self::env(self.new)
        )
    }
}

/// A setting that no longer does anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retired {
    /// The key (`section.key`).
    pub old: &'static str,
    /// Why it went.
    pub why: &'static str,
}

impl std::fmt::Display for Retired {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}) is ignored and goes away in the next release: {}", self.old, Renamed::env(self.old), self.why)
    }
}

/// Why the projection waits went.
const NO_PROJECTION_WAIT: &str = "follow counts arrive as events on kafka.edge_count_topic; counter-svc no longer waits for projection-svc";

impl CounterSettings {
    /// The retired settings given (their values are dropped).
    pub fn take_retired(&mut self) -> Vec<Retired> {
        let mut used = Vec::new();
        if self.projection_wait_ms.take().is_some() {
            used.push(Retired { old: "counters.projection_wait_ms", why: NO_PROJECTION_WAIT });
        }
        if self.rebuild_wait_ms.take().is_some() {
            used.push(Retired { old: "counters.rebuild_wait_ms", why: NO_PROJECTION_WAIT });
        }
        used
    }

    /// Moves values given under the old names to the keys that replaced them and returns the
    /// old names used. An old name counts only while its new key holds its default, so a new
    /// key set to anything else wins.
    pub fn take_renamed(&mut self) -> Vec<Renamed> {
        let defaults = Self::default();
        let mut used = Vec::new();
        if let Some(ms) = self.verify_after_ms.take() {
            if self.relay_quiet_ms == defaults.relay_quiet_ms {
                self.relay_quiet_ms = ms;
            }
            used.push(Renamed { old: "counters.verify_after_ms", new: "counters.relay_quiet_ms" });
        }
        used
    }
}

impl Config {
    /// Applies the old names of renamed settings and drops retired ones, logging a
    /// deprecation warning for each one used (counter-svc calls it at start, once telemetry
    /// runs).
    pub fn apply_renamed(&mut self) {
        for renamed in self.counters.take_renamed() {
            tracing::warn!(old = renamed.old, new = renamed.new, "{renamed}");
        }
        for retired in self.counters.take_retired() {
            tracing::warn!(old = retired.old, "{retired}");
        }
    }
}

impl socialgraph_server::cli::ServiceConfig for Config {
    fn server(&self) -> &ServerSettings {
        &self.server
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the deprecation warnings of `config` print, and the config after them.
    fn warned(mut config: Config) -> (Config, String) {
        #[derive(Clone, Default)]
        struct Buffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Buffer {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0.lock().map_err(|_| std::io::Error::other("poisoned"))?.extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt().with_writer(move || writer.clone()).with_ansi(false).finish();
        tracing::subscriber::with_default(subscriber, || config.apply_renamed());
        let text = String::from_utf8(buffer.0.lock().map(|b| b.clone()).unwrap_or_default()).unwrap_or_default();
        (config, text)
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail closures return its (large) error
    fn old_counter_names_still_work_with_a_deprecation_warning() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("SG_COUNTERS__REBUILD_WAIT_MS", "7000");
            jail.set_env("SG_COUNTERS__VERIFY_AFTER_MS", "900");
            let loaded: Config = socialgraph_server::load_config(None).map_err(|e| e.to_string())?;
            let (config, log) = warned(loaded);
            assert_eq!(config.counters.relay_quiet_ms, 900);
            assert!(log.contains("WARN"), "{log}");
            assert!(log.contains("counters.rebuild_wait_ms (SG_COUNTERS__REBUILD_WAIT_MS) is ignored"), "{log}");
            assert!(log.contains("counters.verify_after_ms (SG_COUNTERS__VERIFY_AFTER_MS) is deprecated"), "{log}");
            assert!(log.contains("use counters.relay_quiet_ms (SG_COUNTERS__RELAY_QUIET_MS)"), "{log}");
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail closures return its (large) error
    fn new_counter_names_are_read_and_win_over_the_old_ones() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("SG_COUNTERS__RELAY_QUIET_MS", "1500");
            let (config, log) = warned(socialgraph_server::load_config(None).map_err(|e| e.to_string())?);
            assert_eq!(config.counters.relay_quiet_ms, 1500);
            assert_eq!(log, "", "no warning without an old name");
            jail.set_env("SG_COUNTERS__VERIFY_AFTER_MS", "700");
            let (config, log) = warned(socialgraph_server::load_config(None).map_err(|e| e.to_string())?);
            assert_eq!(config.counters.relay_quiet_ms, 1500);
            assert!(log.contains("counters.verify_after_ms"), "{log}");
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail closures return its (large) error
    fn the_retired_projection_wait_is_accepted_with_a_warning() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("SG_COUNTERS__PROJECTION_WAIT_MS", "8000");
            let (_, log) = warned(socialgraph_server::load_config(None).map_err(|e| e.to_string())?);
            assert!(log.contains("counters.projection_wait_ms (SG_COUNTERS__PROJECTION_WAIT_MS) is ignored"), "{log}");
            assert!(log.contains("kafka.edge_count_topic"), "{log}");
            Ok(())
        });
    }
}
