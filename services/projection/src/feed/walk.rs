//! The three walks of a home timeline, chosen by GetTimeline's `min_post_id` and
//! `since_post_id`, and the list each one's page tokens are bound to: a token names the walk
//! and the bound post, so it cannot continue another walk or the same walk from another post.

use socialgraph_domain::ListKind;
use socialgraph_server::{ApiError, ApiResult};

/// Which way a timeline request walks (GetTimeline's `min_post_id` and `since_post_id`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Walk {
    /// Newest first from the newest post down (neither field set).
    Down,
    /// Oldest first from just above this post up to the newest (`min_post_id`).
    UpFrom(i64),
    /// Newest first from the newest post down to just above this post (`since_post_id`).
    DownTo(i64),
}

impl Walk {
    /// The walk a request's `min_post_id` and `since_post_id` ask for (0: unset).
    ///
    /// # Errors
    /// INVALID_ARGUMENT naming `since_post_id` when both are set.
    pub fn of(min_post_id: i64, since_post_id: i64) -> ApiResult<Self> {
        match (min_post_id, since_post_id) {
            (0, 0) => Ok(Self::Down),
            (min, 0) => Ok(Self::UpFrom(min)),
            (0, since) => Ok(Self::DownTo(since)),
            _ => Err(ApiError::invalid("since_post_id", "must be 0 when min_post_id is set: a page walks up from one post or down to one, not both")),
        }
    }

    /// The list its page tokens belong to.
    pub fn kind(self) -> ListKind {
        match self {
            Self::Down => ListKind::Timeline,
            Self::UpFrom(_) => ListKind::TimelineMin,
            Self::DownTo(_) => ListKind::TimelineSince,
        }
    }

    /// The request field naming the bound post and its id.
    pub fn bound(self) -> Option<(&'static str, i64)> {
        match self {
            Self::Down => None,
            Self::UpFrom(id) => Some(("min_post_id", id)),
            Self::DownTo(id) => Some(("since_post_id", id)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_field_picks_its_walk_and_both_are_refused() {
        assert_eq!(Walk::of(0, 0).ok(), Some(Walk::Down));
        assert_eq!(Walk::of(7, 0).ok(), Some(Walk::UpFrom(7)));
        assert_eq!(Walk::of(0, 7).ok(), Some(Walk::DownTo(7)));
        // A negative id still picks the walk; the page request then names the field.
        assert_eq!(Walk::of(-1, 0).ok().and_then(Walk::bound), Some(("min_post_id", -1)));
        let both = Walk::of(7, 8).map(|_| ()).map_err(tonic::Status::from).unwrap_err();
        assert_eq!(both.code(), tonic::Code::InvalidArgument);
        assert!(both.message().contains("since_post_id"), "{}", both.message());
    }

    #[test]
    fn each_walk_has_its_own_token_list() {
        let kinds = [Walk::Down, Walk::UpFrom(1), Walk::DownTo(1)].map(Walk::kind);
        assert_eq!(kinds, [ListKind::Timeline, ListKind::TimelineMin, ListKind::TimelineSince]);
    }
}
