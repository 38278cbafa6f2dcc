//! `leasehold chaos --fault-marks`: faults injected from outside the run
//! (here by the test, against its own Redis), marked with `chaos mark`,
//! judged as the run's own; and `chaos check --fault-marks` on a saved
//! history.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
use common::leasehold;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// `leasehold chaos mark EDGE NAME --file FILE`.
fn mark(edge: &str, name: &str, file: &Path) -> TestResult {
    let out = leasehold(&[
        "chaos",
        "mark",
        edge,
        name,
        "--file",
        file.to_str().ok_or("path")?,
    ])?;
    assert!(out.status.success(), "{out:?}");
    Ok(())
}

/// The blind mode under `--faults none` against the test's own Redis,
/// while the test deletes the held lock keys (a key loss of its own) and
/// then pauses every client (`CLIENT PAUSE 300 ALL`, a stall of its own),
/// marking each with `chaos mark`. The run is named after the marked
/// faults and judged under them: the blind mode is a negative control
/// under a key loss (caught or missed, never only reported, as it is
/// under no fault), and the errors returned to its callers are judged
/// against windows shorter than the wait.
#[test]
fn faults_injected_and_marked_from_outside_are_judged_as_the_runs_own() -> TestResult {
    let redis = leasehold_testkit::RedisServer::start()?;
    let dir = tempfile::tempdir()?;
    let marks = dir.path().join("marks.txt");
    let report = dir.path().join("report");
    let url = format!("redis://127.0.0.1:{}/", redis.port());
    let args = [
        "chaos",
        "--json",
        "--redis-url",
        &url,
        "--modes",
        "blind",
        "--faults",
        "none",
        "--duration",
        "4s",
        "--fault-marks",
        marks.to_str().ok_or("path")?,
        "--report",
        report.to_str().ok_or("path")?,
    ];
    let child = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(args)
        .env_remove("REDIS_URL")
        .env_remove("DATABASE_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;

    // The run has started once its callers hold the lock.
    let keys = ["lock:{wallet:1}", "lock:{wallet:2}"];
    let deadline = Instant::now() + Duration::from_secs(60);
    while redis.command(&["EXISTS", keys[0], keys[1]])?.to_string() == "0" {
        assert!(Instant::now() < deadline, "the run never took a lock");
    }
    mark("start", "key-loss", &marks)?;
    let (mut deleted, deadline) = (0, Instant::now() + Duration::from_secs(2));
    while deleted < 20 && Instant::now() < deadline {
        deleted += redis
            .command(&["DEL", keys[0], keys[1]])?
            .to_string()
            .parse::<u32>()?;
    }
    mark("end", "key-loss", &marks)?;
    mark("start", "redis-stall", &marks)?;
    redis.command(&["CLIENT", "PAUSE", "300", "ALL"])?;
    // Answered once the pause is over.
    redis.command(&["PING"])?;
    mark("end", "redis-stall", &marks)?;

    let out = child.wait_with_output()?;
    let stdout = String::from_utf8(out.stdout)?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let rows: Vec<Value> = stdout
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    let [row] = &rows[..] else {
        panic!("one row expected: {stdout}\n{stderr}");
    };
    assert_eq!(row["fault"], "key-loss+redis-stall", "{row}\n{stderr}");
    assert_eq!(row["control"], true, "{row}");
    assert!(
        row["status"] == "control_caught" || row["status"] == "control_missed",
        "{row}"
    );
    assert_eq!(row["errors_judged"], 1, "{row}");
    assert!(
        stderr.contains("marked fault key-loss from")
            && stderr.contains("marked fault redis-stall from"),
        "{stderr}"
    );
    // The saved history holds the marked windows: re-checked as it is, it
    // is judged the same (exit 0 for a caught control, 1 for a missed one).
    let history = report.join("blind-none-1.jsonl");
    let text = std::fs::read_to_string(&history)?;
    assert!(
        text.contains(r#""actor":"marks","type":"fault_start","fault":"redis-stall""#),
        "{text}"
    );
    let checked = leasehold(&["chaos", "check", history.to_str().ok_or("path")?, "--json"])?;
    let check: Value = serde_json::from_slice(&checked.stdout)?;
    assert_eq!(check["header"]["fault"], "key-loss+redis-stall", "{check}");
    assert_eq!(check["errors"]["judged"], true, "{check}");
    assert_eq!(out.status.code(), checked.status.code(), "{check}");
    Ok(())
}

/// A hand-written blind run under no fault with a lost update: only
/// reported. Checked again with a key loss marked after the fact, it is a
/// control, caught, named by the mark. A marks file with a malformed line
/// is a usage error naming the line; the history is left as it was.
#[test]
fn chaos_check_judges_a_saved_history_under_marks_written_after_it() -> TestResult {
    let dir = tempfile::tempdir()?;
    let t0_ms: u64 = 1_765_000_000_000;
    let key = "lock:{wallet:1}";
    let events = [
        serde_json::json!({"at_us": 0, "actor": "coordinator", "type": "run", "mode": "blind",
            "fault": "none", "seed": 1, "ttl_ms": 100, "control": false, "reported_only": true,
            "initial": [["wallet:1", 100]]}),
        serde_json::json!({"at_us": 0, "actor": "coordinator", "type": "budget", "wait_ms": 2000}),
        serde_json::json!({"at_us": 0, "actor": "coordinator", "type": "wall_clock",
            "unix_us": t0_ms * 1000}),
        serde_json::json!({"at_us": 100, "actor": "w0.t0", "type": "acquire", "op": 1, "key": key}),
        serde_json::json!({"at_us": 110, "actor": "w0.t0", "type": "acquired", "op": 1,
            "key": key, "token": "aaaa", "fence": null}),
        serde_json::json!({"at_us": 200, "actor": "w0.t0", "type": "write", "op": 2,
            "started_us": 150, "key": key, "resource": "wallet:1", "amount": 10, "fence": null,
            "outcome": "accepted"}),
        serde_json::json!({"at_us": 2_000_000, "actor": "checker", "type": "final",
            "resource": "wallet:1", "balance": 100, "ledger_sum": 10, "ledger_rows": 1}),
    ];
    let history = dir.path().join("blind-none-1.jsonl");
    let lines: Vec<String> = events.iter().map(Value::to_string).collect();
    std::fs::write(&history, lines.join("\n") + "\n")?;
    let history = history.to_str().ok_or("path")?;

    let out = leasehold(&["chaos", "check", history])?;
    let stdout = String::from_utf8(out.stdout)?;
    assert!(stdout.contains("reported: "), "{stdout}");

    let marks = dir.path().join("marks.txt");
    std::fs::write(
        &marks,
        format!(
            "{} start key-loss\n{} end key-loss\n",
            t0_ms + 50,
            t0_ms + 400
        ),
    )?;
    let out = leasehold(&[
        "chaos",
        "check",
        history,
        "--fault-marks",
        marks.to_str().ok_or("path")?,
    ])?;
    let stdout = String::from_utf8(out.stdout)?;
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("control caught: "), "{stdout}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("marked fault key-loss from 0.050 s to 0.400 s"),
        "{stderr}"
    );

    let bad = dir.path().join("bad.txt");
    std::fs::write(
        &bad,
        format!("{} start key-loss\n{} stop key-loss\n", t0_ms, t0_ms + 9),
    )?;
    let out = leasehold(&[
        "chaos",
        "check",
        history,
        "--fault-marks",
        bad.to_str().ok_or("path")?,
    ])?;
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("fault marks line 2"), "{stderr}");
    assert_eq!(std::fs::read_to_string(history)?, lines.join("\n") + "\n");
    Ok(())
}

/// A malformed marks file found at a run's end: a usage error naming the
/// line, after the run's history is saved (unmarked, next to the marks
/// file without `--report`).
#[test]
fn a_malformed_marks_file_fails_the_matrix_after_saving_the_history() -> TestResult {
    let dir = tempfile::tempdir()?;
    let marks = dir.path().join("marks.txt");
    std::fs::write(&marks, "# mine\nsoon start redis-stall\n")?;
    let out = leasehold(&[
        "chaos",
        "--modes",
        "cas",
        "--faults",
        "none",
        "--duration",
        "1s",
        "--fault-marks",
        marks.to_str().ok_or("path")?,
    ])?;
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("fault marks line 2") && stderr.contains("saved unmarked"),
        "{stderr}"
    );
    let saved = std::fs::read_to_string(dir.path().join("cas-none-1.jsonl"))?;
    assert!(saved.contains(r#""type":"final""#), "{saved}");
    Ok(())
}
