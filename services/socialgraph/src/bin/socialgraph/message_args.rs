//! The message subcommands (`send`, `conversations`, `messages`, `read`) as clap parses them.

use clap::{Args, Subcommand};
use socialgraph_cli::{CliResult, Endpoints, messages};

use crate::args::PagingArgs;

/// MessageService's commands, listed among the others.
#[derive(Debug, Subcommand)]
pub enum MessageCommand {
    /// FROM sends BODY to --to USER (a private conversation) or into --conversation ID.
    Send {
        /// The sender.
        #[arg(allow_negative_numbers = true)]
        from: i64,
        /// The message body (text).
        body: String,
        #[command(flatten)]
        target: Target,
        /// Idempotency key (1–64 printable ASCII); a send repeated with it writes nothing.
        /// Default: a new UUID.
        #[arg(long)]
        client_id: Option<String>,
    },
    /// USER's conversations, latest activity first, with unread counts.
    Conversations {
        /// The user.
        #[arg(allow_negative_numbers = true)]
        user: i64,
        #[command(flatten)]
        paging: PagingArgs,
    },
    /// The messages of CONVERSATION that USER can read, newest first.
    Messages {
        /// The reader (a member).
        #[arg(allow_negative_numbers = true)]
        user: i64,
        /// The conversation.
        #[arg(allow_negative_numbers = true)]
        conversation: i64,
        #[command(flatten)]
        paging: PagingArgs,
    },
    /// USER has read CONVERSATION up to MESSAGE (the cursor only moves forward).
    Read {
        /// The reader.
        #[arg(allow_negative_numbers = true)]
        user: i64,
        /// The conversation.
        #[arg(allow_negative_numbers = true)]
        conversation: i64,
        /// The newest message read (its id).
        #[arg(allow_negative_numbers = true, value_name = "MESSAGE")]
        up_to: i64,
    },
}

/// Where `send` goes: exactly one of the two.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct Target {
    /// The recipient of a private message.
    #[arg(long, allow_negative_numbers = true)]
    to: Option<i64>,
    /// A group (or private conversation) by id.
    #[arg(long, allow_negative_numbers = true)]
    conversation: Option<i64>,
}

/// Runs one message subcommand.
pub async fn run(e: &Endpoints, command: MessageCommand, json: bool) -> CliResult<()> {
    match command {
        MessageCommand::Send { from, body, target, client_id } => {
            messages::send(e, (target.to.unwrap_or(0), target.conversation.unwrap_or(0)), from, client_id, body, json).await
        }
        MessageCommand::Conversations { user, paging } => messages::conversations(e, user, paging.into(), json).await,
        MessageCommand::Messages { user, conversation, paging } => messages::messages(e, user, conversation, paging.into(), json).await,
        MessageCommand::Read { user, conversation, up_to } => messages::read(e, user, conversation, up_to, json).await,
    }
}
