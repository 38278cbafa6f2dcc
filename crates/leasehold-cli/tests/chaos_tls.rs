//! `leasehold chaos --redis-url rediss://...` against the user's own
//! infrastructure: a Redis that speaks TLS only and requires a client
//! certificate, reached as an ACL user with exactly the harness's rules
//! (`leasehold_chaos::ACL_RULES` + `HARNESS_ACL_RULES`), through the fault
//! proxy on a chosen port and host, or with no proxy. What cannot work is
//! an error with its exit code before anything runs, and never shows the
//! password.

use std::process::Output;

use leasehold_testkit::{ClientAuth, RedisOptions, RedisServer, TestCerts};
use serde_json::Value;

type TestResult = Result<(), Box<dyn std::error::Error>>;

mod common;
use common::{chaos_matrix, leasehold};

const USER: &str = "harness";
const PASSWORD: &str = "chaos-tls-s3cret";

/// Runs `leasehold chaos args` (see [`leasehold`]).
fn chaos(args: &[&str]) -> Result<Output, std::io::Error> {
    let all: Vec<&str> = std::iter::once("chaos")
        .chain(args.iter().copied())
        .collect();
    leasehold(&all)
}

/// stderr, checked for the password.
fn stderr(out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!text.contains(PASSWORD), "password in {text}");
    text
}

/// A Redis over TLS only, client certificates required, with `USER` made
/// with the lock user's rules and `extra`.
fn tls_redis(certs: &TestCerts, extra: &[&str]) -> Result<RedisServer, Box<dyn std::error::Error>> {
    let server = RedisServer::start_with(
        RedisOptions::default().tls(certs.server().client_auth(ClientAuth::Required)),
    )?;
    let rules: Vec<&str> = leasehold_chaos::ACL_RULES
        .iter()
        .chain(extra)
        .copied()
        .collect();
    server.set_acl_user(USER, PASSWORD, &rules)?;
    Ok(server)
}

fn url(server: &RedisServer) -> String {
    format!("rediss://{USER}:{PASSWORD}@127.0.0.1:{}/", server.port())
}

/// `--tls-ca`, `--tls-cert`, `--tls-key` with the test CA and client pair.
fn tls_flags(certs: &TestCerts) -> Vec<String> {
    vec![
        "--tls-ca".to_owned(),
        certs.ca().display().to_string(),
        "--tls-cert".to_owned(),
        certs.client_cert().display().to_string(),
        "--tls-key".to_owned(),
        certs.client_key().display().to_string(),
    ]
}

/// `chaos --json` with `args` and the TLS flags: exit 0, its rows and
/// its stderr (checked for the password).
fn matrix(
    certs: &TestCerts,
    args: &[&str],
) -> Result<(Vec<Value>, String), Box<dyn std::error::Error>> {
    let tls = tls_flags(certs);
    let mut all = args.to_vec();
    all.extend(tls.iter().map(String::as_str));
    let (rows, stderr) = chaos_matrix(&all)?;
    assert!(!stderr.contains(PASSWORD), "password in {stderr}");
    Ok((rows, stderr))
}

/// The commands the server's ACL refused (`ACL LOG`'s `object`s).
fn refused_commands(server: &RedisServer) -> Result<Vec<String>, leasehold_testkit::Error> {
    Ok(server.acl_log()?.into_iter().map(|e| e.object).collect())
}

/// The check-and-set write path holds under key loss on a TLS Redis that
/// requires client certificates, as the harness's ACL user, through the
/// fault proxy on a chosen port, the workers dialling it as `localhost`
/// (a name the certificate holds). The proxy port is really used: taken,
/// it is an error naming it, before anything runs.
#[test]
fn the_matrix_runs_over_tls_with_client_certificates_as_the_harness_acl_user() -> TestResult {
    let certs = TestCerts::generate()?;
    let server = tls_redis(&certs, &leasehold_chaos::HARNESS_ACL_RULES)?;
    let url = url(&server);
    let port = leasehold_testkit::free_port()?.to_string();
    let (rows, _) = matrix(
        &certs,
        &[
            "--redis-url",
            &url,
            "--proxy-port",
            &port,
            "--proxy-host",
            "localhost",
            "--modes",
            "cas",
            "--faults",
            "key-loss",
            "--duration",
            "3s",
        ],
    )?;
    assert_eq!(rows.len(), 1, "{rows:?}");
    let row = &rows[0];
    assert_eq!(
        (&row["mode"], &row["fault"]),
        (&Value::from("cas"), &Value::from("key-loss"))
    );
    // Double holders absorbed; no blind control ran beside it.
    assert_eq!(row["status"], "held_no_control", "{row}");
    assert_eq!(row["violations"], 0, "{row}");
    assert!(row["accepted"].as_u64() > Some(0), "{row}");
    // The faults really hit: double holders, their stale writes refused.
    assert!(row["overlaps"].as_u64() > Some(0), "{row}");
    // The locks were taken on this server, and nothing outside the
    // harness's ACL was sent but the library's optional INFO probe.
    let counter = server.command(&["EXISTS", "fence:{wallet:1}"])?;
    assert_eq!(counter.to_string(), "1", "{counter:?}");
    let refused = refused_commands(&server)?;
    assert!(refused.iter().all(|c| c == "info"), "{refused:?}");

    // The chosen port is the one the proxy binds: taken, the run stops
    // before it starts, naming it.
    let taken = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    let taken_port = taken.local_addr()?.port().to_string();
    let tls = tls_flags(&certs);
    let mut args = vec![
        "--redis-url",
        &url,
        "--proxy-port",
        &taken_port,
        "--faults",
        "key-loss",
    ];
    args.extend(tls.iter().map(String::as_str));
    let out = chaos(&args)?;
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(
        stderr(&out).contains(&format!("127.0.0.1:{taken_port}")),
        "{out:?}"
    );
    Ok(())
}

/// `--no-proxy`: the workers connect to the URL as given; the faults that
/// need the proxy are skipped with the note, the others run. A user
/// whose ACL lacks a fault's command is refused before any run (exit 3),
/// the command and the README's harness ACL named.
#[test]
fn without_the_proxy_the_network_faults_are_skipped_and_a_missing_acl_rule_is_named() -> TestResult
{
    let certs = TestCerts::generate()?;
    // The lock user's rules only: no SCRIPT FLUSH.
    let server = tls_redis(&certs, &[])?;
    let url = url(&server);
    let (rows, notes) = matrix(
        &certs,
        &[
            "--redis-url",
            &url,
            "--no-proxy",
            "--modes",
            "cas",
            "--faults",
            "early-expiry,net-cut",
            "--duration",
            "3s",
        ],
    )?;
    assert!(
        notes.contains("skipped with --redis-url") && notes.contains("cas x net-cut"),
        "{notes}"
    );
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["fault"], "early-expiry", "{rows:?}");
    assert!(
        rows[0]["status"] == "held_no_control" || rows[0]["status"] == "never_broke",
        "{rows:?}"
    );
    assert!(rows[0]["accepted"].as_u64() > Some(0), "{rows:?}");

    let tls = tls_flags(&certs);
    let mut args = vec![
        "--redis-url",
        &url,
        "--modes",
        "cas",
        "--faults",
        "script-flush",
    ];
    args.extend(tls.iter().map(String::as_str));
    let out = chaos(&args)?;
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let text = stderr(&out);
    assert!(
        text.contains("script|flush")
            && text.contains("README.md")
            && text.contains("script-flush"),
        "{text}"
    );
    Ok(())
}

/// TLS files that cannot be used are a usage error (exit 2) before
/// anything starts: with a `redis://` URL, with no `--redis-url`, with
/// `--cluster`; and the proxy flags need `--redis-url` and go together as
/// they can.
#[test]
fn tls_files_that_would_go_unused_are_a_usage_error() -> TestResult {
    let certs = TestCerts::generate()?;
    let tls = tls_flags(&certs);
    let tls: Vec<&str> = tls.iter().map(String::as_str).collect();
    let plain = format!("redis://{USER}:{PASSWORD}@127.0.0.1:1/");
    for args in [
        vec![
            "--redis-url",
            plain.as_str(),
            "--modes",
            "cas",
            "--faults",
            "key-loss",
        ],
        vec!["--modes", "cas", "--faults", "key-loss"],
        vec!["--redis-url", plain.as_str(), "--cluster"],
    ] {
        let mut all = args.clone();
        all.extend(&tls);
        let out = chaos(&all)?;
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        assert!(stderr(&out).contains("--tls-ca"), "{args:?}: {out:?}");
    }
    for args in [
        vec!["--proxy-port", "7000"],
        vec!["--no-proxy"],
        vec![
            "--redis-url",
            plain.as_str(),
            "--no-proxy",
            "--proxy-host",
            "localhost",
        ],
    ] {
        let out = chaos(&args)?;
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        stderr(&out);
    }
    Ok(())
}
