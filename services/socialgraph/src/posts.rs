//! Posts through FeedService: `post`, `delete-post`, `timeline` and `load posts FILE`.
//!
//! `load posts` reads either `author_id post_id unix_seconds` lines or an activity stream of
//! `actor target unix_seconds kind` lines (SNAP higgs-activity), where each line is a post by
//! its actor at its time whose post id is the line number (1-based). Blank lines and `#`
//! comments are skipped; gzip or plain. PublishPost is idempotent by post id, so a re-run
//! changes nothing, and transient failures are retried (exponential backoff, at most 8 times).

use std::path::Path;
use std::time::{Duration, Instant};

use backon::Retryable;
use futures::StreamExt;
use indicatif::ProgressBar;
use serde::Serialize;
use socialgraph_proto::feed::v1::feed_service_client::FeedServiceClient;
use socialgraph_proto::feed::v1::{GetTimelineRequest, PublishPostRequest, TimelinePost};
use tonic::Code;
use tonic::transport::Channel;

use crate::endpoints::{Endpoints, PROJECTION};
use crate::error::{CliError, CliResult};
use crate::input::{for_each_line, line_error, open};

/// One post to publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Post {
    /// The author (> 0).
    pub author_id: i64,
    /// The post (> 0).
    pub post_id: i64,
    /// Publication time, ms since the epoch.
    pub created_at_ms: i64,
}

/// Reads a posts file (see the module documentation).
///
/// # Errors
/// [`CliError::Io`]; [`CliError::Input`] naming the first bad line.
pub fn read_posts(path: &Path) -> CliResult<Vec<Post>> {
    parse_posts(open(path)?, &path.display().to_string())
}

/// Parses posts from `reader`; `name` names it in errors.
///
/// # Errors
/// [`CliError::Input`] naming the first bad line.
pub fn parse_posts(reader: impl std::io::BufRead, name: &str) -> CliResult<Vec<Post>> {
    let mut out = Vec::new();
    for_each_line(reader, name, |index, line| {
        let bad = |message: String| line_error(name, index, message);
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            return Ok(());
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        let id = |s: &str, what: &str| match s.parse::<i64>() {
            Ok(v) if v > 0 => Ok(v),
            _ => Err(bad(format!("{what} {s:?} is not an id > 0"))),
        };
        let seconds = |s: &str| match s.parse::<i64>() {
            Ok(v) if v >= 0 => Ok(v.saturating_mul(1000)),
            _ => Err(bad(format!("time {s:?} is not Unix seconds ≥ 0"))),
        };
        let post = match f.as_slice() {
            [author, post, at] => Post { author_id: id(author, "author_id")?, post_id: id(post, "post_id")?, created_at_ms: seconds(at)? },
            [actor, _target, at, _kind] => {
                Post { author_id: id(actor, "actor")?, post_id: i64::try_from(index + 1).unwrap_or(i64::MAX), created_at_ms: seconds(at)? }
            }
            _ => return Err(bad(format!("expected `author_id post_id unix_seconds` or `actor target unix_seconds kind`, got {line:?}"))),
        };
        out.push(post);
        Ok(())
    })?;
    Ok(out)
}

/// What a posts load did.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct PostSummary {
    /// Posts read and published.
    pub posts: u64,
    /// Seconds from the first publish to the last answer.
    pub elapsed_secs: f64,
    /// `posts / elapsed_secs`.
    pub posts_per_sec: f64,
}

fn transient(s: &tonic::Status) -> bool {
    matches!(s.code(), Code::Unavailable | Code::ResourceExhausted | Code::DeadlineExceeded)
}

/// Publishes one post, retrying transient failures.
///
/// # Errors
/// [`CliError::Rpc`] for a refusal or a failure that outlived the retries.
pub async fn publish(client: &FeedServiceClient<Channel>, p: Post) -> CliResult<()> {
    let backoff =
        backon::ExponentialBuilder::default().with_min_delay(Duration::from_millis(50)).with_max_delay(Duration::from_secs(2)).with_max_times(8);
    let call = || async {
        let req = PublishPostRequest {
            author_id: p.author_id,
            post_id: p.post_id,
            created_at: Some(socialgraph_domain::timestamp_from_ms(p.created_at_ms)),
        };
        client.clone().publish_post(req).await
    };
    call.retry(backoff).when(transient).await.map(|_| ()).map_err(|s| CliError::rpc(PROJECTION, s))
}

/// Publishes `posts` with `concurrency` calls in flight; `bar` counts posts done.
///
/// # Errors
/// [`CliError::Connect`]; [`CliError::Rpc`] for the first post that failed.
pub async fn load_posts(endpoints: &Endpoints, posts: &[Post], concurrency: usize, bar: &ProgressBar) -> CliResult<PostSummary> {
    let client = endpoints.feed().await?;
    bar.set_length(posts.len() as u64);
    let started = Instant::now();
    let mut results = futures::stream::iter(posts.iter().copied()).map(|p| publish(&client, p)).buffer_unordered(concurrency.max(1));
    while let Some(r) = results.next().await {
        r?;
        bar.inc(1);
    }
    bar.finish_and_clear();
    let elapsed_secs = started.elapsed().as_secs_f64();
    Ok(PostSummary { posts: posts.len() as u64, elapsed_secs, posts_per_sec: posts.len() as f64 / elapsed_secs.max(1e-9) })
}

/// Which way a timeline read walks: GetTimeline's `min_post_id` (posts newer than it, oldest
/// first) or `since_post_id` (newer than it, newest first); both 0 for the newest first walk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TimelineWalk {
    /// Walk up from this post (0: unset).
    pub min_post_id: i64,
    /// Walk down to this post (0: unset).
    pub since_post_id: i64,
}

/// One page (or, with `all`, every page from `token` on) of `user_id`'s timeline along `walk`.
///
/// # Errors
/// [`CliError::Connect`]; [`CliError::Rpc`].
pub async fn timeline(
    endpoints: &Endpoints,
    user_id: i64,
    walk: TimelineWalk,
    page_size: i32,
    token: String,
    all: bool,
) -> CliResult<(Vec<TimelinePost>, String)> {
    let mut client = endpoints.feed().await?;
    let (mut posts, mut token) = (Vec::new(), token);
    loop {
        let req = GetTimelineRequest { user_id, page_size, page_token: token, min_post_id: walk.min_post_id, since_post_id: walk.since_post_id };
        let page = client.get_timeline(req).await.map_err(|s| CliError::rpc(PROJECTION, s))?.into_inner();
        posts.extend(page.posts);
        token = page.next_page_token;
        if !all || token.is_empty() {
            return Ok((posts, token));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_formats_parse_and_bad_lines_are_named() {
        let text = "# posts\n7 70 1341100972\n\n223789 213163 1341100972 MT\n";
        let posts = parse_posts(text.as_bytes(), "t").unwrap();
        assert_eq!(
            posts,
            [
                Post { author_id: 7, post_id: 70, created_at_ms: 1_341_100_972_000 },
                Post { author_id: 223_789, post_id: 4, created_at_ms: 1_341_100_972_000 }
            ]
        );
        let err = parse_posts("1 2\n".as_bytes(), "t").unwrap_err().to_string();
        assert!(err.starts_with("t:1:"), "{err}");
        let err = parse_posts("1 0 5\n".as_bytes(), "t").unwrap_err().to_string();
        assert!(err.contains("post_id"), "{err}");
    }
}
