//! `socialgraph`: the command line of the socialgraph mesh. Each subcommand is one variant of
//! [`Command`] (in [`args`]) and one arm of [`run`]; the work is in the `socialgraph_cli`
//! library, and `socialgraph dev` in [`dev`].
//!
//! Exit status: 0 success, 1 an error (one line on standard error), 2 bad usage, 3 `verify`
//! found mismatches.

#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod args;
mod dev;
mod message_args;

use std::process::ExitCode;

use clap::Parser;
use socialgraph_cli::commands;
use socialgraph_cli::posts::TimelineWalk;
use socialgraph_cli::query::ListQuery;
use socialgraph_cli::writes::{AccountAction, Write};
use socialgraph_cli::{CliResult, Endpoints};

use crate::args::{AccountCommand, Cli, Command, LoadCommand, VerifyArgs};

/// Exit status of a `verify` that found mismatches.
const MISMATCHES: u8 = 3;

/// Runs one subcommand; errors of the library are printed by [`main`].
async fn run(cli: Cli) -> CliResult<ExitCode> {
    let endpoints = cli.mesh.endpoints();
    let (e, json) = (&endpoints, cli.json);
    match cli.command {
        Command::Dev(a) => return Ok(dev::serve(a, endpoints.admin_token).await),
        Command::Load(LoadCommand::Follows(a)) => {
            commands::load_follows(e, &a.file.file, a.file.options(), a.options(), json, !a.no_progress).await?
        }
        Command::Load(LoadCommand::Likes(a)) => commands::load_likes(e, &a.file, &a.options(), json, !a.no_progress).await?,
        Command::Load(LoadCommand::Posts { file, concurrency, no_progress }) => {
            commands::load_posts(e, &file, concurrency, json, !no_progress).await?
        }
        Command::Load(LoadCommand::Messages { file, concurrency, no_progress }) => {
            commands::load_messages(e, &file, concurrency, json, !no_progress).await?
        }
        Command::Messages(m) => message_args::run(e, m, json).await?,
        Command::Post { author, post_id, at } => commands::post(e, author, post_id, at, json).await?,
        Command::DeletePost { author, post_id } => commands::delete_post(e, author, post_id, json).await?,
        Command::Timeline { user, min_post, since_post, paging } => {
            let walk = TimelineWalk { min_post_id: min_post.unwrap_or(0), since_post_id: since_post.unwrap_or(0) };
            commands::timeline(e, user, walk, paging.into(), json).await?
        }
        Command::Following { user, paging } => commands::list(e, ListQuery::Following { user_id: user }, paging.into(), json).await?,
        Command::Followers { user, paging } => commands::list(e, ListQuery::Followers { user_id: user }, paging.into(), json).await?,
        Command::Common { user, other, paging } => {
            commands::list(e, ListQuery::Common { user_id: user, other_user_id: other }, paging.into(), json).await?
        }
        Command::Familiar { viewer, user, paging } => {
            commands::list(e, ListQuery::Familiar { viewer_id: viewer, user_id: user }, paging.into(), json).await?
        }
        Command::Follow(p) => commands::change(e, Write::Follow, p.user, p.other, json).await?,
        Command::Unfollow(p) => commands::change(e, Write::Unfollow, p.user, p.other, json).await?,
        Command::Block(p) => commands::change(e, Write::Block, p.user, p.other, json).await?,
        Command::Unblock(p) => commands::change(e, Write::Unblock, p.user, p.other, json).await?,
        Command::Mute(p) => commands::change(e, Write::Mute, p.user, p.other, json).await?,
        Command::Unmute(p) => commands::change(e, Write::Unmute, p.user, p.other, json).await?,
        Command::RemoveFollower(p) => commands::change(e, Write::RemoveFollower, p.user, p.other, json).await?,
        Command::Blocks { user, paging } => commands::list(e, ListQuery::Blocks { user_id: user }, paging.into(), json).await?,
        Command::Mutes { user, paging } => commands::list(e, ListQuery::Mutes { user_id: user }, paging.into(), json).await?,
        Command::Lock(u) => commands::set_locked(e, u.user, true, json).await?,
        Command::Unlock(u) => commands::set_locked(e, u.user, false, json).await?,
        Command::Requests { user, outgoing, paging } => {
            commands::list(e, ListQuery::Requests { user_id: user, outgoing }, paging.into(), json).await?
        }
        Command::Approve { user, requesters } => commands::answer_requests(e, user, &requesters, true, json).await?,
        Command::Reject { user, requesters } => commands::answer_requests(e, user, &requesters, false, json).await?,
        Command::Account(a) => {
            let (action, user) = match a {
                AccountCommand::Show(u) => (AccountAction::Show, u.user),
                AccountCommand::Deactivate(u) => (AccountAction::Deactivate, u.user),
                AccountCommand::Reactivate(u) => (AccountAction::Reactivate, u.user),
                AccountCommand::Suspend(u) => (AccountAction::Suspend, u.user),
                AccountCommand::Delete(u) => (AccountAction::Delete, u.user),
            };
            commands::account(e, action, user, json).await?
        }
        Command::Relationship { user, others } => commands::relationship(e, user, &others, json).await?,
        Command::Counters { users } => commands::counters(e, &users, json).await?,
        Command::EntityCounts { entity_type, ids } => commands::entity_counts(e, &entity_type, &ids, json).await?,
        Command::Status => commands::status(e, json).await?,
        Command::Verify(a) => return verify(e, &a, json).await,
        Command::Gen(a) => commands::generate_file(&a.out, a.options(), json)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `verify FILE`: exit status 3 when the mesh disagrees with the file.
async fn verify(endpoints: &Endpoints, a: &VerifyArgs, json: bool) -> CliResult<ExitCode> {
    let agrees = commands::verify(endpoints, &a.file.file, a.file.options(), &a.options(), json).await?;
    Ok(if agrees { ExitCode::SUCCESS } else { ExitCode::from(MISMATCHES) })
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
