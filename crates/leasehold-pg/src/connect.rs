//! A plain connection, for callers without a pool.

use std::time::Duration;

use tokio_postgres::{Client, Config, NoTls};

use crate::error::{Error, Result};

/// How long [`connect`] waits for the server when the URL sets no
/// `connect_timeout`: 5 s.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Connects to `url` (`postgres://user:password@host:port/db`, no TLS) and
/// drives the connection on the current tokio runtime.
///
/// # Errors
/// [`Error::InvalidUrl`] (the parser's message is dropped, since it can
/// quote the password), [`Error::Unreachable`] when nothing answers within
/// the URL's `connect_timeout` (default 5 s), [`Error::Auth`] for wrong
/// credentials.
///
/// # Cancel safety
/// Cancel safe: dropping the future drops the half-open connection.
pub async fn connect(url: &str) -> Result<Client> {
    let mut config: Config = url.parse().map_err(|_| Error::InvalidUrl)?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(DEFAULT_CONNECT_TIMEOUT);
    }
    let (client, connection) = config.connect(NoTls).await.map_err(Error::from_pg)?;
    // The client reports a dead connection as closed on its next call.
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}
