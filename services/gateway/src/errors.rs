//! Errors as HTTP: a `google.rpc.Status` JSON body (code, message, details with their `@type`)
//! under the HTTP status of the standard gRPC mapping (the table in `google/rpc/code.proto`),
//! with `Retry-After` whenever the service sent RetryInfo.

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use prost_reflect::{DynamicMessage, MessageDescriptor, Value};
use serde_json::json;
use tonic::Code;
use tonic_types::StatusExt;

/// FAILED_PRECONDITION reasons that mean "conflicts with the current state of another
/// resource" and answer 409 Conflict; every other FAILED_PRECONDITION (e.g. FOLLOWING_LIMIT)
/// answers 400 as in the standard mapping.
pub const CONFLICT_REASONS: &[&str] = &["BLOCKED", "ACCOUNT_INACTIVE", "ACCOUNT_DELETING", "POST_ID_TAKEN"];

/// The HTTP status of a gRPC `code`; `reason` is the ErrorInfo reason, if any.
pub fn http_status(code: Code, reason: Option<&str>) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::FailedPrecondition if reason.is_some_and(|r| CONFLICT_REASONS.contains(&r)) => StatusCode::CONFLICT,
        Code::FailedPrecondition => StatusCode::BAD_REQUEST,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        // 499 "Client Closed Request", as in the standard mapping.
        Code::Cancelled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

fn json_response(http: StatusCode, body: String, retry_after_secs: Option<u64>) -> Response {
    let mut response = (http, [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], body).into_response();
    if let Some(secs) = retry_after_secs {
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    response
}

/// The JSON of `status`'s google.rpc.Status (`status_desc`) in field order (code, message,
/// details), details decoded by their type names; only code and message when the details are
/// absent or cannot be printed.
fn status_json(status: &tonic::Status, status_desc: &MessageDescriptor) -> String {
    let plain = || json!({"code": status.code() as i32, "message": status.message()}).to_string();
    let Ok(mut message) = DynamicMessage::decode(status_desc.clone(), status.details()) else { return plain() };
    message.set_field_by_name("code", Value::I32(status.code() as i32));
    message.set_field_by_name("message", Value::String(status.message().to_owned()));
    serde_json::to_string(&message).unwrap_or_else(|_| plain())
}

/// True when `status` was made by the gRPC client from a broken exchange with something that
/// is not a working gRPC service (an HTTP/2 protocol error, an HTTP answer without a gRPC
/// status), rather than sent by a service.
fn upstream_fault(status: &tonic::Status) -> bool {
    use std::error::Error;
    matches!(status.code(), Code::Internal | Code::Unknown | Code::Unimplemented)
        && (status.source().is_some() || status.message().starts_with("grpc-status header missing") || status.message().contains("protocol error"))
}

/// The HTTP answer to a service's error `status`; 502 Bad Gateway when the upstream is not a
/// working gRPC service.
pub fn from_status(status: &tonic::Status, status_desc: &MessageDescriptor) -> Response {
    if upstream_fault(status) {
        return gateway_error(
            StatusCode::BAD_GATEWAY,
            Code::Unavailable,
            &format!("the upstream did not answer as a gRPC service: {}", status.message()),
            &[],
        );
    }
    let reason = status.get_details_error_info().map(|e| e.reason);
    let retry_after = status.get_details_retry_info().and_then(|r| r.retry_delay).map(|d| d.as_secs_f64().ceil().max(1.0) as u64);
    let mut response = json_response(http_status(status.code(), reason.as_deref()), status_json(status, status_desc), retry_after);
    if status.code() == Code::Unauthenticated {
        response.headers_mut().insert(header::WWW_AUTHENTICATE, www_authenticate(reason.as_deref()));
    }
    response
}

/// The challenge of a 401 answer (RFC 7235 §4.1 requires one): the bearer scheme, with RFC 6750's
/// `invalid_token` when a token was sent and refused.
fn www_authenticate(reason: Option<&str>) -> HeaderValue {
    if reason == Some("CREDENTIALS_INVALID") {
        HeaderValue::from_static("Bearer realm=\"socialgraph\", error=\"invalid_token\"")
    } else {
        HeaderValue::from_static("Bearer realm=\"socialgraph\"")
    }
}

/// A google.rpc.Status body in proto field order (code, message, details), as the services'
/// errors print.
#[derive(serde::Serialize)]
struct StatusBody<'a> {
    code: i32,
    message: &'a str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    details: Vec<serde_json::Value>,
}

/// An error found by the gateway itself (bad path, bad JSON, limits): `code` with `message`,
/// and a google.rpc.BadRequest of `violations` (field, description) when there are any.
pub fn gateway_error(http: StatusCode, code: Code, message: &str, violations: &[(String, String)]) -> Response {
    let mut details = Vec::new();
    if !violations.is_empty() {
        let list: Vec<_> = violations.iter().map(|(f, d)| json!({"field": f, "description": d})).collect();
        details.push(json!({"@type": "type.googleapis.com/google.rpc.BadRequest", "fieldViolations": list}));
    }
    let body = serde_json::to_string(&StatusBody { code: code as i32, message, details }).unwrap_or_default();
    let retry = (http == StatusCode::SERVICE_UNAVAILABLE).then_some(1);
    json_response(http, body, retry)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_to_the_standard_http_statuses() {
        assert_eq!(http_status(Code::InvalidArgument, None), StatusCode::BAD_REQUEST);
        assert_eq!(http_status(Code::NotFound, None), StatusCode::NOT_FOUND);
        assert_eq!(http_status(Code::FailedPrecondition, Some("FOLLOWING_LIMIT")), StatusCode::BAD_REQUEST);
        assert_eq!(http_status(Code::FailedPrecondition, Some("BLOCKED")), StatusCode::CONFLICT);
        assert_eq!(http_status(Code::ResourceExhausted, Some("RATE_LIMITED")), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(http_status(Code::Unavailable, None), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(http_status(Code::DeadlineExceeded, None), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(http_status(Code::PermissionDenied, None), StatusCode::FORBIDDEN);
        assert_eq!(http_status(Code::Unauthenticated, None), StatusCode::UNAUTHORIZED);
        assert_eq!(http_status(Code::Cancelled, None).as_u16(), 499);
    }

    #[tokio::test]
    async fn a_status_with_details_prints_them_decoded_with_retry_after() -> Result<(), Box<dyn std::error::Error>> {
        let pool = socialgraph_httpapi::pool()?;
        let desc = pool.get_message_by_name("google.rpc.Status").ok_or("no google.rpc.Status")?;
        let details = tonic_types::ErrorDetails::with_retry_info(Some(std::time::Duration::from_millis(1500)));
        let mut details = details;
        details.set_error_info("RATE_LIMITED", "socialgraph", std::collections::HashMap::new());
        let status = tonic::Status::with_error_details(Code::ResourceExhausted, "slow down", details);
        let own = gateway_error(StatusCode::BAD_REQUEST, Code::InvalidArgument, "no", &[("f".into(), "d".into())]);
        let own = axum::body::to_bytes(own.into_body(), 1 << 16).await?;
        assert!(own.starts_with(br#"{"code":3,"message":"no","details":["#), "the gateway's own errors keep the field order too");
        let response = from_status(&status, &desc);
        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(response.headers()[header::RETRY_AFTER], "2");
        let text = status_json(&status, &desc);
        assert!(text.starts_with(r#"{"code":8,"message":"slow down","details":["#), "fields in proto order: {text}");
        let json: serde_json::Value = serde_json::from_str(&text)?;
        assert_eq!(json["code"], 8);
        assert_eq!(json["message"], "slow down");
        let text = json["details"].to_string();
        assert!(text.contains("type.googleapis.com/google.rpc.ErrorInfo") && text.contains("RATE_LIMITED"), "{text}");
        assert!(text.contains("\"retryDelay\":\"1.500s\""), "{text}");
        Ok(())
    }
}
