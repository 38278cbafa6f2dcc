//! The `leasehold` binary, run the way a user runs it.

use std::process::Command;

use leasehold_testkit::{RedisOptions, RedisServer};
use serde_json::Value;

mod common;
use common::leasehold;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Runs `leasehold args`, requires it to succeed, and returns its stdout.
fn succeeded(args: &[&str]) -> Result<String, Box<dyn std::error::Error>> {
    let out = leasehold(args)?;
    let stdout = String::from_utf8(out.stdout)?;
    assert!(
        out.status.success(),
        "leasehold {args:?} failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(stdout)
}

/// Runs `leasehold args`, requires it to finish with OK (0) or BROKEN (1),
/// not an error, and returns its stdout.
fn finished(args: &[&str]) -> Result<String, Box<dyn std::error::Error>> {
    let out = leasehold(args)?;
    let stdout = String::from_utf8(out.stdout)?;
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "leasehold {args:?} failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(stdout)
}

/// Runs with `--json` and returns one object per run, checking the exit
/// code against them: 0 when every run is OK, 1 when one is BROKEN.
fn runs(args: &[&str]) -> Result<Vec<Value>, Box<dyn std::error::Error>> {
    let mut all = args.to_vec();
    all.push("--json");
    let out = leasehold(&all)?;
    let stdout = String::from_utf8(out.stdout)?;
    let reports: Vec<Value> = stdout
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    let all_ok = reports.iter().all(|r| r["ok"] == true);
    assert_eq!(
        out.status.code(),
        Some(if all_ok { 0 } else { 1 }),
        "leasehold {all:?}: exit code against the reports\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(reports)
}

#[test]
fn race_is_detected_broken() -> TestResult {
    let reports = runs(&["race", "--runs", "3"])?;
    assert_eq!(reports.len(), 3);
    for r in &reports {
        assert_eq!(r["experiment"], "race");
        assert_eq!(r["ok"], false, "{r}");
        // Every spender read the full balance, so all were accepted.
        assert_eq!(r["accepted"], 50, "{r}");
        assert_eq!(r["expected"], -400, "{r}");
        assert_eq!(r["errors"], 0, "{r}");
        for key in ["balance", "elapsed_ms"] {
            assert!(r[key].is_i64() || r[key].is_u64(), "{key} in {r}");
        }
    }
    Ok(())
}

#[test]
fn lock_is_ok_on_repeated_runs_and_leaves_no_key() -> TestResult {
    let reports = runs(&["lock", "--runs", "5"])?;
    assert_eq!(reports.len(), 5);
    for r in &reports {
        assert_eq!(r["ok"], true, "{r}");
        assert_eq!(r["accepted"], 10, "{r}");
        assert_eq!(r["balance"], 0, "{r}");
        assert_eq!(r["lock_key_left"], false, "{r}");
        assert_eq!(r["errors"], 0, "{r}");
    }
    Ok(())
}

#[test]
fn flags_change_the_workload() -> TestResult {
    let r = &runs(&[
        "lock",
        "-n",
        "7",
        "--amount",
        "5",
        "--initial",
        "20",
        "--work",
        "1ms",
    ])?[0];
    assert_eq!(r["accepted"], 4, "{r}");
    assert_eq!(r["balance"], 0, "{r}");
    let r = &runs(&["race", "-n", "1", "--initial", "5"])?[0];
    assert_eq!(r["accepted"], 0, "{r}");
    assert_eq!(r["ok"], true, "one spender cannot race: {r}");
    Ok(())
}

fn assert_backoff_figures(r: &Value) {
    assert_eq!(r["experiment"], "backoff", "{r}");
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["accepted"], 10, "{r}");
    assert_eq!(r["balance"], 0, "{r}");
    assert_eq!(r["errors"], 0, "{r}");
    assert_eq!(r["gave_up"], 0, "{r}");
    assert_eq!(r["acquisitions"], 50, "{r}");
    assert!(r["round_trips"].as_u64().is_some(), "{r}");
    assert!(
        r["redis_cpu_ms"].as_f64().is_some_and(|ms| ms >= 0.0),
        "{r}"
    );
    assert!(
        r["utilisation"]
            .as_f64()
            .is_some_and(|u| u > 0.0 && u <= 1.0),
        "{r}"
    );
}

#[test]
fn backoff_with_jitter_reports_its_figures() -> TestResult {
    let reports = runs(&["backoff", "--jitter"])?;
    assert_eq!(reports.len(), 1);
    assert_backoff_figures(&reports[0]);
    assert_eq!(reports[0]["mode"], "full jitter");
    // Polling: at least one request to take and one to give back each lease.
    let round_trips = reports[0]["round_trips"].as_u64().unwrap_or(0);
    assert!(round_trips >= 100, "{}", reports[0]);
    Ok(())
}

#[test]
fn backoff_with_handoff_reports_its_figures_without_polling() -> TestResult {
    let reports = runs(&["backoff", "--handoff"])?;
    let r = &reports[0];
    assert_backoff_figures(r);
    assert_eq!(r["mode"], "hand-off");
    // No polling, and the leases pass from caller to caller in process with
    // one token-checked request each (plus the first take and the last
    // release, when all 50 queue behind the first): at most 1.2 requests
    // per lease, where polling needs at least 2.
    let round_trips = r["round_trips"].as_u64().unwrap_or(u64::MAX);
    assert!(round_trips <= 60, "{r}");
    Ok(())
}

#[test]
fn backoff_human_output_has_the_tutorials_lines() -> TestResult {
    let stdout = succeeded(&["backoff", "--handoff", "-n", "5", "--initial", "20"])?;
    assert!(
        stdout.contains("accepted=2 balance=0 expected=0 OK"),
        "{stdout}"
    );
    assert!(stdout.contains("gave up=0 "), "{stdout}");
    assert!(stdout.contains("elapsed="), "{stdout}");
    Ok(())
}

#[test]
fn bench_uncontended_smoke_prints_its_fields() -> TestResult {
    let stdout = succeeded(&[
        "bench",
        "uncontended",
        "--duration",
        "50ms",
        "--rounds",
        "1",
        "--tasks",
        "4",
        "--json",
    ])?;
    let r: Value = serde_json::from_str(stdout.trim())?;
    assert_eq!(r["bench"], "uncontended", "{r}");
    for key in [
        "library_pairs_per_s",
        "floor_pairs_per_s",
        "overhead_ratio",
        "tasks_library_pairs_per_s",
        "tasks_floor_pairs_per_s",
        "tasks_ratio",
    ] {
        assert!(r[key].as_f64().is_some_and(|x| x > 0.0), "{key} in {r}");
    }
    Ok(())
}

/// `bench NAME --ways WAYS` on tiny runs (one round, 3 callers): a row
/// per case and way, each with pairs per second, ordered quantiles, the
/// first way as the base and no caller giving up. No timing is judged
/// (the machine may be busy). Returns the report.
fn bench_consensus_rows(bench: &str, ways: &[&str]) -> Result<Value, Box<dyn std::error::Error>> {
    let callers = 3;
    let ways_flag = ways.join(",");
    let stdout = succeeded(&[
        "bench",
        bench,
        "--ways",
        &ways_flag,
        "--duration",
        "50ms",
        "--rounds",
        "1",
        "--tasks",
        "2",
        "-n",
        &callers.to_string(),
        "--work",
        "1ms",
        "--json",
    ])?;
    let r: Value = serde_json::from_str(stdout.trim())?;
    assert_eq!(r["bench"], bench, "{r}");
    assert_eq!(r["base"], ways[0], "{r}");
    let rows = r["rows"].as_array().ok_or("no rows")?;
    assert_eq!(rows.len(), CONSENSUS_CASES.len() * ways.len(), "{r}");
    for row in rows {
        let median = |key: &str| row[key]["median"].as_f64().ok_or(format!("{key} in {row}"));
        assert!(median("per_s")? > 0.0, "{row}");
        assert!(median("p50_us")? <= median("p99_us")?, "{row}");
        if row["way"] == ways[0] {
            assert_eq!(row["per_s_ratio"], 1.0, "{row}");
        }
        if row["case"] == "tutorial" {
            assert_eq!(median("gave_up")?, 0.0, "{row}");
        }
    }
    for case in CONSENSUS_CASES {
        for way in ways {
            assert!(
                rows.iter()
                    .any(|row| row["case"] == case && row["way"] == *way),
                "no {case} row for {way} in {r}"
            );
        }
    }
    Ok(r)
}

/// The cases of `bench consensus` and `bench etcd`.
const CONSENSUS_CASES: [&str; 3] = ["sequential", "tasks", "tutorial"];

#[test]
fn bench_etcd_smoke_has_a_row_per_case_and_way() -> TestResult {
    let r = bench_consensus_rows("etcd", &["redis", "etcd"])?;
    for row in r["rows"].as_array().ok_or("no rows")? {
        if row["case"] == "tutorial" {
            // Only a Redis way counts its requests.
            assert_eq!(
                row["round_trips_per_acq"]["median"].is_null(),
                row["way"] == "etcd",
                "{row}"
            );
        }
    }
    Ok(())
}

/// `bench consensus` on etcd and ZooKeeper (one member each, the
/// smallest): both pay fsyncs per lease, which Redis does not report
/// (ZooKeeper's prove the bench turned its forceSync back on).
#[test]
fn bench_consensus_smoke_reports_fsyncs_per_lease_on_etcd_and_zookeeper() -> TestResult {
    let r = bench_consensus_rows("consensus", &["redis", "etcd-1", "zookeeper-1"])?;
    assert!(r["zookeeper_version"].is_string(), "{r}");
    assert!(r["etcd_version"].is_string(), "{r}");
    for row in r["rows"].as_array().ok_or("no rows")? {
        let fsyncs = row["fsyncs_per_lease"]["median"].as_f64();
        if row["way"] == "redis" {
            assert!(fsyncs.is_none(), "{row}");
        } else {
            // Each lease writes at least once (a take), durably.
            assert!(fsyncs.is_some_and(|f| f >= 1.0), "{row}");
            assert!(
                row["fsync_ms"]["median"]
                    .as_f64()
                    .is_some_and(|ms| ms >= 0.0),
                "{row}"
            );
        }
    }
    Ok(())
}

/// Every way of `bench pg` on tiny runs: a row per case and way, the
/// advisory lock as the base, the database's cost per lease on the
/// PostgreSQL ways' one-task rows, and the hot run's table figures. No
/// timing is judged (the machine may be busy).
#[test]
fn bench_pg_smoke_has_a_row_per_case_and_way_and_the_cost_per_lease() -> TestResult {
    let callers = 3;
    let stdout = succeeded(&[
        "bench",
        "pg",
        "--duration",
        "50ms",
        "--rounds",
        "1",
        "--tasks",
        "2",
        "-n",
        &callers.to_string(),
        "--work",
        "1ms",
        "--hot-leases",
        "20",
        "--timed",
        "300ms",
        "--json",
    ])?;
    let r: Value = serde_json::from_str(stdout.trim())?;
    assert_eq!(r["bench"], "pg", "{r}");
    assert_eq!(r["base"], "advisory", "{r}");
    let rows = r["rows"].as_array().ok_or("no rows")?;
    let cases = ["sequential", "tasks", "tutorial", "timed"];
    let ways = ["advisory", "pg", "redis", "redis-hand-off"];
    assert_eq!(rows.len(), cases.len() * ways.len(), "{r}");
    for case in cases {
        for way in ways {
            let row = rows
                .iter()
                .find(|row| row["case"] == case && row["way"] == way)
                .ok_or_else(|| format!("no {case} row for {way} in {r}"))?;
            let median = |key: &str| row[key]["median"].as_f64().ok_or(format!("{key} in {row}"));
            assert!(median("per_s")? > 0.0, "{row}");
            assert!(median("p50_us")? <= median("p99_us")?, "{row}");
            if way == "advisory" {
                assert_eq!(row["per_s_ratio"], 1.0, "{row}");
            }
            assert!(median("leases")? > 0.0, "{row}");
            let on_postgres = way == "advisory" || way == "pg";
            if matches!(case, "sequential" | "tutorial") && on_postgres {
                // The lock's own statements, counted by pg_stat_statements:
                // lock and unlock; take, release and its notification (and
                // a waiter's tries, and any retry a slow machine makes the
                // locker send).
                let statements = median("statements_per_lease")?;
                if way == "advisory" {
                    assert_eq!(statements, 2.0, "{row}");
                } else {
                    assert!(statements >= 3.0, "{row}");
                }
                assert!(median("wal_bytes_per_lease")? >= 0.0, "{row}");
                median("dead_tuples_per_lease")?;
            } else {
                assert!(row.get("statements_per_lease").is_none(), "{row}");
            }
            if case == "tutorial" {
                assert_eq!(median("gave_up")?, 0.0, "{row}");
                assert!(median("elapsed_ms")? > 0.0, "{row}");
                // Each caller takes the lock once: no fairness figure.
                assert!(row["fairness"]["median"].is_null(), "{row}");
            }
            if case == "timed" {
                // The most leases one caller got over the fewest: at least
                // 1, or "inf" when one got none (a busy machine's 300 ms).
                let fairness = &row["fairness"]["median"];
                assert!(
                    fairness.as_f64().is_some_and(|f| f >= 1.0) || fairness == "inf",
                    "{row}"
                );
            }
        }
    }
    assert_eq!(r["target"]["at_most"], 1.5, "{r}");
    assert!(r["target"]["ratio"].as_f64().is_some(), "{r}");
    let hot = &r["hot"];
    assert_eq!(hot["leases"], 20, "{r}");
    for figure in ["size_bytes", "live_tuples", "dead_tuples", "autovacuums"] {
        assert!(hot["after"][figure].is_i64(), "{figure} in {hot}");
    }
    Ok(())
}

#[test]
fn bench_contention_smoke_has_cluster_rows_next_to_the_single_server_ones() -> TestResult {
    let callers = 3;
    let stdout = succeeded(&[
        "bench",
        "contention",
        "-n",
        &callers.to_string(),
        "--rounds",
        "1",
        "--work",
        "1ms",
        "--duration",
        "100ms",
        "--json",
    ])?;
    let r: Value = serde_json::from_str(stdout.trim())?;
    assert_eq!(r["bench"], "contention", "{r}");
    let rows = r["medians"].as_array().ok_or("no medians")?;
    let polling = ["tuned", "cluster-tuned"];
    let handoff = [
        "hand-off",
        "cluster-hand-off",
        "cluster-hand-off-2p",
        "cluster-hand-off-fifo",
    ];
    for workload in ["burst", "tutorial", "timed"] {
        for mode in polling.iter().chain(&handoff) {
            let row = rows
                .iter()
                .find(|row| row["workload"] == workload && row["mode"] == *mode)
                .ok_or_else(|| format!("no {workload} row for {mode} in {r}"))?;
            let num = |key: &str| row[key].as_f64().ok_or(format!("{key} in {row}"));
            let acquisitions = num("acquisitions")?;
            if workload == "timed" {
                assert!(acquisitions >= 1.0, "{row}");
            } else {
                // Every caller took the lock once; none gave up.
                assert_eq!(acquisitions, f64::from(callers), "{row}");
            }
            assert_eq!(num("gave_up")?, 0.0, "{row}");
            // One holder at a time: the lock was held at most all the time.
            let util = num("utilisation")?;
            assert!(util > 0.0 && util <= 1.0, "{row}");
            // Redis confirmed every lease: at least one request each, and
            // polling also sends a release per lease.
            let floor = if polling.contains(mode) { 2.0 } else { 1.0 };
            assert!(num("round_trips_per_acq")? >= floor, "{row}");
            assert!(num("redis_cpu_us_per_acq")? > 0.0, "{row}");
        }
    }
    Ok(())
}

#[test]
fn bench_contention_refuses_a_tls_cluster_seed_before_starting_anything() -> TestResult {
    let out = leasehold(&[
        "bench",
        "contention",
        "--cluster-url",
        "redis://127.0.0.1:1,rediss://user:hunter2@127.0.0.1:2",
    ])?;
    let stderr = String::from_utf8(out.stderr)?;
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--cluster-url"), "{stderr}");
    assert!(!stderr.contains("hunter2"), "{stderr}");
    assert!(!stderr.contains("started a throwaway"), "{stderr}");
    Ok(())
}

#[test]
fn bench_guard_smoke_prints_one_line_per_link_and_mode() -> TestResult {
    let stdout = succeeded(&[
        "bench",
        "guard",
        "--duration",
        "50ms",
        "--rounds",
        "1",
        "--tasks",
        "2",
        "--json",
    ])?;
    let lines: Vec<Value> = stdout
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    let modes: Vec<(&str, &str)> = lines
        .iter()
        .filter_map(|r| Some((r["link"].as_str()?, r["mode"].as_str()?)))
        .collect();
    let each = [
        "unguarded",
        "guarded-term",
        "guarded-new",
        "for-update",
        "lease",
        "lease-row",
    ];
    let expected: Vec<(&str, &str)> = ["direct", "proxied"]
        .into_iter()
        .flat_map(|link| each.map(|mode| (link, mode)))
        .collect();
    assert_eq!(modes, expected);
    for r in &lines {
        for key in [
            "sequential_debits_per_s",
            "concurrent_debits_per_s",
            "p50_us",
        ] {
            assert!(r[key].as_f64().is_some_and(|x| x > 0.0), "{key} in {r}");
        }
        for key in ["sequential_ratio", "concurrent_ratio"] {
            assert!(
                r[key]["median"].as_f64().is_some_and(|x| x > 0.0),
                "{key} in {r}"
            );
        }
        // Counted through the proxy only: BEGIN, the read (the guard
        // pipelined with it), the update, COMMIT at least.
        let round_trips = r["round_trips_per_debit"].as_f64();
        if r["link"] == "proxied" {
            assert!(round_trips.is_some_and(|n| n >= 4.0), "{r}");
        } else {
            assert_eq!(round_trips, None, "{r}");
        }
    }
    Ok(())
}

#[test]
fn ttl_without_the_watchdog_breaks_and_every_release_is_refused() -> TestResult {
    let reports = runs(&["ttl"])?;
    assert_eq!(reports.len(), 1);
    let r = &reports[0];
    assert_eq!(r["experiment"], "ttl", "{r}");
    assert_eq!(r["ok"], false, "{r}");
    assert_eq!(r["accepted"], 5, "{r}");
    assert_eq!(r["expected"], 50, "{r}");
    // Every 300 ms spend outlived its 100 ms lease.
    assert_eq!(r["stale_releases"], 5, "{r}");
    assert_eq!(r["lost"], 0, "{r}");
    assert_eq!(r["errors"], 0, "{r}");
    Ok(())
}

#[test]
fn ttl_with_the_watchdog_serialises_the_callers() -> TestResult {
    let r = &runs(&["ttl", "--watchdog"])?[0];
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["accepted"], 5, "{r}");
    assert_eq!(r["balance"], 50, "{r}");
    assert_eq!(r["stale_releases"], 0, "{r}");
    assert_eq!(r["lost"], 0, "{r}");
    assert_eq!(r["errors"], 0, "{r}");
    Ok(())
}

#[test]
fn ttl_prints_the_tutorials_lines() -> TestResult {
    // The second caller gets in ~10 ms after the first, which writes at 300 ms.
    let stdout = finished(&["ttl", "-n", "2", "--work", "300ms", "--ttl", "10ms"])?;
    let mut lines = stdout.lines();
    assert_eq!(
        lines.next(),
        Some("accepted=2 balance=90 expected=80 BROKEN"),
        "{stdout}"
    );
    let figures = lines.next().unwrap_or_default();
    assert!(
        figures.starts_with("refused stale releases=2 lost=0 elapsed="),
        "{stdout}"
    );
    Ok(())
}

#[test]
fn demo_matches_the_tutorial() -> TestResult {
    // Output captured, not a terminal: the demo runs long enough for a
    // bar, and none may show, in stdout or stderr.
    let out = leasehold(&["demo"])?;
    let (stdout, stderr) = (
        String::from_utf8(out.stdout)?,
        String::from_utf8(out.stderr)?,
    );
    assert!(out.status.success(), "{stderr}\n{stdout}");
    for text in [&stdout, &stderr] {
        assert!(!text.contains("demo ["), "{text}");
        assert!(!text.contains('\r') && !text.contains('\x1b'), "{text:?}");
    }
    assert!(stdout.contains("tutorial shows"), "{stdout}");
    assert!(
        stdout.contains("steps show what the tutorial shows"),
        "{stdout}"
    );
    assert!(!stdout.contains(" NO"), "{stdout}");
    assert!(stdout.contains("backoff: full jitter"), "{stdout}");
    assert!(stdout.contains("backoff: hand-off"), "{stdout}");
    Ok(())
}

#[test]
fn demo_json_is_one_object_per_step_and_a_summary() -> TestResult {
    let stdout = succeeded(&["demo", "--json"])?;
    let lines: Vec<Value> = stdout
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    let (summary, steps) = lines.split_last().ok_or("no output")?;
    assert_eq!(
        summary["steps"].as_u64(),
        Some(steps.len() as u64),
        "{summary}"
    );
    assert_eq!(summary["matching"], summary["steps"], "{summary}");
    for step in steps {
        assert_eq!(step["matches"], true, "{step}");
        assert!(step["report"]["experiment"].is_string(), "{step}");
    }
    assert_eq!(steps.len(), 18, "{stdout}");
    Ok(())
}

#[test]
fn given_redis_url_is_used_and_its_password_never_printed() -> TestResult {
    let server = RedisServer::start_with(RedisOptions::default().password("hunter2-secret"))?;
    let out = leasehold(&["lock", "--redis-url", &server.url(), "--json"])?;
    let (stdout, stderr) = (
        String::from_utf8(out.stdout)?,
        String::from_utf8(out.stderr)?,
    );
    assert!(out.status.success(), "{stderr}");
    let r: Value = serde_json::from_str(stdout.trim())?;
    assert_eq!(r["ok"], true);
    assert!(
        !stderr.contains("throwaway"),
        "started its own server: {stderr}"
    );

    let wrong = format!("redis://:wrong-secret@127.0.0.1:{}/", server.port());
    let out = leasehold(&["lock", "--redis-url", &wrong])?;
    let stderr = String::from_utf8(out.stderr)?;
    assert!(!out.status.success());
    assert!(stderr.contains("authentication failed"), "{stderr}");
    assert!(
        !stderr.contains("wrong-secret"),
        "password leaked: {stderr}"
    );
    assert!(stderr.contains(":***@"), "{stderr}");
    Ok(())
}

#[test]
fn unreachable_redis_is_a_clear_error() -> TestResult {
    let port = leasehold_testkit::free_port()?;
    let url = format!("redis://127.0.0.1:{port}/");
    let out = leasehold(&["race", "--redis-url", &url])?;
    let stderr = String::from_utf8(out.stderr)?;
    assert!(!out.status.success());
    assert!(stderr.contains("unreachable"), "{stderr}");
    Ok(())
}

#[test]
fn bad_flags_are_rejected_before_any_work() -> TestResult {
    for args in [
        &["lock", "--ttl", "soon"][..],
        &["race", "-n", "0"],
        &["race", "--runs", "0"],
        &["lock", "--ttl", "0ms"],
        &["lock", "--ttl", "900us"],
        &["ttl", "--ttl", "0s"],
        &["ttl", "-n", "0"],
        &["redlock", "--nodes", "4"],
        &["redlock", "--fault", "flood"],
    ] {
        let out = leasehold(args)?;
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            !String::from_utf8(out.stderr)?.contains("throwaway"),
            "{args:?}"
        );
    }
    let stderr = String::from_utf8(leasehold(&["lock", "--ttl", "0ms"])?.stderr)?;
    assert!(stderr.contains("invalid lock ttl"), "{stderr}");
    Ok(())
}

/// The fence printed after `prefix` on a line of `stdout`.
fn fence_after(stdout: &str, prefix: &str) -> Result<u64, Box<dyn std::error::Error>> {
    let rest = stdout
        .lines()
        .find_map(|line| line.strip_prefix(prefix))
        .ok_or_else(|| format!("no line starting {prefix:?} in\n{stdout}"))?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    Ok(digits.parse()?)
}

#[test]
fn fencing_prints_the_tutorial_lines_and_refuses_the_stale_writer() -> TestResult {
    let stdout = succeeded(&["fencing"])?;
    let a = fence_after(&stdout, "A: got the lock, fence ")?;
    let b = fence_after(&stdout, "B: got the lock, fence ")?;
    assert!(a < b, "{a} then {b} in\n{stdout}");
    for line in [
        format!("A: got the lock, fence {a}, read balance 100"),
        "A: paused for 250ms (GC pause, slow network, stopped VM)".to_owned(),
        format!("B: got the lock, fence {b}, read balance 100"),
        format!("B: wrote balance 90 with fence {b}"),
        "A: wakes up and carries on".to_owned(),
        format!("A: write with fence {a} REJECTED"),
        format!("final: balance=90 fence={b} (two spends of 10 were attempted)"),
        "accepted=1 balance=90 expected=90 OK".to_owned(),
    ] {
        assert!(stdout.contains(&line), "missing {line:?} in\n{stdout}");
    }

    let r = &runs(&["fencing", "--unfenced"])?[0];
    assert_eq!(r["ok"], false, "{r}");
    assert_eq!(r["accepted"], 2, "{r}");
    assert_eq!(r["balance"], 90, "{r}");
    assert_eq!(r["ledger_sum"], 20, "{r}");
    assert!(r["fence"].as_u64().is_some_and(|f| f > 0), "{r}");
    Ok(())
}

#[test]
fn verify_with_the_version_check_is_ok_on_20_broken_leases() -> TestResult {
    let reports = runs(&["verify", "--ttl", "1ms", "--same-version", "--runs", "20"])?;
    assert_eq!(reports.len(), 20);
    for r in &reports {
        assert_eq!(r["ok"], true, "{r}");
        assert_eq!(r["mode"], "cas", "{r}");
        assert_eq!(r["ttl_ms"], 1, "{r}");
        assert_eq!(r["errors"], 0, "{r}");
        // Balance, ledger and accepted count agree; how many of the 50 get
        // through (10 on a quiet machine, as the tutorial shows) depends on
        // how many were refused as stale, which grows with load.
        let accepted = r["accepted"].as_i64().ok_or("accepted")?;
        assert!((1..=10).contains(&accepted), "{r}");
        assert_eq!(r["balance"].as_i64(), Some(100 - 10 * accepted), "{r}");
        assert_eq!(r["ledger_count"].as_i64(), Some(accepted), "{r}");
        assert_eq!(r["ledger_sum"].as_i64(), Some(10 * accepted), "{r}");
        assert!(r["rejected"].is_u64(), "{r}");
    }
    Ok(())
}

#[test]
fn verify_inside_the_fence_guard_is_ok_on_20_broken_leases_while_fenced_alone_is_broken()
-> TestResult {
    let reports = runs(&["verify", "--ttl", "1ms", "--mode", "guard", "--runs", "20"])?;
    assert_eq!(reports.len(), 20);
    for r in &reports {
        // No lost or duplicated debit: balance, ledger and accepted count
        // agree. (How many of the 50 get through depends on how many were
        // refused as stale, which grows with the machine's load.)
        assert_eq!(r["ok"], true, "{r}");
        assert_eq!(r["mode"], "guard", "{r}");
        // A spender stalled over a second inside its transaction (a cold
        // start of 50 connections on a busy machine) has its session ended
        // by the guard's idle bound: nothing committed, counted apart, not
        // an error.
        assert_eq!(r["errors"], 0, "{r}");
        assert!(r["ended"].is_u64(), "{r}");
        let accepted = r["accepted"].as_i64().ok_or("accepted")?;
        assert!((1..=10).contains(&accepted), "{r}");
        assert_eq!(r["balance"].as_i64(), Some(100 - 10 * accepted), "{r}");
        assert_eq!(r["ledger_count"].as_i64(), Some(accepted), "{r}");
        assert_eq!(r["ledger_sum"].as_i64(), Some(10 * accepted), "{r}");
    }
    // The tutorial's fenced-only write under the same broken lease: the
    // negative control for this comparison.
    let fenced = runs(&["verify", "--ttl", "1ms", "--mode", "fenced", "--runs", "3"])?;
    assert!(
        fenced.iter().any(|r| r["ok"] == false),
        "fenced alone at 1 ms should show BROKEN: {fenced:?}"
    );
    Ok(())
}

#[test]
fn verify_modes_without_redis_are_ok_and_the_control_is_broken() -> TestResult {
    for mode in ["for-update", "single"] {
        let r = &runs(&["verify", "--mode", mode, "--runs", "2"])?;
        for r in r {
            assert_eq!(r["ok"], true, "{r}");
            assert_eq!(r["redis_lock"], false, "{r}");
            assert_eq!(r["accepted"], 10, "{r}");
        }
    }
    // Negative control: no lock, no check. The ledger keeps every
    // acknowledged debit, so the lost updates show.
    let r = &runs(&["verify", "--mode", "none"])?[0];
    assert_eq!(r["ok"], false, "{r}");
    assert_eq!(r["accepted"], 50, "{r}");
    assert_eq!(r["ledger_sum"], 500, "{r}");
    Ok(())
}

#[test]
fn experiments_without_postgres_do_not_start_it() -> TestResult {
    for args in [&["race", "-n", "2"][..], &["lock", "-n", "2"]] {
        let out = leasehold(args)?;
        let stderr = String::from_utf8(out.stderr)?;
        assert!(matches!(out.status.code(), Some(0 | 1)), "{stderr}");
        assert!(!stderr.contains("postgres"), "{args:?}: {stderr}");
    }
    Ok(())
}

#[test]
fn a_postgres_refusal_says_the_servers_words_and_sqlstate_without_the_password() -> TestResult {
    let server = leasehold_testkit::PostgresServer::start()?;
    let url = format!(
        "postgres://{}:pg-wrong-secret-7@127.0.0.1:{}/postgres",
        server.user(),
        server.port()
    );
    let out = leasehold(&["verify", "--database-url", &url, "--json"])?;
    let stderr = String::from_utf8(out.stderr)?;
    assert!(!out.status.success(), "{stderr}");
    // tokio-postgres says only "db error"; the server said why, and its
    // SQLSTATE (28P01 invalid_password).
    assert!(
        stderr.contains("password authentication failed for user"),
        "{stderr}"
    );
    assert!(stderr.contains("(sqlstate 28P01)"), "{stderr}");
    assert!(
        !stderr.contains("pg-wrong-secret-7") && !stderr.contains(server.password()),
        "password leaked: {stderr}"
    );
    Ok(())
}

#[test]
fn unreachable_postgres_is_a_clear_error_without_the_password() -> TestResult {
    let port = leasehold_testkit::free_port()?;
    let url = format!("postgres://app:pg-secret-42@127.0.0.1:{port}/app");
    let out = leasehold(&["verify", "--database-url", &url])?;
    let stderr = String::from_utf8(out.stderr)?;
    assert!(!out.status.success());
    assert!(stderr.contains("postgresql unreachable"), "{stderr}");
    assert!(
        !stderr.contains("pg-secret-42"),
        "password leaked: {stderr}"
    );
    assert!(!stderr.contains("throwaway postgres"), "{stderr}");

    let out = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["fencing"])
        .env_remove("REDIS_URL")
        .env("DATABASE_URL", &url)
        .output()?;
    let stderr = String::from_utf8(out.stderr)?;
    assert!(!out.status.success());
    assert!(stderr.contains("postgresql unreachable"), "{stderr}");
    assert!(
        !stderr.contains("pg-secret-42"),
        "password leaked: {stderr}"
    );
    Ok(())
}

#[test]
fn a_key_value_or_query_password_never_shows_in_errors() -> TestResult {
    let port = leasehold_testkit::free_port()?;
    for url in [
        format!("host=127.0.0.1 port={port} user=app password=kv-secret-7 dbname=app"),
        format!("host=127.0.0.1 port={port} user=app password='kv secret-7' dbname=app"),
        format!("postgres://127.0.0.1:{port}/app?user=app&password=kv-secret-7"),
    ] {
        let out = leasehold(&["verify", "--database-url", &url])?;
        let stderr = String::from_utf8(out.stderr)?;
        assert!(!out.status.success(), "{url}");
        assert!(!stderr.contains("secret-7"), "password leaked: {stderr}");
    }
    Ok(())
}

#[test]
fn exit_codes_say_ok_broken_usage_and_server_error() -> TestResult {
    assert_eq!(leasehold(&["lock"])?.status.code(), Some(0), "OK");
    assert_eq!(leasehold(&["race"])?.status.code(), Some(1), "BROKEN");
    assert_eq!(
        leasehold(&["lock", "--no-such-flag"])?.status.code(),
        Some(2)
    );
    let out = leasehold(&["verify", "--same-version", "--mode", "single"])?;
    assert_eq!(out.status.code(), Some(2), "flags that do not go together");
    let port = leasehold_testkit::free_port()?;
    let url = format!("redis://127.0.0.1:{port}/");
    let out = leasehold(&["lock", "--redis-url", &url])?;
    assert_eq!(out.status.code(), Some(3), "redis unreachable");
    let help = String::from_utf8(leasehold(&["--help"])?.stdout)?;
    assert!(help.contains("Exit codes:"), "{help}");
    Ok(())
}

#[test]
fn same_version_with_a_database_only_mode_is_rejected_before_any_work() -> TestResult {
    let out = leasehold(&["verify", "--same-version", "--mode", "single"])?;
    let stderr = String::from_utf8(out.stderr)?;
    assert!(!out.status.success());
    assert!(
        stderr.contains("--same-version means --mode cas"),
        "{stderr}"
    );
    assert!(!stderr.contains("throwaway"), "{stderr}");
    Ok(())
}

#[test]
fn failover_grants_the_lock_twice_and_the_database_catches_it() -> TestResult {
    let stdout = succeeded(&["failover"])?;
    let a = fence_after(&stdout, "A: got lock:{wallet:42} on the primary, fence ")?;
    let b = fence_after(
        &stdout,
        "B: got lock:{wallet:42} on the promoted replica, fence ",
    )?;
    // The promoted replica never saw A's token, yet issues a higher one.
    assert!(a < b, "{a} then {b} in\n{stdout}");
    for line in [
        format!("A: got lock:{{wallet:42}} on the primary, fence {a}, read balance 100"),
        format!("B: got lock:{{wallet:42}} on the promoted replica, fence {b}, read balance 100"),
        format!(
            "two holders of lock:{{wallet:42}}: A (fence {a}, on the dead primary) and B (fence {b}, on the promoted replica): the Redis docs' SAFETY VIOLATION"
        ),
        format!("A: write with fence {a} REJECTED by the database"),
        "accepted=1 balance=90 expected=90 OK".to_owned(),
    ] {
        assert!(stdout.contains(&line), "missing {line:?} in\n{stdout}");
    }

    let r = &runs(&["failover"])?[0];
    assert_eq!(r["holders"], 2, "{r}");
    assert_eq!(r["refused_by_database"], 1, "{r}");
    assert_eq!(r["not_replicated"], false, "{r}");
    let (fence_a, fence_b) = (r["fence_a"].as_u64(), r["fence_b"].as_u64());
    assert!(fence_a.zip(fence_b).is_some_and(|(a, b)| a < b), "{r}");
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["balance"], 90, "{r}");
    assert_eq!(r["ledger_count"], 1, "{r}");
    Ok(())
}

#[test]
fn failover_without_the_database_check_loses_an_update() -> TestResult {
    let r = &runs(&["failover", "--unfenced"])?[0];
    assert_eq!(r["holders"], 2, "{r}");
    assert_eq!(r["refused_by_database"], 0, "{r}");
    assert_eq!(r["ok"], false, "{r}");
    assert_eq!(r["accepted"], 2, "{r}");
    assert_eq!(r["balance"], 90, "{r}");
    assert_eq!(r["expected"], 80, "{r}");
    Ok(())
}

#[test]
fn failover_waiting_for_the_replica_refuses_the_lock_and_ignores_redis_url() -> TestResult {
    let out = leasehold(&[
        "failover",
        "--wait-replicas",
        "1",
        "--json",
        "--redis-url",
        "redis://127.0.0.1:1/",
    ])?;
    let stderr = String::from_utf8(out.stderr)?;
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("--redis-url is ignored"), "{stderr}");
    let r: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(r["not_replicated"], true, "{r}");
    assert_eq!(r["holders"], 1, "{r}");
    assert_eq!(r["fence_a"], Value::Null, "{r}");
    assert_eq!(r["refused_by_database"], 0, "{r}");
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["balance"], 90, "{r}");
    Ok(())
}

#[test]
fn redlock_keeps_the_balance_with_a_node_paused_or_killed() -> TestResult {
    for (nodes, fault) in [("3", "pause"), ("5", "kill")] {
        let r = &runs(&["redlock", "--nodes", nodes, "--fault", fault, "-n", "20"])?[0];
        assert_eq!(r["ok"], true, "{r}");
        assert_eq!(r["errors"], 0, "{r}");
        assert_eq!(r["accepted"], 10, "{r}");
        assert_eq!(r["balance"], 0, "{r}");
        assert_eq!(r["ledger_count"], 10, "{r}");
        assert_eq!(r["fault"], fault, "{r}");
        assert_eq!(r["fault_injected"], true, "{r}");
        assert_eq!(r["fault_after"], 10, "{r}");
        assert!(
            r["acquire_p99_us"].as_u64() >= r["acquire_p50_us"].as_u64(),
            "{r}"
        );
    }
    Ok(())
}

#[test]
fn a_ttl_below_the_p99_hold_time_is_reported_once() -> TestResult {
    let out = leasehold(&["ttl", "--runs", "2"])?;
    let stderr = String::from_utf8(out.stderr)?;
    assert_eq!(
        stderr.matches("is shorter than the p99 hold time").count(),
        1,
        "{stderr}"
    );
    // A watchdog refreshes the lease, so holding it past the TTL is fine.
    let out = leasehold(&["ttl", "--watchdog"])?;
    let stderr = String::from_utf8(out.stderr)?;
    assert!(!stderr.contains("p99 hold time"), "{stderr}");
    Ok(())
}
