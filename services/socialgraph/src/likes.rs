//! `load likes`: MovieLens ratings (`userId,movieId,rating,timestamp`, header optional, CR LF
//! or LF, gzip or plain) turned into CounterService likes and favourites: a rating at or
//! above `like_min` is a Like of the movie by the user, at or above `fav_min` also a Fav.
//! Toggles are idempotent, so a re-run changes nothing and transient failures are retried.

use std::path::Path;
use std::time::{Duration, Instant};

use futures::StreamExt;
use indicatif::ProgressBar;
use serde::Serialize;
use socialgraph_proto::counter::v1::counter_service_client::CounterServiceClient;
use socialgraph_proto::counter::v1::{EntityRef, FavRequest, LikeRequest};
use tonic::Code;
use tonic::transport::Channel;

use crate::endpoints::{COUNTER, Endpoints};
use crate::error::{CliError, CliResult};
use crate::input::{for_each_line, line_error, open};

/// One rating row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rating {
    /// The user who rated (> 0).
    pub user_id: i64,
    /// The movie rated (> 0).
    pub movie_id: i64,
    /// Stars, 0.5..=5.0 in MovieLens.
    pub rating: f64,
}

/// Reads a MovieLens ratings file.
///
/// # Errors
/// [`CliError::Io`]; [`CliError::Input`] naming the first bad line.
pub fn read_ratings(path: &Path) -> CliResult<Vec<Rating>> {
    parse_ratings(open(path)?, &path.display().to_string())
}

/// Parses ratings from `reader`; `name` names it in errors. A first line whose first field is
/// not a number is a header; blank lines are skipped.
///
/// # Errors
/// [`CliError::Input`] naming the first bad line.
pub fn parse_ratings(reader: impl std::io::BufRead, name: &str) -> CliResult<Vec<Rating>> {
    let mut out = Vec::new();
    for_each_line(reader, name, |index, line| {
        let bad = |message: String| line_error(name, index, message);
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        if line.is_empty() || (index == 0 && f[0].parse::<i64>().is_err()) {
            return Ok(());
        }
        if f.len() < 3 {
            return Err(bad(format!("expected userId,movieId,rating[,timestamp], got {line:?}")));
        }
        let id = |s: &str, what: &str| match s.parse::<i64>() {
            Ok(v) if v > 0 => Ok(v),
            _ => Err(bad(format!("{what} {s:?} is not an id > 0"))),
        };
        let rating = f[2].parse::<f64>().map_err(|_| bad(format!("rating {:?} is not a number", f[2])))?;
        out.push(Rating { user_id: id(f[0], "userId")?, movie_id: id(f[1], "movieId")?, rating });
        Ok(())
    })?;
    Ok(out)
}

/// Thresholds, entity type and parallelism of a likes load.
#[derive(Debug, Clone)]
pub struct LikeOptions {
    /// A rating ≥ this is a Like.
    pub like_min: f64,
    /// A rating ≥ this is also a Fav.
    pub fav_min: f64,
    /// Entity type of the movies: 1..64 bytes of `[a-z0-9_]`.
    pub entity_type: String,
    /// Toggles in flight at once, ≥ 1.
    pub concurrency: usize,
}

impl Default for LikeOptions {
    /// Like at 4.0 stars, Fav at 5.0, type `movie`, 16 in flight.
    fn default() -> Self {
        Self { like_min: 4.0, fav_min: 5.0, entity_type: "movie".into(), concurrency: 16 }
    }
}

/// What a likes load did.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct LikeSummary {
    /// Rating rows read.
    pub ratings_read: u64,
    /// Rows below `like_min` (and `fav_min`): nothing sent.
    pub below_threshold: u64,
    /// Like toggles sent.
    pub likes_sent: u64,
    /// Likes that were new (changed = true).
    pub likes_new: u64,
    /// Fav toggles sent.
    pub favs_sent: u64,
    /// Favs that were new.
    pub favs_new: u64,
    /// Seconds from the first toggle to the last answer.
    pub elapsed_secs: f64,
    /// `(likes_sent + favs_sent) / elapsed_secs`.
    pub toggles_per_sec: f64,
}

#[derive(Clone, Copy)]
enum Action {
    Like,
    Fav,
}

async fn toggle(mut client: CounterServiceClient<Channel>, action: Action, r: Rating, entity_type: String) -> CliResult<bool> {
    let entity = Some(EntityRef { entity_type, entity_id: r.movie_id });
    let mut backoff = Duration::from_millis(50);
    let mut attempt = 0;
    loop {
        attempt += 1;
        let result = match action {
            Action::Like => {
                client.like(LikeRequest { actor_id: r.user_id, entity: entity.clone(), owner_id: 0 }).await.map(|a| a.into_inner().changed)
            }
            Action::Fav => client.fav(FavRequest { actor_id: r.user_id, entity: entity.clone(), owner_id: 0 }).await.map(|a| a.into_inner().changed),
        };
        match result {
            Err(s) if attempt <= 8 && matches!(s.code(), Code::Unavailable | Code::ResourceExhausted | Code::DeadlineExceeded) => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
            other => return other.map_err(|s| CliError::rpc(COUNTER, s)),
        }
    }
}

/// Sends the likes and favourites of `ratings`; `progress` counts ratings done.
///
/// # Errors
/// [`CliError::Usage`] for a bad entity type or options; [`CliError::Connect`];
/// [`CliError::Rpc`] for the first toggle that failed (after retries of transient errors).
pub async fn load_likes(endpoints: &Endpoints, ratings: &[Rating], opts: &LikeOptions, progress: &ProgressBar) -> CliResult<LikeSummary> {
    if !socialgraph_domain::valid_entity_type(&opts.entity_type) {
        return Err(CliError::Usage(format!("entity type {:?} must be 1..64 bytes of [a-z0-9_]", opts.entity_type)));
    }
    if opts.concurrency == 0 || opts.fav_min < opts.like_min {
        return Err(CliError::Usage("concurrency must be >= 1 and --fav-min >= --like-min".into()));
    }
    let client = endpoints.counter().await?;
    progress.set_length(ratings.len() as u64);
    let mut summary = LikeSummary { ratings_read: ratings.len() as u64, ..Default::default() };
    let actions: Vec<(Action, Rating)> = ratings
        .iter()
        .flat_map(|r| {
            let like = (r.rating >= opts.like_min).then_some((Action::Like, *r));
            let fav = (r.rating >= opts.fav_min).then_some((Action::Fav, *r));
            like.into_iter().chain(fav)
        })
        .collect();
    summary.below_threshold = ratings.iter().filter(|r| r.rating < opts.like_min).count() as u64;
    progress.inc(summary.below_threshold);
    let start = Instant::now();
    let mut results = futures::stream::iter(actions)
        .map(|(action, r)| {
            let fut = toggle(client.clone(), action, r, opts.entity_type.clone());
            async move { fut.await.map(|changed| (action, changed)) }
        })
        .buffer_unordered(opts.concurrency);
    while let Some(result) = results.next().await {
        let (action, changed) = result?;
        match action {
            Action::Like => {
                summary.likes_sent += 1;
                summary.likes_new += u64::from(changed);
                progress.inc(1);
            }
            Action::Fav => {
                summary.favs_sent += 1;
                summary.favs_new += u64::from(changed);
            }
        }
    }
    progress.finish();
    summary.elapsed_secs = start.elapsed().as_secs_f64();
    let sent = (summary.likes_sent + summary.favs_sent) as f64;
    summary.toggles_per_sec = if summary.elapsed_secs > 0.0 { sent / summary.elapsed_secs } else { 0.0 };
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn movielens_rows_with_header_and_crlf() {
        let text = "userId,movieId,rating,timestamp\r\n1,1,4.0,964982703\r\n1,3,0.5,964981247\r\n\r\n610,170875,3.0,1493846415";
        let r = parse_ratings(text.as_bytes(), "ratings.csv").unwrap();
        assert_eq!(r.len(), 3);
        assert_eq!(r[0], Rating { user_id: 1, movie_id: 1, rating: 4.0 });
        assert_eq!(r[2], Rating { user_id: 610, movie_id: 170875, rating: 3.0 });
    }

    #[test]
    fn bad_rows_name_their_line() {
        let e = parse_ratings("1,2,4.0\n0,2,4.0".as_bytes(), "r.csv").unwrap_err().to_string();
        assert_eq!(e, "r.csv:2: userId \"0\" is not an id > 0");
        let e = parse_ratings("1,2\n".as_bytes(), "r.csv").unwrap_err().to_string();
        assert!(e.starts_with("r.csv:1: expected userId,movieId,rating"), "{e}");
        let e = parse_ratings("1,2,x\n".as_bytes(), "r.csv").unwrap_err().to_string();
        assert!(e.contains("rating \"x\""), "{e}");
    }
}
