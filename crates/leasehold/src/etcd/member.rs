//! One etcd member as the client sees it: its endpoint, and the session
//! (a connection proven to answer, with its auth token) it keeps to it.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::{Instant, timeout_at};
use tonic::Request;
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
    token: Option<AsciiMetadataValue>,
    generation: u64,
}

impl Session {
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
    url: String,
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
            .tcp_nodelay(true)
            .http2_keep_alive_interval(KEEP_ALIVE)
            .keep_alive_timeout(KEEP_ALIVE)
            .keep_alive_while_idle(true);
        Ok(Self {
            url: url.to_owned(),
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
            endpoint: self.url.clone(),
        };
        let channel = timeout_at(deadline, self.endpoint.connect())
            .await
            .map_err(|_| timed_out())?
            .map_err(|source| EtcdError::Connect {
                endpoint: self.url.clone(),
                source,
            })?;
        let mut session = Session {
            channel,
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
            endpoint: self.url.clone(),
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
                endpoint: self.url.clone(),
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
                    endpoint: self.url.clone(),
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
