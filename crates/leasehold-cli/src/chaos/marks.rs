//! `--fault-marks`: faults the user injects from outside, placed in each
//! run's history (the library's `marks` module) and the run's header
//! judged again under them, as a run of the matrix under those faults
//! would be.

use std::path::Path;

use clap::ValueEnum;
use leasehold_chaos::marks::{self, Edge, Marked, MarksError};
use leasehold_chaos::{Event, Fault, Kind};

use super::modes::Expect;
use crate::cli::{ChaosMode, MarkEdge};

/// Places the windows of the marks file `file` in `events` (a run's
/// history) and judges its header again under its faults: what the
/// matrix's run would have said, had it injected them itself.
///
/// # Errors
/// The file's [`MarksError`]; `events` are unchanged then.
pub(crate) fn apply(events: &mut Vec<Event>, file: &Path) -> Result<Marked, MarksError> {
    let windows = marks::read_marks(file)?;
    let marked = marks::mark_history(events, &windows)?;
    if !marked.windows.is_empty() {
        rejudge(events);
    }
    Ok(marked)
}

/// Sets the header's `control` and `reported_only` for its mode under its
/// faults (`+`-joined, as the marks name them): a control when the mode
/// breaks under one of them, reported when it may, judged otherwise. A
/// fault of unknown effect (a name that is not one of [`Fault::ALL`]'s)
/// counts as none: it is not known to break the lock. A header whose mode
/// is not one of the matrix's (a harness run's) is left as it is.
fn rejudge(events: &mut [Event]) {
    for event in events {
        let Kind::Run {
            mode,
            fault,
            control,
            reported_only,
            ..
        } = &mut event.kind
        else {
            continue;
        };
        let Ok(mode) = ChaosMode::from_str(mode, false) else {
            continue;
        };
        let expect = expect_under(mode, fault);
        *control = expect == Expect::Breaks;
        *reported_only = expect == Expect::MayBreak;
    }
}

/// What `mode` is expected to do under every fault of `faults`.
fn expect_under(mode: ChaosMode, faults: &str) -> Expect {
    let expects: Vec<Expect> = faults
        .split('+')
        .map(|name| mode.expect(name.parse::<Fault>().unwrap_or(Fault::None)))
        .collect();
    if expects.contains(&Expect::Breaks) {
        Expect::Breaks
    } else if expects.contains(&Expect::MayBreak) {
        Expect::MayBreak
    } else {
        Expect::Holds
    }
}

/// `chaos mark EDGE NAME --file FILE`: appends the mark, stamped now.
pub(crate) fn append(edge: MarkEdge, name: &str, file: &Path) -> anyhow::Result<()> {
    use anyhow::Context;
    use std::io::Write;
    let edge = match edge {
        MarkEdge::Start => Edge::Start,
        MarkEdge::End => Edge::End,
    };
    let line = marks::mark_line(edge, name, std::time::SystemTime::now())
        .map_err(|err| crate::exit::Usage(err.to_string()))?;
    // One write of a short line to a file opened for appending: lines of
    // injectors marking at once do not interleave.
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(file)
        .and_then(|mut out| out.write_all(line.as_bytes()))
        .with_context(|| format!("appending to {}", file.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_under_marked_faults_is_judged_as_under_the_faults() {
        assert!(expect_under(ChaosMode::Blind, "key-loss") == Expect::Breaks);
        assert!(expect_under(ChaosMode::Blind, "redis-stall+key-loss") == Expect::Breaks);
        assert!(expect_under(ChaosMode::Blind, "redis-stall") == Expect::MayBreak);
        assert!(expect_under(ChaosMode::Blind, "my-own-pause") == Expect::MayBreak);
        assert!(expect_under(ChaosMode::Guard, "my-own-pause+key-loss") == Expect::Holds);
        assert!(expect_under(ChaosMode::Fenced, "key-loss") == Expect::MayBreak);
    }
}
