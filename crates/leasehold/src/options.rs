//! Per-call options for taking a lease.

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::budget::Budget;
use crate::error::{Error, Result};
use crate::retry::RetryStrategy;

/// How many replicas must acknowledge an acquire, and for how long to wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WaitReplicas {
    pub(crate) replicas: u32,
    pub(crate) timeout: Duration,
}

/// What a way of taking a lease supports, for [`AcquireOptions::check`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Supports {
    /// `WAIT` for replicas (a single, replicated server).
    pub(crate) wait_replicas: bool,
}

/// How long and how to wait for a busy lock.
///
/// ```
/// use std::time::Duration;
/// use leasehold::{AcquireOptions, RetryStrategy};
///
/// let opts = AcquireOptions::new()
///     .wait(Duration::from_secs(5))
///     .retry(RetryStrategy::exponential(
///         Duration::from_millis(16),
///         Duration::from_millis(128),
///     ).with_full_jitter());
/// # let _ = opts;
/// ```
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
#[must_use]
pub struct AcquireOptions {
    pub(crate) deadline: Deadline,
    pub(crate) retry: RetryStrategy,
    pub(crate) cancel: Option<CancellationToken>,
    pub(crate) watchdog: bool,
    pub(crate) wait_replicas: Option<WaitReplicas>,
}

#[derive(Debug, Clone, Copy, Default)]
pub(crate) enum Deadline {
    #[default]
    Default,
    After(Duration),
    At(Instant),
}

/// How long an acquire keeps trying when no wait or deadline is given.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(10);

impl AcquireOptions {
    /// The defaults: wait up to [`DEFAULT_WAIT`] (10 s), retrying with
    /// [`RetryStrategy::default`], no cancellation token, no watchdog, no
    /// wait for replicas.
    pub fn new() -> Self {
        Self::default()
    }

    /// Keep trying for at most `wait` from the start of the call. Every
    /// request the acquire sends to the lock service is bounded by the same
    /// deadline.
    ///
    /// Defaults to [`DEFAULT_WAIT`] (10 s).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.deadline = Deadline::After(wait);
        self
    }

    /// Keep trying until `deadline` (a tokio monotonic instant). Replaces any
    /// [`wait`](Self::wait).
    ///
    /// Defaults to 10 s after the start of the call.
    pub fn deadline(mut self, deadline: Instant) -> Self {
        self.deadline = Deadline::At(deadline);
        self
    }

    /// What to wait between attempts while the lock is busy.
    ///
    /// Defaults to [`RetryStrategy::default`]: a random 5 to 15 ms.
    pub fn retry(mut self, retry: RetryStrategy) -> Self {
        self.retry = retry;
        self
    }

    /// Stop waiting when `token` is cancelled; the acquire then fails with
    /// [`GiveUpReason::Cancelled`](crate::GiveUpReason::Cancelled).
    ///
    /// Defaults to none.
    pub fn cancel(mut self, token: CancellationToken) -> Self {
        self.cancel = Some(token);
        self
    }

    /// Start the lease's watchdog as soon as it is acquired, as
    /// [`Lease::watch`](crate::Lease::watch) does: it refreshes the lease
    /// every `ttl / 3` until it is released or dropped, and cancels the
    /// lease's token when the lease is lost.
    ///
    /// Defaults to false: the lease lives for its TTL unless refreshed, or
    /// until [`Lease::watch`](crate::Lease::watch) or
    /// [`Lease::run`](crate::Lease::run) starts the watchdog.
    pub fn watchdog(mut self, enabled: bool) -> Self {
        self.watchdog = enabled;
        self
    }

    /// Polling and hand-off on Redis only ([`Locker`](crate::Locker),
    /// [`HandoffLocker`](crate::HandoffLocker); a way
    /// that cannot wait for its replicas refuses it with
    /// [`Error::InvalidOptions`](crate::Error::InvalidOptions): a Redlock
    /// quorum, whose majority is its replication; etcd and ZooKeeper,
    /// whose commits are a majority's; PostgreSQL, whose commits are as
    /// synchronous as its standbys are set to be; memory). After
    /// the acquire wins (plain or fenced), send `WAIT replicas timeout` on
    /// the same connection; if fewer than `replicas` replicas
    /// acknowledged the lock within `timeout`, release it (token-checked)
    /// and take it again (a new token) after the retry strategy's next
    /// wait, until the acquire's deadline; then fail with
    /// [`Error::NotReplicated`](crate::Error::NotReplicated). `timeout` is
    /// capped by the acquire's deadline. Each try costs up to `timeout`, so
    /// with replicas gone for good the caller waits out its whole wait.
    ///
    /// This narrows the window in which a failover loses a fresh lock; it
    /// does **not** make Redis strongly consistent: a replica that
    /// acknowledged can still lose the write when it restarts without
    /// `appendfsync always`, and a failover may promote a replica that did
    /// not acknowledge. Keep the write fenced in the database. While WAIT
    /// waits, Redis blocks the connection, so other requests on a shared
    /// connection queue behind it. See the
    /// [crate docs](crate#what-each-deployment-guarantees).
    ///
    /// A zero `timeout` is refused with
    /// [`Error::InvalidOptions`](crate::Error::InvalidOptions) before any
    /// I/O (`WAIT n 0` would block forever), and so is one at or above the
    /// locker's command timeout
    /// ([`LockerBuilder::command_timeout`](crate::LockerBuilder::command_timeout),
    /// 1 s by default): the connection would cut such a `WAIT` short and
    /// the acquire would fail with a timeout instead of waiting for the
    /// replicas as long as asked.
    ///
    /// Defaults to none: the acquire returns as soon as the primary said
    /// yes.
    pub fn wait_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.wait_replicas = Some(WaitReplicas { replicas, timeout });
        self
    }

    /// Checks every field against what the way of taking a lease
    /// `supports`, before any I/O: an option it cannot honour is refused
    /// with [`Error::InvalidOptions`] naming the field, never ignored.
    ///
    /// `command_timeout` is the way's bound on one request: a `WAIT` that
    /// may block as long would be cut short by it, so a `wait_replicas`
    /// timeout must be shorter.
    pub(crate) fn check(&self, supports: Supports, command_timeout: Duration) -> Result<()> {
        match self.wait_replicas {
            Some(_) if !supports.wait_replicas => Err(Error::InvalidOptions(
                "wait_replicas does not apply to a quorum (its servers are independent) or to etcd (a write is committed on a majority before it is acknowledged)",
            )),
            Some(wait) if wait.timeout.is_zero() => Err(Error::InvalidOptions(
                "wait_replicas: the timeout must be positive",
            )),
            Some(wait) if wait.timeout >= command_timeout => Err(Error::InvalidOptions(
                "wait_replicas: the timeout must be shorter than the command timeout (the connection cuts a longer WAIT short)",
            )),
            _ => Ok(()),
        }
    }

    /// Resolves when the caller's token is cancelled; never without one.
    pub(crate) async fn cancelled(&self) {
        match &self.cancel {
            Some(cancel) => cancel.cancelled().await,
            None => std::future::pending().await,
        }
    }

    /// The acquire's wait, resolved once at its entry (`start`, when the
    /// checks passed): every layer below sees only this budget.
    pub(crate) fn budget(&self, start: Instant) -> Budget {
        let deadline = match self.deadline {
            Deadline::Default => start + DEFAULT_WAIT,
            Deadline::After(wait) => start + wait,
            Deadline::At(at) => at,
        };
        Budget::until(start, deadline)
    }
}
