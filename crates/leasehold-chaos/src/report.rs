//! The fault matrix: many [`RunCheck`]s folded into one row per lock mode
//! and fault, a text table, JSON rows, and the verdict.
//!
//! Each row's status is a [`Verdict`], as for one run of the harness (the
//! [`verdicts`](mod@crate::verdicts) module): a row of a safe mode *held* when
//! its runs had double holders and no violation, and the control rows under
//! the same fault were caught (*held, no control ran* when the matrix has
//! none under that fault); it *never broke* when no run had a double
//! holder (nothing exercised: not a failure); it is *inconclusive* when the
//! control under its fault missed, and *broken* on any violation. A
//! *negative control* row (a mode expected to break under its fault, e.g. a
//! lock with no database check under a process pause) holds the other way
//! round: it must show a violation in at least [`CONTROL_CATCH_PERCENT`]%
//! of its runs. A control that comes out clean does not mean the mode is
//! safe; it means the fault did not bite or the checker did not look, and
//! then the clean rows prove nothing either. So a missed control fails the
//! matrix.
//!
//! Recovery times are reported but do not enter the verdict: how fast is
//! fast enough depends on the TTL and the fault.
//!
//! The errors returned to the callers are a second judgement, next to
//! safety, for every row (controls too: the lock is the same library):
//! a row fails it when a run judged for errors returned one (see
//! [`mod@crate::check`] for what counts and when a run is judged).

use std::fmt;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::check::{RunCheck, check};
use crate::history::{Event, HistoryError, read_jsonl};
pub use crate::verdicts::CONTROL_CATCH_PERCENT;
use crate::verdicts::{ControlVerdict, Runs, Verdict};

/// What stands in for the mode and fault of a run without a header.
const UNKNOWN: &str = "?";

/// One mode under one fault, over all its runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Row {
    /// The lock mode (`?` for runs without a header).
    pub mode: String,
    /// The fault (`?` for runs without a header).
    pub fault: String,
    /// True for a negative-control row.
    pub control: bool,
    /// True for a row whose mode makes no safety claim under its fault:
    /// violations are reported, not judged.
    pub reported_only: bool,
    /// How many runs.
    pub runs: u64,
    /// Acquires and writes, over all runs.
    pub operations: u64,
    /// Accepted writes.
    pub accepted: u64,
    /// Writes the database refused as stale: each one a lease failure the
    /// database absorbed.
    pub refused_stale: u64,
    /// Writes of unknown outcome.
    pub unknown: u64,
    /// Violations, over all runs.
    pub violations: u64,
    /// Runs with at least one violation.
    pub runs_with_violation: u64,
    /// Double-holder overlaps, over all runs.
    pub overlaps: u64,
    /// Faults whose recovery was measured (see [`mod@crate::check`]).
    pub recoveries: u64,
    /// Of those, the ones that never recovered within their run.
    pub unrecovered: u64,
    /// The longest recovery, in microseconds.
    pub max_recovery_us: Option<u64>,
    /// The median recovery (the lower median for an even count), in
    /// microseconds.
    pub median_recovery_us: Option<u64>,
    /// Acquires that returned an error other than `NotAcquired`.
    pub acquire_errors: u64,
    /// Releases that returned an error other than `NotHeld` / `LeaseLost`.
    pub release_errors: u64,
    /// Leases the watchdog gave up on because Redis did not answer.
    pub refresh_errors: u64,
    /// Runs whose errors were judged (every fault shorter than the wait).
    pub errors_judged: u64,
    /// Judged runs that returned a judged error.
    pub runs_with_errors: u64,
    /// The errors judgement.
    pub errors: ErrorsStatus,
    /// What the row showed (safety), given the control rows under its
    /// fault; in JSON its [`name`](Verdict::name).
    pub status: Verdict,
    /// Whether some run met the lock failing ([`RunCheck::exercised`]).
    #[serde(skip)]
    exercised: bool,
}

/// Whether a row's callers were returned no error they should not have
/// been.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorsStatus {
    /// Judged, and no judged error.
    Ok,
    /// A judged run returned a judged error.
    Failed,
    /// No run was judged (a fault as long as the wait, or no budget
    /// recorded).
    NotJudged,
}

impl fmt::Display for ErrorsStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorsStatus::Ok => "ok",
            ErrorsStatus::Failed => "FAILED",
            ErrorsStatus::NotJudged => "-",
        })
    }
}

impl Row {
    fn new(mode: &str, fault: &str, control: bool, reported_only: bool) -> Row {
        Row {
            mode: mode.to_owned(),
            fault: fault.to_owned(),
            control,
            reported_only,
            runs: 0,
            operations: 0,
            accepted: 0,
            refused_stale: 0,
            unknown: 0,
            violations: 0,
            runs_with_violation: 0,
            overlaps: 0,
            recoveries: 0,
            unrecovered: 0,
            max_recovery_us: None,
            median_recovery_us: None,
            acquire_errors: 0,
            release_errors: 0,
            refresh_errors: 0,
            errors_judged: 0,
            runs_with_errors: 0,
            errors: ErrorsStatus::NotJudged,
            status: Verdict::NeverBroke,
            exercised: false,
        }
    }

    fn add(&mut self, run: &RunCheck) {
        let writes = &run.counts.writes;
        self.runs += 1;
        self.operations += run.counts.operations();
        self.accepted += writes.accepted;
        self.refused_stale += writes.refused_stale;
        self.unknown += writes.unknown;
        self.violations += run.violations.len() as u64;
        self.runs_with_violation += u64::from(!run.holds());
        self.overlaps += run.overlaps.len() as u64;
        self.exercised |= run.exercised();
        self.acquire_errors += run.errors.acquire;
        self.release_errors += run.errors.release;
        self.refresh_errors += run.errors.refresh;
        self.errors_judged += u64::from(run.errors.judged);
        self.runs_with_errors += u64::from(!run.errors.holds());
    }

    fn settle(&mut self, recovered: &mut [u64]) {
        recovered.sort_unstable();
        self.max_recovery_us = recovered.last().copied();
        self.median_recovery_us = recovered
            .get(recovered.len().saturating_sub(1) / 2)
            .copied();
        self.errors = match (self.runs_with_errors, self.errors_judged) {
            (0, 0) => ErrorsStatus::NotJudged,
            (0, _) => ErrorsStatus::Ok,
            _ => ErrorsStatus::Failed,
        };
        self.status = Verdict::judge(&self.totals(), &ControlVerdict::NotRun);
    }

    /// What [`Verdict::judge`] reads of this row.
    fn totals(&self) -> Runs {
        Runs {
            control: self.control,
            reported_only: self.reported_only,
            runs: self.runs,
            runs_with_violation: self.runs_with_violation,
            violations: self.violations,
            double_holders: self.overlaps,
            exercised: self.exercised,
        }
    }

    /// Why the row fails, a sentence per failed judgement (safety, errors);
    /// `None` when it holds.
    #[must_use]
    pub fn failure(&self) -> Option<String> {
        let reasons: Vec<String> = [self.safety_failure(), self.errors_failure()]
            .into_iter()
            .flatten()
            .collect();
        (!reasons.is_empty()).then(|| reasons.join("; "))
    }

    fn errors_failure(&self) -> Option<String> {
        (self.errors == ErrorsStatus::Failed).then(|| {
            format!(
                "{} under {}: errors judgement failed: {} acquire, {} release, {} refresh errors \
                 returned to callers in {} of {} judged runs (every fault shorter than the wait)",
                self.mode,
                self.fault,
                self.acquire_errors,
                self.release_errors,
                self.refresh_errors,
                self.runs_with_errors,
                self.errors_judged
            )
        })
    }

    fn safety_failure(&self) -> Option<String> {
        let name = format!("{} under {}", self.mode, self.fault);
        match self.status {
            Verdict::Broken { .. } => Some(format!(
                "{name}: safety judgement failed: {} violations in {} of {} runs",
                self.violations, self.runs_with_violation, self.runs
            )),
            Verdict::ControlMissed => Some(format!(
                "{name} is a negative control but showed a violation in only {} of {} runs \
                 (needs {CONTROL_CATCH_PERCENT}%): the checker or the fault is not working, \
                 so the other rows prove nothing",
                self.runs_with_violation, self.runs
            )),
            Verdict::Inconclusive { double_holders } => Some(format!(
                "{name}: inconclusive: {double_holders} double holders and no violation, but \
                 the control under {} caught nothing, so these runs could not have caught a \
                 broken write path",
                self.fault
            )),
            _ => None,
        }
    }
}

/// What the control rows under `fault` showed, for the other rows under
/// it: [`ControlVerdict::Caught`] when every one was caught,
/// [`ControlVerdict::CaughtNothing`] when one missed,
/// [`ControlVerdict::NotRun`] when there is none.
#[must_use]
pub fn control_for(rows: &[Row], fault: &str) -> ControlVerdict {
    let controls: Vec<&Row> = rows
        .iter()
        .filter(|r| r.control && r.fault == fault)
        .collect();
    if controls.is_empty() {
        ControlVerdict::NotRun
    } else if controls
        .iter()
        .all(|r| matches!(r.status, Verdict::ControlCaught { .. }))
    {
        ControlVerdict::Caught {
            violations: controls.iter().map(|r| r.violations as usize).sum(),
        }
    } else {
        ControlVerdict::CaughtNothing {
            writes: controls.iter().map(|r| r.accepted).sum(),
        }
    }
}

/// Folds run checks into one row per mode, fault and control flag, in the
/// order each first appears.
#[must_use]
pub fn rows(checks: &[RunCheck]) -> Vec<Row> {
    let mut rows: Vec<(Row, Vec<u64>)> = Vec::new();
    for run in checks {
        let (mode, fault) = run
            .header
            .as_ref()
            .map_or((UNKNOWN, UNKNOWN), |h| (h.mode.as_str(), h.fault.as_str()));
        let (control, reported_only) = (run.is_control(), run.is_reported_only());
        let index = match rows.iter().position(|(r, _)| {
            r.mode == mode
                && r.fault == fault
                && r.control == control
                && r.reported_only == reported_only
        }) {
            Some(index) => index,
            None => {
                rows.push((Row::new(mode, fault, control, reported_only), Vec::new()));
                rows.len() - 1
            }
        };
        if let Some((row, recovered)) = rows.get_mut(index) {
            row.add(run);
            for recovery in run.recovery.iter().filter(|r| r.measurable) {
                row.recoveries += 1;
                match recovery.recovered_after_us {
                    Some(after) => recovered.push(after),
                    None => row.unrecovered += 1,
                }
            }
        }
    }
    let mut rows: Vec<Row> = rows
        .into_iter()
        .map(|(mut row, mut recovered)| {
            row.settle(&mut recovered);
            row
        })
        .collect();
    let controls: Vec<ControlVerdict> = rows.iter().map(|r| control_for(&rows, &r.fault)).collect();
    for (row, control) in rows.iter_mut().zip(controls) {
        row.status = Verdict::judge(&row.totals(), &control);
    }
    rows
}

/// The matrix's verdict: what `leasehold chaos` (and `chaos check`)
/// exit with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
#[non_exhaustive]
pub enum MatrixVerdict {
    /// Every row passes: no violation outside the controls, no
    /// inconclusive row, every control caught, and no judged error
    /// returned to a caller.
    Ok,
    /// Some row fails (or there is none).
    Failed {
        /// One sentence per failing row.
        reasons: Vec<String>,
    },
}

impl MatrixVerdict {
    /// True for [`MatrixVerdict::Ok`].
    #[must_use]
    pub fn is_ok(&self) -> bool {
        matches!(self, MatrixVerdict::Ok)
    }
}

impl fmt::Display for MatrixVerdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MatrixVerdict::Ok => f.write_str("OK"),
            MatrixVerdict::Failed { reasons } => write!(f, "FAILED: {}", reasons.join("; ")),
        }
    }
}

/// The verdict on `rows`: [`MatrixVerdict::Ok`] when every row's
/// [`Verdict`] passes ([`Verdict::passes`]: no violation outside the
/// controls, no inconclusive row, every control row caught in at least
/// [`CONTROL_CATCH_PERCENT`]% of its runs) and no row's errors judgement
/// failed. No rows at all is a failure (nothing was checked).
#[must_use]
pub fn verdict(rows: &[Row]) -> MatrixVerdict {
    if rows.is_empty() {
        return MatrixVerdict::Failed {
            reasons: vec!["no run was checked".to_owned()],
        };
    }
    let reasons: Vec<String> = rows.iter().filter_map(Row::failure).collect();
    if reasons.is_empty() {
        MatrixVerdict::Ok
    } else {
        MatrixVerdict::Failed { reasons }
    }
}

/// A duration in microseconds as milliseconds, for tables; `-` for none.
fn ms(us: Option<u64>) -> String {
    match us {
        None => "-".to_owned(),
        Some(us) if us < 10_000 => format!("{:.1}ms", us as f64 / 1000.0),
        Some(us) => format!("{}ms", us / 1000),
    }
}

/// The rows as a fixed-width text table with a header line, one line per
/// row, each ending in a newline.
#[must_use]
pub fn render_table(rows: &[Row]) -> String {
    let header = [
        "mode",
        "fault",
        "runs",
        "ops",
        "violations",
        "bad runs",
        "overlaps",
        "refused",
        "unknown",
        "rec max",
        "rec median",
        "unrec",
        "errors a/r/f",
        "errors",
        "status",
    ];
    let cells: Vec<[String; 15]> = rows
        .iter()
        .map(|r| {
            [
                if r.control {
                    format!("{} (control)", r.mode)
                } else {
                    r.mode.clone()
                },
                r.fault.clone(),
                r.runs.to_string(),
                r.operations.to_string(),
                r.violations.to_string(),
                r.runs_with_violation.to_string(),
                r.overlaps.to_string(),
                r.refused_stale.to_string(),
                r.unknown.to_string(),
                ms(r.max_recovery_us),
                ms(r.median_recovery_us),
                r.unrecovered.to_string(),
                format!(
                    "{}/{}/{}",
                    r.acquire_errors, r.release_errors, r.refresh_errors
                ),
                r.errors.to_string(),
                r.status.to_string(),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &cells {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: &[&str]| -> String {
        let mut out = String::new();
        for (i, (cell, width)) in cells.iter().zip(widths).enumerate() {
            let last = i + 1 == cells.len();
            if i > 0 {
                out.push_str("  ");
            }
            // Names are left-aligned, numbers right-aligned, the status
            // (last) unpadded.
            match i {
                _ if last => out.push_str(cell),
                0 | 1 => out.push_str(&format!("{cell:<width$}")),
                _ => out.push_str(&format!("{cell:>width$}")),
            }
        }
        out.push('\n');
        out
    };
    let mut out = line(&header);
    for row in &cells {
        let row: Vec<&str> = row.iter().map(String::as_str).collect();
        out.push_str(&line(&row));
    }
    out
}

/// The rows as JSON lines, one object per row (the fields of [`Row`]).
///
/// # Errors
/// A [`serde_json::Error`] if a row cannot be serialized (not expected:
/// rows hold only strings and numbers).
pub fn render_json_lines(rows: &[Row]) -> Result<String, serde_json::Error> {
    let mut out = String::new();
    for row in rows {
        out.push_str(&serde_json::to_string(row)?);
        out.push('\n');
    }
    Ok(out)
}

/// Why a history file could not be checked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FileError {
    /// The file could not be opened.
    #[error("cannot open history {}", path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file could not be read as a history.
    #[error("cannot read history {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: HistoryError,
    },
}

/// Reads a history file of JSON lines (see [`read_jsonl`]).
///
/// # Errors
/// [`FileError::Open`] when the file cannot be opened, [`FileError::Read`]
/// when reading fails or a line is not an event.
pub fn read_history(path: &Path) -> Result<Vec<Event>, FileError> {
    let file = File::open(path).map_err(|source| FileError::Open {
        path: path.to_owned(),
        source,
    })?;
    read_jsonl(BufReader::new(file)).map_err(|source| FileError::Read {
        path: path.to_owned(),
        source,
    })
}

/// Reads and checks a history file: `leasehold chaos check FILE`.
///
/// # Errors
/// As [`read_history`].
pub fn check_file(path: &Path) -> Result<RunCheck, FileError> {
    Ok(check(&read_history(path)?))
}
