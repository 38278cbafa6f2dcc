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
        let mut cause: Option<&(dyn std::error::Error + 'static)> =
            std::error::Error::source(status);
        while let Some(error) = cause {
            if error.is::<SessionLost>()
                || error
                    .downcast_ref::<io::Error>()
                    .and_then(io::Error::get_ref)
                    .is_some_and(|inner| inner.is::<SessionLost>())
            {
                return true;
            }
            cause = error.source();
        }
        false
    }
}

/// The connector of one session: it dials the member once. Any later dial
/// (tonic reconnects a channel whose connection broke, on the next
/// request) fails at once, before anything is sent: a new connection
/// must prove itself first (see [`Member::session`]), and only a new
/// session does that. So a request on a broken session fails as not
/// sent (`Service was not ready`), which is safe to retry, even a write.
#[derive(Clone, Default)]
struct OneConnection {
    dialled: Arc<AtomicBool>,
}

impl Service<Uri> for OneConnection {
    type Response = TokioIo<TcpStream>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let first = !self.dialled.swap(true, Ordering::Relaxed);
        Box::pin(async move {
            if !first {
                return Err(io::Error::new(io::ErrorKind::NotConnected, SessionLost));
            }
            let host = uri.host().unwrap_or("localhost");
            let host = host
                .strip_prefix('[')
                .and_then(|host| host.strip_suffix(']'))
                .unwrap_or(host);
            let port = uri.port_u16().unwrap_or(DEFAULT_PORT);
            let stream = TcpStream::connect((host, port)).await?;
            stream.set_nodelay(true)?;
            Ok(TokioIo::new(stream))
        })
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

/// One member: where it is, and the session to it, made when first needed
/// and forgotten when it fails.
pub(crate) struct Member {
    url: Arc<str>,
    endpoint: Endpoint,
    session: Mutex<Option<Session>>,
    generations: AtomicU64,
}

impl fmt::Debug for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Member").field("url", &self.url).finish()
    }
}

impl Member {
    /// A member at `url` (`http://host:port`); nothing is dialled yet.
    pub(crate) fn new(url: &str) -> Result<Self, EtcdError> {
        let endpoint = Endpoint::from_shared(url.to_owned())
            .map_err(|source| EtcdError::InvalidEndpoint {
                endpoint: url.to_owned(),
                source,
            })?
            .http2_keep_alive_interval(KEEP_ALIVE)
            .keep_alive_timeout(KEEP_ALIVE)
            .keep_alive_while_idle(true);
        Ok(Self {
            url: url.into(),
            endpoint,
            session: Mutex::new(None),
            generations: AtomicU64::new(0),
        })
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
        let connect = self
            .endpoint
            .connect_with_connector(OneConnection::default());
        let channel = timeout_at(deadline, connect)
            .await
            .map_err(|_| timed_out())?
            .map_err(|source| EtcdError::Connect {
                endpoint: self.url.to_string(),
                source,
            })?;
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
        timeout_at(
            deadline,
            maintenance.status(session.request(StatusRequest {})),
        )
        .await
        .map_err(|_| timed_out())?
        .map_err(|source| EtcdError::Unavailable {
            endpoint: self.url.to_string(),
            source,
        })?;
        if let Some(credentials) = credentials {
            session.token = Some(self.authenticate(&session, credentials, deadline).await?);
        }
        *self.lock() = Some(session.clone());
        Ok(session)
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
        let err = Member::new("not a url").expect_err("not a url");
        assert!(
            matches!(err, EtcdError::InvalidEndpoint { ref endpoint, .. } if endpoint == "not a url")
        );
    }
}
