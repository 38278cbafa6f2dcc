//! [`client`]: a Redis client for a URL, with a typed error for a URL this
//! build cannot serve.
//!
//! redis-rs built without TLS refuses a `rediss://` URL with an error that
//! names neither the URL's problem in a way a caller can match on nor the
//! feature that fixes it; a service that left out `leasehold`'s `tls`
//! feature (off by default) meets it first. [`client`] gives
//! [`Error::TlsNotEnabled`] instead, and refuses `rediss://` whenever this
//! crate's `tls` feature is off, even if another crate in the build turned
//! on redis-rs's TLS (the CA and client-certificate handling, and the
//! typed TLS errors, are this crate's).

use crate::error::{Error, Result};

/// A client for `url`, as [`redis::Client::open`] makes it, for
/// [`Locker::connect`](crate::Locker::connect) and the other ways'
/// `connect`.
///
/// A `redis://` (or `valkey://`, `unix://`) URL works in every build. A
/// `rediss://` (or `valkeys://`) URL needs the crate feature `tls`: with it
/// this is [`tls::client`](crate::tls::client) with no files (the server
/// verified against the system's roots); without it, the URL is refused.
/// No I/O.
///
/// # Errors
/// - [`Error::TlsNotEnabled`] for a `rediss://` URL in a build without the
///   `tls` feature;
/// - [`Error::InvalidUrl`] when the URL does not parse.
///
/// Neither message quotes the URL.
pub fn client(url: &str) -> Result<redis::Client> {
    if let Some(err) = refused(url, cfg!(feature = "tls")) {
        return Err(err);
    }
    #[cfg(feature = "tls")]
    {
        crate::tls::client(url, &crate::tls::TlsFiles::new())
    }
    #[cfg(not(feature = "tls"))]
    {
        let info = redis::IntoConnectionInfo::into_connection_info(url).map_err(Error::from_url)?;
        redis::Client::open(info).map_err(Error::from_url)
    }
}

/// Why a build with (`tls_built`) or without TLS refuses `url` before
/// parsing it: [`Error::TlsNotEnabled`] for a TLS scheme without it.
fn refused(url: &str, tls_built: bool) -> Option<Error> {
    let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
    let tls = ["rediss", "valkeys"]
        .iter()
        .any(|tls| scheme.eq_ignore_ascii_case(tls));
    (tls && !tls_built).then_some(Error::TlsNotEnabled)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs in every feature set: the refusal a build without `tls` makes
    /// is checked as a function of that choice.
    #[test]
    fn a_tls_url_is_refused_only_without_tls() {
        for url in ["rediss://:secret@h:6380/", "VALKEYS://h/"] {
            let err = refused(url, false).expect("refused without tls");
            assert!(matches!(err, Error::TlsNotEnabled), "{err:?}");
            assert!(!format!("{err:?} {err}").contains("secret"));
            assert!(refused(url, true).is_none(), "{url}");
        }
        for url in ["redis://h/", "valkey://h/", "unix:///tmp/r.sock", "h:6379"] {
            assert!(refused(url, false).is_none(), "{url}");
        }
    }

    #[test]
    fn a_plain_url_opens_in_every_build() -> Result<()> {
        let opened = client("redis://:secret@127.0.0.1:6379/2")?;
        assert_eq!(opened.get_connection_info().redis_settings().db(), 2);
        let err = client("redis://:secret@h:6379/x").expect_err("bad database");
        assert!(matches!(err, Error::InvalidUrl(_)), "{err:?}");
        assert!(!format!("{err:?} {err}").contains("secret"));
        Ok(())
    }
}
