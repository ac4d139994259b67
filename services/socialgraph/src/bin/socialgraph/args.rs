//! The command line of `socialgraph`, as clap parses it, and its conversion into the options
//! of the `socialgraph_cli` library.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use socialgraph_cli::commands::Paging;
use socialgraph_cli::generator::GenOptions;
use socialgraph_cli::likes::LikeOptions;
use socialgraph_cli::load::LoadOptions;
use socialgraph_cli::verify::VerifyOptions;
use socialgraph_cli::{EdgeFileOptions, EdgeFormat, Endpoints};

/// Client of the socialgraph mesh: bulk loads, queries, verification, graph generation.
#[derive(Debug, Parser)]
#[command(name = "socialgraph", version, about)]
pub struct Cli {
    #[command(flatten)]
    pub mesh: MeshArgs,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Command,
}

/// Where the services are.
#[derive(Debug, Args)]
pub struct MeshArgs {
    /// relation-svc gRPC endpoint.
    #[arg(long, global = true, env = "SG_RELATION_URL", default_value = "http://127.0.0.1:50051")]
    pub relation: String,
    /// projection-svc gRPC endpoint.
    #[arg(long, global = true, env = "SG_PROJECTION_URL", default_value = "http://127.0.0.1:50052")]
    pub projection: String,
    /// counter-svc gRPC endpoint.
    #[arg(long, global = true, env = "SG_COUNTER_URL", default_value = "http://127.0.0.1:50053")]
    pub counter: String,
    /// message-svc gRPC endpoint.
    #[arg(long, global = true, env = "SG_MESSAGE_URL", default_value = "http://127.0.0.1:50054")]
    pub message: String,
    /// Bearer token of admin RPCs (ImportFollows): relation-svc's auth.admin_token.
    #[arg(long, global = true, env = "SG_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
}

impl MeshArgs {
    /// The endpoints the library calls.
    pub fn endpoints(self) -> Endpoints {
        Endpoints {
            relation: self.relation,
            projection: self.projection,
            counter: self.counter,
            message: self.message,
            admin_token: self.admin_token,
        }
    }
}

/// The subcommands; each is one arm of `run` in `main.rs`.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve RelationService, ProjectionService and CounterService in this process on one
    /// SQLite file (the embedded mode; needs nothing else installed). Runs until SIGTERM or
    /// Ctrl-C.
    Dev(crate::dev::DevArgs),
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
    /// USER follows OTHER.
    Follow(PairArgs),
    /// USER stops following OTHER.
    Unfollow(PairArgs),
    /// USER blocks OTHER: the follows both ways end; neither can follow the other until unblocked.
    Block(PairArgs),
    /// USER lifts the block of OTHER (no follow comes back).
    Unblock(PairArgs),
    /// USER mutes OTHER (no follow changes).
    Mute(PairArgs),
    /// USER lifts the mute of OTHER.
    Unmute(PairArgs),
    /// USER removes its follower OTHER (OTHER's follow of USER ends).
    RemoveFollower(PairArgs),
    /// Accounts USER blocks, newest block first.
    Blocks {
        /// The user.
        #[arg(allow_negative_numbers = true)]
        user: i64,
        #[command(flatten)]
        paging: PagingArgs,
    },
    /// Accounts USER mutes, newest mute first.
    Mutes {
        /// The user.
        #[arg(allow_negative_numbers = true)]
        user: i64,
        #[command(flatten)]
        paging: PagingArgs,
    },
    /// Lock USER's account: follows of it become requests it approves.
    Lock(UserArg),
    /// Unlock USER's account, approving every pending request.
    Unlock(UserArg),
    /// Pending follow requests to USER (or, with --outgoing, from USER), newest first.
    Requests {
        /// The user.
        #[arg(allow_negative_numbers = true)]
        user: i64,
        /// The requests USER made.
        #[arg(long)]
        outgoing: bool,
        #[command(flatten)]
        paging: PagingArgs,
    },
    /// USER approves the pending requests of REQUESTERS (each becomes a follow).
    Approve {
        /// The locked account.
        #[arg(allow_negative_numbers = true)]
        user: i64,
        /// The requesters (any number; sent 1000 per request).
        #[arg(required = true, allow_negative_numbers = true)]
        requesters: Vec<i64>,
    },
    /// USER rejects the pending requests of REQUESTERS.
    Reject {
        /// The locked account.
        #[arg(allow_negative_numbers = true)]
        user: i64,
        /// The requesters (any number; sent 1000 per request).
        #[arg(required = true, allow_negative_numbers = true)]
        requesters: Vec<i64>,
    },
    /// An account's lifecycle: show, deactivate, reactivate, suspend, delete.
    #[command(subcommand)]
    Account(AccountCommand),
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
    /// AUTHOR publishes POST_ID (now, or at --at Unix seconds).
    Post {
        /// The author.
        #[arg(allow_negative_numbers = true)]
        author: i64,
        /// The post id (unique across authors).
        #[arg(allow_negative_numbers = true)]
        post_id: i64,
        /// Publication time, Unix seconds (default now).
        #[arg(long, allow_negative_numbers = true)]
        at: Option<i64>,
    },
    /// AUTHOR deletes POST_ID: it leaves every timeline.
    DeletePost {
        /// The author.
        #[arg(allow_negative_numbers = true)]
        author: i64,
        /// The post id.
        #[arg(allow_negative_numbers = true)]
        post_id: i64,
    },
    /// USER's home timeline, newest post first (oldest first with --min-post).
    Timeline {
        /// The user.
        #[arg(allow_negative_numbers = true)]
        user: i64,
        /// Catch up from post ID: the posts newer than it, oldest first, paging up to the newest.
        #[arg(long, value_name = "ID", allow_negative_numbers = true, value_parser = clap::value_parser!(i64).range(1..), conflicts_with = "since_post")]
        min_post: Option<i64>,
        /// The posts newer than post ID, newest first, paging down to it.
        #[arg(long, value_name = "ID", allow_negative_numbers = true, value_parser = clap::value_parser!(i64).range(1..))]
        since_post: Option<i64>,
        #[command(flatten)]
        paging: PagingArgs,
    },
    #[command(flatten)]
    Messages(crate::message_args::MessageCommand),
    /// projection-svc's progress per partition (offsets, high watermark, lag).
    Status,
    /// Check the mesh against an edge file: counters, follower lists, familiar followers.
    Verify(VerifyArgs),
    /// Write a seeded follow graph with skewed degrees as SNAP text.
    Gen(GenArgs),
}

/// What `account` does to USER.
#[derive(Debug, Subcommand)]
pub enum AccountCommand {
    /// Status and edge-job progress.
    Show(UserArg),
    /// Hide every follow of USER until it is reactivated.
    Deactivate(UserArg),
    /// Bring USER's follows back (with --admin-token also lifts a suspension).
    Reactivate(UserArg),
    /// Suspend USER (needs --admin-token).
    Suspend(UserArg),
    /// Delete USER for good: every follow ends; then the id is a new, empty account.
    Delete(UserArg),
}

/// One user.
#[derive(Debug, Args)]
pub struct UserArg {
    /// The user.
    #[arg(allow_negative_numbers = true)]
    pub user: i64,
}

/// The acting user and the other user of a change.
#[derive(Debug, Args)]
pub struct PairArgs {
    /// The acting user.
    #[arg(allow_negative_numbers = true)]
    pub user: i64,
    /// The other user.
    #[arg(allow_negative_numbers = true)]
    pub other: i64,
}

/// What `load` loads.
#[derive(Debug, Subcommand)]
pub enum LoadCommand {
    /// Follow edges (SNAP text or CSV, plain or .gz) through ImportFollows.
    Follows(LoadFollowsArgs),
    /// MovieLens ratings as likes and favourites.
    Likes(LoadLikesArgs),
    /// Posts (`author post_id unix_seconds` lines, or an activity stream `actor target
    /// unix_seconds kind` whose line numbers are the post ids) through PublishPost.
    /// Private messages (`sender recipient unix_seconds` lines, SNAP CollegeMsg) through
    /// SendMessage; each line's client id is its line number, so a re-run sends nothing twice.
    Messages {
        /// The messages file (plain or .gz).
        file: PathBuf,
        /// Clients sending at once (each owns a set of conversations).
        #[arg(long, default_value_t = 4)]
        concurrency: usize,
        /// No progress bar.
        #[arg(long)]
        no_progress: bool,
    },
    Posts {
        /// The posts file (plain or .gz).
        file: PathBuf,
        /// Publishes in flight at once.
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
        /// No progress bar.
        #[arg(long)]
        no_progress: bool,
    },
}

/// An edge file and how to read it (`load follows`, `verify`).
#[derive(Debug, Args)]
pub struct FileArgs {
    /// The edge file.
    pub file: PathBuf,
    /// Layout of the file.
    #[arg(long, value_enum, default_value_t = EdgeFormat::Auto)]
    pub format: EdgeFormat,
    /// Added to every id (files numbering users from 0 need 1).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub id_offset: i64,
}

impl FileArgs {
    /// How the library reads the file.
    pub fn options(&self) -> EdgeFileOptions {
        EdgeFileOptions { format: self.format, id_offset: self.id_offset }
    }
}

/// `load follows` settings.
#[derive(Debug, Args)]
pub struct LoadFollowsArgs {
    #[command(flatten)]
    pub file: FileArgs,
    /// Edges per ImportFollows message (at most 10000).
    #[arg(long, default_value_t = 10_000)]
    pub message_edges: usize,
    /// Concurrent ImportFollows streams.
    #[arg(long, default_value_t = 4)]
    pub streams: usize,
    /// No progress bar.
    #[arg(long)]
    pub no_progress: bool,
}

impl LoadFollowsArgs {
    /// How the library sends the edges.
    pub fn options(&self) -> LoadOptions {
        LoadOptions { message_edges: self.message_edges, streams: self.streams }
    }
}

/// `load likes` settings.
#[derive(Debug, Args)]
pub struct LoadLikesArgs {
    /// MovieLens ratings.csv (or .csv.gz).
    pub file: PathBuf,
    /// A rating at or above this is a like.
    #[arg(long, default_value_t = 4.0)]
    pub like_min: f64,
    /// A rating at or above this is also a favourite.
    #[arg(long, default_value_t = 5.0)]
    pub fav_min: f64,
    /// Entity type of the movies.
    #[arg(long, default_value = "movie")]
    pub entity_type: String,
    /// Toggles in flight at once.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// No progress bar.
    #[arg(long)]
    pub no_progress: bool,
}

impl LoadLikesArgs {
    /// How the library turns ratings into toggles.
    pub fn options(&self) -> LikeOptions {
        LikeOptions { like_min: self.like_min, fav_min: self.fav_min, entity_type: self.entity_type.clone(), concurrency: self.concurrency }
    }
}

/// Paging of the list subcommands.
#[derive(Debug, Args)]
pub struct PagingArgs {
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

/// `verify` settings.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    #[command(flatten)]
    pub file: FileArgs,
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

impl VerifyArgs {
    /// What the library samples and how long it waits.
    pub fn options(&self) -> VerifyOptions {
        VerifyOptions {
            sample_users: self.sample,
            sample_pairs: self.pairs.unwrap_or(self.sample),
            seed: self.seed,
            wait: Duration::from_secs(self.wait_secs),
            max_reported: self.max_report,
            ..VerifyOptions::default()
        }
    }
}

/// `gen` settings.
#[derive(Debug, Args)]
pub struct GenArgs {
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
    pub out: PathBuf,
}

impl GenArgs {
    /// The graph the library generates.
    pub fn options(&self) -> GenOptions {
        GenOptions { users: self.users, edges: self.edges, seed: self.seed }
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
