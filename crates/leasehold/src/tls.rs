//! TLS in transit: `rediss://` URLs with your own CA and client certificate.
//!
//! [`client`] builds the [`redis::Client`] that
//! [`Locker::connect`](crate::Locker::connect),
//! [`HandoffLocker::connect`](crate::HandoffLocker::connect),
//! [`Quorum::connect`](crate::Quorum::connect) and their builders'
//! `connect` take. Give it a `rediss://`
//! URL and the files you have:
//!
//! - a **CA file** (PEM, one or more certificates) to verify the server
//!   against; without one, the system's trusted roots are used;
//! - a **client certificate and its key** (PEM; the key in PKCS#8, PKCS#1
//!   or SEC1 form) for a server that asks for one
//!   (`tls-auth-clients yes|optional`).
//!
//! The server's certificate is always verified: it must chain to a trusted
//! CA, be within its validity period and name the URL's host (an IP
//! address in the URL must be in the certificate's IP SANs). There is no
//! switch to turn verification off.
//!
//! Every file is read and checked when the client is built, so a missing
//! file, a file with no PEM in it or a key that does not match its
//! certificate is [`Error::TlsFile`] at once, naming which file and why,
//! before any connection is tried. What goes wrong on the wire comes back
//! from the first connection as its own variant rather than as
//! [`Error::Unreachable`]:
//!
//! | what happened | error |
//! |---|---|
//! | the server's certificate is not signed by a CA we trust, expired, not yet valid, or for another host | [`Error::TlsCertificate`] with its [`CertificateProblem`](crate::CertificateProblem) |
//! | a `rediss://` URL, but the port does not speak TLS | [`Error::NotTls`] |
//! | a `redis://` URL, but the port speaks TLS | [`Error::TlsExpected`] |
//! | the server refused our client certificate, or wanted one we did not send | [`Error::ClientCertRejected`] |
//!
//! [`Error::TlsCertificate`], [`Error::ClientCertRejected`] and
//! [`Error::NotTls`] (when the server answers the handshake with plain
//! text) come from any connection attempt that fails that way.
//! [`Error::TlsExpected`], and [`Error::NotTls`] when the handshake just
//! times out, need a probe of the port, which
//! [`LockerBuilder::connect`](crate::LockerBuilder::connect) (which
//! [`Locker::connect`](crate::Locker::connect) and a hand-off locker's
//! `connect` use) makes when its connect fails. A
//! [`Quorum`](crate::Quorum) connects lazily: a node that fails on TLS is a
//! missing vote ([`Error::QuorumNotReached`]), as any unreachable node.
//!
//! ```no_run
//! use leasehold::tls::{self, TlsFiles};
//! use leasehold::Locker;
//!
//! # async fn run() -> leasehold::Result<()> {
//! let files = TlsFiles::new()
//!     .ca("/etc/leasehold/ca.pem")
//!     .cert("/etc/leasehold/client.pem")
//!     .key("/etc/leasehold/client-key.pem");
//! let client = tls::client("rediss://:secret@redis.internal:6380/", &files)?;
//! let locker = Locker::connect(&client).await?;
//! # let _ = locker;
//! # Ok(())
//! # }
//! ```
//!
//! This module exists with the crate feature `tls` (off by default), which
//! also enables redis-rs's rustls support; TLS uses rustls with the `aws-lc-rs`
//! crypto provider, installed as the process default if none is. Without
//! the feature, [`client`](crate::client()) refuses a `rediss://` URL with
//! [`Error::TlsNotEnabled`].
//!
//! # For other clients
//!
//! The loading and the classification `client` uses are public, so that a
//! crate that speaks TLS to another server (`leasehold-pg`'s `tls` feature,
//! for PostgreSQL) reads files and names failures the same way:
//! [`ca_roots`], [`system_roots`] and [`client_identity`] read and check
//! the files (each problem an [`Error::TlsFile`] naming the file), and
//! [`classify`] reads a [`TlsFailure`] out of any client's error. They use
//! [`rustls`] 0.23's types, re-exported here, and the [`provider`].

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use redis::{ConnectionAddr, IntoConnectionInfo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

use crate::error::{Error, Result, TlsFileRole};
pub use crate::tls_failure::{TlsFailure, classify};
/// Re-exported: the types [`ca_roots`], [`system_roots`] and
/// [`client_identity`] return, at the version this crate uses.
pub use rustls;

/// The files a TLS connection uses, built with consuming setters; every
/// one is optional.
///
/// Paths are kept as given and read by [`client`]. A certificate without
/// its key (or a key without its certificate) is refused there.
#[must_use]
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    ca: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
}

impl TlsFiles {
    /// No files: verify the server against the system's trusted roots and
    /// present no client certificate.
    pub fn new() -> Self {
        TlsFiles::default()
    }

    /// The CA certificate(s) (PEM) to verify the server against, instead
    /// of the system's trusted roots.
    ///
    /// Defaults to none (the system's roots).
    pub fn ca(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca = Some(path.into());
        self
    }

    /// The client certificate (PEM; the leaf first if it is a chain) to
    /// present when the server asks. Needs [`key`](Self::key).
    ///
    /// Defaults to none.
    pub fn cert(mut self, path: impl Into<PathBuf>) -> Self {
        self.cert = Some(path.into());
        self
    }

    /// The private key (PEM) of [`cert`](Self::cert).
    ///
    /// Defaults to none.
    pub fn key(mut self, path: impl Into<PathBuf>) -> Self {
        self.key = Some(path.into());
        self
    }

    /// True when no file is set.
    pub fn is_empty(&self) -> bool {
        self.ca.is_none() && self.cert.is_none() && self.key.is_none()
    }

    /// The CA file, if set.
    pub fn ca_path(&self) -> Option<&Path> {
        self.ca.as_deref()
    }

    /// The client certificate file, if set.
    pub fn cert_path(&self) -> Option<&Path> {
        self.cert.as_deref()
    }

    /// The client key file, if set.
    pub fn key_path(&self) -> Option<&Path> {
        self.key.as_deref()
    }
}

/// Builds a client for `url` that uses `files`.
///
/// A `rediss://` URL connects over TLS, verifying the server against
/// `files`' CA (or the system's roots) and presenting its client
/// certificate if the server asks. A `redis://` URL with no files gives a
/// plain client, the same as [`redis::Client::open`], so one call serves
/// both (a CLI can pass its `--tls-*` flags through unchanged). No I/O
/// but reading the files.
///
/// # Errors
/// - [`Error::InvalidUrl`] when `url` does not parse (the message never
///   quotes it), [`Error::TlsNotEnabled`] when redis-rs was built without
///   TLS all the same;
/// - [`Error::InvalidOptions`] for files with a `redis://` URL, or a
///   client certificate without its key (or the other way round);
/// - [`Error::TlsFile`] for a file that cannot be read, holds no PEM
///   certificate (CA, certificate) or private key (key), or whose contents
///   do not parse, or a key that does not match its certificate.
pub fn client(url: &str, files: &TlsFiles) -> Result<redis::Client> {
    let info = url.into_connection_info().map_err(Error::from_url)?;
    if !matches!(info.addr(), ConnectionAddr::TcpTls { .. }) {
        if !files.is_empty() {
            return Err(Error::InvalidOptions(
                "tls files given for a url without tls: use rediss://",
            ));
        }
        return redis::Client::open(info).map_err(|err| Error::InvalidUrl(err.into()));
    }
    let (client_tls, ca) = read_files(files)?;
    install_provider();
    redis::Client::build_with_tls(
        info,
        redis::TlsCertificates {
            client_tls,
            root_cert: ca,
        },
    )
    .map_err(|err| Error::InvalidUrl(err.into()))
}

/// Reads and checks `files`: the client certificate and key (PEM), the CA
/// (PEM), as redis-rs takes them.
fn read_files(files: &TlsFiles) -> Result<(Option<redis::ClientTlsConfig>, Option<Vec<u8>>)> {
    let ca = match &files.ca {
        Some(path) => Some(load_ca(path)?.0),
        None => None,
    };
    let client_tls = match identity_paths(files)? {
        None => None,
        Some((cert_path, key_path)) => {
            let (cert_pem, key_pem, _) = load_identity(cert_path, key_path)?;
            Some(redis::ClientTlsConfig {
                client_cert: cert_pem,
                client_key: key_pem,
            })
        }
    };
    Ok((client_tls, ca))
}

/// The client certificate's and key's paths: both, or neither.
fn identity_paths(files: &TlsFiles) -> Result<Option<(&Path, &Path)>> {
    match (&files.cert, &files.key) {
        (None, None) => Ok(None),
        (Some(_), None) => Err(Error::InvalidOptions(
            "a client certificate needs its key file",
        )),
        (None, Some(_)) => Err(Error::InvalidOptions(
            "a client key needs its certificate file",
        )),
        (Some(cert), Some(key)) => Ok(Some((cert, key))),
    }
}

/// The CA certificates in the PEM file at `path`, as roots to verify a
/// server against.
///
/// # Errors
/// [`Error::TlsFile`] (role [`TlsFileRole::Ca`]) when the file cannot be
/// read, holds no PEM certificate, or holds one that does not parse.
pub fn ca_roots(path: &Path) -> Result<rustls::RootCertStore> {
    load_ca(path).map(|(_, roots)| roots)
}

/// The system's trusted roots (the platform's store, through
/// `rustls-native-certs`): the certificates it could read; none when it
/// has none. [`client`] verifies a server against these when given no CA
/// file.
pub fn system_roots() -> rustls::RootCertStore {
    let mut roots = rustls::RootCertStore::empty();
    roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
    roots
}

/// A client certificate (the leaf first, then its chain) and its private
/// key, read from PEM files and checked to match: what a server that asks
/// for a client certificate is shown. Made by [`client_identity`].
pub struct ClientIdentity {
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

impl ClientIdentity {
    /// The certificate chain and the key, as rustls's
    /// `ConfigBuilder::with_client_auth_cert` takes them.
    pub fn into_parts(self) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        (self.chain, self.key)
    }
}

impl std::fmt::Debug for ClientIdentity {
    /// The number of certificates; never the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientIdentity")
            .field("certificates", &self.chain.len())
            .finish_non_exhaustive()
    }
}

/// Reads the client certificate at `cert` and its private key at `key`
/// (PEM; the key in PKCS#8, PKCS#1 or SEC1 form), and checks that the key
/// is of a kind the [`provider`] signs with and matches the certificate.
///
/// # Errors
/// [`Error::TlsFile`] naming the file: it cannot be read, holds no PEM
/// certificate (or key), holds one that does not parse, a key of an
/// unsupported kind, or a key that does not match the certificate.
pub fn client_identity(cert: &Path, key: &Path) -> Result<ClientIdentity> {
    load_identity(cert, key).map(|(_, _, identity)| identity)
}

/// A rustls client configuration from `files`: the server verified against
/// the CA file (or the [system's roots](system_roots) without one), the
/// client certificate presented if given, the [`provider`]'s safe default
/// protocol versions, no ALPN (set `alpn_protocols` for a protocol that
/// needs it). What the etcd way uses for `https://` endpoints; no I/O but
/// reading the files.
///
/// # Errors
/// [`Error::InvalidOptions`] for a client certificate without its key (or
/// the other way round); [`Error::TlsFile`] as [`ca_roots`] and
/// [`client_identity`].
pub fn client_config(files: &TlsFiles) -> Result<rustls::ClientConfig> {
    let roots = match &files.ca {
        Some(path) => ca_roots(path)?,
        None => system_roots(),
    };
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|_| Error::InvalidOptions("the tls provider supports no safe protocol version"))?
        .with_root_certificates(roots);
    let config = match identity_paths(files)? {
        None => builder.with_no_client_auth(),
        Some((cert_path, key_path)) => {
            let (chain, key) = client_identity(cert_path, key_path)?.into_parts();
            builder.with_client_auth_cert(chain, key).map_err(|_| {
                file_err(
                    TlsFileRole::Key,
                    key_path,
                    "does not match the client certificate",
                )
            })?
        }
    };
    Ok(config)
}

/// The crypto provider every TLS connection of this crate uses: rustls's
/// `aws-lc-rs` provider.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// The CA file at `path`: its PEM and the roots it holds.
fn load_ca(path: &Path) -> Result<(Vec<u8>, rustls::RootCertStore)> {
    let pem = read(TlsFileRole::Ca, path)?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in certificates(TlsFileRole::Ca, path, &pem)? {
        roots.add(cert).map_err(|_| {
            file_err(
                TlsFileRole::Ca,
                path,
                "holds a certificate that does not parse",
            )
        })?;
    }
    Ok((pem, roots))
}

/// The client certificate and key files: their PEM, and the identity they
/// make, checked.
fn load_identity(cert_path: &Path, key_path: &Path) -> Result<(Vec<u8>, Vec<u8>, ClientIdentity)> {
    let cert_pem = read(TlsFileRole::Cert, cert_path)?;
    let chain = certificates(TlsFileRole::Cert, cert_path, &cert_pem)?;
    let key_pem = read(TlsFileRole::Key, key_path)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|_| file_err(TlsFileRole::Key, key_path, "holds no PEM private key"))?;
    let signing_key = provider()
        .key_provider
        .load_private_key(key.clone_key())
        .map_err(|_| {
            file_err(
                TlsFileRole::Key,
                key_path,
                "holds a key of an unsupported kind",
            )
        })?;
    match rustls::sign::CertifiedKey::new(chain.clone(), signing_key).keys_match() {
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {}
        Err(rustls::Error::InconsistentKeys(_)) => {
            return Err(file_err(
                TlsFileRole::Key,
                key_path,
                "does not match the client certificate",
            ));
        }
        Err(_) => {
            return Err(file_err(
                TlsFileRole::Cert,
                cert_path,
                "holds a certificate that does not parse",
            ));
        }
    }
    Ok((cert_pem, key_pem, ClientIdentity { chain, key }))
}

fn read(role: TlsFileRole, path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| Error::TlsFile {
        role,
        path: path.to_owned(),
        problem: "cannot be read",
        source: Some(source),
    })
}

/// The PEM certificates in `pem`: at least one, each a well-formed PEM
/// block.
fn certificates(
    role: TlsFileRole,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|_| file_err(role, path, "holds a PEM block that does not parse"))?;
    if certs.is_empty() {
        return Err(file_err(role, path, "holds no PEM certificate"));
    }
    Ok(certs)
}

fn file_err(role: TlsFileRole, path: &Path, problem: &'static str) -> Error {
    Error::TlsFile {
        role,
        path: path.to_owned(),
        problem,
        source: None,
    }
}

/// Makes aws-lc-rs rustls's process-wide crypto provider unless one is set.
/// redis-rs builds its TLS settings with the process default, which rustls
/// picks by itself only while exactly one provider is compiled in; this
/// keeps a program that links both from failing at its first connection.
pub(crate) fn install_provider() {
    // An Err means a provider is already installed, which is all we need.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

/// How long [`explain`]'s probe may take. It runs only after a connect
/// failed, on top of the connect's own deadline when that is what ran out.
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_millis(250);

/// Turns a failed connect into [`Error::TlsExpected`] or [`Error::NotTls`]
/// when the scheme and the port disagree; any other error is returned as it
/// is.
///
/// Neither mistake shows by itself. A TLS server given plain RESP closes
/// the connection, which looks like a server that went away; a plain
/// server given a TLS hello waits for the end of a line that never comes,
/// which looks like a paused server. So when a connect fails that way, the
/// port gets one probe in the other protocol, on a new connection: a TLS
/// ClientHello for a `redis://` URL (a TLS handshake record back means
/// TLS), a RESP `PING` for a `rediss://` URL (a RESP reply back means
/// plain). The probe sends no credentials and takes at most
/// [`PROBE_TIMEOUT`].
pub(crate) async fn explain(client: &redis::Client, err: Error) -> Error {
    let deadline = Instant::now() + PROBE_TIMEOUT;
    match client.get_connection_info().addr() {
        ConnectionAddr::Tcp(host, port) if closed(&err) => {
            if !matches!(
                tokio::time::timeout_at(deadline, speaks_tls(host, *port)).await,
                Ok(Ok(true))
            ) {
                return err;
            }
            match err {
                Error::Unreachable { op, source } | Error::Redis { op, source } => {
                    Error::TlsExpected { op, source }
                }
                other => other,
            }
        }
        ConnectionAddr::TcpTls { host, port, .. }
            if matches!(err, Error::Timeout { .. }) || closed(&err) =>
        {
            if !matches!(
                tokio::time::timeout_at(deadline, speaks_resp(host, *port)).await,
                Ok(Ok(true))
            ) {
                return err;
            }
            match err {
                Error::Unreachable { op, source } | Error::Redis { op, source } => Error::NotTls {
                    op,
                    source: Some(source),
                },
                Error::Timeout { op, .. } => Error::NotTls { op, source: None },
                other => other,
            }
        }
        _ => err,
    }
}

/// Whether `err` is a connection that was closed or answered with bytes
/// the client could not parse (not refused, not timed out).
fn closed(err: &Error) -> bool {
    match err {
        Error::Unreachable { source, .. } => !source.is_connection_refusal(),
        Error::Redis { source, .. } => source.kind() == redis::ErrorKind::Parse,
        _ => false,
    }
}

/// Whether the server at `host:port` answers a TLS ClientHello with a TLS
/// handshake record (a ServerHello).
async fn speaks_tls(host: &str, port: u16) -> io::Result<bool> {
    let name = match host.parse::<IpAddr>() {
        Ok(ip) => ServerName::IpAddress(ip.into()),
        Err(_) => ServerName::try_from(host.to_owned())
            .map_err(|err| io::Error::new(io::ErrorKind::InvalidInput, err))?,
    };
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(io::Error::other)?
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let mut conn =
        rustls::ClientConnection::new(Arc::new(config), name).map_err(io::Error::other)?;
    let mut hello = Vec::new();
    conn.write_tls(&mut hello)?;
    let header = first_bytes(host, port, &hello).await?;
    // A TLS record: content type 22 (handshake), version 3.x.
    Ok(header[0] == 22 && header[1] == 3)
}

/// Whether the server at `host:port` answers a RESP `PING` with a RESP
/// simple string or error (`+PONG`, `-NOAUTH ...`).
async fn speaks_resp(host: &str, port: u16) -> io::Result<bool> {
    let reply = first_bytes(host, port, b"*1\r\n$4\r\nPING\r\n").await?;
    Ok(matches!(&reply, b"+PO" | b"-NO" | b"-ER" | b"-WR"))
}

/// Connects to `host:port`, sends `request`, and reads the first three
/// bytes of the answer.
async fn first_bytes(host: &str, port: u16, request: &[u8]) -> io::Result<[u8; 3]> {
    let addr: Option<SocketAddr> = tokio::net::lookup_host((host, port)).await?.next();
    let addr = addr.ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no address"))?;
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream.write_all(request).await?;
    let mut answer = [0u8; 3];
    stream.read_exact(&mut answer).await?;
    Ok(answer)
}
