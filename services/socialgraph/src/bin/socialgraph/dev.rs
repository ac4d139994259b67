//! `socialgraph dev`: the embedded mesh (relation, projection, counter and message services on
//! one SQLite file) and the HTTP/JSON gateway in front of them, in this process.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

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
        message_addr: a.message_addr,
        admin_addr: a.admin_addr,
        admin_token: admin_token.unwrap_or_else(|| DEV_ADMIN_TOKEN.to_owned()).into(),
        page_token_secret: a.page_token_secret.map(Into::into),
        ..socialgraph_embedded::DevConfig::default()
    };
    let listeners = socialgraph_embedded::Listeners::bind(&config).await?;
    let http = socialgraph_server::bind(a.http_addr).await?;
    let gateway = gateway_config(&config);
    tracing::info!(
        data = %config.data.display(),
        relation = %config.relation_addr,
        projection = %config.projection_addr,
        counter = %config.counter_addr,
        message = %config.message_addr,
        admin = %config.admin_addr,
        http = %a.http_addr,
        "socialgraph dev serving"
    );
    let shutdown = socialgraph_server::shutdown_on_signal();
    let registry = prometheus::Registry::new();
    let http = socialgraph_gateway::serve_http(&gateway, http, &registry, Default::default(), shutdown.clone());
    // Either part ending (a failure, or the signal) stops the other.
    let (result, served) = tokio::join!(
        async {
            let r = socialgraph_embedded::run(config, listeners, shutdown.clone()).await;
            shutdown.cancel();
            r
        },
        async {
            let r = http.await;
            shutdown.cancel();
            r
        }
    );
    telemetry.shutdown();
    result.and(served)
}

/// The gateway in front of the embedded services' ports (loopback when they listen on every
/// interface), open to any browser origin.
fn gateway_config(dev: &socialgraph_embedded::DevConfig) -> socialgraph_gateway::Config {
    let url = |addr: std::net::SocketAddr| {
        let ip = if addr.ip().is_unspecified() { std::net::Ipv4Addr::LOCALHOST.into() } else { addr.ip() };
        format!("http://{}", std::net::SocketAddr::new(ip, addr.port()))
    };
    let mut c = socialgraph_gateway::Config::default();
    c.upstream.relation_url = url(dev.relation_addr);
    c.upstream.projection_url = url(dev.projection_addr);
    c.upstream.counter_url = url(dev.counter_addr);
    c.upstream.message_url = url(dev.message_addr);
    c.http.cors_allowed_origins = vec!["*".into()];
    c
}

/// `socialgraph dev` settings.
#[derive(Debug, clap::Args)]
pub struct DevArgs {
    /// The SQLite file (created when missing; holds all state across restarts).
    #[arg(long, default_value = "socialgraph-dev.sqlite")]
    pub data: PathBuf,
    /// RelationService listen address.
    #[arg(long, default_value = "127.0.0.1:50051")]
    pub relation_addr: SocketAddr,
    /// ProjectionService listen address.
    #[arg(long, default_value = "127.0.0.1:50052")]
    pub projection_addr: SocketAddr,
    /// CounterService listen address.
    #[arg(long, default_value = "127.0.0.1:50053")]
    pub counter_addr: SocketAddr,
    /// MessageService listen address.
    #[arg(long, default_value = "127.0.0.1:50054")]
    pub message_addr: SocketAddr,
    /// Admin HTTP listen address (/metrics, /ready, /live).
    #[arg(long, default_value = "127.0.0.1:9100")]
    pub admin_addr: SocketAddr,
    /// HTTP/JSON gateway listen address (every public RPC as a REST route, /openapi.json);
    /// it allows any browser origin, as the embedded mode is for local development.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub http_addr: SocketAddr,
    /// HMAC key of page tokens (default: the fixed development key).
    #[arg(long, env = "SG_AUTH__PAGE_TOKEN_SECRET", hide_env_values = true)]
    pub page_token_secret: Option<String>,
}
