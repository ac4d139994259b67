//! The socialgraph v1 contract: messages and gRPC clients/servers generated from `proto/`.
//! Modules mirror the protobuf packages (`socialgraph.relation.v1` → [`relation::v1`]).
#![allow(missing_docs)]

/// Encoded `FileDescriptorSet` of every socialgraph proto file, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/socialgraph_descriptor.bin"));

/// Encoded `FileDescriptorSet` of the google.rpc Status and error details the services send
/// (Status, BadRequest, ErrorInfo, RetryInfo, and the google.protobuf.Duration and Any they use),
/// for server reflection, so reflection clients decode a status's details, and for the gateway,
/// which prints them as JSON.
pub const ERROR_DETAILS_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/error_details_descriptor.bin"));

/// Event messages carried by Kafka records.
pub mod events {
    /// Version 1 of the event schema (Kafka header `schema: v1`).
    pub mod v1 {
        tonic::include_proto!("socialgraph.events.v1");
    }
}

/// RelationService: the following table, its outbox, and following-side reads.
pub mod relation {
    /// Version 1.
    pub mod v1 {
        tonic::include_proto!("socialgraph.relation.v1");
    }
}

/// ProjectionService: the follower table and follower-side reads.
pub mod projection {
    /// Version 1.
    pub mod v1 {
        tonic::include_proto!("socialgraph.projection.v1");
    }
}

/// CounterService: user counters and entity like/fav counts.
pub mod counter {
    /// Version 1.
    pub mod v1 {
        tonic::include_proto!("socialgraph.counter.v1");
    }
}

/// FeedService: home timelines (push, pull, hybrid) and the post entry point.
pub mod feed {
    /// Version 1.
    pub mod v1 {
        tonic::include_proto!("socialgraph.feed.v1");
    }
}

pub use prost_types::Timestamp;

/// MessageService: private and group conversations, read cursors and unread counts.
pub mod message {
    /// Version 1.
    pub mod v1 {
        tonic::include_proto!("socialgraph.message.v1");
    }
}
