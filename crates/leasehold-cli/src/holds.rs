//! Hold times of the leases a run took, for the "TTL shorter than the p99
//! hold time" safety check, printed once per process.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::Lease;

static WARNED: AtomicBool = AtomicBool::new(false);

/// The hold times of one run's leases.
#[derive(Debug, Clone, Default)]
pub(crate) struct HoldTimes(Arc<Mutex<Vec<Duration>>>);

impl HoldTimes {
    /// Records how long `lease` has been held, unless a watchdog keeps it
    /// (a refreshed lease may rightly be held past its TTL).
    pub(crate) fn record(&self, lease: &Lease) {
        if lease.is_watched() {
            return;
        }
        if let Ok(mut holds) = self.0.lock() {
            holds.push(lease.acquired_at().elapsed());
        }
    }

    /// The 99th percentile, if anything was recorded.
    pub(crate) fn p99(&self) -> Option<Duration> {
        let mut holds = self.0.lock().ok()?.clone();
        if holds.is_empty() {
            return None;
        }
        holds.sort_unstable();
        let rank = (holds.len() * 99).div_ceil(100).saturating_sub(1);
        holds.get(rank).copied()
    }

    /// Prints the library's finding once per process when the p99 hold
    /// time reached `ttl`.
    pub(crate) fn check(&self, ttl: Duration) {
        let Some(finding) = self
            .p99()
            .and_then(|p99| leasehold::diagnostics::check_hold_time(ttl, p99))
        else {
            return;
        };
        if !WARNED.swap(true, Ordering::Relaxed) {
            crate::progress::note!("leasehold: safety warning: {finding}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p99_of_a_hundred_is_the_99th() {
        let holds = HoldTimes::default();
        if let Ok(mut v) = holds.0.lock() {
            v.extend((1..=100).rev().map(Duration::from_millis));
        }
        assert_eq!(holds.p99(), Some(Duration::from_millis(99)));
        assert_eq!(HoldTimes::default().p99(), None);
    }
}
