//! The clock, injected: the wall clock in production; in tests a clock that moves
//! with tokio's, so that `#[tokio::test(start_paused = true)]` controls both the
//! timers and the Unix time that decisions compare against.

use std::sync::Arc;

/// Where "now" comes from. Timers use tokio's clock (`tokio::time`), which paused
/// tests control; Unix time comes from here.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Seconds since the Unix epoch.
    fn unix_now(&self) -> u64;
}

pub type DynClock = Arc<dyn Clock>;

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn unix_now(&self) -> u64 {
        crate::time::unix_now()
    }
}

/// Unix time that starts at `base` and advances with tokio's clock only.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    base: u64,
    start: tokio::time::Instant,
}

impl TokioClock {
    pub fn starting_at(base: u64) -> TokioClock {
        TokioClock {
            base,
            start: tokio::time::Instant::now(),
        }
    }
}

impl Clock for TokioClock {
    fn unix_now(&self) -> u64 {
        self.base + self.start.elapsed().as_secs()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn tokio_clock_follows_paused_time() {
        let c = TokioClock::starting_at(1_000);
        assert_eq!(c.unix_now(), 1_000);
        tokio::time::sleep(std::time::Duration::from_secs(90)).await;
        assert_eq!(c.unix_now(), 1_090);
    }
}
