//! Seedable pseudo-random numbers (no external crate): SplitMix64 for seeding and
//! stream derivation, xoshiro256** for the draws.

use std::time::{SystemTime, UNIX_EPOCH};

/// One step of SplitMix64: advances `state` and returns a well-mixed 64-bit value.
///
/// Used to expand a single `u64` seed into a full PRNG state and to derive independent
/// per-stream seeds (e.g. one per tensor chunk in `synth`) from a base seed.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A small, fast, seedable PRNG (xoshiro256**). Not cryptographic.
///
/// The same seed always produces the same sequence on every platform.
#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// Creates a generator from a 64-bit seed (expanded with SplitMix64, so any seed,
    /// including 0, gives a valid non-zero state).
    pub fn new(seed: u64) -> Self {
        let mut sm = seed;
        let s = [
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
        ];
        Self { s }
    }

    /// Creates a generator seeded from the clock, for runs that did not ask for determinism.
    pub fn from_entropy() -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        // Mixing in a stack address separates generators created in the same nanosecond.
        let local = 0u8;
        let addr = &local as *const u8 as u64;
        Self::new(nanos ^ addr.rotate_left(32))
    }

    /// Next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform `f64` in `[0, 1)` with 53 bits of precision.
    #[inline]
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform `f32` in `[0, 1)` with 24 bits of precision.
    #[inline]
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u32 << 24) as f32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_is_reproducible_and_uniform_ish() {
        let mut a = Rng::new(0);
        let mut b = Rng::new(0);
        for _ in 0..10 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        let mean: f64 = (0..10_000).map(|_| a.next_f64()).sum::<f64>() / 10_000.0;
        assert!((mean - 0.5).abs() < 0.02);
        assert!((0..1000).all(|_| (0.0..1.0).contains(&a.next_f32())));
    }
}
