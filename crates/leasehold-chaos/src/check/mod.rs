//! The checks on one history: safety (the money), double holders (the
//! lease), liveness (recovery after each fault).
//!
//! # Safety: what the database must show
//!
//! Each resource (a wallet, in `leasehold chaos`) starts at the value in
//! the run's header and is only ever changed by writes the history
//! records. At the end the checker
//! reads every resource's balance and ledger ([`Kind::Final`]). With
//! `accepted` the sum of the accepted debits of a resource, these must
//! hold, or the run has a [`Violation`]:
//!
//! - balance = initial - accepted, else a [`Violation::LostUpdate`] (two
//!   holders read the same balance and both wrote it back);
//! - ledger rows = accepted writes, else a [`Violation::DuplicatedDebit`]
//!   (more rows: a debit applied twice) or a [`Violation::LostDebit`]
//!   (fewer: an acknowledged debit vanished);
//! - balance = initial - ledger sum, else a [`Violation::LedgerMismatch`];
//! - balance >= 0, else a [`Violation::NegativeBalance`].
//!
//! A write whose outcome is [`WriteOutcome::Unknown`] (the connection died
//! during `COMMIT`) may or may not have happened, and no observer can tell
//! which: calling it lost or applied would each make a correct system look
//! broken. So the checks accept *any subset* of the unknown writes as
//! applied: the balance must be `initial - accepted - s` for `s` the sum of
//! some subset of the unknown debits, and the ledger may hold up to that
//! many extra rows. The subset sums are enumerated exactly up to
//! 65,536 distinct sums; past that the check only asks that the difference
//! lie between the sum of the negative and the sum of the positive unknown
//! amounts (weaker, never a false alarm).
//!
//! A resource may instead be judged by the user's own invariant over
//! their own state ([`Kind::ResourceCheck`], written by the
//! [`Harness`](crate::Harness)): then that verdict is its check (a failed
//! one is a [`Violation::InvariantFailed`]) and the balance checks above
//! do not apply to it.
//!
//! A resource of the header without a final state is a
//! [`Violation::MissingFinal`], a written or read resource missing from
//! the header a [`Violation::UnknownResource`], and a history without a
//! header a [`Violation::MissingHeader`]: a check that could not be made
//! must not pass silently.
//!
//! # Double holders are counted, not judged
//!
//! A lease is held, in the holder's view, from its [`Kind::Acquired`] to its
//! [`Kind::Released`] or [`Kind::Lost`] (same key and token), or to the end
//! of the history when neither came (a holder paused or killed never learns
//! its lease is gone). Two such intervals of different tokens on one key
//! that intersect are an [`Overlap`]: two callers believed they held the
//! lock at once.
//!
//! That is not a violation. A lease *will* fail this way: a holder paused
//! past its TTL, a failover that loses the key, a flushed script. Redis
//! cannot prevent it and the lock cannot detect it in time. What must not
//! fail is the money, and that is what the database's fence or
//! check-and-set is for: the stale holder's write is refused
//! ([`WriteOutcome::RefusedStale`]). Overlaps show how often the lease
//! failed under a fault; violations show whether anything was lost because
//! of it.
//!
//! # Liveness: recovery after a fault
//!
//! For each [`Kind::FaultEnd`] matched with its [`Kind::FaultStart`] (same
//! fault and target; the latest unmatched start), a [`Recovery`] compares
//! throughput (accepted writes, by completion time) after the fault with
//! before it:
//!
//! - the *pre-fault rate* is the number of accepted writes per second in the
//!   [`PRE_WINDOW_US`] (2 s) before the fault started, shortened so that it
//!   starts neither before the workload's first operation nor before the end
//!   of an earlier fault (a dip already in the window would lower the bar);
//! - the *window* is `max(ttl, 250 ms)`: a lease lost in the fault can keep
//!   the lock for up to one TTL before anyone may take it again, so a
//!   shorter window would call a healthy system slow;
//! - the system *recovered* at the first accepted write after the fault's
//!   end from which the next [`RECOVERY_FRACTION`] (80%) of the pre-fault
//!   rate's writes for one window complete within one window;
//!   `recovered_after_us` is that write's time minus the fault's end.
//!
//! When no write was accepted before the fault (or the fault had no start)
//! the recovery is *not measurable*; when the bar is never reached before
//! the history ends it is `None`. Faults running at the same time are not
//! told apart.
//!
//! # Errors returned to the callers
//!
//! A service sees a fault as the errors its calls return. The callers
//! record each one the lock's contention does not explain as a
//! [`Kind::CallerError`], and [`CallerErrors`] counts them by call:
//!
//! - **acquire**: any error but `NotAcquired` (the lock stayed busy through
//!   the whole wait, or the run's end cancelled the wait: contention, not a
//!   fault);
//! - **release**: any error but `NotHeld` / `LeaseLost` (Redis said the
//!   lease was gone: it really was lost, and the release says so);
//! - **refresh**: a lease the watchdog gave up on because Redis did not
//!   confirm a refresh before the lease ran out (`LeaseLost` with cause
//!   `unreachable`): the work was stopped though Redis never said the lease
//!   was gone. A lease found gone (`expired`) is not counted. Without the
//!   watchdog no caller refreshes, and there is nothing to count.
//!
//! They are **judged**: the library retries a fault that may pass within
//! the caller's budget, so a fault shorter than the caller's wait must
//! return **no** acquire or release error. A run is judged when it
//! recorded its budget ([`Kind::Budget`]) and every fault window was
//! shorter than the wait. Refresh errors are judged only when, besides,
//! every fault leaves Redis answering
//! ([`Fault::keeps_redis_answering`](crate::fault::Fault::keeps_redis_answering)):
//! a lease cannot outlive an outage longer than its TTL (it would be a
//! lease Redis did not confirm), so losing it then is the guarantee at
//! work, not an error. A judged run with an error fails
//! ([`CallerErrors::holds`]), next to the safety check.
//!
//! [`WriteOutcome::Unknown`]: crate::history::WriteOutcome::Unknown
//! [`WriteOutcome::RefusedStale`]: crate::history::WriteOutcome::RefusedStale

mod errors;
mod findings;
mod holders;
mod recovery;
mod safety;
mod violation;

use crate::history::{Event, Kind};

pub use errors::CallerErrors;
use errors::caller_errors;
use findings::count;
pub use findings::{Counts, RunCheck, RunHeader, WriteCounts};
pub use holders::{Holder, LeaseEnd, LeaseSpan, Overlap};
use holders::{lease_spans_sorted, overlaps};
pub use recovery::{
    FaultWindow, MIN_RECOVERY_WINDOW_US, PRE_WINDOW_US, RECOVERY_FRACTION, Recovery,
};
use recovery::{fault_windows_sorted, recovery};
use safety::safety;
pub use violation::Violation;

/// Checks one history (in any order: a sorted copy is used).
#[must_use]
pub fn check(events: &[Event]) -> RunCheck {
    let events = sorted(events);
    let duration_us = events.last().map_or(0, |e| e.at_us);
    let header = events.iter().find_map(|e| match &e.kind {
        Kind::Run {
            mode,
            fault,
            seed,
            ttl_ms,
            control,
            reported_only,
            initial,
        } => Some(RunHeader {
            mode: mode.clone(),
            fault: fault.clone(),
            seed: *seed,
            ttl_ms: *ttl_ms,
            control: *control,
            reported_only: *reported_only,
            initial: initial.clone(),
        }),
        _ => None,
    });
    let counts = count(&events);
    let violations = safety(&events, header.as_ref());
    let overlaps = overlaps(&lease_spans_sorted(&events));
    let window_us = header
        .as_ref()
        .map_or(0, |h| h.ttl_ms.saturating_mul(1000))
        .max(MIN_RECOVERY_WINDOW_US);
    let recovery = recovery(&events, window_us);
    let errors = caller_errors(&events);
    RunCheck {
        header,
        duration_us,
        counts,
        violations,
        overlaps,
        recovery,
        errors,
    }
}

/// The leases of a history (in any order), by acquisition time. An end
/// ([`Kind::Released`] or [`Kind::Lost`]) closes the open lease of the same
/// key and token; ends without one are ignored.
#[must_use]
pub fn lease_spans(events: &[Event]) -> Vec<LeaseSpan> {
    lease_spans_sorted(&sorted(events))
}

/// The fault windows of a history (in any order), by start. A
/// [`Kind::FaultEnd`] closes the latest open window of the same fault and
/// target; one without a start gets `from_us: None`.
#[must_use]
pub fn fault_windows(events: &[Event]) -> Vec<FaultWindow> {
    fault_windows_sorted(&sorted(events))
}

fn sorted(events: &[Event]) -> Vec<&Event> {
    let mut sorted: Vec<&Event> = events.iter().collect();
    sorted.sort_by_key(|e| e.at_us);
    sorted
}
