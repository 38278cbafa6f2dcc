//! The lease guard: proof, for a while, that we hold one or more locks.
//!
//! This is the lease core. One [`Lease`] type serves every way of taking a
//! lease (polling, hand-off, quorum): it keeps the validity, runs the
//! watchdog and gives the locks back, and it talks to whatever granted it
//! through one small interface, [`Backend`]. It knows nothing of retries,
//! queues or quorums.
//!
//! This file holds the [`Lease`] type and its calls; `backend` the
//! interface to what granted it, `retry` the retried release and refresh
//! (and how a release is reported), `run` the work under the lease
//! ([`Lease::run`], [`Lease::shield`], [`Finished`]).

mod backend;
mod retry;
mod run;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tracing::Instrument;

use crate::backend::Wake;
use crate::error::{Error, Result};
use crate::fencing::FencingToken;
use crate::metrics;
use crate::service::Service;
use crate::token::{HolderId, LeaseToken};
use crate::watchdog::{self, LostCause, Shared};

pub(crate) use self::backend::{Backend, Part, Reply};
pub(crate) use self::retry::{release_retrying, release_runtime, spawn_dropped_release};
pub use self::run::Finished;
pub(crate) use self::run::hold_while;

use self::retry::{log_release, refresh_retrying};

/// The target of the module's tracing events, whichever of its files sends
/// them (the crate docs list them under it).
const TARGET: &str = "leasehold::lease";
use self::run::Shields;

/// The longest TTL a lease may have: 24 hours. A lease longer than that is
/// almost certainly a unit mistake (seconds passed as milliseconds), and a
/// crashed holder would block the key for as long.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// Rejects TTLs Redis would refuse or that cannot be meant. No I/O.
pub(crate) fn check_ttl(ttl: Duration) -> Result<()> {
    if ttl < Duration::from_millis(1) || ttl > MAX_TTL {
        return Err(Error::InvalidTtl { ttl, max: MAX_TTL });
    }
    Ok(())
}

/// A held lease on one or more lock keys.
///
/// Every way of taking a lease returns this type: [`Locker`](crate::Locker)
/// (polling Redis), [`HandoffLocker`](crate::HandoffLocker) (queued on
/// Redis), [`Quorum`](crate::Quorum) (Redlock), `MemoryLocker` (feature
/// `memory`), and the lessors of other crates (`leasehold-etcd`'s
/// `EtcdLocker`, `leasehold-pg`'s `PgLocker`, `leasehold-zookeeper`'s
/// `ZkLocker`, any [`LockService`](crate::LockService)), for one key or,
/// with `acquire_all`, several. Each key carries a 128-bit token of this
/// holder alone, and, if fenced, its own [`FencingToken`].
///
/// A lease is not a mutex: the service takes the lock back when the lease
/// runs out (Redis deletes the key at its TTL, etcd ends its lease, a
/// PostgreSQL lease row expires on the database's clock, a ZooKeeper
/// session expires), whether or not the holder has finished, and a holder
/// paused past it cannot tell. [`remaining`](Self::remaining) is the holder's conservative
/// local estimate, counted on a monotonic clock from when the last request
/// that proved we hold the keys (the acquire or a refresh) was sent (less a
/// drift margin for a quorum).
///
/// Work that may outlast the TTL should run inside [`run`](Self::run), or
/// under [`watch`](Self::watch): a watchdog then refreshes the lease every
/// `ttl / 3` and stops the work when the lease is lost (see the
/// [`watchdog` docs](crate::watchdog)).
///
/// Give it back with [`release`](Self::release), which tells you whether the
/// lease was still yours. Dropping a `Lease` without releasing never blocks:
/// it aborts the watchdog, cancels the [`watch`](Self::watch) token, does
/// its bookkeeping at once and spawns the release requests on the current
/// tokio runtime (if any); the TTL is the fallback.
#[must_use = "a lease should be released with `release().await`; dropping it releases in the background"]
pub struct Lease {
    backend: Arc<dyn Backend>,
    /// In acquire order (sorted by key for a lease on several keys).
    parts: Vec<Part>,
    acquired_at: Instant,
    shared: Arc<Shared>,
    /// The runtime the lease was taken on, for spawning its watchdog.
    runtime: Option<tokio::runtime::Handle>,
    /// Set once, by the first [`watch`](Lease::watch) (so `watch` and `run`
    /// take `&self`, and the work can borrow the lease while it runs).
    watchdog: OnceLock<AbortOnDropHandle<()>>,
    /// Sections of the work that [`run`](Lease::run) lets finish even when
    /// the lease is lost ([`shield`](Lease::shield)).
    shields: Shields,
    released: bool,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("parts", &self.parts)
            .field("ttl", &self.ttl())
            .field("remaining", &self.remaining())
            .field("watched", &self.is_watched())
            .field("lost", &self.lost())
            .finish()
    }
}

impl Lease {
    /// A lease on one lock, confirmed by a request sent at `confirmed_at`
    /// that set `ttl`.
    pub(crate) fn new(
        backend: Arc<dyn Backend>,
        part: Part,
        ttl: Duration,
        confirmed_at: Instant,
    ) -> Self {
        let margin = backend.margin();
        Lease {
            backend,
            parts: vec![part],
            acquired_at: confirmed_at,
            shared: Shared::with_margin(confirmed_at, ttl, margin),
            runtime: tokio::runtime::Handle::try_current().ok(),
            watchdog: OnceLock::new(),
            shields: Shields::default(),
            released: false,
        }
    }

    /// Takes `other`'s locks into this lease (same backend, same TTL, no
    /// watchdog running yet): one lease, valid until the earlier of the two
    /// ends.
    pub(crate) fn absorb(&mut self, mut other: Lease) {
        other.released = true;
        other.end();
        self.shared.lower_to(other.shared.validity());
        self.acquired_at = self.acquired_at.min(other.acquired_at);
        for part in &other.parts {
            self.backend.held(&part.key, &self.shared);
        }
        self.parts.append(&mut other.parts);
    }

    /// What the lease shares with its watchdog (its validity).
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The lock key (the first one, in acquire order, of a lease on several
    /// keys).
    pub fn key(&self) -> &str {
        self.parts.first().map_or("", |p| &p.key)
    }

    /// The lock service this lease lives on (Redis, etcd, ...), as its
    /// errors name it.
    pub fn service(&self) -> Service {
        self.backend.service()
    }

    /// Every lock key this lease holds, in acquire order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().map(|p| p.key.as_str())
    }

    /// This holder's token on [`key`](Self::key), as stored there: 128
    /// random bits of its own, never shared with another holder.
    pub fn token(&self) -> &LeaseToken {
        &self.parts[0].token
    }

    /// This holder's public name on [`key`](Self::key): derived from its
    /// token, safe to log and store (see [`HolderId`]). The `leasehold-pg`
    /// fence guard records it with the fence it accepts.
    pub fn holder(&self) -> HolderId {
        self.parts[0].token.holder()
    }

    /// This holder's public name on `key`, for a lease on several keys;
    /// `None` if the lease does not hold `key`.
    pub fn holder_for(&self, key: &str) -> Option<HolderId> {
        self.parts
            .iter()
            .find(|p| p.key == key)
            .map(|p| p.token.holder())
    }

    /// The token that marks `key` as ours on the lock service, for a lease
    /// on several keys (each lock is taken with its own); `None` if the
    /// lease does not hold `key`. A service that keeps the token in a
    /// table (`leasehold-pg`'s `PgLocker`) is asked with it.
    pub fn token_for(&self, key: &str) -> Option<&LeaseToken> {
        self.parts.iter().find(|p| p.key == key).map(|p| &p.token)
    }

    /// The fencing token issued with the lock on [`key`](Self::key), if it
    /// was taken with [`FencedKeys`](crate::FencedKeys); `None` for a plain
    /// lock. Send it with every write the lease protects, and have the
    /// storage refuse tokens at or below the highest it has accepted.
    pub fn fence(&self) -> Option<FencingToken> {
        self.parts.first().and_then(|p| p.fence)
    }

    /// The fencing token issued with the lock on `key`, for a lease on
    /// several keys; `None` if the lease does not hold `key` or holds it
    /// unfenced.
    pub fn fence_for(&self, key: &str) -> Option<FencingToken> {
        self.parts
            .iter()
            .find(|p| p.key == key)
            .and_then(|p| p.fence)
    }

    /// Raises the fence counter of the lock on [`key`](Self::key) to at
    /// least `at_least`, never lowering it: what to do when the storage
    /// refused a write because it has seen a fence at least as high as ours.
    /// A lost counter restarts at the server's clock, above every token
    /// issued before, so that happens only when the clock assumption of
    /// [`FencingToken`] fails (a counter that ran ahead of the clock of the
    /// server that issues next), or when another holder wrote with our
    /// token. Raised to the fence the storage reported, the counter issues
    /// the next lease a token above it, and writes succeed again after at
    /// most one refusal. This lease's own token stays what it was (it was
    /// refused; take a new lease to write).
    ///
    /// The `leasehold-pg` fence guard calls it for you when it refuses a
    /// write. Bounded by the command (or node) timeout.
    ///
    /// # Errors
    /// [`Error::InvalidKey`] when the lease's lock is not fenced;
    /// [`Error::InvalidFence`] when the counter holds no integer;
    /// [`Error::Timeout`], [`Error::Unreachable`],
    /// [`Error::QuorumNotReached`] when Redis (or a majority) could not be
    /// asked.
    ///
    /// # Cancel safety
    /// Cancel safe: the raise may or may not land; raising again is
    /// harmless.
    pub async fn raise_fence(&self, at_least: FencingToken) -> Result<()> {
        self.raise_fence_for(&self.parts[0].key, at_least).await
    }

    /// [`raise_fence`](Self::raise_fence) for the lock on `key`, for a lease
    /// on several keys.
    ///
    /// # Errors
    /// As [`raise_fence`](Self::raise_fence); [`Error::InvalidKey`] also
    /// when the lease does not hold `key`.
    ///
    /// # Cancel safety
    /// As [`raise_fence`](Self::raise_fence).
    pub async fn raise_fence_for(&self, key: &str, at_least: FencingToken) -> Result<()> {
        let fence_key = self
            .parts
            .iter()
            .find(|p| p.key == key)
            .and_then(|p| p.fence_key.as_deref())
            .ok_or_else(|| Error::InvalidKey {
                key: key.to_owned(),
                reason: "the lease holds no fenced lock on this key",
            })?;
        let deadline = Instant::now() + self.backend.command_timeout();
        self.backend
            .raise_fence(fence_key, at_least, deadline)
            .await
    }

    /// The fence counter's key of the lock on `key`; `None` if the lease
    /// does not hold `key` or holds it unfenced. It names the resource in a
    /// database fence table (see `leasehold-pg`).
    pub fn fence_key_for(&self, key: &str) -> Option<&str> {
        self.parts
            .iter()
            .find(|p| p.key == key)
            .and_then(|p| p.fence_key.as_deref())
    }

    /// The TTL of the last request that proved we hold the keys: the
    /// acquire, or the last successful refresh.
    pub fn ttl(&self) -> Duration {
        self.shared.validity().ttl
    }

    /// When the request that gave us the lock was sent (monotonic clock):
    /// the winning acquire, or the pass that moved the lock to us (the
    /// earliest of them for a lease on several keys).
    pub fn acquired_at(&self) -> Instant {
        self.acquired_at
    }

    /// When the last request that proved we hold the keys was sent: the
    /// acquire, or the last successful refresh (yours or the watchdog's).
    pub fn confirmed_at(&self) -> Instant {
        self.shared.validity().confirmed_at
    }

    /// The latest instant until which the lease can still be ours: the send
    /// time of the last request that proved we hold it plus its TTL, less
    /// the drift margin of a quorum (the *confirmed deadline*). After it,
    /// assume it is gone.
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

    /// Marks the lease lost because a newer holder exists: the database
    /// refused a write of ours as stale (the `leasehold-pg` guard's
    /// `Guard::Refused`), so whatever Redis says, this lease no longer
    /// protects anything. The watchdog stops, the [`watch`](Self::watch)
    /// token is cancelled (work under [`run`](Self::run) stops at its next
    /// `.await`, [`shield`](Self::shield)ed sections first), and
    /// [`lost`](Self::lost) is [`LostCause::Superseded`]. A lease already
    /// lost keeps its first cause. The lock is not given back here:
    /// [`release`](Self::release) still does that, token-checked.
    ///
    /// A leadership [`Term`](crate::Term) ends this way. The `leasehold-pg`
    /// guard calls it on every refusal; call it yourself when another
    /// check (your own SQL) refuses the lease.
    pub fn mark_superseded(&self) {
        self.shared.lose(LostCause::Superseded);
    }

    /// Whether a watchdog is keeping this lease.
    pub fn is_watched(&self) -> bool {
        self.watchdog.get().is_some()
    }

    /// Resets the lease's TTL to `ttl` on every key, if each still holds our
    /// token: one token-checked request per key (`SET key token IFEQ token
    /// PX ttl` on Redis 8.4+ and Valkey 8.1+, a Lua `GET` + `PEXPIRE`
    /// elsewhere and for a fenced lease; on a majority
    /// of a quorum's nodes). On success the confirmed deadline becomes the
    /// send time of the first request plus `ttl`, and `ttl` is what a
    /// running watchdog uses from then on.
    ///
    /// A refresh never creates or deletes a key. Each try is bounded by the
    /// command (or node) timeout; a fault that passes quickly (a restart, a
    /// killed connection) is retried while the lease is still valid.
    ///
    /// # Errors
    /// - [`Error::InvalidTtl`] before any I/O, as for acquire;
    /// - [`Error::LeaseLost`] without I/O if the lease was already found
    ///   lost (a lost lease stays lost: its work has been told to stop);
    /// - [`Error::NotHeld`] when a key expired or changed hands: the lease
    ///   is marked lost ([`LostCause::Expired`]) and the
    ///   [`watch`](Self::watch) token is cancelled;
    /// - [`Error::Timeout`], [`Error::Unreachable`],
    ///   [`Error::QuorumNotReached`] and friends when Redis could not be
    ///   asked or did not answer enough; the lease keeps its previous
    ///   deadline.
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
        // A fault that may pass is retried while the lease can still be
        // saved (until its confirmed deadline). The new validity counts from
        // the first try's send time: never later than the one that landed.
        let refreshed = refresh_retrying(
            &*self.backend,
            &self.parts,
            ttl,
            sent_at,
            self.valid_until(),
        )
        .await;
        let key = self.key();
        let ttl_ms = ttl.as_millis();
        match refreshed {
            Ok(None) => {
                metrics::refresh("caller", "ok");
                tracing::debug!(key, ttl_ms, by = "caller", outcome = "ok", "refreshed");
                self.shared.confirm(sent_at, ttl);
                Ok(())
            }
            Ok(Some(key)) => {
                metrics::refresh("caller", "not_held");
                let cause = LostCause::Expired;
                tracing::warn!(
                    key,
                    ttl_ms,
                    by = "caller",
                    outcome = "not_held",
                    cause = cause.label(),
                    "refresh found the lease gone"
                );
                self.shared.lose(cause);
                Err(Error::NotHeld { key })
            }
            Err(err) => {
                metrics::refresh("caller", "error");
                tracing::debug!(key, ttl_ms, by = "caller", outcome = "error", error = %err, "refresh failed");
                Err(err)
            }
        }
    }

    /// Starts the watchdog (if it is not running yet) and returns the token
    /// it cancels when the lease is lost. `select!` on
    /// [`cancelled()`](CancellationToken::cancelled) in the protected work,
    /// and read [`lost`](Self::lost) for the cause.
    ///
    /// The watchdog is a task owned by the lease: it refreshes every key
    /// every `ttl / 3` (each refresh bounded by `ttl / 3`), and cancels the
    /// token when a refresh says a key is gone or when refreshes keep
    /// failing until the confirmed deadline. It stops when the lease is
    /// released or dropped, and the token is then cancelled too (with
    /// `lost()` unset), so work that still holds a clone stops. A lease that
    /// was already lost returns its (cancelled) token without starting
    /// anything. Takes `&self`: the work can hold `&lease` (for its fence,
    /// or the `leasehold-pg` guard) while the watchdog runs.
    ///
    /// See also [`AcquireOptions::watchdog`](crate::AcquireOptions::watchdog)
    /// to start it at acquire time, and [`run`](Self::run).
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] when the lease was not taken on a tokio
    /// runtime, so there is nowhere to run the watchdog.
    pub fn watch(&self) -> Result<CancellationToken> {
        if self.watchdog.get().is_none() && self.lost().is_none() {
            let runtime = self.runtime.as_ref().ok_or(Error::InvalidOptions(
                "the watchdog needs the lease to be taken on a tokio runtime",
            ))?;
            self.watchdog.get_or_init(|| {
                let (backend, parts) = (self.backend.clone(), self.parts.clone());
                // A fault that may pass (a killed connection: the request
                // that finds it broken fails, the next reconnects) is
                // retried within the refresh's own bound, not a period
                // later.
                let refresh = move |ttl, deadline: Instant| {
                    let (backend, parts) = (backend.clone(), parts.clone());
                    async move {
                        let gone =
                            refresh_retrying(&*backend, &parts, ttl, Instant::now(), deadline)
                                .await?;
                        Ok(gone.is_none())
                    }
                };
                let (backend, parts) = (self.backend.clone(), self.parts.clone());
                let arm = move || any_gone(&*backend, &parts);
                let task = runtime.spawn(watchdog::keep(
                    self.shared.clone(),
                    self.key().to_owned(),
                    self.backend.service(),
                    refresh,
                    arm,
                ));
                AbortOnDropHandle::new(task)
            });
        }
        Ok(self.shared.signal())
    }

    fn lost_error(&self, cause: LostCause) -> Error {
        Error::LeaseLost {
            key: self.key().to_owned(),
            service: self.backend.service(),
            cause,
        }
    }

    /// The bound on one request to whatever granted the lease.
    pub(crate) fn command_timeout(&self) -> Duration {
        self.backend.command_timeout()
    }

    /// Writes an election's leader record (`body`) on every key's server,
    /// if the lock still holds our token: `Ok(false)` when it does not.
    pub(crate) async fn announce(&self, record_key: &str, body: &str) -> Result<bool> {
        let deadline = Instant::now() + self.backend.command_timeout();
        match self.parts.first() {
            Some(part) => {
                self.backend
                    .announce(part, record_key, body, deadline)
                    .await
            }
            None => Ok(false),
        }
    }

    /// Stops the watchdog and tells holders of the token the lease ended.
    fn end(&mut self) {
        self.watchdog.take();
        self.shared.end();
    }

    /// Stops the watchdog, cancels the [`watch`](Self::watch) token, and
    /// gives every lock back if its key still holds our token (`DELEX key
    /// IFEQ token` on Redis 8.4+, `DELIFEQ key token` on Valkey 9.0+, a Lua
    /// script elsewhere; in hand-off mode the
    /// lock passes to the next waiter in the same atomic step; on every
    /// node of a quorum).
    ///
    /// A fault that passes quickly (Redis restarting, a killed connection,
    /// `LOADING`) is retried, token-checked, while the lease is still valid
    /// (and for at least the command timeout), so the next holder need not
    /// wait out the TTL; each try is bounded by the command (or node)
    /// timeout, and a timeout is not retried. A lease the watchdog found
    /// [`Unreachable`](LostCause::Unreachable) may still be in Redis, so
    /// release still asks.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when a key had expired or changed hands: nothing
    /// was deleted there, and another holder's lock is untouched (the other
    /// keys were still given back). [`Error::Timeout`],
    /// [`Error::Unreachable`], [`Error::QuorumNotReached`] and friends when
    /// Redis could not be asked in time; the TTL then ends the lease.
    /// [`Error::LeaseLost`] ([`LostCause::Unreachable`]) when Redis stayed
    /// out of reach until the lease ran out: nothing is left to give back.
    /// If a try that may have acted got no answer and a later try finds
    /// the key gone, the release cannot tell whether it deleted the key or
    /// found it gone, and never claims either: while the lease is still
    /// valid that is [`Error::Timeout`] (the key may have been lost), once
    /// it ran out [`Error::LeaseLost`]
    /// ([`LostCause::Unreachable`]), as when Redis stayed out of reach:
    /// either way the lease is over.
    ///
    /// # Cancel safety
    /// If the future is dropped before Redis answers, the release may or may
    /// not happen; either way the TTL ends the lease.
    pub async fn release(mut self) -> Result<()> {
        self.released = true;
        self.end();
        let span = tracing::debug_span!(
            "leasehold.release",
            key = self.key(),
            keys = self.parts.len(),
            outcome = tracing::field::Empty,
        );
        let outcome = if span.is_disabled() {
            self.release_parts().await
        } else {
            self.release_parts().instrument(span.clone()).await
        };
        span.record(
            "outcome",
            match &outcome {
                Ok(()) => "released",
                Err(Error::NotHeld { .. }) => "not_held",
                Err(_) => "error",
            },
        );
        outcome
    }

    /// Gives every part back; the first failure is the outcome.
    async fn release_parts(&self) -> Result<()> {
        let (until, per_try) = (self.valid_until(), self.backend.command_timeout());
        let mut outcome = Ok(());
        for part in &self.parts {
            let released = release_retrying(&*self.backend, part, until, per_try).await;
            log_release(&part.key, &released, false);
            if outcome.is_ok() {
                outcome = match released {
                    Ok(true) => Ok(()),
                    Ok(false) => Err(Error::NotHeld {
                        key: part.key.clone(),
                    }),
                    Err(err) => Err(err),
                };
            }
        }
        outcome
    }
}

/// The service's signal that any of `parts`' locks may be gone: resolves
/// when the first part's does; `None` when no part has one.
fn any_gone(backend: &dyn Backend, parts: &[Part]) -> Option<Wake> {
    let mut wakes: Vec<Wake> = parts.iter().filter_map(|p| backend.watch_held(p)).collect();
    match wakes.len() {
        0 => None,
        1 => wakes.pop(),
        _ => Some(Box::pin(std::future::poll_fn(move |cx| {
            if wakes
                .iter_mut()
                .any(|wake| wake.as_mut().poll(cx).is_ready())
            {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        }))),
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.end();
        if !self.released {
            let until = self.valid_until();
            for part in std::mem::take(&mut self.parts) {
                self.backend.clone().release_dropped(part, until);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_bounds() {
        assert!(check_ttl(Duration::ZERO).is_err());
        assert!(check_ttl(Duration::from_micros(999)).is_err());
        assert!(check_ttl(Duration::from_millis(1)).is_ok());
        assert!(check_ttl(MAX_TTL).is_ok());
        assert!(matches!(
            check_ttl(MAX_TTL + Duration::from_millis(1)),
            Err(Error::InvalidTtl { .. })
        ));
    }
}
