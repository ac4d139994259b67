//! Consistency tokens: what a write returns so that a read served by another service can wait
//! until it reflects that write (read-your-writes across services).
//!
//! A token names one edge change: (follower, followee, the edge's version after the write) and
//! the version of the follower's followings it made (relation-svc's `following_count`). A read
//! holding it answers once its view has applied that version of that edge or a newer one (and,
//! for the follower's followings, that version of the count or a newer one). Encoded as URL-safe
//! base64 (no padding) of `v2.<follower>.<followee>.<version>.<followings version>`, or of
//! `v1.<follower>.<followee>.<version>` when the followings version is unknown (tokens of
//! earlier releases read so too); callers treat it as opaque. A forged token can only make the
//! read wait its bounded time, so it is not signed.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use crate::Violation;

/// A decoded consistency token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsistencyToken {
    /// The edge's follower.
    pub follower_id: i64,
    /// The edge's followee.
    pub followee_id: i64,
    /// The edge's version after the write; the read waits for this version or a newer one.
    pub version: i64,
    /// The version of the follower's followings the write made or a later one (0: unknown).
    pub followings_version: i64,
}

impl ConsistencyToken {
    /// The token's text form.
    pub fn encode(&self) -> String {
        let text = if self.followings_version > 0 {
            format!("v2.{}.{}.{}.{}", self.follower_id, self.followee_id, self.version, self.followings_version)
        } else {
            format!("v1.{}.{}.{}", self.follower_id, self.followee_id, self.version)
        };
        URL_SAFE_NO_PAD.encode(text)
    }

    /// Parses `text` given in request field `field`: `Ok(None)` for an empty token.
    ///
    /// # Errors
    /// A field violation when the text is not a token this version wrote.
    pub fn decode(field: &str, text: &str) -> Result<Option<Self>, Violation> {
        if text.is_empty() {
            return Ok(None);
        }
        let bad = || Violation::new(field, "not a consistency_token returned by a RelationService write");
        let raw = URL_SAFE_NO_PAD.decode(text).map_err(|_| bad())?;
        let raw = String::from_utf8(raw).map_err(|_| bad())?;
        let mut parts = raw.split('.');
        let counted = match parts.next() {
            Some("v1") => false,
            Some("v2") => true,
            _ => return Err(bad()),
        };
        let mut num = || parts.next().and_then(|p| p.parse::<i64>().ok()).filter(|n| *n > 0).ok_or_else(bad);
        let mut token = Self { follower_id: num()?, followee_id: num()?, version: num()?, followings_version: 0 };
        if counted {
            token.followings_version = num()?;
        }
        // Only the canonical spelling a write produced (no signs, no leading zeros), and never a
        // self-edge, which no write can make.
        if parts.next().is_some() || token.encode() != text || token.follower_id == token.followee_id {
            return Err(bad());
        }
        Ok(Some(token))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_anything_else_is_refused() {
        let t = ConsistencyToken { follower_id: 7, followee_id: 1 << 40, version: 3, followings_version: 0 };
        assert_eq!(ConsistencyToken::decode("t", &t.encode()), Ok(Some(t)));
        let counted = ConsistencyToken { followings_version: 12, ..t };
        assert_eq!(URL_SAFE_NO_PAD.decode(counted.encode()).ok(), Some(b"v2.7.1099511627776.3.12".to_vec()));
        assert_eq!(ConsistencyToken::decode("t", &counted.encode()), Ok(Some(counted)));
        // v2 without its fourth number, and with a fifth
        for bad in [URL_SAFE_NO_PAD.encode("v2.1.2.3"), URL_SAFE_NO_PAD.encode("v2.1.2.3.4.5"), URL_SAFE_NO_PAD.encode("v2.1.2.3.0")] {
            assert!(ConsistencyToken::decode("t", &bad).is_err(), "{bad} is refused");
        }
        assert_eq!(ConsistencyToken::decode("t", ""), Ok(None));
        // x, v1.1.2, v2.1.2.3, v1.1.2.3.4, v1.-1.2.3, !!, v1.5.5.1 (self-edge), v1.+2.3.1, v1.02.3.1
        for bad in ["x", "djEuMS4y", "djIuMS4yLjM", "djEuMS4yLjMuNA", "djEuLTEuMi4z", "!!", "djEuNS41LjE", "djEuKzIuMy4x", "djEuMDIuMy4x"] {
            assert!(ConsistencyToken::decode("t", bad).is_err(), "{bad} is refused");
        }
    }
}
