//! Client-side counters: what a locker asked of Redis.

use std::sync::atomic::{AtomicU64, Ordering};

/// A snapshot of a [`Locker`](crate::Locker)'s counters, shared by all its
/// clones (and by a [`HandoffLocker`](crate::HandoffLocker) built on it).
///
/// Counted on the client, one per request sent, so they measure what the
/// library costs Redis in round trips. (Redis's own
/// `total_commands_processed` also counts every command a Lua script runs,
/// so it is not a round-trip count.)
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockerStats {
    /// Requests that tried to take (or wait for) a lock: `SET NX` attempts,
    /// hand-off enqueue and re-check scripts.
    pub acquire_requests: u64,
    /// Requests that gave a lock back or left a wait queue.
    pub release_requests: u64,
    /// Leases taken, whether by a request or by a hand-off.
    pub acquisitions: u64,
}

impl LockerStats {
    /// All lock requests: [`acquire_requests`](Self::acquire_requests) plus
    /// [`release_requests`](Self::release_requests).
    pub fn requests(&self) -> u64 {
        self.acquire_requests.saturating_add(self.release_requests)
    }
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    acquire_requests: AtomicU64,
    release_requests: AtomicU64,
    acquisitions: AtomicU64,
}

impl Counters {
    pub(crate) fn acquire_request(&self) {
        self.acquire_requests.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn release_request(&self) {
        self.release_requests.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn acquisition(&self) {
        self.acquisitions.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> LockerStats {
        LockerStats {
            acquire_requests: self.acquire_requests.load(Ordering::Relaxed),
            release_requests: self.release_requests.load(Ordering::Relaxed),
            acquisitions: self.acquisitions.load(Ordering::Relaxed),
        }
    }
}
