//! Tests of the value encoding and the buckets.

use super::*;

#[test]
fn values_round_trip_as_varints() {
    let v = Stored { counters: Sds([1, 200, 3, u32::MAX, 0]), version: 77_777, rest_until_s: 60_000_000, followings_version: -1 };
    let bytes = v.encode();
    assert_eq!(bytes[0], 1);
    assert_eq!(&bytes[1..3], &[0xc8, 0x01], "200 as LEB128");
    assert_eq!(Stored::decode(&bytes), Some(v));
    assert_eq!(Stored::decode(&bytes[..bytes.len() - 1]), None, "truncated");
    assert_eq!(Stored::decode(&[bytes.as_slice(), &[0]].concat()), None, "trailing byte");
    let fresh = Stored { version: -1, followings_version: -1, ..Stored::default() };
    assert_eq!(fresh.encode(), vec![0; 7]);
    assert_eq!(Stored::decode(&[0; 7]), Some(fresh));
    // With followings from relation events: an eighth varint, which older values lack.
    let relation = Stored { followings_version: 300, ..v };
    let bytes = relation.encode();
    assert_eq!(&bytes[bytes.len() - 2..], &[0xad, 0x02], "301 as LEB128");
    assert_eq!(Stored::decode(&bytes), Some(relation));
    assert_eq!(Stored::decode(&v.encode()).map(|s| s.followings_version), Some(-1), "a seven-varint value has none");
    assert_eq!(Stored::decode(&[bytes.as_slice(), &[0]].concat()), None, "a ninth varint is malformed");
}

#[test]
fn a_counter_over_u32_is_malformed() {
    let mut bytes = Stored::default().encode();
    bytes.splice(0..1, [0x80, 0x80, 0x80, 0x80, 0x10]);
    assert_eq!(Stored::decode(&bytes), None);
}

#[test]
fn buckets_spread_sequential_ids() {
    let mut per = vec![0u32; USER_BUCKETS as usize];
    for u in 1..=1_000_000i64 {
        per[user_bucket(u) as usize] += 1;
    }
    let max = per.iter().max().copied().unwrap_or_default();
    assert!(max <= 40, "1M sequential users: fullest bucket {max} (mean 15)");
}

#[test]
fn apply_floors_at_zero_and_saturates() {
    let mut s = Sds([0, 5, u32::MAX - 1, 0, 0]);
    s.apply([-3, -2, 10, 1, 0]);
    assert_eq!(s, Sds([0, 3, u32::MAX, 1, 0]));
}
