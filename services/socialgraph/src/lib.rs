//! The `socialgraph` command line as a library: bulk loads of follow edge lists and MovieLens
//! ratings, the mesh's reads, verification of the mesh against a file, and a seeded graph
//! generator. Integration tests call the same functions the binary does.
//!
//! Every call talks gRPC to relation-svc, projection-svc and counter-svc at the
//! [`Endpoints`](endpoints::Endpoints) given; errors are [`CliError`](error::CliError)s whose
//! `Display` is one line (for a server error: service, gRPC code, message and details).

// Tests may unwrap: a panic is how they fail.
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

/// `println!` that ignores a closed standard output (`socialgraph … | head`), where
/// `println!` would panic.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

pub mod commands;
pub mod edges;
pub mod endpoints;
pub mod error;
pub mod generator;
pub mod graph;
pub mod input;
pub mod likes;
pub mod load;
pub mod messages;
pub mod output;
pub mod posts;
pub mod query;
pub mod rng;
pub mod verify;
pub mod writes;

pub use edges::{EdgeFileOptions, EdgeFormat, FollowGraph, read_follow_file};
pub use endpoints::Endpoints;
pub use error::{CliError, CliResult};
