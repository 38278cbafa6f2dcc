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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use serde::Serialize;

use crate::fault::Fault;
use crate::history::{Event, Kind, WriteOutcome};
use crate::verdicts::{ControlVerdict, Runs, Verdict};

/// How far before a fault's start its pre-fault rate is measured, at most:
/// 2 s.
pub const PRE_WINDOW_US: u64 = 2_000_000;

/// The smallest recovery window: 250 ms (the window is the TTL when that is
/// longer).
pub const MIN_RECOVERY_WINDOW_US: u64 = 250_000;

/// The share of the pre-fault rate that counts as recovered: 80%.
pub const RECOVERY_FRACTION: f64 = 0.8;

/// Past this many distinct subset sums of unknown writes, the lost-update
/// check falls back to a range.
const MAX_SUBSET_SUMS: usize = 1 << 16;

/// What one history shows.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct RunCheck {
    /// The run's header; `None` when the history has none (then
    /// [`Violation::MissingHeader`] is among the violations).
    pub header: Option<RunHeader>,
    /// The time of the last event, in microseconds since the run started.
    pub duration_us: u64,
    /// How many operations of each kind, and their outcomes.
    pub counts: Counts,
    /// Every broken invariant; empty when the run holds.
    pub violations: Vec<Violation>,
    /// Every pair of leases on one key held at once (not a violation).
    pub overlaps: Vec<Overlap>,
    /// How throughput recovered after each fault, in the order they ended.
    pub recovery: Vec<Recovery>,
    /// The errors the callers were returned, and whether they are judged.
    pub errors: CallerErrors,
}

/// The errors the callers were returned that the lock's contention does
/// not explain, by call (see the [module docs](self)).
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

impl RunCheck {
    /// True when the history shows no violation.
    #[must_use]
    pub fn holds(&self) -> bool {
        self.violations.is_empty()
    }

    /// True when the run's write path met the lock failing: two callers
    /// held it at once, or the run took no lock at all and wrote (every
    /// write then met the others).
    #[must_use]
    pub fn exercised(&self) -> bool {
        !self.overlaps.is_empty() || (self.counts.acquires == 0 && self.counts.writes.total() > 0)
    }

    /// The run's [`Verdict`], checked alone: no control ran (see
    /// [`verdict_with`](Self::verdict_with)).
    #[must_use]
    pub fn verdict(&self) -> Verdict {
        self.verdict_with(&ControlVerdict::NotRun)
    }

    /// The run's [`Verdict`], given what its negative control showed.
    #[must_use]
    pub fn verdict_with(&self, control: &ControlVerdict) -> Verdict {
        Verdict::judge(&self.runs(), control)
    }

    /// What [`Verdict::judge`] reads of this run.
    pub(crate) fn runs(&self) -> Runs {
        Runs {
            control: self.is_control(),
            reported_only: self.is_reported_only(),
            runs: 1,
            runs_with_violation: u64::from(!self.holds()),
            violations: self.violations.len() as u64,
            double_holders: self.overlaps.len() as u64,
            exercised: self.exercised(),
        }
    }

    /// True when the run is a negative control (a mode expected to break
    /// under its fault); false when it is not or has no header.
    #[must_use]
    pub fn is_control(&self) -> bool {
        self.header.as_ref().is_some_and(|h| h.control)
    }

    /// True when the run's mode makes no safety claim under its fault: its
    /// violations are reported, not judged.
    #[must_use]
    pub fn is_reported_only(&self) -> bool {
        self.header.as_ref().is_some_and(|h| h.reported_only)
    }

    /// True when throughput recovered within `limit_us` after every fault
    /// whose recovery is measurable. Faults that are not measurable (see
    /// [`Recovery::measurable`]) are skipped, so a run with none is
    /// trivially true.
    #[must_use]
    pub fn recovered_within(&self, limit_us: u64) -> bool {
        self.recovery
            .iter()
            .filter(|r| r.measurable)
            .all(|r| r.recovered_after_us.is_some_and(|after| after <= limit_us))
    }
}

/// The run's header, as in [`Kind::Run`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct RunHeader {
    /// The lock mode, e.g. `fenced-cas`.
    pub mode: String,
    /// The fault schedule's name, e.g. `process-pause` or `none`.
    pub fault: String,
    /// The seed of the workload and the fault schedule.
    pub seed: u64,
    /// The lease TTL in milliseconds.
    pub ttl_ms: u64,
    /// True for a negative control.
    pub control: bool,
    /// True when violations are reported, not judged.
    pub reported_only: bool,
    /// The resources and their initial balances.
    pub initial: Vec<(String, i64)>,
}

/// How many operations of each kind a history records.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Counts {
    /// Acquires started ([`Kind::Acquire`]).
    pub acquires: u64,
    /// Acquires that got the lease.
    pub acquired: u64,
    /// Acquires that gave up.
    pub acquire_failed: u64,
    /// Lease extensions.
    pub refreshes: u64,
    /// Writes, by outcome.
    pub writes: WriteCounts,
    /// Releases (whatever their outcome).
    pub releases: u64,
    /// Releases that found the lease gone (`not_held`).
    pub releases_not_held: u64,
    /// Leases their holder learnt were lost.
    pub leases_lost: u64,
}

impl Counts {
    /// The operations a caller made: acquires started plus writes.
    #[must_use]
    pub fn operations(&self) -> u64 {
        self.acquires + self.writes.total()
    }
}

/// Writes by outcome.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct WriteCounts {
    /// Committed.
    pub accepted: u64,
    /// Refused by the fence or check-and-set.
    pub refused_stale: u64,
    /// Refused for lack of funds.
    pub insufficient: u64,
    /// Failed before commit.
    pub failed: u64,
    /// Outcome unknown.
    pub unknown: u64,
}

impl WriteCounts {
    /// All writes.
    #[must_use]
    pub fn total(&self) -> u64 {
        self.accepted + self.refused_stale + self.insufficient + self.failed + self.unknown
    }

    fn add(&mut self, outcome: WriteOutcome) {
        match outcome {
            WriteOutcome::Accepted => self.accepted += 1,
            WriteOutcome::RefusedStale => self.refused_stale += 1,
            WriteOutcome::Insufficient => self.insufficient += 1,
            WriteOutcome::Failed => self.failed += 1,
            WriteOutcome::Unknown => self.unknown += 1,
        }
    }
}

/// A broken invariant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Violation {
    /// The history has no [`Kind::Run`] header: nothing can be checked.
    MissingHeader,
    /// The balance is not the initial balance minus the accepted debits
    /// (minus any subset of the debits of unknown outcome).
    LostUpdate {
        /// The resource.
        resource: String,
        /// Its initial balance.
        initial: i64,
        /// The sum of its accepted debits.
        accepted: i64,
        /// How many writes of unknown outcome it had.
        unknown_writes: u64,
        /// The sum of their amounts.
        unknown_sum: i64,
        /// Its final balance.
        balance: i64,
        /// `initial - accepted`.
        expected: i64,
    },
    /// More ledger rows than accepted debits (plus debits of unknown
    /// outcome): a debit was applied twice.
    DuplicatedDebit {
        /// The resource.
        resource: String,
        /// Its ledger rows.
        ledger_rows: u64,
        /// Its accepted debits.
        accepted: u64,
        /// Its debits of unknown outcome.
        unknown: u64,
    },
    /// Fewer ledger rows than accepted debits: an acknowledged debit is not
    /// in the ledger.
    LostDebit {
        /// The resource.
        resource: String,
        /// Its ledger rows.
        ledger_rows: u64,
        /// Its accepted debits.
        accepted: u64,
    },
    /// The balance is not the initial balance minus the ledger's sum.
    LedgerMismatch {
        /// The resource.
        resource: String,
        /// Its initial balance.
        initial: i64,
        /// Its final balance.
        balance: i64,
        /// The sum of its ledger's amounts.
        ledger_sum: i64,
    },
    /// The final balance is below zero.
    NegativeBalance {
        /// The resource.
        resource: String,
        /// Its final balance.
        balance: i64,
    },
    /// A user-supplied invariant check said the state is wrong.
    InvariantFailed {
        /// Who ran the check.
        actor: String,
        /// What it said.
        detail: String,
    },
    /// A resource of the header has no [`Kind::Final`] state.
    MissingFinal {
        /// The resource.
        resource: String,
    },
    /// A resource is written or read but not in the header, so it cannot
    /// be checked.
    UnknownResource {
        /// The resource.
        resource: String,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::MissingHeader => {
                write!(
                    f,
                    "the history has no run header, so no resource was checked"
                )
            }
            Violation::LostUpdate {
                resource,
                initial,
                accepted,
                unknown_writes,
                unknown_sum,
                balance,
                expected,
            } => {
                write!(
                    f,
                    "lost: {resource} is {balance}, but {initial} less its committed writes \
                     ({accepted}) is {expected}"
                )?;
                if *unknown_writes > 0 {
                    write!(
                        f,
                        ", and no subset of its {unknown_writes} writes of unknown outcome \
                         (totalling {unknown_sum}) explains the difference"
                    )?;
                }
                f.write_str(": a committed write is missing from the final state")
            }
            Violation::DuplicatedDebit {
                resource,
                ledger_rows,
                accepted,
                unknown,
            } => write!(
                f,
                "duplicate: {resource} records {ledger_rows} writes for {accepted} committed \
                 and {unknown} of unknown outcome: a write applied twice"
            ),
            Violation::LostDebit {
                resource,
                ledger_rows,
                accepted,
            } => write!(
                f,
                "missing: {resource} records {ledger_rows} writes for {accepted} committed: \
                 {} committed writes missing from the final state",
                accepted.saturating_sub(*ledger_rows)
            ),
            Violation::LedgerMismatch {
                resource,
                initial,
                balance,
                ledger_sum,
            } => write!(
                f,
                "mismatch: {resource} is {balance}, but {initial} less the writes it records \
                 ({ledger_sum}) is {}",
                initial.saturating_sub(*ledger_sum)
            ),
            Violation::NegativeBalance { resource, balance } => {
                write!(f, "below zero: {resource} is {balance}")
            }
            Violation::InvariantFailed { actor, detail } => {
                write!(f, "invariant failed (checked by {actor}): {detail}")
            }
            Violation::MissingFinal { resource } => write!(
                f,
                "{resource} has no final state in the history, so it was not checked"
            ),
            Violation::UnknownResource { resource } => write!(
                f,
                "{resource} is written or read but not in the run header, so it was not checked"
            ),
        }
    }
}

/// One of two holders of a lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Holder {
    /// The caller.
    pub actor: String,
    /// Its lease's token label.
    pub token: String,
}

/// Two leases on one key held at once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Overlap {
    /// The lock key.
    pub key: String,
    /// The holder that acquired first (or, at the same instant, appears
    /// first in the history).
    pub a: Holder,
    /// The other holder.
    pub b: Holder,
    /// When both held it, from (inclusive).
    pub from_us: u64,
    /// To (exclusive).
    pub to_us: u64,
}

/// How throughput recovered after one fault.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Recovery {
    /// The fault.
    pub fault: String,
    /// What it hit.
    pub target: String,
    /// When it started, if the history says.
    pub started_us: Option<u64>,
    /// When it ended.
    pub ended_us: u64,
    /// Accepted writes per second before the fault (see the module docs).
    pub pre_rate: f64,
    /// The sliding window's width, in microseconds.
    pub window_us: u64,
    /// False when there is no pre-fault rate to compare with (no accepted
    /// write before the fault, or no start).
    pub measurable: bool,
    /// How long after the fault's end throughput was back; `None` when not
    /// measurable or never within the history.
    pub recovered_after_us: Option<u64>,
}

impl fmt::Display for Recovery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} on {}: ", self.fault, self.target)?;
        match (self.measurable, self.recovered_after_us) {
            (false, _) => write!(f, "not measurable (no accepted write before it)"),
            (true, Some(after)) => write!(
                f,
                "throughput back to 80% of {:.1} writes/s {:.1} ms after its end",
                self.pre_rate,
                after as f64 / 1000.0
            ),
            (true, None) => write!(
                f,
                "throughput never back to 80% of {:.1} writes/s within the run",
                self.pre_rate
            ),
        }
    }
}

/// How a lease's holding interval ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseEnd {
    /// The holder released it (whatever the release's outcome).
    Released,
    /// The holder learnt it was lost.
    Lost {
        /// Why, as recorded.
        cause: String,
    },
    /// Neither: held until the end of the history.
    Open,
}

/// One lease, held in its holder's view from `from_us` to `to_us`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseSpan {
    /// The holder.
    pub actor: String,
    /// The lock key.
    pub key: String,
    /// The token label.
    pub token: String,
    /// The fencing token, if any.
    pub fence: Option<u64>,
    /// When it was acquired.
    pub from_us: u64,
    /// When it was released or lost, or the end of the history.
    pub to_us: u64,
    /// How it ended.
    pub end: LeaseEnd,
}

/// A fault's window.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FaultWindow {
    /// The fault.
    pub fault: String,
    /// What it hit.
    pub target: String,
    /// Its [`Kind::FaultStart`], if recorded.
    pub from_us: Option<u64>,
    /// Its [`Kind::FaultEnd`], if recorded.
    pub to_us: Option<u64>,
}

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

/// Counts the [`Kind::CallerError`]s and decides whether they are judged.
fn caller_errors(events: &[&Event]) -> CallerErrors {
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

fn count(events: &[&Event]) -> Counts {
    let mut counts = Counts::default();
    for event in events {
        match &event.kind {
            Kind::Acquire { .. } => counts.acquires += 1,
            Kind::Acquired { .. } => counts.acquired += 1,
            Kind::AcquireFailed { .. } => counts.acquire_failed += 1,
            Kind::Refreshed { .. } => counts.refreshes += 1,
            Kind::Lost { .. } => counts.leases_lost += 1,
            Kind::Released { outcome, .. } => {
                counts.releases += 1;
                if outcome == "not_held" {
                    counts.releases_not_held += 1;
                }
            }
            Kind::Write { outcome, .. } => counts.writes.add(*outcome),
            _ => {}
        }
    }
    counts
}

#[derive(Default)]
struct Tally {
    accepted_sum: i64,
    accepted: u64,
    unknown: Vec<i64>,
}

struct Final {
    balance: i64,
    ledger_sum: i64,
    ledger_rows: u64,
}

fn safety(events: &[&Event], header: Option<&RunHeader>) -> Vec<Violation> {
    let mut tallies: BTreeMap<&str, Tally> = BTreeMap::new();
    let mut finals: BTreeMap<&str, Final> = BTreeMap::new();
    let mut invariants = Vec::new();
    let mut judged: BTreeSet<&str> = BTreeSet::new();
    for event in events {
        match &event.kind {
            Kind::Write {
                resource,
                amount,
                outcome,
                ..
            } => {
                let tally = tallies.entry(resource).or_default();
                match outcome {
                    WriteOutcome::Accepted => {
                        tally.accepted += 1;
                        tally.accepted_sum = tally.accepted_sum.saturating_add(*amount);
                    }
                    WriteOutcome::Unknown => tally.unknown.push(*amount),
                    WriteOutcome::RefusedStale
                    | WriteOutcome::Insufficient
                    | WriteOutcome::Failed => {}
                }
            }
            Kind::Final {
                resource,
                balance,
                ledger_sum,
                ledger_rows,
            } => {
                finals.insert(
                    resource,
                    Final {
                        balance: *balance,
                        ledger_sum: *ledger_sum,
                        ledger_rows: *ledger_rows,
                    },
                );
            }
            Kind::ResourceCheck {
                resource,
                ok,
                detail,
            } => {
                judged.insert(resource);
                if !ok {
                    invariants.push(Violation::InvariantFailed {
                        actor: event.actor.clone(),
                        detail: format!("{resource}: {detail}"),
                    });
                }
            }
            Kind::Invariant { ok: false, detail } => invariants.push(Violation::InvariantFailed {
                actor: event.actor.clone(),
                detail: detail.clone(),
            }),
            _ => {}
        }
    }

    let mut violations = Vec::new();
    let Some(header) = header else {
        violations.push(Violation::MissingHeader);
        violations.extend(invariants);
        return violations;
    };
    let empty = Tally::default();
    for (resource, initial) in &header.initial {
        let Some(state) = finals.get(resource.as_str()) else {
            if judged.contains(resource.as_str()) {
                continue;
            }
            violations.push(Violation::MissingFinal {
                resource: resource.clone(),
            });
            continue;
        };
        let tally = tallies.get(resource.as_str()).unwrap_or(&empty);
        resource_violations(resource, *initial, tally, state, &mut violations);
    }
    let known: BTreeSet<&str> = header.initial.iter().map(|(r, _)| r.as_str()).collect();
    let seen: BTreeSet<&str> = tallies
        .keys()
        .chain(finals.keys())
        .chain(judged.iter())
        .copied()
        .collect();
    for resource in seen.difference(&known) {
        violations.push(Violation::UnknownResource {
            resource: (*resource).to_owned(),
        });
    }
    violations.extend(invariants);
    violations
}

fn resource_violations(
    resource: &str,
    initial: i64,
    tally: &Tally,
    state: &Final,
    violations: &mut Vec<Violation>,
) {
    let expected = initial.saturating_sub(tally.accepted_sum);
    let unexplained = expected.saturating_sub(state.balance);
    if !subset_sum_reaches(&tally.unknown, unexplained) {
        violations.push(Violation::LostUpdate {
            resource: resource.to_owned(),
            initial,
            accepted: tally.accepted_sum,
            unknown_writes: tally.unknown.len() as u64,
            unknown_sum: tally.unknown.iter().fold(0i64, |s, a| s.saturating_add(*a)),
            balance: state.balance,
            expected,
        });
    }
    let unknown = tally.unknown.len() as u64;
    if state.ledger_rows > tally.accepted + unknown {
        violations.push(Violation::DuplicatedDebit {
            resource: resource.to_owned(),
            ledger_rows: state.ledger_rows,
            accepted: tally.accepted,
            unknown,
        });
    } else if state.ledger_rows < tally.accepted {
        violations.push(Violation::LostDebit {
            resource: resource.to_owned(),
            ledger_rows: state.ledger_rows,
            accepted: tally.accepted,
        });
    }
    if state.balance != initial.saturating_sub(state.ledger_sum) {
        violations.push(Violation::LedgerMismatch {
            resource: resource.to_owned(),
            initial,
            balance: state.balance,
            ledger_sum: state.ledger_sum,
        });
    }
    if state.balance < 0 {
        violations.push(Violation::NegativeBalance {
            resource: resource.to_owned(),
            balance: state.balance,
        });
    }
}

/// Whether some subset of `amounts` (the empty one included) sums to
/// `target`; past [`MAX_SUBSET_SUMS`] distinct sums, whether `target` lies
/// in the range of all subset sums.
fn subset_sum_reaches(amounts: &[i64], target: i64) -> bool {
    let mut sums = BTreeSet::from([0i64]);
    for amount in amounts {
        let next: Vec<i64> = sums.iter().map(|s| s.saturating_add(*amount)).collect();
        sums.extend(next);
        if sums.len() > MAX_SUBSET_SUMS {
            let low = amounts
                .iter()
                .filter(|a| **a < 0)
                .fold(0i64, |s, a| s.saturating_add(*a));
            let high = amounts
                .iter()
                .filter(|a| **a > 0)
                .fold(0i64, |s, a| s.saturating_add(*a));
            return (low..=high).contains(&target);
        }
    }
    sums.contains(&target)
}

fn lease_spans_sorted(events: &[&Event]) -> Vec<LeaseSpan> {
    let end_of_history = events.last().map_or(0, |e| e.at_us);
    let mut spans: Vec<LeaseSpan> = Vec::new();
    let mut open: HashMap<(&str, &str), usize> = HashMap::new();
    for event in events {
        let (key, token, end) = match &event.kind {
            Kind::Acquired {
                key, token, fence, ..
            } => {
                open.insert((key, token), spans.len());
                spans.push(LeaseSpan {
                    actor: event.actor.clone(),
                    key: key.clone(),
                    token: token.clone(),
                    fence: *fence,
                    from_us: event.at_us,
                    to_us: end_of_history,
                    end: LeaseEnd::Open,
                });
                continue;
            }
            Kind::Released { key, token, .. } => (key, token, LeaseEnd::Released),
            Kind::Lost { key, token, cause } => (
                key,
                token,
                LeaseEnd::Lost {
                    cause: cause.clone(),
                },
            ),
            _ => continue,
        };
        if let Some(index) = open.remove(&(key.as_str(), token.as_str()))
            && let Some(span) = spans.get_mut(index)
        {
            span.to_us = event.at_us.max(span.from_us);
            span.end = end;
        }
    }
    spans
}

fn overlaps(spans: &[LeaseSpan]) -> Vec<Overlap> {
    let mut by_key: BTreeMap<&str, Vec<&LeaseSpan>> = BTreeMap::new();
    for span in spans {
        by_key.entry(&span.key).or_default().push(span);
    }
    let mut found = Vec::new();
    for (key, spans) in by_key {
        // `spans` is in acquisition order: once a later lease starts after
        // this one ends, no later one can intersect it.
        for (i, a) in spans.iter().enumerate() {
            for b in spans.iter().skip(i + 1) {
                if b.from_us >= a.to_us {
                    break;
                }
                let (from_us, to_us) = (b.from_us, a.to_us.min(b.to_us));
                if a.token == b.token || from_us >= to_us {
                    continue;
                }
                found.push(Overlap {
                    key: key.to_owned(),
                    a: Holder {
                        actor: a.actor.clone(),
                        token: a.token.clone(),
                    },
                    b: Holder {
                        actor: b.actor.clone(),
                        token: b.token.clone(),
                    },
                    from_us,
                    to_us,
                });
            }
        }
    }
    found.sort_by_key(|o| (o.from_us, o.to_us));
    found
}

fn fault_windows_sorted(events: &[&Event]) -> Vec<FaultWindow> {
    let mut windows: Vec<FaultWindow> = Vec::new();
    let mut open: HashMap<(&str, &str), Vec<usize>> = HashMap::new();
    for event in events {
        match &event.kind {
            Kind::FaultStart { fault, target } => {
                open.entry((fault, target)).or_default().push(windows.len());
                windows.push(FaultWindow {
                    fault: fault.clone(),
                    target: target.clone(),
                    from_us: Some(event.at_us),
                    to_us: None,
                });
            }
            Kind::FaultEnd { fault, target } => {
                let started = open
                    .get_mut(&(fault.as_str(), target.as_str()))
                    .and_then(Vec::pop);
                match started.and_then(|i| windows.get_mut(i)) {
                    Some(window) => window.to_us = Some(event.at_us),
                    None => windows.push(FaultWindow {
                        fault: fault.clone(),
                        target: target.clone(),
                        from_us: None,
                        to_us: Some(event.at_us),
                    }),
                }
            }
            _ => {}
        }
    }
    windows.sort_by_key(|w| w.from_us.or(w.to_us));
    windows
}

fn recovery(events: &[&Event], window_us: u64) -> Vec<Recovery> {
    let accepted: Vec<u64> = events
        .iter()
        .filter(|e| {
            matches!(
                e.kind,
                Kind::Write {
                    outcome: WriteOutcome::Accepted,
                    ..
                }
            )
        })
        .map(|e| e.at_us)
        .collect();
    let workload_start = events
        .iter()
        .find_map(|e| match &e.kind {
            Kind::Acquire { .. } => Some(e.at_us),
            Kind::Write { started_us, .. } => Some((*started_us).min(e.at_us)),
            _ => None,
        })
        .unwrap_or(0);
    let windows = fault_windows_sorted(events);
    let fault_ends: Vec<u64> = windows.iter().filter_map(|w| w.to_us).collect();
    let mut recoveries: Vec<Recovery> = windows
        .iter()
        .filter_map(|w| {
            let ended_us = w.to_us?;
            let pre_rate = w.from_us.map_or(0.0, |started| {
                let earlier_end = fault_ends
                    .iter()
                    .copied()
                    .filter(|end| *end <= started)
                    .max()
                    .unwrap_or(0);
                let from = started
                    .saturating_sub(PRE_WINDOW_US)
                    .max(workload_start)
                    .max(earlier_end);
                rate(&accepted, from, started)
            });
            let measurable = pre_rate > 0.0;
            let recovered_after_us = if measurable {
                recovered_after(&accepted, ended_us, pre_rate, window_us)
            } else {
                None
            };
            Some(Recovery {
                fault: w.fault.clone(),
                target: w.target.clone(),
                started_us: w.from_us,
                ended_us,
                pre_rate,
                window_us,
                measurable,
                recovered_after_us,
            })
        })
        .collect();
    recoveries.sort_by_key(|r| r.ended_us);
    recoveries
}

/// Accepted writes per second in `[from, to)`; 0 for an empty window.
fn rate(accepted: &[u64], from: u64, to: u64) -> f64 {
    if to <= from {
        return 0.0;
    }
    let n = accepted.iter().filter(|t| (from..to).contains(*t)).count();
    n as f64 * 1_000_000.0 / (to - from) as f64
}

fn recovered_after(accepted: &[u64], ended_us: u64, pre_rate: f64, window_us: u64) -> Option<u64> {
    let needed = (RECOVERY_FRACTION * pre_rate * window_us as f64 / 1_000_000.0).ceil();
    // A float-to-int cast saturates; at least one write is needed.
    let needed = (needed as usize).max(1);
    let after: Vec<u64> = accepted
        .iter()
        .copied()
        .filter(|t| *t >= ended_us)
        .collect();
    after.windows(needed).find_map(|run| {
        let (first, last) = (run.first()?, run.last()?);
        (last - first < window_us).then(|| first - ended_us)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subset_sums_are_exact_while_few() {
        assert!(subset_sum_reaches(&[], 0));
        assert!(!subset_sum_reaches(&[], 10));
        assert!(subset_sum_reaches(&[10, 25], 35));
        assert!(!subset_sum_reaches(&[10, 25], 15));
        assert!(subset_sum_reaches(&[10, -5], 5));
    }

    #[test]
    fn subset_sums_fall_back_to_a_range_when_too_many() {
        // 17 distinct powers of two: 131,072 sums, past the cap.
        let amounts: Vec<i64> = (0..17).map(|i| 1i64 << i).chain([-3]).collect();
        assert!(subset_sum_reaches(&amounts, (1 << 17) - 1));
        assert!(subset_sum_reaches(&amounts, -3));
        assert!(!subset_sum_reaches(&amounts, 1 << 17));
        assert!(!subset_sum_reaches(&amounts, -4));
    }
}
