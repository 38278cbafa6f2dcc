//! [`Connector`]: the TLS connector [`config`](crate::config()) gives a
//! pool, one type in every build.
//!
//! tokio-postgres connects through a [`MakeTlsConnect`]; a pool
//! (`deadpool_postgres::Manager::from_config(config, connector, ..)`) is
//! generic over it. If that type were rustls's with the `tls` feature and
//! something else without it, turning the feature on (which any crate in
//! the build can do) would change the type a caller's code names, and
//! break it. So it is ours, in every build: with `tls` it speaks TLS
//! through rustls (`tokio-postgres-rustls`); without, it speaks none, and
//! [`config`](crate::config()) has already refused a URL that needs TLS and
//! told tokio-postgres not to ask for it. [`Handshake`] and [`Stream`] are
//! its associated types, opaque the same way.

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::Socket;
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};

/// What does the work: rustls with the `tls` feature, tokio-postgres's
/// `NoTls` (which refuses every handshake) without.
#[cfg(feature = "tls")]
type Make = tokio_postgres_rustls::MakeRustlsConnect;
#[cfg(not(feature = "tls"))]
type Make = tokio_postgres::NoTls;

type Shake = <Make as MakeTlsConnect<Socket>>::TlsConnect;
type Inner = <Make as MakeTlsConnect<Socket>>::Stream;

/// The error of a handshake: the TLS library's, boxed (tokio-postgres
/// boxes it anyway), so that the type is the same in every build.
pub type HandshakeError = Box<dyn StdError + Send + Sync>;

/// The connector [`config`](crate::config()) returns: give it with the
/// configuration to your pool, or to `Config::connect`. With the crate
/// feature `tls` it speaks TLS (rustls) as the URL's parameters asked;
/// without, it speaks none (a handshake asked of it fails with a
/// [`HandshakeError`] that tokio-postgres reports as a TLS error).
///
/// The same type in every build, so that turning `tls` on does not break
/// code that names it.
#[derive(Clone)]
pub struct Connector(Make);

impl Connector {
    /// A connector with the rustls settings `config`.
    #[cfg(feature = "tls")]
    pub(crate) fn rustls(config: leasehold::tls::rustls::ClientConfig) -> Connector {
        Connector(tokio_postgres_rustls::MakeRustlsConnect::new(config))
    }

    /// A connector that speaks no TLS.
    #[cfg(not(feature = "tls"))]
    pub(crate) fn plain() -> Connector {
        Connector(tokio_postgres::NoTls)
    }

    /// Whether this build can speak TLS through it (the crate feature
    /// `tls`).
    pub fn speaks_tls(&self) -> bool {
        cfg!(feature = "tls")
    }
}

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connector")
            .field("tls", &self.speaks_tls())
            .finish_non_exhaustive()
    }
}

impl MakeTlsConnect<Socket> for Connector {
    type Stream = Stream;
    type TlsConnect = Handshake;
    type Error = HandshakeError;

    fn make_tls_connect(&mut self, domain: &str) -> Result<Handshake, HandshakeError> {
        MakeTlsConnect::<Socket>::make_tls_connect(&mut self.0, domain)
            .map(Handshake)
            .map_err(Into::into)
    }
}

/// One connection's TLS handshake ([`Connector`]'s `TlsConnect`).
pub struct Handshake(Shake);

impl fmt::Debug for Handshake {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handshake").finish_non_exhaustive()
    }
}

impl TlsConnect<Socket> for Handshake {
    type Stream = Stream;
    type Error = HandshakeError;
    type Future = Pin<Box<dyn Future<Output = Result<Stream, HandshakeError>> + Send>>;

    fn connect(self, stream: Socket) -> Self::Future {
        let handshake = TlsConnect::connect(self.0, stream);
        Box::pin(async move { handshake.await.map(Stream).map_err(Into::into) })
    }
}

/// A connection after its TLS handshake ([`Connector`]'s `Stream`). A
/// build without `tls` never makes one.
pub struct Stream(Inner);

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stream").finish_non_exhaustive()
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }
}

impl TlsStream for Stream {
    fn channel_binding(&self) -> ChannelBinding {
        self.0.channel_binding()
    }
}
