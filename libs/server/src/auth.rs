//! Admin RPC credentials: `authorization: Bearer <token>` compared in constant time.
//!
//! Every refusal here is UNAUTHENTICATED, as gRPC's status rules ask of a request whose
//! credentials are missing or cannot be verified; the ErrorInfo reason tells which.
//! PERMISSION_DENIED is kept for callers that are known and still may not do a thing.

use secrecy::{ExposeSecret, SecretString};

use crate::{ApiError, ApiResult};

/// ErrorInfo reason: the request carries no `authorization` header (or no bearer token in it).
pub const REASON_CREDENTIALS_MISSING: &str = "CREDENTIALS_MISSING";
/// ErrorInfo reason: the bearer token is not the configured one.
pub const REASON_CREDENTIALS_INVALID: &str = "CREDENTIALS_INVALID";
/// ErrorInfo reason: no admin token is configured, so no credentials can be verified and the
/// admin RPCs are off.
pub const REASON_ADMIN_DISABLED: &str = "ADMIN_RPCS_DISABLED";

/// UNAUTHENTICATED with `reason` and `message`.
pub fn unauthenticated(reason: &'static str, message: impl Into<String>) -> ApiError {
    ApiError::Unauthenticated { reason, message: message.into() }
}

/// The bearer token of `authorization`, if the header holds one. The scheme is
/// case-insensitive (RFC 7235 §2.1); the token is not.
fn bearer(metadata: &tonic::metadata::MetadataMap) -> Option<&str> {
    let header = metadata.get("authorization")?.to_str().ok()?;
    match header.split_once(' ') {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("bearer") && !rest.is_empty() => Some(rest),
        _ => None,
    }
}

/// Checks the admin bearer token of a request.
///
/// # Errors
/// UNAUTHENTICATED with reason [`REASON_CREDENTIALS_MISSING`] when the request carries no
/// bearer token, [`REASON_CREDENTIALS_INVALID`] when it is wrong, and
/// [`REASON_ADMIN_DISABLED`] when no admin token is configured.
pub fn require_admin(configured: Option<&SecretString>, metadata: &tonic::metadata::MetadataMap) -> ApiResult<()> {
    let Some(token) = configured else {
        return Err(unauthenticated(REASON_ADMIN_DISABLED, "admin RPCs are disabled: no admin token is configured (auth.admin_token)"));
    };
    let Some(given) = bearer(metadata) else {
        return Err(unauthenticated(REASON_CREDENTIALS_MISSING, "this RPC needs the admin bearer token in the authorization header"));
    };
    let expected = token.expose_secret();
    // Constant time, so the token cannot be learnt byte by byte from response times.
    let same = given.len() == expected.len() && given.bytes().zip(expected.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0;
    if same { Ok(()) } else { Err(unauthenticated(REASON_CREDENTIALS_INVALID, "the admin bearer token is wrong")) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(header: Option<&str>) -> tonic::metadata::MetadataMap {
        let mut md = tonic::metadata::MetadataMap::new();
        if let Some(h) = header {
            md.insert("authorization", h.parse().expect("header"));
        }
        md
    }

    fn reason(r: ApiResult<()>) -> Option<&'static str> {
        match r {
            Err(ApiError::Unauthenticated { reason, .. }) => Some(reason),
            _ => None,
        }
    }

    #[test]
    fn every_refusal_is_unauthenticated_with_its_reason() {
        let token = SecretString::from("s3cret");
        assert!(require_admin(Some(&token), &with(Some("Bearer s3cret"))).is_ok());
        assert!(require_admin(Some(&token), &with(Some("bearer s3cret"))).is_ok(), "the scheme is case-insensitive");
        assert_eq!(reason(require_admin(Some(&token), &with(None))), Some(REASON_CREDENTIALS_MISSING));
        assert_eq!(reason(require_admin(Some(&token), &with(Some("Bearer")))), Some(REASON_CREDENTIALS_MISSING));
        assert_eq!(reason(require_admin(Some(&token), &with(Some("Basic czNjcmV0")))), Some(REASON_CREDENTIALS_MISSING));
        assert_eq!(reason(require_admin(Some(&token), &with(Some("Bearer S3CRET")))), Some(REASON_CREDENTIALS_INVALID));
        assert_eq!(reason(require_admin(Some(&token), &with(Some("Bearer s3cre")))), Some(REASON_CREDENTIALS_INVALID));
        assert_eq!(reason(require_admin(None, &with(Some("Bearer s3cret")))), Some(REASON_ADMIN_DISABLED));
        assert_eq!(reason(require_admin(None, &with(None))), Some(REASON_ADMIN_DISABLED));
    }

    #[test]
    fn the_status_carries_the_code_and_reason() {
        let status = tonic::Status::from(require_admin(Some(&SecretString::from("x")), &with(None)).unwrap_err());
        assert_eq!(status.code(), tonic::Code::Unauthenticated);
        assert_eq!(crate::reason_of(&status).as_deref(), Some(REASON_CREDENTIALS_MISSING));
    }
}
