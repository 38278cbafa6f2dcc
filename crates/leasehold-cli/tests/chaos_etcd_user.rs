//! `leasehold chaos --modes etcd --etcd-endpoints https://...` against the
//! user's own etcd cluster: one the test kit starts as if it were the
//! user's, over TLS with client certificates required and etcd's
//! authentication on. The run writes there as the given user, the faults
//! that need the members' processes are skipped with a note naming them,
//! and what cannot work (a wrong password, flags that do not go
//! together) is an error with its exit code before anything runs, never
//! showing the password.

use std::process::{Command, Output};

use leasehold_testkit::{ClientAuth, EtcdCluster, TestCerts};
use serde_json::Value;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const USER: &str = "locker";
const PASSWORD: &str = "etcd-user-s3cret";
const ROOT_PASSWORD: &str = "etcd-root-s3cret";
const WRONG: &str = "etcd-wrong-s3cret";

/// Runs `leasehold chaos args` with `password` (if any) in
/// `LEASEHOLD_ETCD_PASSWORD`, without the caller's server URLs and TLS
/// files (as `common::leasehold`).
fn chaos(args: &[&str], password: Option<&str>) -> Result<Output, std::io::Error> {
    let mut command = Command::new(env!("CARGO_BIN_EXE_leasehold"));
    command
        .arg("chaos")
        .args(args)
        .env_remove("REDIS_URL")
        .env_remove("DATABASE_URL")
        .env_remove("LEASEHOLD_TLS_CA")
        .env_remove("LEASEHOLD_TLS_CERT")
        .env_remove("LEASEHOLD_TLS_KEY")
        .env_remove("LEASEHOLD_ETCD_PASSWORD");
    if let Some(password) = password {
        command.env("LEASEHOLD_ETCD_PASSWORD", password);
    }
    command.output()
}

/// stdout and stderr, checked for every password.
fn texts(out: &Output) -> (String, String) {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    for secret in [PASSWORD, ROOT_PASSWORD, WRONG] {
        assert!(!stdout.contains(secret), "a password in {stdout}");
        assert!(!stderr.contains(secret), "a password in {stderr}");
    }
    (stdout, stderr)
}

/// A one-member etcd over TLS (client certificates required), `USER`
/// allowed to read and write under `leasehold`, authentication on.
fn users_etcd(certs: &TestCerts) -> Result<EtcdCluster, leasehold_testkit::Error> {
    let cluster = EtcdCluster::start_tls(1, &certs.server().client_auth(ClientAuth::Required))?;
    cluster
        .member(0)
        .add_user(USER, PASSWORD, "leasehold", true)?;
    cluster.member(0).enable_auth(ROOT_PASSWORD)?;
    Ok(cluster)
}

/// `--etcd-endpoints` and the TLS flags for `cluster`, as `USER`.
fn etcd_flags(cluster: &EtcdCluster, certs: &TestCerts) -> Vec<String> {
    vec![
        "--etcd-endpoints".to_owned(),
        cluster.endpoints().join(","),
        "--etcd-tls-ca".to_owned(),
        certs.ca().display().to_string(),
        "--etcd-tls-cert".to_owned(),
        certs.client_cert().display().to_string(),
        "--etcd-tls-key".to_owned(),
        certs.client_key().display().to_string(),
        "--etcd-user".to_owned(),
        USER.to_owned(),
    ]
}

/// A short etcd run: etcd grants whole seconds, so the TTL is 1 s.
const SHORT: [&str; 10] = [
    "--ttl",
    "1s",
    "--wait",
    "5s",
    "--duration",
    "2s",
    "--workers",
    "2",
    "--tasks",
    "2",
];

#[test]
fn the_etcd_mode_runs_on_the_users_etcd_and_skips_the_process_faults() -> TestResult {
    let certs = TestCerts::generate()?;
    let cluster = users_etcd(&certs)?;
    let before = cluster.member(0).status()?.revision;
    let flags = etcd_flags(&cluster, &certs);
    let mut args: Vec<&str> = vec![
        "--json",
        "--modes",
        "etcd",
        "--faults",
        "none,etcd-revoke,etcd-leader-kill,etcd-restart",
    ];
    args.extend(flags.iter().map(String::as_str));
    // The skipped faults' windows must fit the run too (the matrix checks
    // every chosen fault's): a TTL of 100 ms, which etcd rounds up to its
    // whole second.
    args.extend(["--ttl", "100ms", "--wait", "5s", "--duration", "2s"]);
    args.extend(["--workers", "2", "--tasks", "2"]);
    let out = chaos(&args, Some(PASSWORD))?;
    let (stdout, stderr) = texts(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let rows: Vec<Value> = stdout
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    let none = rows
        .iter()
        .find(|r| r["mode"] == "etcd" && r["fault"] == "none")
        .ok_or_else(|| format!("no etcd x none row in {stdout}"))?;
    assert_eq!(none["violations"], 0, "{none}");
    assert!(none["accepted"].as_u64() > Some(0), "{none}");
    // The revoke needs etcd's API only: it ran there, as the user.
    let revoked = rows
        .iter()
        .find(|r| r["mode"] == "etcd" && r["fault"] == "etcd-revoke")
        .ok_or_else(|| format!("no etcd x etcd-revoke row in {stdout}"))?;
    assert_eq!(revoked["violations"], 0, "{revoked}");
    assert!(revoked["accepted"].as_u64() > Some(0), "{revoked}");
    // The faults that need the members' processes did not run there: a
    // note names each, and no row claims them.
    for fault in ["etcd-leader-kill", "etcd-restart"] {
        assert!(
            stderr.contains(&format!("etcd x {fault}")) && stderr.contains("--etcd-endpoints"),
            "{stderr}"
        );
        assert!(rows.iter().all(|r| r["fault"] != fault), "{stdout}");
    }
    // The workers took their leases on this cluster: each acquire and
    // release is a write there.
    let after = cluster.member(0).status()?.revision;
    let accepted = none["accepted"].as_i64().unwrap_or(0);
    assert!(after - before >= accepted, "{before} -> {after}: {none}");
    Ok(())
}

#[test]
fn a_wrong_password_is_an_error_naming_the_endpoint_before_any_run() -> TestResult {
    let certs = TestCerts::generate()?;
    let cluster = users_etcd(&certs)?;
    let endpoint = cluster.endpoints().remove(0);
    let before = cluster.member(0).status()?.revision;
    let flags = etcd_flags(&cluster, &certs);
    let mut args: Vec<&str> = vec!["--modes", "etcd", "--faults", "none"];
    args.extend(flags.iter().map(String::as_str));
    args.extend(SHORT);
    let out = chaos(&args, Some(WRONG))?;
    let (stdout, stderr) = texts(&out);
    assert_eq!(out.status.code(), Some(3), "{stdout}\n{stderr}");
    assert!(
        stderr.contains(&endpoint) && stderr.contains("refused to authenticate user \"locker\""),
        "{stderr}"
    );
    // Nothing ran: no run's line, nothing written.
    assert!(!stderr.contains("etcd x none"), "{stderr}");
    assert_eq!(cluster.member(0).status()?.revision, before);
    Ok(())
}

#[test]
fn flags_that_cannot_work_on_the_users_etcd_are_usage_errors() -> TestResult {
    let plain = ["--etcd-endpoints", "http://127.0.0.1:1"];
    let cases: [(Vec<&str>, Option<&str>, &str); 5] = [
        (
            vec!["--modes", "etcd", "--etcd-user", "u", plain[0], plain[1]],
            None,
            "LEASEHOLD_ETCD_PASSWORD",
        ),
        (
            vec![
                "--modes",
                "etcd",
                "--etcd-endpoints",
                "http://u:etcd-user-s3cret@127.0.0.1:1",
            ],
            None,
            "--etcd-user",
        ),
        (
            vec![
                "--modes",
                "etcd-lock-rpc",
                "--etcd-user",
                "u",
                plain[0],
                plain[1],
            ],
            Some(PASSWORD),
            "etcd-lock-rpc",
        ),
        (
            vec![
                "--modes",
                "etcd",
                "--etcd-tls-ca",
                "ca.pem",
                plain[0],
                plain[1],
            ],
            None,
            "https://",
        ),
        (
            vec![
                "--modes",
                "etcd",
                "--faults",
                "etcd-leader-kill",
                plain[0],
                plain[1],
            ],
            None,
            "etcd x etcd-leader-kill",
        ),
    ];
    for (args, password, says) in cases {
        let out = chaos(&args, password)?;
        let (stdout, stderr) = texts(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stdout}\n{stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    Ok(())
}
