//! Request-side rules of AIP-158 lists shared by every service: owner ids, page size and page
//! token checked together, so one response names every bad field.

use secrecy::ExposeSecret;
use socialgraph_domain::{Cursor, ListKind, PageTokenKey, Violation, validate_user_id};

use crate::{ApiError, ApiResult};

/// A validated list request.
#[derive(Debug, Clone, Copy)]
pub struct PageRequest {
    /// Entries to return (1..=1000).
    pub size: usize,
    /// Resume strictly after this entry; `None` for the first page.
    pub after: Option<Cursor>,
}

/// Validates a list request: each `(field, id)` in `owners` must be > 0, `page_size` in
/// 0..=1000 (0 → 50), and `token` empty or a token of this list (kind and owner ids).
///
/// # Errors
/// INVALID_ARGUMENT naming every bad field; reason BAD_PAGE_TOKEN for a bad token.
pub fn page_request(key: &PageTokenKey, kind: ListKind, owners: &[(&str, i64)], page_size: i32, token: &str) -> ApiResult<PageRequest> {
    let mut bad: Vec<Violation> = owners.iter().filter_map(|(f, id)| validate_user_id(f, *id).err()).collect();
    let size = socialgraph_domain::page_size(page_size).map_err(|d| Violation::new("page_size", d));
    if let Err(v) = &size {
        bad.push(v.clone());
    }
    if !bad.is_empty() {
        return Err(bad.into());
    }
    let (a, b) = (owners.first().map_or(0, |o| o.1), owners.get(1).map_or(0, |o| o.1));
    let after = key
        .decode(token, kind, a, b)
        .map_err(|e| ApiError::InvalidArgument { reason: "BAD_PAGE_TOKEN", violations: vec![Violation::new("page_token", e.to_string())] })?;
    Ok(PageRequest { size: size.unwrap_or_default(), after })
}

/// The page-token key from the configured secret; without one, a fixed development key and a
/// warning (tokens then verify on every replica, but anyone who reads the source can forge one).
pub fn page_token_key(secret: Option<&secrecy::SecretString>) -> PageTokenKey {
    match secret {
        Some(s) => PageTokenKey::new(s.expose_secret().as_bytes()),
        None => {
            tracing::warn!("auth.page_token_secret is not set: page tokens use the development key");
            PageTokenKey::new(b"socialgraph-development-page-token-key")
        }
    }
}
