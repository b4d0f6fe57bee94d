//! The one random number generator of the load generator and the engine bench: `fastrand`,
//! seeded per thread so that every run draws the same sequences.

pub use fastrand::Rng;
use std::time::Duration;

const SEED: u64 = 0x5EED_CAFE_F00D;
const SECOND: u64 = 1_000_000_000;

/// The generator of submitting thread `thread` (the same seed on every run).
pub fn for_thread(thread: usize) -> Rng {
    Rng::with_seed(SEED ^ (thread as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// A uniform delay in `[low, high]` seconds.
#[inline]
pub fn uniform(rng: &mut Rng, low: u64, high: u64) -> Duration {
    Duration::from_nanos(rng.u64(low * SECOND..=high * SECOND))
}

/// A uniform delay in `[low, high)`.
#[inline]
pub fn between(rng: &mut Rng, low: Duration, high: Duration) -> Duration {
    let span = u64::try_from((high - low).as_nanos()).unwrap_or(u64::MAX);
    low + Duration::from_nanos(rng.u64(0..span))
}
