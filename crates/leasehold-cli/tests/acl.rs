//! The CLI's Redis experiments under exactly the ACL the README states for
//! them, and the keys they change against what their `--help` names.

use std::collections::BTreeSet;
use std::time::Duration;

use leasehold_testkit::{PostgresServer, RedisServer};
use serde_json::Value;

mod common;
use common::leasehold;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// The experiments, with flags that keep them short; `verify` waits long
/// enough for its callers to queue behind one another on a busy machine
/// (this test is about the ACL, not about how long a caller waits).
const EXPERIMENTS: &[&[&str]] = &[
    &["race"],
    &["lock"],
    &["ttl", "-n", "2"],
    &["ttl", "-n", "2", "--watchdog"],
    &["backoff"],
    &["backoff", "--jitter"],
    &["backoff", "--handoff"],
    &["fencing"],
    &["verify", "-n", "20", "--wait", "60s"],
    &["verify", "-n", "20", "--wait", "60s", "--mode", "cas"],
    &["verify", "-n", "20", "--wait", "60s", "--mode", "guard"],
];

/// Runs `experiment` with `--json` on the given servers; returns its one
/// report, its stderr and its exit code.
fn run(
    experiment: &[&str],
    redis_url: &str,
    database_url: &str,
) -> Result<(Value, String, Option<i32>), Box<dyn std::error::Error>> {
    let mut args = experiment.to_vec();
    args.extend(["--json", "--redis-url", redis_url]);
    if matches!(experiment[0], "fencing" | "verify") {
        args.extend(["--database-url", database_url]);
    }
    let out = leasehold(&args)?;
    let stderr = String::from_utf8(out.stderr)?;
    let stdout = String::from_utf8(out.stdout)?;
    let report = serde_json::from_str(stdout.trim())
        .map_err(|err| format!("{experiment:?}: {err}\nstdout: {stdout}\nstderr: {stderr}"))?;
    Ok((report, stderr, out.status.code()))
}

/// The `ACL SETUSER locker ...` lines of the README, in order: the lock
/// user's minimal ACL, then what the CLI's experiments add to it.
fn readme_acl() -> Result<Vec<Vec<String>>, Box<dyn std::error::Error>> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))?;
    let lines: Vec<Vec<String>> = readme
        .lines()
        .filter(|line| line.starts_with("ACL SETUSER locker "))
        .map(|line| {
            line.split_whitespace()
                .map(|word| {
                    if word == ">password" {
                        ">pw".to_owned()
                    } else {
                        word.to_owned()
                    }
                })
                .collect()
        })
        .collect();
    assert_eq!(lines.len(), 2, "the README's ACL lines: {lines:?}");
    Ok(lines)
}

fn set_user(server: &RedisServer, line: &[String]) -> TestResult {
    let args: Vec<&str> = line.iter().map(String::as_str).collect();
    assert_eq!(server.redis_cli(&args)?, "OK");
    Ok(())
}

#[test]
fn redis_experiments_run_under_the_minimal_acl_the_readme_states() -> TestResult {
    let (redis, postgres) = (RedisServer::start()?, PostgresServer::start()?);
    let acl = readme_acl()?;
    for line in &acl {
        set_user(&redis, line)?;
    }
    let url = format!("redis://locker:pw@{}:{}/", redis.host(), redis.port());
    for experiment in EXPERIMENTS {
        let (r, stderr, code) = run(experiment, &url, &postgres.url())?;
        assert_eq!(r["errors"], 0, "{experiment:?}: {r}\n{stderr}");
        let expected = if r["ok"] == true { 0 } else { 1 };
        assert_eq!(code, Some(expected), "{experiment:?}: {r}\n{stderr}");
        // No error, neither the CLI's (`error: ...`) nor a logged one (the
        // metrics summary's `error=0` is a count, not one).
        let failed = |line: &str| line.starts_with("error") || line.contains("ERROR");
        assert!(!stderr.lines().any(failed), "{experiment:?}: {stderr}");
        assert!(!stderr.contains("throwaway"), "{experiment:?}: {stderr}");
        // The user may not run INFO: the CLI says so and goes on.
        assert!(
            stderr.contains("cannot check the safety settings"),
            "{experiment:?}: {stderr}"
        );
        if experiment[0] == "backoff" {
            assert_eq!(r["redis_cpu_ms"], Value::Null, "{r}");
        }
    }
    // What the tutorial shows, under the ACL too.
    let (race, _, _) = run(&["race"], &url, &postgres.url())?;
    assert_eq!(race["ok"], false, "{race}");
    let (handoff, _, _) = run(&["backoff", "--handoff"], &url, &postgres.url())?;
    assert_eq!(handoff["gave_up"], 0, "{handoff}");
    assert_eq!(handoff["ok"], true, "{handoff}");

    let bench = leasehold(&[
        "bench",
        "uncontended",
        "--duration",
        "20ms",
        "--rounds",
        "1",
        "--tasks",
        "2",
        "--json",
        "--redis-url",
        &url,
    ])?;
    assert_eq!(bench.status.code(), Some(0), "{bench:?}");

    // Negative control: the lock user's ACL alone does not reach the
    // wallet, so the experiments are refused, as a server error (3).
    let bare = RedisServer::start()?;
    set_user(&bare, &acl[0])?;
    let bare_url = format!("redis://locker:pw@{}:{}/", bare.host(), bare.port());
    let out = leasehold(&["race", "--redis-url", &bare_url])?;
    let stderr = String::from_utf8(out.stderr)?;
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("setting the balance wallet:42:balance: NoPerm"),
        "{stderr}"
    );
    Ok(())
}

/// Every key written or deleted while `experiment` runs (keyspace
/// notifications, read up to a marker published after it exits).
fn keys_changed(
    redis: &RedisServer,
    experiment: &[&str],
    database_url: &str,
) -> Result<BTreeSet<String>, Box<dyn std::error::Error>> {
    const PREFIX: &str = "__keyspace@0__:";
    const DONE: &str = "leasehold-test:done";
    let client = redis::Client::open(redis.url())?;
    let mut conn = client.get_connection()?;
    let mut pubsub = conn.as_pubsub();
    pubsub.set_read_timeout(Some(Duration::from_secs(30)))?;
    pubsub.psubscribe(format!("{PREFIX}*"))?;
    pubsub.subscribe(DONE)?;
    let (r, stderr, _) = run(experiment, &redis.url(), database_url)?;
    assert_eq!(r["errors"], 0, "{experiment:?}: {r}\n{stderr}");
    redis.redis_cli(&["PUBLISH", DONE, "1"])?;
    let mut keys = BTreeSet::new();
    loop {
        let message = pubsub.get_message()?;
        let channel = message.get_channel_name();
        if channel == DONE {
            return Ok(keys);
        }
        if let Some(key) = channel.strip_prefix(PREFIX) {
            keys.insert(key.to_owned());
        }
    }
}

#[test]
fn experiments_change_only_the_keys_their_help_names() -> TestResult {
    let (redis, postgres) = (RedisServer::start()?, PostgresServer::start()?);
    redis.redis_cli(&["CONFIG", "SET", "notify-keyspace-events", "KA"])?;
    let mut seen = BTreeSet::new();
    for experiment in EXPERIMENTS {
        let keys = keys_changed(&redis, experiment, &postgres.url())?;
        let help = leasehold(&[experiment[0], "--help"])?;
        let help = String::from_utf8(help.stdout)?;
        let changes = help
            .split("What it changes")
            .nth(1)
            .and_then(|rest| rest.split("Exit codes:").next())
            .unwrap_or_default();
        for key in &keys {
            // Word ends: lock:wallet:42 must not pass for lock:wallet:42:waitq.
            let named = changes
                .split(|c: char| c.is_whitespace() || matches!(c, ',' | ';' | '(' | ')'))
                .map(|word| word.trim_end_matches('.'))
                .any(|word| word == key);
            assert!(
                named,
                "{experiment:?} changed {key}, which its --help does not name:\n{help}"
            );
        }
        seen.extend(keys);
    }
    // The check saw the keys it is about.
    for key in [
        "wallet:42:balance",
        "lock:wallet:42",
        "lock:{wallet:42}",
        "fence:{wallet:42}",
    ] {
        assert!(seen.contains(key), "{key} not seen: {seen:?}");
    }
    Ok(())
}
