//! The lease guard: proof, for a while, that we hold a lock.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

use crate::RedisConnection;
use crate::error::{Error, Result};
use crate::handoff::HandoffStyle;
use crate::locker::Locker;
use crate::token::LeaseToken;

/// A held lease on one lock key.
///
/// A lease is not a mutex: Redis deletes the key when the TTL runs out,
/// whether or not the holder has finished, and a holder paused past its TTL
/// cannot tell. [`remaining`](Self::remaining) is the holder's conservative
/// local estimate, counted on a monotonic clock from when the winning request
/// was sent.
///
/// Give it back with [`release`](Self::release), which tells you whether the
/// lease was still yours. Dropping a `Lease` without releasing never blocks:
/// it spawns a best-effort release on the current tokio runtime (if any), and
/// the TTL is the fallback.
#[must_use = "a lease should be released with `release().await`; dropping it releases in the background"]
pub struct Lease<C: RedisConnection = MultiplexedConnection> {
    locker: Locker<C>,
    key: String,
    token: LeaseToken,
    ttl: Duration,
    acquired_at: Instant,
    released: bool,
    kind: ReleaseKind,
}

/// How a lease gives its lock back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReleaseKind {
    /// Compare-and-delete.
    Plain,
    /// Hand the lock to the next waiter in the queue (hand-off mode).
    Handoff(HandoffStyle),
}

impl<C: RedisConnection> std::fmt::Debug for Lease<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("key", &self.key)
            .field("token", &self.token)
            .field("ttl", &self.ttl)
            .field("remaining", &self.remaining())
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
            ttl,
            acquired_at,
            released: false,
            kind: ReleaseKind::Plain,
        }
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

    /// This holder's token, as stored in the key.
    pub fn token(&self) -> &LeaseToken {
        &self.token
    }

    /// The TTL the lease was taken with.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// When the winning request was sent (monotonic clock).
    pub fn acquired_at(&self) -> Instant {
        self.acquired_at
    }

    /// The latest instant until which the lease can still be ours: the send
    /// time of the winning request plus the TTL. After it, assume it is gone.
    pub fn valid_until(&self) -> Instant {
        self.acquired_at + self.ttl
    }

    /// Time left until [`valid_until`](Self::valid_until), zero once passed.
    pub fn remaining(&self) -> Duration {
        self.valid_until().saturating_duration_since(Instant::now())
    }

    /// Deletes the lock if it still holds this lease's token (a lease taken
    /// through a [`HandoffLocker`](crate::HandoffLocker) instead passes the
    /// lock to the next waiter, in the same atomic step).
    ///
    /// Bounded by the locker's command timeout.
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
        let deadline = Instant::now() + self.locker.command_timeout();
        if release(&self.locker, &self.key, &self.token, self.kind, deadline).await? {
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
        if !self.released {
            spawn_release_kind(
                self.locker.clone(),
                std::mem::take(&mut self.key),
                self.token.clone(),
                self.kind,
            );
        }
    }
}

async fn release<C: RedisConnection>(
    locker: &Locker<C>,
    key: &str,
    token: &LeaseToken,
    kind: ReleaseKind,
    deadline: Instant,
) -> Result<bool> {
    match kind {
        ReleaseKind::Plain => locker.release_token(key, token, deadline).await,
        ReleaseKind::Handoff(style) => {
            crate::handoff::release(locker, key, token, style, false, deadline).await
        }
    }
}

/// Best-effort background release; never blocks, never panics.
pub(crate) fn spawn_release<C: RedisConnection>(locker: Locker<C>, key: String, token: LeaseToken) {
    spawn_release_kind(locker, key, token, ReleaseKind::Plain);
}

/// [`spawn_release`] for a lease of any kind.
pub(crate) fn spawn_release_kind<C: RedisConnection>(
    locker: Locker<C>,
    key: String,
    token: LeaseToken,
    kind: ReleaseKind,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::debug!(
            key,
            "no tokio runtime to release a dropped lease; the ttl will end it"
        );
        return;
    };
    runtime.spawn(async move {
        let deadline = Instant::now() + locker.command_timeout();
        match release(&locker, &key, &token, kind, deadline).await {
            Ok(true) => tracing::debug!(key, "released dropped lease"),
            Ok(false) => tracing::debug!(key, "dropped lease had already expired"),
            Err(err) => tracing::warn!(key, error = %err, "could not release dropped lease; the ttl will end it"),
        }
    });
}
