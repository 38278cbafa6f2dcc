//! The single-node lease lock, polling: `SET key token NX PX ttl`, retried
//! with a [`RetryStrategy`](crate::RetryStrategy) until a deadline.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{self, Claim, Held, LockService, Reply};
use crate::call;
use crate::compare::Step;
use crate::connection::{Connection, RECONNECT_RETRIES};
use crate::endpoint::Endpoint;
use crate::error::{Error, Result};
use crate::fencing::{FencedKeys, FencingToken};
use crate::node::{Attempt, Node, RedisConnection, ttl_millis};
use crate::service::Service;
use crate::stats::LockerStats;

/// How long a single Redis request may take when the caller gave no tighter
/// deadline: 1 s.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(1);

/// How long a fence counter lives after the last lease that took or
/// refreshed it: 30 days ([`LockerBuilder::fence_ttl`]).
pub const DEFAULT_FENCE_TTL: Duration = Duration::from_secs(30 * 24 * 60 * 60);

/// Rejects a zero fence TTL (use `None` for "forever"). No I/O.
pub(crate) fn check_fence_ttl(ttl: Option<Duration>) -> Result<()> {
    match ttl {
        Some(ttl) if ttl < Duration::from_millis(1) => Err(Error::InvalidOptions(
            "fence_ttl must be at least 1 ms (None keeps counters forever)",
        )),
        _ => Ok(()),
    }
}

/// Takes leases on one Redis server (or one Redis Cluster), polling while
/// the lock is busy.
///
/// Cheap to clone: clones share the connection, which redis-rs multiplexes.
/// Generic over the connection type; the default, opened by
/// [`Locker::connect`] (or [`LockerBuilder::connect`]), is a reconnecting
/// [`Connection`]: after Redis
/// restarts or the connection drops, the request that finds it broken fails
/// ([`Error::Unreachable`], which [`is_retryable`](Error::is_retryable))
/// and starts a reconnect, and the next request goes out on the new
/// connection; when the server refuses the reconnect's credentials (an ACL
/// user lost on an empty restart), requests fail with [`Error::Auth`] (also
/// retryable) and the handshake is tried again with backoff, so the locker
/// works again as soon as the server accepts it. A bare
/// [`MultiplexedConnection`](redis::aio::MultiplexedConnection) never
/// reconnects: once it breaks, every request fails until you build a new
/// locker, so use it only where something else replaces it. A redis-rs
/// [`ConnectionManager`](redis::aio::ConnectionManager) reconnects, but
/// once the server refused a reconnect's credentials it answers every
/// later request with that refusal, until you build a new one. A connection
/// of yours goes in through [`LockerBuilder::build`].
///
/// A Redis Cluster connection works too (feature `cluster`; the keys of one
/// lock must share a hash tag, such as `lock:{wallet:42}`). Give its client
/// short retry waits: redis-rs's cluster client waits at least 1.28 s
/// before it retries a request that met `TRYAGAIN`, `CLUSTERDOWN`,
/// `MASTERDOWN` or `LOADING` (a slot migration, a failover), many times a
/// lease's TTL. The locker's command timeout cuts that wait short (a
/// retryable [`Error::Timeout`]), but the caller has waited it out.
///
/// ```no_run
/// # async fn cluster() -> Result<(), Box<dyn std::error::Error>> {
/// let client = redis::cluster::ClusterClient::builder(vec!["redis://127.0.0.1:7000"])
///     .min_retry_wait(1) // ms
///     .max_retry_wait(50) // ms
///     .build()?;
/// let locker = leasehold::Locker::builder().build(client.get_async_connection().await?)?;
/// # let _ = locker;
/// # Ok(())
/// # }
/// ```
///
/// It is a [`LockService`], so a [`Lessor`](crate::Lessor): the same four
/// calls take a lease every way (see also
/// [`HandoffLocker`](crate::HandoffLocker) and [`Quorum`](crate::Quorum)):
/// [`acquire`](crate::Lessor::acquire),
/// [`acquire_with`](crate::Lessor::acquire_with),
/// [`acquire_all`](crate::Lessor::acquire_all) and
/// [`with_lock`](crate::Lessor::with_lock) (`use leasehold::Lessor`).
/// Pass a key (`&str`) for a plain lock, [`FencedKeys`](crate::FencedKeys)
/// for a fenced one.
#[derive(Clone)]
pub struct Locker<C = Connection> {
    pub(crate) node: Arc<Node<C>>,
}

impl<C> std::fmt::Debug for Locker<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Locker").finish_non_exhaustive()
    }
}

/// Builds a [`Locker`] with non-default settings: [`connect`](Self::connect)
/// opens the locker's own reconnecting connection, [`build`](Self::build)
/// wraps a connection of yours (a cluster or multiplexed connection).
///
/// ```no_run
/// # async fn demo(client: redis::Client) -> leasehold::Result<()> {
/// use std::time::Duration;
/// use leasehold::Locker;
///
/// let locker = Locker::builder()
///     .command_timeout(Duration::from_millis(500))
///     .fence_ttl(Some(Duration::from_secs(7 * 24 * 60 * 60)))
///     .connect(&client)
///     .await?;
/// # let _ = locker;
/// # Ok(())
/// # }
/// ```
#[must_use]
#[derive(Debug, Clone)]
pub struct LockerBuilder {
    command_timeout: Duration,
    fence_ttl: Option<Duration>,
}

impl LockerBuilder {
    /// Bounds every Redis request that has no tighter deadline of its own
    /// (release, and each attempt of an acquire whose deadline is further
    /// away). A locker from [`connect`](Self::connect) also opens its
    /// connection, and bounds each response on it, within this timeout.
    ///
    /// Defaults to [`DEFAULT_COMMAND_TIMEOUT`] (1 s).
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// How long a fence counter lives after the last lease that used it
    /// (every fenced acquire, grant, relay and refresh resets its expiry,
    /// so a long term keeps its counter); `None` keeps counters forever. A
    /// counter that expired restarts at the server's clock, above every
    /// token issued before (see [`FencingToken`](crate::FencingToken)), so
    /// counters of idle resources can go away: a service that locks
    /// millions of distinct resources does not keep a key for each
    /// forever.
    ///
    /// Defaults to [`DEFAULT_FENCE_TTL`] (30 days).
    pub fn fence_ttl(mut self, ttl: Option<Duration>) -> Self {
        self.fence_ttl = ttl;
        self
    }

    /// Rejects settings no locker can use. No I/O.
    pub(crate) fn check(&self) -> Result<()> {
        if self.command_timeout.is_zero() {
            return Err(Error::InvalidOptions("command timeout must be positive"));
        }
        check_fence_ttl(self.fence_ttl)
    }

    /// Checks the settings, then opens a reconnecting [`Connection`] to
    /// `redis` (a `&redis::Client`'s server, or with the `sentinel` feature
    /// the primary a [`Sentinel`](crate::Sentinel) finds, followed across
    /// failovers: see [`sentinel`](crate::sentinel)) and builds the locker
    /// over it. This is the way in for a long-lived service: the locker
    /// outlives Redis restarts and dropped connections.
    ///
    /// When a request finds the connection broken (Redis restarted, the
    /// connection was killed or timed out at the TCP level), that request
    /// fails and a reconnect starts at once, retried twice within a few
    /// hundred milliseconds; requests sent meanwhile wait for it (bounded
    /// by their own deadlines). If Redis is still down, those requests fail
    /// and the next one starts a new reconnect; an acquire retries within
    /// its deadline, so it gets the lock as soon as Redis is back. A
    /// refused handshake (an ACL user lost on an empty restart) is tried
    /// again with backoff, and the locker works again within about half a
    /// second of the server accepting it. Opening the connection, and each
    /// response on it, is bounded by the
    /// [command timeout](Self::command_timeout).
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] for a zero command timeout or fence TTL,
    /// before any I/O; [`Error::Unreachable`] when nothing listens,
    /// [`Error::Timeout`] when the server accepts the connection but does
    /// not answer (a paused process), [`Error::Auth`] for wrong
    /// credentials. Over TLS (see [`tls`](crate::tls)):
    /// [`Error::TlsCertificate`] when the server's certificate is refused,
    /// [`Error::ClientCertRejected`] when the server refuses ours,
    /// [`Error::NotTls`] for a `rediss://` URL to a plain port and
    /// [`Error::TlsExpected`] for a `redis://` URL to a TLS port (telling
    /// these two apart from a closed or silent server takes one probe of
    /// the port, up to 250 ms more after the failure). Through Sentinel:
    /// [`Error::UnknownMaster`], [`Error::SentinelUnreachable`],
    /// [`Error::NoPrimary`].
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future drops the half-open connection.
    pub async fn connect(self, redis: impl Into<Endpoint>) -> Result<Locker> {
        self.check()?;
        let conn = connect(&redis.into(), self.command_timeout).await?;
        self.build(conn)
    }

    /// Checks the settings and builds the locker over `conn`, a connection
    /// of yours (see [`Locker`] on which kinds recover). No I/O.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] for a zero command timeout or fence TTL.
    pub fn build<C: RedisConnection>(self, conn: C) -> Result<Locker<C>> {
        self.check()?;
        Ok(Locker {
            node: Arc::new(Node::new(conn, self.command_timeout, self.fence_ttl)),
        })
    }
}

impl Locker<Connection> {
    /// Opens a reconnecting connection to `redis` (a `&redis::Client`, or a
    /// [`&Sentinel`](crate::Sentinel)) and wraps it in
    /// a locker with default settings: `Locker::builder().connect(redis)`
    /// (see [`LockerBuilder::connect`] for how the connection recovers).
    /// This is the way in for a long-lived service.
    ///
    /// # Errors
    /// As [`LockerBuilder::connect`]: [`Error::Unreachable`],
    /// [`Error::Timeout`], [`Error::Auth`], and over TLS
    /// [`Error::TlsCertificate`], [`Error::ClientCertRejected`],
    /// [`Error::NotTls`] or [`Error::TlsExpected`]; through Sentinel
    /// [`Error::UnknownMaster`], [`Error::SentinelUnreachable`] or
    /// [`Error::NoPrimary`].
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future drops the half-open connection.
    pub async fn connect(redis: impl Into<Endpoint>) -> Result<Self> {
        Locker::builder().connect(redis).await
    }

    /// A builder for non-default settings, which then opens the locker's
    /// own connection ([`LockerBuilder::connect`]) or wraps yours
    /// ([`LockerBuilder::build`]).
    pub fn builder() -> LockerBuilder {
        LockerBuilder {
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            fence_ttl: Some(DEFAULT_FENCE_TTL),
        }
    }
}

/// Opens a reconnecting [`Connection`] whose connect and response timeouts
/// are both `timeout`, mapping failures to [`Error`].
///
/// When a request finds the connection broken (Redis restarted, the
/// connection was killed or timed out at the TCP level), that request fails
/// and a reconnect starts at once, retried twice within a few tens of
/// milliseconds; requests sent meanwhile wait for it (bounded by their own
/// deadlines). If Redis is still down, those requests fail and the next one
/// starts a new reconnect. If Redis refuses the reconnect's handshake (the
/// ACL user is gone, its password changed), requests fail at once with
/// [`Error::Auth`] and the handshake is tried again after a backoff of 50
/// to 500 ms: the connection works again within about half a second of the
/// server accepting it. See [`Connection`].
pub(crate) async fn connect(endpoint: &Endpoint, timeout: Duration) -> Result<Connection> {
    let conn = Connection::lazy(endpoint.clone(), timeout, RECONNECT_RETRIES);
    let deadline = Instant::now() + timeout;
    let connected = call::bounded("connect", "", deadline, conn.established())
        .await
        .map(|()| conn);
    #[cfg(feature = "tls")]
    let connected = match (connected, endpoint.server()) {
        (Err(err), Some(client)) => Err(crate::tls::explain(client, err).await),
        (connected, _) => connected,
    };
    connected
}

impl<C: RedisConnection> Locker<C> {
    /// The bound on a single Redis request; see
    /// [`LockerBuilder::command_timeout`].
    pub fn command_timeout(&self) -> Duration {
        self.node.command_timeout()
    }

    /// The connection this locker sends its requests on, for commands of
    /// your own: a clone shares it (and, for a [`Connection`], its
    /// reconnects).
    pub fn connection(&self) -> &C {
        self.node.connection()
    }

    /// What this locker and its clones have asked of Redis so far.
    pub fn stats(&self) -> LockerStats {
        self.node.counters.snapshot()
    }
}

/// Polling Redis: each step is one `SET NX` (with the fence script for a
/// fenced claim); the lease is given back with a token-checked delete.
impl<C: RedisConnection> LockService for Locker<C> {
    type Entry = ();

    fn service(&self) -> Service {
        Service::REDIS
    }

    fn command_timeout(&self) -> Duration {
        self.node.command_timeout()
    }

    fn mode(&self) -> &'static str {
        "poll"
    }

    fn step<'a>(
        &'a self,
        claim: &'a Claim,
        (): &'a mut (),
        deadline: Instant,
    ) -> Reply<'a, backend::Step> {
        let node = &self.node;
        node.counters.acquire_request();
        Box::pin(async move {
            let px = ttl_millis(claim.ttl());
            let won = match claim.fence_key() {
                None => match node
                    .set_nx(claim.key(), claim.token(), px, deadline)
                    .await?
                {
                    Attempt::Won(()) => Some(None),
                    Attempt::Busy => None,
                },
                Some(fence_key) => {
                    let keys = FencedKeys::new(claim.key(), fence_key)?;
                    match node
                        .set_nx_fenced(&keys, claim.token(), px, deadline)
                        .await?
                    {
                        Attempt::Won(fence) => Some(Some(fence)),
                        Attempt::Busy => None,
                    }
                }
            };
            Ok(match won {
                Some(fence) => {
                    node.counters.acquisition();
                    backend::Step::won(fence)
                }
                None => backend::Step::busy(),
            })
        })
    }

    fn undo<'a>(&'a self, claim: &'a Claim, (): &'a mut (), deadline: Instant) -> Reply<'a, ()> {
        Box::pin(async move {
            self.node
                .token_checked(Step::Release, claim.key(), None, claim.token(), deadline)
                .await
                .map(drop)
        })
    }

    /// The lock an unknown step may have taken is given back with
    /// retries until it would have expired anyway.
    fn abandon(&self, claim: Claim, (): (), maybe_taken: bool) {
        if maybe_taken {
            let until = Instant::now() + claim.ttl();
            let held = Held {
                key: claim.key,
                token: claim.token,
                fence_key: None,
                fence: None,
            };
            crate::served::spawn_release(self.clone(), held, until);
        }
    }

    fn refresh<'a>(&'a self, held: &'a Held, ttl: Duration, deadline: Instant) -> Reply<'a, bool> {
        Box::pin(self.node.token_checked(
            Step::Refresh { ttl },
            held.key(),
            held.fence_key(),
            held.token(),
            deadline,
        ))
    }

    fn release<'a>(&'a self, held: &'a Held, deadline: Instant) -> Reply<'a, bool> {
        Box::pin(
            self.node
                .token_checked(Step::Release, held.key(), None, held.token(), deadline),
        )
    }

    fn offers_replicas(&self) -> bool {
        true
    }

    fn wait_replicas<'a>(
        &'a self,
        key: &'a str,
        replicas: u32,
        timeout: Duration,
    ) -> Reply<'a, u64> {
        Box::pin(self.node.wait_replicas(key, replicas, timeout))
    }

    fn raise_fence<'a>(
        &'a self,
        fence_key: &'a str,
        at_least: FencingToken,
        deadline: Instant,
    ) -> Reply<'a, ()> {
        Box::pin(async move {
            self.node.raise_fence(fence_key, at_least, deadline).await?;
            Ok(())
        })
    }

    fn announce<'a>(
        &'a self,
        held: &'a Held,
        record_key: &'a str,
        body: &'a str,
        deadline: Instant,
    ) -> Reply<'a, bool> {
        Box::pin(
            self.node
                .announce(held.key(), record_key, held.token(), body, deadline),
        )
    }

    fn leader_record<'a>(
        &'a self,
        key: &'a str,
        record_key: &'a str,
    ) -> Reply<'a, Option<(String, i64)>> {
        let deadline = Instant::now() + self.node.command_timeout();
        Box::pin(self.node.leader(key, record_key, deadline))
    }
}
