//! What one history shows: [`RunCheck`], with the run's header and the
//! counts of its operations.

use serde::Serialize;

use crate::history::{Event, Kind, WriteOutcome};
use crate::verdicts::{ControlVerdict, Runs, Verdict};

use super::errors::CallerErrors;
use super::holders::Overlap;
use super::recovery::Recovery;
use super::violation::Violation;

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

pub(super) fn count(events: &[&Event]) -> Counts {
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
