//! `relation-svc`: serve RelationService, or run the database migrations.
use clap::{Parser, Subcommand};

/// relation-svc: the following table, its outbox and the relay to Kafka.
#[derive(Parser)]
#[command(version)]
struct Cli {
    /// TOML config file (settings also come from SG_<SECTION>__<KEY> variables).
    #[arg(long, env = "SG_CONFIG")]
    config: Option<std::path::PathBuf>,
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let config: socialgraph_relation::Config = socialgraph_server::load_config(cli.config.as_deref())?;
    let telemetry = socialgraph_telemetry::init("relation-svc")?;
    let result = match cli.command.unwrap_or(Command::Serve) {
        Command::Migrate => socialgraph_relation::migrate(&config).await,
        Command::Serve => {
            let grpc = socialgraph_server::bind(config.server.grpc_addr).await?;
            let admin = socialgraph_server::bind(config.server.admin_addr).await?;
            tracing::info!(grpc = %config.server.grpc_addr, admin = %config.server.admin_addr, "relation-svc listening");
            socialgraph_relation::run(config, grpc, admin, socialgraph_server::shutdown_on_signal()).await
        }
    };
    telemetry.shutdown();
    result
}
