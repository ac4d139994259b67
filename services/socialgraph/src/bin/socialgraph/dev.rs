//! `socialgraph dev`: the embedded mesh (relation, projection and counter services on one
//! SQLite file) in this process.

use std::process::ExitCode;

use crate::args::DevArgs;

/// Default bearer token of the embedded mode's admin RPCs when `--admin-token` is not given.
const DEV_ADMIN_TOKEN: &str = "dev-admin-token";

/// Serves until SIGTERM or Ctrl-C; a failure to start or serve prints one line on standard
/// error and is exit status 1.
pub async fn serve(args: DevArgs, admin_token: Option<String>) -> ExitCode {
    match run(args, admin_token).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: socialgraph dev: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the embedded mesh until SIGTERM or Ctrl-C.
async fn run(a: DevArgs, admin_token: Option<String>) -> anyhow::Result<()> {
    let telemetry = socialgraph_telemetry::init("socialgraph-dev")?;
    let config = socialgraph_embedded::DevConfig {
        data: a.data,
        relation_addr: a.relation_addr,
        projection_addr: a.projection_addr,
        counter_addr: a.counter_addr,
        admin_addr: a.admin_addr,
        admin_token: admin_token.unwrap_or_else(|| DEV_ADMIN_TOKEN.to_owned()).into(),
        page_token_secret: a.page_token_secret.map(Into::into),
        ..socialgraph_embedded::DevConfig::default()
    };
    let listeners = socialgraph_embedded::Listeners::bind(&config).await?;
    tracing::info!(
        data = %config.data.display(),
        relation = %config.relation_addr,
        projection = %config.projection_addr,
        counter = %config.counter_addr,
        admin = %config.admin_addr,
        "socialgraph dev serving"
    );
    let shutdown = socialgraph_server::shutdown_on_signal();
    let result = socialgraph_embedded::run(config, listeners, shutdown).await;
    telemetry.shutdown();
    result
}
