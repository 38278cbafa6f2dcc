//! What a run, or a row of runs, showed: one verdict, in the words the
//! harness ([`RunReport`](crate::RunReport)) and `leasehold chaos` (its
//! table, its JSON rows, `chaos check`) share.
//!
//! # A verdict says what was exercised
//!
//! A write path's own check (a fence, a check-and-set, the guard) is
//! exercised only when the lock fails: when two callers hold it at once (a
//! *double holder*), the check is all that stands between the second
//! writer and the first one's write. A run in which the lock never broke
//! says nothing about the check, however long it ran. And a run in which
//! it broke says something only if a *negative control* (the same run with
//! the check removed) was caught under the same fault and settings:
//! otherwise no broken path would have lost anything either. So:
//!
//! - **held**: the lock broke (`N` double holders), every one was absorbed
//!   (no violation), and the negative control was caught. Without a control
//!   it says **held, no control ran**: a pass that says what it does not
//!   know (a cell of the matrix under a fault no control runs under).
//! - **never broke**: no two callers held the lock at once: nothing was
//!   exercised. Not a pass for the check, and not a failure: a fault that
//!   never breaks the lock (a killed connection, a restart the watchdog
//!   rides out) is asserted this way in CI.
//! - **inconclusive**: double holders and no violation, but the negative
//!   control caught nothing: the run could not have caught a broken write
//!   path. A failure.
//! - **broken**: a violation. A failure.
//!
//! A negative control itself is **control caught** (what it is for) or
//! **control missed** (a failure: the checker or the fault is not
//! working, or the path without its check still has something that keeps
//! it right, which the harness's summary names:
//! [`RunReport::not_caught_because`](crate::RunReport::not_caught_because));
//! a run whose mode makes no safety claim under its fault is
//! **reported**, not judged.
//!
//! A run without a lock ([`Lock::none`](crate::Lock::none): the database
//! alone keeps the write right) has every caller writing at once, so it
//! is exercised whenever it wrote.
//!
//! The errors returned to the callers are a second judgement, apart from
//! this one ([`CallerErrors`](crate::CallerErrors)).

use std::fmt;

use serde::{Serialize, Serializer};

/// The share of its runs in which a control row must show a violation:
/// 90%.
pub const CONTROL_CATCH_PERCENT: u64 = 90;

/// What the negative control of a run (or of a matrix cell: the control
/// rows under the same fault) showed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ControlVerdict {
    /// No control ran ([`NegativeControl::Off`](crate::NegativeControl::Off),
    /// a run that is a control itself, a history checked alone, a matrix
    /// cell under a fault no control runs under): the verdict cannot say
    /// whether the run could catch a broken write path.
    NotRun,
    /// The control broke an invariant (`violations` times): this fault and
    /// these settings can show a broken write path.
    Caught {
        /// How many violations the control's check found.
        violations: usize,
    },
    /// The control broke nothing in `writes` writes: this run could not
    /// have caught a broken write path.
    CaughtNothing {
        /// How many writes the control made.
        writes: u64,
    },
}

/// What a run, or a row of runs, showed (see the [module docs](self)).
///
/// Its [`Display`](fmt::Display) is the sentence the harness's summary
/// and the matrix's table print; in JSON it is its
/// [`name`](Self::name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// The lock broke and the write path absorbed every double holder.
    Held {
        /// How many times two callers held the lock at once (0 for a run
        /// without a lock).
        double_holders: u64,
        /// Whether a negative control was caught under the same fault and
        /// settings; false when none ran.
        control_caught: bool,
    },
    /// No two callers held the lock at once: nothing was exercised.
    NeverBroke,
    /// Double holders and no violation, but the negative control caught
    /// nothing.
    Inconclusive {
        /// How many times two callers held the lock at once.
        double_holders: u64,
    },
    /// An invariant was broken.
    Broken {
        /// How many violations.
        violations: u64,
    },
    /// A negative control that broke an invariant, as it should.
    ControlCaught {
        /// How many violations.
        violations: u64,
    },
    /// A negative control that broke nothing (in a matrix row: in fewer
    /// than [`CONTROL_CATCH_PERCENT`]% of its runs).
    ControlMissed,
    /// A mode that makes no safety claim under its fault: what it showed
    /// is reported, not judged.
    Reported {
        /// How many violations.
        violations: u64,
    },
}

impl Verdict {
    /// False for the failures: [`Broken`](Self::Broken),
    /// [`Inconclusive`](Self::Inconclusive) and
    /// [`ControlMissed`](Self::ControlMissed). [`NeverBroke`](Self::NeverBroke)
    /// passes (it is not a failure), though it proves nothing about the
    /// check.
    #[must_use]
    pub fn passes(self) -> bool {
        !matches!(
            self,
            Verdict::Broken { .. } | Verdict::Inconclusive { .. } | Verdict::ControlMissed
        )
    }

    /// The verdict's name, as in JSON: `held`, `held_no_control`,
    /// `never_broke`, `inconclusive`, `broken`, `control_caught`,
    /// `control_missed` or `reported`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Held {
                control_caught: true,
                ..
            } => "held",
            Verdict::Held { .. } => "held_no_control",
            Verdict::NeverBroke => "never_broke",
            Verdict::Inconclusive { .. } => "inconclusive",
            Verdict::Broken { .. } => "broken",
            Verdict::ControlCaught { .. } => "control_caught",
            Verdict::ControlMissed => "control_missed",
            Verdict::Reported { .. } => "reported",
        }
    }

    /// The verdict on runs with these totals, given what their negative
    /// control showed: the one place the rules of the [module docs](self)
    /// are written.
    pub(crate) fn judge(runs: &Runs, control: &ControlVerdict) -> Verdict {
        if runs.control {
            let caught = runs.runs > 0
                && runs.runs_with_violation * 100 >= runs.runs * CONTROL_CATCH_PERCENT;
            return if caught {
                Verdict::ControlCaught {
                    violations: runs.violations,
                }
            } else {
                Verdict::ControlMissed
            };
        }
        if runs.reported_only {
            return Verdict::Reported {
                violations: runs.violations,
            };
        }
        if runs.violations > 0 {
            return Verdict::Broken {
                violations: runs.violations,
            };
        }
        if !runs.exercised {
            return Verdict::NeverBroke;
        }
        let double_holders = runs.double_holders;
        match control {
            ControlVerdict::Caught { .. } => Verdict::Held {
                double_holders,
                control_caught: true,
            },
            ControlVerdict::NotRun => Verdict::Held {
                double_holders,
                control_caught: false,
            },
            ControlVerdict::CaughtNothing { .. } => Verdict::Inconclusive { double_holders },
        }
    }
}

/// What [`Verdict::judge`] reads of one run or a row of runs.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Runs {
    /// The runs are a negative control.
    pub(crate) control: bool,
    /// Their mode makes no safety claim under their fault.
    pub(crate) reported_only: bool,
    pub(crate) runs: u64,
    pub(crate) runs_with_violation: u64,
    pub(crate) violations: u64,
    pub(crate) double_holders: u64,
    /// Some run met the lock failing: a double holder, or writes without
    /// any lock.
    pub(crate) exercised: bool,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let control = |caught: bool| {
            if caught {
                "the control caught"
            } else {
                "no control ran"
            }
        };
        match *self {
            Verdict::Held {
                double_holders: 0,
                control_caught,
            } => write!(
                f,
                "held: no lock, every write met the others; {}",
                control(control_caught)
            ),
            Verdict::Held {
                double_holders,
                control_caught,
            } => write!(
                f,
                "held: {double_holders} double holders absorbed; {}",
                control(control_caught)
            ),
            Verdict::NeverBroke => f.write_str("never broke: no double holder, nothing exercised"),
            Verdict::Inconclusive { double_holders } => write!(
                f,
                "INCONCLUSIVE: {double_holders} double holders, but the control caught nothing"
            ),
            Verdict::Broken { violations } => write!(f, "BROKEN: {violations} violations"),
            Verdict::ControlCaught { violations } => {
                write!(f, "control caught: {violations} violations")
            }
            Verdict::ControlMissed => {
                f.write_str("FAILED: control missed (its writes broke no invariant: the checker, the fault, or something still checking in the path)")
            }
            Verdict::Reported { violations } => {
                write!(f, "reported: {violations} violations (no safety claim)")
            }
        }
    }
}

impl Serialize for Verdict {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}
