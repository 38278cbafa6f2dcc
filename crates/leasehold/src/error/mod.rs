//! The crate's one error type.
//!
//! This file holds the type and what callers ask of it
//! ([`is_retryable`](Error::is_retryable), ...); `classify` maps what the
//! Redis client reports to the variant that names its outcome.

mod classify;

use std::path::PathBuf;
use std::time::Duration;

use crate::lost::LostCause;
use crate::service::Service;
use crate::tls_failure::CertificateProblem;

/// Why an acquire gave up without the lock.
///
/// Every way of not getting the lock comes back as [`Error::NotAcquired`] with
/// one of these reasons, whatever retry strategy or options were chosen, so a
/// caller can match on one variant and still tell the cases apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GiveUpReason {
    /// The lock was held by someone else on every attempt and the retry
    /// strategy ran out of waits (for example [`RetryStrategy::none`], as used
    /// by a single attempt).
    ///
    /// [`RetryStrategy::none`]: crate::RetryStrategy::none
    RetriesExhausted,
    /// The caller's deadline passed while the lock was still held by someone
    /// else.
    DeadlineExpired,
    /// The caller's cancellation token fired while waiting.
    Cancelled,
}

impl GiveUpReason {
    /// Its value in traces and metrics: `retries_exhausted`,
    /// `deadline_expired`, `cancelled`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            GiveUpReason::RetriesExhausted => "retries_exhausted",
            GiveUpReason::DeadlineExpired => "deadline_expired",
            GiveUpReason::Cancelled => "cancelled",
        }
    }
}

impl std::fmt::Display for GiveUpReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            GiveUpReason::RetriesExhausted => "retries exhausted",
            GiveUpReason::DeadlineExpired => "deadline expired",
            GiveUpReason::Cancelled => "cancelled",
        })
    }
}

/// Which file an [`Error::TlsFile`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TlsFileRole {
    /// The CA certificate(s) the server is verified against.
    Ca,
    /// The client certificate.
    Cert,
    /// The client certificate's private key.
    Key,
}

impl std::fmt::Display for TlsFileRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TlsFileRole::Ca => "ca",
            TlsFileRole::Cert => "client certificate",
            TlsFileRole::Key => "client key",
        })
    }
}

/// Everything that can go wrong when taking, keeping or giving back a lease.
///
/// Variants are named after outcomes. Messages are lowercase and never repeat
/// the text of the underlying Redis error: walk [`std::error::Error::source`]
/// for that. No message contains a password or a connection URL.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lock stayed busy until the caller stopped waiting.
    ///
    /// An acquire that saw the lock held by someone else and then met a
    /// fault that may pass (a timeout, a restart, a full server) which
    /// lasted until its wait ran out gives up this way too, with that
    /// fault in [`fault`](Error::NotAcquired::fault) (and as its
    /// [`source`](std::error::Error::source)): the lock was busy, and the
    /// service also failed at the end, which the caller handles as busy.
    /// An acquire whose every request failed never learned whether the
    /// lock was busy: it returns the fault itself (a
    /// [`Timeout`](Error::Timeout), ...), not this.
    #[error(
        "lock {key:?} not acquired after {attempts} attempts in {waited:?}: {reason}{}",
        if fault.is_some() { ", the lock busy and then its service failing" } else { "" }
    )]
    NotAcquired {
        /// The lock key.
        key: String,
        /// How many times the lock was requested from the service.
        attempts: u32,
        /// Time spent from the first request to giving up.
        waited: Duration,
        /// Why the acquire stopped.
        reason: GiveUpReason,
        /// The fault the acquire was riding out when it stopped, after it
        /// had seen the lock busy: `None` when the service's last answer
        /// was "busy".
        #[source]
        fault: Option<Box<Error>>,
    },

    /// Too few servers of a quorum answered for a majority to be possible
    /// (Redlock): the lock is not necessarily busy, the servers are down or
    /// slow.
    #[error(
        "lock {key:?}: quorum not reached, {got} of {needed} votes, {failed_nodes} servers failed"
    )]
    QuorumNotReached {
        /// The lock key.
        key: String,
        /// Yes votes (or confirmations) received.
        got: usize,
        /// Votes needed: a strict majority.
        needed: usize,
        /// Servers that errored or did not answer in time.
        failed_nodes: usize,
    },

    /// The lock was won on the primary, but fewer replicas than asked for
    /// ([`AcquireOptions::wait_replicas`](crate::AcquireOptions::wait_replicas))
    /// acknowledged it in time: a failover now could lose it and let a
    /// second holder in. The lock was released (token-checked) before this
    /// was returned. The acquire already took the lock again and again
    /// within its wait (each time given back): this is what the last try
    /// found when the wait ran out.
    ///
    /// Retryable: the replicas may be lagging or briefly unreachable, and a
    /// later acquire can be confirmed. While they stay down, every acquire
    /// fails this way (the lock is unavailable, which is the point).
    #[error("lock {key:?} not replicated: {acked} of {wanted} replicas acknowledged it")]
    NotReplicated {
        /// The lock key.
        key: String,
        /// Replicas that acknowledged the write.
        acked: u32,
        /// Replicas asked for.
        wanted: u32,
    },

    /// The lease is no longer ours: it expired or another holder took the
    /// key. Returned by release (and refresh), which then changed nothing.
    #[error("lock {key:?} not held: the lease expired or changed hands")]
    NotHeld {
        /// The lock key.
        key: String,
    },

    /// The lease was lost while protected work ran (or before it started):
    /// the watchdog found the key gone, or could not confirm it before the
    /// lease's deadline. Returned by [`Lease::run`](crate::Lease::run)
    /// instead of the work's output, which was cancelled.
    #[error("lock {key:?} on {service} lost: {cause}")]
    LeaseLost {
        /// The lock key.
        key: String,
        /// The service the lease lived on.
        service: Service,
        /// Why the watchdog gave up on the lease.
        cause: LostCause,
    },

    /// The TTL is outside the accepted range (at least 1 ms, at most
    /// [`MAX_TTL`](crate::MAX_TTL)). Rejected before any I/O.
    #[error("invalid lock ttl {ttl:?}: must be at least 1ms and at most {max:?}")]
    InvalidTtl {
        /// The rejected TTL.
        ttl: Duration,
        /// The largest accepted TTL.
        max: Duration,
    },

    /// The key is not usable as a lock key (for example, it is empty).
    /// Rejected before any I/O.
    #[error("invalid lock key {key:?}: {reason}")]
    InvalidKey {
        /// The rejected key.
        key: String,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// The lock key and the fence key of a fenced lock hash to different
    /// Redis Cluster slots, so one script cannot touch both. Give them the
    /// same hash tag (`lock:{wallet:42}`, `fence:{wallet:42}`), or use
    /// [`FencedKeys::for_resource`](crate::FencedKeys::for_resource).
    /// Rejected before any I/O.
    #[error(
        "lock key {lock:?} (slot {lock_slot}) and fence key {fence:?} (slot {fence_slot}) are in different cluster slots: give both the same {{hash tag}}"
    )]
    KeysInDifferentSlots {
        /// The lock key.
        lock: String,
        /// The fence key.
        fence: String,
        /// The lock key's hash slot.
        lock_slot: u16,
        /// The fence key's hash slot.
        fence_slot: u16,
    },

    /// The fence key holds something other than an integer counter below
    /// 2^53 (another type, text, a negative number or one out of range),
    /// or the token would pass [`FencingToken::MAX`](crate::FencingToken::MAX)
    /// (also a raise to beyond it), so no fencing token could be issued.
    /// The lock was not left taken.
    #[error("fence key {key:?} does not hold an integer counter below 2^53")]
    InvalidFence {
        /// The fence key.
        key: String,
        /// The script's error reply.
        #[source]
        source: ClientError,
    },

    /// An option combination that cannot work, such as a deadline already in
    /// the past. Rejected before any I/O.
    #[error("invalid options: {0}")]
    InvalidOptions(&'static str),

    /// The service (Redis, etcd, ...) did not answer within the caller's
    /// deadline or the locker's command timeout (a paused, overloaded or
    /// partitioned server).
    #[error("{service} did not answer {op} within {after:?}")]
    Timeout {
        /// The service that did not answer.
        service: Service,
        /// The operation that was waiting (`"acquire"`, `"release"`, ...).
        op: &'static str,
        /// How long it waited.
        after: Duration,
    },

    /// Redis could not be reached: connection refused, reset or dropped.
    #[error("redis unreachable during {op}")]
    Unreachable {
        /// The operation that failed.
        op: &'static str,
        /// The underlying client error.
        #[source]
        source: ClientError,
    },

    /// Redis refused our credentials (wrong password, unknown or disabled
    /// user, or a password is required).
    ///
    /// Retryable: the credentials may be refused for a while and then
    /// accepted again (an ACL user lost on an empty restart and recreated, a
    /// password being rotated), and the [`Connection`](crate::Connection)
    /// tries the handshake again with backoff, so a later call works as
    /// soon as the server accepts it. Credentials that are simply wrong fail
    /// the same way every time: [`Locker::connect`](crate::Locker::connect)
    /// reports them at startup, and a caller's deadline ends its retries.
    #[error("redis authentication failed")]
    Auth(#[source] ClientError),

    /// The Redis user may not run a command (or touch a key or channel)
    /// that `op` needs: its ACL is missing something (the README lists the
    /// minimal ACL for each mode). Not retryable.
    #[error("redis refused {op}: no permission to run {command}")]
    NoPermission {
        /// The operation that failed.
        op: &'static str,
        /// The command (or key, or channel) the ACL refused, as Redis named
        /// it.
        command: String,
        /// The server's error.
        #[source]
        source: ClientError,
    },

    /// The lock key exists but does not hold a string, so it is not a lock
    /// (another part of the application uses the same name).
    #[error("key {key:?} holds a value of the wrong type for a lock")]
    WrongType {
        /// The lock key.
        key: String,
        /// The server's WRONGTYPE reply.
        #[source]
        source: ClientError,
    },

    /// The server lacks a command this mode needs, such as the sharded
    /// pub/sub (`SSUBSCRIBE`, `SPUBLISH`, Redis 7.0 or newer) that a
    /// [`HandoffLocker`](crate::HandoffLocker) waits on. Found when the
    /// locker connects; not retryable.
    #[error("redis lacks {what}: needs redis {needs} or newer")]
    Unsupported {
        /// What is missing.
        what: &'static str,
        /// The oldest Redis version that has it.
        needs: &'static str,
        /// The server's error.
        #[source]
        source: ClientError,
    },

    /// The service answered with a reply we did not expect.
    #[error("unexpected reply from {service} to {op}")]
    UnexpectedReply {
        /// The service that answered.
        service: Service,
        /// The operation.
        op: &'static str,
    },

    /// The operating system's random source failed when the token
    /// generator needed a seed, so no token could be drawn. Nothing was
    /// sent to Redis.
    #[error("os random source unavailable")]
    Random(#[source] getrandom::Error),

    /// The Redis URL does not parse. The message does not quote the URL;
    /// the source is the client's error, which does not either.
    #[error("invalid redis url")]
    InvalidUrl(#[source] ClientError),

    /// A `rediss://` URL, in a build without the crate feature `tls`:
    /// turn it on (`leasehold = { version = "...", features = ["tls"] }`)
    /// or use a `redis://` URL. From [`client`](crate::client) and
    /// [`Sentinel::new`](crate::Sentinel::new) (with the `sentinel`
    /// feature), before any I/O. The message does not quote the URL.
    #[error(
        "a rediss:// (or https:// etcd) url needs tls, which this build leaves out: enable leasehold's tls feature"
    )]
    TlsNotEnabled,

    /// A TLS file given to [`tls::client`](crate::tls::client) cannot be
    /// used: it cannot be read, holds no PEM certificate (CA, certificate)
    /// or private key (key), holds one that does not parse, or the key
    /// does not match the certificate. Found before any I/O on the
    /// network. The message names the file, never its contents.
    #[error("tls {role} file {path:?} {problem}")]
    TlsFile {
        /// Which file.
        role: TlsFileRole,
        /// Its path, as given.
        path: PathBuf,
        /// What is wrong with it.
        problem: &'static str,
        /// The read error, when it could not be read.
        #[source]
        source: Option<std::io::Error>,
    },

    /// We refused the server's TLS certificate: it is not signed by a CA
    /// we trust, expired, not for this host... Not retryable: the
    /// certificate or the CA file must change.
    #[error("redis tls certificate refused during {op}: {problem}")]
    TlsCertificate {
        /// The operation that connected.
        op: &'static str,
        /// Why it was refused.
        problem: CertificateProblem,
        /// The client's error.
        #[source]
        source: ClientError,
    },

    /// A `rediss://` URL, but the port serves plain Redis: it answered the
    /// TLS handshake with something that is not TLS, or (found by
    /// [`LockerBuilder::connect`](crate::LockerBuilder::connect), which
    /// every `connect` that opens a locker's connection uses, and which
    /// probes the port once when the handshake times out) answered a plain `PING`. Use `redis://`, or the
    /// server's TLS port.
    #[error(
        "redis does not speak tls on this port (during {op}): use a redis:// url or its tls port"
    )]
    NotTls {
        /// The operation that connected.
        op: &'static str,
        /// The client's error, when it got one (none when the handshake
        /// timed out).
        #[source]
        source: Option<ClientError>,
    },

    /// A plain `redis://` URL, but the server on that port expects TLS (it
    /// answered a TLS hello): use `rediss://`. Found by
    /// [`LockerBuilder::connect`](crate::LockerBuilder::connect) (which
    /// every `connect` that opens a locker's connection uses), probing the
    /// port once when a plain connection is closed on it.
    #[error("redis expects tls on this port (during {op}): use a rediss:// url")]
    TlsExpected {
        /// The operation that connected.
        op: &'static str,
        /// The client's error from the plain attempt.
        #[source]
        source: ClientError,
    },

    /// The server refused our TLS client certificate (not signed by a CA
    /// it trusts, expired), or asked for one and we sent none: give
    /// [`TlsFiles::cert`](crate::tls::TlsFiles::cert) and
    /// [`key`](crate::tls::TlsFiles::key).
    #[error("redis refused our tls client certificate, or needs one, during {op}")]
    ClientCertRejected {
        /// The operation that connected.
        op: &'static str,
        /// The client's error.
        #[source]
        source: ClientError,
    },

    /// Through Redis Sentinel: every sentinel that answered knows no
    /// master by this name (a typo, or sentinels monitoring something
    /// else). Not retryable.
    #[error("the sentinels know no master named {name:?}")]
    UnknownMaster {
        /// The master name asked for.
        name: String,
    },

    /// Through Redis Sentinel: no sentinel answered (all down, unreachable,
    /// or the addresses are not sentinels). Retryable: the connection asks
    /// again on the next request.
    #[error("no sentinel reachable for master {master:?} during {op}")]
    SentinelUnreachable {
        /// The operation that connected.
        op: &'static str,
        /// The master name asked for.
        master: String,
    },

    /// Through Redis Sentinel: the sentinels know the master name but
    /// named no node that answers as primary, or the node they named was
    /// demoted before we used it: a failover in progress. Nothing was sent
    /// to a data node. Retryable: an acquire waits it out within its
    /// deadline.
    #[error("no primary for master {master:?} during {op}: a failover in progress")]
    NoPrimary {
        /// The operation that connected.
        op: &'static str,
        /// The master name asked for.
        master: String,
    },

    /// Redis is out of memory (`maxmemory` reached under the `noeviction`
    /// policy, `OOM`): it refuses writes until memory frees. Retryable: an
    /// acquire rides it out within its wait, and returns it when the wait
    /// runs out during it with the lock never seen busy (so a full server
    /// never looks like contention; see [`NotAcquired`](Error::NotAcquired)).
    #[error("redis out of memory during {op}: maxmemory reached, writes refused")]
    OutOfMemory {
        /// The operation that failed.
        op: &'static str,
        /// The server's reply (the reply alone: a `redis::RedisError`
        /// would say it twice, once itself and once as its source).
        #[source]
        source: redis::ServerError,
    },

    /// A request of a lock service outside this crate (a
    /// [`LockService`](crate::backend::LockService) of another crate)
    /// failed: `fault` says whether it may have acted and whether trying
    /// again may help. Made with [`Error::service`]. Retryable unless the
    /// service refused the request.
    #[error("{service} error during {op}")]
    Service {
        /// The service that failed.
        service: Service,
        /// The operation that failed (`"acquire"`, `"refresh"`,
        /// `"release"`, ...).
        op: &'static str,
        /// What the request did, as far as anyone can know.
        fault: ServiceFault,
        /// The service client's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },

    /// The lock service does not offer what was asked of it (a fence that
    /// cannot be raised, a leader record for an election).
    #[error("{service} does not offer {what}")]
    NotOffered {
        /// The service.
        service: Service,
        /// What it does not offer (`"raise_fence"`, `"election"`).
        what: &'static str,
    },

    /// Any other error from Redis or the client.
    #[error("redis error during {op}")]
    Redis {
        /// The operation that failed.
        op: &'static str,
        /// The underlying client error.
        #[source]
        source: ClientError,
    },
}

impl Error {
    /// True when trying the same operation again later may succeed: the lock
    /// was busy, Redis was slow or unreachable, was loading, failing over or
    /// busy with a script, a cluster slot was moving (`TRYAGAIN`, or a
    /// `MOVED` / `ASK` redirect the cluster client stopped following while
    /// the nodes disagreed on the slot's owner: Redis ran nothing), or its
    /// replicas did not acknowledge the lock in time, or its script cache
    /// lacked a script (`NOSCRIPT`: a failover or restart emptied it, the
    /// script did not run, and the next try loads it again), or it refused
    /// our credentials. `Unreachable` and `Auth` count as
    /// retryable because the connection
    /// [`Locker::connect`](crate::Locker::connect) opens reconnects, and
    /// authenticates again with backoff until the server accepts it (other
    /// connections may not: see [`Locker`](crate::Locker)).
    ///
    /// Invalid input, permission failures (`NOPERM`, whether we sent the
    /// refused command or one of our scripts did), TLS failures (a refused
    /// certificate, the wrong scheme for the port, an unusable file),
    /// unknown commands and wrong-type keys are not retryable. `NotHeld` is
    /// not retryable either: the lease is gone, and the right response is to
    /// stop the protected work, not to retry it; the same goes for
    /// `LeaseLost`.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::NotAcquired { reason, .. } => *reason != GiveUpReason::Cancelled,
            Error::Timeout { .. }
            | Error::Unreachable { .. }
            | Error::Auth(_)
            | Error::QuorumNotReached { .. }
            | Error::NotReplicated { .. }
            | Error::SentinelUnreachable { .. }
            | Error::NoPrimary { .. }
            | Error::OutOfMemory { .. } => true,
            Error::Service { fault, .. } => *fault != ServiceFault::Refused,
            Error::Redis { source, .. } => {
                source.is_io_error()
                    || source.is_timeout()
                    || matches!(
                        source.code(),
                        Some(
                            "LOADING"
                                | "BUSY"
                                | "TRYAGAIN"
                                | "MOVED"
                                | "ASK"
                                | "CLUSTERDOWN"
                                | "MASTERDOWN"
                                | "READONLY"
                                | "NOREPLICAS"
                                | "NOSCRIPT"
                        )
                    )
            }
            _ => false,
        }
    }

    /// An error of a lock service outside this crate, for its
    /// [`LockService`](crate::backend::LockService) implementation: `op`
    /// failed on `service` with `source`, and `fault` says what the
    /// request did. Its message names the service and the operation; the
    /// client's error is its [`source`](std::error::Error::source) (keep
    /// secrets out of it).
    pub fn service(
        service: Service,
        op: &'static str,
        fault: ServiceFault,
        source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Error {
        Error::Service {
            service,
            op,
            fault,
            source: source.into(),
        }
    }

    /// True when the error is about the lock not being ours (busy or lost),
    /// rather than about Redis or the input.
    pub fn is_contention(&self) -> bool {
        matches!(
            self,
            Error::NotAcquired { .. } | Error::NotHeld { .. } | Error::LeaseLost { .. }
        )
    }
}

impl From<getrandom::Error> for Error {
    fn from(err: getrandom::Error) -> Self {
        Error::Random(err)
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What the Redis client reported, as the source of an [`Error`], said
/// once.
///
/// redis-rs puts a server's reply (`WRONGTYPE ...`, `LOADING ...`) or an
/// I/O error in its error's message **and** returns it again as the
/// error's source, so a chain of sources (`{:#}` in `anyhow`, a log
/// line's causes) said it twice. This wrapper keeps the client's message
/// and skips a source whose text the message already holds. It
/// dereferences to the client's error ([`code`](redis::RedisError::code),
/// [`kind`](redis::RedisError::kind), ...).
#[derive(Debug)]
pub struct ClientError(redis::RedisError);

impl ClientError {
    /// The client's error.
    pub fn get_ref(&self) -> &redis::RedisError {
        &self.0
    }

    /// The client's error, owned.
    pub fn into_inner(self) -> redis::RedisError {
        self.0
    }
}

impl From<redis::RedisError> for ClientError {
    fn from(err: redis::RedisError) -> ClientError {
        ClientError(err)
    }
}

impl std::ops::Deref for ClientError {
    type Target = redis::RedisError;

    fn deref(&self) -> &redis::RedisError {
        &self.0
    }
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for ClientError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        let inner = std::error::Error::source(&self.0)?;
        if self.0.to_string().contains(&inner.to_string()) {
            inner.source()
        } else {
            Some(inner)
        }
    }
}

/// What a request of a service outside this crate did, as far as the
/// caller can know: the kind of an [`Error::Service`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServiceFault {
    /// The service refused the request (bad input, no permission, a wrong
    /// setup): it did not act, and trying again will not help.
    Refused,
    /// The request did not reach the service or was refused for now
    /// (unreachable, loading, failing over): it did not act, and trying
    /// again may help.
    Transient,
    /// The request may or may not have acted (a timeout, a connection lost
    /// with the request out): never reported as success; trying again
    /// may help.
    Unknown,
}
