//! The single-node lease lock, polling: `SET key token NX PX ttl`, retried
//! with a [`RetryStrategy`](crate::RetryStrategy) until a deadline.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use std::future::Future;

use crate::budget::Budget;
use crate::compare::Step;
use crate::connection::{Connection, RECONNECT_RETRIES};
use crate::endpoint::Endpoint;
use crate::error::{Error, Result};
use crate::fencing::{FencingToken, LockKeys, Target};
use crate::lease::{
    Backend, Lease, Part, Reply, release_retrying, release_runtime, spawn_dropped_release,
};
use crate::lessor::Lessor;
use crate::node::{Attempt, Node, RedisConnection, ttl_millis};
use crate::options::{AcquireOptions, Supports};
use crate::stats::LockerStats;
use crate::token::LeaseToken;
use crate::way::{self, Way};
use crate::{call, rounds};

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
/// The same four calls take a lease every way (see also
/// [`HandoffLocker`](crate::HandoffLocker) and [`Quorum`](crate::Quorum)):
/// [`acquire`](Self::acquire), [`acquire_with`](Self::acquire_with),
/// [`acquire_all`](Self::acquire_all) and [`with_lock`](Self::with_lock).
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

    /// Takes the lease on `keys` for `ttl` with the default
    /// [`AcquireOptions`] (up to 10 s, random 5 to 15 ms between attempts).
    ///
    /// See [`acquire_with`](Self::acquire_with) for errors and cancel safety.
    pub async fn acquire(&self, keys: impl LockKeys, ttl: Duration) -> Result<Lease> {
        self.acquire_with(keys, ttl, &AcquireOptions::default())
            .await
    }

    /// Takes the lease on `keys` for `ttl`: `SET key token NX PX ttl` with a
    /// fresh 128-bit token, retried while the key is busy, as `opts` says.
    /// Given [`FencedKeys`](crate::FencedKeys), one script takes the lock
    /// and, only if that worked, issues the next [`FencingToken`] from the
    /// fence counter (above the counter and the server's clock, see
    /// [`FencingToken`]): only a holder gets a token.
    ///
    /// The lease's validity is counted from the moment the winning request
    /// was *sent*, so the holder's idea of its remaining time is never longer
    /// than Redis's. Every [`AcquireOptions`] field applies.
    ///
    /// # Errors
    /// - [`Error::InvalidTtl`] / [`Error::InvalidKey`] /
    ///   [`Error::InvalidOptions`] (a zero replica wait) before any I/O;
    /// - [`Error::NotAcquired`] when the key stayed busy, with the reason:
    ///   retries exhausted, deadline expired, or cancelled;
    /// - [`Error::Timeout`] (each request is bounded by the deadline and the
    ///   command timeout), [`Error::Unreachable`], [`Error::Auth`],
    ///   [`Error::OutOfMemory`] and the other retryable faults
    ///   ([`Error::is_retryable`]) are retried within the wait, and
    ///   returned when it runs out during them (see the guide's table,
    ///   "Which errors an acquire rides out");
    /// - [`Error::WrongType`] (the key holds a non-string value) and
    ///   [`Error::NoPermission`], returned at once without retrying;
    /// - [`Error::InvalidFence`] when the fence key holds anything but a
    ///   integer counter below 2^53 (the lock is not left taken);
    /// - [`Error::InvalidOptions`] when [`AcquireOptions::watchdog`] is set
    ///   but there is no tokio runtime to run it on (the lease just taken is
    ///   then released in the background);
    /// - [`Error::NotReplicated`] when
    ///   [`AcquireOptions::wait_replicas`] is set and too few replicas
    ///   acknowledged the lock: it was released again.
    ///
    /// [`FencingToken`]: crate::FencingToken
    ///
    /// # Cancel safety
    /// Cancel safe. If the future is dropped (or times out) while a request
    /// is in flight, it may still land; a best-effort token-checked release
    /// is then spawned, and the TTL is the fallback (a fencing token it
    /// consumed is simply never used). Dropped while waiting for replicas,
    /// the lease already exists and its drop releases it in the background.
    pub async fn acquire_with(
        &self,
        keys: impl LockKeys,
        ttl: Duration,
        opts: &AcquireOptions,
    ) -> Result<Lease> {
        way::acquire_with(self, keys, ttl, opts).await
    }

    /// Takes the leases on every one of `keys` for `ttl`, in one global
    /// order (sorted by lock key, whatever the order given), and returns
    /// them as one [`Lease`] with one watchdog and a fencing token per
    /// fenced key ([`Lease::fence_for`]). Two callers locking the same keys
    /// in opposite orders never deadlock. All keys share `opts`' deadline.
    ///
    /// # Errors
    /// As [`acquire_with`](Self::acquire_with), for the first key that
    /// fails; the keys already taken are given back first. Also
    /// [`Error::InvalidKey`] for no keys, or one lock key named with two
    /// fence keys.
    ///
    /// # Cancel safety
    /// Cancel safe: the keys already taken are released in the background.
    pub async fn acquire_all<K: LockKeys>(
        &self,
        keys: impl IntoIterator<Item = K>,
        ttl: Duration,
        opts: &AcquireOptions,
    ) -> Result<Lease> {
        way::acquire_all_of(self, keys, ttl, opts).await
    }

    /// Takes the lease on `keys`, runs `work` while it is held (with the
    /// watchdog, as [`Lease::run`]), and releases it: the lease's whole life
    /// in one call. `work` gets the lease, for its
    /// [`fence`](Lease::fence) and the `leasehold-pg` guard. The same call
    /// as [`Lessor::with_lock`](crate::Lessor::with_lock), which says what
    /// the [`Finished`](crate::Finished) outcome means for your data.
    ///
    /// ```no_run
    /// # async fn demo(locker: leasehold::Locker) -> leasehold::Result<()> {
    /// use std::time::Duration;
    /// use leasehold::{AcquireOptions, FencedKeys};
    ///
    /// let keys = FencedKeys::for_resource("wallet:42")?;
    /// let opts = AcquireOptions::new().wait(Duration::from_secs(5));
    /// let done = locker
    ///     .with_lock(&keys, Duration::from_secs(2), &opts, async |lease| {
    ///         // guard, read, decide, write with lease.fence() ...
    ///         lease.fence()
    ///     })
    ///     .await?;
    /// if let Err(release) = &done.release {
    ///     // The work ran to its end; the lease was no longer (or not
    ///     // provably) ours when it was given back.
    ///     eprintln!("release: {release}");
    /// }
    /// let _fence = done.output;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`acquire_with`](Self::acquire_with) (no work ran); and
    /// [`Error::LeaseLost`] when the watchdog found the lease lost before
    /// `work` finished (`work` was stopped at its current `.await`, so it
    /// has no output). Once `work` has finished, the call returns `Ok`: a
    /// release that failed or found the lease gone is in
    /// [`Finished::release`](crate::Finished::release), beside the output.
    ///
    /// # Cancel safety
    /// Dropping the future drops `work` and the lease (released in the
    /// background).
    pub async fn with_lock<T>(
        &self,
        keys: impl LockKeys,
        ttl: Duration,
        opts: &AcquireOptions,
        work: impl AsyncFnOnce(&Lease) -> T,
    ) -> Result<crate::Finished<T>> {
        Lessor::with_lock(self, keys, ttl, opts, work).await
    }
}

impl<C: RedisConnection> Way for Locker<C> {
    /// A polling locker honours every option.
    const SUPPORTS: Supports = Supports {
        wait_replicas: true,
    };

    fn mode(&self) -> &'static str {
        "poll"
    }

    fn command_timeout(&self) -> Duration {
        self.node.command_timeout()
    }

    /// The polling loop for one checked target.
    async fn take(
        &self,
        target: Target,
        ttl: Duration,
        opts: &AcquireOptions,
        budget: Budget,
    ) -> Result<Lease> {
        let token = LeaseToken::generate()?;
        let px = ttl_millis(ttl);
        let fenced = target.fenced();
        let node = &self.node;
        let (fence, sent_at) = rounds::acquire_rounds(
            &target.lock,
            opts,
            budget,
            node.command_timeout(),
            |deadline| {
                node.counters.acquire_request();
                let (fenced, target, token) = (&fenced, &target, &token);
                async move {
                    Ok(match fenced {
                        None => match node.set_nx(&target.lock, token, px, deadline).await? {
                            Attempt::Won(()) => Attempt::Won(None),
                            Attempt::Busy => Attempt::Busy,
                        },
                        Some(keys) => match node.set_nx_fenced(keys, token, px, deadline).await? {
                            Attempt::Won(fence) => Attempt::Won(Some(fence)),
                            Attempt::Busy => Attempt::Busy,
                        },
                    })
                }
            },
            |deadline| {
                let (key, token) = (&target.lock, &token);
                async move {
                    node.token_checked(Step::Release, key, None, token, deadline)
                        .await
                        .map(drop)
                }
            },
            || {
                let until = Instant::now() + ttl;
                spawn_release(node.clone(), target.lock.clone(), token.clone(), until);
            },
        )
        .await?;
        node.counters.acquisition();
        let part = Part {
            key: target.lock,
            token,
            fence_key: target.fence,
            fence,
        };
        Ok(Lease::new(self.node.clone(), part, ttl, sent_at))
    }

    async fn confirm_replicas(
        &self,
        lease: Lease,
        opts: &AcquireOptions,
        deadline: Instant,
    ) -> Result<Lease> {
        crate::replicas::confirm(&self.node, lease, opts, deadline).await
    }
}

/// A plain lease gives its lock back with a token-checked delete.
impl<C: RedisConnection> Backend for Node<C> {
    fn service(&self) -> crate::service::Service {
        crate::service::Service::REDIS
    }

    fn command_timeout(&self) -> Duration {
        Node::command_timeout(self)
    }

    fn refresh<'a>(&'a self, part: &'a Part, ttl: Duration, deadline: Instant) -> Reply<'a, bool> {
        Box::pin(self.token_checked(
            Step::Refresh { ttl },
            &part.key,
            part.fence_key.as_deref(),
            &part.token,
            deadline,
        ))
    }

    fn release<'a>(&'a self, part: &'a Part, deadline: Instant) -> Reply<'a, bool> {
        Box::pin(self.token_checked(Step::Release, &part.key, None, &part.token, deadline))
    }

    fn raise_fence<'a>(
        &'a self,
        fence_key: &'a str,
        at_least: FencingToken,
        deadline: Instant,
    ) -> Reply<'a, ()> {
        Box::pin(async move {
            self.raise_fence(fence_key, at_least, deadline).await?;
            Ok(())
        })
    }

    fn announce<'a>(
        &'a self,
        part: &'a Part,
        record_key: &'a str,
        body: &'a str,
        deadline: Instant,
    ) -> Reply<'a, bool> {
        Box::pin(Node::announce(
            self,
            &part.key,
            record_key,
            &part.token,
            body,
            deadline,
        ))
    }

    fn release_dropped(self: Arc<Self>, part: Part, until: Instant) {
        spawn_release(self, part.key, part.token, until);
    }
}

/// Best-effort background release of the lock `key` held with `token`,
/// retrying faults that may pass until `until` (when the TTL frees it
/// anyway); never blocks, never panics. With no runtime, the TTL ends the
/// lease.
pub(crate) fn spawn_release<C: RedisConnection>(
    node: Arc<Node<C>>,
    key: String,
    token: LeaseToken,
    until: Instant,
) {
    let Some(runtime) = release_runtime(&key) else {
        return;
    };
    spawn_dropped_release(&runtime, key.clone(), async move {
        let part = Part {
            key,
            token,
            fence_key: None,
            fence: None,
        };
        let per_try = node.command_timeout();
        release_retrying(&*node, &part, until, per_try).await
    });
}

impl<C: RedisConnection> crate::lessor::sealed::Sealed for Locker<C> {
    fn service(&self) -> crate::service::Service {
        crate::service::Service::REDIS
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

/// The same calls as the inherent methods.
impl<C: RedisConnection> Lessor for Locker<C> {
    fn acquire(
        &self,
        keys: impl LockKeys,
        ttl: Duration,
    ) -> impl Future<Output = Result<Lease>> + Send {
        Locker::acquire(self, keys, ttl)
    }

    fn acquire_with(
        &self,
        keys: impl LockKeys,
        ttl: Duration,
        opts: &AcquireOptions,
    ) -> impl Future<Output = Result<Lease>> + Send {
        Locker::acquire_with(self, keys, ttl, opts)
    }

    fn acquire_all<K: LockKeys>(
        &self,
        keys: impl IntoIterator<Item = K> + Send,
        ttl: Duration,
        opts: &AcquireOptions,
    ) -> impl Future<Output = Result<Lease>> + Send {
        Locker::acquire_all(self, keys, ttl, opts)
    }
}
