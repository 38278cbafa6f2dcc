//! Fault windows marked from outside the run, judged like the nemesis's
//! own.
//!
//! A fault you inject with your own tooling (a `CLIENT PAUSE 1500 ALL`, a
//! `kill -STOP` of an etcd member, a network cut) happens outside the
//! run, which cannot see it. Unless it is told, the run's checks do not
//! know when the fault was active: a negative control under it is judged
//! as under no fault (the blind mode only *reported*), and the errors
//! judgement ([`CallerErrors`](crate::CallerErrors)) cannot tell a fault
//! shorter than the callers' wait from one longer than it.
//!
//! So the injector marks its windows, as [`MarkedWindow`]s (from Rust)
//! or as lines appended to a file (from a shell, [`parse_marks`]):
//!
//! ```text
//! 1765097812345 start redis-stall
//! 1765097813901 end redis-stall
//! ```
//!
//! and [`mark_history`] turns them into the run's own
//! [`Kind::FaultStart`] / [`Kind::FaultEnd`] events (actor `marks`,
//! target `outside`), so the checker judges them as it judges the
//! nemesis's windows, and renames the run after them: its header's fault
//! `none` becomes the marked names (joined by `+`, in the order they
//! started; a run with a fault of its own keeps it first), so its row is
//! named by the marked fault. A mark named after one of the faults the
//! nemesis knows ([`Fault`](crate::Fault)'s names: `redis-stall` for
//! `CLIENT PAUSE ALL`, `etcd-member-pause` for a stopped etcd member,
//! `net-cut`, `key-loss` for your own `DEL` of the lock keys) is judged as
//! that fault (whether it breaks the lock, whether Redis keeps answering
//! through it); any other name is a fault of unknown effect (a control
//! under it is reported, not judged, and the refresh errors are not
//! judged under it).
//!
//! # The file's lines
//!
//! `<unix-ms> start <name>` or `<unix-ms> end <name>`: the wall-clock
//! time in milliseconds since the Unix epoch (`date +%s%3N`), the edge,
//! and the fault's name (no spaces). Blank lines and lines starting with
//! `#` are skipped. Lines may come in any order (two injectors appending
//! to one file): they are taken by time. Then:
//!
//! - **nested or overlapping marks of one name** are one window, their
//!   union (the fault is on while any of its marks is open);
//! - **a start with no end** is a window open at the end of the file: in
//!   a run, it ends at the end of the history (the run's end), and its
//!   target says `outside, no end mark: cut at the run's end`;
//! - **a window that began before the run** starts at the run's start
//!   (target `outside, began before the run`);
//! - **a window wholly outside the run** (ended before it started, or
//!   started after it ended) is not the run's: it is left out and
//!   counted ([`Marked::outside`]); a matrix of many runs reads one file
//!   and each run takes the windows that fall in it;
//! - **an end with no open start** of its name is an error naming its
//!   line ([`MarksError::EndWithoutStart`]), as is a line that is not of
//!   the form above ([`MarksError::Malformed`]), or a time that is not in
//!   milliseconds (before 2001 or after year 5000: seconds or
//!   microseconds). Never a panic, and the history is left as it was: the
//!   run's events are all kept, the file can be fixed and the saved
//!   history re-checked (`leasehold chaos check HISTORY --fault-marks
//!   FILE`).
//!
//! Cutting a window at the run's start or end never wrongs the errors
//! judgement: the callers' calls all start within the run, so none of
//! them meets more of the fault than the part inside the run.
//!
//! # Clocks
//!
//! The marks are on the wall clock (the injector is another process),
//! the history on the run's clock: microseconds since the run started.
//! The run records where its clock stands on the wall clock
//! ([`Kind::WallClock`], at its start), and a mark at wall-clock time `t`
//! is placed at `t - start`. The history's own timestamps are taken from
//! the same system clock against the same start (see
//! [`Recorder`](crate::Recorder)), so on one machine the two agree to
//! within the marks' resolution (1 ms) plus how late the injector wrote
//! the mark after (or early before) the fault's own edge: a shell's
//! `date` before `redis-cli` is a few milliseconds early, which widens
//! the window (the safe side for the errors judgement, which asks
//! whether a window was shorter than the wait). A step of the wall clock
//! during the run moves marks and events alike. An injector on another
//! machine adds the offset between the two clocks (NTP keeps it to a
//! few milliseconds on a LAN); write the marks on the run's machine when
//! the windows' edges matter to that precision.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::harness::RunReport;
use crate::history::{Event, Kind};

/// The actor of the fault events placed from marks.
pub const MARKS_ACTOR: &str = "marks";

/// The target of a marked window placed whole.
const OUTSIDE: &str = "outside";

/// Marks before this are not in milliseconds (2001-09-09 in ms; 1e12
/// seconds or microseconds would be far off).
const MIN_UNIX_MS: u64 = 1_000_000_000_000;

/// Marks after this are not in milliseconds (the year 5138 in ms; a
/// microsecond timestamp of today is above it).
const MAX_UNIX_MS: u64 = 100_000_000_000_000;

/// One fault window marked from outside the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MarkedWindow {
    /// The fault's name: one of [`Fault`](crate::Fault)'s to be judged as
    /// that fault, any other for a fault of unknown effect.
    pub name: String,
    /// When it started, on the wall clock.
    pub start: SystemTime,
    /// When it ended, on the wall clock; `None` while it is still on (it
    /// then ends at the run's end).
    pub end: Option<SystemTime>,
}

impl MarkedWindow {
    /// The window `name` from `start` to `end`.
    pub fn new(name: impl Into<String>, start: SystemTime, end: SystemTime) -> MarkedWindow {
        MarkedWindow {
            name: name.into(),
            start,
            end: Some(end),
        }
    }

    /// The window `name` from `start`, still on.
    pub fn open(name: impl Into<String>, start: SystemTime) -> MarkedWindow {
        MarkedWindow {
            name: name.into(),
            start,
            end: None,
        }
    }
}

/// A mark's edge: the fault starts or ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Edge {
    /// The fault starts.
    Start,
    /// The fault ends.
    End,
}

impl Edge {
    /// `start` or `end`, as in the file.
    pub const fn name(self) -> &'static str {
        match self {
            Edge::Start => "start",
            Edge::End => "end",
        }
    }
}

impl fmt::Display for Edge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why fault marks could not be read or placed in a history.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MarksError {
    /// The marks file could not be read.
    #[error("cannot read fault marks {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A line is not `<unix-ms> start|end <name>`.
    #[error("fault marks line {line} is not `<unix-ms> start|end <name>`: {reason}")]
    Malformed {
        /// The 1-based line number.
        line: usize,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// An end mark with no open start of its name before it.
    #[error("fault marks line {line} ends {name:?}, which no earlier mark started")]
    EndWithoutStart {
        /// The 1-based line number.
        line: usize,
        /// The fault's name.
        name: String,
    },
    /// A fault name that cannot go in a mark (empty, or with spaces).
    #[error("a fault mark's name must be one word without spaces")]
    BadName,
    /// The history does not say where its clock stands on the wall clock
    /// (no [`Kind::WallClock`]: a history of an older version).
    #[error("the history does not say when the run started on the wall clock")]
    NoWallClock,
    /// The history already holds marked windows (events of actor
    /// [`MARKS_ACTOR`]): placing marks twice would double them.
    #[error("the history already holds marked fault windows")]
    AlreadyMarked,
}

/// One marked window as placed in a run's history.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PlacedWindow {
    /// The fault's name.
    pub name: String,
    /// Its start, in microseconds since the run started.
    pub from_us: u64,
    /// Its end, in microseconds since the run started.
    pub to_us: u64,
    /// It began before the run: cut at the run's start.
    pub began_before: bool,
    /// It had no end mark, or ended after the run: cut at the run's end.
    pub cut_at_end: bool,
}

impl PlacedWindow {
    /// The target of its events: `outside`, with what was cut.
    fn target(&self) -> String {
        let mut target = OUTSIDE.to_owned();
        if self.began_before {
            target.push_str(", began before the run");
        }
        if self.cut_at_end {
            target.push_str(", no end mark: cut at the run's end");
        }
        target
    }
}

/// `redis-stall from 1.234 s to 1.790 s`, and what was cut.
impl fmt::Display for PlacedWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = |us: u64| us as f64 / 1e6;
        write!(
            f,
            "{} from {:.3} s to {:.3} s",
            self.name,
            s(self.from_us),
            s(self.to_us)
        )?;
        if self.began_before {
            f.write_str(" (began before the run: cut at its start)")?;
        }
        if self.cut_at_end {
            f.write_str(" (no end mark within the run: cut at its end)")?;
        }
        Ok(())
    }
}

/// What [`mark_history`] placed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Marked {
    /// The windows placed in the run, by start.
    pub windows: Vec<PlacedWindow>,
    /// The windows left out: wholly before or after the run.
    pub outside: usize,
}

/// The [`Kind::WallClock`] event of a run that started at `start` on the
/// wall clock, to record at `at_us` 0.
pub fn wall_clock(start: SystemTime) -> Kind {
    Kind::WallClock {
        unix_us: crate::recorder::start_to_micros(start),
    }
}

/// The mark line `<unix-ms> <edge> <name>` for `at`, newline included:
/// what `leasehold chaos mark` appends.
///
/// # Errors
/// [`MarksError::BadName`] for an empty name or one with whitespace.
pub fn mark_line(edge: Edge, name: &str, at: SystemTime) -> Result<String, MarksError> {
    if name.is_empty() || name.chars().any(char::is_whitespace) {
        return Err(MarksError::BadName);
    }
    let ms = at
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    Ok(format!("{ms} {edge} {name}\n"))
}

/// Reads a marks file (see the [module docs](self) for its lines).
///
/// # Errors
/// [`MarksError::Read`] when the file cannot be read, and as
/// [`parse_marks`].
pub fn read_marks(path: &Path) -> Result<Vec<MarkedWindow>, MarksError> {
    let text = std::fs::read_to_string(path).map_err(|source| MarksError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse_marks(&text)
}

/// The windows of a marks file's text, by start (see the [module
/// docs](self)).
///
/// # Errors
/// [`MarksError::Malformed`] naming the first line that is not a mark,
/// [`MarksError::EndWithoutStart`] naming an end no start opened.
pub fn parse_marks(text: &str) -> Result<Vec<MarkedWindow>, MarksError> {
    let mut marks = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        marks.push(parse_line(index + 1, trimmed)?);
    }
    // By time; the file's order among equal times.
    marks.sort_by_key(|mark: &Mark| mark.unix_ms);
    let mut windows: Vec<MarkedWindow> = Vec::new();
    // Per name: the open window's index and how many marks hold it open.
    let mut open: Vec<(String, usize, u32)> = Vec::new();
    for mark in marks {
        let at = UNIX_EPOCH + Duration::from_millis(mark.unix_ms);
        let held = open.iter().position(|(name, _, _)| *name == mark.name);
        match (mark.edge, held) {
            (Edge::Start, Some(i)) => open[i].2 += 1,
            (Edge::Start, None) => {
                open.push((mark.name.clone(), windows.len(), 1));
                windows.push(MarkedWindow::open(mark.name, at));
            }
            (Edge::End, Some(i)) => {
                open[i].2 -= 1;
                if open[i].2 == 0 {
                    let (_, window, _) = open.remove(i);
                    windows[window].end = Some(at);
                }
            }
            (Edge::End, None) => {
                return Err(MarksError::EndWithoutStart {
                    line: mark.line,
                    name: mark.name,
                });
            }
        }
    }
    Ok(windows)
}

/// One line of a marks file.
struct Mark {
    line: usize,
    unix_ms: u64,
    edge: Edge,
    name: String,
}

fn parse_line(line: usize, text: &str) -> Result<Mark, MarksError> {
    let malformed = |reason| MarksError::Malformed { line, reason };
    let mut words = text.split_whitespace();
    let (Some(time), Some(edge), Some(name)) = (words.next(), words.next(), words.next()) else {
        return Err(malformed("too few words"));
    };
    if words.next().is_some() {
        return Err(malformed("more than three words"));
    }
    let unix_ms: u64 = time
        .parse()
        .map_err(|_| malformed("the time is not a whole number of milliseconds"))?;
    if !(MIN_UNIX_MS..MAX_UNIX_MS).contains(&unix_ms) {
        return Err(malformed(
            "the time is not milliseconds since the Unix epoch (seconds or microseconds?)",
        ));
    }
    let edge = match edge {
        "start" => Edge::Start,
        "end" => Edge::End,
        _ => return Err(malformed("the second word is neither start nor end")),
    };
    Ok(Mark {
        line,
        unix_ms,
        edge,
        name: name.to_owned(),
    })
}

/// Places `windows` in a run's history (in any order; sorted by time on
/// return) as its own fault windows, and renames the run after them (see
/// the [module docs](self)). The history's end is its last event.
/// Windows wholly outside the run are left out and counted.
///
/// Nothing is changed on an error.
///
/// # Errors
/// [`MarksError::NoWallClock`] when the history has no
/// [`Kind::WallClock`], [`MarksError::AlreadyMarked`] when it already
/// holds marked windows.
pub fn mark_history(
    events: &mut Vec<Event>,
    windows: &[MarkedWindow],
) -> Result<Marked, MarksError> {
    let (clock_at_us, clock_unix_us) = events
        .iter()
        .find_map(|e| match e.kind {
            Kind::WallClock { unix_us } => Some((e.at_us, unix_us)),
            _ => None,
        })
        .ok_or(MarksError::NoWallClock)?;
    if events.iter().any(|e| e.actor == MARKS_ACTOR) {
        return Err(MarksError::AlreadyMarked);
    }
    let end_us = events.iter().map(|e| e.at_us).max().unwrap_or(0);
    // A wall-clock time on the run's clock (negative before its start).
    let place = |at: SystemTime| -> i128 {
        let unix_us = at
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i128::try_from(d.as_micros()).unwrap_or(i128::MAX));
        unix_us - i128::from(clock_unix_us) + i128::from(clock_at_us)
    };
    let mut marked = Marked::default();
    for window in windows {
        let from = place(window.start);
        let to = window.end.map(place);
        if from > i128::from(end_us) || to.is_some_and(|to| to < 0) {
            marked.outside += 1;
            continue;
        }
        let to_us = to.map_or(end_us, |to| {
            u64::try_from(to).unwrap_or(u64::MAX).min(end_us)
        });
        marked.windows.push(PlacedWindow {
            name: window.name.clone(),
            from_us: u64::try_from(from).unwrap_or(0),
            to_us,
            began_before: from < 0,
            cut_at_end: to.is_none_or(|to| to > i128::from(end_us)),
        });
    }
    marked.windows.sort_by_key(|w| w.from_us);
    for window in &marked.windows {
        let (fault, target) = (window.name.clone(), window.target());
        events.push(Event {
            at_us: window.from_us,
            actor: MARKS_ACTOR.to_owned(),
            kind: Kind::FaultStart {
                fault: fault.clone(),
                target: target.clone(),
            },
        });
        events.push(Event {
            at_us: window.to_us,
            actor: MARKS_ACTOR.to_owned(),
            kind: Kind::FaultEnd { fault, target },
        });
    }
    rename(events, &marked.windows);
    events.sort_by_key(|e| e.at_us);
    Ok(marked)
}

/// The header's fault after the marked names: `none` becomes them, any
/// other keeps its place first.
fn rename(events: &mut [Event], windows: &[PlacedWindow]) {
    let mut names: Vec<&str> = Vec::new();
    for window in windows {
        if !names.contains(&window.name.as_str()) {
            names.push(&window.name);
        }
    }
    if names.is_empty() {
        return;
    }
    for event in events {
        if let Kind::Run { fault, .. } = &mut event.kind {
            let marked = names.join("+");
            *fault = if fault == "none" {
                marked
            } else {
                format!("{fault}+{marked}")
            };
        }
    }
}

impl RunReport {
    /// This report with `windows`, faults you injected from outside the
    /// run, placed in its history as its own fault windows and checked
    /// again (see the [`marks`](mod@crate::marks) module): the errors
    /// returned to the callers are judged against them, and the run is
    /// named after them. The negative control's report, if any, gets the
    /// windows that fall in its own run (it runs first: inject your fault
    /// through it too, or it will have caught nothing under it).
    ///
    /// ```no_run
    /// # use std::time::SystemTime;
    /// # use leasehold_chaos::{MarkedWindow, RunReport};
    /// # fn demo(report: RunReport, paused: SystemTime, resumed: SystemTime)
    /// # -> Result<(), leasehold_chaos::MarksError> {
    /// let report =
    ///     report.with_fault_marks(&[MarkedWindow::new("redis-stall", paused, resumed)])?;
    /// assert!(report.check.errors.holds(), "{report}");
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`mark_history`] (the report is consumed; a history without a
    /// wall clock is one recorded by an older version).
    pub fn with_fault_marks(self, windows: &[MarkedWindow]) -> Result<RunReport, MarksError> {
        let mut events = self.events;
        mark_history(&mut events, windows)?;
        let mut report = RunReport::new(events);
        report.control = self.control;
        report.control_report = match self.control_report {
            Some(control) => Some(Box::new(control.with_fault_marks(windows)?)),
            None => None,
        };
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::check;

    const T0_MS: u64 = 1_765_000_000_000;

    fn at(ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(T0_MS + ms)
    }

    fn event(at_us: u64, actor: &str, kind: Kind) -> Event {
        Event {
            at_us,
            actor: actor.to_owned(),
            kind,
        }
    }

    /// A cas run of 3 s under no fault of its own, with a 2 s wait, one
    /// acquire error returned at 1.2 s; the run started at `T0_MS`.
    fn history() -> Vec<Event> {
        vec![
            event(
                0,
                "coordinator",
                Kind::Run {
                    mode: "cas".into(),
                    fault: "none".into(),
                    seed: 1,
                    ttl_ms: 100,
                    control: false,
                    reported_only: false,
                    initial: vec![("wallet:1".into(), 100)],
                },
            ),
            event(0, "coordinator", Kind::Budget { wait_ms: 2000 }),
            event(
                0,
                "coordinator",
                Kind::WallClock {
                    unix_us: T0_MS * 1000,
                },
            ),
            event(
                1_200_000,
                "w0.t0",
                Kind::CallerError {
                    call: "acquire".into(),
                    key: "lock:{wallet:1}".into(),
                    error: "unreachable".into(),
                    detail: "redis unreachable".into(),
                },
            ),
            event(
                3_000_000,
                "checker",
                Kind::Final {
                    resource: "wallet:1".into(),
                    balance: 100,
                    ledger_sum: 0,
                    ledger_rows: 0,
                },
            ),
        ]
    }

    /// The same history with the nemesis's own window instead.
    fn with_own_window(fault: &str, from_us: u64, to_us: u64) -> Vec<Event> {
        let mut events = history();
        for event in &mut events {
            if let Kind::Run { fault: f, .. } = &mut event.kind {
                *f = fault.to_owned();
            }
        }
        let (fault, target) = (fault.to_owned(), "redis".to_owned());
        events.push(event(
            from_us,
            "nemesis",
            Kind::FaultStart {
                fault: fault.clone(),
                target: target.clone(),
            },
        ));
        events.push(event(to_us, "nemesis", Kind::FaultEnd { fault, target }));
        events
    }

    #[test]
    fn an_error_in_a_marked_window_shorter_than_the_wait_is_judged_as_in_an_own_one() {
        let mut events = history();
        let marked = mark_history(
            &mut events,
            &[MarkedWindow::new("redis-stall", at(1_000), at(1_500))],
        )
        .expect("marked");
        assert_eq!(marked.outside, 0);
        assert_eq!(
            (marked.windows[0].from_us, marked.windows[0].to_us),
            (1_000_000, 1_500_000)
        );
        let check = check(&events);
        let own = crate::check::check(&with_own_window("redis-stall", 1_000_000, 1_500_000));
        assert_eq!(check.errors, own.errors);
        assert!(check.errors.judged && !check.errors.holds(), "{check:?}");
        assert_eq!(
            check.header.as_ref().map(|h| h.fault.as_str()),
            Some("redis-stall")
        );
        assert_eq!(check.recovery.len(), 1, "{:?}", check.recovery);
    }

    #[test]
    fn a_marked_window_longer_than_the_wait_leaves_the_errors_unjudged_as_an_own_one() {
        let mut events = history();
        mark_history(
            &mut events,
            &[MarkedWindow::new("my-pause", at(500), at(2_600))],
        )
        .expect("marked");
        let check = check(&events);
        let own = crate::check::check(&with_own_window("my-pause", 500_000, 2_600_000));
        assert_eq!(check.errors, own.errors);
        assert!(!check.errors.judged && check.errors.holds(), "{check:?}");
    }

    #[test]
    fn an_error_outside_every_window_still_counts() {
        let mut events = history();
        mark_history(
            &mut events,
            &[MarkedWindow::new("redis-stall", at(2_000), at(2_300))],
        )
        .expect("marked");
        let check = check(&events);
        assert_eq!(check.errors.acquire, 1);
        assert!(check.errors.judged && !check.errors.holds(), "{check:?}");
    }

    #[test]
    fn open_early_and_outside_windows_are_cut_or_left_out() {
        let mut events = history();
        let marked = mark_history(
            &mut events,
            &[
                MarkedWindow::new("key-loss", at(0) - Duration::from_secs(1), at(300)),
                MarkedWindow::open("redis-stall", at(2_500)),
                MarkedWindow::new(
                    "net-cut",
                    at(0) - Duration::from_secs(9),
                    at(0) - Duration::from_secs(8),
                ),
                MarkedWindow::open("net-cut", at(4_000)),
            ],
        )
        .expect("marked");
        assert_eq!(marked.outside, 2);
        let [early, open] = &marked.windows[..] else {
            panic!("{marked:?}");
        };
        assert!(
            early.began_before && !early.cut_at_end && early.from_us == 0,
            "{early:?}"
        );
        assert!(open.cut_at_end && open.to_us == 3_000_000, "{open:?}");
        assert!(open.to_string().contains("cut at its end"), "{open}");
        let check = check(&events);
        let header = check.header.expect("a header");
        assert_eq!(header.fault, "key-loss+redis-stall");
        assert!(
            events.iter().any(|e| matches!(&e.kind,
                Kind::FaultEnd { target, .. } if target == "outside, no end mark: cut at the run's end")),
            "{events:?}"
        );
        assert!(matches!(
            mark_history(&mut events, &[]),
            Err(MarksError::AlreadyMarked)
        ));
    }

    #[test]
    fn a_history_without_a_wall_clock_is_refused_unchanged() {
        let mut events = history();
        events.retain(|e| !matches!(e.kind, Kind::WallClock { .. }));
        let before = events.clone();
        let err = mark_history(&mut events, &[MarkedWindow::open("x", at(1))]);
        assert!(matches!(err, Err(MarksError::NoWallClock)), "{err:?}");
        assert_eq!(events, before);
    }

    #[test]
    fn lines_are_taken_by_time_and_overlapping_marks_of_one_name_are_their_union() {
        // Out of file order, one mark nested in another, a window still on.
        let text = format!(
            "# injector\n{} start redis-stall\n\n{} end redis-stall\n{} start redis-stall\n{} end redis-stall\n{} start redis-stall\n{} end redis-stall\n{} start net-cut\n",
            T0_MS + 100,
            T0_MS + 900,
            T0_MS + 400,
            T0_MS + 500,
            T0_MS + 1_000,
            T0_MS + 1_200,
            T0_MS + 1_100,
        );
        assert_eq!(
            parse_marks(&text).expect("marks"),
            [
                MarkedWindow::new("redis-stall", at(100), at(900)),
                MarkedWindow::new("redis-stall", at(1_000), at(1_200)),
                MarkedWindow::open("net-cut", at(1_100)),
            ]
        );
    }

    #[test]
    fn a_malformed_line_or_an_end_without_start_is_named() {
        let cases = [
            (format!("{T0_MS} start a\n{T0_MS} begin a\n"), 2),
            (format!("\n\n{T0_MS} start\n"), 3),
            ("1765000000 start a\n".to_owned(), 1),
            (format!("{T0_MS} start a b\n"), 1),
            (format!("{T0_MS}.5 start a\n"), 1),
        ];
        for (text, line) in cases {
            match parse_marks(&text) {
                Err(MarksError::Malformed { line: l, .. }) => assert_eq!(l, line, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
        let text = format!("{} start a\n{} end b\n", T0_MS, T0_MS + 1);
        let err = parse_marks(&text).expect_err("an end without start");
        assert!(
            matches!(err, MarksError::EndWithoutStart { line: 2, .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("line 2"), "{err}");
    }

    #[test]
    fn a_mark_line_reads_back() {
        let mut text = mark_line(Edge::Start, "redis-stall", at(5)).expect("a line");
        text.push_str(&mark_line(Edge::End, "redis-stall", at(7)).expect("a line"));
        assert_eq!(
            parse_marks(&text).expect("marks"),
            [MarkedWindow::new("redis-stall", at(5), at(7))]
        );
        assert!(matches!(
            mark_line(Edge::Start, "two words", at(0)),
            Err(MarksError::BadName)
        ));
    }
}
