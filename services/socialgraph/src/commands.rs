//! The subcommands of `socialgraph`: each runs one library call and prints its result on
//! standard output (a table, or JSON with `json`); progress bars go to standard error.

use std::path::Path;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use crate::edges::{EdgeFileOptions, read_follow_file};
use crate::endpoints::Endpoints;
use crate::error::CliResult;
use crate::generator::{GenOptions, write_snap};
use crate::likes::{LikeOptions, load_likes as send_likes, read_ratings};
use crate::load::{LoadOptions, load_follows as send_follows};
use crate::output::{self, CountersRow, EntityRow, FollowRow, PartitionRow, RelationshipRow, RestrictedRow, print_json, print_rows};
use crate::query::{self, ListQuery};
use crate::verify::{VerifyOptions, verify as run_verify};
use crate::writes::{AccountAction, Write, write as send_write};

/// Page size, token and whether to follow every next page token.
#[derive(Debug, Clone, Default)]
pub struct Paging {
    /// Entries per page; `None` is the server's default (50), or 1000 with `all`.
    pub page_size: Option<i32>,
    /// Where to start: a `next_page_token` printed earlier; empty for the first page.
    pub page_token: String,
    /// Fetch every page from `page_token` on.
    pub all: bool,
}

/// A progress bar on standard error with rate and ETA, or a hidden one.
pub fn progress_bar(visible: bool, unit: &str) -> ProgressBar {
    if !visible {
        return ProgressBar::hidden();
    }
    let template = format!("{{spinner}} {{elapsed_precise}} [{{wide_bar}}] {{human_pos}}/{{human_len}} {unit} {{per_sec}} ETA {{eta}}");
    let style = ProgressStyle::with_template(&template).unwrap_or_else(|_| ProgressStyle::default_bar());
    ProgressBar::new(0).with_style(style)
}

fn ms_time(ms: Option<i64>) -> Option<String> {
    ms.map(output::rfc3339)
}

/// Prints one page (or, with `all`, every page) of a list.
///
/// # Errors
/// Connection and RPC errors.
pub async fn list(endpoints: &Endpoints, q: ListQuery, paging: Paging, json: bool) -> CliResult<()> {
    let mut client = q.client(endpoints).await?;
    let (entries, next) = if paging.all {
        (q.all(&mut client, paging.page_size.unwrap_or(1000), paging.page_token).await?, String::new())
    } else {
        q.page(&mut client, paging.page_size.unwrap_or(0), paging.page_token).await?
    };
    let footer = if next.is_empty() { String::new() } else { format!("next page token: {next}") };
    if let ListQuery::Blocks { .. } | ListQuery::Mutes { .. } | ListQuery::Requests { .. } = q {
        let rows: Vec<RestrictedRow> = entries.iter().map(|e| RestrictedRow { user_id: e.user_id, since: ms_time(e.followed_at_ms) }).collect();
        let key = match q {
            ListQuery::Blocks { .. } => "blocks",
            ListQuery::Mutes { .. } => "mutes",
            _ => "requests",
        };
        print_rows(&rows, json, &json!({ key: rows, "next_page_token": next }), &[footer]);
        return Ok(());
    }
    let rows: Vec<FollowRow> = entries.iter().map(|e| FollowRow { user_id: e.user_id, followed_at: ms_time(e.followed_at_ms) }).collect();
    let key = match q {
        ListQuery::Following { .. } => "following",
        ListQuery::Followers { .. } => "followers",
        _ => "accounts",
    };
    print_rows(&rows, json, &json!({ key: rows, "next_page_token": next }), &[footer]);
    Ok(())
}

/// Performs one change of the graph by `actor` on `other` and prints what it did.
///
/// # Errors
/// Connection and RPC errors (the server's status: bad ids, BLOCKED, FOLLOWING_LIMIT, …).
pub async fn change(endpoints: &Endpoints, what: Write, actor: i64, other: i64, json: bool) -> CliResult<()> {
    let row = send_write(endpoints, what, actor, other).await?;
    print_rows(std::slice::from_ref(&row), json, &row, &[]);
    Ok(())
}

/// Performs an account action on `user_id` and prints the account.
///
/// # Errors
/// Connection and RPC errors.
pub async fn account(endpoints: &Endpoints, action: AccountAction, user_id: i64, json: bool) -> CliResult<()> {
    let row = crate::writes::account(endpoints, action, user_id).await?;
    print_rows(std::slice::from_ref(&row), json, &row, &[]);
    Ok(())
}

/// Locks or unlocks `user_id`'s account and prints what changed.
///
/// # Errors
/// Connection and RPC errors.
pub async fn set_locked(endpoints: &Endpoints, user_id: i64, locked: bool, json: bool) -> CliResult<()> {
    let (changed, approved) = crate::writes::set_locked(endpoints, user_id, locked).await?;
    let value = json!({ "user_id": user_id, "locked": locked, "changed": changed, "approved": approved });
    if json {
        print_json(&value);
    } else {
        out!("user {user_id}: locked={locked} changed={changed} requests approved={approved}");
    }
    Ok(())
}

/// Approves or rejects pending follow requests and prints how many.
///
/// # Errors
/// Connection and RPC errors.
pub async fn answer_requests(endpoints: &Endpoints, user_id: i64, requesters: &[i64], approve: bool, json: bool) -> CliResult<()> {
    let n = crate::writes::answer_requests(endpoints, user_id, requesters, approve).await?;
    let key = if approve { "approved" } else { "rejected" };
    if json {
        print_json(&json!({ "user_id": user_id, key: n }));
    } else {
        out!("user {user_id}: {key} {n}");
    }
    Ok(())
}

/// Prints the relationships of `user_id` with each of `others`.
///
/// # Errors
/// Connection and RPC errors.
pub async fn relationship(endpoints: &Endpoints, user_id: i64, others: &[i64], json: bool) -> CliResult<()> {
    let rows: Vec<RelationshipRow> = query::relationships(endpoints, user_id, others)
        .await?
        .into_iter()
        .map(|r| RelationshipRow {
            other_user_id: r.other_user_id,
            following: r.following,
            followed_by: r.followed_by,
            followed_at: ms_time(r.followed_at.as_ref().map(socialgraph_domain::timestamp_to_ms)),
            followed_by_at: ms_time(r.followed_by_at.as_ref().map(socialgraph_domain::timestamp_to_ms)),
            blocking: r.blocking,
            blocked_by: r.blocked_by,
            muting: r.muting,
            requested: r.requested,
            requested_by: r.requested_by,
        })
        .collect();
    print_rows(&rows, json, &json!({ "user_id": user_id, "relationships": rows }), &[]);
    Ok(())
}

/// Prints the counters of `users`.
///
/// # Errors
/// Connection and RPC errors.
pub async fn counters(endpoints: &Endpoints, users: &[i64], json: bool) -> CliResult<()> {
    let mut client = endpoints.counter().await?;
    let rows: Vec<CountersRow> = query::user_counters(&mut client, users, socialgraph_domain::MAX_BATCH)
        .await?
        .into_iter()
        .map(|c| CountersRow {
            user_id: c.user_id,
            followings: c.followings,
            followers: c.followers,
            posts: c.posts,
            likes_received: c.likes_received,
            favs_received: c.favs_received,
        })
        .collect();
    print_rows(&rows, json, &json!({ "counters": rows }), &[]);
    Ok(())
}

/// Prints like and fav counts of entities.
///
/// # Errors
/// Connection and RPC errors.
pub async fn entity_counts(endpoints: &Endpoints, entity_type: &str, ids: &[i64], json: bool) -> CliResult<()> {
    let rows: Vec<EntityRow> = query::entity_counts(endpoints, entity_type, ids)
        .await?
        .into_iter()
        .map(|(entity_id, likes, favs)| EntityRow { entity_type: entity_type.to_owned(), entity_id, likes, favs })
        .collect();
    print_rows(&rows, json, &json!({ "counts": rows }), &[]);
    Ok(())
}

/// Prints projection-svc's status, with the total lag.
///
/// # Errors
/// Connection and RPC errors.
pub async fn status(endpoints: &Endpoints, json: bool) -> CliResult<()> {
    let rows: Vec<PartitionRow> = query::projection_status(endpoints)
        .await?
        .into_iter()
        .map(|p| PartitionRow {
            topic: p.topic,
            partition: p.partition,
            next_offset: p.next_offset,
            high_watermark: p.high_watermark,
            lag: p.lag,
            last_event_time: ms_time(p.last_event_time.as_ref().map(socialgraph_domain::timestamp_to_ms)),
        })
        .collect();
    let lag: i64 = rows.iter().map(|r| r.lag).sum();
    print_rows(&rows, json, &json!({ "partitions": rows, "total_lag": lag }), &[format!("total lag: {lag}")]);
    Ok(())
}

/// Reads an edge file and streams it to relation-svc; prints the summary.
///
/// # Errors
/// File, connection and RPC errors.
pub async fn load_follows(endpoints: &Endpoints, path: &Path, file: EdgeFileOptions, opts: LoadOptions, json: bool, progress: bool) -> CliResult<()> {
    let read_start = Instant::now();
    let graph = read_follow_file(path, file)?;
    let read_secs = read_start.elapsed().as_secs_f64();
    let bar = progress_bar(progress && !json, "edges");
    let mut summary = send_follows(endpoints, &graph, opts, &bar).await?;
    summary.read_secs = read_secs;
    if json {
        print_json(&summary);
        return Ok(());
    }
    out!(
        "{}",
        output::key_values(&[
            ("lines read", summary.lines_read.to_string()),
            ("edge lines", summary.edge_lines.to_string()),
            ("self-loops skipped", summary.self_loops_skipped.to_string()),
            ("duplicates skipped (first occurrence wins)", summary.duplicates_skipped.to_string()),
            ("not follows skipped (rating <= 0)", summary.not_follows_skipped.to_string()),
            ("edges sent", summary.edges_sent.to_string()),
            ("edges loaded (new)", summary.edges_loaded.to_string()),
            ("already followed", summary.already_followed.to_string()),
            ("read time", format!("{:.1} s", summary.read_secs)),
            ("load time", format!("{:.1} s", summary.elapsed_secs)),
            ("edges/s", format!("{:.0}", summary.edges_per_sec)),
        ])
    );
    Ok(())
}

/// Reads MovieLens ratings and sends likes and favourites; prints the summary.
///
/// # Errors
/// File, connection and RPC errors.
pub async fn load_likes(endpoints: &Endpoints, path: &Path, opts: &LikeOptions, json: bool, progress: bool) -> CliResult<()> {
    let ratings = read_ratings(path)?;
    let bar = progress_bar(progress && !json, "ratings");
    let s = send_likes(endpoints, &ratings, opts, &bar).await?;
    if json {
        print_json(&s);
        return Ok(());
    }
    out!(
        "{}",
        output::key_values(&[
            ("ratings read", s.ratings_read.to_string()),
            ("below the like threshold", s.below_threshold.to_string()),
            ("likes sent", s.likes_sent.to_string()),
            ("likes new", s.likes_new.to_string()),
            ("favs sent", s.favs_sent.to_string()),
            ("favs new", s.favs_new.to_string()),
            ("elapsed", format!("{:.1} s", s.elapsed_secs)),
            ("toggles/s", format!("{:.0}", s.toggles_per_sec)),
        ])
    );
    Ok(())
}

/// `load posts FILE`: publishes every post of the file; prints the summary.
///
/// # Errors
/// File, connection and RPC errors.
pub async fn load_posts(endpoints: &Endpoints, path: &Path, concurrency: usize, json: bool, progress: bool) -> CliResult<()> {
    let posts = crate::posts::read_posts(path)?;
    let bar = progress_bar(progress && !json, "posts");
    let s = crate::posts::load_posts(endpoints, &posts, concurrency, &bar).await?;
    if json {
        print_json(&s);
        return Ok(());
    }
    let rows =
        [("posts published", s.posts.to_string()), ("elapsed", format!("{:.1} s", s.elapsed_secs)), ("posts/s", format!("{:.0}", s.posts_per_sec))];
    out!("{}", output::key_values(&rows));
    Ok(())
}

/// `load messages FILE`: private messages through SendMessage; prints counts and rate.
///
/// # Errors
/// File, connection and RPC errors.
pub async fn load_messages(endpoints: &Endpoints, path: &Path, concurrency: usize, json: bool, progress: bool) -> CliResult<()> {
    let lines = crate::messages::read_messages(path)?;
    let bar = progress_bar(progress && !json, "messages");
    let s = crate::messages::load_messages(endpoints, &lines, concurrency, &bar).await?;
    if json {
        print_json(&s);
        return Ok(());
    }
    let rows = [
        ("messages sent", s.messages.to_string()),
        ("created (not sent before)", s.created.to_string()),
        ("elapsed", format!("{:.1} s", s.elapsed_secs)),
        ("messages/s", format!("{:.0}", s.messages_per_sec)),
    ];
    out!("{}", output::key_values(&rows));
    Ok(())
}

/// `post AUTHOR POST_ID [--at SECONDS]`.
///
/// # Errors
/// Connection and RPC errors.
pub async fn post(endpoints: &Endpoints, author_id: i64, post_id: i64, at_secs: Option<i64>, json: bool) -> CliResult<()> {
    let created_at_ms = at_secs.map_or_else(socialgraph_domain::now_ms, |s| s.saturating_mul(1000));
    let p = crate::posts::Post { author_id, post_id, created_at_ms };
    crate::posts::publish(&endpoints.feed().await?, p).await?;
    if json {
        print_json(&json!({ "author_id": author_id, "post_id": post_id, "created_at": output::rfc3339(created_at_ms) }));
    } else {
        out!("published post {post_id} of {author_id} at {}", output::rfc3339(created_at_ms));
    }
    Ok(())
}

/// `delete-post AUTHOR POST_ID`.
///
/// # Errors
/// Connection and RPC errors.
pub async fn delete_post(endpoints: &Endpoints, author_id: i64, post_id: i64, json: bool) -> CliResult<()> {
    let req = socialgraph_proto::feed::v1::DeletePostRequest { author_id, post_id };
    endpoints.feed().await?.delete_post(req).await.map_err(|s| crate::error::CliError::rpc(crate::endpoints::PROJECTION, s))?;
    if json {
        print_json(&json!({ "author_id": author_id, "post_id": post_id, "deleted": true }));
    } else {
        out!("deleted post {post_id} of {author_id}");
    }
    Ok(())
}

/// `timeline USER`: one page (or every page) of the home timeline along `walk` (newest first,
/// or oldest first from a post with `min_post_id`).
///
/// # Errors
/// Connection and RPC errors.
pub async fn timeline(endpoints: &Endpoints, user_id: i64, walk: crate::posts::TimelineWalk, paging: Paging, json: bool) -> CliResult<()> {
    let size = paging.page_size.unwrap_or(if paging.all { 1000 } else { 0 });
    let (posts, next) = crate::posts::timeline(endpoints, user_id, walk, size, paging.page_token, paging.all).await?;
    let at = |p: &socialgraph_proto::feed::v1::TimelinePost| p.created_at.as_ref().map(socialgraph_domain::timestamp_to_ms).map(output::rfc3339);
    if json {
        let items: Vec<_> = posts.iter().map(|p| json!({ "post_id": p.post_id, "author_id": p.author_id, "created_at": at(p) })).collect();
        print_json(&json!({ "posts": items, "next_page_token": next }));
        return Ok(());
    }
    for p in &posts {
        out!("{:>20}  {:>20}  {}", p.post_id, p.author_id, at(p).unwrap_or_default());
    }
    if !next.is_empty() {
        out!("next page token: {next}");
    }
    Ok(())
}

/// Verifies the mesh against a file; prints mismatches and the summary. Returns whether
/// everything agreed.
///
/// # Errors
/// File, connection and RPC errors, and a projection that does not catch up in time.
pub async fn verify(endpoints: &Endpoints, path: &Path, file: EdgeFileOptions, opts: &VerifyOptions, json: bool) -> CliResult<bool> {
    let graph = read_follow_file(path, file)?;
    let r = run_verify(endpoints, &graph, opts).await?;
    let total = r.total_mismatches();
    if json {
        print_json(&r);
        return Ok(total == 0);
    }
    for line in &r.mismatches {
        out!("MISMATCH {line}");
    }
    if total > r.mismatches.len() as u64 {
        out!("… and {} more mismatches", total - r.mismatches.len() as u64);
    }
    out!(
        "{}",
        output::key_values(&[
            ("users: counters compared", r.users_checked.to_string()),
            ("users: counters wrong", r.counter_mismatches.to_string()),
            ("follower lists compared", format!("{} ({} entries)", r.follower_lists_checked, r.follower_entries_expected)),
            ("follower lists wrong", r.follower_list_mismatches.to_string()),
            (
                "familiar pairs compared",
                format!("{} ({} non-empty, {} entries)", r.familiar_pairs_checked, r.familiar_pairs_nonempty, r.familiar_entries_expected)
            ),
            ("familiar pairs wrong", r.familiar_mismatches.to_string()),
            ("waited for projection", format!("{:.1} s", r.waited_secs)),
            ("elapsed", format!("{:.1} s", r.elapsed_secs)),
            ("result", if total == 0 { "OK".to_owned() } else { format!("{total} MISMATCHES") }),
        ])
    );
    Ok(total == 0)
}

/// Generates a graph into `out`; prints what was written.
///
/// # Errors
/// Impossible sizes and file errors.
pub fn generate_file(out: &Path, opts: GenOptions, json: bool) -> CliResult<()> {
    let edges = write_snap(out, opts)?;
    let path = out.display().to_string();
    if json {
        print_json(&json!({ "path": path, "users": opts.users, "edges": edges, "seed": opts.seed }));
    } else {
        out!("wrote {edges} edges among {} users (seed {}) to {path}", opts.users, opts.seed);
    }
    Ok(())
}
