//! The CLI over TLS: `rediss://` with `--tls-ca`, `--tls-cert` and
//! `--tls-key` (or `LEASEHOLD_TLS_*`), and PostgreSQL's `sslmode` /
//! `sslrootcert` / `sslcert` / `sslkey` in `--database-url`, against servers
//! that accept TLS clients with a certificate only. What goes wrong is a
//! clear error with its exit code, and never shows the password.

use std::path::Path;
use std::process::{Command, Output};

use leasehold_testkit::{ClientAuth, PostgresServer, RedisOptions, RedisServer, TestCerts};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const PASSWORD: &str = "cli-tls-s3cret";

fn leasehold(args: &[&str], env: &[(&str, &Path)]) -> Result<Output, std::io::Error> {
    let mut command = Command::new(env!("CARGO_BIN_EXE_leasehold"));
    command
        .args(args)
        .env_remove("REDIS_URL")
        .env_remove("DATABASE_URL")
        .env_remove("LEASEHOLD_TLS_CA")
        .env_remove("LEASEHOLD_TLS_CERT")
        .env_remove("LEASEHOLD_TLS_KEY");
    for (name, value) in env {
        command.env(name, value);
    }
    command.output()
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

/// stderr, checked for the password.
fn stderr(out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!text.contains(PASSWORD), "password in {text}");
    text
}

#[test]
fn experiments_run_over_tls_to_redis_and_postgresql_with_client_certificates() -> TestResult {
    let certs = TestCerts::generate()?;
    let redis = RedisServer::start_with(
        RedisOptions::default()
            .password(PASSWORD)
            .tls(certs.server().client_auth(ClientAuth::Required)),
    )?;
    let pg = PostgresServer::start_tls(&certs.server().client_auth(ClientAuth::Required))?;
    let database_url = format!(
        "{}?sslmode=verify-full&sslrootcert={}&sslcert={}&sslkey={}",
        pg.url(),
        path(&certs.ca()),
        path(&certs.client_cert()),
        path(&certs.client_key())
    );
    let redis_url = redis.url();
    assert!(redis_url.starts_with("rediss://"), "{redis_url}");

    // Flags.
    let out = leasehold(
        &[
            "fencing",
            "--json",
            "--redis-url",
            &redis_url,
            "--tls-ca",
            &path(&certs.ca()),
            "--tls-cert",
            &path(&certs.client_cert()),
            "--tls-key",
            &path(&certs.client_key()),
            "--database-url",
            &database_url,
        ],
        &[],
    )?;
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(report["ok"], true, "{report}");

    // The same files from the environment.
    let (ca, cert, key) = (certs.ca(), certs.client_cert(), certs.client_key());
    let out = leasehold(
        &["lock", "--json", "--redis-url", &redis_url],
        &[
            ("LEASEHOLD_TLS_CA", &ca),
            ("LEASEHOLD_TLS_CERT", &cert),
            ("LEASEHOLD_TLS_KEY", &key),
        ],
    )?;
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");

    // Without the client certificate the server refuses us: a server-side
    // error (3), named.
    let out = leasehold(
        &[
            "lock",
            "--redis-url",
            &redis_url,
            "--tls-ca",
            &path(&certs.ca()),
        ],
        &[],
    )?;
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("certificate"), "{err}");
    Ok(())
}

#[test]
fn tls_mistakes_are_clear_errors_with_their_exit_codes() -> TestResult {
    let certs = TestCerts::generate()?;
    let redis = RedisServer::start_with(
        RedisOptions::default()
            .password(PASSWORD)
            .tls(certs.server()),
    )?;
    let tls_url = redis.url();
    let plain_url = format!("redis://:{PASSWORD}@127.0.0.1:{}/", redis.port());
    let ca = path(&certs.ca());

    // A CA that did not sign the server's certificate.
    let out = leasehold(
        &[
            "race",
            "--redis-url",
            &tls_url,
            "--tls-ca",
            &path(&certs.untrusted_ca()),
        ],
        &[],
    )?;
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("certificate"), "{err}");

    // A plain URL to the TLS port: TLS files with it are a usage error,
    // and without them the server is named as speaking TLS.
    let out = leasehold(&["race", "--redis-url", &plain_url, "--tls-ca", &ca], &[])?;
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("rediss://"), "{err}");
    let out = leasehold(&["race", "--redis-url", &plain_url], &[])?;
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.to_lowercase().contains("tls"), "{err}");

    // A CA file that is not there: usage (2), naming the file.
    let missing = certs.dir().join("no-such-ca.pem");
    let out = leasehold(
        &["race", "--redis-url", &tls_url, "--tls-ca", &path(&missing)],
        &[],
    )?;
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("no-such-ca.pem"), "{err}");

    // Half a client certificate: clap refuses it (2).
    let out = leasehold(
        &[
            "race",
            "--redis-url",
            &tls_url,
            "--tls-cert",
            &path(&certs.client_cert()),
        ],
        &[],
    )?;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    Ok(())
}
