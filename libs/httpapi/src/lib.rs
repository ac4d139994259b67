//! The HTTP/JSON face of the socialgraph contract, derived from the proto alone:
//! - [`routes`]: one route per `google.api.http` annotation of an RPC (`proto/`), the table the
//!   gateway serves;
//! - [`openapi::document`]: the OpenAPI 3.0 document of those routes, with request and response
//!   schemas in the proto3 JSON mapping (int64 as strings, Timestamps as RFC 3339, enums by name)
//!   and errors as `google.rpc.Status`.
//!
//! Nothing here is kept by hand in step with the proto: a new annotated RPC is a new route and
//! a new OpenAPI operation.

pub mod openapi;
pub mod routes;
pub mod template;

pub use routes::{BodyMapping, Route, field_at, routes, unrouted};
pub use template::{Bindings, Segment, Template};

use prost_reflect::DescriptorPool;

/// Why the route table could not be read from the descriptors.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    /// The descriptors could not be decoded.
    #[error("descriptor set: {0}")]
    Descriptors(#[from] prost_reflect::DescriptorError),
    /// `google/api/annotations.proto` is not among the descriptors.
    #[error("the descriptors do not declare the google.api.http option")]
    NoAnnotation,
    /// A path template uses syntax the gateway does not serve.
    #[error("path template {template:?}: {why}")]
    Template {
        /// The template.
        template: String,
        /// What is wrong.
        why: String,
    },
    /// A rule cannot be served as written.
    #[error("google.api.http of {rpc}: {why}")]
    Rule {
        /// Full name of the RPC.
        rpc: String,
        /// What is wrong.
        why: String,
    },
    /// Two routes would answer the same requests.
    #[error("{a} and {b} both route {template}")]
    Conflict {
        /// One RPC.
        a: String,
        /// The other.
        b: String,
        /// The template.
        template: String,
    },
}

/// Every socialgraph descriptor plus the google.rpc Status and error details, in one pool: what
/// the routes, the JSON mapping of requests, responses and errors, and the OpenAPI document need.
///
/// # Errors
/// The embedded descriptor sets do not decode (a build defect).
pub fn pool() -> Result<DescriptorPool, RouteError> {
    let mut pool = DescriptorPool::decode(socialgraph_proto::FILE_DESCRIPTOR_SET)?;
    pool.decode_file_descriptor_set(socialgraph_proto::ERROR_DETAILS_DESCRIPTOR_SET)?;
    Ok(pool)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rpc_has_a_route_except_the_admin_and_streaming_ones() -> Result<(), RouteError> {
        let pool = pool()?;
        let all = routes(&pool)?;
        assert!(all.len() >= 49, "{} routes", all.len());
        let mut left = unrouted(&pool)?;
        left.sort();
        assert_eq!(
            left,
            [
                "CounterService.RebuildEntityCounts",
                "CounterService.RebuildUnreadCounts",
                "CounterService.RebuildUserCounters",
                "FeedService.RebuildInboxes",
                "MessageService.BatchGetMemberStates",
                "MessageService.GetUnreadCounts",
                "MessageService.Subscribe",
                "ProjectionService.Rebuild",
                "RelationService.ImportFollows",
                "RelationService.ScanEdges",
            ],
            "every public RPC needs a google.api.http annotation; only admin RPCs, message-svc's exact \
             unread reads (what counter-svc rebuilds from) and the Subscribe stream go without"
        );
        let follow = all.iter().find(|r| r.label() == "RelationService.Follow").expect("Follow is routed");
        assert_eq!((follow.method.as_str(), follow.template.text.as_str()), ("POST", "/v1/users/{follower_id}/following/{followee_id}"));
        assert_eq!(follow.grpc_path(), "/socialgraph.relation.v1.RelationService/Follow");
        Ok(())
    }
}
