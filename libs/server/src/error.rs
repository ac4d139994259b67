//! The one error type of the RPC layer and its single conversion to `tonic::Status`, carrying
//! google.rpc details (BadRequest, ErrorInfo, RetryInfo). Internal causes are logged with their
//! chain and never shown to the caller.

use std::collections::HashMap;
use std::time::Duration;

use socialgraph_domain::Violation;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// `ErrorInfo.domain` of every socialgraph error.
pub const DOMAIN: &str = "socialgraph";

/// UNAVAILABLE reason: the SQL database is unreachable, lost the connection, or stayed busy
/// (lock contention) through every retry.
pub const REASON_DATABASE: &str = "DATABASE_UNAVAILABLE";
/// UNAVAILABLE reason: counter-svc's Redis is unreachable or too slow.
pub const REASON_REDIS: &str = "REDIS_UNAVAILABLE";
/// UNAVAILABLE reason: relation-svc's follow rate limiter (Redis) is unreachable and
/// `limits.on_redis_error = closed`.
pub const REASON_RATE_LIMITER: &str = "RATE_LIMITER_UNAVAILABLE";
/// UNAVAILABLE reason: another service of the mesh this RPC needs did not answer.
pub const REASON_PEER: &str = "PEER_UNAVAILABLE";
/// UNAVAILABLE reason: the event log (Kafka) did not answer.
pub const REASON_BROKER: &str = "BROKER_UNAVAILABLE";

/// The API error of a database failure: UNAVAILABLE (reason [`REASON_DATABASE`]) for a lost
/// connection or a busy database (see `socialgraph_storage::is_unavailable` and
/// `is_retryable`), INTERNAL for everything else. The driver's text is logged, never returned.
pub fn db_error(e: sea_orm::DbErr) -> ApiError {
    db_unavailable(&e).unwrap_or_else(|| ApiError::internal(e))
}

/// [`db_error`] of one failed read whose error several callers share (identical reads in
/// flight answered by one): each gets the same status.
pub fn shared_db_error(e: &sea_orm::DbErr) -> ApiError {
    db_unavailable(e).unwrap_or_else(|| ApiError::internal(std::io::Error::other(e.to_string())))
}

/// UNAVAILABLE (logged) when `e` says the database is down or a retry may succeed.
fn db_unavailable(e: &sea_orm::DbErr) -> Option<ApiError> {
    (socialgraph_storage::is_unavailable(e) || socialgraph_storage::is_retryable(e)).then(|| {
        tracing::warn!(error = %e, "database unavailable");
        ApiError::unavailable(REASON_DATABASE, "database unavailable; retry")
    })
}

/// A result of the RPC layer.
pub type ApiResult<T> = Result<T, ApiError>;

/// What went wrong, by what the caller can do about it.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The request is malformed: fix it. `reason` is the ErrorInfo reason (e.g. SELF_FOLLOW).
    #[error("invalid argument: {}", describe(.violations))]
    InvalidArgument {
        /// Stable machine-readable reason.
        reason: &'static str,
        /// The fields at fault.
        violations: Vec<Violation>,
    },
    /// The request is valid but the system's state forbids it (e.g. FOLLOWING_LIMIT).
    #[error("{message}")]
    FailedPrecondition {
        /// Stable machine-readable reason.
        reason: &'static str,
        /// For a person.
        message: String,
        /// ErrorInfo metadata, e.g. the limit.
        metadata: HashMap<String, String>,
    },
    /// A quota is spent: retry after `retry_after` (RetryInfo).
    #[error("{message}")]
    ResourceExhausted {
        /// Stable machine-readable reason.
        reason: &'static str,
        /// For a person.
        message: String,
        /// When a retry can succeed.
        retry_after: Duration,
    },
    /// The call needs credentials the request does not carry, or carries but they cannot be
    /// verified: UNAUTHENTICATED with ErrorInfo `reason` (one of the `REASON_CREDENTIALS_*`
    /// constants). gRPC's rule: no or unverifiable credentials are UNAUTHENTICATED; a known
    /// caller refused a method or resource is PERMISSION_DENIED ([`ApiError::Forbidden`]).
    #[error("{message}")]
    Unauthenticated {
        /// Stable machine-readable reason.
        reason: &'static str,
        /// For a person; never names the expected credentials.
        message: String,
    },
    /// The resource the request names does not exist (e.g. a message id): NOT_FOUND with
    /// ErrorInfo `reason`.
    #[error("{message}")]
    NotFound {
        /// Stable machine-readable reason, e.g. UNKNOWN_MESSAGE.
        reason: &'static str,
        /// For a person.
        message: String,
    },
    /// The caller may not do this to this resource (e.g. read a conversation it is not a
    /// member of): PERMISSION_DENIED with ErrorInfo `reason`.
    #[error("{message}")]
    Forbidden {
        /// Stable machine-readable reason, e.g. NOT_A_MEMBER.
        reason: &'static str,
        /// For a person.
        message: String,
    },
    /// A dependency is down; retrying later may succeed. The caller gets `message` (never a
    /// driver's text), ErrorInfo with `reason` (one of the `UNAVAILABLE_*` constants) and
    /// RetryInfo of one second.
    #[error("unavailable: {message}")]
    Unavailable {
        /// Stable machine-readable reason, e.g. [`REASON_DATABASE`].
        reason: &'static str,
        /// Human-readable, opaque message.
        message: String,
    },
    /// A bug or an unexpected failure; details go to the log only.
    #[error("internal error: {0}")]
    Internal(Box<dyn std::error::Error + Send + Sync>),
}

/// Most field violations one error reports (message and BadRequest details alike): a batch of
/// 1,000 bad ids would otherwise make trailers larger than common clients accept (16 KiB).
pub const MAX_REPORTED_VIOLATIONS: usize = 10;

fn describe(v: &[Violation]) -> String {
    let shown = v.iter().take(MAX_REPORTED_VIOLATIONS).map(|v| format!("{}: {}", v.field, v.description)).collect::<Vec<_>>().join("; ");
    match v.len().saturating_sub(MAX_REPORTED_VIOLATIONS) {
        0 => shown,
        more => format!("{shown}; and {more} more"),
    }
}

impl ApiError {
    /// INVALID_ARGUMENT on one field, reason INVALID_ARGUMENT.
    pub fn invalid(field: impl Into<String>, description: impl Into<String>) -> Self {
        Self::InvalidArgument { reason: "INVALID_ARGUMENT", violations: vec![Violation::new(field, description)] }
    }

    /// INVALID_ARGUMENT on several fields.
    pub fn violations(violations: Vec<Violation>) -> Self {
        Self::InvalidArgument { reason: "INVALID_ARGUMENT", violations }
    }

    /// Wraps an unexpected failure.
    pub fn internal(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::Internal(Box::new(e))
    }

    /// UNAVAILABLE with `reason` (one of the `REASON_*` constants of a dependency) and an
    /// opaque `message`.
    pub fn unavailable(reason: &'static str, message: impl Into<String>) -> Self {
        Self::Unavailable { reason, message: message.into() }
    }
}

impl From<Violation> for ApiError {
    fn from(v: Violation) -> Self {
        Self::violations(vec![v])
    }
}

impl From<Vec<Violation>> for ApiError {
    fn from(v: Vec<Violation>) -> Self {
        Self::violations(v)
    }
}

impl From<ApiError> for Status {
    fn from(e: ApiError) -> Self {
        let message = e.to_string();
        let mut d = ErrorDetails::new();
        let code = match e {
            ApiError::InvalidArgument { reason, violations } => {
                for v in violations.into_iter().take(MAX_REPORTED_VIOLATIONS) {
                    d.add_bad_request_violation(v.field, v.description);
                }
                d.set_error_info(reason, DOMAIN, HashMap::new());
                Code::InvalidArgument
            }
            ApiError::FailedPrecondition { reason, metadata, .. } => {
                d.set_error_info(reason, DOMAIN, metadata);
                Code::FailedPrecondition
            }
            ApiError::ResourceExhausted { reason, retry_after, .. } => {
                d.set_error_info(reason, DOMAIN, HashMap::new());
                d.set_retry_info(Some(retry_after));
                Code::ResourceExhausted
            }
            ApiError::Unauthenticated { reason, .. } => {
                d.set_error_info(reason, DOMAIN, HashMap::new());
                Code::Unauthenticated
            }
            ApiError::NotFound { reason, .. } => {
                d.set_error_info(reason, DOMAIN, HashMap::new());
                Code::NotFound
            }
            ApiError::Forbidden { reason, .. } => {
                d.set_error_info(reason, DOMAIN, HashMap::new());
                Code::PermissionDenied
            }
            ApiError::Unavailable { reason, .. } => {
                d.set_error_info(reason, DOMAIN, HashMap::new());
                d.set_retry_info(Some(Duration::from_secs(1)));
                Code::Unavailable
            }
            ApiError::Internal(cause) => {
                let mut chain = cause.to_string();
                let mut src = cause.source();
                while let Some(s) = src {
                    chain.push_str(": ");
                    chain.push_str(&s.to_string());
                    src = s.source();
                }
                tracing::error!(error = %chain, "internal error");
                return Status::internal("internal error");
            }
        };
        Status::with_error_details(code, message, d)
    }
}

/// The google.rpc ErrorInfo reason of a status another service answered (`None` without one).
pub fn reason_of(status: &Status) -> Option<String> {
    status.get_error_details().error_info().map(|i| i.reason.clone())
}
