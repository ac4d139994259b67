//! The message subcommands (`send`, `conversations`, `messages`, `read`, `delete-message`,
//! `edit-message`, `rename-group`) as clap parses them.

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
    /// USER deletes MESSAGE (only its sender may): it leaves the conversation and the unread
    /// counts of those who had not read it.
    DeleteMessage {
        /// The sender.
        #[arg(allow_negative_numbers = true)]
        user: i64,
        /// The message (its id).
        #[arg(allow_negative_numbers = true, value_name = "MESSAGE")]
        message_id: i64,
    },
    /// USER replaces the body of MESSAGE (only its sender may) with BODY.
    EditMessage {
        /// The sender.
        #[arg(allow_negative_numbers = true)]
        user: i64,
        /// The message (its id).
        #[arg(allow_negative_numbers = true, value_name = "MESSAGE")]
        message_id: i64,
        /// The new body (text).
        body: String,
    },
    /// USER (a member) gives group CONVERSATION the title TITLE.
    RenameGroup {
        /// A member of the group.
        #[arg(allow_negative_numbers = true)]
        user: i64,
        /// The group.
        #[arg(allow_negative_numbers = true)]
        conversation: i64,
        /// The new title (at most 200 bytes).
        title: String,
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
        MessageCommand::DeleteMessage { user, message_id } => messages::delete(e, user, message_id, json).await,
        MessageCommand::EditMessage { user, message_id, body } => messages::edit(e, user, message_id, body, json).await,
        MessageCommand::RenameGroup { user, conversation, title } => messages::rename(e, user, conversation, title, json).await,
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::MessageCommand;
    use crate::args::{Cli, Command};

    fn parse(args: &[&str]) -> Option<MessageCommand> {
        match Cli::try_parse_from(std::iter::once("socialgraph").chain(args.iter().copied())).ok()?.command {
            Command::Messages(m) => Some(m),
            _ => None,
        }
    }

    #[test]
    fn deletes_edits_and_renames_parse_their_arguments() {
        assert!(matches!(parse(&["delete-message", "2", "7"]), Some(MessageCommand::DeleteMessage { user: 2, message_id: 7 })));
        assert!(matches!(parse(&["edit-message", "2", "7", "new text"]),
            Some(MessageCommand::EditMessage { user: 2, message_id: 7, ref body }) if body == "new text"));
        assert!(matches!(parse(&["rename-group", "2", "9", "title"]),
            Some(MessageCommand::RenameGroup { user: 2, conversation: 9, ref title }) if title == "title"));
        assert!(parse(&["edit-message", "2", "7"]).is_none(), "the body is required");
    }
}
