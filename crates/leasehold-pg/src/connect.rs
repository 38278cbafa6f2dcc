//! A plain connection, for callers without a pool.

use std::time::Duration;

use tokio_postgres::{Client, Config};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::error::{Error, Result};
use crate::tls;

/// How long [`connect`] waits for the server when the URL sets no
/// `connect_timeout`: 5 s.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Connects to `url` and drives the connection on the current tokio
/// runtime.
///
/// `url` is a libpq connection string, as a URL
/// (`postgres://user:password@host:port/db?sslmode=verify-full&sslrootcert=/etc/ca.pem`)
/// or `key=value` pairs. TLS follows libpq's `sslmode` (default `prefer`:
/// TLS when the server offers it, the certificate not checked),
/// `sslrootcert`, `sslcert` and `sslkey`; the table in the crate's README
/// ("TLS") says what each mode checks.
///
/// # Errors
/// - [`Error::InvalidUrl`] (the parser's message is dropped, since it can
///   quote the password), [`Error::InvalidTls`] for an unknown `sslmode`
///   or half a client certificate, [`Error::TlsFile`] for a file that
///   cannot be used (all before connecting);
/// - [`Error::Unreachable`] when nothing answers within the URL's
///   `connect_timeout` (default 5 s), [`Error::Auth`] for wrong
///   credentials;
/// - [`Error::TlsNotSupported`] when TLS is required and the server does
///   not offer it, [`Error::TlsCertificate`] when its certificate is
///   refused, [`Error::ClientCertRejected`] when it refuses ours.
///
/// # Cancel safety
/// Cancel safe: dropping the future drops the half-open connection.
pub async fn connect(url: &str) -> Result<Client> {
    let (rest, params) = tls::split(url)?;
    let mut config: Config = rest.parse().map_err(|_| Error::InvalidUrl)?;
    config.ssl_mode(params.ssl_mode());
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(DEFAULT_CONNECT_TIMEOUT);
    }
    let connector = MakeRustlsConnect::new(params.client_config()?);
    let (client, connection) = config.connect(connector).await.map_err(Error::from_pg)?;
    // The client reports a dead connection as closed on its next call.
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}
