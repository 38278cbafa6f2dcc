//! The seam every lock service implements: [`LockService`].
//!
//! leasehold's promise is one lease API over whatever lock service a team
//! runs. A service (an in-memory table, a PostgreSQL lease table, a
//! ZooKeeper ensemble, ...) is one implementation of [`LockService`]: it
//! says how to take one step towards a lock and how to refresh and give
//! back a lock it granted, and it may offer more (raise a fence, a leader
//! record, a wake-up for waiters). Everything above that is written once
//! and is the same for every service: the checks before any I/O, the
//! deadline and the retry strategy, cancellation, the trace span and the
//! metrics, the [`Lease`](crate::Lease) with its watchdog and fencing
//! token, [`Lessor`](crate::Lessor)'s four calls (`acquire`,
//! `acquire_with`, `acquire_all` in one global order, `with_lock`) and
//! [`Election`](crate::Election). A type that implements [`LockService`]
//! *is* a [`Lessor`](crate::Lessor): there is nothing else to write.
//!
//! It is modelled on bb8's `ManageConnection` and tower's `Service`: the
//! crate that owns the trait writes the machinery once on top of it, and a
//! backend that brings its own client lives in its own crate.
//!
//! # The contract
//!
//! leasehold's guarantees (the crate docs list them) hold for a backend
//! only if it keeps these; the conformance suite
//! (`leasehold_testkit::conformance`) checks them against a running
//! service:
//!
//! 1. **Ownership confirmed by the service.** [`step`](LockService::step)
//!    returns [`Step::won`] only once the service has recorded the claim's
//!    token as the lock's holder, for at least the claim's TTL counted from
//!    when the step *began* (the lease's validity is counted from there, on
//!    the caller's monotonic clock). Never from a local cache.
//! 2. **Token-checked refresh and release.** [`refresh`](LockService::refresh)
//!    and [`release`](LockService::release) act only if the lock still
//!    carries the held token, in one atomic step on the service, and
//!    answer `Ok(false)` when it does not: a late holder never extends or
//!    deletes its successor's lock.
//! 3. **Fencing tokens that only grow.** A fenced claim's win carries a
//!    token above every token issued before for the same fence key, for as
//!    long as the service keeps its data. A service whose tokens cannot be
//!    raised by hand (etcd's revision, ZooKeeper's zxid) leaves
//!    [`raise_fence`](LockService::raise_fence) to its default (refused):
//!    what it loses is the heal after the store lost its data (a holder
//!    whose token a database guard refused cannot lift the counter past
//!    the stored fence), so there only the holder rule stands until the
//!    store's counter passes the fence on its own.
//! 4. **An unknown outcome is never success.** A request whose answer was
//!    lost returns an error whose outcome is unknown
//!    ([`ServiceFault::Unknown`], or [`Error::Timeout`]); never `Ok`. A step
//!    that may have taken the lock is undone by
//!    [`undo`](LockService::undo) before the next step, or by
//!    [`abandon`](LockService::abandon) if the acquire ends first.
//! 5. **Every request bounded by the deadline it is given.** No call waits
//!    past its `deadline` (an [`Error::Timeout`] or a service fault then);
//!    [`abandon`](LockService::abandon) never blocks. (A lease dropped
//!    without a release is given back by the crate: its
//!    [`release`](LockService::release), spawned and retried until the
//!    lease would have ended.)
//!
//! # The holder's watch: hearing of a loss between refreshes
//!
//! A service that can tell its holder at once that a lock is gone (a
//! ZooKeeper watch on the holder's own node, a notification) offers it
//! through [`watch_held`](LockService::watch_held): a [`Wake`] that
//! resolves when the service saw a *sign* that the lock may be gone. The
//! lease's watchdog selects on it beside its refresh timer, and when it
//! resolves, confirms with one token-checked
//! [`refresh`](LockService::refresh) at once: `Ok(false)` ends the lease
//! as lost ([`LostCause::Expired`](crate::LostCause::Expired), as a
//! refresh on the timer would have), `Ok(true)` keeps it. A signal alone
//! never ends a lease:
//!
//! - a sign is not a finding: a watch also fires for a session event, a
//!   change of the node's data, or a fault in setting it up, and only the
//!   token-checked refresh says whether the lock still carries our token;
//!   ending a lease the service still holds for us would stop the work for
//!   nothing, and let no one else in;
//! - the refresh is the check every other loss goes through, so a lease is
//!   lost for one reason only (the service said it is not ours, or could
//!   not say so before the lease's validity ran out), whatever woke the
//!   watchdog.
//!
//! A spurious wake therefore costs one refresh, never a live lease. The
//! watchdog arms the signal when it starts and again after each refresh
//! *on its timer* that confirmed the lease; a wake it found spurious (or
//! could not settle: the refresh failed) is not re-armed until then. So a
//! signal that fires at once every time costs at most one extra refresh
//! per refresh period, and a loss right after a spurious wake is still
//! found by the next refresh on the timer, as without a signal.
//!
//! Errors name the service ([`service`](LockService::service)); a cause
//! the crate's [`Error`] has no variant for is an [`Error::Service`] made
//! with [`Error::service`], which says whether the request may have acted
//! and whether trying again may help ([`ServiceFault`]).
//!
//! # One acquire, step by step
//!
//! The crate's one retry loop drives an acquire:
//!
//! ```text
//! checks (key, ttl, options: no I/O) -> deadline, fixed once
//! loop:
//!   undo, if the last step's outcome was unknown     (one request)
//!   step                                             (one request)
//!     won           -> the lease (then the watchdog, if asked)
//!     busy          -> wait: the strategy's next wait, or (a queued
//!                      service) the step's wake-up alone; never past the
//!                      deadline; out of waits or time -> NotAcquired
//!     error, may pass -> as busy, remembered for the give-up
//!     error, final  -> returned
//! on an error: leave (awaited, by the deadline), then abandon
//! on any end without a win: abandon (sync, never blocks)
//! ```
//!
//! A step makes one request and does not wait on its own: waiting is the
//! loop's (it knows the deadline, the strategy and the caller's
//! cancellation). A service that queues its waiters keeps the acquire's
//! place in [`Entry`](LockService::Entry), which the loop hands to every
//! step of the same acquire and, at its end, to `abandon`.
//!
//! # Sketches: PostgreSQL and ZooKeeper against this trait
//!
//! Written before the trait was frozen, to check that it fits the next
//! services (neither is built yet):
//!
//! - **PostgreSQL** (a lease table): `Entry = ()`. `step` is one
//!   statement: `INSERT ... ON CONFLICT (resource) DO UPDATE ... WHERE
//!   expires_at < clock_timestamp() RETURNING token` (expiry on the
//!   database's clock; the token from a counter row release never
//!   removes); `Step::won(token)` or `Step::busy_until(notified)` where
//!   `notified` is a `LISTEN` on a connection of the locker's own (with
//!   the strategy's wait as the fallback through PgBouncer). `refresh` and
//!   `release` are `UPDATE`/`DELETE ... WHERE resource = $1 AND holder =
//!   $2`. A lost answer is `ServiceFault::Unknown`; `undo` is the release.
//!   `raise_fence` is `UPDATE counter SET n = greatest(n, $2)`.
//! - **ZooKeeper** (Curator's layout): `Entry` is the contender's
//!   sequential znode (its path, and the unique prefix to find it again
//!   after an unknown create). The first `step` creates it; each later
//!   step lists the children: lowest sequence -> `Step::won(czxid)`; else
//!   `Step::busy_until(watch on the predecessor)`. `undo` finds the node
//!   by its prefix and deletes it; `abandon` spawns that delete. The TTL
//!   is the session's: [`check_ttl`](LockService::check_ttl) refuses a TTL
//!   the negotiated session timeout cannot honour. `raise_fence` keeps its
//!   default (a zxid cannot be raised).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::time::Instant;

pub use crate::error::ServiceFault;
use crate::error::{Error, Result};
use crate::fencing::FencingToken;
use crate::service::Service;
use crate::token::LeaseToken;

/// A boxed future of a [`LockService`] call, borrowing the service and
/// its arguments for `'a`.
pub type Reply<'a, T> = Pin<Box<dyn Future<Output = Result<T>> + Send + 'a>>;

/// A wake-up: for a waiter ([`Step::busy_until`]), resolves when the lock
/// may have become free (a notification, a watch, or the service's own
/// fallback timer), and the retry loop steps again then; for a holder
/// ([`LockService::watch_held`]), resolves when the lock may be gone, and
/// the lease's watchdog refreshes at once then.
pub type Wake = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A lock service, the seam every backend implements: see the
/// [module docs](self) for the contract, the loop that drives it and
/// sketches of PostgreSQL and ZooKeeper against it.
///
/// Implement it and the type is a [`Lessor`](crate::Lessor), usable by an
/// [`Election`](crate::Election) when it offers a leader record. Cheap to
/// clone: clones share the service (its connection, its table).
pub trait LockService: Clone + Send + Sync + 'static {
    /// What one acquire keeps across its steps (a queued service's place
    /// in the queue); `()` for a service each step asks afresh.
    type Entry: Default + Send + Sync + 'static;

    /// The service, as errors name it.
    fn service(&self) -> Service;

    /// The bound on one request with no tighter deadline (a refresh
    /// after a fault, a release).
    fn command_timeout(&self) -> Duration;

    /// The bound on one [`step`](Self::step) with no tighter deadline: a
    /// step that takes several rounds (a quorum's votes, then its fence
    /// round, then its cleanup) needs more than one request's. Defaults to
    /// [`command_timeout`](Self::command_timeout).
    fn step_timeout(&self) -> Duration {
        self.command_timeout()
    }

    /// The clock-drift margin taken off every TTL this service confirms:
    /// the holder counts a lease of `ttl` as valid for `ttl - margin(ttl)`
    /// from the confirming request's send time. Defaults to none: a
    /// service that decides expiry on one clock needs none; several
    /// independent servers, each on its own clock, do (Redlock's
    /// `ttl / 100 + 2 ms`).
    fn margin(_ttl: Duration) -> Duration {
        Duration::ZERO
    }

    /// Its name in traces and metrics (the `mode` label of an acquire),
    /// where one service has several ways of taking a lease (`poll` on
    /// Redis). Defaults to the service's name.
    fn mode(&self) -> &'static str {
        self.service().name()
    }

    /// The fence key a fenced lease of this service is guarded under (its
    /// [`Lease::fence_key_for`](crate::Lease::fence_key_for), the row of a
    /// fence table), for the fence key the caller named; the claim's
    /// [`fence_key`](Claim::fence_key) is this. Defaults to the caller's
    /// key: tokens of services that share it must be comparable (one
    /// counter) or raisable (a refused holder lifts its counter past the
    /// stored fence). A service whose tokens are neither (etcd's
    /// revisions, ZooKeeper's zxids) names rows of its own, with its name
    /// in front (`etcd:fence:{wallet:42}`), so the guard never compares
    /// them with another service's.
    fn fence_key_of(&self, fence_key: &str) -> String {
        fence_key.to_owned()
    }

    /// Refuses a TTL the service cannot honour (a ZooKeeper session timeout
    /// shorter than it), with [`Error::InvalidOptions`] or
    /// [`Error::InvalidTtl`]; never changes it silently. Called before any
    /// I/O, after the crate's own bounds (1 ms to
    /// [`MAX_TTL`](crate::MAX_TTL)). Defaults to every TTL accepted.
    ///
    /// # Errors
    /// As above.
    fn check_ttl(&self, _ttl: Duration) -> Result<()> {
        Ok(())
    }

    /// One step towards the lock `claim` names: at most one request,
    /// bounded by `deadline`, and no waiting of its own. [`Step::won`] only
    /// once the service recorded `claim`'s token as the holder (the
    /// contract's first point).
    ///
    /// # Errors
    /// A fault of the service; one that may pass
    /// ([`Error::is_retryable`]) is retried until the acquire's deadline.
    fn step<'a>(
        &'a self,
        claim: &'a Claim,
        entry: &'a mut Self::Entry,
        deadline: Instant,
    ) -> Reply<'a, Step>;

    /// Gives back whatever a step with an unknown outcome may have taken
    /// for `claim` (a token-checked delete: it can never touch another
    /// holder's lock); the loop sends the next step only once this
    /// succeeded. Bounded by `deadline`.
    ///
    /// # Errors
    /// A fault of the service.
    fn undo<'a>(
        &'a self,
        claim: &'a Claim,
        entry: &'a mut Self::Entry,
        deadline: Instant,
    ) -> Reply<'a, ()>;

    /// An acquire of `claim` ended with an error (gave up, failed,
    /// cancelled; not dropped): leave any queue `entry` keeps a place in
    /// now, by `deadline` (the acquire's), so that the caller hears the
    /// error only once the place is gone; [`abandon`](Self::abandon) runs
    /// after it (for what is left, and alone for a dropped acquire).
    /// Defaults to nothing: a service whose steps keep no place.
    fn leave<'a>(
        &'a self,
        _claim: &'a Claim,
        _entry: &'a mut Self::Entry,
        _deadline: Instant,
    ) -> Reply<'a, ()> {
        Box::pin(std::future::ready(Ok(())))
    }

    /// An acquire of `claim` ended without a win (gave up, cancelled,
    /// dropped): give back what it may hold (`maybe_taken`: a step's
    /// outcome was unknown) and leave any queue `entry` keeps a place in.
    /// Synchronous and never blocks: spawn the requests (on the current
    /// tokio runtime, if any); the TTL is the fallback. Defaults to one
    /// [`undo`](Self::undo), spawned, when `maybe_taken`.
    fn abandon(&self, claim: Claim, entry: Self::Entry, maybe_taken: bool) {
        if !maybe_taken {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let service = self.clone();
        runtime.spawn(async move {
            let mut entry = entry;
            let deadline = Instant::now() + service.command_timeout();
            if let Err(err) = service.undo(&claim, &mut entry, deadline).await {
                tracing::debug!(key = claim.key(), error = %err, "could not undo an abandoned acquire; the ttl will end it");
            }
        });
    }

    /// Resets `held`'s TTL to `ttl` if its lock still carries our token:
    /// `Ok(false)` when it does not. Never creates or deletes the lock.
    /// Bounded by `deadline`.
    ///
    /// # Errors
    /// A fault of the service (the lease's watchdog retries one that may
    /// pass while the lease is valid).
    fn refresh<'a>(&'a self, held: &'a Held, ttl: Duration, deadline: Instant) -> Reply<'a, bool>;

    /// Gives `held`'s lock back if it still carries our token: `Ok(false)`
    /// when it does not. Bounded by `deadline`.
    ///
    /// # Errors
    /// A fault of the service; one whose outcome is unknown never becomes
    /// `Ok`.
    fn release<'a>(&'a self, held: &'a Held, deadline: Instant) -> Reply<'a, bool>;

    /// A signal that `held`'s lock may be gone, for the lease's watchdog to
    /// confirm at once instead of at its next refresh (the
    /// [module docs](self#the-holders-watch-hearing-of-a-loss-between-refreshes)
    /// say why a signal alone never ends a lease). Defaults to `None`: no
    /// signal, and the watchdog finds a loss by its refreshes alone.
    ///
    /// The wake-up is created when the watchdog starts (and again after a
    /// refresh on its timer confirmed the lease, if it fired) and dropped
    /// when the lease ends; it is lazy (a future), so whatever it sets up
    /// (a watch) happens when it is first polled, at once. An
    /// implementation must guarantee:
    ///
    /// - **It resolves when the lock is gone.** Once the service removed
    ///   `held`'s lock (deleted, expired, taken over, the session that held
    ///   it ended), the wake-up resolves, or had already: arming it on a
    ///   lock already gone resolves at once. That is the whole point; a
    ///   loss it misses is found by the next refresh, as without it.
    /// - **It may resolve spuriously**, but only on a sign (a session
    ///   event, a fault while arming it, a change it cannot tell from a
    ///   loss): each wake costs a refresh, and the watchdog does not re-arm
    ///   a spurious one until its next timed refresh, so one that resolves
    ///   for nothing wastes at most one refresh per period and misses the
    ///   losses of that period.
    /// - **It is cheap while pending**: it never blocks its thread, and
    ///   gives back what it set up when dropped (a watch removed, a
    ///   subscription closed).
    fn watch_held(&self, _held: &Held) -> Option<Wake> {
        None
    }

    /// Whether it can confirm a win on replicas
    /// ([`AcquireOptions::wait_replicas`](crate::AcquireOptions::wait_replicas)):
    /// a single server with asynchronous replicas. Defaults to `false`: the
    /// option is then refused before any I/O, never ignored.
    fn offers_replicas(&self) -> bool {
        false
    }

    /// Waits up to `timeout` until `replicas` replicas acknowledged the
    /// writes that won the lock `key` (just won, on this client's
    /// connection): how many did. Called only when
    /// [`offers_replicas`](Self::offers_replicas); the lock is given back
    /// (and [`Error::NotReplicated`] returned) when too few did. Defaults to
    /// refused.
    ///
    /// # Errors
    /// [`Error::NotOffered`] by default; else a fault of the service.
    fn wait_replicas<'a>(
        &'a self,
        _key: &'a str,
        _replicas: u32,
        _timeout: Duration,
    ) -> Reply<'a, u64> {
        not_offered(self.service(), "wait_replicas")
    }

    /// Raises the fence counter `fence_key` to at least `at_least`, never
    /// lowering it. Defaults to refused ([`Error::NotOffered`]): a service
    /// whose tokens cannot be raised (the contract's third point says what
    /// that loses).
    ///
    /// # Errors
    /// [`Error::NotOffered`] by default; else a fault of the service.
    fn raise_fence<'a>(
        &'a self,
        _fence_key: &'a str,
        _at_least: FencingToken,
        _deadline: Instant,
    ) -> Reply<'a, ()> {
        not_offered(self.service(), "raise_fence")
    }

    /// Writes the leader record `record_key` (`body`) of an election whose
    /// lock `held` is, if the lock still carries our token: `Ok(false)`
    /// when it does not. Defaults to refused: an
    /// [`Election`](crate::Election) over the service still elects (the
    /// lock and its fencing token are the term), but cannot name its
    /// leader to the other candidates (`leader` and `observe` return
    /// [`Error::NotOffered`]).
    ///
    /// # Errors
    /// [`Error::NotOffered`] by default; else a fault of the service.
    fn announce<'a>(
        &'a self,
        _held: &'a Held,
        _record_key: &'a str,
        _body: &'a str,
        _deadline: Instant,
    ) -> Reply<'a, bool> {
        not_offered(self.service(), "election")
    }

    /// The leader record `record_key` of the election whose lock is `key`,
    /// with the lock's remaining time to live in ms, when the lock's
    /// current holder wrote it; bounded by the command timeout. Defaults to
    /// refused, as [`announce`](Self::announce).
    ///
    /// # Errors
    /// [`Error::NotOffered`] by default; else a fault of the service.
    fn leader_record<'a>(
        &'a self,
        _key: &'a str,
        _record_key: &'a str,
    ) -> Reply<'a, Option<(String, i64)>> {
        not_offered(self.service(), "election")
    }
}

/// What an acquire asks for: one lock key, the token that will mark it as
/// ours, the fence key whose counter issues its fencing token (if fenced),
/// and the TTL. Checked before the first step (a non-empty key, a TTL in
/// bounds).
#[derive(Debug, Clone)]
pub struct Claim {
    pub(crate) key: String,
    pub(crate) token: LeaseToken,
    pub(crate) fence_key: Option<String>,
    pub(crate) ttl: Duration,
}

impl Claim {
    /// The lock key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The token the lock carries while it is ours (random, 128 bits of
    /// this acquire alone).
    pub fn token(&self) -> &LeaseToken {
        &self.token
    }

    /// The fence counter's key, for a fenced claim.
    pub fn fence_key(&self) -> Option<&str> {
        self.fence_key.as_deref()
    }

    /// How long the lock is ours once won.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }
}

/// One lock a lease holds: its key, the token the key carries for us, and,
/// for a fenced lock, its fence counter's key and the fencing token issued
/// with it.
#[derive(Debug, Clone)]
pub struct Held {
    pub(crate) key: String,
    pub(crate) token: LeaseToken,
    pub(crate) fence_key: Option<String>,
    pub(crate) fence: Option<FencingToken>,
}

impl Held {
    /// The lock key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The token the lock carries for us.
    pub fn token(&self) -> &LeaseToken {
        &self.token
    }

    /// The fence counter's key, for a fenced lock.
    pub fn fence_key(&self) -> Option<&str> {
        self.fence_key.as_deref()
    }

    /// The fencing token issued with the lock, for a fenced lock.
    pub fn fence(&self) -> Option<FencingToken> {
        self.fence
    }
}

/// What one [`step`](LockService::step) found.
#[must_use]
pub struct Step {
    pub(crate) kind: StepKind,
}

pub(crate) enum StepKind {
    Won(Option<FencingToken>),
    Busy(Option<Wake>),
}

impl Step {
    /// The lock is ours, with the fencing token issued with it (for a
    /// fenced claim; `None` otherwise).
    pub fn won(fence: Option<FencingToken>) -> Step {
        Step {
            kind: StepKind::Won(fence),
        }
    }

    /// Someone else holds the lock: the loop waits for the retry
    /// strategy's next wait, then steps again.
    pub fn busy() -> Step {
        Step {
            kind: StepKind::Busy(None),
        }
    }

    /// Someone else holds the lock, and `wake` resolves when it may have
    /// become free: the loop steps again when `wake` resolves (never past
    /// the deadline, or the caller's cancellation), not after the
    /// strategy's wait. The strategy still counts the round (its
    /// `max_attempts` bounds the steps), but a queued service decides when
    /// to look again: put its fallback timer (a holder's expiry, a poll
    /// where notifications cannot arrive) into `wake`.
    pub fn busy_until(wake: impl Future<Output = ()> + Send + 'static) -> Step {
        Step {
            kind: StepKind::Busy(Some(Box::pin(wake))),
        }
    }

    /// Whether the lock is ours.
    pub fn is_won(&self) -> bool {
        matches!(self.kind, StepKind::Won(_))
    }
}

impl std::fmt::Debug for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            StepKind::Won(fence) => f.debug_tuple("Won").field(fence).finish(),
            StepKind::Busy(wake) => f
                .debug_struct("Busy")
                .field("wake", &wake.is_some())
                .finish(),
        }
    }
}

/// A default of [`LockService`]: the service does not offer `what`.
fn not_offered<'a, T: Send + 'a>(service: Service, what: &'static str) -> Reply<'a, T> {
    Box::pin(std::future::ready(Err(Error::NotOffered { service, what })))
}
