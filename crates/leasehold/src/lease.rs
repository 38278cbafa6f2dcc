//! The lease guard: proof, for a while, that we hold one or more locks.
//!
//! This is the lease core. One [`Lease`] type serves every way of taking a
//! lease (polling, hand-off, quorum): it keeps the validity, runs the
//! watchdog and gives the locks back, and it talks to whatever granted it
//! through one small interface, [`Backend`]. It knows nothing of retries,
//! queues or quorums.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tracing::Instrument;

use crate::error::{Error, Result};
use crate::fencing::FencingToken;
use crate::metrics;
use crate::token::{HolderId, LeaseToken};
use crate::watchdog::{self, LostCause, Margin, Shared};

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

/// One lock a lease holds: its key, the token the key carries for us, and,
/// for a fenced lock, its fence counter's key and the fencing token issued
/// with it.
#[derive(Debug, Clone)]
pub(crate) struct Part {
    pub(crate) key: String,
    pub(crate) token: LeaseToken,
    pub(crate) fence_key: Option<String>,
    pub(crate) fence: Option<FencingToken>,
}

/// A boxed reply future of a [`Backend`].
pub(crate) type Reply<'a, T> = Pin<Box<dyn Future<Output = Result<T>> + Send + 'a>>;

/// What granted a lease, as the lease sees it: the token-checked steps on
/// one lock. Implemented by each way of taking a lease.
pub(crate) trait Backend: Send + Sync + 'static {
    /// The bound on a release with no tighter deadline.
    fn command_timeout(&self) -> Duration;

    /// The clock-drift margin taken off every confirmed TTL.
    fn margin(&self) -> Margin {
        watchdog::no_margin
    }

    /// Resets `part`'s TTL to `ttl` if its key still holds our token:
    /// `Ok(false)` when it does not. Never creates or deletes the key.
    fn refresh<'a>(&'a self, part: &'a Part, ttl: Duration, deadline: Instant) -> Reply<'a, bool>;

    /// Gives `part`'s lock back (deleted, or passed to the next waiter) if
    /// its key still holds our token: `Ok(false)` when it does not.
    fn release<'a>(&'a self, part: &'a Part, deadline: Instant) -> Reply<'a, bool>;

    /// Raises the fence counter `fence_key` to at least `at_least`, never
    /// lowering it (on a majority, for a quorum).
    fn raise_fence<'a>(
        &'a self,
        fence_key: &'a str,
        at_least: FencingToken,
        deadline: Instant,
    ) -> Reply<'a, ()>;

    /// Writes the leader record `record_key` (`body`) of an election whose
    /// lock `part` is, if its key still holds our token (on a majority, for
    /// a quorum): `Ok(false)` when it does not.
    fn announce<'a>(
        &'a self,
        part: &'a Part,
        record_key: &'a str,
        body: &'a str,
        deadline: Instant,
    ) -> Reply<'a, bool>;

    /// Notes that the lease sharing `shared` now holds `key` (a lease on
    /// several keys took in another lock).
    fn held(&self, _key: &str, _shared: &Arc<Shared>) {}

    /// Gives back the lock of a lease dropped without
    /// [`release`](Lease::release), valid until `until` (the lease's
    /// confirmed deadline: faults that may pass are retried until then, so
    /// the next holder need not wait out the TTL). Synchronous, never
    /// blocks: bookkeeping happens here, Redis requests are spawned when a
    /// runtime is at hand, and the TTL is the fallback.
    fn release_dropped(self: Arc<Self>, part: Part, until: Instant);
}

/// A held lease on one or more lock keys.
///
/// Every way of taking a lease returns this type: [`Locker`](crate::Locker)
/// (polling), [`HandoffLocker`](crate::HandoffLocker) (queued) and
/// [`Quorum`](crate::Quorum) (Redlock), for one key or, with `acquire_all`,
/// several. Each key carries a 128-bit token of this holder alone, and, if
/// fenced, its own [`FencingToken`].
///
/// A lease is not a mutex: Redis deletes the key when the TTL runs out,
/// whether or not the holder has finished, and a holder paused past its TTL
/// cannot tell. [`remaining`](Self::remaining) is the holder's conservative
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

/// How many [`shield`](Lease::shield)ed sections are running, and a signal
/// when one ends.
#[derive(Debug, Default)]
struct Shields {
    running: std::sync::atomic::AtomicUsize,
    ended: tokio::sync::Notify,
}

/// One running shielded section; ends it when dropped (finished or
/// cancelled).
struct ShieldGuard<'a>(&'a Shields);

impl Drop for ShieldGuard<'_> {
    fn drop(&mut self) {
        self.0
            .running
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        self.0.ended.notify_waiters();
    }
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
    /// A leadership [`Term`](crate::Term) ends this way; the guard does not
    /// call it for you.
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
                let task = runtime.spawn(watchdog::keep(
                    self.shared.clone(),
                    self.key().to_owned(),
                    refresh,
                ));
                AbortOnDropHandle::new(task)
            });
        }
        Ok(self.shared.signal())
    }

    /// Runs `work` while the lease is held: starts the watchdog (as
    /// [`watch`](Self::watch) does) and races `work` against it. `work`
    /// may borrow the lease (its [`fence`](Self::fence), the `leasehold-pg`
    /// guard in the same transaction):
    ///
    /// ```no_run
    /// # async fn demo(lease: leasehold::Lease) -> leasehold::Result<()> {
    /// let fence = lease.run(async { lease.fence() }).await?;
    /// # let _ = fence;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// If the watchdog finds the lease lost before `work` finishes, `work` is
    /// dropped at its current `.await` and never resumed, and the result is
    /// [`Error::LeaseLost`]. Once `work` has finished, its output is always
    /// returned, even if the loss was found in the same instant: the work
    /// ran to its end and its effects happened, and hiding them from the
    /// caller would lose them. Whether the lease was still ours then is
    /// what [`lost`](Self::lost) and [`release`](Self::release) tell.
    ///
    /// The watchdog keeps running after `run` returns, until the lease is
    /// released or dropped, so several `run`s can share one lease.
    ///
    /// Being cancelled is only as good as `work`'s cancellation points: code
    /// between two `.await`s runs to the next one. And the watchdog notices
    /// a loss up to one refresh period late, so `Ok` does not prove the
    /// lease held throughout: a write inside `work` must still be fenced by
    /// the database (the `leasehold-pg` guard), which is what makes it
    /// correct. A transaction dropped before its commit is rolled back; one
    /// dropped while its `COMMIT` is in flight may have committed: the
    /// database knows, the caller does not.
    ///
    /// # Errors
    /// - [`Error::LeaseLost`] with the [`LostCause`] when the lease was lost
    ///   before `work` finished (or before it started);
    /// - [`Error::InvalidOptions`] as for [`watch`](Self::watch).
    ///
    /// # Cancel safety
    /// Dropping the returned future drops `work` at its current `.await`;
    /// the lease and its watchdog are unaffected.
    pub async fn run<F: Future>(&self, work: F) -> Result<F::Output> {
        let lost = self.watch()?;
        if let Some(cause) = self.lost() {
            return Err(self.lost_error(cause));
        }
        self.race(&lost, work).await
    }

    /// Runs `section` to its end even if the watchdog finds the lease lost
    /// meanwhile: inside [`run`](Self::run) (and `with_lock`), the work is
    /// then stopped only once no shielded section is running. Made for the
    /// **commit** of a guarded transaction, so that the caller always learns
    /// whether it committed: `lease.shield(tx.commit()).await?` as the
    /// work's last step (the `leasehold-pg` docs show it in full).
    ///
    /// Without it, a loss found while the `COMMIT` is in flight drops the
    /// work there: the transaction may have committed, and the caller gets
    /// [`Error::LeaseLost`] instead of the work's output. Shielding does not
    /// make a write safer or less safe (a `COMMIT` already sent lands
    /// whether or not its future is dropped; the fence guard is what
    /// refuses a stale holder), it keeps the *answer*. Keep shielded
    /// sections short: the watchdog cannot stop them.
    ///
    /// Outside `run`, it is just `section.await`.
    ///
    /// # Cancel safety
    /// As `section`'s own; dropping the future ends the shield.
    pub async fn shield<F: Future>(&self, section: F) -> F::Output {
        self.shields
            .running
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let _guard = ShieldGuard(&self.shields);
        section.await
    }

    /// `work` raced against the loss of the lease (`lost` cancelled). The
    /// work is polled first: an output it produced is never dropped; and
    /// after a loss it goes on while a [`shield`](Self::shield)ed section
    /// runs.
    async fn race<F: Future>(&self, lost: &CancellationToken, work: F) -> Result<F::Output> {
        let mut work = std::pin::pin!(work);
        tokio::select! {
            biased;
            output = &mut work => return Ok(output),
            () = lost.cancelled() => {}
        }
        loop {
            let ended = self.shields.ended.notified();
            let mut ended = std::pin::pin!(ended);
            // Registered before the count is read, so an end between the
            // two is not missed.
            ended.as_mut().enable();
            if self
                .shields
                .running
                .load(std::sync::atomic::Ordering::SeqCst)
                == 0
            {
                return Err(self.lost_error(self.lost().unwrap_or(LostCause::Expired)));
            }
            tokio::select! {
                biased;
                output = &mut work => return Ok(output),
                () = &mut ended => {}
            }
        }
    }

    fn lost_error(&self, cause: LostCause) -> Error {
        Error::LeaseLost {
            key: self.key().to_owned(),
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
    /// it ran out [`Error::LeaseLost`] ([`LostCause::Unreachable`]), as
    /// when Redis stayed out of reach: either way the lease is over.
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

/// Gives `part`'s lock back, retrying a fault that may pass until `until`
/// (the lease's confirmed deadline: after it the TTL frees the key anyway),
/// at least one `per_try`. A try that faulted may have landed, so if a later
/// try then finds the key no longer ours, we cannot tell "released by that
/// try" from "lost before": the fault is the outcome, never a `NotHeld` we
/// do not know.
pub(crate) async fn release_retrying(
    backend: &dyn Backend,
    part: &Part,
    until: Instant,
    per_try: Duration,
) -> Result<bool> {
    let start = Instant::now();
    let faulted = std::sync::atomic::AtomicBool::new(false);
    let released = crate::call::retrying(start, until, per_try, |deadline| {
        let faulted = &faulted;
        async move {
            let tried = backend.release(part, deadline).await;
            if matches!(&tried, Err(err) if crate::call::may_have_acted(err)) {
                faulted.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            tried
        }
    })
    .await;
    let faulted = faulted.into_inner();
    match released {
        // No definite answer came for the try that may have acted, and a
        // later try found the key gone while the lease was still valid:
        // that try's delete, or the key lost (a restart, an eviction, a
        // delete). We cannot tell which, and claim neither.
        Ok(false) if faulted && Instant::now() < until => Err(Error::Timeout {
            op: "release",
            after: start.elapsed(),
        }),
        // The same once the lease ran out: whether our try deleted the key
        // or its TTL ended it, nothing is left to give back and the lease
        // is over, as below.
        Ok(false) if faulted => {
            tracing::debug!(
                key = part.key,
                "release unconfirmed until the lease ran out"
            );
            Err(Error::LeaseLost {
                key: part.key.clone(),
                cause: LostCause::Unreachable,
            })
        }
        // Redis stayed out of reach until the lease ran out: there is
        // nothing left to give back (its TTL has ended it, on the same
        // conservative clock as `remaining`), and the lease is lost; the
        // fault is not the caller's news. Never a success we cannot know.
        Err(err) if crate::call::fault_may_pass(&err) && Instant::now() >= until => {
            tracing::debug!(key = part.key, error = %err, "redis unreachable until the lease ran out");
            Err(Error::LeaseLost {
                key: part.key.clone(),
                cause: LostCause::Unreachable,
            })
        }
        released => released,
    }
}

/// Reports how giving back the lock `key` went: one event (a WARN when the
/// lease was found gone: it expired or changed hands while held) and the
/// release metric. `dropped`: the lease was dropped without release.
fn log_release(key: &str, released: &Result<bool>, dropped: bool) {
    let outcome = match released {
        Ok(true) => "released",
        Ok(false) => "not_held",
        Err(_) => "error",
    };
    metrics::release(outcome, dropped);
    match (released, dropped) {
        (Ok(true), false) => tracing::debug!(key, outcome, "released"),
        (Ok(true), true) => tracing::debug!(key, outcome, "released dropped lease"),
        (Ok(false), false) => tracing::warn!(
            key,
            outcome,
            "release found the lease gone: it expired or changed hands while held"
        ),
        (Ok(false), true) => tracing::debug!(key, outcome, "dropped lease had already expired"),
        (Err(err), false) => tracing::debug!(key, outcome, error = %err, "release failed"),
        (Err(Error::LeaseLost { .. }), true) => tracing::debug!(
            key,
            outcome,
            "dropped lease ran out before redis answered; its ttl ended it"
        ),
        (Err(err), true) => {
            tracing::warn!(key, outcome, error = %err, "could not release dropped lease; the ttl will end it")
        }
    }
}

/// Holds `lease` while `work` runs with it: starts the watchdog, races the
/// work against the loss of the lease, and releases it; the work's output
/// comes back with the release's outcome. The common case of every way of
/// taking a lease (`with_lock`).
pub(crate) async fn hold_while<T>(
    lease: Lease,
    work: impl AsyncFnOnce(&Lease) -> T,
) -> Result<Finished<T>> {
    let output = match lease.run(work(&lease)).await {
        Ok(output) => output,
        Err(err) => {
            // No output: the work was stopped (or never started). Give the
            // lock back all the same; the error says why the work stopped.
            if let Err(release) = lease.release().await {
                tracing::debug!(error = %release, "release after a lost lease failed");
            }
            return Err(err);
        }
    };
    let release = lease.release().await;
    Ok(Finished { output, release })
}

/// What [`with_lock`](crate::Lessor::with_lock) returns when the work ran to
/// its end: the work's output **and** how giving the lease back went. The
/// output is never dropped because of the release: by the time the release
/// runs, the work's effects (a committed transaction) have happened.
///
/// What the two say about the data:
///
/// - The **database decided** what the work wrote: a write guarded by the
///   `leasehold-pg` fence guard (or a check-and-set) was committed or
///   refused by the database, whatever the lease did. Put that answer in
///   `output` (for example the guard's `Accepted` / `Refused`), and count
///   committed work from it.
/// - [`release`](Self::release) only says whether the lock was still ours
///   when we gave it back: `Ok(())` it was, and is now free (or handed to
///   the next waiter); [`Error::NotHeld`] or [`Error::LeaseLost`] it had
///   expired or changed hands while the work ran (the fence guard is what
///   kept the data right then); [`Error::Timeout`] / [`Error::Unreachable`]
///   Redis could not be asked, and the TTL ends the lease. None of these
///   undo or void what the work committed.
#[must_use = "the work's output is inside; `release` says whether the lease was still held"]
#[derive(Debug)]
#[non_exhaustive]
pub struct Finished<T> {
    /// What the work returned. It ran to its end.
    pub output: T,
    /// How giving the lease back went (see the type's docs).
    pub release: Result<()>,
}

impl<T> Finished<T> {
    /// The work's output, whatever the release said.
    pub fn into_output(self) -> T {
        self.output
    }

    /// Whether the lease was still ours when it was given back (the release
    /// found our token on every key). `false` does not mean the work's
    /// writes were lost or wrong: the database decided those.
    pub fn was_held_at_release(&self) -> bool {
        self.release.is_ok()
    }
}

/// The runtime to spawn a dropped lease's release on; `None` (logged) when
/// there is none, and the TTL ends the lease.
pub(crate) fn release_runtime(key: &str) -> Option<tokio::runtime::Handle> {
    let runtime = tokio::runtime::Handle::try_current().ok();
    if runtime.is_none() {
        tracing::debug!(
            key,
            "no tokio runtime to release a dropped lease; the ttl will end it"
        );
    }
    runtime
}

/// Spawns `release` (the Redis part of giving back a dropped lease's lock
/// `key`) on `runtime` and logs how it went; never blocks.
pub(crate) fn spawn_dropped_release<F>(runtime: &tokio::runtime::Handle, key: String, release: F)
where
    F: Future<Output = Result<bool>> + Send + 'static,
{
    runtime.spawn(async move {
        log_release(&key, &release.await, true);
    });
}

/// [`refresh_all`], with a fault that may pass retried from `start` until
/// `until` (at least one command timeout): the one retry of a caller's
/// refresh and the watchdog's. Each try is token-checked, so repeating one
/// that may have landed is harmless.
async fn refresh_retrying(
    backend: &dyn Backend,
    parts: &[Part],
    ttl: Duration,
    start: Instant,
    until: Instant,
) -> Result<Option<String>> {
    crate::call::retrying(start, until, backend.command_timeout(), |deadline| {
        refresh_all(backend, parts, ttl, deadline)
    })
    .await
}

/// Refreshes every part; `Some(key)` names the first whose key no longer
/// held our token (the rest are left as they are).
async fn refresh_all(
    backend: &dyn Backend,
    parts: &[Part],
    ttl: Duration,
    deadline: Instant,
) -> Result<Option<String>> {
    for part in parts {
        if !backend.refresh(part, ttl, deadline).await? {
            return Ok(Some(part.key.clone()));
        }
    }
    Ok(None)
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

    /// A backend whose first release deletes the key but whose answer is
    /// lost (a timeout, after `lost_for`), and whose later releases find
    /// the key gone.
    struct LostAnswer {
        lost_for: Duration,
        tries: std::sync::atomic::AtomicU32,
    }

    impl Backend for LostAnswer {
        fn command_timeout(&self) -> Duration {
            Duration::from_millis(100)
        }
        fn refresh<'a>(&'a self, _: &'a Part, _: Duration, _: Instant) -> Reply<'a, bool> {
            Box::pin(async { Ok(false) })
        }
        fn release<'a>(&'a self, _: &'a Part, _: Instant) -> Reply<'a, bool> {
            let first = self.tries.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
            let lost_for = self.lost_for;
            Box::pin(async move {
                if first {
                    tokio::time::sleep(lost_for).await;
                    return Err(Error::Unreachable {
                        op: "release",
                        source: redis::RedisError::from(std::io::Error::from(
                            std::io::ErrorKind::ConnectionReset,
                        ))
                        .into(),
                    });
                }
                Ok(false)
            })
        }
        fn raise_fence<'a>(&'a self, _: &'a str, _: FencingToken, _: Instant) -> Reply<'a, ()> {
            Box::pin(async { Ok(()) })
        }
        fn announce<'a>(
            &'a self,
            _: &'a Part,
            _: &'a str,
            _: &'a str,
            _: Instant,
        ) -> Reply<'a, bool> {
            Box::pin(async { Ok(false) })
        }
        fn release_dropped(self: Arc<Self>, _: Part, _: Instant) {}
    }

    fn part() -> Part {
        Part {
            key: "k".to_owned(),
            token: LeaseToken::generate().unwrap_or_else(|_| unreachable!()),
            fence_key: None,
            fence: None,
        }
    }

    /// The first try's connection broke with the request out (it may have
    /// deleted the key), the retry finds the key gone: before the lease ran
    /// out that is a timeout (the key may have been lost), after it the
    /// lease is over (lost, unreachable). Never `Ok` and never `NotHeld`.
    #[tokio::test(start_paused = true)]
    async fn a_release_that_may_have_acted_never_claims_what_it_cannot_know() {
        for (lost_for, lease_for, expired) in [
            (Duration::from_millis(10), Duration::from_secs(5), false),
            (Duration::from_millis(60), Duration::from_millis(50), true),
        ] {
            let backend = LostAnswer {
                lost_for,
                tries: Default::default(),
            };
            let until = Instant::now() + lease_for;
            let outcome =
                release_retrying(&backend, &part(), until, backend.command_timeout()).await;
            match (&outcome, expired) {
                (Err(Error::Timeout { op: "release", .. }), false)
                | (
                    Err(Error::LeaseLost {
                        cause: LostCause::Unreachable,
                        ..
                    }),
                    true,
                ) => {}
                _ => panic!("lease for {lease_for:?}: {outcome:?}"),
            }
            assert_eq!(backend.tries.load(std::sync::atomic::Ordering::SeqCst), 2);
        }
    }

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
