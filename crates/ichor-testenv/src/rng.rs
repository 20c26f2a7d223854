//! Seeded, replayable randomness for tests: one generator, one environment variable.
//!
//! A randomized test takes its seed from [`seed`] (or its seeds from [`seeds`]) and prints
//! it; `ICHOR_TEST_SEED=<n>` replays a failure with exactly that seed.

use rand::RngCore;

/// The environment variable that fixes the seed of every randomized test.
pub const SEED_ENV: &str = "ICHOR_TEST_SEED";

/// The seed from `ICHOR_TEST_SEED` if set, else `default`; printed with how to replay it (the
/// test runner shows it when the test fails).
pub fn seed(default: u64) -> u64 {
    let seed = from_env().unwrap_or(default);
    eprintln!("seed {seed} (replay: {SEED_ENV}={seed})");
    seed
}

/// The seeds to run: the one in `ICHOR_TEST_SEED` if set, else `first..first + count`.
pub fn seeds_from(first: u64, count: u64) -> Vec<u64> {
    match from_env() {
        Some(seed) => vec![seed],
        None => (first..first.saturating_add(count)).collect(),
    }
}

/// The seeds to run: the one in `ICHOR_TEST_SEED` if set, else `0..count`.
pub fn seeds(count: u64) -> Vec<u64> {
    match from_env() {
        Some(seed) => vec![seed],
        None => (0..count).collect(),
    }
}

/// A generator seeded by [`seed`]`(default)`.
pub fn seeded(default: u64) -> TestRng {
    TestRng::new(seed(default))
}

fn from_env() -> Option<u64> {
    let value = std::env::var(SEED_ENV).ok()?;
    Some(
        value
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{SEED_ENV} must be a number, got {value:?}")),
    )
}

/// SplitMix64: small, fast, deterministic for a seed; good enough to pick test actions (not
/// for anything secret). Implements [`RngCore`], so `rand`'s helpers work on it.
#[derive(Debug, Clone)]
pub struct TestRng(u64);

impl TestRng {
    /// The generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed ^ 0x5DEE_CE66_D1CE_5EED)
    }

    /// A number in `0..n`; `0` when `n` is `0`.
    pub fn below(&mut self, n: usize) -> usize {
        let n = u64::try_from(n).unwrap_or(u64::MAX);
        if n == 0 {
            return 0;
        }
        usize::try_from(self.next_u64() % n).unwrap_or(0)
    }

    /// True `num` times in `den` (`den > 0`).
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.next_u64() % den < num
    }
}

impl RngCore for TestRng {
    fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn fill_bytes(&mut self, dest: &mut [u8]) {
        for chunk in dest.chunks_mut(8) {
            let bytes = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_replays_the_same_sequence() {
        let a: Vec<u64> = (0..8)
            .map({
                let mut r = TestRng::new(7);
                move |_| r.next_u64()
            })
            .collect();
        let b: Vec<u64> = (0..8)
            .map({
                let mut r = TestRng::new(7);
                move |_| r.next_u64()
            })
            .collect();
        let c = TestRng::new(8).next_u64();
        assert_eq!(a, b);
        assert_ne!(a[0], c);
    }

    #[test]
    fn below_stays_in_range() {
        let mut r = TestRng::new(1);
        assert!((0..1000).all(|_| r.below(3) < 3));
        assert_eq!(r.below(0), 0);
    }
}
