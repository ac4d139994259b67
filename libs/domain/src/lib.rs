//! Domain types of socialgraph, free of IO: user ids, edges, page sizes and integrity-protected
//! keyset page tokens, and the conversions the services share.

mod consistency;
mod convert;
mod ids;
mod page;
mod versions;

pub use consistency::ConsistencyToken;
pub use ids::{Edge, EdgeState, MAX_ENTITY_TYPE_LEN, UserId, Violation, valid_entity_type, validate_batch, validate_user_id};
pub use page::{Cursor, DEFAULT_PAGE_SIZE, ListEntry, ListKind, MAX_PAGE_SIZE, Page, PageToken, PageTokenError, PageTokenKey, page_size};
pub use versions::{NEWER_WINS, newer_wins};

/// Most ids accepted by one batch RPC (docs/src/api/overview.md#batches).
pub const MAX_BATCH: usize = 1000;

/// Milliseconds since the Unix epoch by the system clock (0 if the clock is before 1970): the
/// one clock of every `*_ms` column, event time and score.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or_default()
}

/// Milliseconds since the Unix epoch as a protobuf `Timestamp`.
pub fn timestamp_from_ms(ms: i64) -> prost_types::Timestamp {
    prost_types::Timestamp { seconds: ms.div_euclid(1000), nanos: (ms.rem_euclid(1000) * 1_000_000) as i32 }
}

/// A protobuf `Timestamp` as milliseconds since the Unix epoch (sub-millisecond part dropped).
pub fn timestamp_to_ms(ts: &prost_types::Timestamp) -> i64 {
    ts.seconds.saturating_mul(1000).saturating_add(i64::from(ts.nanos) / 1_000_000)
}

/// Seconds of 0001-01-01T00:00:00Z and of 9999-12-31T23:59:59Z: the range of a valid
/// `google.protobuf.Timestamp` (see timestamp.proto).
const TIMESTAMP_SECONDS: std::ops::RangeInclusive<i64> = -62_135_596_800..=253_402_300_799;

/// Checks that `ts` is a valid `google.protobuf.Timestamp`: seconds within years 0001–9999 and
/// nanos in 0..=999,999,999 (timestamp.proto's rules).
///
/// # Errors
/// A violation naming `field`.
pub fn validate_timestamp(field: &str, ts: &prost_types::Timestamp) -> Result<(), Violation> {
    if !TIMESTAMP_SECONDS.contains(&ts.seconds) {
        return Err(Violation::new(field, "seconds must lie in 0001-01-01..=9999-12-31"));
    }
    if !(0..1_000_000_000).contains(&ts.nanos) {
        return Err(Violation::new(field, "nanos must lie in 0..=999999999"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_outside_the_protobuf_range_are_refused() {
        let ts = |seconds, nanos| prost_types::Timestamp { seconds, nanos };
        assert!(validate_timestamp("t", &ts(0, 0)).is_ok());
        assert!(validate_timestamp("t", &ts(253_402_300_799, 999_999_999)).is_ok());
        assert!(validate_timestamp("t", &ts(-62_135_596_800, 0)).is_ok());
        for (s, n) in [(253_402_300_800, 0), (-62_135_596_801, 0), (i64::MAX, 0), (i64::MIN, 0), (0, -1), (0, 1_000_000_000)] {
            assert!(validate_timestamp("t", &ts(s, n)).is_err(), "{s} {n}");
        }
    }

    #[test]
    fn timestamps_round_trip_through_milliseconds() {
        for ms in [0_i64, 1, 999, 1_700_000_000_123, -1, -1001] {
            assert_eq!(timestamp_to_ms(&timestamp_from_ms(ms)), ms);
        }
    }
}
