//! AIP-158 page sizes and keyset page tokens.
//!
//! A token names the list it belongs to (kind and owner ids) and the last entry returned
//! (`followed_at_ms`, `peer_id`); lists are ordered by that pair descending, so the next page is
//! "strictly below the cursor" (the walk up a timeline, [`ListKind::TimelineMin`], is the one
//! list in ascending order: its next page is strictly above). The bytes are authenticated with
//! HMAC-SHA256 (RFC 2104) under a key every replica shares, so a token edited by hand, or taken
//! from another list, is refused.
//! Encoding: URL-safe base64 without padding of `version(1) kind(1) a(8) b(8) ts(8) peer(8)
//! mac(16)`, integers big-endian.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Page size used when the request says 0.
pub const DEFAULT_PAGE_SIZE: usize = 50;
/// Largest page size a request may ask for.
pub const MAX_PAGE_SIZE: usize = 1000;

const TOKEN_VERSION: u8 = 1;
const BODY_LEN: usize = 2 + 8 * 4;
const MAC_LEN: usize = 16;

/// Resolves a requested page size: 0 → [`DEFAULT_PAGE_SIZE`].
///
/// # Errors
/// A description when the size is negative or above [`MAX_PAGE_SIZE`].
pub fn page_size(requested: i32) -> Result<usize, String> {
    match requested {
        0 => Ok(DEFAULT_PAGE_SIZE),
        n if n < 0 => Err(format!("must be >= 0, got {n}")),
        n if n as usize > MAX_PAGE_SIZE => Err(format!("must be <= {MAX_PAGE_SIZE}, got {n}")),
        n => Ok(n as usize),
    }
}

/// Which list a token pages through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ListKind {
    /// `ListFollowing(user_id)`.
    Following = 1,
    /// `ListFollowers(user_id)`.
    Followers = 2,
    /// `ListCommonFollowing(user_id, other_user_id)`.
    CommonFollowing = 3,
    /// `ListFamiliarFollowers(viewer_id, user_id)`.
    FamiliarFollowers = 4,
    /// `ListBlocks(user_id)` (entries ordered by block time).
    Blocks = 5,
    /// `ListMutes(user_id)` (entries ordered by mute time).
    Mutes = 6,
    /// `ListFollowRequests(user_id, INCOMING)` (entries ordered by request time).
    IncomingRequests = 7,
    /// `ListFollowRequests(user_id, OUTGOING)`.
    OutgoingRequests = 8,
    /// `GetTimeline(user_id)` (cursor: post time and post id).
    Timeline = 9,
    /// `ListAuthorPosts(author_id)` (cursor: post time and post id).
    AuthorPosts = 10,
    /// `ListConversations(user_id)` (cursor: last message id and conversation id).
    Conversations = 11,
    /// `ListMessages(user_id, conversation_id)` (cursor: sequence and message id).
    Messages = 12,
    /// `GetTimeline(user_id, min_post_id)`: the walk up from a post, oldest first (cursor: post
    /// time and post id; the second owner id is the post the walk started from).
    TimelineMin = 13,
    /// `GetTimeline(user_id, since_post_id)`: newest first down to a post (cursor as above; the
    /// second owner id is the post that ends the walk).
    TimelineSince = 14,
}

/// The last entry of a page: lists are ordered by (`followed_at_ms`, `peer_id`), descending but
/// for [`ListKind::TimelineMin`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    /// Follow time of the last entry returned, ms since the epoch.
    pub followed_at_ms: i64,
    /// User id of the last entry returned.
    pub peer_id: i64,
}

/// One entry of a list: the peer and the follow time that orders it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListEntry {
    /// The account listed.
    pub user_id: i64,
    /// The follow time that orders the list, ms since the epoch.
    pub followed_at_ms: i64,
}

/// One page of a list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    /// The entries of the page, in list order (newest follow first).
    pub entries: Vec<ListEntry>,
    /// Token of the next page; empty on the last page.
    pub next_page_token: String,
}

/// A decoded page token: the list it belongs to and where the next page starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageToken {
    /// The list.
    pub kind: ListKind,
    /// First owner id of the list (user_id, or viewer_id for familiar followers).
    pub a: i64,
    /// Second owner id (other_user_id or user_id), 0 for single-owner lists.
    pub b: i64,
    /// The next page holds entries strictly after this cursor.
    pub cursor: Cursor,
}

/// Why a token was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PageTokenError {
    /// Not base64, wrong length, unknown version or a failed MAC: edited or truncated.
    #[error("the page token is malformed or was modified")]
    Tampered,
    /// Authentic, but issued for another list or other parameters.
    #[error("the page token belongs to a different list or different request parameters")]
    WrongList,
}

/// The HMAC key that signs page tokens; every replica must share it.
#[derive(Clone)]
pub struct PageTokenKey(Vec<u8>);

impl std::fmt::Debug for PageTokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PageTokenKey(..)")
    }
}

impl PageTokenKey {
    /// A key from secret bytes (any length; HMAC hashes long keys).
    pub fn new(secret: &[u8]) -> Self {
        Self(secret.to_vec())
    }

    fn mac(&self, body: &[u8]) -> [u8; MAC_LEN] {
        // HMAC accepts keys of any length, so construction cannot fail.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0).unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        mac.update(body);
        let full = mac.finalize().into_bytes();
        let mut out = [0u8; MAC_LEN];
        out.copy_from_slice(&full[..MAC_LEN]);
        out
    }

    /// Encodes `token` as an opaque string.
    pub fn encode(&self, token: &PageToken) -> String {
        let mut buf = Vec::with_capacity(BODY_LEN + MAC_LEN);
        buf.push(TOKEN_VERSION);
        buf.push(token.kind as u8);
        for v in [token.a, token.b, token.cursor.followed_at_ms, token.cursor.peer_id] {
            buf.extend_from_slice(&v.to_be_bytes());
        }
        let mac = self.mac(&buf);
        buf.extend_from_slice(&mac);
        URL_SAFE_NO_PAD.encode(buf)
    }

    /// Decodes a token and checks it belongs to the list (`kind`, `a`, `b`).
    /// Returns `Ok(None)` for the empty token (first page).
    ///
    /// # Errors
    /// [`PageTokenError::Tampered`] for anything not produced by [`Self::encode`] with this key;
    /// [`PageTokenError::WrongList`] for a token of another list.
    pub fn decode(&self, raw: &str, kind: ListKind, a: i64, b: i64) -> Result<Option<Cursor>, PageTokenError> {
        if raw.is_empty() {
            return Ok(None);
        }
        let bytes = URL_SAFE_NO_PAD.decode(raw).map_err(|_| PageTokenError::Tampered)?;
        if bytes.len() != BODY_LEN + MAC_LEN || bytes[0] != TOKEN_VERSION {
            return Err(PageTokenError::Tampered);
        }
        let (body, mac) = bytes.split_at(BODY_LEN);
        // Constant-time comparison through the hmac crate's verifier.
        let mut verifier = <Hmac<Sha256> as Mac>::new_from_slice(&self.0).unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        verifier.update(body);
        verifier.verify_truncated_left(mac).map_err(|_| PageTokenError::Tampered)?;
        let int = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&body[2 + 8 * i..2 + 8 * (i + 1)]);
            i64::from_be_bytes(b)
        };
        if body[1] != kind as u8 || int(0) != a || int(1) != b {
            return Err(PageTokenError::WrongList);
        }
        Ok(Some(Cursor { followed_at_ms: int(2), peer_id: int(3) }))
    }

    /// Cuts `entries` (fetched with one entry more than `size`) to a page, with the token of
    /// the next page: empty when there was no extra entry.
    pub fn finish(&self, mut entries: Vec<ListEntry>, size: usize, kind: ListKind, a: i64, b: i64) -> Page {
        if entries.len() <= size || size == 0 {
            return Page { entries, next_page_token: String::new() };
        }
        entries.truncate(size);
        let last = entries[size - 1];
        let cursor = Cursor { followed_at_ms: last.followed_at_ms, peer_id: last.user_id };
        let next_page_token = self.encode(&PageToken { kind, a, b, cursor });
        Page { entries, next_page_token }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token() -> PageToken {
        PageToken { kind: ListKind::Following, a: 42, b: 0, cursor: Cursor { followed_at_ms: 1_700_000_000_000, peer_id: 7 } }
    }

    #[test]
    fn token_round_trips_for_its_own_list() {
        let key = PageTokenKey::new(b"k");
        let s = key.encode(&token());
        assert_eq!(key.decode(&s, ListKind::Following, 42, 0), Ok(Some(token().cursor)));
        assert_eq!(key.decode("", ListKind::Following, 42, 0), Ok(None));
    }

    #[test]
    fn edited_token_is_refused() {
        let key = PageTokenKey::new(b"k");
        let s = key.encode(&token());
        let mut bytes = URL_SAFE_NO_PAD.decode(&s).unwrap();
        for i in 0..bytes.len() {
            bytes[i] ^= 1;
            let edited = URL_SAFE_NO_PAD.encode(&bytes);
            assert_eq!(key.decode(&edited, ListKind::Following, 42, 0), Err(PageTokenError::Tampered));
            bytes[i] ^= 1;
        }
        assert_eq!(key.decode("not a token", ListKind::Following, 42, 0), Err(PageTokenError::Tampered));
        assert_eq!(key.decode(&s[..s.len() - 2], ListKind::Following, 42, 0), Err(PageTokenError::Tampered));
    }

    #[test]
    fn token_of_another_list_or_key_is_refused() {
        let key = PageTokenKey::new(b"k");
        let s = key.encode(&token());
        assert_eq!(key.decode(&s, ListKind::Followers, 42, 0), Err(PageTokenError::WrongList));
        assert_eq!(key.decode(&s, ListKind::Following, 43, 0), Err(PageTokenError::WrongList));
        assert_eq!(PageTokenKey::new(b"other").decode(&s, ListKind::Following, 42, 0), Err(PageTokenError::Tampered));
    }

    #[test]
    fn a_timeline_walk_token_fits_only_its_walk_and_post() {
        let key = PageTokenKey::new(b"k");
        let cursor = Cursor { followed_at_ms: 5, peer_id: 9 };
        let up = key.encode(&PageToken { kind: ListKind::TimelineMin, a: 42, b: 7, cursor });
        assert_eq!(key.decode(&up, ListKind::TimelineMin, 42, 7), Ok(Some(cursor)));
        for (kind, b) in [(ListKind::TimelineMin, 8), (ListKind::TimelineSince, 7), (ListKind::Timeline, 0), (ListKind::Timeline, 7)] {
            assert_eq!(key.decode(&up, kind, 42, b), Err(PageTokenError::WrongList), "{kind:?} from post {b}");
        }
    }

    #[test]
    fn page_size_defaults_and_bounds() {
        assert_eq!(page_size(0), Ok(DEFAULT_PAGE_SIZE));
        assert_eq!(page_size(1000), Ok(1000));
        assert!(page_size(1001).is_err());
        assert!(page_size(-1).is_err());
    }
}
