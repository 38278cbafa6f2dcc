//! What a write path says one write did, and what the committed writes add
//! up to: the two halves of an honest verdict.
//!
//! The harness cannot see inside your write path. Only the path knows
//! whether its write reached the state: a transaction the watchdog dropped
//! before its `COMMIT` wrote nothing; one whose connection died during the
//! `COMMIT` may have. So the write closure answers with an [`Outcome`], and
//! the checker believes exactly that much: a [`Outcome::Committed`] write
//! must be in the final state, a [`Outcome::NotWritten`] or
//! [`Outcome::Stopped`] one must not, an [`Outcome::Unknown`] one may or
//! may not. A path that claims "not written" for a write that landed shows
//! up as a violation, which is what a test is for.

use std::collections::BTreeMap;
use std::future::Future;

use leasehold::LostCause;

use crate::callers::{Call, Written};
use crate::history::{Kind, WriteOutcome};

/// What your write path says one write did.
///
/// ```
/// use leasehold_chaos::{Call, Outcome};
///
/// # async fn demo(call: Call<'_>) -> Outcome {
/// // The watchdog stops the work at an `.await` if the lease is lost; a
/// // stopped work wrote nothing (its transaction was rolled back).
/// match call.run(async { /* read, pause point, write, commit */ true }).await {
///     Ok(true) => Outcome::Committed,
///     Ok(false) => Outcome::Refused,
///     Err(stopped) => stopped.into(),
/// }
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The write reached the state and was committed: the final state must
    /// show it.
    Committed,
    /// The write path's own check refused it (a stale fencing token, a
    /// changed value under check-and-set): nothing written.
    Refused,
    /// Nothing reached the state: the path failed or declined before it
    /// wrote (a business rule, a rolled-back transaction). The reason is
    /// shown in the history (never put a secret in it).
    NotWritten(String),
    /// The lease's watchdog stopped the work before it wrote (what
    /// [`Call::run`] returns as [`Stopped`]): nothing written. Counted as not
    /// written, and apart, in [`RunReport::stopped`](crate::RunReport::stopped).
    Stopped,
    /// The path cannot know whether the write landed (the connection died
    /// during the `COMMIT`): the checker accepts either. The reason is shown
    /// in the history.
    Unknown(String),
}

/// The history's detail of an [`Outcome::Stopped`] write.
pub(crate) const STOPPED: &str = "stopped by the watchdog before it wrote";

impl Outcome {
    /// The history's outcome and detail.
    pub(crate) fn recorded(&self) -> (WriteOutcome, Option<String>) {
        match self {
            Outcome::Committed => (WriteOutcome::Accepted, None),
            Outcome::Refused => (WriteOutcome::RefusedStale, None),
            Outcome::NotWritten(why) => (WriteOutcome::Failed, Some(why.clone())),
            Outcome::Stopped => (WriteOutcome::Failed, Some(STOPPED.to_owned())),
            Outcome::Unknown(why) => (WriteOutcome::Unknown, Some(why.clone())),
        }
    }
}

impl From<Outcome> for Written {
    fn from(outcome: Outcome) -> Written {
        let (outcome, detail) = outcome.recorded();
        Written { outcome, detail }
    }
}

/// The watchdog found the lease lost and stopped the work at an `.await`
/// ([`Call::run`]). The work did not run past that point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stopped {
    /// Why the lease was lost, when the lease knows.
    pub cause: Option<LostCause>,
}

impl From<Stopped> for Outcome {
    fn from(_: Stopped) -> Outcome {
        Outcome::Stopped
    }
}

impl Call<'_> {
    /// Runs `work` (your read, [`pause_point`](Call::pause_point), write and
    /// commit) under the lease's watchdog when the harness runs one
    /// ([`Harness::watchdog`](crate::Harness::watchdog)): the work is
    /// dropped at its current `.await` when the watchdog finds the lease
    /// lost, and the result is `Err(`[`Stopped`]`)`, exactly as
    /// [`Lease::run`](leasehold::Lease::run) and `with_lock` do in your
    /// service. Without a watchdog (or a lease) it is `work.await`.
    ///
    /// Whether a stopped work wrote nothing is for your path to know: a
    /// transaction dropped before its `COMMIT` is rolled back, so
    /// `Err(stopped) => stopped.into()` ([`Outcome::Stopped`]) is right for
    /// it; a statement already sent in autocommit has landed, and calling it
    /// stopped will be caught as a lost or duplicated write. Shield the
    /// commit (`lease.shield(tx.commit())`) so that its answer is never
    /// lost.
    ///
    /// # Errors
    /// [`Stopped`] when the watchdog stopped the work.
    pub async fn run<F: Future>(&self, work: F) -> Result<F::Output, Stopped> {
        match self.lease {
            Some(lease) if lease.is_watched() => lease.run(work).await.map_err(|_| Stopped {
                cause: lease.lost(),
            }),
            _ => Ok(work.await),
        }
    }
}

/// What the writes of a run came to, per resource, as your write path
/// reported them ([`Outcome`]): what your invariant compares your final
/// state with.
///
/// ```
/// # use leasehold_chaos::{Kind, Writes};
/// # fn demo(writes: &Writes, jobs_done: i64) -> Vec<Kind> {
/// // A counter each committed job adds one to, from 0.
/// vec![writes.check_counter("jobs:1", 0, jobs_done)]
/// # }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Writes {
    resources: BTreeMap<String, Tally>,
}

/// The writes to one resource.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    /// Writes reported [`Outcome::Committed`].
    pub committed: u64,
    /// The sum of their amounts.
    pub committed_sum: i64,
    /// The amounts of the writes reported [`Outcome::Unknown`].
    pub unknown: Vec<i64>,
}

impl Writes {
    /// Counts one write of `amount` to `resource`.
    pub(crate) fn add(&mut self, resource: &str, amount: i64, outcome: &Outcome) {
        let tally = self.resources.entry(resource.to_owned()).or_default();
        match outcome {
            Outcome::Committed => {
                tally.committed += 1;
                tally.committed_sum = tally.committed_sum.saturating_add(amount);
            }
            Outcome::Unknown(_) => tally.unknown.push(amount),
            Outcome::Refused | Outcome::NotWritten(_) | Outcome::Stopped => {}
        }
    }

    /// Adds `other`'s writes to these.
    pub(crate) fn merge(&mut self, other: Writes) {
        for (resource, tally) in other.resources {
            let mine = self.resources.entry(resource).or_default();
            mine.committed += tally.committed;
            mine.committed_sum = mine.committed_sum.saturating_add(tally.committed_sum);
            mine.unknown.extend(tally.unknown);
        }
    }

    /// The writes to `resource` (empty when none was made).
    pub fn of(&self, resource: &str) -> Tally {
        self.resources.get(resource).cloned().unwrap_or_default()
    }

    /// The check of a counter that each committed write to `resource` adds
    /// one to, from `initial`: it holds when `value - initial` is the
    /// number of committed writes plus any number of the unknown ones.
    /// Fewer is a lost write (two holders read the same value and both
    /// wrote it plus one: one of the two committed writes is missing),
    /// more a duplicate (a write applied twice, or one reported not
    /// written that landed).
    pub fn check_counter(&self, resource: &str, initial: i64, value: i64) -> Kind {
        let tally = self.of(resource);
        let done = value.saturating_sub(initial);
        let low = i64::try_from(tally.committed).unwrap_or(i64::MAX);
        let high = low.saturating_add(i64::try_from(tally.unknown.len()).unwrap_or(i64::MAX));
        let ok = (low..=high).contains(&done);
        let detail = format!(
            "counter {value} from {initial}: {} committed, {} unknown{}",
            tally.committed,
            tally.unknown.len(),
            if ok {
                String::new()
            } else if done < low {
                format!(
                    ": lost: {} committed writes missing from the final state",
                    low - done
                )
            } else {
                format!(
                    ": duplicate: {} more than the writes made (a write applied twice, or \
                     one reported not written that landed)",
                    done - high
                )
            }
        );
        Kind::ResourceCheck {
            resource: resource.to_owned(),
            ok,
            detail,
        }
    }

    /// The check of a value that each committed write to `resource` adds
    /// its amount to (a negative amount takes away), from `initial`: it
    /// holds when `value - initial` is the committed amounts plus the
    /// amounts of some of the unknown writes.
    pub fn check_sum(&self, resource: &str, initial: i64, value: i64) -> Kind {
        let tally = self.of(resource);
        let unexplained = value
            .saturating_sub(initial)
            .saturating_sub(tally.committed_sum);
        let ok = subset_sum(&tally.unknown, unexplained);
        Kind::ResourceCheck {
            resource: resource.to_owned(),
            ok,
            detail: format!(
                "value {value} from {initial}: {} committed summing to {}, {} unknown{}",
                tally.committed,
                tally.committed_sum,
                tally.unknown.len(),
                if ok {
                    String::new()
                } else {
                    format!(": {unexplained} not explained by the writes")
                }
            ),
        }
    }

    /// A check of `resource` you made yourself: `ok` and what you found.
    pub fn check(&self, resource: &str, ok: bool, detail: impl Into<String>) -> Kind {
        Kind::ResourceCheck {
            resource: resource.to_owned(),
            ok,
            detail: detail.into(),
        }
    }
}

/// Whether some subset of `amounts` sums to `target` (exact up to 4096
/// distinct sums; past that, whether `target` is in their range: weaker,
/// never a false alarm).
fn subset_sum(amounts: &[i64], target: i64) -> bool {
    let mut sums = std::collections::BTreeSet::from([0i64]);
    for amount in amounts {
        let next: Vec<i64> = sums.iter().map(|s| s.saturating_add(*amount)).collect();
        sums.extend(next);
        if sums.len() > 4096 {
            let low: i64 = amounts.iter().filter(|a| **a < 0).sum();
            let high: i64 = amounts.iter().filter(|a| **a > 0).sum();
            return (low..=high).contains(&target);
        }
    }
    sums.contains(&target)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(kind: &Kind) -> bool {
        matches!(kind, Kind::ResourceCheck { ok: true, .. })
    }

    #[test]
    fn a_counter_holds_only_between_committed_and_committed_plus_unknown() {
        let mut writes = Writes::default();
        for _ in 0..3 {
            writes.add("jobs", 1, &Outcome::Committed);
        }
        writes.add("jobs", 1, &Outcome::Unknown("commit cut".into()));
        writes.add("jobs", 1, &Outcome::Stopped);
        writes.add("jobs", 1, &Outcome::NotWritten("declined".into()));
        assert!(!ok(&writes.check_counter("jobs", 10, 12)), "a lost update");
        assert!(ok(&writes.check_counter("jobs", 10, 13)));
        assert!(ok(&writes.check_counter("jobs", 10, 14)));
        assert!(!ok(&writes.check_counter("jobs", 10, 15)), "one too many");
        assert!(!ok(&writes.check_counter("other", 0, 1)));
    }

    #[test]
    fn a_sum_is_explained_by_committed_amounts_and_some_unknown_ones() {
        let mut writes = Writes::default();
        writes.add("a", -5, &Outcome::Committed);
        writes.add("a", -7, &Outcome::Unknown("commit cut".into()));
        assert!(ok(&writes.check_sum("a", 100, 95)));
        assert!(ok(&writes.check_sum("a", 100, 88)));
        assert!(!ok(&writes.check_sum("a", 100, 93)));
    }
}
