//! projection-svc configuration: defaults < `--config` TOML file < `SG_<SECTION>__<KEY>`
//! environment variables (e.g. `SG_CONSUMER__PARTITIONS='{replica={ordinal=0,count=3}}'`).

use secrecy::SecretString;
use serde::{Deserialize, Serialize};
use socialgraph_events::consumer::ConsumerSettings;
pub use socialgraph_server::{AuthSettings, CacheSettings, DatabaseSettings, KafkaSettings, ServerSettings};

/// Everything projection-svc reads.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Listen addresses, timeouts and limits of the gRPC and admin servers.
    pub server: ServerSettings,
    /// The SQL database holding `follower` and `consumer_offset`.
    pub database: DatabaseSettings,
    /// Kafka topic and brokers.
    pub kafka: KafkaSettings,
    /// Which partitions this replica consumes and how it fetches.
    pub consumer: ConsumerSettings,
    /// relation-svc, the source that rebuilds read.
    pub relation: RelationSettings,
    /// Page-token signing.
    pub auth: AuthSettings,
    /// The cache Redis: following lists kept from the events (projection-svc applies them).
    pub cache: CacheSettings,
    /// Home timelines (FeedService).
    pub feed: crate::feed::FeedSettings,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            server: ServerSettings::with_ports(50052, 9102),
            database: DatabaseSettings::with_pool(16),
            kafka: KafkaSettings::default(),
            consumer: ConsumerSettings::default(),
            relation: RelationSettings::default(),
            auth: AuthSettings::default(),
            cache: CacheSettings::default(),
            feed: crate::feed::FeedSettings::default(),
        }
    }
}

/// `[relation]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RelationSettings {
    /// gRPC URL of relation-svc.
    pub url: String,
    /// relation-svc's admin token (ScanEdges), used by Rebuild.
    #[serde(skip_serializing)]
    pub admin_token: Option<SecretString>,
}

impl Default for RelationSettings {
    fn default() -> Self {
        Self { url: "http://127.0.0.1:50051".into(), admin_token: None }
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
    use socialgraph_events::consumer::Assignment;

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail closures return its (large) error
    fn environment_sets_nested_keys_and_the_partition_assignment() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("SG_CONSUMER__PARTITIONS__REPLICA__ORDINAL", "2");
            jail.set_env("SG_CONSUMER__PARTITIONS__REPLICA__COUNT", "3");
            jail.set_env("SG_DATABASE__URL", "mysql://root@db/sg");
            jail.set_env("SG_CONFIG", "/etc/socialgraph/projection.toml");
            jail.set_env("SG_LOG_FORMAT", "json");
            let c: Config = socialgraph_server::load_config(None).map_err(|e| e.to_string())?;
            assert_eq!(c.consumer.partitions, Assignment::Replica { ordinal: 2, count: 3 });
            assert_eq!(c.database.url, "mysql://root@db/sg");
            Ok(())
        });
        figment::Jail::expect_with(|jail| {
            jail.set_env("SG_CONSUMER__PARTITIONS", "all");
            let c: Config = socialgraph_server::load_config(None).map_err(|e| e.to_string())?;
            assert_eq!(c.consumer.partitions, Assignment::All);
            jail.set_env("SG_DATABASE__NO_SUCH_KEY", "1");
            let err = socialgraph_server::load_config::<Config>(None).unwrap_err().to_string();
            assert!(err.contains("no_such_key"), "unknown keys are named: {err}");
            Ok(())
        });
    }
}
