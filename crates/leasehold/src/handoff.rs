//! Hand-off mode: waiters sleep until a release hands them the lock.
//!
//! The protocol, its crash safety and the measured design choice are
//! documented on [`HandoffLocker`].

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::ConnectionManager;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::error::{Error, GiveUpReason, Result};
use crate::fencing::{FencingToken, LockKeys, Target};
use crate::lease::{Backend, Lease, Part, Reply, release_runtime, spawn_dropped_release};
use crate::locker::Locker;
use crate::node::{Node, not_a_fence, ttl_millis};
use crate::options::{AcquireOptions, Supports};
use crate::relay::{Entry, Next, Relay, Ticket, Turn};
use crate::rounds::Rounds;
use crate::token::LeaseToken;
use crate::watchdog::{Shared, Validity};
use crate::way::{self, Way};
use crate::{RedisConnection, call};

/// How many passes in a row a release may make to other waiters of the
/// same [`HandoffLocker`] before one lets other processes' waiters in
/// first, by default ([`HandoffLockerBuilder::relay_limit`]).
pub const DEFAULT_RELAY_LIMIT: u32 = 16;

/// How a release passes the lock to the next waiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum HandoffStyle {
    /// The release sets the lock to the next waiter's token (issuing its
    /// fencing token too) and tells it: the waiter owns the lease without
    /// sending a request. FIFO.
    #[default]
    Grant,
    /// The release deletes the lock and wakes the next waiter, which takes
    /// it with its own request. FIFO as well, one more request per
    /// acquisition; kept as the measured alternative.
    Wake,
}

impl HandoffStyle {
    fn as_arg(self) -> &'static str {
        match self {
            HandoffStyle::Grant => "grant",
            HandoffStyle::Wake => "wake",
        }
    }
}

/// What a waiter's pub/sub message said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signal {
    /// The lock is ours, with this fencing token (0: unfenced).
    Granted(u64),
    /// Re-check the lock: it was released to us (take it), or messages may
    /// have been lost.
    Woken,
}

type Waiters = Mutex<HashMap<String, mpsc::UnboundedSender<Signal>>>;

/// One locker's own waiters, and the channel that names them in the queue.
/// A release by this locker that serves one of them tells it through here
/// instead of `PUBLISH`.
struct Local {
    channel: String,
    waiters: Waiters,
    /// The tokens of this locker's leases not yet given back (released or
    /// dropped). With `waiters`, it tells an *orphan* hand-off: one to a
    /// token that neither waits nor holds here any more.
    held: Mutex<HashSet<LeaseToken>>,
    /// The in-process queues, unless relay is off.
    relay: Option<Relay>,
}

impl Local {
    /// Tells every waiter of ours to re-check the lock.
    fn wake_all(&self) {
        for sender in self
            .waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
        {
            let _ = sender.send(Signal::Woken);
        }
    }

    /// Delivers `signal` to our waiter `token`; `false` when it no longer
    /// waits (it won another way, or gave up and is leaving the queue).
    fn tell(&self, token: &str, signal: Signal) -> bool {
        self.waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(token)
            .is_some_and(|sender| sender.send(signal).is_ok())
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashSet<LeaseToken>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Nobody here waits with `token` or holds a lease with it. A waiter
    /// that wins becomes a lease before it stops being a waiter, so a
    /// token in neither was given up, given back, or never ours in this
    /// life of the queue (an entry a failover or a restart from disk
    /// brought back).
    fn orphan(&self, token: &LeaseToken) -> bool {
        !self
            .waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(token.as_str())
            && !self.held().contains(token)
    }
}

/// What a hand-off lease gives its lock back through: the node, the style,
/// and the locker's own waiters (served in process).
pub(crate) struct HandoffBackend<C> {
    node: Arc<Node<C>>,
    style: HandoffStyle,
    local: Arc<Local>,
    /// Itself, to spawn the requests that pass on an orphan hand-off.
    this: Weak<HandoffBackend<C>>,
}

impl<C> HandoffBackend<C> {
    /// Who a lease of ours on `key` that ends serves next: the relay's
    /// decision (synchronous), or nobody in process with relay off.
    fn next(&self, key: &str) -> Next {
        self.local
            .relay
            .as_ref()
            .map_or(Next::Nobody, |r| r.next(key))
    }
}

impl<C: RedisConnection> HandoffBackend<C> {
    /// A hand-off reached `token` (on `key`), which neither waits nor holds
    /// a lease here: nobody will take that lock or give it back, so we leave
    /// the queue on the token's behalf. The leave script is token-checked:
    /// it passes the lock on if the lock still holds `token` (or serves the
    /// queue if the lock is free), and changes nothing else. Without it the
    /// lock sat with nobody until its TTL ran out, once per stale queue entry
    /// a failover or a restart from disk brought back.
    fn pass_orphan(&self, key: &str, token: &str) {
        let Some(token) = LeaseToken::parse(token) else {
            return;
        };
        if !self.local.orphan(&token) {
            tracing::debug!(
                key,
                "served waiter no longer waits: it won the lock another way"
            );
            return;
        }
        let Some(this) = self.this.upgrade() else {
            return;
        };
        tracing::debug!(key, "hand-off to a waiter gone from here; passing it on");
        spawn_leave(
            this,
            Part {
                key: key.to_owned(),
                token,
                fence_key: None,
                fence: None,
            },
        );
    }
}

impl<C: RedisConnection> Backend for HandoffBackend<C> {
    fn command_timeout(&self) -> Duration {
        self.node.command_timeout()
    }

    fn refresh<'a>(&'a self, part: &'a Part, ttl: Duration, deadline: Instant) -> Reply<'a, bool> {
        // The lock itself is a plain lease's: the node refreshes it.
        Backend::refresh(&*self.node, part, ttl, deadline)
    }

    fn release<'a>(&'a self, part: &'a Part, deadline: Instant) -> Reply<'a, bool> {
        self.local.held().remove(&part.token);
        Box::pin(release(self, part, deadline))
    }

    fn raise_fence<'a>(
        &'a self,
        fence_key: &'a str,
        at_least: FencingToken,
        deadline: Instant,
    ) -> Reply<'a, ()> {
        Backend::raise_fence(&*self.node, fence_key, at_least, deadline)
    }

    fn held(&self, key: &str, shared: &Arc<Shared>) {
        if let Some(relay) = &self.local.relay {
            relay.hold(key, shared);
        }
    }

    fn release_dropped(self: Arc<Self>, part: Part) {
        self.local.held().remove(&part.token);
        release_dropped(self, part);
    }
}

/// A [`Locker`] whose waiters are handed the lock by the release instead of
/// polling for it: the queued way of taking a [`Lease`], with the same four
/// calls as [`Locker`] ([`acquire`](Self::acquire),
/// [`acquire_with`](Self::acquire_with), [`acquire_all`](Self::acquire_all),
/// [`with_lock`](Self::with_lock)), fenced or not.
///
/// # Why
///
/// A polling lock ([`Locker::acquire_with`]) asks Redis again after every
/// wait. With `n` callers queued on one key that is `n` requests per wait
/// interval for one winner, the winner is whoever happens to ask first after
/// a release (so a lucky caller can win again and again), and the key sits
/// idle between the release and the next lucky poll. Shorter waits cut the
/// idle time and multiply the requests; longer waits do the opposite.
///
/// A [`HandoffLocker`] removes the trade-off: a caller that finds the lock
/// busy joins a FIFO queue and sleeps; the holder's release passes the lock
/// straight to the first live waiter and tells it so over pub/sub. One
/// request to join, one to release, whatever the number of waiters, and
/// waiters are served in arrival order.
///
/// By default it goes one step further for the callers of one process (all
/// the tasks sharing one `HandoffLocker`): they queue in process behind the
/// one of them that holds or waits in Redis, and a release passes the lock
/// to the next of them with one token-checked request
/// ([in-process relay](#in-process-relay)). Redis then sees one request per
/// lease instead of two.
///
/// # Protocol
///
/// Three keys per lock key `K`: the lock `K` itself (the same string as in
/// polling mode), a ZSET `K:waitq` of waiter tokens scored by arrival, and a
/// HASH `K:waiters` mapping each waiter's token to its entry's expiry, its
/// TTL and the pub/sub channel that reaches it.
///
/// - **Acquire** (`handoff_acquire.lua`) takes the lock if it is free and
///   nobody live is ahead of us, and otherwise enqueues us, in one atomic
///   step. A release can therefore never fall between "it was busy" and "we
///   are in the queue". Each locker subscribes to its own channel once, when
///   it connects, and registers a waiter locally before sending the script,
///   so a hand-off that lands before the script's reply is not missed either.
/// - **Release** (`handoff_release.lua`) checks our token, pops the first
///   live waiter, publishes `g <token> <key>` on its channel and sets the
///   lock to that waiter's token with that waiter's TTL (`SET K token PX
///   ttl`). The waiter holds the lease from that moment: no request of its
///   own.
/// - **In-process hand-off**: when that waiter is one of the releasing
///   locker's own (its entry names our channel), the script still moves the
///   lock to its token in the same atomic step, but skips the `PUBLISH` and
///   returns the token; the release then wakes the waiter through an
///   in-process channel. One server-side socket write fewer per hand-off, so
///   share one `HandoffLocker` among all the tasks of a process.
/// - **Giving up** (deadline, cancel, retries exhausted, or the future
///   dropped) runs the release script in "leave" mode: it removes our entry
///   and, if the lock was handed to us meanwhile, passes it on.
/// - **Fallback timer**: a waiter re-runs the acquire script when the
///   holder's TTL (as last seen) runs out, and at least once per TTL of its
///   own. That picks up a hand-off whose message was lost, and serves the
///   queue when a holder died without releasing. There is no per-waiter
///   heartbeat: a waiter's liveness is checked when it is served (below).
///
/// # In-process relay
///
/// On by default ([`DEFAULT_RELAY_LIMIT`]); `relay_limit(0)` turns it off.
///
/// - A caller that finds another task of this locker holding `key`, or
///   waiting for it in Redis, does not send a request: it joins a local FIFO
///   and sleeps. Only one task per locker and key is ever in Redis's queue.
/// - A release with local waiters passes the lock to the first of them with
///   **one token-checked request** (a *relay*): in one atomic step Redis
///   checks that the key still holds the releasing lease's token and sets
///   it to a fresh token of the next holder, with the TTL that holder asked
///   for. The new lease is counted from when that request was sent. If the
///   key no longer held our token (it expired, was evicted, lost in a
///   restart or failover, or taken by another process), nothing moves: the
///   release returns [`Error::NotHeld`] and the next local waiter goes to
///   Redis like any other caller. So every holder, relayed or not, was
///   confirmed by Redis when it was handed the lock, and no two holders
///   share a token.
/// - Every `relay_limit + 1`-th pass is a **checkpoint**: the same request
///   serves Redis's queue first (another process's waiter gets the lock;
///   our next waiter then queues in Redis behind it) and, with nobody
///   waiting there, moves the lock to our next waiter as a relay does.
///   So another process waits at most `relay_limit` local turns, and
///   processes take turns in batches instead of caller by caller: with
///   relay on, FIFO holds within a process and between the batches of
///   processes; with it off, across all callers.
/// - A local waiter that stops waiting in process because no lease of ours
///   on the key is alive any more (its holder hung, or an outage outlasted
///   it) queues in Redis as a unit of its own. While such a unit waits
///   there, every pass is a checkpoint: it came before the callers queued
///   in process since, so it is served before them, and the local queue
///   then waits behind it (one unit per process again) instead of
///   overtaking it turn after turn.
/// - A local waiter that gives up (deadline, cancel, dropped future) leaves
///   the local queue without a request; if a turn reached it meanwhile it
///   passes it on. [`RetryStrategy::none`](crate::RetryStrategy::none) on a
///   key busy in process gives up at once (one attempt, answered locally).
/// - Safety does not depend on the local queue: every transfer of the lock
///   is decided by Redis with a token check; the local queue only decides
///   who asks next. As with any lease, a write that must not happen twice
///   is fenced by the database.
///
/// # Crash safety
///
/// - A holder that dies blocks the key for at most its TTL: the lock
///   expires, and the next waiter's re-check (due by then, see above) takes
///   it or hands it on.
/// - A waiter whose process dies has no subscriber on its channel any more;
///   `PUBLISH` reports zero receivers, and the release drops it and serves
///   the next one in the same step.
/// - A hand-off that reaches a token that neither waits nor holds a lease in
///   its locker any more (in process or over pub/sub) is an *orphan*: the
///   waiter gave up, or its queue entry came back after it had left (a
///   failover to a replica that had not seen it leave, a restart from an
///   old append-only file). The locker runs the leave script for that
///   token, which passes the lock on if it still holds the token. A waiter
///   that *won* the lock another way meanwhile (its own re-check, or
///   another client's script, can serve it between a release script and
///   the message) holds a lease with that token, so it is left alone: an
///   earlier version handed the lock on whenever the waiter was gone and,
///   under load, took it from a waiter that had just won it. Every step is
///   token-checked, so an orphan that a leave script passed on already
///   changes nothing.
/// - A waiter that gives up while a hand-off to it is in flight: its leave
///   script runs after the hand-off (which then finds the lock holding its
///   token and passes it on) or before it (and then no release can pick it,
///   unless its entry comes back, above).
/// - With relay, a holder task that panics drops its lease, which passes it
///   on in the background. A holder that never releases nor drops its
///   lease (a leaked guard, a hung task) blocks our local waiters until its
///   lease runs out by its own clock: they then fall back to Redis, which
///   has freed the key by then. The whole process dying is the dead holder
///   case above.
/// - Anything that still slips through (a process that is partitioned but
///   not yet disconnected, a waiter future leaked with `mem::forget`) is
///   handed a lease that ends with its TTL; queue entries expire at their
///   owner's deadline.
///
/// # Which design, and why
///
/// Three designs are implemented and measured side by side by `leasehold
/// bench contention` (see `BENCHMARKS.md`, 50 and 500 callers working 2 ms
/// each on one key, medians):
///
/// - [`HandoffStyle::Wake`], relay off: the release deletes the lock and
///   only *wakes* the first waiter, which takes it with its own request.
///   3.0 requests per acquisition, the longest release-to-next-holder gap
///   (p50 230 to 430 us).
/// - [`HandoffStyle::Grant`], relay off: the FIFO hand-off described above,
///   the lock moves inside the release script. 2.0 requests per
///   acquisition, gap p50 170 to 250 us, server CPU per acquisition 0.42
///   to 0.76 of tuned polling at 50 callers.
/// - Grant with [in-process relay](#in-process-relay) (the default): one
///   token-checked request per acquisition (see `BENCHMARKS.md` for the
///   current figures). An earlier relay passed the lease on *without* a
///   request (0.06 requests per acquisition) and was withdrawn: it let
///   local holders work after the key had vanished and another process had
///   taken the lock.
///
/// Why relay wins: without it every acquisition costs two requests that
/// each reach Redis alone (the holder's work separates them), and on a
/// small machine a lone request costs the server tens of microseconds of
/// CPU in socket system calls, whatever the script does. Relay halves that
/// and keeps the waiters off Redis. What it costs: FIFO across processes
/// becomes turns of up to `relay_limit` leases (documented above);
/// `relay_limit(0)` restores strict per-caller FIFO.
///
/// # Limits
///
/// - All callers of one key must use hand-off mode: a polling acquire on the
///   same key takes the lock when it is free and ignores the queue (safe, but
///   not fair).
/// - On Redis Cluster the three keys must share a slot: give the lock key a
///   hash tag, such as `lock:{wallet:42}`. There, `PUBLISH` counts only the
///   subscribers on the node that runs the script, so a waiter connected to
///   another node looks dead: use hand-off mode on a single node (or with
///   every locker's pub/sub connection on the key's node).
/// - With relay on, a lease that is neither released nor dropped (a hung
///   task, `mem::forget`) still counts as its locker's holder for the key,
///   forever. Once it runs out (by its own clock), that locker's callers
///   stop waiting for it at once and go to Redis, where the key is free;
///   they just no longer get relays from it (every pass is then a
///   checkpoint: still one request, but Redis's queue first). Release or
///   drop every lease; a watchdog does not help a task that never returns.
/// - If a locker's pub/sub connection drops, its waiters look dead to other
///   lockers' releases until it is back, and are dropped from the queue (its
///   own releases still serve them in process). The locker reconnects and
///   resubscribes on its own (retrying while Redis is down) and then wakes
///   all its waiters, which re-check the lock and re-join the queue at
///   once: they may lose their place in line, never their turn.
///
/// # Lease validity
///
/// A lease handed over by a release is counted from when the waiter's last
/// request that found the lock busy was *sent*: the hand-off happened after
/// that, so the holder's estimate of its remaining time is never longer than
/// Redis's (it is shorter by up to the time it waited).
///
/// Cheap to clone: clones share the locker and the one pub/sub connection.
#[derive(Clone)]
pub struct HandoffLocker<C: RedisConnection = ConnectionManager> {
    inner: Arc<HandoffInner<C>>,
}

struct HandoffInner<C: RedisConnection> {
    locker: Locker<C>,
    backend: Arc<HandoffBackend<C>>,
    listener: JoinHandle<()>,
}

impl<C: RedisConnection> Drop for HandoffInner<C> {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

impl<C: RedisConnection> std::fmt::Debug for HandoffLocker<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let backend = &self.inner.backend;
        f.debug_struct("HandoffLocker")
            .field("style", &backend.style)
            .field("channel", &backend.local.channel)
            .field(
                "relay_limit",
                &backend.local.relay.as_ref().map_or(0, Relay::limit),
            )
            .finish_non_exhaustive()
    }
}

/// Builds a [`HandoffLocker`].
#[must_use]
#[derive(Debug)]
pub struct HandoffLockerBuilder<C: RedisConnection> {
    locker: Locker<C>,
    client: redis::Client,
    style: HandoffStyle,
    relay_limit: u32,
}

impl<C: RedisConnection> HandoffLockerBuilder<C> {
    /// How many passes in a row a release may make to other waiters of
    /// this locker (see [relay](HandoffLocker#in-process-relay)) before the
    /// next one serves Redis's queue (other processes' waiters) first. `0`
    /// turns relay off: every waiter queues in Redis, and all callers,
    /// whatever their process, are served in arrival order.
    ///
    /// Defaults to [`DEFAULT_RELAY_LIMIT`] (16).
    pub fn relay_limit(mut self, limit: u32) -> Self {
        self.relay_limit = limit;
        self
    }

    /// How a release passes the lock on.
    ///
    /// Defaults to [`HandoffStyle::Grant`].
    pub fn style(mut self, style: HandoffStyle) -> Self {
        self.style = style;
        self
    }

    /// Opens the pub/sub connection, subscribes to this locker's channel
    /// and starts the task that routes hand-offs to waiters (and reconnects
    /// the pub/sub connection when it drops). Both requests are bounded by
    /// the locker's command timeout.
    ///
    /// # Errors
    /// [`Error::Unreachable`], [`Error::Timeout`] or [`Error::Auth`] when the
    /// pub/sub connection cannot be opened; [`Error::Random`] when no channel
    /// name could be drawn.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future drops the half-open connection.
    pub async fn connect(self) -> Result<HandoffLocker<C>> {
        let channel = format!("leasehold:handoff:{}", LeaseToken::generate()?);
        let timeout = self.locker.command_timeout();
        let messages = subscribe(&self.client, &channel, timeout).await?;
        let local = Arc::new(Local {
            channel,
            waiters: Waiters::default(),
            held: Mutex::default(),
            relay: (self.relay_limit > 0).then(|| Relay::new(self.relay_limit)),
        });
        let backend = Arc::new_cyclic(|this| HandoffBackend {
            node: self.locker.node.clone(),
            style: self.style,
            local,
            this: this.clone(),
        });
        let listener = tokio::spawn(route(self.client, messages, backend.clone(), timeout));
        Ok(HandoffLocker {
            inner: Arc::new(HandoffInner {
                locker: self.locker,
                backend,
                listener,
            }),
        })
    }
}

/// Opens a pub/sub connection subscribed to `channel`, each request bounded
/// by `timeout`.
async fn subscribe(
    client: &redis::Client,
    channel: &str,
    timeout: Duration,
) -> Result<redis::aio::PubSubStream> {
    let deadline = Instant::now() + timeout;
    let mut pubsub = call::bounded("subscribe", "", deadline, client.get_async_pubsub()).await?;
    call::bounded("subscribe", "", deadline, pubsub.subscribe(channel)).await?;
    Ok(pubsub.into_on_message())
}

/// Delivers each `g <token> <key> <fence>` / `w <token> <key>` message to
/// the local waiter. A message for a waiter that is no longer registered
/// is dropped when the token holds a lease here (it won the lock another
/// way: a re-check found it handed over); otherwise the hand-off is an
/// orphan and is passed on ([`HandoffBackend::pass_orphan`]).
///
/// When the connection drops (Redis restarted, the connection was killed),
/// it reconnects and resubscribes, retrying with a growing pause (up to 1 s)
/// while Redis is down, then wakes every waiter of this locker: a message
/// sent while nobody listened is lost, and a release that found nobody
/// listening dropped our waiter from Redis's queue, so each one re-checks
/// the lock (and re-joins the queue) at once instead of at its fallback
/// timer.
async fn route<C: RedisConnection>(
    client: redis::Client,
    mut messages: redis::aio::PubSubStream,
    backend: Arc<HandoffBackend<C>>,
    timeout: Duration,
) {
    let local = &backend.local;
    loop {
        while let Some(msg) = messages.next().await {
            let Ok(payload) = std::str::from_utf8(msg.get_payload_bytes()) else {
                continue;
            };
            let mut parts = payload.split(' ');
            let (Some(kind), Some(token), Some(key)) = (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let signal = match kind {
                "g" => {
                    let fence = parts.next().and_then(|f| f.parse().ok()).unwrap_or(0);
                    Signal::Granted(fence)
                }
                "w" => Signal::Woken,
                _ => continue,
            };
            if !local.tell(token, signal) {
                backend.pass_orphan(key, token);
            }
        }
        tracing::warn!(
            channel = local.channel,
            "hand-off pub/sub connection lost; reconnecting"
        );
        let mut pause = Duration::from_millis(20);
        messages = loop {
            match subscribe(&client, &local.channel, timeout).await {
                Ok(messages) => break messages,
                Err(err) => {
                    tracing::debug!(error = %err, "hand-off pub/sub reconnect failed; retrying");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
            }
        };
        tracing::info!(
            channel = local.channel,
            "hand-off pub/sub connection back; waiters re-check the lock"
        );
        local.wake_all();
    }
}

/// How soon a queued waiter whose re-check failed (connection dropped, Redis
/// restarting) tries again.
const RECHECK_AFTER_FAILURE: Duration = Duration::from_millis(50);

/// What one run of the acquire script found.
enum Found {
    /// We set the lock just now, with this fence (0: unfenced).
    TookIt(u64),
    /// A release had already handed it to us, with this fence.
    HandedOver(u64),
    /// We wait; the holder's remaining TTL if known.
    Waiting(Option<Duration>),
}

/// A waiter of ours was handed the lock `key` by a release (`via`: `grant`,
/// `recheck` or `relay`): one DEBUG event, and the hand-off metric.
fn handed(key: &str, via: &'static str, fence: Option<FencingToken>) {
    let fence = fence.map(FencingToken::get);
    crate::metrics::handoff(via);
    tracing::debug!(key, via, fence, "handed the lock by a release");
}

/// A fence from a script or message: `None` for 0 (unfenced).
fn fence_of(value: u64) -> Option<FencingToken> {
    (value > 0).then(|| FencingToken::new(value))
}

impl<C: RedisConnection> Way for HandoffLocker<C> {
    /// A hand-off locker honours every option.
    const SUPPORTS: Supports = Supports {
        wait_replicas: true,
    };

    const MODE: &'static str = "handoff";

    async fn take(&self, target: Target, ttl: Duration, opts: &AcquireOptions) -> Result<Lease> {
        self.take_checked(target, ttl, opts).await
    }
}

impl<C: RedisConnection> HandoffLocker<C> {
    /// A builder over `locker` (whose connection sends the scripts) and
    /// `client` (which opens the one pub/sub connection this locker needs).
    pub fn builder(locker: Locker<C>, client: &redis::Client) -> HandoffLockerBuilder<C> {
        HandoffLockerBuilder {
            locker,
            client: client.clone(),
            style: HandoffStyle::default(),
            relay_limit: DEFAULT_RELAY_LIMIT,
        }
    }

    /// The underlying locker (its [`stats`](Locker::stats) count hand-off
    /// requests too).
    pub fn locker(&self) -> &Locker<C> {
        &self.inner.locker
    }

    /// Takes the lease on `keys` for `ttl`, queued, with the default
    /// [`AcquireOptions`].
    ///
    /// See [`acquire_with`](Self::acquire_with) for errors and cancel safety.
    pub async fn acquire(&self, keys: impl LockKeys, ttl: Duration) -> Result<Lease> {
        self.acquire_with(keys, ttl, &AcquireOptions::default())
            .await
    }

    /// Takes the lease on `keys` for `ttl`, waiting in the key's FIFO queue
    /// until a release hands it over, as `opts` says. Given
    /// [`FencedKeys`](crate::FencedKeys), every holder gets its own
    /// [`FencingToken`], issued in the same atomic step that gives it the
    /// lock (its own acquire, a release's grant, or a relay's pass), so
    /// tokens grow strictly from holder to holder. Use the same fence key
    /// for every caller of one lock key.
    ///
    /// `opts`'s deadline and cancellation token apply exactly as in
    /// [`Locker::acquire_with`]. Its retry strategy's *waits* are not used
    /// (a waiter sleeps until it is handed the lock or its fallback timer
    /// fires), but its length is: each fallback re-check consumes one wait,
    /// so [`RetryStrategy::none`](crate::RetryStrategy::none) makes one
    /// attempt and [`max_attempts`](crate::RetryStrategy::max_attempts)
    /// bounds the number of requests. Queuing in process behind another
    /// task of this locker ([relay](#in-process-relay)) counts as one
    /// attempt and uses one wait.
    ///
    /// [`AcquireOptions::watchdog`] and
    /// [`AcquireOptions::wait_replicas`] apply as in
    /// [`Locker::acquire_with`], to a lease passed on in process too.
    ///
    /// The lease's release hands the lock to the next waiter.
    ///
    /// # Errors
    /// As [`Locker::acquire_with`]: [`Error::NotAcquired`] with the reason
    /// (retries exhausted, deadline expired, cancelled), whatever the
    /// options; [`Error::InvalidTtl`] / [`Error::InvalidKey`] (and a zero
    /// replica wait timeout, [`Error::InvalidOptions`]) before any I/O;
    /// [`Error::NotReplicated`] when too few replicas acknowledged (the lock
    /// was passed on); [`Error::InvalidFence`] when the fence key holds no
    /// counter; a failure of the first request returned at once. Once
    /// queued, a waiter rides out a dropped connection or a Redis restart: a
    /// re-check that fails with [`Error::Unreachable`] or
    /// [`Error::Timeout`] is retried 50 ms later (the connection reconnects
    /// meanwhile) until the deadline.
    ///
    /// # Cancel safety
    /// Cancel safe. If the future is dropped while waiting (or a request is
    /// in flight), a best-effort "leave" script is spawned that removes our
    /// queue entry and passes on a lock that was handed to us; the entry's
    /// expiry and the lease's TTL are the fallback. Dropped while waiting
    /// for replicas, the lease exists and its drop passes it on.
    pub async fn acquire_with(
        &self,
        keys: impl LockKeys,
        ttl: Duration,
        opts: &AcquireOptions,
    ) -> Result<Lease> {
        way::acquire_with(self, keys, ttl, opts).await
    }

    /// Takes the leases on every one of `keys`, queued, in one global order,
    /// as one [`Lease`]; see [`Locker::acquire_all`].
    ///
    /// # Errors
    /// As [`Locker::acquire_all`].
    ///
    /// # Cancel safety
    /// Cancel safe, as [`acquire_with`](Self::acquire_with).
    pub async fn acquire_all<K: LockKeys>(
        &self,
        keys: impl IntoIterator<Item = K>,
        ttl: Duration,
        opts: &AcquireOptions,
    ) -> Result<Lease> {
        way::acquire_all_of(self, keys, ttl, opts).await
    }

    /// Takes the lease on `keys`, queued, runs `work` while it is held and
    /// releases it; see [`Locker::with_lock`].
    ///
    /// # Errors
    /// As [`Locker::with_lock`].
    ///
    /// # Cancel safety
    /// As [`Locker::with_lock`].
    pub async fn with_lock<T>(
        &self,
        keys: impl LockKeys,
        ttl: Duration,
        opts: &AcquireOptions,
        work: impl AsyncFnOnce(&Lease) -> T,
    ) -> Result<crate::Finished<T>> {
        crate::Lessor::with_lock(self, keys, ttl, opts, work).await
    }

    /// One checked target: queued, then the replica wait and the watchdog.
    async fn take_checked(
        &self,
        target: Target,
        ttl: Duration,
        opts: &AcquireOptions,
    ) -> Result<Lease> {
        let start = Instant::now();
        let lease = self.take(&target, ttl, opts, start).await?;
        let deadline = opts.deadline_from(start);
        let lease =
            crate::replicas::confirm(&self.inner.locker.node, lease, opts, deadline).await?;
        if opts.watchdog {
            lease.watch()?;
        }
        Ok(lease)
    }

    /// The waiting part of [`acquire_with`](Self::acquire_with), from
    /// `start`: in process, then in Redis.
    async fn take(
        &self,
        target: &Target,
        ttl: Duration,
        opts: &AcquireOptions,
        start: Instant,
    ) -> Result<Lease> {
        let key = target.lock.as_str();
        let fence_key = target.fence.as_deref();
        let backend = &self.inner.backend;
        let mut rounds = Rounds::new(key, opts, backend.node.command_timeout(), start);
        rounds.check_cancelled()?;
        let unit = match &backend.local.relay {
            None => None,
            Some(relay) => {
                let may_wait = rounds.may_wait();
                match relay.enter(key, ttl, fence_key, may_wait) {
                    Entry::Represent => {}
                    // Queuing in process is an attempt (answered locally)
                    // and uses up one wait of the strategy, as a busy join
                    // would.
                    Entry::Busy => {
                        rounds.attempt_in_process();
                        return Err(rounds.give_up(GiveUpReason::RetriesExhausted));
                    }
                    Entry::Queued(ticket) => {
                        rounds.attempt_in_process();
                        rounds.next_wait()?;
                        let waited = self.wait_in_process(relay, target, ttl, ticket, &rounds);
                        if let Some(lease) = waited.await? {
                            return Ok(lease);
                        }
                    }
                }
                Some(Unit {
                    relay,
                    key,
                    armed: true,
                })
            }
        };
        let token = LeaseToken::generate()?;
        let px = ttl_millis(ttl);
        let counters = &backend.node.counters;
        let (tx, mut rx) = mpsc::unbounded_channel();
        let waiting = Waiting::enter(self, target, &token, ttl, tx, unit);

        let mut last_busy = start;
        loop {
            let (sent_at, call_deadline) = rounds.attempt()?;
            counters.acquire_request();
            let lifetime = ttl_millis(rounds.deadline().saturating_duration_since(sent_at));
            let request = self.try_or_enqueue(target, &token, px, lifetime, call_deadline);
            let holder_left = match rounds.unless_cancelled(request).await? {
                Ok(Found::TookIt(fence)) => return Ok(waiting.into_lease(sent_at, fence)),
                Ok(Found::HandedOver(fence)) => {
                    handed(key, "recheck", fence_of(fence));
                    return Ok(waiting.into_lease(last_busy, fence));
                }
                Ok(Found::Waiting(holder_left)) => {
                    // Only a reply that saw the lock busy bounds when a
                    // later hand-over can have happened.
                    last_busy = sent_at;
                    holder_left
                }
                // Once queued, a waiter rides out a dropped connection or a
                // Redis restart: the connection reconnects for the next
                // request, which re-joins the queue (a restarted Redis has
                // lost it). Its first request still fails fast.
                Err(err @ (Error::Unreachable { .. } | Error::Timeout { .. }))
                    if last_busy > start =>
                {
                    tracing::debug!(key, error = %err, "re-check failed; the waiter retries");
                    Some(RECHECK_AFTER_FAILURE)
                }
                Err(err) => return Err(err),
            };
            rounds.next_wait()?;
            // Due no later than the holder's expiry (as last seen), so a dead
            // holder is noticed at once; at least once per TTL of our own.
            let recheck =
                holder_left.map_or(ttl, |left| (left + Duration::from_millis(1)).min(ttl));
            let wake = rounds.deadline().min(Instant::now() + recheck);
            tokio::select! {
                biased;
                () = rounds.cancelled() => return Err(rounds.give_up(GiveUpReason::Cancelled)),
                signal = rx.recv() => match signal {
                    Some(Signal::Granted(fence)) => {
                        handed(key, "grant", fence_of(fence));
                        return Ok(waiting.into_lease(last_busy, fence));
                    }
                    Some(Signal::Woken) | None => {}
                },
                () = tokio::time::sleep_until(wake) => {}
            }
        }
    }

    /// Waits in this locker's queue for `target` until a unit of ours passes
    /// us the lease (`Some`) or its place in Redis's queue (`None`: go to
    /// Redis), or our fallback timer (one TTL) sends us to Redis as a unit
    /// of our own. Gives up as `rounds` says.
    async fn wait_in_process(
        &self,
        relay: &Relay,
        target: &Target,
        ttl: Duration,
        ticket: Ticket,
        rounds: &Rounds<'_>,
    ) -> Result<Option<Lease>> {
        let key = target.lock.as_str();
        let mut waiting = LocalWaiting {
            handoff: self,
            target,
            ticket: Some(ticket),
            _counted: crate::metrics::Waiter::enter(crate::metrics::Queue::Process),
        };
        let deadline = rounds.deadline();
        let cancelled = rounds.cancelled();
        tokio::pin!(cancelled);
        let turn = loop {
            // Due when our holders' leases run out (as they know it), so a
            // holder that never gives its lease back blocks us at most until
            // then; with no holder of ours alive, after our own TTL.
            let fallback = relay
                .held_until(key)
                .map_or(Instant::now() + ttl, |until| {
                    until + Duration::from_millis(1)
                })
                .min(deadline);
            let Some(ticket) = waiting.ticket.as_mut() else {
                break None;
            };
            tokio::select! {
                biased;
                () = &mut cancelled => return Err(rounds.give_up(GiveUpReason::Cancelled)),
                turn = ticket.turn() => {
                    waiting.ticket = None;
                    break turn;
                }
                () = tokio::time::sleep_until(fallback) => {
                    if fallback >= deadline {
                        return Err(rounds.give_up(GiveUpReason::DeadlineExpired));
                    }
                    if relay.held_until(key).is_some_and(|until| until > Instant::now()) {
                        continue;
                    }
                    break waiting.ticket.take().and_then(|t| relay.leave(key, t, true));
                }
            }
        };
        Ok(match turn {
            Some(Turn::Lease {
                token,
                validity,
                fence,
            }) => {
                handed(key, "relay", fence);
                Some(self.relayed(target, token, validity, fence))
            }
            // `None` from the ticket: the unit that was passing to us was
            // dropped mid-way; its place is ours.
            Some(Turn::Represent) | None => None,
        })
    }

    /// A lease passed to us in process.
    fn relayed(
        &self,
        target: &Target,
        token: LeaseToken,
        validity: Validity,
        fence: Option<FencingToken>,
    ) -> Lease {
        self.lease(target, token, validity.ttl, validity.confirmed_at, fence)
    }

    /// A lease of ours on `target`, recorded as this locker's holder of its
    /// key (relay on).
    fn lease(
        &self,
        target: &Target,
        token: LeaseToken,
        ttl: Duration,
        confirmed_at: Instant,
        fence: Option<FencingToken>,
    ) -> Lease {
        let backend = &self.inner.backend;
        backend.node.counters.acquisition();
        backend.local.held().insert(token.clone());
        let part = Part {
            key: target.lock.clone(),
            token,
            fence_key: target.fence.clone(),
            fence,
        };
        let lease = Lease::new(backend.clone(), part, ttl, confirmed_at);
        if let Some(relay) = &backend.local.relay {
            relay.hold(lease.key(), lease.shared());
        }
        lease
    }

    /// How many callers of this locker wait *in process* for `key` (see
    /// [relay](HandoffLocker#in-process-relay)): queued behind a holder or
    /// waiter of this same locker, without a request of their own. Zero
    /// when relay is off.
    pub fn queued_in_process(&self, key: &str) -> usize {
        self.inner
            .backend
            .local
            .relay
            .as_ref()
            .map_or(0, |relay| relay.queued(key))
    }

    /// One run of the acquire script.
    async fn try_or_enqueue(
        &self,
        target: &Target,
        token: &LeaseToken,
        px: u64,
        lifetime: u64,
        deadline: Instant,
    ) -> Result<Found> {
        let key = target.lock.as_str();
        let backend = &self.inner.backend;
        let [queue, waiters] = queue_keys(key);
        let mut conn = backend.node.conn();
        let mut invocation = crate::scripts::HANDOFF_ACQUIRE.key(key);
        invocation.key(&queue).key(&waiters);
        if let Some(fence_key) = &target.fence {
            invocation.key(fence_key);
        }
        invocation
            .arg(token)
            .arg(px)
            .arg(&backend.local.channel)
            .arg(lifetime.max(1))
            .arg(backend.node.fence_ttl_ms());
        let reply =
            call::bounded("acquire", key, deadline, invocation.invoke_async(&mut conn)).await;
        let (code, pttl, fence): (i64, i64, u64) = match reply {
            Ok(reply) => reply,
            Err(err) => return Err(not_a_fence(err, target.fence.as_deref().unwrap_or(""))),
        };
        match code {
            1 => Ok(Found::TookIt(fence)),
            2 => Ok(Found::HandedOver(fence)),
            0 => Ok(Found::Waiting(
                u64::try_from(pttl)
                    .ok()
                    .filter(|ms| *ms > 0)
                    .map(Duration::from_millis),
            )),
            _ => Err(Error::UnexpectedReply { op: "acquire" }),
        }
    }
}

/// The queue and waiter-entry keys of lock `key`.
fn queue_keys(key: &str) -> [String; 2] {
    [format!("{key}:waitq"), format!("{key}:waiters")]
}

/// What a run of the release script is for.
#[derive(Debug, Clone, Copy)]
enum Mode<'a> {
    /// The holder gives the lock back: the next waiter in Redis's queue, or
    /// nobody, gets it.
    Release,
    /// A waiter gives up: it leaves Redis's queue, passing on a lock that
    /// was handed to it meanwhile.
    Leave,
    /// A checkpoint: the holder serves Redis's queue first and, with nobody
    /// live there, moves the lock to a waiter of its own process (`next`,
    /// TTL `px` ms), token-checked; a fenced waiter gets its fencing token.
    Checkpoint {
        px: u64,
        next: &'a str,
        fenced: bool,
    },
}

/// What one run of the release script did: its code, the token of one of
/// our own waiters it served (we must tell it), and the fence it issued to
/// that waiter or to the next local holder.
struct Served {
    code: i64,
    local: Option<String>,
    /// The fence issued (0: none; negative: woken, not granted).
    fence: i64,
}

/// Gives back the lock of `part`: to the next waiter of this locker if relay
/// is on and one waits, else to the next waiter in Redis's queue.
/// `Ok(false)`: the lock did not hold our token.
async fn release<C: RedisConnection>(
    backend: &HandoffBackend<C>,
    part: &Part,
    deadline: Instant,
) -> Result<bool> {
    serve(backend, part, backend.next(&part.key), deadline).await
}

/// The release of a lease dropped without [`Lease::release`]: who is served
/// next is decided here, synchronously, and only the Redis requests are
/// spawned. With no runtime to spawn them on, the local head goes to Redis
/// itself and the lock's TTL ends the dropped lease.
fn release_dropped<C: RedisConnection>(backend: Arc<HandoffBackend<C>>, part: Part) {
    let next = backend.next(&part.key);
    let Some(runtime) = release_runtime(&part.key) else {
        if let (Next::Relay(queued) | Next::Checkpoint(queued), Some(relay)) =
            (next, &backend.local.relay)
        {
            relay.pass_place(&part.key, Some(queued));
        }
        return;
    };
    spawn_dropped_release(&runtime, part.key.clone(), async move {
        let deadline = Instant::now() + backend.node.command_timeout();
        serve(&backend, &part, next, deadline).await
    });
}

/// Serves `next` (what the relay decided) with the lock of `part`. Every
/// move of the lock is one token-checked script run, so a local waiter is
/// handed a lease only after Redis moved the lock to its own fresh token
/// (and issued its own fencing token).
async fn serve<C: RedisConnection>(
    backend: &HandoffBackend<C>,
    part: &Part,
    mut next: Next,
    deadline: Instant,
) -> Result<bool> {
    let key = part.key.as_str();
    let Some(relay) = &backend.local.relay else {
        return release_in_redis(backend, part, Mode::Release, deadline).await;
    };
    let mut holding = part.clone();
    // Set once a pass moved the lock from the releasing lease's token: that
    // lease was then held until its release, whatever happens after.
    let mut confirmed = false;
    loop {
        let (queued, serve_queue) = match next {
            Next::Nobody => {
                let released = release_in_redis(backend, &holding, Mode::Release, deadline).await;
                return settle(key, confirmed, released);
            }
            Next::Relay(queued) => (queued, false),
            Next::Checkpoint(queued) => (queued, true),
        };
        let Ok(next_token) = LeaseToken::generate() else {
            relay.pass_place(key, Some(queued));
            next = Next::Nobody;
            continue;
        };
        // The counter that issues the next holder's token (and any fenced
        // Redis waiter's): the waiter's own, else ours.
        let fence_key = queued.fence_key().or(holding.fence_key.as_deref());
        let sent_at = Instant::now();
        let moved = if serve_queue {
            let mode = Mode::Checkpoint {
                px: ttl_millis(queued.ttl()),
                next: next_token.as_str(),
                fenced: queued.fence_key().is_some(),
            };
            release_once(backend, &holding, fence_key, mode, deadline).await
        } else {
            relay_once(backend, &holding, &next_token, &queued, deadline).await
        };
        match moved {
            Ok(Served { code: 3, fence, .. }) => {
                confirmed = true;
                let fence = fence_of(u64::try_from(fence).unwrap_or(0));
                tracing::debug!(
                    key,
                    fence = fence.map(FencingToken::get),
                    checkpoint = serve_queue,
                    "passed the lock to a waiter of this locker"
                );
                let validity = Validity::new(sent_at, queued.ttl());
                let turn = Turn::Lease {
                    token: next_token.clone(),
                    validity,
                    fence,
                };
                let fence_key = queued.fence_key().map(str::to_owned);
                if queued.hand(turn).is_ok() {
                    return Ok(true);
                }
                // It stopped waiting: the lock now holds a token nobody has;
                // pass it on (or give it back) for it.
                holding = Part {
                    key: key.to_owned(),
                    token: next_token,
                    fence_key,
                    fence,
                };
                next = relay.next(key);
            }
            Ok(served) => {
                if served.code == 2 && served.local.is_some() {
                    // The checkpoint served a unit of ours that waited in
                    // Redis: our local head waits on, behind it.
                    relay.keep_first(key, queued);
                } else {
                    relay.pass_place(key, Some(queued));
                }
                tell_served(key, backend, &served);
                return Ok(confirmed || served.code != 0);
            }
            Err(err) => {
                relay.pass_place(key, Some(queued));
                return settle(key, confirmed, Err(err));
            }
        }
    }
}

/// The outcome of a release whose last step was `last`: once a pass had
/// confirmed the releasing lease, a failure after it (on the lock moved to a
/// waiter that then left) is not that lease's; the TTL ends it.
fn settle(key: &str, confirmed: bool, last: Result<bool>) -> Result<bool> {
    if !confirmed {
        return last;
    }
    if let Err(err) = last {
        tracing::warn!(key, error = %err, "could not give back a lock passed to a waiter that left; the ttl will end it");
    }
    Ok(true)
}

/// Gives back (or, with [`Mode::Leave`], leaves the queue for) the lock in
/// Redis, handing it to the next waiter there. `Ok(false)`: the lock did not
/// hold our token.
async fn release_in_redis<C: RedisConnection>(
    backend: &HandoffBackend<C>,
    part: &Part,
    mode: Mode<'_>,
    deadline: Instant,
) -> Result<bool> {
    let served = release_once(backend, part, part.fence_key.as_deref(), mode, deadline).await?;
    if served.code == 2 {
        tracing::debug!(
            key = part.key,
            local = served.local.is_some(),
            "handed the lock to the next waiter in the queue"
        );
    }
    tell_served(&part.key, backend, &served);
    Ok(served.code != 0)
}

/// When a release served one of this locker's own Redis waiters, the script
/// did not tell it: we do. If it no longer waits and holds no lease, the
/// hand-off is an orphan and is passed on
/// ([`HandoffBackend::pass_orphan`]); if it won the lock another way
/// meanwhile (a re-check found it handed over, or another client's script
/// granted it), the lock is rightly its and is left alone. (Handing the lock
/// on whenever the waiter was gone took it, under load, from a waiter that
/// had just won it.)
fn tell_served<C: RedisConnection>(key: &str, backend: &HandoffBackend<C>, served: &Served) {
    let signal = match (backend.style, u64::try_from(served.fence)) {
        (HandoffStyle::Grant, Ok(fence)) => Signal::Granted(fence),
        // Woken instead of granted (a fenced waiter we could not issue a
        // token to): it takes the lock itself.
        (HandoffStyle::Grant, Err(_)) | (HandoffStyle::Wake, _) => Signal::Woken,
    };
    if let Some(next) = &served.local
        && !backend.local.tell(next, signal)
    {
        backend.pass_orphan(key, next);
    }
}

/// One run of the release script for the lock of `part`, with `fence_key`
/// (if any) as the counter that issues fencing tokens to the waiters it
/// serves.
async fn release_once<C: RedisConnection>(
    backend: &HandoffBackend<C>,
    part: &Part,
    fence_key: Option<&str>,
    mode: Mode<'_>,
    deadline: Instant,
) -> Result<Served> {
    let key = part.key.as_str();
    backend.node.counters.release_request();
    let [queue, waiters] = queue_keys(key);
    let mut conn = backend.node.conn();
    let mut invocation = crate::scripts::HANDOFF_RELEASE.key(key);
    invocation.key(&queue).key(&waiters);
    if let Some(fence_key) = fence_key {
        invocation.key(fence_key);
    }
    let (mode, px, next, fenced) = match mode {
        Mode::Release => ("", 0, "", false),
        Mode::Leave => ("leave", 0, "", false),
        Mode::Checkpoint { px, next, fenced } => ("pass", px, next, fenced),
    };
    invocation
        .arg(&part.token)
        .arg(backend.style.as_arg())
        .arg(mode)
        .arg(&backend.local.channel)
        .arg(px)
        .arg(next)
        .arg(if fenced { "f" } else { "-" })
        .arg(backend.node.fence_ttl_ms());
    let reply = call::bounded("release", key, deadline, invocation.invoke_async(&mut conn)).await;
    let (code, local, fence): (i64, String, i64) = match reply {
        Ok(reply) => reply,
        Err(err) => return Err(not_a_fence(err, fence_key.unwrap_or(""))),
    };
    Ok(Served {
        code,
        local: Some(local).filter(|t| !t.is_empty()),
        fence,
    })
}

/// One run of the relay script: moves the lock of `part` to `next` (the
/// local waiter `queued`'s token), with its fencing token if it is fenced.
/// Code 3 when it moved, 0 when the lock did not hold `part`'s token.
async fn relay_once<C: RedisConnection>(
    backend: &HandoffBackend<C>,
    part: &Part,
    next: &LeaseToken,
    queued: &crate::relay::Queued,
    deadline: Instant,
) -> Result<Served> {
    let key = part.key.as_str();
    backend.node.counters.release_request();
    let mut conn = backend.node.conn();
    let mut invocation = crate::scripts::RELAY.key(key);
    if let Some(fence_key) = queued.fence_key() {
        invocation.key(fence_key);
    }
    invocation
        .arg(&part.token)
        .arg(next)
        .arg(ttl_millis(queued.ttl()))
        .arg(backend.node.fence_ttl_ms());
    let reply = call::bounded("release", key, deadline, invocation.invoke_async(&mut conn)).await;
    let (moved, fence): (i64, i64) = match reply {
        Ok(reply) => reply,
        Err(err) => return Err(not_a_fence(err, queued.fence_key().unwrap_or(""))),
    };
    Ok(Served {
        code: if moved == 1 { 3 } else { 0 },
        local: None,
        fence,
    })
}

/// A registered waiter: routes its signals while it waits, and leaves the
/// queue (passing on a lock handed to it) if it stops waiting without the
/// lease.
struct Waiting<'a, C: RedisConnection> {
    handoff: &'a HandoffLocker<C>,
    target: &'a Target,
    token: &'a LeaseToken,
    ttl: Duration,
    won: bool,
    /// Our relay unit, if relay is on: ended (serving the local queue) if
    /// we stop waiting without the lease, passed to the lease if we win.
    unit: Option<Unit<'a>>,
    /// Counts us among the waiters in Redis's queue while we wait.
    _counted: crate::metrics::Waiter,
}

impl<'a, C: RedisConnection> Waiting<'a, C> {
    fn enter(
        handoff: &'a HandoffLocker<C>,
        target: &'a Target,
        token: &'a LeaseToken,
        ttl: Duration,
        signals: mpsc::UnboundedSender<Signal>,
        unit: Option<Unit<'a>>,
    ) -> Self {
        handoff
            .inner
            .backend
            .local
            .waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(token.as_str().to_owned(), signals);
        Waiting {
            handoff,
            target,
            token,
            ttl,
            won: false,
            unit,
            _counted: crate::metrics::Waiter::enter(crate::metrics::Queue::Redis),
        }
    }

    fn into_lease(mut self, acquired_at: Instant, fence: u64) -> Lease {
        self.won = true;
        if let Some(unit) = &mut self.unit {
            unit.armed = false;
        }
        self.handoff.lease(
            self.target,
            self.token.clone(),
            self.ttl,
            acquired_at,
            fence_of(fence),
        )
    }
}

impl<C: RedisConnection> Drop for Waiting<'_, C> {
    fn drop(&mut self) {
        let backend = &self.handoff.inner.backend;
        backend
            .local
            .waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(self.token.as_str());
        if !self.won {
            let part = Part {
                key: self.target.lock.clone(),
                token: self.token.clone(),
                fence_key: self.target.fence.clone(),
                fence: None,
            };
            spawn_leave(backend.clone(), part);
        }
    }
}

/// A relay unit that has not (yet) turned into a lease: if it ends without
/// one, its place goes to the next local waiter.
struct Unit<'a> {
    relay: &'a Relay,
    key: &'a str,
    armed: bool,
}

impl Drop for Unit<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.relay.pass_place(self.key, None);
        }
    }
}

/// A waiter in the local queue: if it stops waiting (gave up, or the future
/// was dropped) after its turn was handed to it, it passes that turn on.
struct LocalWaiting<'a, C: RedisConnection> {
    handoff: &'a HandoffLocker<C>,
    target: &'a Target,
    ticket: Option<Ticket>,
    /// Counts us among the waiters queued in process while we wait.
    _counted: crate::metrics::Waiter,
}

impl<C: RedisConnection> Drop for LocalWaiting<'_, C> {
    fn drop(&mut self) {
        let key = self.target.lock.as_str();
        let (Some(ticket), Some(relay)) =
            (self.ticket.take(), &self.handoff.inner.backend.local.relay)
        else {
            return;
        };
        match relay.leave(key, ticket, false) {
            None => {}
            Some(Turn::Represent) => relay.pass_place(key, None),
            // Dropping the lease passes it on.
            Some(Turn::Lease {
                token,
                validity,
                fence,
            }) => {
                drop(self.handoff.relayed(self.target, token, validity, fence));
            }
        }
    }
}

/// Leaves Redis's queue in the background (the waiter gave up).
fn spawn_leave<C: RedisConnection>(backend: Arc<HandoffBackend<C>>, part: Part) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::debug!(
            key = part.key,
            "no tokio runtime to leave the wait queue; the entry expires"
        );
        return;
    };
    runtime.spawn(async move {
        let deadline = Instant::now() + backend.node.command_timeout();
        let left = release_in_redis(&backend, &part, Mode::Leave, deadline);
        if let Err(err) = left.await {
            tracing::warn!(key = part.key, error = %err, "could not leave the wait queue; the entry expires");
        }
    });
}
