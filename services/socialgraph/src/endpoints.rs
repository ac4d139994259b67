//! Where the mesh's services are, and connected clients for them.

use socialgraph_proto::counter::v1::counter_service_client::CounterServiceClient;
use socialgraph_proto::projection::v1::projection_service_client::ProjectionServiceClient;
use socialgraph_proto::relation::v1::relation_service_client::RelationServiceClient;
use tonic::transport::{Channel, Endpoint};

use crate::error::{CliError, CliResult, chain};

/// Largest response accepted (a page of 1000 entries is far below it).
const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// Service name of relation-svc in messages.
pub const RELATION: &str = "relation-svc";
/// Service name of projection-svc in messages.
pub const PROJECTION: &str = "projection-svc";
/// Service name of counter-svc in messages.
pub const COUNTER: &str = "counter-svc";
/// Service name of message-svc in messages.
pub const MESSAGE: &str = "message-svc";

/// The mesh's gRPC endpoints (URLs such as `http://127.0.0.1:50051`) and the admin bearer
/// token sent with admin RPCs (ImportFollows).
#[derive(Debug, Clone)]
pub struct Endpoints {
    /// relation-svc (default port 50051).
    pub relation: String,
    /// projection-svc (default port 50052).
    pub projection: String,
    /// counter-svc (default port 50053).
    pub counter: String,
    /// message-svc (default port 50054).
    pub message: String,
    /// Admin token; `None` sends admin RPCs without credentials (the service refuses them).
    pub admin_token: Option<String>,
}

impl Default for Endpoints {
    /// The default ports (docs/src/architecture/overview.md#ports) on 127.0.0.1, no admin token.
    fn default() -> Self {
        Self {
            relation: "http://127.0.0.1:50051".into(),
            projection: "http://127.0.0.1:50052".into(),
            counter: "http://127.0.0.1:50053".into(),
            message: "http://127.0.0.1:50054".into(),
            admin_token: None,
        }
    }
}

async fn channel(service: &'static str, url: &str) -> CliResult<Channel> {
    let connect = |reason: String| CliError::Connect { service, url: url.to_owned(), reason };
    let endpoint = Endpoint::from_shared(url.to_owned()).map_err(|e| connect(chain(&e)))?;
    endpoint.tcp_nodelay(true).connect().await.map_err(|e| connect(chain(&e)))
}

impl Endpoints {
    /// A connected RelationService client.
    ///
    /// # Errors
    /// [`CliError::Connect`] when the URL is malformed or nothing answers there.
    pub async fn relation(&self) -> CliResult<RelationServiceClient<Channel>> {
        Ok(RelationServiceClient::new(channel(RELATION, &self.relation).await?).max_decoding_message_size(MAX_MESSAGE_BYTES))
    }

    /// A connected ProjectionService client.
    ///
    /// # Errors
    /// [`CliError::Connect`] when the URL is malformed or nothing answers there.
    pub async fn projection(&self) -> CliResult<ProjectionServiceClient<Channel>> {
        Ok(ProjectionServiceClient::new(channel(PROJECTION, &self.projection).await?).max_decoding_message_size(MAX_MESSAGE_BYTES))
    }

    /// A connected FeedService client (served by projection-svc).
    ///
    /// # Errors
    /// [`CliError::Connect`] when the URL is malformed or nothing answers there.
    pub async fn feed(&self) -> CliResult<socialgraph_proto::feed::v1::feed_service_client::FeedServiceClient<Channel>> {
        Ok(socialgraph_proto::feed::v1::feed_service_client::FeedServiceClient::new(channel(PROJECTION, &self.projection).await?)
            .max_decoding_message_size(MAX_MESSAGE_BYTES))
    }

    /// A connected CounterService client.
    ///
    /// # Errors
    /// [`CliError::Connect`] when the URL is malformed or nothing answers there.
    pub async fn counter(&self) -> CliResult<CounterServiceClient<Channel>> {
        Ok(CounterServiceClient::new(channel(COUNTER, &self.counter).await?).max_decoding_message_size(MAX_MESSAGE_BYTES))
    }

    /// A connected MessageService client.
    ///
    /// # Errors
    /// [`CliError::Connect`] when the URL is malformed or nothing answers there.
    pub async fn message(&self) -> CliResult<socialgraph_proto::message::v1::message_service_client::MessageServiceClient<Channel>> {
        Ok(socialgraph_proto::message::v1::message_service_client::MessageServiceClient::new(channel(MESSAGE, &self.message).await?)
            .max_decoding_message_size(MAX_MESSAGE_BYTES))
    }

    /// Wraps `msg` in a request carrying `authorization: Bearer <admin token>` when a token is
    /// set.
    ///
    /// # Errors
    /// [`CliError::Usage`] when the token cannot be sent as a header value.
    pub fn admin_request<T>(&self, msg: T) -> CliResult<tonic::Request<T>> {
        let mut req = tonic::Request::new(msg);
        if let Some(token) = &self.admin_token {
            let value = format!("Bearer {token}").parse().map_err(|_| CliError::Usage("the admin token must be printable ASCII".into()))?;
            req.metadata_mut().insert("authorization", value);
        }
        Ok(req)
    }
}
