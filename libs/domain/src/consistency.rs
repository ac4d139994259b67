//! Consistency tokens: what a write returns so that a read served by another service can wait
//! until it reflects that write (read-your-writes across services).
//!
//! A token names one edge change: (follower, followee, the edge's version after the write). A
//! read holding it answers once its view has applied that version of that edge or a newer one.
//! Encoded as URL-safe base64 (no padding) of `v1.<follower>.<followee>.<version>`; callers treat
//! it as opaque. A forged token can only make the read wait its bounded time, so it is not
//! signed.

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
}

impl ConsistencyToken {
    /// The token's text form.
    pub fn encode(&self) -> String {
        URL_SAFE_NO_PAD.encode(format!("v1.{}.{}.{}", self.follower_id, self.followee_id, self.version))
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
        if parts.next() != Some("v1") {
            return Err(bad());
        }
        let mut num = || parts.next().and_then(|p| p.parse::<i64>().ok()).filter(|n| *n > 0).ok_or_else(bad);
        let token = Self { follower_id: num()?, followee_id: num()?, version: num()? };
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
        let t = ConsistencyToken { follower_id: 7, followee_id: 1 << 40, version: 3 };
        assert_eq!(ConsistencyToken::decode("t", &t.encode()), Ok(Some(t)));
        assert_eq!(ConsistencyToken::decode("t", ""), Ok(None));
        // x, v1.1.2, v2.1.2.3, v1.1.2.3.4, v1.-1.2.3, !!, v1.5.5.1 (self-edge), v1.+2.3.1, v1.02.3.1
        for bad in ["x", "djEuMS4y", "djIuMS4yLjM", "djEuMS4yLjMuNA", "djEuLTEuMi4z", "!!", "djEuNS41LjE", "djEuKzIuMy4x", "djEuMDIuMy4x"] {
            assert!(ConsistencyToken::decode("t", bad).is_err(), "{bad} is refused");
        }
    }
}
