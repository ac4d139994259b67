//! Reads of the mesh: the four paged lists and the batch lookups, converted to plain rows.

use prost_types::Timestamp;
use socialgraph_domain::{MAX_BATCH, timestamp_to_ms};
use socialgraph_proto::counter::v1::counter_service_client::CounterServiceClient;
use socialgraph_proto::counter::v1::{BatchGetEntityCountsRequest, BatchGetUserCountersRequest, EntityRef, UserCounters};
use socialgraph_proto::events::v1::Metric;
use socialgraph_proto::projection::v1::GetProjectionStatusRequest;
use socialgraph_proto::projection::v1::ListFollowersRequest;
use socialgraph_proto::projection::v1::projection_service_client::ProjectionServiceClient;
use socialgraph_proto::relation::v1 as rel;
use socialgraph_proto::relation::v1::relation_service_client::RelationServiceClient;
use tonic::transport::Channel;

use crate::endpoints::{COUNTER, Endpoints, PROJECTION, RELATION};
use crate::error::{CliError, CliResult};

/// A paged list of the mesh.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListQuery {
    /// Accounts `user_id` follows (relation-svc ListFollowing).
    Following {
        /// Whose list.
        user_id: i64,
    },
    /// Accounts following `user_id` (projection-svc ListFollowers).
    Followers {
        /// Whose list.
        user_id: i64,
    },
    /// Accounts both follow, in `user_id`'s follow order (ListCommonFollowing).
    Common {
        /// First user.
        user_id: i64,
        /// Second user.
        other_user_id: i64,
    },
    /// Accounts `viewer_id` follows that follow `user_id` (ListFamiliarFollowers).
    Familiar {
        /// Whose acquaintances.
        viewer_id: i64,
        /// Whose followers.
        user_id: i64,
    },
    /// Accounts `user_id` blocks, newest block first (ListBlocks; the entry's time is the
    /// block's).
    Blocks {
        /// Whose blocks.
        user_id: i64,
    },
    /// Accounts `user_id` mutes, newest mute first (ListMutes).
    Mutes {
        /// Whose mutes.
        user_id: i64,
    },
    /// Pending follow requests to (`outgoing` false) or from `user_id`, newest first
    /// (ListFollowRequests; the entry's time is the request's).
    Requests {
        /// Whose requests.
        user_id: i64,
        /// The requests `user_id` made instead of those made to it.
        outgoing: bool,
    },
}

/// One list entry: the account and the time that orders the list (of the follow; of the block
/// or mute for those lists).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listed {
    /// The account.
    pub user_id: i64,
    /// Follow time in ms since the Unix epoch; `None` if the server sent none.
    pub followed_at_ms: Option<i64>,
}

/// A connected client for the service that serves a [`ListQuery`].
#[derive(Debug, Clone)]
pub enum ListClient {
    /// relation-svc (following, common, familiar).
    Relation(RelationServiceClient<Channel>),
    /// projection-svc (followers).
    Projection(ProjectionServiceClient<Channel>),
}

fn ms(ts: Option<&Timestamp>) -> Option<i64> {
    ts.map(timestamp_to_ms)
}

fn follow_entries(v: Vec<rel::FollowEntry>) -> Vec<Listed> {
    v.into_iter().map(|e| Listed { user_id: e.user_id, followed_at_ms: ms(e.followed_at.as_ref()) }).collect()
}

fn restricted_entries(v: Vec<rel::RestrictedAccount>) -> Vec<Listed> {
    v.into_iter().map(|e| Listed { user_id: e.user_id, followed_at_ms: ms(e.created_at.as_ref()) }).collect()
}

impl ListQuery {
    /// Connects to the service that serves this list.
    ///
    /// # Errors
    /// [`CliError::Connect`].
    pub async fn client(&self, endpoints: &Endpoints) -> CliResult<ListClient> {
        Ok(match self {
            Self::Followers { .. } => ListClient::Projection(endpoints.projection().await?),
            _ => ListClient::Relation(endpoints.relation().await?),
        })
    }

    /// One page: entries newest first and the next page token (empty at the end).
    /// `page_size` 0 means the server's default (50); at most 1000.
    ///
    /// # Errors
    /// [`CliError::Rpc`] (bad ids, page size or token: INVALID_ARGUMENT);
    /// [`CliError::Usage`] when `client` serves another list.
    pub async fn page(&self, client: &mut ListClient, page_size: i32, page_token: String) -> CliResult<(Vec<Listed>, String)> {
        let wrong = || CliError::Usage("this list is served by another service".into());
        let relation_err = |s| CliError::rpc(RELATION, s);
        match (*self, client) {
            (Self::Followers { user_id }, ListClient::Projection(c)) => {
                let r = c
                    .list_followers(ListFollowersRequest { user_id, page_size, page_token, ..Default::default() })
                    .await
                    .map_err(|s| CliError::rpc(PROJECTION, s))?;
                let r = r.into_inner();
                let entries = r.followers.into_iter().map(|e| Listed { user_id: e.user_id, followed_at_ms: ms(e.followed_at.as_ref()) }).collect();
                Ok((entries, r.next_page_token))
            }
            (Self::Following { user_id }, ListClient::Relation(c)) => {
                let r = c.list_following(rel::ListFollowingRequest { user_id, page_size, page_token }).await.map_err(relation_err)?.into_inner();
                Ok((follow_entries(r.following), r.next_page_token))
            }
            (Self::Common { user_id, other_user_id }, ListClient::Relation(c)) => {
                let req = rel::ListCommonFollowingRequest { user_id, other_user_id, page_size, page_token };
                let r = c.list_common_following(req).await.map_err(relation_err)?.into_inner();
                Ok((follow_entries(r.accounts), r.next_page_token))
            }
            (Self::Familiar { viewer_id, user_id }, ListClient::Relation(c)) => {
                let req = rel::ListFamiliarFollowersRequest { viewer_id, user_id, page_size, page_token };
                let r = c.list_familiar_followers(req).await.map_err(relation_err)?.into_inner();
                Ok((follow_entries(r.accounts), r.next_page_token))
            }
            (Self::Blocks { user_id }, ListClient::Relation(c)) => {
                let r = c.list_blocks(rel::ListBlocksRequest { user_id, page_size, page_token }).await.map_err(relation_err)?.into_inner();
                Ok((restricted_entries(r.accounts), r.next_page_token))
            }
            (Self::Mutes { user_id }, ListClient::Relation(c)) => {
                let r = c.list_mutes(rel::ListMutesRequest { user_id, page_size, page_token }).await.map_err(relation_err)?.into_inner();
                Ok((restricted_entries(r.accounts), r.next_page_token))
            }
            (Self::Requests { user_id, outgoing }, ListClient::Relation(c)) => {
                let direction = if outgoing { rel::RequestDirection::Outgoing } else { rel::RequestDirection::Incoming } as i32;
                let req = rel::ListFollowRequestsRequest { user_id, direction, page_size, page_token };
                let r = c.list_follow_requests(req).await.map_err(relation_err)?.into_inner();
                Ok((restricted_entries(r.accounts), r.next_page_token))
            }
            _ => Err(wrong()),
        }
    }

    /// Every entry, following next page tokens from `page_token` to the end.
    ///
    /// # Errors
    /// As [`ListQuery::page`].
    pub async fn all(&self, client: &mut ListClient, page_size: i32, mut page_token: String) -> CliResult<Vec<Listed>> {
        let mut out = Vec::new();
        loop {
            let (entries, next) = self.page(client, page_size, page_token).await?;
            out.extend(entries);
            if next.is_empty() {
                return Ok(out);
            }
            page_token = next;
        }
    }
}

/// Both directions between `user_id` and each of `others`, in request order (batches of up
/// to 1000).
///
/// # Errors
/// [`CliError::Connect`]; [`CliError::Rpc`].
pub async fn relationships(endpoints: &Endpoints, user_id: i64, others: &[i64]) -> CliResult<Vec<rel::Relationship>> {
    let mut client = endpoints.relation().await?;
    let mut out = Vec::with_capacity(others.len());
    for chunk in others.chunks(MAX_BATCH) {
        let req = rel::BatchGetRelationshipsRequest { user_id, other_user_ids: chunk.to_vec() };
        out.extend(client.batch_get_relationships(req).await.map_err(|s| CliError::rpc(RELATION, s))?.into_inner().relationships);
    }
    Ok(out)
}

/// The counters of each user, in request order, `batch` users per request (≤ 1000).
///
/// # Errors
/// [`CliError::Rpc`].
pub async fn user_counters(client: &mut CounterServiceClient<Channel>, user_ids: &[i64], batch: usize) -> CliResult<Vec<UserCounters>> {
    let mut out = Vec::with_capacity(user_ids.len());
    for chunk in user_ids.chunks(batch.clamp(1, MAX_BATCH)) {
        let req = BatchGetUserCountersRequest { user_ids: chunk.to_vec(), ..Default::default() };
        out.extend(client.batch_get_user_counters(req).await.map_err(|s| CliError::rpc(COUNTER, s))?.into_inner().counters);
    }
    Ok(out)
}

/// Like and fav counts of entities of one type: (entity_id, likes, favs) in request order.
///
/// # Errors
/// [`CliError::Connect`]; [`CliError::Rpc`].
pub async fn entity_counts(endpoints: &Endpoints, entity_type: &str, ids: &[i64]) -> CliResult<Vec<(i64, u64, u64)>> {
    let mut client = endpoints.counter().await?;
    let mut out = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(MAX_BATCH) {
        let entities = chunk.iter().map(|&entity_id| EntityRef { entity_type: entity_type.to_owned(), entity_id }).collect();
        let req = BatchGetEntityCountsRequest { entities, metrics: vec![Metric::Like as i32, Metric::Fav as i32] };
        let counts = client.batch_get_entity_counts(req).await.map_err(|s| CliError::rpc(COUNTER, s))?.into_inner().counts;
        for (id, c) in chunk.iter().zip(counts) {
            let get = |m: Metric| c.counts.iter().find(|x| x.metric == m as i32).map_or(0, |x| x.count);
            out.push((*id, get(Metric::Like), get(Metric::Fav)));
        }
    }
    Ok(out)
}

/// projection-svc's per-partition progress.
///
/// # Errors
/// [`CliError::Connect`]; [`CliError::Rpc`].
pub async fn projection_status(endpoints: &Endpoints) -> CliResult<Vec<socialgraph_proto::projection::v1::PartitionStatus>> {
    let mut client = endpoints.projection().await?;
    let r = client.get_projection_status(GetProjectionStatusRequest {}).await.map_err(|s| CliError::rpc(PROJECTION, s))?;
    Ok(r.into_inner().partitions)
}
