//! Seeded randomness whose values depend only on the ChaCha8 stream (value-stable across
//! versions of `rand_chacha`), so the same seed gives the same graph and samples everywhere.

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};

/// A deterministic generator for `seed`.
pub fn seeded(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// A number in `0..n` (n > 0), by Lemire's multiply-shift (bias below 2^-32 for any n used
/// here).
pub fn below(rng: &mut ChaCha8Rng, n: usize) -> usize {
    ((u128::from(rng.next_u64()) * n as u128) >> 64) as usize
}

/// True with probability `percent`/100.
pub fn chance(rng: &mut ChaCha8Rng, percent: u64) -> bool {
    rng.next_u64() % 100 < percent
}

/// Up to `k` distinct items of `items`, in random order (partial Fisher–Yates).
pub fn sample<T: Copy>(rng: &mut ChaCha8Rng, items: &[T], k: usize) -> Vec<T> {
    let mut pool = items.to_vec();
    let k = k.min(pool.len());
    for i in 0..k {
        let j = i + below(rng, pool.len() - i);
        pool.swap(i, j);
    }
    pool.truncate(k);
    pool
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_values_and_ranges_hold() {
        let (mut a, mut b) = (seeded(7), seeded(7));
        let xs: Vec<usize> = (0..100).map(|_| below(&mut a, 10)).collect();
        let ys: Vec<usize> = (0..100).map(|_| below(&mut b, 10)).collect();
        assert_eq!(xs, ys);
        assert!(xs.iter().all(|&x| x < 10));
        let s = sample(&mut a, &[1, 2, 3, 4, 5], 3);
        assert_eq!(s.len(), 3);
        let mut d = s.clone();
        d.sort_unstable();
        d.dedup();
        assert_eq!(d.len(), 3, "distinct");
        assert_eq!(sample(&mut a, &[1, 2], 5).len(), 2);
    }
}
