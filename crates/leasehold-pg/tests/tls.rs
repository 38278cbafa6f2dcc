//! `connect` over TLS against a real PostgreSQL with `ssl=on` and
//! certificates made at test time: libpq's `sslmode` / `sslrootcert` /
//! `sslcert` / `sslkey`, and each failure as its own error.

use leasehold::Lessor;
use std::path::Path;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use leasehold::{CertificateProblem, FencedKeys, Locker, TlsFileRole};
use leasehold_pg::tokio_postgres::Client;
use leasehold_pg::{Error, Guard};
use leasehold_testkit::{ClientAuth, PostgresServer, RedisServer, TestCerts};

mod common;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// One TLS server (asking for, not requiring, client certificates) and
/// its certificates, shared by the tests of this binary that run at once.
struct Shared {
    certs: TestCerts,
    server: PostgresServer,
}

fn shared() -> Result<Arc<Shared>, Box<dyn std::error::Error>> {
    static SHARED: Mutex<Weak<Shared>> = Mutex::new(Weak::new());
    let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(found) = shared.upgrade() {
        return Ok(found);
    }
    let certs = TestCerts::generate()?;
    let server = PostgresServer::start_tls(&certs.server().client_auth(ClientAuth::Optional))?;
    let found = Arc::new(Shared { certs, server });
    *shared = Arc::downgrade(&found);
    Ok(found)
}

/// `server`'s URL with `params` (the paths in them need no
/// percent-encoding: temporary directories are plain ASCII).
fn url(server: &PostgresServer, params: &str) -> String {
    format!("{}?{params}", server.url())
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

/// Whether `db`'s connection is encrypted, and the client certificate's
/// subject the server saw.
async fn ssl_state(db: &Client) -> Result<(bool, Option<String>), Box<dyn std::error::Error>> {
    let row = db
        .query_one(
            "SELECT ssl, client_dn FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await?;
    Ok((row.get(0), row.get(1)))
}

/// Connects and expects an error; checks no message in its chain shows
/// the password.
async fn connect_err(url: &str, password: &str) -> Error {
    let err = tokio::time::timeout(Duration::from_secs(30), leasehold_pg::connect(url))
        .await
        .expect("connect must not hang")
        .expect_err("connect must fail");
    let mut current: Option<&dyn std::error::Error> = Some(&err);
    while let Some(e) = current {
        let text = format!("{e} / {e:?}");
        assert!(!text.contains(password), "password in {text}");
        current = e.source();
    }
    err
}

#[tokio::test]
async fn verify_full_connects_and_guards_a_write() -> TestResult {
    let shared = shared()?;
    let (certs, pg) = (&shared.certs, &shared.server);
    let redis = RedisServer::start()?;
    let locker = Locker::connect(&leasehold::redis::Client::open(redis.url())?).await?;

    let params = format!("sslmode=verify-full&sslrootcert={}", path(&certs.ca()));
    let mut db = leasehold_pg::connect(&url(pg, &params)).await?;
    assert_eq!(ssl_state(&db).await?, (true, None));
    leasehold_pg::setup(&mut db).await?;
    db.batch_execute(
        "CREATE TABLE IF NOT EXISTS tls_accounts (name text PRIMARY KEY, balance bigint NOT NULL);
         INSERT INTO tls_accounts VALUES ('alice', 100) ON CONFLICT (name) DO NOTHING;",
    )
    .await?;

    let keys = FencedKeys::for_resource("tls:alice")?;
    let lease = locker.acquire(&keys, Duration::from_secs(10)).await?;
    let tx = db.transaction().await?;
    assert!(matches!(
        leasehold_pg::guard(&tx, &lease).await?,
        Guard::Accepted
    ));
    tx.execute(
        "UPDATE tls_accounts SET balance = balance - 10 WHERE name = 'alice'",
        &[],
    )
    .await?;
    tx.commit().await?;
    lease.release().await?;
    let balance: i64 = db
        .query_one("SELECT balance FROM tls_accounts WHERE name = 'alice'", &[])
        .await?
        .get(0);
    assert_eq!(balance, 90);

    // The same in key=value form, verify-ca.
    let kv = format!(
        "host=127.0.0.1 port={} user={} password={} dbname=postgres sslmode=verify-ca sslrootcert='{}'",
        pg.port(),
        pg.user(),
        pg.password(),
        path(&certs.ca()),
    );
    let db = leasehold_pg::connect(&kv).await?;
    assert!(ssl_state(&db).await?.0);
    Ok(())
}

#[tokio::test]
async fn client_certificate_is_presented_and_an_untrusted_one_rejected() -> TestResult {
    let shared = shared()?;
    let (certs, pg) = (&shared.certs, &shared.server);
    let params = format!(
        "sslmode=verify-full&sslrootcert={}&sslcert={}&sslkey={}",
        path(&certs.ca()),
        path(&certs.client_cert()),
        path(&certs.client_key()),
    );
    let db = leasehold_pg::connect(&url(pg, &params)).await?;
    let (ssl, client_dn) = ssl_state(&db).await?;
    assert!(ssl);
    assert_eq!(client_dn.as_deref(), Some("/CN=leasehold test client"));

    let params = format!(
        "sslmode=verify-full&sslrootcert={}&sslcert={}&sslkey={}",
        path(&certs.ca()),
        path(&certs.untrusted_client_cert()),
        path(&certs.untrusted_client_key()),
    );
    let err = connect_err(&url(pg, &params), pg.password()).await;
    assert!(matches!(err, Error::ClientCertRejected(_)), "{err:?}");
    Ok(())
}

#[tokio::test]
async fn server_signed_by_another_ca_is_unknown_issuer() -> TestResult {
    let shared = shared()?;
    let (certs, pg) = (&shared.certs, &shared.server);
    for mode in ["verify-full", "verify-ca", "require"] {
        let params = format!("sslmode={mode}&sslrootcert={}", path(&certs.untrusted_ca()));
        let err = connect_err(&url(pg, &params), pg.password()).await;
        assert!(
            matches!(
                err,
                Error::TlsCertificate {
                    problem: CertificateProblem::UnknownIssuer,
                    ..
                }
            ),
            "{mode}: {err:?}"
        );
        assert_eq!(
            err.to_string(),
            "postgresql tls certificate refused: not signed by a trusted ca"
        );
        assert!(!err.is_retryable());
    }
    // require without a CA, as libpq: encrypted, the server not checked.
    let db = leasehold_pg::connect(&url(pg, "sslmode=require")).await?;
    assert!(ssl_state(&db).await?.0);
    // prefer (the default) uses TLS when offered; disable does not.
    let db = leasehold_pg::connect(&pg.url()).await?;
    assert!(ssl_state(&db).await?.0);
    let db = leasehold_pg::connect(&url(pg, "sslmode=disable")).await?;
    assert!(!ssl_state(&db).await?.0);
    Ok(())
}

#[tokio::test]
async fn expired_server_certificate_is_expired() -> TestResult {
    let certs = TestCerts::generate()?;
    let pg = PostgresServer::start_tls(&certs.expired_server())?;
    let params = format!("sslmode=verify-full&sslrootcert={}", path(&certs.ca()));
    let err = connect_err(&url(&pg, &params), pg.password()).await;
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
    Ok(())
}

#[tokio::test]
async fn required_tls_against_a_plain_server_is_not_supported() -> TestResult {
    let pg = common::server()?;
    let certs = TestCerts::generate()?;
    for params in [
        "sslmode=require".to_owned(),
        format!("sslmode=verify-full&sslrootcert={}", path(&certs.ca())),
    ] {
        let err = connect_err(&url(&pg, &params), pg.password()).await;
        assert!(
            matches!(err, Error::TlsNotSupported(_)),
            "{params}: {err:?}"
        );
    }
    // Without sslmode the plain server is used in plain (prefer).
    let db = leasehold_pg::connect(&pg.url()).await?;
    assert!(!ssl_state(&db).await?.0);
    Ok(())
}

#[tokio::test]
async fn bad_tls_parameters_fail_before_connecting() -> TestResult {
    let certs = TestCerts::generate()?;
    // Nothing listens on port 1: every error below comes before connecting.
    let base = "postgres://app:pw-s3cret@127.0.0.1:1/db";
    let missing = certs.dir().join("missing.pem");
    let cases = [
        (
            format!("sslmode=verify-full&sslrootcert={}", path(&missing)),
            TlsFileRole::Ca,
            "cannot be read",
        ),
        (
            format!(
                "sslmode=verify-ca&sslrootcert={}",
                path(&certs.client_key())
            ),
            TlsFileRole::Ca,
            "holds no PEM certificate",
        ),
        (
            format!(
                "sslcert={}&sslkey={}",
                path(&certs.client_cert()),
                path(&certs.server_key())
            ),
            TlsFileRole::Key,
            "does not match the client certificate",
        ),
    ];
    for (params, want_role, want_problem) in cases {
        let err = connect_err(&format!("{base}?{params}"), "pw-s3cret").await;
        match &err {
            Error::TlsFile { role, problem, .. } => {
                assert_eq!((*role, *problem), (want_role, want_problem), "{err}")
            }
            other => panic!("{params}: expected TlsFile, got {other:?}"),
        }
    }
    for params in [
        "sslmode=verify-everything".to_owned(),
        format!("sslcert={}", path(&certs.client_cert())),
    ] {
        let err = connect_err(&format!("{base}?{params}"), "pw-s3cret").await;
        assert!(matches!(err, Error::InvalidTls(_)), "{params}: {err:?}");
    }
    Ok(())
}

#[tokio::test]
async fn server_requiring_client_certificates_admits_only_them() -> TestResult {
    let certs = TestCerts::generate()?;
    let pg = PostgresServer::start_tls(&certs.server().client_auth(ClientAuth::Required))?;
    let verify = format!("sslmode=verify-full&sslrootcert={}", path(&certs.ca()));
    // pg_hba.conf refuses a client without a certificate, and one without
    // TLS, as an authentication failure.
    for params in [verify.clone(), "sslmode=disable".to_owned()] {
        let err = connect_err(&url(&pg, &params), pg.password()).await;
        assert!(matches!(err, Error::Auth(_)), "{params}: {err:?}");
    }
    let params = format!(
        "{verify}&sslcert={}&sslkey={}",
        path(&certs.client_cert()),
        path(&certs.client_key()),
    );
    let db = leasehold_pg::connect(&url(&pg, &params)).await?;
    assert_eq!(
        ssl_state(&db).await?,
        (true, Some("/CN=leasehold test client".to_owned()))
    );
    Ok(())
}
