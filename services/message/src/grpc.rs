//! MessageService over gRPC: validate the request, call [`Messages`], map the result.

use std::sync::Arc;

use socialgraph_domain::{Violation, validate_batch, validate_user_id};
use socialgraph_proto::message::v1 as pb;
use socialgraph_proto::message::v1::message_service_server::MessageService;
use socialgraph_server::{ApiError, ApiResult};
use tonic::{Request, Response, Status};

use crate::live::Hub;
use crate::reads::message_pb;
use crate::service::{MAX_TITLE_BYTES, Messages, Send, validate_send};
use crate::subscribe::{Cursor, open, pump};

/// The tonic implementation of `socialgraph.message.v1.MessageService`.
pub struct MessageGrpc {
    messages: Arc<Messages>,
    hub: Arc<Hub>,
}

impl MessageGrpc {
    /// Serves `messages`; Subscribe streams follow `hub`.
    pub fn new(messages: Arc<Messages>, hub: Arc<Hub>) -> Self {
        Self { messages, hub }
    }
}

/// Checks every `(field, id)` is > 0, naming each bad one.
fn ids(fields: &[(&str, i64)]) -> ApiResult<()> {
    let bad: Vec<Violation> = fields.iter().filter_map(|(f, id)| validate_user_id(f, *id).err()).collect();
    if bad.is_empty() { Ok(()) } else { Err(bad.into()) }
}

/// A group title: at most [`MAX_TITLE_BYTES`] bytes.
fn validate_title(title: &str) -> Result<(), Violation> {
    if title.len() > MAX_TITLE_BYTES {
        return Err(Violation::new("title", format!("holds {} bytes, at most {MAX_TITLE_BYTES} are allowed", title.len())));
    }
    Ok(())
}

fn answer<T>(r: ApiResult<T>) -> Result<Response<T>, Status> {
    r.map(Response::new).map_err(Status::from)
}

#[tonic::async_trait]
impl MessageService for MessageGrpc {
    type SubscribeStream = tokio_stream::wrappers::ReceiverStream<Result<pb::SubscribeResponse, Status>>;

    async fn subscribe(&self, req: Request<pb::SubscribeRequest>) -> Result<Response<Self::SubscribeStream>, Status> {
        let r = req.into_inner();
        let opened = async {
            validate_user_id("user_id", r.user_id).map_err(ApiError::from)?;
            let token = Cursor::decode(&r.resume_token, r.user_id)?;
            open(&self.hub, r.user_id, token, self.messages.config.subscribe.max_catch_up_records).await
        };
        let (rx, cursor) = opened.await?;
        let (tx, stream) = tokio::sync::mpsc::channel(64);
        tokio::spawn(pump(Arc::clone(&self.hub), rx, cursor, tx));
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(stream)))
    }

    async fn send_message(&self, req: Request<pb::SendMessageRequest>) -> Result<Response<pb::SendMessageResponse>, Status> {
        let r = req.into_inner();
        let max = self.messages.config.messages.max_body_bytes;
        answer(
            async {
                let target = validate_send(r.sender_id, r.recipient_id, r.conversation_id, &r.client_message_id, &r.body, max)?;
                let send = Send { sender_id: r.sender_id, target, client_message_id: r.client_message_id, body: r.body };
                let sent = self.messages.send(&send).await?;
                Ok(pb::SendMessageResponse { message: Some(message_pb(sent.message)), created: sent.created })
            }
            .await,
        )
    }

    async fn list_conversations(&self, req: Request<pb::ListConversationsRequest>) -> Result<Response<pb::ListConversationsResponse>, Status> {
        let r = req.into_inner();
        answer(self.messages.list_conversations(r.user_id, r.page_size, &r.page_token).await)
    }

    async fn list_messages(&self, req: Request<pb::ListMessagesRequest>) -> Result<Response<pb::ListMessagesResponse>, Status> {
        let r = req.into_inner();
        answer(self.messages.list_messages(r.user_id, r.conversation_id, r.page_size, &r.page_token).await)
    }

    async fn mark_read(&self, req: Request<pb::MarkReadRequest>) -> Result<Response<pb::MarkReadResponse>, Status> {
        let r = req.into_inner();
        answer(
            async {
                ids(&[("user_id", r.user_id), ("conversation_id", r.conversation_id), ("up_to_message_id", r.up_to_message_id)])?;
                let (changed, m) = self.messages.mark_read(r.user_id, r.conversation_id, r.up_to_message_id).await?;
                Ok(pb::MarkReadResponse { changed, read_seq: m.read_seq, unread_count: m.unread_count })
            }
            .await,
        )
    }

    async fn create_group(&self, req: Request<pb::CreateGroupRequest>) -> Result<Response<pb::CreateGroupResponse>, Status> {
        let r = req.into_inner();
        answer(
            async {
                let mut bad: Vec<Violation> = validate_user_id("creator_id", r.creator_id).err().into_iter().collect();
                if !r.member_ids.is_empty() {
                    bad.extend(validate_batch("member_ids", &r.member_ids).err().unwrap_or_default());
                }
                bad.extend(validate_title(&r.title).err());
                if !bad.is_empty() {
                    return Err(bad.into());
                }
                let (conversation_id, member_count) = self.messages.create_group(r.creator_id, &r.member_ids, &r.title).await?;
                Ok(pb::CreateGroupResponse { conversation_id, member_count })
            }
            .await,
        )
    }

    async fn add_members(&self, req: Request<pb::AddMembersRequest>) -> Result<Response<pb::AddMembersResponse>, Status> {
        let r = req.into_inner();
        answer(
            async {
                let mut bad: Vec<Violation> = [("actor_id", r.actor_id), ("conversation_id", r.conversation_id)]
                    .iter()
                    .filter_map(|(f, id)| validate_user_id(f, *id).err())
                    .collect();
                bad.extend(validate_batch("user_ids", &r.user_ids).err().unwrap_or_default());
                if !bad.is_empty() {
                    return Err(ApiError::violations(bad));
                }
                let (added, member_count) = self.messages.add_members(r.actor_id, r.conversation_id, &r.user_ids).await?;
                Ok(pb::AddMembersResponse { added, member_count })
            }
            .await,
        )
    }

    async fn remove_member(&self, req: Request<pb::RemoveMemberRequest>) -> Result<Response<pb::RemoveMemberResponse>, Status> {
        let r = req.into_inner();
        answer(
            async {
                ids(&[("actor_id", r.actor_id), ("conversation_id", r.conversation_id), ("user_id", r.user_id)])?;
                Ok(pb::RemoveMemberResponse { changed: self.messages.remove(r.actor_id, r.conversation_id, r.user_id).await? })
            }
            .await,
        )
    }

    async fn leave(&self, req: Request<pb::LeaveRequest>) -> Result<Response<pb::LeaveResponse>, Status> {
        let r = req.into_inner();
        answer(
            async {
                ids(&[("user_id", r.user_id), ("conversation_id", r.conversation_id)])?;
                Ok(pb::LeaveResponse { changed: self.messages.remove(r.user_id, r.conversation_id, r.user_id).await? })
            }
            .await,
        )
    }

    async fn delete_message(&self, req: Request<pb::DeleteMessageRequest>) -> Result<Response<pb::DeleteMessageResponse>, Status> {
        let r = req.into_inner();
        answer(
            async {
                ids(&[("user_id", r.user_id), ("message_id", r.message_id)])?;
                Ok(pb::DeleteMessageResponse { changed: self.messages.delete_message(r.user_id, r.message_id).await? })
            }
            .await,
        )
    }

    async fn edit_message(&self, req: Request<pb::EditMessageRequest>) -> Result<Response<pb::EditMessageResponse>, Status> {
        let r = req.into_inner();
        let max = self.messages.config.messages.max_body_bytes;
        answer(
            async {
                let mut bad: Vec<Violation> =
                    [("user_id", r.user_id), ("message_id", r.message_id)].iter().filter_map(|(f, id)| validate_user_id(f, *id).err()).collect();
                if r.body.is_empty() || r.body.len() > max {
                    bad.push(Violation::new("body", format!("must hold 1 to {max} bytes, holds {}", r.body.len())));
                }
                if !bad.is_empty() {
                    return Err(ApiError::violations(bad));
                }
                let (changed, m) = self.messages.edit_message(r.user_id, r.message_id, &r.body).await?;
                Ok(pb::EditMessageResponse { changed, message: Some(message_pb(m)) })
            }
            .await,
        )
    }

    async fn rename_group(&self, req: Request<pb::RenameGroupRequest>) -> Result<Response<pb::RenameGroupResponse>, Status> {
        let r = req.into_inner();
        answer(
            async {
                let mut bad: Vec<Violation> = [("user_id", r.user_id), ("conversation_id", r.conversation_id)]
                    .iter()
                    .filter_map(|(f, id)| validate_user_id(f, *id).err())
                    .collect();
                bad.extend(validate_title(&r.title).err());
                if !bad.is_empty() {
                    return Err(ApiError::violations(bad));
                }
                Ok(pb::RenameGroupResponse { changed: self.messages.rename_group(r.user_id, r.conversation_id, &r.title).await? })
            }
            .await,
        )
    }

    async fn get_unread_counts(&self, req: Request<pb::GetUnreadCountsRequest>) -> Result<Response<pb::GetUnreadCountsResponse>, Status> {
        let r = req.into_inner();
        answer(
            async {
                ids(&[("user_id", r.user_id)])?;
                self.messages.unread_counts(r.user_id).await
            }
            .await,
        )
    }

    async fn batch_get_member_states(
        &self,
        req: Request<pb::BatchGetMemberStatesRequest>,
    ) -> Result<Response<pb::BatchGetMemberStatesResponse>, Status> {
        let r = req.into_inner();
        answer(
            async {
                if r.members.is_empty() || r.members.len() > socialgraph_domain::MAX_BATCH {
                    return Err(ApiError::invalid(
                        "members",
                        format!("must hold 1 to {} pairs, holds {}", socialgraph_domain::MAX_BATCH, r.members.len()),
                    ));
                }
                let mut bad = Vec::new();
                for (i, m) in r.members.iter().enumerate() {
                    bad.extend(validate_user_id(&format!("members[{i}].conversation_id"), m.conversation_id).err());
                    bad.extend(validate_user_id(&format!("members[{i}].user_id"), m.user_id).err());
                }
                if !bad.is_empty() {
                    return Err(ApiError::violations(bad));
                }
                let pairs: Vec<(i64, i64)> = r.members.iter().map(|m| (m.conversation_id, m.user_id)).collect();
                Ok(pb::BatchGetMemberStatesResponse { states: self.messages.member_states(&pairs).await? })
            }
            .await,
        )
    }
}
