//! The one exponential backoff of the project: a first delay, doubled after each
//! consecutive failure up to a cap, and reset by a success; optionally spread at
//! random. It never sleeps and never reads a clock; callers wait on whatever clock
//! they were given.

use std::time::Duration;

/// Consecutive failures and the delays they earn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    failures: u32,
}

impl Backoff {
    /// Waits `first` after one failure, twice that after two, and so on up to `max`.
    pub const fn new(first: Duration, max: Duration) -> Backoff {
        Backoff {
            first,
            max,
            failures: 0,
        }
    }

    /// The delay after `failures` consecutive failures (none after none).
    pub fn delay_after(&self, failures: u32) -> Duration {
        if failures == 0 {
            return Duration::ZERO;
        }
        // 2^31 × first overflows long before any cap anyone sets is reached.
        let factor = 1u32 << (failures - 1).min(31);
        self.first.saturating_mul(factor).min(self.max)
    }

    /// Counts a failure; returns how long to wait before trying again.
    pub fn fail(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        self.delay_after(self.failures)
    }

    /// `fail`, the wait stretched by up to half at random: many clients that failed
    /// together (a fleet's agents when their store is overloaded) do not all try
    /// again at the same moment.
    pub fn fail_spread(&mut self) -> Duration {
        let d = self.fail();
        d + d.mul_f64(unit_random() / 2.0)
    }

    /// Counts a success (the next failure waits `first` again); returns whether
    /// it ends a run of failures, for a "works again" line.
    pub fn succeed(&mut self) -> bool {
        std::mem::take(&mut self.failures) > 0
    }

    /// Consecutive failures so far.
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

/// A number in [0, 1), different at each call (from the standard library's
/// per-instance random hashing keys; good enough to spread retries).
pub fn unit_random() -> f64 {
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0);
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_caps_and_resets() {
        let s = Duration::from_secs;
        let mut b = Backoff::new(s(1), s(5));
        assert_eq!(b.delay_after(0), Duration::ZERO);
        let waits: Vec<Duration> = (0..5).map(|_| b.fail()).collect();
        assert_eq!(waits, [s(1), s(2), s(4), s(5), s(5)]);
        assert_eq!(b.failures(), 5);
        assert!(b.succeed());
        assert!(!b.succeed());
        assert_eq!(b.fail(), s(1));
        assert_eq!(b.delay_after(u32::MAX), s(5));
    }

    #[test]
    fn spread_waits_stay_within_half_again_and_differ() {
        let mut b = Backoff::new(Duration::from_secs(2), Duration::from_secs(2));
        let waits: Vec<Duration> = (0..50).map(|_| b.fail_spread()).collect();
        assert!(
            waits
                .iter()
                .all(|w| *w >= Duration::from_secs(2) && *w < Duration::from_secs(3)),
            "{waits:?}"
        );
        let distinct: std::collections::BTreeSet<Duration> = waits.iter().copied().collect();
        assert!(distinct.len() > 40, "{waits:?}");
    }
}
