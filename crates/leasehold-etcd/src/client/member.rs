//! One etcd member as the client sees it: its endpoint, and the session
//! (a connection proven to answer, with its auth token) it keeps to it.

use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout_at};
use tonic::Request;
use tonic::codegen::Service;
use tonic::codegen::http::Uri;
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::transport::{Channel, Endpoint};

use super::api::etcdserverpb::auth_client::AuthClient;
use super::api::etcdserverpb::maintenance_client::MaintenanceClient;
use super::api::etcdserverpb::{AuthenticateRequest, StatusRequest};
use super::error::EtcdError;

/// How often an idle connection is pinged (HTTP/2 PING), and how long a
/// ping may go unanswered before the connection counts as dead: a member
/// that vanished without closing its connections is noticed within about
/// twice this even with no request in flight.
const KEEP_ALIVE: Duration = Duration::from_secs(5);

/// etcd's client port, for an endpoint that names none.
const DEFAULT_PORT: u16 = 2379;

/// The failure of a request on a session whose connection broke: nothing
/// was sent (see [`OneConnection`]).
#[derive(Debug, thiserror::Error)]
#[error("the session's connection was lost; nothing was sent")]
pub(crate) struct SessionLost;

impl SessionLost {
    /// Whether `status` is this failure (somewhere in its sources).
    pub(crate) fn caused(status: &tonic::Status) -> bool {
        std::error::Error::source(status).is_some_and(caused_by::<SessionLost>)
    }
}

/// Whether `err`, or an error in its `source()` chain or inside an
/// `io::Error` there, is an `E`: how a failure of our connector's is
/// found again in the error tonic and hyper wrap it in.
fn caused_by<E: std::error::Error + 'static>(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(err);
    while let Some(error) = cause {
        if error.is::<E>()
            || error
                .downcast_ref::<io::Error>()
                .and_then(io::Error::get_ref)
                .is_some_and(|inner| inner.is::<E>())
        {
            return true;
        }
        cause = error.source();
    }
    false
}

/// The host `uri` names, as a socket address or a certificate's name
/// takes it: an IPv6 address without its brackets; `localhost` if none.
fn host_of(uri: &Uri) -> &str {
    let host = uri.host().unwrap_or("localhost");
    host.strip_prefix('[')
        .and_then(|host| host.strip_suffix(']'))
        .unwrap_or(host)
}

/// The connector of one session: it dials the member once. Any later dial
/// (tonic reconnects a channel whose connection broke, on the next
/// request) fails at once, before anything is sent: a new connection
/// must prove itself first (see [`Member::session`]), and only a new
/// session does that. So a request on a broken session fails as not
/// sent (`Service was not ready`), which is safe to retry, even a write.
///
/// With TLS (an `https://` endpoint), the handshake is made here, on the
/// one connection, so tonic only ever sees a plain stream (it is given an
/// `http://` URI and never does TLS of its own).
#[derive(Clone, Default)]
struct OneConnection {
    dialled: Arc<AtomicBool>,
    #[cfg(feature = "tls")]
    tls: Option<Tls>,
    /// The TLS failure the connection's stream met, if any: HTTP/2 keeps
    /// only the text of an I/O error, so the stream notes it first.
    #[cfg(feature = "tls")]
    tls_failure: TlsFailureSlot,
}

/// Where a TLS stream notes the failure it met.
#[cfg(feature = "tls")]
type TlsFailureSlot = Arc<Mutex<Option<leasehold::tls::TlsFailure>>>;

/// How a member's connection speaks TLS: the client settings and the name
/// its certificate must carry.
#[cfg(feature = "tls")]
#[derive(Clone)]
struct Tls {
    connector: tokio_rustls::TlsConnector,
    server_name: rustls::pki_types::ServerName<'static>,
}

impl Service<Uri> for OneConnection {
    type Response = TokioIo<Stream>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let first = !self.dialled.swap(true, Ordering::Relaxed);
        #[cfg(feature = "tls")]
        let tls = self.tls.clone();
        #[cfg(feature = "tls")]
        let slot = Arc::clone(&self.tls_failure);
        Box::pin(async move {
            if !first {
                return Err(io::Error::new(io::ErrorKind::NotConnected, SessionLost));
            }
            let host = host_of(&uri);
            let port = uri.port_u16().unwrap_or(DEFAULT_PORT);
            let stream = TcpStream::connect((host, port)).await?;
            stream.set_nodelay(true)?;
            #[cfg(feature = "tls")]
            if let Some(tls) = tls {
                let stream = match tls.connector.connect(tls.server_name, stream).await {
                    Ok(stream) => stream,
                    Err(err) if err.kind() == io::ErrorKind::UnexpectedEof => {
                        return Err(if speaks_plain_http(host, port).await {
                            io::Error::new(io::ErrorKind::InvalidData, PlainPort)
                        } else {
                            err
                        });
                    }
                    Err(err) => return Err(err),
                };
                return Ok(TokioIo::new(Stream::Tls(Box::new(stream), slot)));
            }
            Ok(TokioIo::new(Stream::Plain(stream)))
        })
    }
}

/// An `https://` endpoint whose port speaks plain HTTP: it closed the
/// connection on our TLS hello, and answered a plain request.
#[cfg(feature = "tls")]
#[derive(Debug, thiserror::Error)]
#[error("the member's port does not speak tls")]
struct PlainPort;

/// How long the probe of [`speaks_plain_http`] may take.
#[cfg(feature = "tls")]
const PROBE_TIMEOUT: Duration = Duration::from_millis(250);

/// Whether the port answers a plain HTTP request (on a new connection,
/// within [`PROBE_TIMEOUT`]): asked only after a TLS handshake met the end
/// of the stream, which is how a plain etcd port meets a TLS hello. The
/// probe sends no credentials.
#[cfg(feature = "tls")]
async fn speaks_plain_http(host: &str, port: u16) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let probe = async {
        let mut stream = TcpStream::connect((host, port)).await?;
        stream
            .write_all(b"GET /version HTTP/1.1\r\nHost: etcd\r\nConnection: close\r\n\r\n")
            .await?;
        let mut head = [0u8; 5];
        stream.read_exact(&mut head).await?;
        Ok::<_, io::Error>(&head == b"HTTP/")
    };
    matches!(
        tokio::time::timeout(PROBE_TIMEOUT, probe).await,
        Ok(Ok(true))
    )
}

/// The TLS failure, if any, of a new connection to the member at
/// `endpoint`, made as a session's is ([`OneConnection`]), that then sends
/// nothing and reads what comes first: an alert (our certificate refused)
/// or the member's first frame (none). See [`Member::tls_reason`].
#[cfg(feature = "tls")]
async fn probe_tls(endpoint: &Endpoint, tls: &Tls) -> Option<leasehold::tls::TlsFailure> {
    use tokio::io::AsyncReadExt;
    let mut connector = OneConnection {
        tls: Some(tls.clone()),
        ..OneConnection::default()
    };
    let mut stream = match connector.call(endpoint.uri().clone()).await {
        Ok(stream) => stream.into_inner(),
        Err(err) => return leasehold::tls::classify(&err),
    };
    let mut first = [0u8; 1];
    match stream.read(&mut first).await {
        Ok(_) => None,
        Err(err) => leasehold::tls::classify(&err),
    }
}

/// A member's connection: plain TCP, or TLS over it.
enum Stream {
    Plain(TcpStream),
    #[cfg(feature = "tls")]
    Tls(
        Box<tokio_rustls::client::TlsStream<TcpStream>>,
        TlsFailureSlot,
    ),
}

/// `result`, after noting in `slot` the TLS failure it is, if it is one.
#[cfg(feature = "tls")]
fn note<T>(slot: &TlsFailureSlot, result: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
    if let Poll::Ready(Err(err)) = &result
        && let Some(failure) = leasehold::tls::classify(err)
    {
        *slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(failure);
    }
    result
}

impl tokio::io::AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(stream) => Pin::new(stream).poll_read(cx, buf),
            #[cfg(feature = "tls")]
            Stream::Tls(stream, slot) => note(slot, Pin::new(stream.as_mut()).poll_read(cx, buf)),
        }
    }
}

impl tokio::io::AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(stream) => Pin::new(stream).poll_write(cx, buf),
            #[cfg(feature = "tls")]
            Stream::Tls(stream, slot) => note(slot, Pin::new(stream.as_mut()).poll_write(cx, buf)),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(stream) => Pin::new(stream).poll_write_vectored(cx, bufs),
            #[cfg(feature = "tls")]
            Stream::Tls(stream, slot) => note(
                slot,
                Pin::new(stream.as_mut()).poll_write_vectored(cx, bufs),
            ),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(stream) => stream.is_write_vectored(),
            #[cfg(feature = "tls")]
            Stream::Tls(stream, _) => stream.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(stream) => Pin::new(stream).poll_flush(cx),
            #[cfg(feature = "tls")]
            Stream::Tls(stream, slot) => note(slot, Pin::new(stream.as_mut()).poll_flush(cx)),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(stream) => Pin::new(stream).poll_shutdown(cx),
            #[cfg(feature = "tls")]
            Stream::Tls(stream, slot) => note(slot, Pin::new(stream.as_mut()).poll_shutdown(cx)),
        }
    }
}

/// The TLS settings of a client's `https://` members (feature `tls`):
/// a rustls client configuration, offering ALPN `h2` as gRPC needs.
#[cfg(feature = "tls")]
#[derive(Clone)]
pub struct TlsSettings(pub(crate) Arc<rustls::ClientConfig>);

/// Without the `tls` feature there are no TLS settings: an `https://`
/// endpoint is refused ([`EtcdError::TlsRequired`]).
#[cfg(not(feature = "tls"))]
#[derive(Debug, Clone)]
pub(crate) enum TlsSettings {}

#[cfg(feature = "tls")]
impl fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsSettings").finish_non_exhaustive()
    }
}

#[cfg(feature = "tls")]
impl TlsSettings {
    /// Settings from a rustls configuration; its ALPN protocols are
    /// replaced by `h2`.
    pub fn new(mut config: rustls::ClientConfig) -> Self {
        config.alpn_protocols = vec![b"h2".to_vec()];
        Self(Arc::new(config))
    }
}

/// A user name and password for etcd's authentication.
///
/// `Debug` shows the user name only; the password is never formatted,
/// logged or put in an error.
#[derive(Clone)]
pub struct Credentials {
    user: String,
    password: String,
}

impl Credentials {
    /// A user name and its password.
    pub fn new(user: impl Into<String>, password: impl Into<String>) -> Self {
        Self {
            user: user.into(),
            password: password.into(),
        }
    }

    /// The user name.
    pub fn user(&self) -> &str {
        &self.user
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// A connection to one member that answered, with the auth token it gave
/// (etcd's simple tokens are a member's own, so each member has its own).
#[derive(Clone)]
pub(crate) struct Session {
    pub(crate) channel: Channel,
    endpoint: Arc<str>,
    token: Option<AsciiMetadataValue>,
    generation: u64,
}

impl Session {
    /// The member's endpoint, as given.
    pub(crate) fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// `message` as a request on this session: with the auth token, and
    /// with `hasleader`, so that a member that knows no leader (cut off
    /// from its peers, or in an election) refuses at once, before applying
    /// anything, instead of holding the request until its own timeout.
    pub(crate) fn request<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        let metadata = request.metadata_mut();
        metadata.insert("hasleader", MetadataValue::from_static("true"));
        if let Some(token) = &self.token {
            metadata.insert("token", token.clone());
        }
        request
    }
}

/// One member: where it is, the session to it, made when first needed
/// and forgotten when it fails, and whether it is demoted.
pub(crate) struct Member {
    url: Arc<str>,
    endpoint: Endpoint,
    #[cfg(feature = "tls")]
    tls: Option<Tls>,
    session: Mutex<Option<Session>>,
    generations: AtomicU64,
    /// Set when the member fell silent (an attempt timed out, its answer
    /// was lost, it could not be reached); cleared when it answers again.
    /// A client moving on from a failed member skips demoted ones while
    /// another is left (see [`EtcdClient`](super::EtcdClient)).
    demoted: AtomicBool,
}

impl fmt::Debug for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Member").field("url", &self.url).finish()
    }
}

impl Member {
    /// A member at `url` (`http://host:port`, or `https://host:port` with
    /// `tls`'s settings); nothing is dialled yet.
    pub(crate) fn new(url: &str, tls: Option<&TlsSettings>) -> Result<Self, EtcdError> {
        let (plain, secure) = match url.strip_prefix("https://") {
            Some(rest) => (format!("http://{rest}"), true),
            None => (url.to_owned(), false),
        };
        let endpoint = Endpoint::from_shared(plain)
            .map_err(|source| EtcdError::InvalidEndpoint {
                endpoint: url.to_owned(),
                source,
            })?
            .http2_keep_alive_interval(KEEP_ALIVE)
            .keep_alive_timeout(KEEP_ALIVE)
            .keep_alive_while_idle(true);
        #[cfg(feature = "tls")]
        let tls = match (secure, tls) {
            (false, _) => None,
            (true, None) => {
                return Err(EtcdError::TlsRequired {
                    endpoint: url.to_owned(),
                });
            }
            (true, Some(settings)) => {
                let server_name =
                    rustls::pki_types::ServerName::try_from(host_of(endpoint.uri()).to_owned())
                        .map_err(|_| EtcdError::TlsRequired {
                            endpoint: url.to_owned(),
                        })?;
                Some(Tls {
                    connector: tokio_rustls::TlsConnector::from(Arc::clone(&settings.0)),
                    server_name,
                })
            }
        };
        #[cfg(not(feature = "tls"))]
        if secure {
            let _ = tls;
            return Err(EtcdError::TlsRequired {
                endpoint: url.to_owned(),
            });
        }
        Ok(Self {
            url: url.into(),
            endpoint,
            #[cfg(feature = "tls")]
            tls,
            session: Mutex::new(None),
            generations: AtomicU64::new(0),
            demoted: AtomicBool::new(false),
        })
    }

    /// Marks the member silent: the client passes over it while another
    /// member is left.
    pub(crate) fn demote(&self) {
        if !self.demoted.swap(true, Ordering::Relaxed) {
            tracing::debug!(endpoint = %self.url, "etcd member demoted until it answers again");
        }
    }

    /// The member answered: it is no longer passed over.
    pub(crate) fn answered(&self) {
        if self.demoted.swap(false, Ordering::Relaxed) {
            tracing::debug!(endpoint = %self.url, "etcd member answers again");
        }
    }

    /// Whether the member fell silent and has not answered since.
    pub(crate) fn is_demoted(&self) -> bool {
        self.demoted.load(Ordering::Relaxed)
    }

    /// The endpoint as given.
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// The session to this member, made now if there is none: connect,
    /// check that the member answers (a `Status` call carrying
    /// `hasleader`), and authenticate if there are credentials, all by
    /// `deadline`. Nothing of the caller's request has been sent when this
    /// fails, so any failure here is safe to retry elsewhere.
    pub(crate) async fn session(
        &self,
        deadline: Instant,
        credentials: Option<&Credentials>,
    ) -> Result<Session, EtcdError> {
        if let Some(session) = self.lock().clone() {
            return Ok(session);
        }
        let timed_out = || EtcdError::AttemptTimedOut {
            endpoint: self.url.to_string(),
        };
        let connector = OneConnection {
            #[cfg(feature = "tls")]
            tls: self.tls.clone(),
            ..OneConnection::default()
        };
        #[cfg(feature = "tls")]
        let tls_failure = Arc::clone(&connector.tls_failure);
        let connect = self.endpoint.connect_with_connector(connector);
        let channel = timeout_at(deadline, connect)
            .await
            .map_err(|_| timed_out())?
            .map_err(|source| self.connect_failed(source))?;
        let mut session = Session {
            channel,
            endpoint: self.url.clone(),
            token: None,
            generation: self.generations.fetch_add(1, Ordering::Relaxed) + 1,
        };
        // Something that accepts connections in front of a stopped member
        // (a proxy, a load balancer) would take a first request and lose
        // it; a member restarted without a quorum accepts and answers
        // nothing. The check proves the member itself answers, and knows
        // a leader, before a write goes out on this connection.
        let mut maintenance = MaintenanceClient::new(session.channel.clone());
        let failed = match timeout_at(
            deadline,
            maintenance.status(session.request(StatusRequest {})),
        )
        .await
        {
            Ok(Ok(_)) => None,
            Ok(Err(source)) => Some(EtcdError::Unavailable {
                endpoint: self.url.to_string(),
                source,
            }),
            Err(_) => Some(timed_out()),
        };
        if let Some(err) = failed {
            #[cfg(feature = "tls")]
            let err = self.tls_reason(err, &tls_failure, deadline).await;
            return Err(err);
        }
        if let Some(credentials) = credentials {
            session.token = Some(self.authenticate(&session, credentials, deadline).await?);
        }
        self.answered();
        *self.lock() = Some(session.clone());
        Ok(session)
    }

    /// Why a new TLS connection's first request failed, if TLS is why.
    /// With TLS 1.3 the member checks our certificate after our side of
    /// the handshake is done, so its refusal comes as an alert on the
    /// connection: noted by the stream if it read it, or else (our request
    /// may have met the closed connection first) learnt by a probe: a new
    /// handshake that sends nothing and reads what comes back, an alert or
    /// the member's first frame, within [`PROBE_TIMEOUT`] and `deadline`.
    #[cfg(feature = "tls")]
    async fn tls_reason(
        &self,
        err: EtcdError,
        noted: &TlsFailureSlot,
        deadline: Instant,
    ) -> EtcdError {
        let Some(tls) = &self.tls else {
            return err;
        };
        let mut failure = *noted.lock().unwrap_or_else(PoisonError::into_inner);
        if failure.is_none() {
            let by = deadline.min(Instant::now() + PROBE_TIMEOUT);
            failure = timeout_at(by, probe_tls(&self.endpoint, tls))
                .await
                .ok()
                .flatten();
        }
        match failure {
            Some(failure) => EtcdError::TlsRefused {
                endpoint: self.url.to_string(),
                failure,
                source: Box::new(err),
            },
            None => err,
        }
    }

    /// What a failed connect was: a TLS failure, named, or any other.
    fn connect_failed(&self, source: tonic::transport::Error) -> EtcdError {
        #[cfg(feature = "tls")]
        if let Some(failure) = leasehold::tls::classify(&source).or_else(|| {
            caused_by::<PlainPort>(&source).then_some(leasehold::tls::TlsFailure::NotTls)
        }) {
            return EtcdError::Tls {
                endpoint: self.url.to_string(),
                failure,
                source,
            };
        }
        EtcdError::Connect {
            endpoint: self.url.to_string(),
            source,
        }
    }

    /// Asks the member for an auth token.
    async fn authenticate(
        &self,
        session: &Session,
        credentials: &Credentials,
        deadline: Instant,
    ) -> Result<AsciiMetadataValue, EtcdError> {
        let mut auth = AuthClient::new(session.channel.clone());
        let request = session.request(AuthenticateRequest {
            name: credentials.user.clone(),
            password: credentials.password.clone(),
        });
        let reply = timeout_at(deadline, auth.authenticate(request))
            .await
            .map_err(|_| EtcdError::AttemptTimedOut {
                endpoint: self.url.to_string(),
            })?
            .map_err(|source| match source.code() {
                tonic::Code::InvalidArgument
                | tonic::Code::FailedPrecondition
                | tonic::Code::PermissionDenied
                | tonic::Code::Unauthenticated => EtcdError::AuthFailed {
                    user: credentials.user.clone(),
                    source,
                },
                _ => EtcdError::Unavailable {
                    endpoint: self.url.to_string(),
                    source,
                },
            })?
            .into_inner();
        AsciiMetadataValue::try_from(reply.token).map_err(|_| EtcdError::Rejected {
            source: tonic::Status::internal("etcd's auth token is not ASCII"),
        })
    }

    /// Drops `session` if it is still the current one (so the next request
    /// connects afresh), after it failed.
    pub(crate) fn forget(&self, session: &Session) {
        let mut current = self.lock();
        if current
            .as_ref()
            .is_some_and(|current| current.generation == session.generation)
        {
            *current = None;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Session>> {
        self.session.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_never_show_the_password() {
        let credentials = Credentials::new("alice", "hunter2-secret");
        let debug = format!("{credentials:?}");
        assert!(debug.contains("alice"), "{debug}");
        assert!(!debug.contains("hunter2"), "{debug}");
    }

    #[test]
    fn a_bad_endpoint_is_refused_by_name() {
        let err = Member::new("not a url", None).expect_err("not a url");
        assert!(
            matches!(err, EtcdError::InvalidEndpoint { ref endpoint, .. } if endpoint == "not a url")
        );
    }
}
