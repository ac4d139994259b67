//! `load follows`: a [`FollowGraph`] streamed to relation-svc's ImportFollows.
//!
//! The graph is already free of self-loops and repeats (see [`crate::edges`]), so the server
//! sees each edge once; its `skipped_duplicates` then counts edges that were already followed
//! (an earlier load). Edges are cut into messages of up to 10,000 (the server's limit) and
//! spread round-robin over one or more concurrent streams; every edge carries its
//! `followed_at`, so the order in which streams commit changes nothing.

use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use indicatif::ProgressBar;
use serde::Serialize;
use socialgraph_domain::timestamp_from_ms;
use socialgraph_proto::relation::v1::{ImportEdge, ImportFollowsRequest, ImportFollowsResponse};

use crate::edges::{FileEdge, FollowGraph};
use crate::endpoints::{Endpoints, RELATION};
use crate::error::{CliError, CliResult};

/// Most edges the server accepts in one ImportFollows message.
pub const MAX_MESSAGE_EDGES: usize = 10_000;

/// How to stream the edges.
#[derive(Debug, Clone, Copy)]
pub struct LoadOptions {
    /// Edges per message, 1..=10,000.
    pub message_edges: usize,
    /// Concurrent ImportFollows streams, ≥ 1.
    pub streams: usize,
}

impl Default for LoadOptions {
    /// 10,000 edges per message on 4 streams.
    fn default() -> Self {
        Self { message_edges: MAX_MESSAGE_EDGES, streams: 4 }
    }
}

/// What a load did: the file's counts and the server's.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct LoadSummary {
    /// Lines of the file.
    pub lines_read: u64,
    /// Lines that named an edge.
    pub edge_lines: u64,
    /// Self-loops skipped (not sent).
    pub self_loops_skipped: u64,
    /// Repeats of an earlier pair of the file skipped (not sent; the first occurrence wins).
    pub duplicates_skipped: u64,
    /// CSV rows with a rating ≤ 0 skipped (not follows).
    pub not_follows_skipped: u64,
    /// Edges sent to relation-svc.
    pub edges_sent: u64,
    /// Edges that became follows (new; one event each).
    pub edges_loaded: u64,
    /// Edges sent that were already followed (kept with their earlier follow time).
    pub already_followed: u64,
    /// Seconds reading and parsing the file (set by the caller that read it).
    pub read_secs: f64,
    /// Seconds from the first message to the server's answer.
    pub elapsed_secs: f64,
    /// `edges_sent / elapsed_secs`.
    pub edges_per_sec: f64,
}

fn message(edges: &[FileEdge]) -> ImportFollowsRequest {
    ImportFollowsRequest {
        edges: edges
            .iter()
            .map(|e| ImportEdge { follower_id: e.follower_id, followee_id: e.followee_id, followed_at: Some(timestamp_from_ms(e.followed_at_ms)) })
            .collect(),
    }
}

/// Streams the edges of `graph` to relation-svc (admin token from `endpoints`); `progress`
/// advances by the edges of each message as the transport takes it.
///
/// # Errors
/// [`CliError::Connect`]; [`CliError::Rpc`] when the server ends a stream with an error
/// (messages before it stay written: a re-run skips them as already followed);
/// [`CliError::Usage`] for options out of range.
pub async fn load_follows(endpoints: &Endpoints, graph: &FollowGraph, opts: LoadOptions, progress: &ProgressBar) -> CliResult<LoadSummary> {
    if !(1..=MAX_MESSAGE_EDGES).contains(&opts.message_edges) || opts.streams == 0 {
        return Err(CliError::Usage(format!("edges per message must be 1..={MAX_MESSAGE_EDGES} and streams >= 1")));
    }
    let client = endpoints.relation().await?;
    let edges: Arc<[FileEdge]> = graph.edges.as_slice().into();
    let size = opts.message_edges;
    let messages = edges.len().div_ceil(size);
    let streams = opts.streams.min(messages.max(1));
    progress.set_length(edges.len() as u64);
    let start = Instant::now();
    let calls = (0..streams).map(|s| {
        let (edges, progress, mut client) = (Arc::clone(&edges), progress.clone(), client.clone());
        let body = futures::stream::iter((s..messages).step_by(streams)).map(move |m| {
            let chunk = &edges[m * size..((m + 1) * size).min(edges.len())];
            progress.inc(chunk.len() as u64);
            message(chunk)
        });
        let request = endpoints.admin_request(body);
        async move { client.import_follows(request?).await.map(|r| r.into_inner()).map_err(|s| CliError::rpc(RELATION, s)) }
    });
    let answers: Vec<ImportFollowsResponse> = futures::future::try_join_all(calls).await?;
    let elapsed = start.elapsed().as_secs_f64();
    progress.finish();
    let s = graph.stats;
    let sent = edges.len() as u64;
    Ok(LoadSummary {
        lines_read: s.lines_read,
        edge_lines: s.edge_lines,
        self_loops_skipped: s.self_loops,
        duplicates_skipped: s.duplicates,
        not_follows_skipped: s.not_follows,
        edges_sent: sent,
        edges_loaded: answers.iter().map(|a| a.imported.max(0) as u64).sum(),
        already_followed: answers.iter().map(|a| a.skipped_duplicates.max(0) as u64).sum(),
        read_secs: 0.0,
        elapsed_secs: elapsed,
        edges_per_sec: if elapsed > 0.0 { sent as f64 / elapsed } else { 0.0 },
    })
}
