//! `gateway [--config FILE] [serve|openapi]`: serve the HTTP/JSON gateway (the default), or
//! print the OpenAPI document generated from the proto.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

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
    /// Serve HTTP/JSON and the admin port (the default).
    Serve,
    /// Print the OpenAPI 3 document of every route and exit.
    Openapi,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Some(Command::Openapi) = cli.command {
        // A closed pipe (`gateway openapi | head`) ends the output quietly.
        use std::io::Write;
        return match std::io::stdout().write_all(socialgraph_gateway::OPENAPI_JSON.as_bytes()) {
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
            _ => Ok(()),
        };
    }
    let config: socialgraph_gateway::Config = socialgraph_server::load_config(cli.config.as_deref())?;
    config.validate()?;
    let telemetry = socialgraph_telemetry::init("gateway")?;
    let http = socialgraph_server::bind(config.http.addr).await?;
    let admin = socialgraph_server::bind(config.http.admin_addr).await?;
    tracing::info!(http = %config.http.addr, admin = %config.http.admin_addr, "gateway listening");
    let result = socialgraph_gateway::run(config, http, admin, socialgraph_server::shutdown_on_signal()).await;
    telemetry.shutdown();
    result
}
