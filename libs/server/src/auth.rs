//! Admin RPC credentials: `authorization: Bearer <token>` compared in constant time.

use secrecy::{ExposeSecret, SecretString};

use crate::{ApiError, ApiResult};

/// Checks the admin bearer token of a request.
///
/// # Errors
/// PERMISSION_DENIED when no admin token is configured (admin RPCs are off);
/// UNAUTHENTICATED when the header is missing or wrong.
pub fn require_admin(configured: Option<&SecretString>, metadata: &tonic::metadata::MetadataMap) -> ApiResult<()> {
    let Some(token) = configured else {
        return Err(ApiError::PermissionDenied("admin RPCs are disabled: configure auth.admin_token".into()));
    };
    let header = metadata.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or_default();
    // The scheme is case-insensitive (RFC 7235 §2.1); the token is not.
    let given = match header.split_once(' ') {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("bearer") => rest,
        _ => "",
    };
    let expected = token.expose_secret();
    // Constant time, so the token cannot be learnt byte by byte from response times.
    let same = !given.is_empty() && given.len() == expected.len() && given.bytes().zip(expected.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0;
    if same { Ok(()) } else { Err(ApiError::Unauthenticated("missing or wrong admin bearer token".into())) }
}
