//! `socialgraph`: the command line of the socialgraph mesh. Each subcommand is one variant of
//! [`Command`] and one arm of [`run`]; the work is in the `socialgraph_cli` library.
//!
//! Exit status: 0 success, 1 an error (one line on standard error), 2 bad usage, 3 `verify`
//! found mismatches.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use socialgraph_cli::commands::{self, Paging};
use socialgraph_cli::generator::GenOptions;
use socialgraph_cli::likes::LikeOptions;
use socialgraph_cli::load::LoadOptions;
use socialgraph_cli::query::ListQuery;
use socialgraph_cli::verify::VerifyOptions;
use socialgraph_cli::{CliResult, EdgeFileOptions, EdgeFormat, Endpoints};

/// Client of the socialgraph mesh: bulk loads, queries, verification, graph generation.
#[derive(Debug, Parser)]
#[command(name = "socialgraph", version, about)]
struct Cli {
    #[command(flatten)]
    mesh: MeshArgs,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

/// Where the services are.
#[derive(Debug, Args)]
struct MeshArgs {
    /// relation-svc gRPC endpoint.
    #[arg(long, global = true, env = "SG_RELATION_URL", default_value = "http://127.0.0.1:50051")]
    relation: String,
    /// projection-svc gRPC endpoint.
    #[arg(long, global = true, env = "SG_PROJECTION_URL", default_value = "http://127.0.0.1:50052")]
    projection: String,
    /// counter-svc gRPC endpoint.
    #[arg(long, global = true, env = "SG_COUNTER_URL", default_value = "http://127.0.0.1:50053")]
    counter: String,
    /// Bearer token of admin RPCs (ImportFollows): relation-svc's auth.admin_token.
    #[arg(long, global = true, env = "SG_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve RelationService, ProjectionService and CounterService in this process on one
    /// SQLite file (the embedded mode; needs nothing else installed). Runs until SIGTERM or
    /// Ctrl-C.
    Dev(DevArgs),
    /// Bulk-load a file into the mesh.
    #[command(subcommand)]
    Load(LoadCommand),
    /// Accounts USER follows, newest first.
    Following {
        /// The user.
        #[arg(allow_negative_numbers = true)]
        user: i64,
        #[command(flatten)]
        paging: PagingArgs,
    },
    /// Accounts following USER, newest first.
    Followers {
        /// The user.
        #[arg(allow_negative_numbers = true)]
        user: i64,
        #[command(flatten)]
        paging: PagingArgs,
    },
    /// Both directions between USER and each OTHER.
    Relationship {
        /// The point of view.
        #[arg(allow_negative_numbers = true)]
        user: i64,
        /// Other users (any number; sent 1000 per request).
        #[arg(required = true, allow_negative_numbers = true)]
        others: Vec<i64>,
    },
    /// Accounts both USER and OTHER follow, in USER's follow order.
    Common {
        /// First user.
        #[arg(allow_negative_numbers = true)]
        user: i64,
        /// Second user.
        #[arg(allow_negative_numbers = true)]
        other: i64,
        #[command(flatten)]
        paging: PagingArgs,
    },
    /// Accounts VIEWER follows that follow USER ("followed by people you know").
    Familiar {
        /// Whose acquaintances.
        #[arg(allow_negative_numbers = true)]
        viewer: i64,
        /// Whose followers.
        #[arg(allow_negative_numbers = true)]
        user: i64,
        #[command(flatten)]
        paging: PagingArgs,
    },
    /// Followings, followers, posts, likes and favs received of each USER.
    Counters {
        /// Users (any number; sent 1000 per request).
        #[arg(required = true, allow_negative_numbers = true)]
        users: Vec<i64>,
    },
    /// Like and fav counts of entities of one type.
    EntityCounts {
        /// Entity type, e.g. `movie` or `post`.
        entity_type: String,
        /// Entity ids.
        #[arg(required = true, allow_negative_numbers = true)]
        ids: Vec<i64>,
    },
    /// projection-svc's progress per partition (offsets, high watermark, lag).
    Status,
    /// Check the mesh against an edge file: counters, follower lists, familiar followers.
    Verify(VerifyArgs),
    /// Write a seeded follow graph with skewed degrees as SNAP text.
    Gen(GenArgs),
}

#[derive(Debug, Subcommand)]
enum LoadCommand {
    /// Follow edges (SNAP text or CSV, plain or .gz) through ImportFollows.
    Follows(LoadFollowsArgs),
    /// MovieLens ratings as likes and favourites.
    Likes(LoadLikesArgs),
}

#[derive(Debug, Args)]
struct FileArgs {
    /// The edge file.
    file: PathBuf,
    /// Layout of the file.
    #[arg(long, value_enum, default_value_t = EdgeFormat::Auto)]
    format: EdgeFormat,
    /// Added to every id (files numbering users from 0 need 1).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    id_offset: i64,
}

impl FileArgs {
    fn options(&self) -> EdgeFileOptions {
        EdgeFileOptions { format: self.format, id_offset: self.id_offset }
    }
}

#[derive(Debug, Args)]
struct LoadFollowsArgs {
    #[command(flatten)]
    file: FileArgs,
    /// Edges per ImportFollows message (at most 10000).
    #[arg(long, default_value_t = 10_000)]
    message_edges: usize,
    /// Concurrent ImportFollows streams.
    #[arg(long, default_value_t = 4)]
    streams: usize,
    /// No progress bar.
    #[arg(long)]
    no_progress: bool,
}

#[derive(Debug, Args)]
struct LoadLikesArgs {
    /// MovieLens ratings.csv (or .csv.gz).
    file: PathBuf,
    /// A rating at or above this is a like.
    #[arg(long, default_value_t = 4.0)]
    like_min: f64,
    /// A rating at or above this is also a favourite.
    #[arg(long, default_value_t = 5.0)]
    fav_min: f64,
    /// Entity type of the movies.
    #[arg(long, default_value = "movie")]
    entity_type: String,
    /// Toggles in flight at once.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// No progress bar.
    #[arg(long)]
    no_progress: bool,
}

#[derive(Debug, Args)]
struct PagingArgs {
    /// Entries per page (server default 50, at most 1000; 1000 with --all).
    #[arg(long)]
    page_size: Option<i32>,
    /// Start at this next page token.
    #[arg(long, default_value = "")]
    page_token: String,
    /// Fetch every page.
    #[arg(long)]
    all: bool,
}

impl From<PagingArgs> for Paging {
    fn from(p: PagingArgs) -> Self {
        Paging { page_size: p.page_size, page_token: p.page_token, all: p.all }
    }
}

#[derive(Debug, Args)]
struct VerifyArgs {
    #[command(flatten)]
    file: FileArgs,
    /// Users whose follower lists are compared.
    #[arg(long, default_value_t = 200)]
    sample: usize,
    /// (viewer, user) pairs whose familiar followers are compared [default: --sample].
    #[arg(long)]
    pairs: Option<usize>,
    /// Seed of the samples.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Seconds to wait for the projection to catch up, and again for counters and lists.
    #[arg(long, default_value_t = 300)]
    wait_secs: u64,
    /// Mismatch lines printed (all are counted).
    #[arg(long, default_value_t = 20)]
    max_report: usize,
}

#[derive(Debug, Args)]
struct GenArgs {
    /// Users (ids 1..=N).
    #[arg(long, default_value_t = 7_000)]
    users: u64,
    /// Edges.
    #[arg(long, default_value_t = 100_000)]
    edges: u64,
    /// Seed; the same seed writes the same file.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Output file.
    out: PathBuf,
}

/// `socialgraph dev` settings.
#[derive(Debug, Args)]
struct DevArgs {
    /// The SQLite file (created when missing; holds all state across restarts).
    #[arg(long, default_value = "socialgraph-dev.sqlite")]
    data: PathBuf,
    /// RelationService listen address.
    #[arg(long, default_value = "127.0.0.1:50051")]
    relation_addr: std::net::SocketAddr,
    /// ProjectionService listen address.
    #[arg(long, default_value = "127.0.0.1:50052")]
    projection_addr: std::net::SocketAddr,
    /// CounterService listen address.
    #[arg(long, default_value = "127.0.0.1:50053")]
    counter_addr: std::net::SocketAddr,
    /// Admin HTTP listen address (/metrics, /ready, /live).
    #[arg(long, default_value = "127.0.0.1:9100")]
    admin_addr: std::net::SocketAddr,
    /// HMAC key of page tokens (default: the fixed development key).
    #[arg(long, env = "SG_AUTH__PAGE_TOKEN_SECRET", hide_env_values = true)]
    page_token_secret: Option<String>,
}

/// Default bearer token of the embedded mode's admin RPCs when `--admin-token` is not given.
const DEV_ADMIN_TOKEN: &str = "dev-admin-token";

/// Runs the embedded mesh until SIGTERM or Ctrl-C.
async fn dev(a: DevArgs, admin_token: Option<String>) -> anyhow::Result<()> {
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

async fn run(cli: Cli) -> CliResult<ExitCode> {
    let m = cli.mesh;
    let dev_admin_token = m.admin_token.clone();
    let endpoints = Endpoints { relation: m.relation, projection: m.projection, counter: m.counter, admin_token: m.admin_token };
    let json = cli.json;
    match cli.command {
        Command::Dev(a) => {
            if let Err(e) = dev(a, dev_admin_token).await {
                eprintln!("error: socialgraph dev: {e:#}");
                return Ok(ExitCode::FAILURE);
            }
        }
        Command::Load(LoadCommand::Follows(a)) => {
            let opts = LoadOptions { message_edges: a.message_edges, streams: a.streams };
            commands::load_follows(&endpoints, &a.file.file, a.file.options(), opts, json, !a.no_progress).await?;
        }
        Command::Load(LoadCommand::Likes(a)) => {
            let opts = LikeOptions { like_min: a.like_min, fav_min: a.fav_min, entity_type: a.entity_type, concurrency: a.concurrency };
            commands::load_likes(&endpoints, &a.file, &opts, json, !a.no_progress).await?;
        }
        Command::Following { user, paging } => commands::list(&endpoints, ListQuery::Following { user_id: user }, paging.into(), json).await?,
        Command::Followers { user, paging } => commands::list(&endpoints, ListQuery::Followers { user_id: user }, paging.into(), json).await?,
        Command::Common { user, other, paging } => {
            commands::list(&endpoints, ListQuery::Common { user_id: user, other_user_id: other }, paging.into(), json).await?;
        }
        Command::Familiar { viewer, user, paging } => {
            commands::list(&endpoints, ListQuery::Familiar { viewer_id: viewer, user_id: user }, paging.into(), json).await?;
        }
        Command::Relationship { user, others } => commands::relationship(&endpoints, user, &others, json).await?,
        Command::Counters { users } => commands::counters(&endpoints, &users, json).await?,
        Command::EntityCounts { entity_type, ids } => commands::entity_counts(&endpoints, &entity_type, &ids, json).await?,
        Command::Status => commands::status(&endpoints, json).await?,
        Command::Verify(a) => {
            let opts = VerifyOptions {
                sample_users: a.sample,
                sample_pairs: a.pairs.unwrap_or(a.sample),
                seed: a.seed,
                wait: Duration::from_secs(a.wait_secs),
                max_reported: a.max_report,
                ..VerifyOptions::default()
            };
            if !commands::verify(&endpoints, &a.file.file, a.file.options(), &opts, json).await? {
                return Ok(ExitCode::from(3));
            }
        }
        Command::Gen(a) => commands::generate_file(&a.out, GenOptions { users: a.users, edges: a.edges, seed: a.seed }, json)?,
    }
    Ok(ExitCode::SUCCESS)
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn endpoints_default_to_the_design_ports_and_take_options_anywhere() {
        let cli = Cli::try_parse_from(["socialgraph", "followers", "7", "--relation", "http://r:1", "--json"]).unwrap();
        assert_eq!(cli.mesh.relation, "http://r:1");
        assert!(cli.json);
        let cli = Cli::try_parse_from(["socialgraph", "status"]).unwrap();
        if std::env::var_os("SG_PROJECTION_URL").is_none() {
            assert_eq!(cli.mesh.projection, "http://127.0.0.1:50052");
        }
        let cli = Cli::try_parse_from(["socialgraph", "load", "follows", "f.txt.gz", "--id-offset", "1"]).unwrap();
        assert!(matches!(cli.command, Command::Load(LoadCommand::Follows(ref a)) if a.file.id_offset == 1));
    }
}
