//! The shared `main` of every service binary: `<binary> [--config FILE] [serve|migrate]`.

use std::future::Future;
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use serde::{Serialize, de::DeserializeOwned};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::ServerSettings;

#[derive(Parser)]
struct Cli {
    /// TOML config file (settings also come from SG_<SECTION>__<KEY> variables).
    #[arg(long, env = "SG_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Serve gRPC and the admin port (the default).
    Serve,
    /// Run pending database migrations and exit.
    Migrate,
}

/// A service configuration that names its listen addresses.
pub trait ServiceConfig: Serialize + DeserializeOwned + Default + Clone + Send + 'static {
    /// The `[server]` section.
    fn server(&self) -> &ServerSettings;
}

/// Parses the command line, loads the config, starts telemetry, then either runs migrations
/// or binds the gRPC and admin ports and calls `run` until SIGTERM.
///
/// # Errors
/// Bad config (the message names the key), bind failures, and whatever `run` or `migrate`
/// returns.
pub async fn service_main<C, R, RF, M, MF>(binary: &'static str, run: R, migrate: M) -> anyhow::Result<()>
where
    C: ServiceConfig,
    R: FnOnce(C, TcpListener, TcpListener, CancellationToken) -> RF,
    RF: Future<Output = anyhow::Result<()>>,
    M: FnOnce(C) -> MF,
    MF: Future<Output = anyhow::Result<()>>,
{
    let cli = Cli::parse();
    let config: C = crate::load_config(cli.config.as_deref())?;
    let telemetry = socialgraph_telemetry::init(binary)?;
    let result = match cli.command.unwrap_or(Command::Serve) {
        Command::Migrate => migrate(config).await,
        Command::Serve => {
            let (grpc_addr, admin_addr) = (config.server().grpc_addr, config.server().admin_addr);
            let grpc = crate::bind(grpc_addr).await?;
            let admin = crate::bind(admin_addr).await?;
            tracing::info!(grpc = %grpc_addr, admin = %admin_addr, "{binary} listening");
            run(config, grpc, admin, crate::shutdown_on_signal()).await
        }
    };
    telemetry.shutdown();
    result
}
