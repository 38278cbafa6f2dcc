//! A plain connection, for callers without a pool.

use std::time::Duration;

use tokio_postgres::{Client, Config};

use crate::connector::Connector;
use crate::error::{Error, Result};
use crate::params;

/// How long [`connect`] waits for the server when the URL sets no
/// `connect_timeout`: 5 s.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// What [`connect`] connects with, for a pool: the parsed `url` (with the
/// 5 s `connect_timeout` when it sets none) and the [`Connector`] its
/// `sslmode`, `sslrootcert`, `sslcert` and `sslkey` ask for, as
/// [`connect`] describes them. Give both to your pool, e.g.
/// `deadpool_postgres::Manager::from_config(config, connector, ..)`.
///
/// # Errors
/// [`Error::InvalidUrl`], [`Error::TlsNotEnabled`], [`Error::InvalidTls`]
/// and [`Error::TlsFile`], as for [`connect`]; nothing is connected yet.
pub fn config(url: &str) -> Result<(Config, Connector)> {
    let (rest, params) = params::split(url)?;
    let mut config: Config = rest.parse().map_err(|_| Error::InvalidUrl)?;
    config.ssl_mode(params.ssl_mode(cfg!(feature = "tls"))?);
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(DEFAULT_CONNECT_TIMEOUT);
    }
    #[cfg(feature = "tls")]
    let connector = Connector::rustls(crate::tls::client_config(&params)?);
    #[cfg(not(feature = "tls"))]
    let connector = Connector::plain();
    Ok((config, connector))
}

/// Connects to `url` and drives the connection on the current tokio
/// runtime.
///
/// `url` is a libpq connection string, as a URL
/// (`postgres://user:password@host:port/db?sslmode=verify-full&sslrootcert=/etc/ca.pem`)
/// or `key=value` pairs. With the crate feature `tls` (off by default),
/// TLS follows libpq's parameters, over rustls (TLS 1.2 and 1.3, the
/// `aws-lc-rs` provider, SCRAM channel binding when the server offers it):
///
/// | `sslmode` | TLS | the server's certificate |
/// |---|---|---|
/// | `disable` | never | - |
/// | `allow`, `prefer` (the default) | if the server offers it | not checked |
/// | `require` | always, else [`Error::TlsNotSupported`] | not checked; with `sslrootcert`, as `verify-ca` |
/// | `verify-ca` | always | must chain to `sslrootcert`, be valid now |
/// | `verify-full` | always | as `verify-ca`, and name the URL's host |
///
/// `sslrootcert` is a PEM file of CA certificates, or `system` for the
/// system's trusted roots; for `verify-ca` and `verify-full` it defaults,
/// as in libpq, to `~/.postgresql/root.crt`. `sslcert` and `sslkey` (PEM,
/// both or neither) give a client certificate, for a server that asks for
/// one (`clientcert=verify-ca` in `pg_hba.conf`). These four parameters
/// are taken out of the string before tokio-postgres parses the rest
/// (its parser knows none of them but `sslmode`, and not all its values).
///
/// Without the `tls` feature this crate speaks no TLS, as libpq built
/// without SSL: `disable`, `allow` and `prefer` (libpq's default, so a URL
/// with no `sslmode` too) connect in plain text, never asking the server
/// for TLS; `require`, `verify-ca`, `verify-full`, or any of `sslrootcert`,
/// `sslcert`, `sslkey`, are refused with [`Error::TlsNotEnabled`] before
/// any connection is tried.
///
/// # Errors
/// - [`Error::InvalidUrl`] (the parser's message is dropped, since it can
///   quote the password), [`Error::TlsNotEnabled`] for a URL that needs
///   TLS in a build without the `tls` feature, [`Error::InvalidTls`] for
///   an unknown `sslmode` or half a client certificate, [`Error::TlsFile`]
///   for a file that cannot be used (all before connecting);
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
    let (config, connector) = config(url)?;
    let (client, connection) = config.connect(connector).await.map_err(Error::from_pg)?;
    // The client reports a dead connection as closed on its next call.
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}
