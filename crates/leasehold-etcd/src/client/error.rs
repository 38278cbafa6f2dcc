//! What can go wrong talking to etcd, and which failures may be retried.

use tonic::Status;

/// An error of the etcd client.
///
/// The variants say what is known of the request's outcome:
/// [`OutcomeUnknown`](Self::OutcomeUnknown) is the one that matters for a
/// write: etcd may have applied it. Every other variant means the request
/// was not applied, or (for [`Rejected`](Self::Rejected) and the other
/// refusals) that etcd refused it.
///
/// No variant carries a password or an auth token: credentials are never
/// part of an error's text or its `Debug` output.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EtcdError {
    /// The client was given no endpoint.
    #[error("no etcd endpoint given")]
    NoEndpoints,

    /// An endpoint is not a URL the client can dial (`http://host:port`).
    #[error("invalid etcd endpoint {endpoint:?}")]
    InvalidEndpoint {
        /// The endpoint as given.
        endpoint: String,
        /// Why it is invalid.
        #[source]
        source: tonic::transport::Error,
    },

    /// The caller's deadline passed (or had passed when the request came
    /// in) before any member answered. Nothing was applied: a write whose
    /// outcome is unknown is [`OutcomeUnknown`](Self::OutcomeUnknown)
    /// instead.
    #[error("the deadline passed before etcd answered (after {attempts} attempts)")]
    DeadlineExceeded {
        /// How many members were tried (0 if the deadline had passed).
        attempts: u32,
        /// The last attempt's failure, if there was one.
        #[source]
        last: Option<Box<EtcdError>>,
    },

    /// A write reached a member (or may have) and no answer came: the
    /// connection broke, or the deadline passed while the member worked
    /// on it. etcd may have applied it, or may apply it later; the client
    /// does not resend it. Read what the write was meant to change to
    /// learn its outcome. The next request goes to another member.
    #[error("etcd at {endpoint} may or may not have applied the write")]
    OutcomeUnknown {
        /// The member the write went to.
        endpoint: String,
        /// The failure, or `None` if the deadline passed first.
        #[source]
        source: Option<Status>,
    },

    /// An `https://` endpoint, but the client has no TLS settings (or this
    /// build has no TLS: leasehold's `tls` feature), or its host is not a
    /// name or address a certificate can be checked against.
    #[error("etcd endpoint {endpoint} needs tls settings")]
    TlsRequired {
        /// The endpoint as given.
        endpoint: String,
    },

    /// The TLS handshake with a member failed (nothing was sent): we
    /// refused its certificate, it refused ours, or it does not speak TLS.
    /// The certificate or the settings must change; the client still
    /// tries the other members within the deadline.
    #[cfg(feature = "tls")]
    #[error("tls with etcd at {endpoint} failed: {failure}")]
    Tls {
        /// The member.
        endpoint: String,
        /// What the handshake's failure says.
        failure: leasehold::tls::TlsFailure,
        /// The transport's error.
        #[source]
        source: tonic::transport::Error,
    },

    /// The member refused our TLS client certificate (or wanted one) on a
    /// new connection's first request: with TLS 1.3 its refusal comes after
    /// our side of the handshake. Nothing of the caller's request was sent.
    #[cfg(feature = "tls")]
    #[error("tls with etcd at {endpoint} failed: {failure}")]
    TlsRefused {
        /// The member.
        endpoint: String,
        /// What the alert says.
        failure: leasehold::tls::TlsFailure,
        /// What the request saw after it (a lost connection, no answer).
        #[source]
        source: Box<EtcdError>,
    },

    /// Connecting to a member failed (nothing was sent).
    #[error("could not connect to etcd at {endpoint}")]
    Connect {
        /// The member.
        endpoint: String,
        /// The transport's error.
        #[source]
        source: tonic::transport::Error,
    },

    /// A member did not answer within the attempt's time (a read, or the
    /// check a new connection makes before it carries a request).
    #[error("etcd at {endpoint} did not answer in time")]
    AttemptTimedOut {
        /// The member.
        endpoint: String,
    },

    /// A member failed a request that is safe to send again (a read, or a
    /// request etcd refused before applying it, such as `no leader`).
    #[error("etcd at {endpoint} failed the request")]
    Unavailable {
        /// The member.
        endpoint: String,
        /// etcd's or the transport's status.
        #[source]
        source: Status,
    },

    /// The lease does not exist: it expired, was revoked, or never was.
    #[error("etcd lease {lease:x} not found (expired or revoked)")]
    LeaseNotFound {
        /// The lease ID.
        lease: i64,
    },

    /// etcd refused the user name or password (or authentication is not
    /// enabled on the cluster).
    #[error("etcd refused to authenticate user {user:?}")]
    AuthFailed {
        /// The user name (never the password).
        user: String,
        /// etcd's status.
        #[source]
        source: Status,
    },

    /// A watch asked for revisions etcd has compacted away: restart from
    /// a fresh read, not from the same revision.
    #[error("etcd compacted the revisions from {revision} on (oldest kept: {compact_revision})")]
    Compacted {
        /// The revision the watch asked for.
        revision: i64,
        /// The oldest revision etcd still has.
        compact_revision: i64,
    },

    /// A watch stream ended or broke (its member stopped, lost its leader,
    /// or the connection broke): open a new one from
    /// [`WatchStream::next_revision`](super::WatchStream::next_revision).
    #[error("the watch on etcd at {endpoint} ended")]
    WatchLost {
        /// The member the watch ran on.
        endpoint: String,
        /// The status it ended with, if any.
        #[source]
        source: Option<Status>,
    },

    /// etcd canceled a watch for a reason of its own.
    #[error("etcd canceled the watch: {reason}")]
    WatchCanceled {
        /// etcd's reason.
        reason: String,
    },

    /// etcd refused the request (a bad argument, a permission, a full
    /// database, ...): sending it again would not help.
    #[error("etcd refused the request")]
    Rejected {
        /// etcd's status.
        #[source]
        source: Status,
    },
}

impl EtcdError {
    /// Whether etcd refused a write that stores something because the
    /// cluster is out of space (its `NOSPACE` alarm, raised when the
    /// backend outgrew `--quota-backend-bytes`: "database space
    /// exceeded"). Until an operator compacts, defragments and disarms the
    /// alarm, etcd refuses every put and lease grant and still applies
    /// deletes and lease revokes, so a release still gives the lock back,
    /// and an acquire rides it out within its wait (it is
    /// [retryable](Self::is_retryable)).
    pub fn is_no_space(&self) -> bool {
        matches!(self, Self::Rejected { source }
            if source.code() == tonic::Code::ResourceExhausted
                && source.message().contains("database space exceeded"))
    }

    /// Whether the request may have been applied: a write that failed this
    /// way must be checked (by reading what it changes), not resent
    /// blindly.
    pub fn is_outcome_unknown(&self) -> bool {
        matches!(self, Self::OutcomeUnknown { .. })
    }

    /// Whether the same request may succeed if sent again with a new
    /// deadline (the cluster was unreachable or busy, or out of space:
    /// [`is_no_space`](Self::is_no_space), which passes when an operator
    /// frees space, as a full Redis passes when memory frees); `false` for
    /// any other refusal, for bad input, and for an unknown outcome (which
    /// needs a read first).
    pub fn is_retryable(&self) -> bool {
        if self.is_no_space() {
            return true;
        }
        match self {
            Self::DeadlineExceeded { .. }
            | Self::Connect { .. }
            | Self::AttemptTimedOut { .. }
            | Self::Unavailable { .. }
            | Self::WatchLost { .. } => true,
            #[cfg(feature = "tls")]
            Self::Tls { .. } | Self::TlsRefused { .. } => false,
            Self::NoEndpoints
            | Self::InvalidEndpoint { .. }
            | Self::TlsRequired { .. }
            | Self::OutcomeUnknown { .. }
            | Self::LeaseNotFound { .. }
            | Self::AuthFailed { .. }
            | Self::Compacted { .. }
            | Self::WatchCanceled { .. }
            | Self::Rejected { .. } => false,
        }
    }

    /// The TLS failure this error is, if it is one.
    #[cfg(feature = "tls")]
    pub fn tls_failure(&self) -> Option<leasehold::tls::TlsFailure> {
        match self {
            Self::Tls { failure, .. } | Self::TlsRefused { failure, .. } => Some(*failure),
            _ => None,
        }
    }

    /// Whether this is a TLS failure ([`Tls`](Self::Tls) or
    /// [`TlsRefused`](Self::TlsRefused)); always `false` without the `tls`
    /// feature.
    pub(crate) fn is_tls(&self) -> bool {
        #[cfg(feature = "tls")]
        return self.tls_failure().is_some();
        #[cfg(not(feature = "tls"))]
        false
    }

    /// The TLS failure that made every attempt fail, as the error itself,
    /// when the deadline passed after one ([`DeadlineExceeded`](Self::DeadlineExceeded)
    /// with a [`Tls`](Self::Tls) last failure); any other error as it is.
    /// A connect reports why it failed, not only that time ran out.
    pub(crate) fn into_tls_failure(self) -> Self {
        match self {
            #[cfg(feature = "tls")]
            Self::DeadlineExceeded {
                last: Some(last), ..
            } if last.is_tls() => *last,
            other => other,
        }
    }

    /// Whether the lease the request named does not exist (it expired,
    /// was revoked, or never was): [`LeaseNotFound`](Self::LeaseNotFound),
    /// or etcd's refusal of a put under it.
    pub(crate) fn is_lease_not_found(&self) -> bool {
        matches!(self, Self::LeaseNotFound { .. })
            || self
                .rejected_message()
                .is_some_and(|message| message.contains("requested lease not found"))
    }

    /// etcd's status if etcd refused the request with one.
    pub(crate) fn rejected_message(&self) -> Option<&str> {
        match self {
            Self::Rejected { source } => Some(source.message()),
            _ => None,
        }
    }
}
