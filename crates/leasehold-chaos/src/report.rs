//! The fault matrix: many [`RunCheck`]s folded into one row per lock mode
//! and fault, a text table, JSON rows, and the verdict.
//!
//! A row holds when none of its runs has a violation. A *negative control*
//! row (a mode expected to break under its fault, e.g. a lock with no
//! database check under a process pause) holds the other way round: it
//! must show a violation in at least [`CONTROL_CATCH_PERCENT`]% of its
//! runs. A control that comes out clean does not mean the mode is safe; it
//! means the fault did not bite or the checker did not look, and then the
//! clean rows prove nothing either. So a missed control fails the verdict.
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

/// The share of its runs in which a control row must show a violation:
/// 90%.
pub const CONTROL_CATCH_PERCENT: u64 = 90;

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
    /// Whether the row holds (safety).
    pub status: RowStatus,
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

/// Whether a row holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RowStatus {
    /// No run showed a violation.
    Ok,
    /// Some run showed a violation.
    Broken,
    /// A control row that showed a violation in enough of its runs: the
    /// checker and the fault work.
    ControlCaught,
    /// A control row that did not: the checker or the fault is not working.
    ControlMissed,
    /// A row whose mode makes no safety claim under its fault: what it
    /// showed is reported, not judged.
    Reported,
}

impl RowStatus {
    /// True for [`RowStatus::Ok`] and [`RowStatus::ControlCaught`].
    #[must_use]
    pub fn is_ok(self) -> bool {
        matches!(
            self,
            RowStatus::Ok | RowStatus::ControlCaught | RowStatus::Reported
        )
    }
}

impl fmt::Display for RowStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RowStatus::Ok => "ok",
            RowStatus::Broken => "BROKEN",
            RowStatus::ControlCaught => "ok (control caught)",
            RowStatus::ControlMissed => "FAILED (control missed: checker or fault not working)",
            RowStatus::Reported => "reported (no safety claim)",
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
            status: RowStatus::Ok,
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
        self.status = match (self.control, self.violations) {
            _ if self.reported_only && !self.control => RowStatus::Reported,
            (false, 0) => RowStatus::Ok,
            (false, _) => RowStatus::Broken,
            (true, _)
                if self.runs > 0
                    && self.runs_with_violation * 100 >= self.runs * CONTROL_CATCH_PERCENT =>
            {
                RowStatus::ControlCaught
            }
            (true, _) => RowStatus::ControlMissed,
        };
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
            RowStatus::Ok | RowStatus::ControlCaught | RowStatus::Reported => None,
            RowStatus::Broken => Some(format!(
                "{name}: safety judgement failed: {} violations in {} of {} runs",
                self.violations, self.runs_with_violation, self.runs
            )),
            RowStatus::ControlMissed => Some(format!(
                "{name} is a negative control but showed a violation in only {} of {} runs \
                 (needs {CONTROL_CATCH_PERCENT}%): the checker or the fault is not working, \
                 so the other rows prove nothing",
                self.runs_with_violation, self.runs
            )),
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
    rows.into_iter()
        .map(|(mut row, mut recovered)| {
            row.settle(&mut recovered);
            row
        })
        .collect()
}

/// The matrix's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Verdict {
    /// Every row holds: no violation outside the controls, and every control
    /// caught.
    Ok,
    /// Some row does not hold (or there is none).
    Failed {
        /// One sentence per failing row.
        reasons: Vec<String>,
    },
}

impl Verdict {
    /// True for [`Verdict::Ok`].
    #[must_use]
    pub fn is_ok(&self) -> bool {
        matches!(self, Verdict::Ok)
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Ok => f.write_str("OK"),
            Verdict::Failed { reasons } => write!(f, "FAILED: {}", reasons.join("; ")),
        }
    }
}

/// The verdict on `rows`: [`Verdict::Ok`] when every non-control row has no
/// violation and every control row showed a violation in at least
/// [`CONTROL_CATCH_PERCENT`]% of its runs. No rows at all is a failure
/// (nothing was checked).
#[must_use]
pub fn verdict(rows: &[Row]) -> Verdict {
    if rows.is_empty() {
        return Verdict::Failed {
            reasons: vec!["no run was checked".to_owned()],
        };
    }
    let reasons: Vec<String> = rows.iter().filter_map(Row::failure).collect();
    if reasons.is_empty() {
        Verdict::Ok
    } else {
        Verdict::Failed { reasons }
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
