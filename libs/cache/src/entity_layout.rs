//! The entity state string decoded in Rust ([`crate::entities`] gives the format): which keys
//! hold an entity's facts and how each metric is represented, for benchmarks, tests and
//! operators' tools; and the front of a state ([`header`]), which the service's count reads
//! decode from a `GETRANGE` of its first [`HEADER_MAX`] bytes. Every change of a state goes
//! through the scripts.

use crate::keys::EntityKeys;

/// One metric's facts as the state describes them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetricLayout {
    /// Actors with the metric set (the count the service answers).
    pub count: u64,
    /// Whether the actors outside bitmap chunks are in the spill set.
    pub spilled: bool,
    /// Size of the spill set when its chunks were last looked at (0 unless spilled).
    pub spill_mark: u64,
    /// Bitmap chunks as (chunk id, population), ascending.
    pub chunks: Vec<(u64, u64)>,
    /// Actors below 2^32 held in the state, ascending.
    pub small: Vec<u64>,
    /// Actors at or above 2^32 held in the state, ascending.
    pub big: Vec<i64>,
}

/// A decoded entity state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EntityLayout {
    /// The toggle sequence.
    pub seq: u64,
    /// Like, then fav.
    pub metrics: [MetricLayout; 2],
}

impl EntityLayout {
    /// Decodes a state string; `None` when it is not format 1 or is truncated or longer.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let (&format, rest) = bytes.split_first()?;
        if format != 1 {
            return None;
        }
        let mut r = Cursor(rest);
        let mut out = EntityLayout { seq: r.varint()?, ..Default::default() };
        let counts = [r.varint()?, r.varint()?];
        for (m, count) in out.metrics.iter_mut().zip(counts) {
            m.count = count;
            let shape = r.varint()?;
            m.spilled = shape & 1 != 0;
            m.spill_mark = r.part(shape, 1)?;
            let mut c = 0;
            for _ in 0..r.part(shape, 2)? {
                c += r.varint()?;
                m.chunks.push((c, r.varint()?));
            }
            let mut a = 0;
            for _ in 0..r.part(shape, 4)? {
                a += r.varint()?;
                m.small.push(a);
            }
            for _ in 0..r.part(shape, 8)? {
                m.big.push(i64::from_be_bytes(r.take8()?));
            }
        }
        r.0.is_empty().then_some(out)
    }

    /// Every key that holds a fact of the entity, besides the state itself: its bitmap chunks
    /// and, where spilled, its spill sets.
    pub fn fact_keys(&self, keys: &EntityKeys) -> Vec<String> {
        let mut out = Vec::new();
        for (m, name) in self.metrics.iter().zip(["like", "fav"]) {
            out.extend(m.chunks.iter().map(|(c, _)| keys.chunk(name, *c)));
            if m.spilled {
                out.push(keys.spill(name));
            }
        }
        out
    }
}

/// Longest front of a state that [`header`] needs: the format byte and three varints of at
/// most 10 bytes each (a u64 in LEB128).
pub const HEADER_MAX: usize = 31;

/// The toggle sequence and the like and fav counts at the front of a state (or of its first
/// [`HEADER_MAX`] bytes), as the scripts' Lua `header` reads them: all 0 for an empty input (a missing
/// state); `None` when it is not format 1 or ends inside the three varints.
pub fn header(front: &[u8]) -> Option<(u64, u64, u64)> {
    let Some((&format, rest)) = front.split_first() else { return Some((0, 0, 0)) };
    if format != 1 {
        return None;
    }
    let mut r = Cursor(rest);
    Some((r.varint()?, r.varint()?, r.varint()?))
}

/// The unread rest of a state.
struct Cursor<'a>(&'a [u8]);

impl Cursor<'_> {
    /// One unsigned LEB128 varint.
    fn varint(&mut self) -> Option<u64> {
        let mut x: u64 = 0;
        for shift in (0..64).step_by(7) {
            let (&b, tail) = self.0.split_first()?;
            self.0 = tail;
            x |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Some(x);
            }
        }
        None
    }

    /// The varint of a part the shape names (`bit` set), else 0.
    fn part(&mut self, shape: u64, bit: u64) -> Option<u64> {
        if shape & bit != 0 { self.varint() } else { Some(0) }
    }

    /// Eight bytes.
    fn take8(&mut self) -> Option<[u8; 8]> {
        let (head, tail) = self.0.split_first_chunk::<8>()?;
        self.0 = tail;
        Some(*head)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_decodes_with_chunks_small_and_big_actors() {
        // seq 5, like 4 fav 0; like (shape 14): one chunk 2 (pop 1), small 3 and 130, big 2^40;
        // fav empty (shape 0).
        let mut s = vec![1, 5, 4, 0, 14, 1, 2, 1, 2, 3, 127, 1];
        s.extend((1i64 << 40).to_be_bytes());
        s.push(0);
        let got = EntityLayout::decode(&s).expect("decodes");
        assert_eq!(got.seq, 5);
        let like = &got.metrics[0];
        assert_eq!(
            (like.count, like.spilled, like.chunks.clone(), like.small.clone(), like.big.clone()),
            (4, false, vec![(2, 1)], vec![3, 130], vec![1 << 40])
        );
        assert_eq!(got.metrics[1], MetricLayout::default());
        assert_eq!(EntityLayout::decode(&s[..s.len() - 1]), None);
        assert_eq!(EntityLayout::decode(&[2]), None);
    }

    #[test]
    fn a_header_reads_the_front_of_a_state_or_of_its_first_bytes() {
        // seq 2^51 (8 varint bytes, a clock in µs), like 300 (2 bytes), fav 7, then the shapes.
        let mut s = vec![1];
        let mut seq = 1u64 << 51;
        while seq >= 0x80 {
            s.push((seq as u8 & 0x7f) | 0x80);
            seq >>= 7;
        }
        s.push(seq as u8);
        s.extend([0xac, 0x02, 7, 0, 0]);
        assert_eq!(header(&s), Some((1 << 51, 300, 7)));
        // Any cut that keeps the three varints reads the same; a shorter one is malformed.
        let end = s.len() - 2;
        assert_eq!(header(&s[..end]), Some((1 << 51, 300, 7)));
        assert_eq!(header(&s[..end - 1]), None);
        assert_eq!(header(&[]), Some((0, 0, 0)));
        assert_eq!(header(&[2, 5, 4, 0]), None);
        // Ten bytes is the longest u64; an eleventh continuation byte is malformed.
        let mut max = vec![1];
        max.extend([0xff; 9]);
        max.extend([0x01, 0, 0]);
        assert!(max.len() <= HEADER_MAX);
        assert_eq!(header(&max), Some((u64::MAX, 0, 0)));
        assert_eq!(header(&[1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0, 0]), None);
    }
}
