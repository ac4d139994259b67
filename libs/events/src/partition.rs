//! Kafka's default partitioner, so that every producer and consumer agrees on placement.
//!
//! Apache Kafka's `BuiltInPartitioner.partitionForKey`: `toPositive(murmur2(key)) % partitions`,
//! with murmur2 seeded 0x9747b28c and `toPositive(x) = x & 0x7fffffff`.

/// The partition of a record with key `key` in a topic of `partitions` partitions (> 0).
pub fn kafka_partition(key: &[u8], partitions: i32) -> i32 {
    let hash = murmur2::murmur2(key, murmur2::KAFKA_SEED) & 0x7fff_ffff;
    (hash % partitions.max(1) as u32) as i32
}

/// The record key of a user-keyed event: the id as 8 bytes big-endian (Java's `Long` layout).
pub fn user_key(user_id: i64) -> [u8; 8] {
    user_id.to_be_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Vectors of Apache Kafka's `UtilsTest.testMurmur2` (signed Java ints).
    #[test]
    fn murmur2_matches_kafka_reference_vectors() {
        let cases: [(&[u8], i32); 6] = [
            (b"21", -973932308),
            (b"foobar", -790332482),
            (b"a-little-bit-long-string", -985981536),
            (b"a-little-bit-longer-string", -1486304829),
            (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
            (b"abc", 479470107),
        ];
        for (key, want) in cases {
            assert_eq!(murmur2::murmur2(key, murmur2::KAFKA_SEED) as i32, want, "key {key:?}");
        }
    }

    #[test]
    fn partition_is_in_range_and_stable() {
        for id in 1..2000_i64 {
            let p = kafka_partition(&user_key(id), 12);
            assert!((0..12).contains(&p));
            assert_eq!(p, kafka_partition(&user_key(id), 12));
        }
    }
}
