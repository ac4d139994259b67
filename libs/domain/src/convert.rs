//! The one conversion between an [`Edge`] and its wire forms: `socialgraph.relation.v1.Edge`
//! (ScanEdges pages) and `socialgraph.events.v1.RelationEvent` (the event of a change).

use socialgraph_proto::events::v1::{RelationEvent, RelationEventKind};
use socialgraph_proto::relation::v1 as pb;

use crate::{Edge, EdgeState, timestamp_from_ms, timestamp_to_ms};

impl From<Edge> for pb::Edge {
    fn from(e: Edge) -> Self {
        Self {
            follower_id: e.follower_id,
            followee_id: e.followee_id,
            following: e.state == EdgeState::Following,
            version: e.version,
            followed_at: Some(timestamp_from_ms(e.followed_at_ms)),
            updated_at: Some(timestamp_from_ms(e.updated_at_ms)),
        }
    }
}

impl From<&pb::Edge> for Edge {
    /// Missing times become 0.
    fn from(e: &pb::Edge) -> Self {
        Self {
            follower_id: e.follower_id,
            followee_id: e.followee_id,
            state: if e.following { EdgeState::Following } else { EdgeState::NotFollowing },
            version: e.version,
            followed_at_ms: e.followed_at.as_ref().map(timestamp_to_ms).unwrap_or_default(),
            updated_at_ms: e.updated_at.as_ref().map(timestamp_to_ms).unwrap_or_default(),
        }
    }
}

impl From<&RelationEvent> for Edge {
    /// The edge after the change the event describes: FOLLOWED is following, anything else
    /// not; `updated_at` is the event's `occurred_at` (missing times become 0).
    fn from(e: &RelationEvent) -> Self {
        Self {
            follower_id: e.follower_id,
            followee_id: e.followee_id,
            state: if e.kind == RelationEventKind::Followed as i32 { EdgeState::Following } else { EdgeState::NotFollowing },
            version: e.version,
            followed_at_ms: e.followed_at.as_ref().map(timestamp_to_ms).unwrap_or_default(),
            updated_at_ms: e.occurred_at.as_ref().map(timestamp_to_ms).unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_edge_survives_the_wire_and_its_event_says_the_same() {
        let e = Edge { follower_id: 1, followee_id: 2, state: EdgeState::Following, version: 3, followed_at_ms: 1_500, updated_at_ms: 2_750 };
        assert_eq!(Edge::from(&pb::Edge::from(e)), e);
        let event = RelationEvent {
            kind: RelationEventKind::Followed as i32,
            follower_id: 1,
            followee_id: 2,
            version: 3,
            followed_at: Some(timestamp_from_ms(1_500)),
            occurred_at: Some(timestamp_from_ms(2_750)),
            ..Default::default()
        };
        assert_eq!(Edge::from(&event), e);
        let unfollowed = RelationEvent { kind: RelationEventKind::Unfollowed as i32, ..event };
        assert_eq!(Edge::from(&unfollowed).state, EdgeState::NotFollowing);
    }
}
