//! The gRPC side: a few HTTP/2 channels per service, used in turn, and unary calls whose
//! request and response are already-encoded protobuf bytes (the gateway encodes and decodes
//! them itself from the descriptors, so one codec serves every RPC).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::{Channel, Endpoint};

use crate::config::UpstreamSettings;

/// A codec that moves encoded messages through unchanged.
#[derive(Debug, Clone, Copy, Default)]
struct RawCodec;

impl Encoder for RawCodec {
    type Item = Bytes;
    type Error = tonic::Status;
    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Bytes;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, tonic::Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;
    fn encoder(&mut self) -> RawCodec {
        *self
    }
    fn decoder(&mut self) -> RawCodec {
        *self
    }
}

/// The channels to one service, handed out round-robin.
#[derive(Clone)]
pub struct Pool {
    channels: Arc<[Channel]>,
    next: Arc<AtomicUsize>,
}

impl Pool {
    fn new(url: &str, settings: &UpstreamSettings) -> anyhow::Result<Self> {
        let endpoint = Endpoint::from_shared(url.to_owned())?.connect_timeout(Duration::from_millis(settings.connect_timeout_ms)).tcp_nodelay(true);
        let channels: Vec<Channel> = (0..settings.channels.max(1)).map(|_| endpoint.connect_lazy()).collect();
        Ok(Self { channels: channels.into(), next: Arc::new(AtomicUsize::new(0)) })
    }

    /// Calls the unary RPC at `path` (`/package.Service/Method`) with the encoded `request`
    /// (metadata and deadline already set on it) and returns the encoded response.
    ///
    /// # Errors
    /// The service's status, or UNAVAILABLE when it cannot be reached.
    pub async fn unary(&self, path: &str, request: tonic::Request<Bytes>) -> Result<Bytes, tonic::Status> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.channels.len();
        let mut grpc = tonic::client::Grpc::new(self.channels[i].clone());
        grpc.ready().await.map_err(|e| tonic::Status::unavailable(format!("service not reachable: {e}")))?;
        let path = http::uri::PathAndQuery::try_from(path).map_err(|e| tonic::Status::internal(e.to_string()))?;
        Ok(grpc.unary(request, path, RawCodec).await?.into_inner())
    }
}

/// The pools of the four services, by gRPC service full name.
#[derive(Clone)]
pub struct Upstreams {
    relation: Pool,
    projection: Pool,
    counter: Pool,
    /// `None` when no message-svc is configured.
    message: Option<Pool>,
}

impl Upstreams {
    /// Lazy channels to the services in `settings` (nothing connects before the first call).
    ///
    /// # Errors
    /// A URL is malformed (the message names the key).
    pub fn new(settings: &UpstreamSettings) -> anyhow::Result<Self> {
        use anyhow::Context;
        Ok(Self {
            relation: Pool::new(&settings.relation_url, settings).context("upstream.relation_url")?,
            projection: Pool::new(&settings.projection_url, settings).context("upstream.projection_url")?,
            counter: Pool::new(&settings.counter_url, settings).context("upstream.counter_url")?,
            message: match settings.message_url.as_str() {
                "" => None,
                url => Some(Pool::new(url, settings).context("upstream.message_url")?),
            },
        })
    }

    /// Whether `full_name` is one of the mesh's gRPC services (configured or not).
    pub fn knows(full_name: &str) -> bool {
        matches!(
            full_name,
            "socialgraph.relation.v1.RelationService"
                | "socialgraph.projection.v1.ProjectionService"
                | "socialgraph.feed.v1.FeedService"
                | "socialgraph.counter.v1.CounterService"
                | "socialgraph.message.v1.MessageService"
        )
    }

    /// The pool serving the gRPC service `full_name`, if it is one of the mesh's and configured.
    pub fn for_service(&self, full_name: &str) -> Option<&Pool> {
        match full_name {
            "socialgraph.relation.v1.RelationService" => Some(&self.relation),
            // FeedService is served by projection-svc beside ProjectionService.
            "socialgraph.projection.v1.ProjectionService" | "socialgraph.feed.v1.FeedService" => Some(&self.projection),
            "socialgraph.counter.v1.CounterService" => Some(&self.counter),
            "socialgraph.message.v1.MessageService" => self.message.as_ref(),
            _ => None,
        }
    }
}
