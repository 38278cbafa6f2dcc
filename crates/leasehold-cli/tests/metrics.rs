//! `--metrics-addr` serves the library's metrics as Prometheus text while
//! a run lasts, and a long run ends with a metrics summary on stderr.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A hang detector, not a timing assertion.
const HUNG: Duration = Duration::from_secs(120);

/// One plain HTTP/1.0 GET; the whole response, or `None` while nothing
/// listens yet.
fn scrape(addr: &str) -> Option<String> {
    let mut stream = TcpStream::connect(addr).ok()?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: leasehold\r\n\r\n")
        .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    Some(response)
}

#[test]
fn a_run_serves_prometheus_metrics_and_ends_with_a_summary() -> TestResult {
    let addr = {
        let probe = TcpListener::bind("127.0.0.1:0")?;
        probe.local_addr()?.to_string()
    };
    // With the watchdog, the 5 callers of each run hold the lock one after
    // the other for 300 ms each: 4 runs last at least 6 s, a long run.
    let mut child = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["ttl", "--watchdog", "--runs", "4", "--json"])
        .args(["--metrics-addr", &addr])
        .env_remove("REDIS_URL")
        .env_remove("DATABASE_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;

    let started = Instant::now();
    let mut served = None;
    while served.is_none() && started.elapsed() < HUNG && child.try_wait()?.is_none() {
        match scrape(&addr) {
            Some(body) if body.contains("leasehold_acquire_seconds") => served = Some(body),
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    }
    if served.is_none() {
        let _ = child.kill();
    }
    let out = child.wait_with_output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let body = served.ok_or_else(|| format!("no metrics served on {addr}: {stderr}"))?;
    assert!(
        body.starts_with("HTTP/1.1 200") || body.starts_with("HTTP/1.0 200"),
        "{body}"
    );
    assert!(body.contains("# TYPE leasehold_acquire_seconds"), "{body}");
    assert!(body.contains(r#"outcome="acquired""#), "{body}");

    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("metrics: acquires=20 acquired=20 gave_up=0"),
        "{stderr}"
    );
    assert!(stderr.contains("metrics: gave up none"), "{stderr}");
    // stdout stays the run's JSON: one object per run, nothing else.
    let stdout = String::from_utf8(out.stdout)?;
    for line in stdout.lines() {
        serde_json::from_str::<serde_json::Value>(line)?;
    }
    assert_eq!(stdout.lines().count(), 4, "{stdout}");
    Ok(())
}

#[test]
fn an_address_that_is_not_host_and_port_is_a_usage_error() -> TestResult {
    let out = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["race", "--metrics-addr", "localhost"])
        .env_remove("REDIS_URL")
        .output()?;
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--metrics-addr"));
    Ok(())
}
