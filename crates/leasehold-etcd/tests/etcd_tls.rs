//! TLS to etcd (`EtcdLockerBuilder::tls`, features `etcd` and `tls`)
//! against a real etcd cluster that serves its clients over TLS and asks
//! them for a certificate (`--client-cert-auth`): a lease is taken with the
//! right files, and each wrong setting is a typed error at connect, named
//! as on Redis (a certificate we refuse, ours refused, a plain port), or
//! refused before any I/O.

use std::time::Duration;

use leasehold::tls::{TlsFailure, TlsFiles};
use leasehold::{CertificateProblem, Error, FencedKeys, Lessor};
use leasehold_etcd::{EtcdError, EtcdLocker, etcd_error};
use leasehold_testkit::{ClientAuth, EtcdCluster, TestCerts};

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// Long enough for a handshake on a loaded machine; a failed handshake
/// ends the connect before it (the test does not wait it out).
const TIMEOUT: Duration = Duration::from_secs(3);

/// The files of a client the cluster trusts.
fn trusted(certs: &TestCerts) -> TlsFiles {
    TlsFiles::new()
        .ca(certs.ca())
        .cert(certs.client_cert())
        .key(certs.client_key())
}

async fn connect(endpoints: Vec<String>, files: TlsFiles) -> Result<EtcdLocker, Error> {
    EtcdLocker::builder(endpoints)
        .tls(files)
        .command_timeout(TIMEOUT)
        .connect()
        .await
}

/// The TLS failure an etcd connect error names.
#[track_caller]
fn failure(result: Result<EtcdLocker, Error>) -> Option<TlsFailure> {
    match result {
        Err(err @ Error::Service { op: "connect", .. })
            if etcd_error(&err).and_then(EtcdError::tls_failure).is_some() =>
        {
            etcd_error(&err).and_then(EtcdError::tls_failure)
        }
        other => panic!("expected a tls failure at connect, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_is_taken_over_tls_with_a_client_certificate() -> TestResult {
    let certs = TestCerts::generate()?;
    let cluster = EtcdCluster::start_tls(3, &certs.server().client_auth(ClientAuth::Required))?;
    assert!(
        cluster
            .endpoints()
            .iter()
            .all(|e| e.starts_with("https://"))
    );
    let locker = connect(cluster.endpoints(), trusted(&certs)).await?;
    let first = locker
        .acquire(FencedKeys::for_resource("tls:1")?, Duration::from_secs(5))
        .await?;
    let first_token = first.fence().ok_or("a fenced lease has a token")?;
    first.release().await?;
    let second = locker
        .acquire(FencedKeys::for_resource("tls:1")?, Duration::from_secs(5))
        .await?;
    assert!(second.fence().ok_or("token")? > first_token);
    second.release().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_wrong_tls_setting_is_named_at_connect() -> TestResult {
    let certs = TestCerts::generate()?;
    let cluster = EtcdCluster::start_tls(1, &certs.server().client_auth(ClientAuth::Required))?;
    // The members' CA not given: the system's roots do not know it.
    let no_ca = TlsFiles::new()
        .cert(certs.client_cert())
        .key(certs.client_key());
    assert_eq!(
        failure(connect(cluster.endpoints(), no_ca).await),
        Some(TlsFailure::Certificate(CertificateProblem::UnknownIssuer))
    );
    // Another CA given.
    let other_ca = TlsFiles::new()
        .ca(certs.untrusted_ca())
        .cert(certs.client_cert())
        .key(certs.client_key());
    assert_eq!(
        failure(connect(cluster.endpoints(), other_ca).await),
        Some(TlsFailure::Certificate(CertificateProblem::UnknownIssuer))
    );
    // No client certificate, or one the cluster does not trust.
    let no_cert = TlsFiles::new().ca(certs.ca());
    assert_eq!(
        failure(connect(cluster.endpoints(), no_cert).await),
        Some(TlsFailure::ClientCertRejected)
    );
    let stranger = TlsFiles::new()
        .ca(certs.ca())
        .cert(certs.untrusted_client_cert())
        .key(certs.untrusted_client_key());
    assert_eq!(
        failure(connect(cluster.endpoints(), stranger).await),
        Some(TlsFailure::ClientCertRejected)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_to_a_plain_cluster_is_not_tls_and_bad_settings_are_refused_before_io() -> TestResult {
    let certs = TestCerts::generate()?;
    let plain = EtcdCluster::start(1)?;
    let https: Vec<String> = plain
        .endpoints()
        .iter()
        .map(|endpoint| endpoint.replacen("http://", "https://", 1))
        .collect();
    assert_eq!(
        failure(connect(https, trusted(&certs)).await),
        Some(TlsFailure::NotTls)
    );
    // Files with plain endpoints, mixed schemes, a certificate without
    // its key, a missing file: refused before any connection.
    let unreachable = || vec!["http://127.0.0.1:1".to_owned()];
    assert!(matches!(
        connect(unreachable(), trusted(&certs)).await,
        Err(Error::InvalidOptions(_))
    ));
    let mixed = vec![
        "https://127.0.0.1:1".to_owned(),
        "http://127.0.0.1:2".to_owned(),
    ];
    assert!(matches!(
        connect(mixed, TlsFiles::new()).await,
        Err(Error::InvalidOptions(_))
    ));
    let secure = || vec!["https://127.0.0.1:1".to_owned()];
    assert!(matches!(
        connect(secure(), TlsFiles::new().cert(certs.client_cert())).await,
        Err(Error::InvalidOptions(_))
    ));
    let missing = certs.dir().join("no-such-ca.pem");
    assert!(matches!(
        connect(secure(), TlsFiles::new().ca(&missing)).await,
        Err(Error::TlsFile { ref path, .. }) if *path == missing
    ));
    Ok(())
}
