//! Benchmarks of the socialgraph services against the local PostgreSQL, Redis and broker, each
//! printed beside a raw baseline of the same work done directly on the backing store, with the
//! ratio service/raw.
//!
//! `cargo run --release -p socialgraph-integration-tests --bin bench -- all`, or one part:
//! `relation`, `projection`, `counters`, `likes`, `import`, `idle`, `cache`, `feeds`, `messages`, `sustained` (`--help`
//! lists each part's knobs).
//!
//! It prints numbers and asserts nothing. Every loop is bounded in count and in time, and all
//! traffic goes to 127.0.0.1. Databases and Redis keys it creates are removed at the end of
//! their part; topics stay, as the tests' do (a DeleteTopics on the tansu 0.6 broker was once
//! followed by a panic of its storage task, which left the broker unusable until restarted).
//!
//! This file holds the command line and the dispatch; each part lives in its own module, on the
//! shared [`report`] (tables, percentiles, ratios), [`load`] (load generators) and [`backends`]
//! (broker and Redis) helpers.

mod backends;
mod cache;
mod cache_followers;
mod cache_joins;
mod cache_throughput;
mod counters;
mod falkordb;
mod feeds;
mod floor;
mod idle;
mod import;
mod likes;
mod load;
mod memory;
mod messages;
mod projection;
mod raw;
mod relation;
mod report;
mod soak;
mod sustained;

use std::time::Instant;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "bench", about = "socialgraph benchmarks: each service beside a raw baseline of the same work")]
struct Cli {
    #[command(subcommand)]
    part: Part,
    /// Run the in-process services under a plain log subscriber (warn) instead of the services'
    /// telemetry (whose OpenTelemetry layer turns every span of every level into an OTel span),
    /// to see what that costs.
    #[arg(long, global = true)]
    plain_tracing: bool,
}

#[derive(Subcommand)]
enum Part {
    /// Follow RPC vs the same transaction on PostgreSQL; relay vs direct produce.
    Relation(RelationArgs),
    /// Follow → ListFollowers propagation; consumer apply vs raw fetch.
    Projection(ProjectionArgs),
    /// User counter reads vs redis-benchmark.
    Counters(CountersArgs),
    /// Like RPC vs the raw Lua toggle; entity count reads vs MGET; memory per liked MovieLens
    /// movie.
    Likes(LikesArgs),
    /// Redis memory per user counter (vs a 5-field hash) and per like at three densities (vs a
    /// plain set and a plain bitmap); needs only Redis.
    Memory(MemoryArgs),
    /// A follow graph through ImportFollows into the whole mesh vs COPY; time to lag 0 and to
    /// right counters.
    Import(ImportArgs),
    /// Follows at a fixed rate for a long time: errors, lag and memory (RSS) at start and end.
    Sustained(SustainedArgs),
    /// CPU of the broker and of the services while the mesh receives nothing.
    Idle(IdleArgs),
    /// The fault catalogue's mixed workload at 80 % of the sustainable rate for ten minutes,
    /// a fault every minute; then every view against the source of truth.
    Soak(SoakArgs),
    /// Following pages and relationship batches with the following-list cache warm, cold and
    /// off, beside ZREVRANGE/ZMSCORE and PostgreSQL.
    Cache(CacheArgs),
    /// Publish throughput, inbox writes per post and fan-out rate at pull thresholds of 100,
    /// 1,000 and 100,000 (vs a Redis ZADD pipeline); GetTimeline vs ZREVRANGE and a SQL pull.
    Feeds(FeedsArgs),
    /// SendMessage vs the raw transaction; ListConversations of a user with 1,000
    /// conversations; a send to a group of 500 until counter-svc shows every member's unread.
    Messages(MessagesArgs),
    /// Every part, in order, with default settings (the sustained run included).
    All,
}

#[derive(Parser, Clone)]
struct RelationArgs {
    /// Follows per run (random distinct edges).
    #[arg(long, default_value_t = 20_000)]
    follows: usize,
    /// Concurrent callers.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Longest time one closed-loop run may take.
    #[arg(long, default_value_t = 120)]
    max_secs: u64,
    /// Outbox rows loaded with ImportFollows for the relay measurement.
    #[arg(long, default_value_t = 100_000)]
    relay_rows: usize,
}

#[derive(Parser, Clone)]
struct ProjectionArgs {
    /// Offered follow rates (follows/s), open loop.
    #[arg(long, value_delimiter = ',', default_values_t = [200u32, 2000])]
    rates: Vec<u32>,
    /// Seconds each rate is offered.
    #[arg(long, default_value_t = 10)]
    secs: u64,
    /// Measure the propagation of every n-th follow.
    #[arg(long, default_value_t = 10)]
    sample_every: u64,
    /// Events in the pre-filled topic of the apply-throughput measurement.
    #[arg(long, default_value_t = 500_000)]
    events: usize,
}

#[derive(Parser, Clone)]
struct CountersArgs {
    /// Users whose counters are read.
    #[arg(long, default_value_t = 10_000)]
    users: i64,
    /// Concurrent callers.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Seconds of each read run.
    #[arg(long, default_value_t = 10)]
    secs: u64,
}

#[derive(Parser, Clone)]
struct MemoryArgs {
    /// Users of the user counter measurement.
    #[arg(long, default_value_t = 1_000_000)]
    users: i64,
}

#[derive(Parser, Clone)]
struct LikesArgs {
    /// Entities (`post`) the likes go to.
    #[arg(long, default_value_t = 2_000)]
    entities: i64,
    /// Most likes of the Like run (distinct actor/entity pairs).
    #[arg(long, default_value_t = 200_000)]
    likes: usize,
    /// Concurrent callers.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Seconds of each run.
    #[arg(long, default_value_t = 10)]
    secs: u64,
    /// MovieLens ratings (gzip CSV userId,movieId,rating,timestamp).
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/data/ml-latest-small/ratings.csv.gz"))]
    movielens: String,
}

#[derive(Parser, Clone)]
struct ImportArgs {
    /// The edge list (SNAP text, gzip or not).
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/data/soc-Slashdot0902.txt.gz"))]
    file: String,
}

#[derive(Parser, Clone)]
struct CacheArgs {
    /// The edge list (SNAP text, gzip or not).
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/data/soc-Slashdot0902.txt.gz"))]
    file: String,
    /// Reads per measured row.
    #[arg(long, default_value_t = 2_000)]
    reads: usize,
    /// Seconds of each throughput run (warm BatchGetRelationships, ZMSCORE, the bare server).
    #[arg(long, default_value_t = 10)]
    secs: u64,
    /// A FalkorDB to run the same warm reads on (`redis://127.0.0.1:6390`, started by
    /// scripts/falkordb.sh); empty: not measured.
    #[arg(long, env = "SG_BENCH_FALKORDB_URL", default_value = "")]
    falkordb_url: String,
}

#[derive(Parser, Clone)]
struct FeedsArgs {
    /// Posts published.
    #[arg(long, default_value_t = 4_400)]
    posts: usize,
    /// PublishPost calls in flight.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// GetTimeline reads per measured row.
    #[arg(long, default_value_t = 1_000)]
    reads: usize,
}

#[derive(Parser, Clone)]
struct MessagesArgs {
    /// Sends of the throughput run.
    #[arg(long, default_value_t = 20_000)]
    sends: usize,
    /// Users the sends go between (random pairs).
    #[arg(long, default_value_t = 10_000)]
    users: i64,
    /// Concurrent callers.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Longest time one closed-loop run may take.
    #[arg(long, default_value_t = 120)]
    max_secs: u64,
    /// ListConversations reads.
    #[arg(long, default_value_t = 2_000)]
    reads: usize,
    /// Sends to the group of 500.
    #[arg(long, default_value_t = 10)]
    group_rounds: usize,
}

#[derive(Parser, Clone)]
struct IdleArgs {
    /// Seconds measured in each configuration.
    #[arg(long, default_value_t = 30)]
    secs: u64,
}

#[derive(Parser, Clone)]
struct SustainedArgs {
    /// Seconds of the run.
    #[arg(long, default_value_t = 600)]
    secs: u64,
    /// Offered follows/s; 0 = 80 % of the rate a 10 s closed-loop run sustains first.
    #[arg(long, default_value_t = 0)]
    rate: u32,
}

#[derive(Parser, Clone)]
struct SoakArgs {
    /// Seconds of the run.
    #[arg(long, default_value_t = 600)]
    secs: u64,
    /// Seconds between two faults.
    #[arg(long, default_value_t = 60)]
    fault_every: u64,
    /// Offered ops/s; 0 = 80 % of the end-to-end rate of a 10 s closed-loop run and its drain.
    #[arg(long, default_value_t = 0)]
    rate: u32,
    /// Users who follow each other and toggle likes.
    #[arg(long, default_value_t = 2_000)]
    users: i64,
}

fn defaults<T: Parser>() -> T {
    T::parse_from(["bench"])
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if cli.plain_tracing {
        // The services' telemetry init then finds a subscriber in place and leaves it.
        let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().init();
        println!("(plain tracing: the services run without their OpenTelemetry layer)");
    }
    let started = Instant::now();
    let load_at_start = report::load_average();
    match cli.part {
        Part::Relation(a) => relation::run(&a).await?,
        Part::Projection(a) => projection::run(&a).await?,
        Part::Counters(a) => counters::run(&a).await?,
        Part::Likes(a) => likes::run(&a).await?,
        Part::Memory(a) => memory::run(&a).await?,
        Part::Import(a) => import::run(&a).await?,
        Part::Idle(a) => idle::run(&a).await?,
        Part::Cache(a) => cache::run(&a).await?,
        Part::Sustained(a) => sustained::run(&a).await?,
        Part::Soak(a) => soak::run(&a).await?,
        Part::Feeds(a) => feeds::run(&a).await?,
        Part::Messages(a) => messages::run(&a).await?,
        Part::All => {
            relation::run(&defaults()).await?;
            projection::run(&defaults()).await?;
            counters::run(&defaults()).await?;
            likes::run(&defaults()).await?;
            memory::run(&defaults()).await?;
            import::run(&defaults()).await?;
            idle::run(&defaults()).await?;
            cache::run(&defaults()).await?;
            feeds::run(&defaults()).await?;
            messages::run(&defaults()).await?;
            sustained::run(&defaults()).await?;
        }
    }
    report::print_summary(&load_at_start);
    println!("\ntotal bench time {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}
