//! The lease guard: proof, for a while, that we hold a lock.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionManager;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::RedisConnection;
use crate::compare::Step;
use crate::error::{Error, Result};
use crate::fencing::FencingToken;
use crate::handoff::HandoffRelease;
use crate::locker::{Locker, check_ttl};
use crate::token::LeaseToken;
use crate::watchdog::{self, LostCause, Shared};

/// A held lease on one lock key.
///
/// A lease is not a mutex: Redis deletes the key when the TTL runs out,
/// whether or not the holder has finished, and a holder paused past its TTL
/// cannot tell. [`remaining`](Self::remaining) is the holder's conservative
/// local estimate, counted on a monotonic clock from when the last request
/// that proved we hold the key (the acquire or a refresh) was sent.
///
/// Work that may outlast the TTL should run inside [`run`](Self::run), or
/// under [`watch`](Self::watch): a watchdog then refreshes the lease every
/// `ttl / 3` and stops the work when the lease is lost (see the
/// [`watchdog` docs](crate#keeping-a-lease)).
///
/// Give it back with [`release`](Self::release), which tells you whether the
/// lease was still yours. Dropping a `Lease` without releasing never blocks:
/// it aborts the watchdog, cancels the [`watch`](Self::watch) token, and
/// spawns a best-effort release on the current tokio runtime (if any); the
/// TTL is the fallback.
#[must_use = "a lease should be released with `release().await`; dropping it releases in the background"]
pub struct Lease<C: RedisConnection = ConnectionManager> {
    locker: Locker<C>,
    key: String,
    token: LeaseToken,
    acquired_at: Instant,
    shared: Arc<Shared>,
    /// The runtime the lease was taken on, for spawning its watchdog.
    runtime: Option<tokio::runtime::Handle>,
    watchdog: Option<AbortOnDropHandle<()>>,
    fence: Option<FencingToken>,
    released: bool,
    kind: ReleaseKind,
}

/// How a lease gives its lock back.
#[derive(Debug, Clone)]
pub(crate) enum ReleaseKind {
    /// Compare-and-delete.
    Plain,
    /// Hand the lock to the next waiter in the queue (hand-off mode).
    Handoff(HandoffRelease),
}

impl<C: RedisConnection> std::fmt::Debug for Lease<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("key", &self.key)
            .field("token", &self.token)
            .field("ttl", &self.ttl())
            .field("fence", &self.fence)
            .field("remaining", &self.remaining())
            .field("watched", &self.is_watched())
            .field("lost", &self.lost())
            .finish()
    }
}

impl<C: RedisConnection> Lease<C> {
    pub(crate) fn new(
        locker: Locker<C>,
        key: String,
        token: LeaseToken,
        ttl: Duration,
        acquired_at: Instant,
    ) -> Self {
        Lease {
            locker,
            key,
            token,
            acquired_at,
            shared: Shared::new(acquired_at, ttl),
            runtime: tokio::runtime::Handle::try_current().ok(),
            watchdog: None,
            fence: None,
            released: false,
            kind: ReleaseKind::Plain,
        }
    }

    /// What the lease shares with its watchdog (its validity).
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The same lease, carrying the fencing token its acquire was issued.
    pub(crate) fn with_fence(mut self, fence: FencingToken) -> Self {
        self.fence = Some(fence);
        self
    }

    /// The fencing token issued with this lease, if it was taken with
    /// [`Locker::acquire_fenced`]; `None` for a plain lease. Send it with
    /// every write the lease protects, and have the storage refuse tokens at
    /// or below the highest it has accepted.
    pub fn fence(&self) -> Option<FencingToken> {
        self.fence
    }

    /// Makes the lease give its lock back the `kind` way.
    pub(crate) fn with_release(mut self, kind: ReleaseKind) -> Self {
        self.kind = kind;
        self
    }

    /// The lock key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// This holder's token, as stored in the key: 128 random bits of its
    /// own, never shared with another holder (a lease relayed in process by
    /// a [`HandoffLocker`](crate::HandoffLocker) gets a fresh one too).
    pub fn token(&self) -> &LeaseToken {
        &self.token
    }

    /// The TTL of the last request that proved we hold the key: the acquire,
    /// or the last successful refresh.
    pub fn ttl(&self) -> Duration {
        self.shared.validity().ttl
    }

    /// When the request that gave us the lock was sent (monotonic clock):
    /// the winning acquire, or the pass that moved the lock to us.
    pub fn acquired_at(&self) -> Instant {
        self.acquired_at
    }

    /// When the last request that proved we hold the key was sent: the
    /// acquire, or the last successful refresh (yours or the watchdog's).
    pub fn confirmed_at(&self) -> Instant {
        self.shared.validity().confirmed_at
    }

    /// The latest instant until which the lease can still be ours: the send
    /// time of the last request that proved we hold it plus its TTL (the
    /// *confirmed deadline*). After it, assume it is gone.
    pub fn valid_until(&self) -> Instant {
        self.shared.validity().until()
    }

    /// Time left until [`valid_until`](Self::valid_until), zero once passed.
    pub fn remaining(&self) -> Duration {
        self.valid_until().saturating_duration_since(Instant::now())
    }

    /// Why the lease was lost, once a refresh (the watchdog's or yours) has
    /// found it gone; `None` while it is believed held.
    pub fn lost(&self) -> Option<LostCause> {
        self.shared.lost()
    }

    /// Whether a watchdog is keeping this lease.
    pub fn is_watched(&self) -> bool {
        self.watchdog.is_some()
    }

    /// Resets the lease's TTL to `ttl`, if the key still holds our token:
    /// one token-checked request (`SET key token IFEQ token PX ttl` on Redis
    /// 8.4+, a Lua `GET` + `PEXPIRE` before). On success the confirmed
    /// deadline becomes the request's send time plus `ttl`, and `ttl` is what
    /// a running watchdog uses from then on.
    ///
    /// A refresh never creates or deletes the key. Bounded by the locker's
    /// command timeout.
    ///
    /// # Errors
    /// - [`Error::InvalidTtl`] before any I/O, as for acquire;
    /// - [`Error::LeaseLost`] without I/O if the lease was already found
    ///   lost (a lost lease stays lost: its work has been told to stop);
    /// - [`Error::NotHeld`] when the key expired or changed hands: nothing
    ///   changed, the lease is marked lost ([`LostCause::Expired`]) and the
    ///   [`watch`](Self::watch) token is cancelled;
    /// - [`Error::Timeout`], [`Error::Unreachable`] and friends when Redis
    ///   could not be asked; the lease keeps its previous deadline.
    ///
    /// # Cancel safety
    /// Cancel safe: if the future is dropped before Redis answers, the
    /// refresh may or may not land, and the lease keeps its previous
    /// (shorter, hence safe) deadline.
    pub async fn refresh(&self, ttl: Duration) -> Result<()> {
        check_ttl(ttl)?;
        if let Some(cause) = self.lost() {
            return Err(self.lost_error(cause));
        }
        let sent_at = Instant::now();
        let deadline = sent_at + self.locker.command_timeout();
        let held = self
            .locker
            .token_checked(Step::Refresh { ttl }, &self.key, &self.token, deadline)
            .await?;
        if held {
            self.shared.confirm(sent_at, ttl);
            Ok(())
        } else {
            self.shared.lose(LostCause::Expired);
            Err(Error::NotHeld {
                key: self.key.clone(),
            })
        }
    }

    /// Starts the watchdog (if it is not running yet) and returns the token
    /// it cancels when the lease is lost. `select!` on
    /// [`cancelled()`](CancellationToken::cancelled) in the protected work,
    /// and read [`lost`](Self::lost) for the cause.
    ///
    /// The watchdog is a task owned by the lease: it refreshes every
    /// `ttl / 3` (each refresh bounded by `ttl / 3`), and cancels the token
    /// when a refresh says the lease is gone or when refreshes keep failing
    /// until the confirmed deadline. It stops when the lease is released or
    /// dropped, and the token is then cancelled too (with `lost()` unset),
    /// so work that still holds a clone stops. A lease that was already
    /// lost returns its (cancelled) token without starting anything.
    ///
    /// See also [`AcquireOptions::watchdog`](crate::AcquireOptions::watchdog)
    /// to start it at acquire time, and [`run`](Self::run).
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] when the lease was not taken on a tokio
    /// runtime, so there is nowhere to run the watchdog.
    pub fn watch(&mut self) -> Result<CancellationToken> {
        if self.watchdog.is_none() && self.lost().is_none() {
            let runtime = self.runtime.as_ref().ok_or(Error::InvalidOptions(
                "the watchdog needs the lease to be taken on a tokio runtime",
            ))?;
            let (locker, key, token) = (self.locker.clone(), self.key.clone(), self.token.clone());
            let refresh = move |ttl, deadline| {
                let (locker, key, token) = (locker.clone(), key.clone(), token.clone());
                async move {
                    locker
                        .token_checked(Step::Refresh { ttl }, &key, &token, deadline)
                        .await
                }
            };
            let task = runtime.spawn(watchdog::keep(
                self.shared.clone(),
                self.key.clone(),
                refresh,
            ));
            self.watchdog = Some(AbortOnDropHandle::new(task));
        }
        Ok(self.shared.signal().clone())
    }

    /// Runs `work` while the lease is held: starts the watchdog (as
    /// [`watch`](Self::watch) does) and races `work` against it. If the
    /// lease is lost first, `work` is dropped at its current `.await` and
    /// never resumed, and the result is [`Error::LeaseLost`], never the
    /// work's output.
    ///
    /// The watchdog keeps running after `run` returns, until the lease is
    /// released or dropped, so several `run`s can share one lease.
    ///
    /// Being cancelled is only as good as `work`'s cancellation points: code
    /// between two `.await`s runs to the next one. And the watchdog notices
    /// a loss up to one refresh period late, so a write inside `work` must
    /// still be fenced by the database.
    ///
    /// # Errors
    /// - [`Error::LeaseLost`] with the [`LostCause`] when the lease was lost
    ///   before or while `work` ran (also when both finished at the same
    ///   moment: a result that might have been produced without the lease is
    ///   not returned);
    /// - [`Error::InvalidOptions`] as for [`watch`](Self::watch).
    ///
    /// # Cancel safety
    /// Dropping the returned future drops `work` at its current `.await`;
    /// the lease and its watchdog are unaffected.
    pub async fn run<F: Future>(&mut self, work: F) -> Result<F::Output> {
        let lost = self.watch()?;
        tokio::select! {
            biased;
            () = lost.cancelled() => {
                Err(self.lost_error(self.lost().unwrap_or(LostCause::Expired)))
            }
            output = work => Ok(output),
        }
    }

    fn lost_error(&self, cause: LostCause) -> Error {
        Error::LeaseLost {
            key: self.key.clone(),
            cause,
        }
    }

    /// Stops the watchdog and tells holders of the token the lease ended.
    fn end(&mut self) {
        self.watchdog = None;
        self.shared.end();
    }

    /// Stops the watchdog, cancels the [`watch`](Self::watch) token, and
    /// deletes the lock if it still holds this lease's token
    /// (`DELEX key IFEQ token` on Redis 8.4+, a Lua script before). A lease
    /// taken through a [`HandoffLocker`](crate::HandoffLocker) instead
    /// passes the lock to the next waiter, in the same atomic step.
    ///
    /// Bounded by the locker's command timeout. A lease the watchdog found
    /// [`Unreachable`](LostCause::Unreachable) may still be in Redis, so
    /// release still asks.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when the lease had expired or the key changed
    /// hands: nothing was deleted, and another holder's lock is untouched.
    /// [`Error::Timeout`], [`Error::Unreachable`] and friends when Redis
    /// could not be asked; the TTL then ends the lease.
    ///
    /// # Cancel safety
    /// If the future is dropped before Redis answers, the release may or may
    /// not happen; either way the TTL ends the lease.
    pub async fn release(mut self) -> Result<()> {
        self.released = true;
        self.end();
        let deadline = Instant::now() + self.locker.command_timeout();
        let released = release(&self.locker, &self.key, &self.token, &self.kind, deadline);
        if released.await? {
            Ok(())
        } else {
            Err(Error::NotHeld {
                key: std::mem::take(&mut self.key),
            })
        }
    }
}

impl<C: RedisConnection> Drop for Lease<C> {
    fn drop(&mut self) {
        self.end();
        if !self.released {
            let (locker, key, token) = (
                self.locker.clone(),
                std::mem::take(&mut self.key),
                self.token.clone(),
            );
            match std::mem::replace(&mut self.kind, ReleaseKind::Plain) {
                ReleaseKind::Plain => spawn_release(locker, key, token),
                ReleaseKind::Handoff(how) => {
                    crate::handoff::release_dropped(locker, key, token, how);
                }
            }
        }
    }
}

async fn release<C: RedisConnection>(
    locker: &Locker<C>,
    key: &str,
    token: &LeaseToken,
    kind: &ReleaseKind,
    deadline: Instant,
) -> Result<bool> {
    match kind {
        ReleaseKind::Plain => locker.release_token(key, token, deadline).await,
        ReleaseKind::Handoff(how) => {
            crate::handoff::release(locker, key, token, how, deadline).await
        }
    }
}

/// Best-effort background release of a plain lease; never blocks, never
/// panics. With no runtime, the TTL ends the lease.
pub(crate) fn spawn_release<C: RedisConnection>(locker: Locker<C>, key: String, token: LeaseToken) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::debug!(
            key,
            "no tokio runtime to release a dropped lease; the ttl will end it"
        );
        return;
    };
    runtime.spawn(async move {
        let deadline = Instant::now() + locker.command_timeout();
        match locker.release_token(&key, &token, deadline).await {
            Ok(true) => tracing::debug!(key, "released dropped lease"),
            Ok(false) => tracing::debug!(key, "dropped lease had already expired"),
            Err(err) => tracing::warn!(key, error = %err, "could not release dropped lease; the ttl will end it"),
        }
    });
}
