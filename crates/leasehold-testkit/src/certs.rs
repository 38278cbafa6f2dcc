//! Certificates generated at test time, for TLS servers and clients.
//!
//! [`TestCerts::generate`] makes a fresh set in a temporary directory: a CA
//! the tests trust, a server certificate it signed for `127.0.0.1` and
//! `localhost`, a client certificate it signed, and the ways a TLS
//! connection should fail: a second CA that nobody trusts (with a server and
//! a client certificate of its own) and an expired server certificate
//! signed by the trusted CA. Keys are ECDSA P-256 in PKCS#8 PEM, made with
//! the pure-Rust `rcgen`: no `openssl` binary is needed.
//!
//! A server started with a [`ServerTls`] (from [`TestCerts::server`],
//! [`TestCerts::untrusted_server`] or [`TestCerts::expired_server`]) copies
//! the PEM text into its own directory, so the [`TestCerts`] may be dropped
//! before the server; clients that read the files by path need it alive.

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use tempfile::TempDir;

use crate::Error;
use crate::process;

/// The names every generated server certificate is valid for.
const SERVER_NAMES: [&str; 2] = ["127.0.0.1", "localhost"];

/// A certificate and its private key, as PEM text.
#[derive(Clone)]
struct Pair {
    cert: String,
    key: String,
}

/// A CA: its certificate (PEM) and what signs with it.
struct Authority {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A fresh set of test certificates, written as PEM files to a temporary
/// directory that is removed on drop.
///
/// | file | what |
/// |---|---|
/// | [`ca`](Self::ca) | the CA clients and servers trust |
/// | [`server_cert`](Self::server_cert) / [`server_key`](Self::server_key) | signed by the CA, for `127.0.0.1` and `localhost`, valid until 4096 |
/// | [`client_cert`](Self::client_cert) / [`client_key`](Self::client_key) | signed by the CA, for client authentication |
/// | [`untrusted_ca`](Self::untrusted_ca) | a second CA nobody trusts |
/// | [`untrusted_client_cert`](Self::untrusted_client_cert) / [`untrusted_client_key`](Self::untrusted_client_key) | a client certificate signed by the untrusted CA |
/// | [`expired_server_cert`](Self::expired_server_cert) | signed by the CA, for the same names, expired on 2001-01-01 |
///
/// ```no_run
/// use leasehold_testkit::{RedisOptions, RedisServer, TestCerts};
///
/// let certs = TestCerts::generate()?;
/// let server = RedisServer::start_with(RedisOptions::default().tls(certs.server()))?;
/// assert!(server.url().starts_with("rediss://"));
/// // Clients trust certs.ca(); server.redis_cli(..) speaks TLS by itself.
/// assert_eq!(server.redis_cli(&["PING"])?, "PONG");
/// # Ok::<(), leasehold_testkit::Error>(())
/// ```
pub struct TestCerts {
    ca: String,
    server: Pair,
    client: Pair,
    untrusted_ca: String,
    untrusted_server: Pair,
    untrusted_client: Pair,
    expired_server: Pair,
    dir: TempDir,
}

impl fmt::Debug for TestCerts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestCerts")
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

impl TestCerts {
    /// Generates the certificates and writes them to a new temporary
    /// directory. Takes a few milliseconds (no RSA).
    ///
    /// # Errors
    /// [`Error::Certificate`] if generating or signing fails,
    /// [`Error::Io`] if a file cannot be written.
    pub fn generate() -> Result<TestCerts, Error> {
        let ca = authority("leasehold test CA")?;
        let untrusted_ca = authority("leasehold untrusted CA")?;
        let server = leaf(&ca, Role::Server, false)?;
        let certs = TestCerts {
            server,
            client: leaf(&ca, Role::Client, false)?,
            untrusted_server: leaf(&untrusted_ca, Role::Server, false)?,
            untrusted_client: leaf(&untrusted_ca, Role::Client, false)?,
            expired_server: leaf(&ca, Role::Server, true)?,
            ca: ca.pem,
            untrusted_ca: untrusted_ca.pem,
            dir: tempfile::Builder::new()
                .prefix("leasehold-certs-")
                .tempdir()
                .map_err(process::io_err(&std::env::temp_dir()))?,
        };
        let files: [(&str, &str); 12] = [
            ("ca.pem", &certs.ca),
            ("server.pem", &certs.server.cert),
            ("server-key.pem", &certs.server.key),
            ("client.pem", &certs.client.cert),
            ("client-key.pem", &certs.client.key),
            ("untrusted-ca.pem", &certs.untrusted_ca),
            ("untrusted-server.pem", &certs.untrusted_server.cert),
            ("untrusted-server-key.pem", &certs.untrusted_server.key),
            ("untrusted-client.pem", &certs.untrusted_client.cert),
            ("untrusted-client-key.pem", &certs.untrusted_client.key),
            ("expired-server.pem", &certs.expired_server.cert),
            ("expired-server-key.pem", &certs.expired_server.key),
        ];
        for (name, pem) in files {
            let path = certs.dir.path().join(name);
            fs::write(&path, pem).map_err(process::io_err(&path))?;
        }
        Ok(certs)
    }

    /// The directory holding the PEM files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The trusted CA's certificate (`ca.pem`).
    pub fn ca(&self) -> PathBuf {
        self.file("ca.pem")
    }

    /// The server certificate signed by the trusted CA (`server.pem`).
    pub fn server_cert(&self) -> PathBuf {
        self.file("server.pem")
    }

    /// The key of [`server_cert`](Self::server_cert) (`server-key.pem`).
    pub fn server_key(&self) -> PathBuf {
        self.file("server-key.pem")
    }

    /// The client certificate signed by the trusted CA (`client.pem`).
    pub fn client_cert(&self) -> PathBuf {
        self.file("client.pem")
    }

    /// The key of [`client_cert`](Self::client_cert) (`client-key.pem`).
    pub fn client_key(&self) -> PathBuf {
        self.file("client-key.pem")
    }

    /// The second CA, which nothing trusts (`untrusted-ca.pem`).
    pub fn untrusted_ca(&self) -> PathBuf {
        self.file("untrusted-ca.pem")
    }

    /// A client certificate signed by the untrusted CA
    /// (`untrusted-client.pem`): servers of this set refuse it.
    pub fn untrusted_client_cert(&self) -> PathBuf {
        self.file("untrusted-client.pem")
    }

    /// The key of [`untrusted_client_cert`](Self::untrusted_client_cert).
    pub fn untrusted_client_key(&self) -> PathBuf {
        self.file("untrusted-client-key.pem")
    }

    /// A server certificate signed by the trusted CA that expired on
    /// 2001-01-01 (`expired-server.pem`).
    pub fn expired_server_cert(&self) -> PathBuf {
        self.file("expired-server.pem")
    }

    /// The key of [`expired_server_cert`](Self::expired_server_cert).
    pub fn expired_server_key(&self) -> PathBuf {
        self.file("expired-server-key.pem")
    }

    /// A server that presents [`server_cert`](Self::server_cert); it
    /// verifies client certificates against [`ca`](Self::ca), and the
    /// testkit's own client trusts it and presents
    /// [`client_cert`](Self::client_cert). Client certificates are not
    /// asked for unless [`ServerTls::client_auth`] says so.
    pub fn server(&self) -> ServerTls {
        self.server_tls(&self.server, &self.ca)
    }

    /// A server that presents a certificate signed by the
    /// [untrusted CA](Self::untrusted_ca): clients that trust only
    /// [`ca`](Self::ca) refuse it. The testkit's own client trusts the
    /// untrusted CA, so [`RedisServer::command`](crate::RedisServer::command)
    /// still works.
    pub fn untrusted_server(&self) -> ServerTls {
        self.server_tls(&self.untrusted_server, &self.untrusted_ca)
    }

    /// A server that presents the
    /// [expired certificate](Self::expired_server_cert). Every verifying
    /// client refuses it, the testkit's own included: its readiness check
    /// accepts a handshake that fails on the certificate, but
    /// [`RedisServer::command`](crate::RedisServer::command) fails.
    pub fn expired_server(&self) -> ServerTls {
        self.server_tls(&self.expired_server, &self.ca)
    }

    fn server_tls(&self, identity: &Pair, trust: &str) -> ServerTls {
        ServerTls {
            cert: identity.cert.clone(),
            key: identity.key.clone(),
            client_ca: self.ca.clone(),
            trust: trust.to_owned(),
            client: self.client.clone(),
            client_auth: ClientAuth::No,
        }
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// Whether a TLS server asks clients for a certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ClientAuth {
    /// Clients are not asked for a certificate (redis:
    /// `--tls-auth-clients no`).
    #[default]
    No,
    /// A client may present a certificate, which must then be valid
    /// (redis: `--tls-auth-clients optional`).
    Optional,
    /// Every client must present a valid certificate (redis:
    /// `--tls-auth-clients yes`; PostgreSQL: `hostssl ... clientcert=verify-ca`
    /// in `pg_hba.conf`).
    Required,
}

/// What a TLS server presents and whom it accepts, as PEM text; made by
/// [`TestCerts::server`] and its siblings, given to
/// [`RedisOptions::tls`](crate::RedisOptions::tls) or
/// [`PostgresServer::start_tls`](crate::PostgresServer::start_tls).
///
/// Its `Debug` output shows no key.
#[derive(Clone)]
pub struct ServerTls {
    pub(crate) cert: String,
    pub(crate) key: String,
    /// Verifies client certificates.
    pub(crate) client_ca: String,
    /// What the testkit's own client trusts: the CA that signed `cert`.
    pub(crate) trust: String,
    /// What the testkit's own client presents (and a TLS replica, to its
    /// primary).
    client: Pair,
    pub(crate) client_auth: ClientAuth,
}

impl fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerTls")
            .field("client_auth", &self.client_auth)
            .finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Whether the server asks clients for a certificate.
    ///
    /// Defaults to [`ClientAuth::No`].
    #[must_use]
    pub fn client_auth(mut self, auth: ClientAuth) -> Self {
        self.client_auth = auth;
        self
    }

    /// The client authentication set with [`client_auth`](Self::client_auth).
    pub fn get_client_auth(&self) -> ClientAuth {
        self.client_auth
    }

    /// The testkit's client certificate and key (PEM), which a TLS
    /// replica presents to its primary.
    pub(crate) fn client_pair(&self) -> (&str, &str) {
        (&self.client.cert, &self.client.key)
    }

    /// The certificates the testkit's own client uses against this server.
    pub(crate) fn client_certificates(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: Some(redis::ClientTlsConfig {
                client_cert: self.client.cert.clone().into_bytes(),
                client_key: self.client.key.clone().into_bytes(),
            }),
            root_cert: Some(self.trust.clone().into_bytes()),
        }
    }
}

/// What a leaf certificate is for.
#[derive(Clone, Copy)]
enum Role {
    Server,
    Client,
}

fn authority(name: &str) -> Result<Authority, Error> {
    let key = KeyPair::generate().map_err(cert_err)?;
    let mut params = CertificateParams::default();
    params.distinguished_name = named(name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let cert = params.self_signed(&key).map_err(cert_err)?;
    Ok(Authority {
        pem: cert.pem(),
        issuer: Issuer::new(params, key),
    })
}

fn leaf(ca: &Authority, role: Role, expired: bool) -> Result<Pair, Error> {
    let key = KeyPair::generate().map_err(cert_err)?;
    let (mut params, name, usage) = match role {
        Role::Server => (
            CertificateParams::new(SERVER_NAMES.map(str::to_owned).to_vec()).map_err(cert_err)?,
            "127.0.0.1",
            ExtendedKeyUsagePurpose::ServerAuth,
        ),
        Role::Client => (
            CertificateParams::default(),
            "leasehold test client",
            ExtendedKeyUsagePurpose::ClientAuth,
        ),
    };
    params.distinguished_name = named(name);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![usage];
    if expired {
        params.not_before = rcgen::date_time_ymd(2000, 1, 1);
        params.not_after = rcgen::date_time_ymd(2001, 1, 1);
    }
    let cert = params.signed_by(&key, &ca.issuer).map_err(cert_err)?;
    Ok(Pair {
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

fn named(common_name: &str) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    name
}

fn cert_err(source: rcgen::Error) -> Error {
    Error::Certificate(source)
}

/// Makes aws-lc-rs rustls's process-wide crypto provider unless one is set:
/// redis-rs builds its TLS settings with the default provider, which
/// rustls can pick by itself only while exactly one provider is compiled
/// in.
pub(crate) fn install_provider() {
    // An Err means a provider is already installed, which is all we need.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

/// Whether `err` (or an error inside it) is rustls refusing the peer's
/// certificate.
pub(crate) fn is_certificate_rejection(err: &(dyn std::error::Error + 'static)) -> bool {
    matches!(find_rustls(err), Some(rustls::Error::InvalidCertificate(_)))
}

/// The rustls error inside `err`, looking through `source()` chains,
/// `io::Error` payloads and the `Arc` redis-rs keeps its causes in.
fn find_rustls<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut current = Some(err);
    while let Some(err) = current {
        if let Some(tls) = err.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        let inner: Option<&(dyn std::error::Error + 'static)> =
            match err.downcast_ref::<std::io::Error>() {
                Some(io) => io.get_ref().map(|inner| inner as _),
                None => err
                    .downcast_ref::<std::sync::Arc<dyn std::error::Error + Send + Sync>>()
                    .map(|shared| shared.as_ref() as _),
            };
        if let Some(found) = inner.and_then(find_rustls) {
            return Some(found);
        }
        current = err.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_every_file_as_pem() -> Result<(), Box<dyn std::error::Error>> {
        let certs = TestCerts::generate()?;
        for path in [
            certs.ca(),
            certs.server_cert(),
            certs.client_cert(),
            certs.untrusted_ca(),
            certs.untrusted_client_cert(),
            certs.expired_server_cert(),
        ] {
            let text = fs::read_to_string(&path)?;
            assert!(text.starts_with("-----BEGIN CERTIFICATE-----"), "{path:?}");
        }
        for path in [
            certs.server_key(),
            certs.client_key(),
            certs.untrusted_client_key(),
            certs.expired_server_key(),
        ] {
            let text = fs::read_to_string(&path)?;
            assert!(text.starts_with("-----BEGIN PRIVATE KEY-----"), "{path:?}");
        }
        assert_ne!(fs::read(certs.ca())?, fs::read(certs.untrusted_ca())?);
        let debug = format!("{:?}", certs.server());
        assert!(!debug.contains("PRIVATE"), "{debug}");
        Ok(())
    }
}
