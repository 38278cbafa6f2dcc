//! The one shape every way of taking a lease shares: [`Lessor`].

use std::future::Future;
use std::time::Duration;

use crate::error::Result;
use crate::fencing::LockKeys;
use crate::lease::{Finished, Lease, hold_while};
use crate::options::AcquireOptions;

/// A way of taking a lease.
///
/// A *lessor* is whoever grants a lease. This crate has three:
/// [`Locker`] (polling Redis), [`HandoffLocker`] (queued hand-off on
/// Redis) and [`Quorum`] (Redlock); for tests, with the feature `memory`,
/// `MemoryLocker` (a table in the process). Crates of their own add etcd
/// (`leasehold-etcd`'s `EtcdLocker`, etcd's leases and transactions),
/// PostgreSQL (`leasehold-pg`'s `PgLocker`, a lease table) and ZooKeeper
/// (`leasehold-zookeeper`'s `ZkLocker`, Curator's lock recipe), through
/// the seam any service of yours implements too
/// ([`LockService`](crate::LockService)). They differ in the service they use,
/// how a caller waits and how many servers must agree; they take the same keys, options and TTLs and return the same
/// [`Lease`], with the same guarantees (the crate docs list them). Code that
/// works with any of them is generic over this trait:
///
/// ```no_run
/// use std::time::Duration;
/// use leasehold::{AcquireOptions, FencedKeys, Lessor};
///
/// /// Runs one job under whatever lock the service was configured with.
/// async fn run_job(lock: &impl Lessor, job: &str) -> leasehold::Result<bool> {
///     let keys = FencedKeys::for_resource(job)?;
///     let opts = AcquireOptions::new().wait(Duration::from_secs(2));
///     let done = lock
///         .with_lock(&keys, Duration::from_secs(1), &opts, async |lease| {
///             // ... the job's work, fenced with lease.fence() ...
///             lease.fence().is_some()
///         })
///         .await?;
///     Ok(done.output)
/// }
/// ```
///
/// A lock service of your own becomes one by implementing
/// [`LockService`](crate::LockService) (every service is a `Lessor`); the
/// trait itself is sealed, so the four calls are written once, over that
/// seam. Bring it into scope (`use leasehold::Lessor`) to call them.
///
/// [`Locker`]: crate::Locker
/// [`HandoffLocker`]: crate::HandoffLocker
/// [`Quorum`]: crate::Quorum
///
/// Every future returned here is bounded by the options' deadline (and the
/// command timeout per request), and is `Send` except
/// [`with_lock`](Self::with_lock)'s, which is `Send` when the work's future
/// is.
pub trait Lessor: sealed::Sealed + Clone + Send + Sync + 'static {
    /// Takes the lease on `keys` for `ttl` with the default
    /// [`AcquireOptions`] (up to 10 s, random 5 to 15 ms between attempts).
    ///
    /// # Errors
    /// As [`acquire_with`](Self::acquire_with).
    ///
    /// # Cancel safety
    /// As [`acquire_with`](Self::acquire_with).
    fn acquire(
        &self,
        keys: impl LockKeys,
        ttl: Duration,
    ) -> impl Future<Output = Result<Lease>> + Send;

    /// Takes the lease on `keys` for `ttl` as `opts` says, with a fresh
    /// 128-bit token, trying again while the lock is busy until `opts`'
    /// deadline. Give [`FencedKeys`](crate::FencedKeys) for a fencing token
    /// issued with the lock (only a holder gets one: on Redis one script
    /// takes the lock and, only if that worked, issues the next token from
    /// the fence counter, above the counter and the server's clock; see
    /// [`FencingToken`](crate::FencingToken)).
    ///
    /// The lease's validity is counted from the moment the winning request
    /// was *sent*, so the holder's idea of its remaining time is never
    /// longer than the service's. Every [`AcquireOptions`] field is
    /// honoured or refused ([`Error::InvalidOptions`](crate::Error::InvalidOptions))
    /// before any I/O.
    ///
    /// # Errors
    /// - [`Error::InvalidTtl`](crate::Error::InvalidTtl) /
    ///   [`Error::InvalidKey`](crate::Error::InvalidKey) /
    ///   [`Error::InvalidOptions`](crate::Error::InvalidOptions) (an option
    ///   this way cannot honour, a zero replica wait) before any I/O;
    /// - [`Error::NotAcquired`](crate::Error::NotAcquired) when the lock
    ///   stayed busy, with the reason: retries exhausted, deadline expired,
    ///   or cancelled (carrying the fault it also met at the end, if any);
    /// - [`Error::Timeout`](crate::Error::Timeout) (each request is bounded
    ///   by the deadline and the command timeout),
    ///   [`Error::Unreachable`](crate::Error::Unreachable),
    ///   [`Error::Auth`](crate::Error::Auth),
    ///   [`Error::OutOfMemory`](crate::Error::OutOfMemory) and the other
    ///   retryable faults ([`Error::is_retryable`](crate::Error::is_retryable))
    ///   are retried within the wait, and returned when it runs out during
    ///   them with the lock never seen busy (see the guide's table, "Which
    ///   errors an acquire rides out");
    /// - [`Error::WrongType`](crate::Error::WrongType) (the key holds a
    ///   value of another type) and
    ///   [`Error::NoPermission`](crate::Error::NoPermission), returned at
    ///   once without retrying;
    /// - [`Error::InvalidFence`](crate::Error::InvalidFence) when the fence
    ///   key holds anything but an integer counter below 2^53 (the lock is
    ///   not left taken);
    /// - [`Error::InvalidOptions`](crate::Error::InvalidOptions) when
    ///   [`AcquireOptions::watchdog`] is set but there is no tokio runtime
    ///   to run it on (the lease just taken is then released in the
    ///   background);
    /// - [`Error::NotReplicated`](crate::Error::NotReplicated) when
    ///   [`AcquireOptions::wait_replicas`] is set and too few replicas
    ///   acknowledged the lock: it was released again;
    /// - a quorum adds [`Error::QuorumNotReached`](crate::Error::QuorumNotReached);
    ///   a service outside this crate (etcd, PostgreSQL, ZooKeeper)
    ///   [`Error::Service`](crate::Error::Service).
    ///
    /// # Cancel safety
    /// Cancel safe. If the future is dropped (or times out) while a request
    /// is in flight, it may still land; a best-effort token-checked release
    /// is then spawned, and the TTL is the fallback (a fencing token it
    /// consumed is simply never used). Dropped while waiting for replicas,
    /// the lease already exists and its drop releases it in the background.
    fn acquire_with(
        &self,
        keys: impl LockKeys,
        ttl: Duration,
        opts: &AcquireOptions,
    ) -> impl Future<Output = Result<Lease>> + Send;

    /// Takes every one of `keys` for `ttl`, in one global order (sorted by
    /// lock key), as one [`Lease`] with one watchdog and a fencing token
    /// per fenced key. Two callers locking the same keys in opposite orders
    /// never deadlock.
    ///
    /// # Errors
    /// As [`acquire_with`](Self::acquire_with), for the first key that
    /// fails (the keys already taken are given back first);
    /// [`Error::InvalidKey`](crate::Error::InvalidKey) for no keys.
    ///
    /// # Cancel safety
    /// Cancel safe: the keys already taken are released in the background.
    fn acquire_all<K: LockKeys>(
        &self,
        keys: impl IntoIterator<Item = K> + Send,
        ttl: Duration,
        opts: &AcquireOptions,
    ) -> impl Future<Output = Result<Lease>> + Send;

    /// The lease's whole life in one call: takes it as
    /// [`acquire_with`](Self::acquire_with) does, runs `work` with it under
    /// the watchdog ([`Lease::run`]), gives it back, and returns the work's
    /// output **with** the release's outcome ([`Finished`]).
    ///
    /// `work` gets the lease: its [`fence`](Lease::fence), and everything
    /// the `leasehold-pg` guard needs, so the guard runs inside `work`, in
    /// the same transaction as the writes. If the watchdog finds the lease
    /// lost before `work` finishes, `work` is stopped at its current
    /// `.await` (a transaction not yet committed is rolled back when it is
    /// dropped) and the call fails with
    /// [`Error::LeaseLost`](crate::Error::LeaseLost). Once `work` has
    /// finished, its output is always returned: a release that then fails
    /// or finds the lease gone is reported in [`Finished::release`], never
    /// in place of the output. [`Finished`] says what each outcome means
    /// for the data.
    ///
    /// # Errors
    /// As [`acquire_with`](Self::acquire_with) (the work did not run);
    /// [`Error::LeaseLost`](crate::Error::LeaseLost) when the work was
    /// stopped before it finished.
    ///
    /// # Cancel safety
    /// Dropping the future drops `work` at its current `.await` and the
    /// lease (released in the background).
    fn with_lock<T>(
        &self,
        keys: impl LockKeys,
        ttl: Duration,
        opts: &AcquireOptions,
        work: impl AsyncFnOnce(&Lease) -> T,
    ) -> impl Future<Output = Result<Finished<T>>> {
        let lease = self.acquire_with(keys, ttl, opts);
        async move { hold_while(lease.await?, work).await }
    }
}

/// The seal: implemented by the ways, in their own modules, with
/// what an [`Election`](crate::Election) reads that a lease does not carry.
pub(crate) mod sealed {
    use crate::lease::Reply;

    pub trait Sealed {
        /// The service its leases live on, as errors name it.
        fn service(&self) -> crate::service::Service;

        /// The leader record of the election whose lock is `key` and
        /// record `record_key`, with the lock's time to live in ms, when
        /// the lock's current holder wrote it (as a majority see it, for a
        /// quorum); bounded by the command (or node) timeout.
        fn leader_record<'a>(
            &'a self,
            key: &'a str,
            record_key: &'a str,
        ) -> Reply<'a, Option<(String, i64)>>;

        /// Whether a release hands the lock to a waiter in the same step
        /// (hand-off): then a resigned candidate need not stand back.
        fn hands_over(&self) -> bool {
            false
        }
    }
}
