//! One verdict for a run of the harness and a cell of the matrix: it says
//! what was exercised (held with N double holders absorbed and the control
//! caught, or no control ran; never broke; inconclusive; broken), and the
//! harness's report and the matrix's row agree on the same histories.

mod common;

use common::{History, WALLET};
use leasehold_chaos::report::render_table;
use leasehold_chaos::{
    ControlVerdict, Event, Kind, MatrixVerdict, RunReport, Verdict, WriteOutcome, check, rows,
    verdict,
};

/// A negative control under process-pause that lost a write.
fn control_caught() -> Vec<Event> {
    let mut h = History::wallet("none", "process-pause", true);
    h.acquired(100, "w0.t0", "aaaa", 1)
        .acquired(1_000, "w1.t0", "bbbb", 2)
        .write(1_200, "w1.t0", 10, 2, WriteOutcome::Accepted)
        .write(5_100, "w0.t0", 10, 1, WriteOutcome::Accepted)
        .final_state(6_000, WALLET, 90, 20, 2);
    h.events
}

/// A negative control under process-pause that lost nothing.
fn control_missed() -> Vec<Event> {
    let mut h = History::wallet("none", "process-pause", true);
    h.acquired(100, "w0.t0", "aaaa", 1)
        .write(200, "w0.t0", 10, 1, WriteOutcome::Accepted)
        .released(300, "w0.t0", "aaaa")
        .final_state(6_000, WALLET, 90, 10, 1);
    h.events
}

/// A safe path under process-pause: one double holder, its stale write
/// refused.
fn absorbed() -> Vec<Event> {
    History::saved_by_the_fence().events
}

/// A safe path under process-pause whose lock never broke.
fn never_broke() -> Vec<Event> {
    let mut h = History::wallet("fenced-cas", "process-pause", false);
    h.acquired(100, "w0.t0", "aaaa", 1)
        .write(200, "w0.t0", 10, 1, WriteOutcome::Accepted)
        .released(300, "w0.t0", "aaaa")
        .final_state(1_000, WALLET, 90, 10, 1);
    h.events
}

#[test]
fn a_run_with_double_holders_held_only_if_the_control_was_caught() {
    let run = check(&absorbed());
    assert_eq!(
        run.verdict(),
        Verdict::Held {
            double_holders: 1,
            control_caught: false
        }
    );
    assert_eq!(
        run.verdict().to_string(),
        "held: 1 double holders absorbed; no control ran"
    );
    assert_eq!(run.verdict().name(), "held_no_control");
    let caught = run.verdict_with(&ControlVerdict::Caught { violations: 2 });
    assert_eq!(
        caught.to_string(),
        "held: 1 double holders absorbed; the control caught"
    );
    assert_eq!(caught.name(), "held");
    let nothing = run.verdict_with(&ControlVerdict::CaughtNothing { writes: 30 });
    assert_eq!(nothing, Verdict::Inconclusive { double_holders: 1 });
    assert!(!nothing.passes());
    assert!(caught.passes() && run.verdict().passes());
}

#[test]
fn a_run_whose_lock_never_broke_exercised_nothing_and_does_not_fail() {
    let run = check(&never_broke());
    assert!(!run.exercised());
    for control in [
        ControlVerdict::NotRun,
        ControlVerdict::Caught { violations: 2 },
        ControlVerdict::CaughtNothing { writes: 30 },
    ] {
        let verdict = run.verdict_with(&control);
        assert_eq!(verdict, Verdict::NeverBroke, "{control:?}");
        assert!(verdict.passes());
    }
    assert_eq!(
        Verdict::NeverBroke.to_string(),
        "never broke: no double holder, nothing exercised"
    );
}

#[test]
fn a_run_without_a_lock_is_exercised_by_every_write() {
    let mut h = History::wallet("db", "process-pause", false);
    h.write(200, "w0.t0", 10, 0, WriteOutcome::Accepted)
        .final_state(1_000, WALLET, 90, 10, 1);
    let run = check(&h.events);
    assert!(run.exercised());
    assert_eq!(
        run.verdict_with(&ControlVerdict::Caught { violations: 1 }),
        Verdict::Held {
            double_holders: 0,
            control_caught: true
        }
    );
}

#[test]
fn a_violation_is_broken_whatever_the_control_showed() {
    let mut h = History::saved_by_the_fence();
    h.events.pop();
    h.final_state(6_000, WALLET, 80, 20, 2);
    let run = check(&h.events);
    let violations = run.violations.len() as u64;
    assert!(violations > 0);
    assert_eq!(
        run.verdict_with(&ControlVerdict::Caught { violations: 2 }),
        Verdict::Broken { violations }
    );
}

/// The harness's report (a run and its control) and the matrix's row (the
/// same run and the same control in one matrix) say the same.
#[test]
fn the_harness_and_the_matrix_agree() {
    let cases = [
        (absorbed(), control_caught(), "held", true),
        (absorbed(), control_missed(), "inconclusive", false),
        (never_broke(), control_caught(), "never_broke", true),
        // The cell never broke, as the harness says; the matrix fails on
        // its control row, which missed.
        (never_broke(), control_missed(), "never_broke", false),
    ];
    for (run, control, name, matrix_ok) in cases {
        let report = RunReport::new(run.clone()).with_control(RunReport::new(control.clone()));
        let rows = rows(&[check(&control), check(&run)]);
        assert_eq!(report.verdict(), rows[1].status, "{name}");
        assert_eq!(report.verdict().name(), name);
        assert!(
            report.summary().starts_with(&report.verdict().to_string()),
            "{}",
            report.summary()
        );
        assert_eq!(report.holds(), name != "inconclusive", "{name}");
        assert_eq!(verdict(&rows).is_ok(), matrix_ok, "{name}");
    }
    // Without a control: the same words on both sides.
    let report = RunReport::new(absorbed());
    let rows = rows(&[check(&absorbed())]);
    assert_eq!(report.verdict(), rows[0].status);
    assert!(report.holds());
    assert!(render_table(&rows).contains("held: 1 double holders absorbed; no control ran"));
    assert_eq!(verdict(&rows), MatrixVerdict::Ok);
}

#[test]
fn an_inconclusive_cell_fails_the_matrix_and_says_why() {
    let rows = rows(&[check(&absorbed()), check(&control_missed())]);
    assert_eq!(rows[0].status, Verdict::Inconclusive { double_holders: 1 });
    let MatrixVerdict::Failed { reasons } = verdict(&rows) else {
        panic!("an inconclusive cell passed");
    };
    assert!(
        reasons
            .iter()
            .any(|r| r.starts_with("fenced-cas under process-pause: inconclusive: 1 double")),
        "{reasons:?}"
    );
}

#[test]
fn a_control_run_of_the_harness_is_caught_or_missed() {
    let caught = RunReport::new(control_caught());
    assert!(caught.caught());
    assert_eq!(caught.verdict(), Verdict::ControlCaught { violations: 2 });
    let missed = RunReport::new(control_missed());
    assert_eq!(missed.verdict(), Verdict::ControlMissed);
    assert!(
        missed.summary().starts_with("FAILED: control missed"),
        "{}",
        missed.summary()
    );
    // It says why nothing was caught: here the lock never broke.
    assert!(caught.not_caught_because().is_empty());
    let why = missed.not_caught_because();
    assert!(
        why.iter()
            .any(|r| r.starts_with("no two callers held the lock")),
        "{why:?}"
    );
    assert!(missed.summary().contains("\n  not caught: no two callers"));
    // A path without its fence check that still refused stale writes
    // (a primary key, a constraint) says so.
    let mut h = History::wallet("no-guard", "process-pause", true);
    h.acquired(100, "w0.t0", "aaaa", 1)
        .acquired(150, "w0.t1", "bbbb", 2)
        .write(200, "w0.t1", 10, 2, WriteOutcome::Accepted)
        .write(250, "w0.t0", 10, 1, WriteOutcome::RefusedStale)
        .released(300, "w0.t0", "aaaa")
        .released(300, "w0.t1", "bbbb")
        .final_state(6_000, WALLET, 90, 10, 1);
    let refused = RunReport::new(h.events);
    assert_eq!(refused.verdict(), Verdict::ControlMissed);
    let why = refused.not_caught_because();
    assert!(
        why.iter()
            .any(|r| r.starts_with("1 writes were refused by the path itself")),
        "{why:?}"
    );
    assert!(
        !why.iter().any(|r| r.starts_with("no two callers")),
        "{why:?}"
    );
    // A history without a run header is broken, not judged some other way.
    let mut headless = History::headless();
    headless.push(0, "w0.t0", Kind::Budget { wait_ms: 1 });
    assert!(matches!(
        check(&headless.events).verdict(),
        Verdict::Broken { .. }
    ));
}
