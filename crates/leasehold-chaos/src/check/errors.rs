//! The errors returned to the callers ([`CallerErrors`]), counted by call
//! and judged as the module docs' "Errors returned to the callers" says.

use std::fmt;

use serde::Serialize;

use crate::fault::Fault;
use crate::history::{Event, Kind};

use super::recovery::fault_windows_sorted;

/// The errors the callers were returned that the lock's contention does
/// not explain, by call (see the [module docs](super)).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct CallerErrors {
    /// Acquires that failed other than with `NotAcquired`.
    pub acquire: u64,
    /// Releases that failed other than with `NotHeld` / `LeaseLost`.
    pub release: u64,
    /// Leases the watchdog gave up on because Redis did not answer its
    /// refreshes in time.
    pub refresh: u64,
    /// Whether acquire and release errors are judged: the budget is known
    /// and every fault window was shorter than the wait.
    pub judged: bool,
    /// Whether refresh errors are judged too: judged, and every fault left
    /// Redis answering.
    pub refresh_judged: bool,
}

impl CallerErrors {
    /// False when a judged count is not zero.
    #[must_use]
    pub fn holds(&self) -> bool {
        let failed_calls = self.judged && self.acquire + self.release > 0;
        let failed_refreshes = self.refresh_judged && self.refresh > 0;
        !failed_calls && !failed_refreshes
    }

    /// The three counts as `acquire/release/refresh`.
    #[must_use]
    pub fn summary(&self) -> String {
        format!("{}/{}/{}", self.acquire, self.release, self.refresh)
    }

    /// The judgement in a word: `FAILED` when a judged count is not zero,
    /// `ok` when judged, `not judged` otherwise.
    #[must_use]
    pub fn judgement(&self) -> &'static str {
        match (self.holds(), self.judged) {
            (false, _) => "FAILED",
            (true, true) => "ok",
            (true, false) => "not judged",
        }
    }
}

/// `errors to callers (acquire/release/refresh) 0/0/0: ok`, as the
/// harness's summary and `leasehold chaos` print it.
impl fmt::Display for CallerErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "errors to callers (acquire/release/refresh) {}: {}",
            self.summary(),
            self.judgement()
        )
    }
}

/// Counts the [`Kind::CallerError`]s and decides whether they are judged.
pub(super) fn caller_errors(events: &[&Event]) -> CallerErrors {
    let mut errors = CallerErrors::default();
    for event in events {
        if let Kind::CallerError { call, .. } = &event.kind {
            match call.as_str() {
                "acquire" => errors.acquire += 1,
                "release" => errors.release += 1,
                "refresh" => errors.refresh += 1,
                _ => {}
            }
        }
    }
    let wait_us = events.iter().find_map(|e| match e.kind {
        Kind::Budget { wait_ms } => Some(wait_ms.saturating_mul(1000)),
        _ => None,
    });
    let windows = fault_windows_sorted(events);
    errors.judged = wait_us.is_some_and(|wait_us| {
        windows.iter().all(|w| match (w.from_us, w.to_us) {
            (Some(from), Some(to)) => to.saturating_sub(from) < wait_us,
            _ => false,
        })
    });
    errors.refresh_judged = errors.judged
        && windows.iter().all(|w| {
            w.fault
                .parse::<Fault>()
                .is_ok_and(Fault::keeps_redis_answering)
        });
    errors
}
