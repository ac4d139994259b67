//! FeedService over gRPC: convert the request, call [`Feed`], map the result.

use std::sync::Arc;

use secrecy::SecretString;
use socialgraph_domain::{now_ms, timestamp_from_ms, timestamp_to_ms, validate_user_id};
use socialgraph_proto::feed::v1 as pb;
use socialgraph_proto::feed::v1::feed_service_server::{FeedService, FeedServiceServer};
use socialgraph_server::ApiError;
use tonic::{Request, Response, Status};

use super::Feed;
use super::read::PostPage;
use super::walk::Walk;

/// The tonic implementation of `socialgraph.feed.v1.FeedService`.
pub struct FeedGrpc {
    feed: Arc<Feed>,
    admin_token: Option<SecretString>,
}

impl FeedGrpc {
    /// FeedService's server over `feed`; RebuildInboxes needs `Bearer <admin_token>`.
    pub fn server(feed: Arc<Feed>, admin_token: Option<SecretString>) -> FeedServiceServer<Self> {
        FeedServiceServer::new(Self { feed, admin_token })
    }
}

fn posts(page: PostPage) -> (Vec<pb::TimelinePost>, String) {
    let posts = page
        .posts
        .into_iter()
        .map(|e| pb::TimelinePost { post_id: e.key.post_id, author_id: e.author_id, created_at: Some(timestamp_from_ms(e.key.created_at_ms)) })
        .collect();
    (posts, page.next_page_token)
}

#[tonic::async_trait]
impl FeedService for FeedGrpc {
    async fn publish_post(&self, req: Request<pb::PublishPostRequest>) -> Result<Response<pb::PublishPostResponse>, Status> {
        let r = req.into_inner();
        let at = match &r.created_at {
            Some(ts) => {
                socialgraph_domain::validate_timestamp("created_at", ts).map_err(ApiError::from)?;
                timestamp_to_ms(ts)
            }
            None => now_ms(),
        };
        self.feed.append(r.author_id, r.post_id, at, true).await?;
        Ok(Response::new(pb::PublishPostResponse {}))
    }

    async fn delete_post(&self, req: Request<pb::DeletePostRequest>) -> Result<Response<pb::DeletePostResponse>, Status> {
        let r = req.into_inner();
        self.feed.append(r.author_id, r.post_id, now_ms(), false).await?;
        Ok(Response::new(pb::DeletePostResponse {}))
    }

    async fn get_timeline(&self, req: Request<pb::GetTimelineRequest>) -> Result<Response<pb::GetTimelineResponse>, Status> {
        let r = req.into_inner();
        let walk = Walk::of(r.min_post_id, r.since_post_id)?;
        let (posts, next_page_token) = posts(self.feed.timeline(r.user_id, walk, r.page_size, &r.page_token).await?);
        Ok(Response::new(pb::GetTimelineResponse { posts, next_page_token }))
    }

    async fn list_author_posts(&self, req: Request<pb::ListAuthorPostsRequest>) -> Result<Response<pb::ListAuthorPostsResponse>, Status> {
        let r = req.into_inner();
        let (posts, next_page_token) = posts(self.feed.author_posts(r.author_id, r.page_size, &r.page_token).await?);
        Ok(Response::new(pb::ListAuthorPostsResponse { posts, next_page_token }))
    }

    async fn rebuild_inboxes(&self, req: Request<pb::RebuildInboxesRequest>) -> Result<Response<pb::RebuildInboxesResponse>, Status> {
        socialgraph_server::auth::require_admin(self.admin_token.as_ref(), req.metadata())?;
        let (inboxes, entries_written) = match req.into_inner().target {
            Some(pb::rebuild_inboxes_request::Target::UserId(id)) => {
                validate_user_id("user_id", id).map_err(ApiError::from)?;
                (1, self.feed.rebuild_user(id).await?)
            }
            Some(pb::rebuild_inboxes_request::Target::All(true)) => self.feed.rebuild_all().await?,
            _ => return Err(ApiError::invalid("target", "set user_id (> 0) or all = true").into()),
        };
        Ok(Response::new(pb::RebuildInboxesResponse { inboxes, entries_written }))
    }
}
