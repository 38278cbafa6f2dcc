//! Leases over TLS (`rediss://`), and each way a TLS connection goes wrong
//! surfacing as its own error, against real TLS redis-servers with
//! certificates made at test time.

#![cfg(feature = "tls")]

use leasehold::Lessor;
use std::error::Error as _;

use leasehold::tls::{self, TlsFiles};
use leasehold::{CertificateProblem, Error, FencedKeys, HandoffLocker, Locker, TlsFileRole};
use leasehold_testkit::{ClientAuth, RedisOptions, RedisServer, TestCerts};
use redis::AsyncCommands;

mod common;
use common::*;

/// The password every server here requires; no error message may show it.
const PASSWORD: &str = "tls-s3cret";

fn tls_server(
    certs: &TestCerts,
    auth: ClientAuth,
) -> Result<RedisServer, leasehold_testkit::Error> {
    RedisServer::start_with(
        RedisOptions::default()
            .password(PASSWORD)
            .tls(certs.server().client_auth(auth)),
    )
}

/// `server`'s URL with the other scheme: `redis://` for a TLS server.
fn plain_url(server: &RedisServer) -> String {
    format!("redis://:{PASSWORD}@127.0.0.1:{}/", server.port())
}

/// Connects a locker to `url` with `files`; the error, with its message
/// and every source's checked for the password.
async fn connect_err(url: &str, files: &TlsFiles) -> Result<Error, Box<dyn std::error::Error>> {
    let client = tls::client(url, files)?;
    let err = tokio::time::timeout(HUNG, Locker::connect(&client))
        .await?
        .expect_err("the connection must fail");
    assert_no_password(&err);
    Ok(err)
}

fn assert_no_password(err: &dyn std::error::Error) {
    let mut current = Some(err);
    while let Some(err) = current {
        let text = format!("{err} / {err:?}");
        assert!(!text.contains(PASSWORD), "password in {text}");
        current = err.source();
    }
}

#[tokio::test]
async fn lease_over_tls_with_ca_only() -> TestResult {
    let certs = TestCerts::generate()?;
    let server = tls_server(&certs, ClientAuth::No)?;
    let client = tls::client(&server.url(), &TlsFiles::new().ca(certs.ca()))?;
    let locker = Locker::connect(&client).await?;
    let keys = FencedKeys::for_resource("tls:wallet")?;
    let lease = locker.acquire(&keys, 10 * SECOND).await?;
    assert!(lease.fence().is_some());
    assert_eq!(
        server.redis_cli(&["GET", "lock:{tls:wallet}"])?,
        lease.token().as_str()
    );
    lease.release().await?;
    assert_eq!(server.redis_cli(&["EXISTS", "lock:{tls:wallet}"])?, "0");

    // The hand-off locker's pub/sub connection speaks TLS too.
    let handoff = HandoffLocker::builder().build(locker, &client).await?;
    let lease = handoff.acquire("tls:handoff", 10 * SECOND).await?;
    lease.release().await?;
    Ok(())
}

#[tokio::test]
async fn lease_over_tls_with_a_client_certificate() -> TestResult {
    let certs = TestCerts::generate()?;
    let server = tls_server(&certs, ClientAuth::Required)?;
    let files = TlsFiles::new()
        .ca(certs.ca())
        .cert(certs.client_cert())
        .key(certs.client_key());
    let client = tls::client(&server.url(), &files)?;
    let locker = Locker::connect(&client).await?;
    let conn = locker.connection().clone();
    let lease = locker.acquire("tls:mtls", 10 * SECOND).await?;
    let stored: String = conn.clone().get("tls:mtls").await?;
    assert_eq!(stored, lease.token().as_str());
    lease.release().await?;
    Ok(())
}

#[tokio::test]
async fn missing_client_certificate_is_client_cert_rejected() -> TestResult {
    let certs = TestCerts::generate()?;
    let server = tls_server(&certs, ClientAuth::Required)?;
    let err = connect_err(&server.url(), &TlsFiles::new().ca(certs.ca())).await?;
    assert!(
        matches!(err, Error::ClientCertRejected { op: "connect", .. }),
        "{err:?}"
    );
    // A certificate from a CA the server does not trust is refused too.
    let files = TlsFiles::new()
        .ca(certs.ca())
        .cert(certs.untrusted_client_cert())
        .key(certs.untrusted_client_key());
    let err = connect_err(&server.url(), &files).await?;
    assert!(matches!(err, Error::ClientCertRejected { .. }), "{err:?}");
    assert!(!err.is_retryable());
    Ok(())
}

#[tokio::test]
async fn server_signed_by_another_ca_is_unknown_issuer() -> TestResult {
    let certs = TestCerts::generate()?;
    let server = RedisServer::start_with(
        RedisOptions::default()
            .password(PASSWORD)
            .tls(certs.untrusted_server()),
    )?;
    let err = connect_err(&server.url(), &TlsFiles::new().ca(certs.ca())).await?;
    assert!(
        matches!(
            err,
            Error::TlsCertificate {
                problem: CertificateProblem::UnknownIssuer,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "redis tls certificate refused during connect: not signed by a trusted ca"
    );
    // Without a CA file the system's roots are used: they do not know ours.
    let client = redis::Client::open(server.url())?;
    let err = Locker::connect(&client).await.expect_err("untrusted");
    assert!(
        matches!(
            err,
            Error::TlsCertificate {
                problem: CertificateProblem::UnknownIssuer,
                ..
            }
        ),
        "{err:?}"
    );
    Ok(())
}

#[tokio::test]
async fn expired_server_certificate_is_expired() -> TestResult {
    let certs = TestCerts::generate()?;
    let server = RedisServer::start_with(
        RedisOptions::default()
            .password(PASSWORD)
            .tls(certs.expired_server()),
    )?;
    let err = connect_err(&server.url(), &TlsFiles::new().ca(certs.ca())).await?;
    assert!(
        matches!(
            err,
            Error::TlsCertificate {
                problem: CertificateProblem::Expired,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(!err.is_retryable());
    Ok(())
}

#[tokio::test]
async fn plain_url_to_a_tls_port_is_tls_expected() -> TestResult {
    let certs = TestCerts::generate()?;
    let server = tls_server(&certs, ClientAuth::No)?;
    let err = connect_err(&plain_url(&server), &TlsFiles::new()).await?;
    assert!(
        matches!(err, Error::TlsExpected { op: "connect", .. }),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "redis expects tls on this port (during connect): use a rediss:// url"
    );
    Ok(())
}

#[tokio::test]
async fn tls_url_to_a_plain_port_is_not_tls() -> TestResult {
    let server = RedisServer::start_with(RedisOptions::default().password(PASSWORD))?;
    let certs = TestCerts::generate()?;
    let url = format!("rediss://:{PASSWORD}@127.0.0.1:{}/", server.port());
    let err = connect_err(&url, &TlsFiles::new().ca(certs.ca())).await?;
    assert!(
        matches!(err, Error::NotTls { op: "connect", .. }),
        "{err:?}"
    );
    // The plain server still works for plain clients (nothing was probed
    // into a broken state), and a plain failure stays Unreachable.
    assert_eq!(server.redis_cli(&["PING"])?, "PONG");
    drop(server);
    let client = redis::Client::open(format!(
        "redis://127.0.0.1:{}/",
        leasehold_testkit::free_port()?
    ))?;
    let err = Locker::connect(&client).await.expect_err("nothing listens");
    assert!(matches!(err, Error::Unreachable { .. }), "{err:?}");
    Ok(())
}

#[test]
fn unusable_files_are_named_before_any_io() -> TestResult {
    let certs = TestCerts::generate()?;
    let url = format!("rediss://:{PASSWORD}@127.0.0.1:1/");
    let missing = certs.dir().join("no-such.pem");
    let cases = [
        (
            TlsFiles::new().ca(&missing),
            TlsFileRole::Ca,
            "cannot be read",
        ),
        (
            TlsFiles::new().ca(certs.client_key()),
            TlsFileRole::Ca,
            "holds no PEM certificate",
        ),
        (
            TlsFiles::new()
                .cert(certs.client_key())
                .key(certs.client_key()),
            TlsFileRole::Cert,
            "holds no PEM certificate",
        ),
        (
            TlsFiles::new()
                .cert(certs.client_cert())
                .key(certs.client_cert()),
            TlsFileRole::Key,
            "holds no PEM private key",
        ),
        (
            TlsFiles::new()
                .cert(certs.client_cert())
                .key(certs.server_key()),
            TlsFileRole::Key,
            "does not match the client certificate",
        ),
    ];
    for (files, want_role, want_problem) in cases {
        let err = tls::client(&url, &files).expect_err("unusable file");
        assert_no_password(&err);
        match &err {
            Error::TlsFile {
                role,
                problem,
                source,
                ..
            } => {
                assert_eq!((*role, *problem), (want_role, want_problem), "{err}");
                assert_eq!(source.is_some(), want_problem == "cannot be read");
            }
            other => panic!("expected TlsFile, got {other:?}"),
        }
    }
    let err = tls::client(&url, &TlsFiles::new().ca(&missing)).expect_err("missing");
    assert_eq!(
        err.to_string(),
        format!("tls ca file {missing:?} cannot be read")
    );
    assert!(err.source().is_some());
    Ok(())
}

/// The loading `leasehold-pg` shares (`tls::ca_roots`, `client_identity`):
/// the same files give the same answers as through `tls::client`, and
/// `classify` names no failure in an error that is not TLS.
#[test]
fn the_shared_loading_reads_and_refuses_as_the_client_does() -> TestResult {
    let certs = TestCerts::generate()?;
    assert_eq!(tls::ca_roots(&certs.ca())?.len(), 1);
    let (chain, _key) =
        tls::client_identity(&certs.client_cert(), &certs.client_key())?.into_parts();
    assert!(!chain.is_empty());
    let err = tls::ca_roots(&certs.client_key()).expect_err("a key is no ca");
    assert!(
        matches!(
            err,
            Error::TlsFile {
                role: TlsFileRole::Ca,
                problem: "holds no PEM certificate",
                ..
            }
        ),
        "{err:?}"
    );
    let err = tls::client_identity(&certs.client_cert(), &certs.server_key())
        .expect_err("another certificate's key");
    assert!(
        matches!(
            err,
            Error::TlsFile {
                role: TlsFileRole::Key,
                problem: "does not match the client certificate",
                ..
            }
        ),
        "{err:?}"
    );
    let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
    assert_eq!(tls::classify(&refused), None);
    let certificate = std::io::Error::other(tls::rustls::Error::InvalidCertificate(
        tls::rustls::CertificateError::Expired,
    ));
    assert_eq!(
        tls::classify(&certificate),
        Some(tls::TlsFailure::Certificate(CertificateProblem::Expired))
    );
    Ok(())
}

#[test]
fn files_need_a_tls_url_and_a_certificate_needs_its_key() -> TestResult {
    let certs = TestCerts::generate()?;
    let plain = format!("redis://:{PASSWORD}@127.0.0.1:1/");
    let err = tls::client(&plain, &TlsFiles::new().ca(certs.ca())).expect_err("plain url");
    assert!(matches!(err, Error::InvalidOptions(_)), "{err:?}");
    let tls_url = format!("rediss://:{PASSWORD}@127.0.0.1:1/");
    let err =
        tls::client(&tls_url, &TlsFiles::new().cert(certs.client_cert())).expect_err("no key");
    assert!(matches!(err, Error::InvalidOptions(_)), "{err:?}");
    let err = tls::client(&tls_url, &TlsFiles::new().key(certs.client_key()))
        .expect_err("no certificate");
    assert!(matches!(err, Error::InvalidOptions(_)), "{err:?}");
    // No files and a plain URL: a plain client, as redis::Client::open.
    let client = tls::client(&plain, &TlsFiles::new())?;
    assert!(matches!(
        client.get_connection_info().addr(),
        redis::ConnectionAddr::Tcp(..)
    ));
    let err = tls::client("redis://:pw@[bad", &TlsFiles::new()).expect_err("bad url");
    assert!(matches!(err, Error::InvalidUrl(_)), "{err:?}");
    assert_eq!(err.to_string(), "invalid redis url");
    Ok(())
}
