//! The seeded schedule of a run's fault windows: when each fault starts,
//! how long it lasts, which worker it hits.

use std::time::Duration;

use rand::{RngExt, SeedableRng, rngs::StdRng};

use crate::fault::Fault;

/// One fault window of a schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// The fault (never [`Fault::Mixed`] or [`Fault::None`]).
    pub fault: Fault,
    /// When it starts, from the run's start.
    pub start: Duration,
    /// How long it lasts.
    pub length: Duration,
    /// Which worker it hits, for [`Fault::HolderPause`] (an index below the
    /// worker count).
    pub worker: u32,
}

impl Window {
    /// When it ends, from the run's start.
    pub fn end(&self) -> Duration {
        self.start + self.length
    }
}

/// The seeded fault schedule of one run.
///
/// The first window starts after a warm-up of a quarter of the run (so the
/// throughput before a fault can be measured); each lasts `3 x ttl`
/// (at least 300 ms, so a lease expires inside it) and is followed by a
/// quiet gap of at least `4 x ttl` (at least 1 s, so recovery can be seen).
/// The schedule ends a quiet gap before the run does. A
/// [`Fault::Failover`], [`Fault::ClusterFailover`],
/// [`Fault::SentinelFailover`] or [`Fault::SentinelKill`] happens once per
/// run;
/// [`Fault::Mixed`] draws each
/// window's fault from [`Fault::MIXABLE`].
pub fn schedule(
    fault: Fault,
    seed: u64,
    run: Duration,
    ttl: Duration,
    workers: u32,
) -> Vec<Window> {
    if fault == Fault::None {
        return Vec::new();
    }
    let mut rng = StdRng::seed_from_u64(seed ^ 0x006e_656d_6573_6973);
    let length = (ttl * 3).max(Duration::from_millis(300));
    let gap = (ttl * 4).max(Duration::from_secs(1));
    let mut windows = Vec::new();
    let mut at = run / 4;
    while at + length + gap <= run {
        let this = if fault == Fault::Mixed {
            Fault::MIXABLE[rng.random_range(0..Fault::MIXABLE.len())]
        } else {
            fault
        };
        let jitter = Duration::from_millis(rng.random_range(0..200));
        windows.push(Window {
            fault: this,
            start: at + jitter,
            length,
            worker: rng.random_range(0..workers.max(1)),
        });
        if matches!(
            fault,
            Fault::Failover
                | Fault::ClusterFailover
                | Fault::SentinelFailover
                | Fault::SentinelKill
        ) {
            break;
        }
        at += jitter + length + gap;
    }
    windows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schedule_is_reproducible_from_its_seed_and_leaves_quiet_gaps() {
        let run = Duration::from_secs(20);
        let ttl = Duration::from_millis(200);
        let a = schedule(Fault::Mixed, 7, run, ttl, 3);
        assert_eq!(a, schedule(Fault::Mixed, 7, run, ttl, 3));
        assert_ne!(a, schedule(Fault::Mixed, 8, run, ttl, 3));
        assert!(a.len() >= 3, "{a:?}");
        assert!(a[0].start >= run / 4);
        for pair in a.windows(2) {
            assert!(
                pair[1].start >= pair[0].end() + Duration::from_secs(1),
                "{pair:?}"
            );
        }
        assert!(
            a.iter()
                .all(|w| w.end() + Duration::from_secs(1) <= run && w.worker < 3)
        );
        assert!(a.iter().all(|w| Fault::MIXABLE.contains(&w.fault)));
    }

    #[test]
    fn a_failover_happens_once_and_no_fault_means_no_window() {
        let run = Duration::from_secs(20);
        let ttl = Duration::from_millis(200);
        assert_eq!(schedule(Fault::Failover, 1, run, ttl, 2).len(), 1);
        assert_eq!(schedule(Fault::SentinelFailover, 1, run, ttl, 2).len(), 1);
        assert_eq!(schedule(Fault::SentinelKill, 1, run, ttl, 2).len(), 1);
        assert!(schedule(Fault::None, 1, run, ttl, 2).is_empty());
    }
}
