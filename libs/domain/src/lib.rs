//! Domain types of socialgraph, free of IO: user ids, edges, page sizes and integrity-protected
//! keyset page tokens, and the conversions the services share.

mod ids;
mod page;

pub use ids::{Edge, EdgeState, MAX_ENTITY_TYPE_LEN, UserId, Violation, valid_entity_type, validate_batch, validate_user_id};
pub use page::{
    Cursor, DEFAULT_PAGE_SIZE, ListEntry, ListKind, MAX_PAGE_SIZE, PageToken, PageTokenError, PageTokenKey,
    page_size,
};

/// Most ids accepted by one batch RPC (DESIGN.md §4).
pub const MAX_BATCH: usize = 1000;

/// Milliseconds since the Unix epoch as a protobuf `Timestamp`.
pub fn timestamp_from_ms(ms: i64) -> prost_types::Timestamp {
    prost_types::Timestamp { seconds: ms.div_euclid(1000), nanos: (ms.rem_euclid(1000) * 1_000_000) as i32 }
}

/// A protobuf `Timestamp` as milliseconds since the Unix epoch (sub-millisecond part dropped).
pub fn timestamp_to_ms(ts: &prost_types::Timestamp) -> i64 {
    ts.seconds.saturating_mul(1000).saturating_add(i64::from(ts.nanos) / 1_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_round_trip_through_milliseconds() {
        for ms in [0_i64, 1, 999, 1_700_000_000_123, -1, -1001] {
            assert_eq!(timestamp_to_ms(&timestamp_from_ms(ms)), ms);
        }
    }
}
