//! Seeded randomness for fault tests: [`Rng`] picks the moments and victims
//! of injected faults from a seed that the test prints, so that a failing run
//! can be replayed with `NQ_FAULT_SEED=<seed>`.
//!
//! The generator is SplitMix64: tiny, fast, and good enough to spread fault
//! moments; nothing here needs cryptographic quality.

use std::time::{SystemTime, UNIX_EPOCH};

/// The environment variable that fixes the seed of every fault test.
pub const SEED_ENV: &str = "NQ_FAULT_SEED";

/// A deterministic pseudo-random sequence (SplitMix64).
#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// The sequence of `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng { state: seed }
    }

    /// The seed to use: `NQ_FAULT_SEED` when set (a decimal or 0x-hex u64),
    /// otherwise one drawn from the clock and the process id, so that
    /// successive runs try different moments.
    ///
    /// # Panics
    ///
    /// When `NQ_FAULT_SEED` is set but is not a u64: a replay must not
    /// silently run with another seed.
    pub fn seed_from_env() -> u64 {
        if let Ok(text) = std::env::var(SEED_ENV) {
            let t = text.trim();
            let parsed = match t.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => t.parse(),
            };
            return parsed.unwrap_or_else(|e| {
                panic!("{SEED_ENV}={text:?} is not a u64 (decimal or 0x-hex): {e}")
            });
        }
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        // Fold the 128-bit time and the pid so that two tests started in the
        // same nanosecond still differ.
        let mut r = Rng::new((nanos as u64) ^ ((nanos >> 64) as u64));
        r.next_u64() ^ u64::from(std::process::id()).rotate_left(32)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `lo..=hi`.
    ///
    /// # Panics
    ///
    /// When `lo > hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        assert!(lo <= hi, "empty range {lo}..={hi}");
        let span = hi - lo;
        if span == u64::MAX {
            return self.next_u64();
        }
        // The modulo bias is below 2^-40 for the small spans tests use.
        lo + self.next_u64() % (span + 1)
    }

    /// True with probability `p` (clamped to 0..=1).
    pub fn chance(&mut self, p: f64) -> bool {
        // 53 random bits give a uniform float in [0, 1).
        let x = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        x < p
    }

    /// `len` random bytes.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len + 8);
        while out.len() < len {
            out.extend_from_slice(&self.next_u64().to_le_bytes());
        }
        out.truncate(len);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_replays_its_sequence() {
        let a: Vec<u64> = {
            let mut r = Rng::new(7);
            (0..5).map(|_| r.next_u64()).collect()
        };
        let mut r = Rng::new(7);
        let b: Vec<u64> = (0..5).map(|_| r.next_u64()).collect();
        assert_eq!(a, b);
        assert_ne!(a[0], Rng::new(8).next_u64());
    }

    #[test]
    fn range_stays_inside_its_bounds_and_reaches_both() {
        let mut r = Rng::new(1);
        let draws: Vec<u64> = (0..1000).map(|_| r.range(3, 5)).collect();
        assert!(draws.iter().all(|d| (3..=5).contains(d)));
        assert!(draws.contains(&3) && draws.contains(&5));
        assert_eq!(r.bytes(13).len(), 13);
        assert!(!r.chance(0.0));
        assert!(r.chance(1.0));
    }
}
