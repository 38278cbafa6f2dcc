//! The fault matrix: rows, table, JSON rows, verdict, and checking a file.

mod common;

use common::{History, WALLET, dip};
use leasehold_chaos::check::{RunCheck, check};
use leasehold_chaos::history::write_jsonl;
use leasehold_chaos::report::{ErrorsStatus, FileError, render_json_lines, render_table};
use leasehold_chaos::{Kind, MatrixVerdict, Verdict, WriteOutcome, check_file, rows, verdict};

/// A negative control that broke: two blind writers lost an update.
fn control_broken() -> RunCheck {
    let mut h = History::wallet("none", "process-pause", true);
    h.acquired(100, "w0.t0", "aaaa", 1)
        .acquired(1_000, "w1.t0", "bbbb", 2)
        .write(1_200, "w1.t0", 10, 2, WriteOutcome::Accepted)
        .write(5_100, "w0.t0", 10, 1, WriteOutcome::Accepted)
        .final_state(6_000, WALLET, 90, 20, 2);
    check(&h.events)
}

/// A negative control that (this time) did not break.
fn control_clean() -> RunCheck {
    let mut h = History::wallet("none", "process-pause", true);
    h.acquired(100, "w0.t0", "aaaa", 1)
        .write(200, "w0.t0", 10, 1, WriteOutcome::Accepted)
        .released(300, "w0.t0", "aaaa")
        .final_state(6_000, WALLET, 90, 10, 1);
    check(&h.events)
}

#[test]
fn runs_fold_into_one_row_per_mode_and_fault() {
    let clean = check(&History::clean().events);
    let saved = check(&History::saved_by_the_fence().events);
    let rows = rows(&[clean.clone(), saved.clone(), clean, saved, control_broken()]);
    assert_eq!(rows.len(), 3, "{rows:?}");
    let none = &rows[0];
    assert_eq!(
        (none.mode.as_str(), none.fault.as_str(), none.control),
        ("fenced-cas", "none", false)
    );
    assert_eq!((none.runs, none.operations, none.accepted), (2, 8, 4));
    // No double holder under no fault: nothing exercised, not a failure.
    assert_eq!(
        (none.violations, none.overlaps, none.status),
        (0, 0, Verdict::NeverBroke)
    );
    let pause = &rows[1];
    assert_eq!(pause.fault, "process-pause");
    assert_eq!((pause.runs, pause.overlaps, pause.refused_stale), (2, 2, 2));
    // Two double holders absorbed, and the control under the same fault
    // (though it ran later) was caught.
    assert_eq!(
        pause.status,
        Verdict::Held {
            double_holders: 2,
            control_caught: true
        }
    );
    let control = &rows[2];
    assert!(control.control);
    assert_eq!((control.runs, control.runs_with_violation), (1, 1));
    assert_eq!(control.status, Verdict::ControlCaught { violations: 2 });
    assert_eq!(verdict(&rows), MatrixVerdict::Ok);
}

#[test]
fn a_violation_outside_the_controls_fails_the_verdict() {
    let mut broken = History::clean();
    broken.events.pop();
    broken.final_state(1_000, WALLET, 90, 20, 2);
    let rows = rows(&[check(&History::clean().events), check(&broken.events)]);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].status, Verdict::Broken { violations: 2 });
    assert_eq!((rows[0].runs_with_violation, rows[0].runs), (1, 2));
    let v = verdict(&rows);
    assert!(!v.is_ok());
    assert!(
        v.to_string().starts_with("FAILED: fenced-cas under none: "),
        "{v}"
    );
}

#[test]
fn a_control_without_a_violation_fails_the_verdict() {
    let rows = rows(&[check(&History::clean().events), control_clean()]);
    assert_eq!(rows[1].status, Verdict::ControlMissed);
    let MatrixVerdict::Failed { reasons } = verdict(&rows) else {
        panic!("a control that caught nothing must fail the verdict");
    };
    assert_eq!(reasons.len(), 1);
    assert!(
        reasons[0].contains("the checker or the fault is not working"),
        "{}",
        reasons[0]
    );
    let table = render_table(&rows);
    assert!(
        table.contains("FAILED: control missed (its writes broke no invariant"),
        "{table}"
    );
}

#[test]
fn a_control_must_catch_in_nine_runs_of_ten() {
    let mut runs: Vec<RunCheck> = (0..9).map(|_| control_broken()).collect();
    runs.push(control_clean());
    assert_eq!(
        rows(&runs)[0].status,
        Verdict::ControlCaught { violations: 18 }
    );
    runs[0] = control_clean();
    let rows = rows(&runs);
    assert_eq!((rows[0].runs_with_violation, rows[0].runs), (8, 10));
    assert_eq!(rows[0].status, Verdict::ControlMissed);
    assert!(!verdict(&rows).is_ok());
}

#[test]
fn nothing_checked_is_not_ok() {
    assert!(!verdict(&[]).is_ok());
}

#[test]
fn runs_without_a_header_form_a_failing_row() {
    let mut h = History::headless();
    h.final_state(1_000, WALLET, 100, 0, 0);
    let rows = rows(&[check(&h.events)]);
    assert_eq!((rows[0].mode.as_str(), rows[0].fault.as_str()), ("?", "?"));
    assert_eq!(rows[0].status, Verdict::Broken { violations: 1 });
}

#[test]
fn recovery_times_give_a_max_and_a_median() {
    let runs: Vec<RunCheck> = [300_000, 100_000, 200_000]
        .into_iter()
        .map(|gap| check(&dip(gap).events))
        .collect();
    let mut never = dip(0);
    never.events.retain(|e| e.at_us <= 2_500_000);
    let mut runs = runs;
    runs.push(check(&never.events));
    let rows = rows(&runs);
    assert_eq!(rows.len(), 1);
    let row = &rows[0];
    assert_eq!((row.recoveries, row.unrecovered), (4, 1));
    assert_eq!(row.max_recovery_us, Some(300_000));
    assert_eq!(row.median_recovery_us, Some(200_000));
    assert!(render_table(&rows).contains("300ms"));
}

#[test]
fn the_table_is_fixed_width() {
    let rows = rows(&[
        check(&History::clean().events),
        check(&History::saved_by_the_fence().events),
        control_broken(),
    ]);
    let table = render_table(&rows);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 4, "{table}");
    assert!(lines[0].starts_with("mode"), "{table}");
    // Every column ends at the same place on every line: the status, last,
    // starts at one offset.
    let status_at: Vec<usize> = lines
        .iter()
        .zip([
            "status",
            "never broke",
            "held: 1 double holders",
            "control caught",
        ])
        .map(|(line, status)| line.rfind(status).expect("a status"))
        .collect();
    assert!(status_at.windows(2).all(|w| w[0] == w[1]), "{table}");
    assert!(lines[3].starts_with("none (control)"), "{table}");
}

#[test]
fn rows_are_json_lines() -> Result<(), serde_json::Error> {
    let rows = rows(&[
        check(&History::saved_by_the_fence().events),
        control_clean(),
    ]);
    let text = render_json_lines(&rows)?;
    let parsed: Vec<serde_json::Value> = text
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    assert_eq!(parsed.len(), 2);
    assert_eq!(parsed[0]["mode"], "fenced-cas");
    assert_eq!(parsed[0]["refused_stale"], 1);
    // The control under process-pause missed: the fenced row's double
    // holder proves nothing.
    assert_eq!(parsed[0]["status"], "inconclusive");
    assert_eq!(parsed[1]["status"], "control_missed");
    assert_eq!(parsed[1]["control"], true);
    let v = serde_json::to_value(verdict(&rows))?;
    assert_eq!(v["verdict"], "failed");
    Ok(())
}

#[test]
fn a_history_file_is_checked() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("run.jsonl");
    let events = History::saved_by_the_fence().events;
    write_jsonl(std::fs::File::create(&path)?, &events)?;
    assert_eq!(check_file(&path)?, check(&events));

    let missing = dir.path().join("missing.jsonl");
    let err = check_file(&missing).expect_err("no such file");
    assert!(matches!(err, FileError::Open { .. }));
    assert_eq!(
        err.to_string(),
        format!("cannot open history {}", missing.display())
    );

    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"at_us\":1}\n")?;
    let err = check_file(&bad).expect_err("not an event");
    assert!(matches!(err, FileError::Read { .. }));
    assert_eq!(
        err.to_string(),
        format!("cannot read history {}", bad.display())
    );
    Ok(())
}

/// One run under `fault` (a window of `window_us`) with a 2 s budget when
/// `budget`, in which a caller was returned `errors` (call, kind) pairs.
fn errored(fault: &str, window_us: u64, budget: bool, errors: &[(&str, &str)]) -> RunCheck {
    let mut h = History::wallet("cas", fault, false);
    if budget {
        h.push(0, "coordinator", Kind::Budget { wait_ms: 2_000 });
    }
    h.acquired(100, "w0.t0", "aaaa", 1)
        .write(200, "w0.t0", 10, 1, WriteOutcome::Accepted)
        .released(300, "w0.t0", "aaaa")
        .fault(1_000, 1_000 + window_us, fault, "redis");
    for (call, error) in errors {
        h.push(
            1_500,
            "w0.t1",
            Kind::CallerError {
                call: (*call).into(),
                key: common::KEY.into(),
                error: (*error).into(),
                detail: "redis unreachable during acquire".into(),
            },
        );
    }
    h.final_state(3_000_000, WALLET, 90, 10, 1);
    check(&h.events)
}

#[test]
fn an_error_returned_under_a_fault_shorter_than_the_wait_fails_its_row() {
    let run = errored(
        "redis-restart",
        300_000,
        true,
        &[("acquire", "unreachable")],
    );
    assert_eq!((run.errors.acquire, run.errors.judged), (1, true));
    // A restart does not keep Redis answering: a lease lost to it is the
    // guarantee at work, so refreshes are not judged there.
    assert!(!run.errors.refresh_judged);
    assert!(!run.errors.holds());
    let rows = rows(&[run]);
    let row = &rows[0];
    assert!(row.status.passes(), "safety held: {}", row.status);
    assert_eq!(row.errors, ErrorsStatus::Failed);
    let MatrixVerdict::Failed { reasons } = verdict(&rows) else {
        panic!("an error under a short fault must fail the verdict");
    };
    assert!(
        reasons[0].contains("errors judgement failed") && reasons[0].contains("1 acquire"),
        "{reasons:?}"
    );
    assert!(
        render_table(&rows).contains("0/0"),
        "{}",
        render_table(&rows)
    );
}

#[test]
fn errors_are_judged_only_under_faults_shorter_than_a_known_wait() {
    let clean = errored("script-flush", 300_000, true, &[]);
    assert!(clean.errors.judged && clean.errors.refresh_judged);
    assert_eq!(rows(&[clean])[0].errors, ErrorsStatus::Ok);
    // Longer than the wait: counted, not judged.
    let long = errored("redis-pause", 2_500_000, true, &[("acquire", "timeout")]);
    assert!(!long.errors.judged && long.errors.holds());
    // No budget recorded (an older history): not judged.
    let unknown = errored("redis-restart", 300_000, false, &[("release", "timeout")]);
    assert!(!unknown.errors.judged);
    let rows = rows(&[long, unknown]);
    assert!(rows.iter().all(|r| r.errors == ErrorsStatus::NotJudged));
    assert_eq!(verdict(&rows), MatrixVerdict::Ok);
    // A refresh error (a lease given up as unreachable) is judged only
    // where Redis keeps answering: under key loss, it fails.
    let refresh = errored(
        "key-loss",
        300_000,
        true,
        &[("refresh", "lease_lost_unreachable")],
    );
    assert_eq!((refresh.errors.refresh, refresh.errors.holds()), (1, false));
    let paused = errored(
        "redis-pause",
        300_000,
        true,
        &[("refresh", "lease_lost_unreachable")],
    );
    assert!(paused.errors.holds());
}
