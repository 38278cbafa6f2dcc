//! `leasehold chaos` on PostgreSQL as the lock service: `PgLocker` with
//! the fence guard and its lease-row check (mode `pg`, and `pg-pgbouncer`
//! through PgBouncer in transaction mode), and its negative control, a
//! `PgLocker` lease without a fence and a blind write (`pg-blind`), under
//! the pg faults. Short runs: a TTL of 500 ms, so a window lasts 1.5 s
//! and a run 5 s; every acquire waits up to 5 s, longer than any window.

mod common;
use common::{chaos_matrix, row};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// The flags every run here shares.
const SHORT_RUNS: [&str; 12] = [
    "--ttl",
    "500ms",
    "--wait",
    "5s",
    // Between a holder's read and its write: long enough that a lease
    // ended under a holder meets its successor's read before its write,
    // on a loaded machine too.
    "--work",
    "50ms",
    "--duration",
    "5s",
    "--workers",
    "2",
    "--tasks",
    "3",
];

/// `--modes modes --faults faults` and the short runs' flags: the rows
/// (exit 0 required: every safe row held, every control caught).
fn matrix(modes: &str, faults: &str) -> Result<Vec<serde_json::Value>, Box<dyn std::error::Error>> {
    let mut args = vec!["--modes", modes, "--faults", faults];
    args.extend_from_slice(&SHORT_RUNS);
    Ok(chaos_matrix(&args)?.0)
}

/// Safe: no violation and something written; `errors_ok`: and no error
/// returned to a caller.
fn assert_safe(safe: &serde_json::Value, errors_ok: bool) {
    assert_eq!(safe["violations"], 0, "{safe}");
    assert!(safe["accepted"].as_u64() > Some(0), "{safe}");
    if errors_ok {
        assert_eq!(safe["errors"], "ok", "{safe}");
        for call in ["acquire_errors", "release_errors", "refresh_errors"] {
            assert_eq!(safe[call], 0, "{call}: {safe}");
        }
    }
}

/// A holder paused past its TTL and the lease rows deleted by hand make
/// two holders: the control (no fence, a blind write) loses debits under
/// the pause, the guard with its lease-row check absorbs every one, and
/// no caller sees an error.
#[test]
fn the_pg_way_holds_and_the_blind_control_is_caught() -> TestResult {
    let rows = matrix("pg,pg-blind", "holder-pause,pg-row-delete")?;
    let control = row(&rows, "pg-blind", "holder-pause")?;
    assert_eq!(control["status"], "control_caught", "{control}");
    assert!(control["overlaps"].as_u64() > Some(0), "{control}");
    for fault in ["holder-pause", "pg-row-delete"] {
        assert_safe(row(&rows, "pg", fault)?, true);
    }
    Ok(())
}

/// The callers' backends ended, the lease table locked by a migration,
/// the database's clock stepped forward, a crash: the pg way loses
/// nothing. Errors to callers are judged where the database keeps
/// answering (a crash refuses connections until it has recovered).
#[test]
fn the_pg_way_loses_nothing_under_the_databases_faults() -> TestResult {
    let rows = matrix("pg", "pg-backend-kill,pg-table-lock,pg-clock-step,pg-crash")?;
    for fault in ["pg-backend-kill", "pg-table-lock", "pg-clock-step"] {
        assert_safe(row(&rows, "pg", fault)?, true);
    }
    assert_safe(row(&rows, "pg", "pg-crash")?, false);
    Ok(())
}

/// Through PgBouncer in transaction mode (the locker's waiters poll): a
/// holder paused past its TTL is absorbed with no error to a caller, and
/// PgBouncer restarted loses nothing.
#[test]
fn the_pg_way_holds_through_pgbouncer() -> TestResult {
    let rows = matrix("pg-pgbouncer", "holder-pause,pgbouncer-restart")?;
    assert_safe(row(&rows, "pg-pgbouncer", "holder-pause")?, true);
    assert_safe(row(&rows, "pg-pgbouncer", "pgbouncer-restart")?, false);
    Ok(())
}
