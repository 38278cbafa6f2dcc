//! Hand-off mode: waiters sleep until a release hands them the lock.
//!
//! The protocol, its crash safety and the measured design choice are
//! documented on [`HandoffLocker`].
//!
//! This file holds the public locker, its builder and its calls; the rest
//! is in files with one job each, each using only the types declared here
//! and the files listed before it: `relay` (the in-process relay: this
//! locker's waiters queued in process, and who is served next), `client`
//! (the public [`HandoffClient`] the subscription is opened with),
//! `subscriptions` (the sharded pub/sub connection and the channels its
//! waiters need), `local` (this locker's own waiters and the leases it
//! holds), `release` (the release side: serving the next waiter, in
//! process or in Redis's queue), `waiting` (a waiter's guards, until it
//! wins or leaves), `acquire` (the acquire side, the hand-off [`Way`]:
//! queuing in process, then in Redis) and `pubsub` (the routing of
//! messages to waiters). The locker's [`Lessor`] calls are the crate's one
//! acquire path (module `acquire`, which reaches the queuing through that
//! [`Way`]).
//!
//! [`Way`]: crate::way::Way

mod acquire;
mod client;
mod local;
mod pubsub;
mod relay;
mod release;
mod subscriptions;
mod waiting;

use std::sync::{Arc, Mutex};

use tokio::task::JoinHandle;

use crate::connection::Connection;
use crate::endpoint::Endpoint;
use crate::error::Result;
use crate::locker::Locker;
use crate::node::RedisConnection;
use crate::token::LeaseToken;
#[cfg(doc)]
use crate::{
    error::Error, lease::Lease, lessor::Lessor, locker::LockerBuilder, options::AcquireOptions,
};

use self::local::{Local, Waiters};
use self::pubsub::route;
use self::relay::Relay;
use self::release::HandoffBackend;
use self::subscriptions::{Channels, Subscriptions};

pub use self::client::HandoffClient;

#[cfg(doc)]
use crate::fencing::FencingToken;

/// The target of the module's tracing events, whichever of its files sends
/// them (the crate docs list them under it).
const TARGET: &str = "leasehold::handoff";

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

/// A [`Locker`] whose waiters are handed the lock by the release instead of
/// polling for it: the queued way of taking a [`Lease`], with the same four
/// calls as [`Locker`] ([`acquire`](Self::acquire),
/// [`acquire_with`](Self::acquire_with), [`acquire_all`](Self::acquire_all),
/// [`with_lock`](Self::with_lock)), fenced or not.
///
/// # Why
///
/// A polling lock ([`Lessor::acquire_with`](crate::Lessor::acquire_with)) asks Redis again after every
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
/// TTL and the shard channel that reaches it.
///
/// Waiters are told over **sharded pub/sub** (`SSUBSCRIBE` / `SPUBLISH`,
/// Redis 7.0 or newer), on one channel per locker and hash tag:
/// `leasehold:handoff:{<tag>}:<locker id>` for a key `…{<tag>}…`
/// (`leasehold:handoff:<locker id>` for a key without a tag, one node
/// only). The channel is in the lock key's slot, so on a Redis Cluster the
/// script that serves a waiter runs on the node its subscriber listens on,
/// and `SPUBLISH` counts exactly the live subscribers; on one node the same
/// commands work the same way.
///
/// - **Acquire** (`handoff_acquire.lua`) takes the lock if it is free and
///   nobody live is ahead of us, and otherwise enqueues us, in one atomic
///   step. A release can therefore never fall between "it was busy" and "we
///   are in the queue". A waiter is registered locally and its locker
///   subscribed to the key's channel (one `SSUBSCRIBE` per locker and hash
///   tag, kept while any of its waiters needs it, dropped 5 s after the
///   last left) before the script is sent, so a hand-off that lands before
///   the script's reply is not missed either.
/// - **Release** (`handoff_release.lua`) checks our token, pops the first
///   live waiter, publishes `g <token> <key>` on its channel (`SPUBLISH`) and sets the
///   lock to that waiter's token with that waiter's TTL (`SET K token PX
///   ttl`). The waiter holds the lease from that moment: no request of its
///   own.
/// - **In-process hand-off**: when that waiter is one of the releasing
///   locker's own (its entry names our channel), the script still moves the
///   lock to its token in the same atomic step, but skips the `SPUBLISH` and
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
/// - A local waiter waits for the holder it knows of: if the key is lost
///   behind that holder's back (deleted by hand, evicted), a caller of
///   another process takes it at once, but a caller of this locker waits
///   until the holder gives its lease back or, at the latest, until that
///   lease runs out as the holder counts it (its TTL). Safe (the lost
///   lease's release is refused), and one TTL of delay at most.
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
///   `SPUBLISH` reports zero receivers, and the release drops it and serves
///   the next one in the same step.
/// - A waiter is told only when the lock key's primary itself has a
///   subscriber to its channel (`PUBSUB SHARDNUMSUB`, in the same script,
///   before `SPUBLISH`). A replica receives what its primary publishes
///   without being counted, so a subscription that sits on a replica (a
///   node demoted by a failover that the subscription followed) would
///   otherwise see a grant the script counted as undelivered and gave to
///   the next waiter: two holders. Such a waiter is skipped like a dead
///   one and re-checks at its fallback timer.
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
/// bench contention` (see `BENCHMARKS.md`, and every mode's table in
/// `docs/history/benchmarks.md`: 50 and 500 callers working 2 ms each on
/// one key, medians):
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
/// # Taking a lease
///
/// With the four calls of [`Lessor`] (`use leasehold::Lessor`): the
/// caller waits in the key's FIFO queue until a release hands the lock
/// over. Given [`FencedKeys`](crate::FencedKeys), every holder gets its
/// own [`FencingToken`], issued in the same atomic step that gives it the
/// lock (its own acquire, a release's grant, or a relay's pass), so tokens
/// grow strictly from holder to holder. Use the same fence key for every
/// caller of one lock key. The lease's release hands the lock to the next
/// waiter.
///
/// The options' deadline and cancellation token apply exactly as in
/// [`Lessor::acquire_with`]. The retry strategy's *waits* are not used (a
/// waiter sleeps until it is handed the lock, or until the holder's lease
/// runs out as last seen), but its length is: each wait consumes one, so
/// [`RetryStrategy::none`](crate::RetryStrategy::none) makes one attempt
/// and [`max_attempts`](crate::RetryStrategy::max_attempts) bounds the
/// attempts. Queuing in process behind another task of this locker
/// ([relay](#in-process-relay)) is an attempt answered locally, and so is
/// the turn that comes to it there. [`AcquireOptions::watchdog`] and
/// [`AcquireOptions::wait_replicas`] apply as everywhere, to a lease passed
/// on in process too.
///
/// **Errors**, as [`Lessor::acquire_with`]: [`Error::NotAcquired`] with the
/// reason (retries exhausted, deadline expired, cancelled), whatever the
/// options; [`Error::InvalidTtl`] / [`Error::InvalidKey`] (and a zero
/// replica wait timeout, [`Error::InvalidOptions`]) before any I/O;
/// [`Error::NotReplicated`] when too few replicas acknowledged (the lock
/// was passed on); [`Error::InvalidFence`] when the fence key holds no
/// counter. A waiter rides out a dropped connection or a Redis restart: a
/// re-check that fails with a fault that may pass ([`Error::Unreachable`],
/// [`Error::Timeout`], ...) is retried 50 ms later (the connection
/// reconnects meanwhile) until the deadline.
///
/// **Cancel safety**: cancel safe. If the future is dropped while waiting
/// (or a request is in flight), a best-effort "leave" script is spawned
/// that removes our queue entry and passes on a lock that was handed to
/// us; the entry's expiry and the lease's TTL are the fallback. Dropped
/// while waiting for replicas, the lease exists and its drop passes it on.
///
/// # Limits
///
/// - All callers of one key must use hand-off mode: a polling acquire on the
///   same key takes the lock when it is free and ignores the queue (safe, but
///   not fair).
/// - **Redis 7.0 or newer.** An older server has no sharded pub/sub:
///   [`connect`](HandoffLockerBuilder::connect) and
///   [`build`](HandoffLockerBuilder::build) refuse it with
///   [`Error::Unsupported`] (there is no fallback to classic pub/sub, which
///   is wrong on a cluster; use [`Locker`] on such a server).
/// - **Redis Cluster** works with the same guarantees as one node: build
///   the locker over a `Locker` on a cluster connection and a RESP3
///   `ClusterClient` (a RESP2 one is refused with
///   [`Error::InvalidOptions`]). The three keys (and the fence key) must
///   share a slot: give the lock key a hash tag, such as
///   `lock:{wallet:42}`. The subscription follows the key: when its slot
///   moves to another node the old owner drops it, the locker subscribes
///   again (reaching the new owner) and then wakes its waiters, which
///   re-check and keep their place (the queue moved with the slot) or
///   re-join it if a release meanwhile found nobody listening. A failover
///   can lose a fresh lock or queue entry, as for any key on an
///   asynchronous replica. After a failover the demoted node drops the
///   subscription too; before subscribing again the locker sends a `GET`
///   of the key through its subscription connection, which follows
///   `MOVED` to the new primary (the demoted node, now a replica, would
///   accept the `SSUBSCRIBE`, and releases could not count it: above).
/// - redis-rs's cluster connection reconnects a dropped node connection
///   (killed, a node restart) only after a request fails on it, so while
///   any of its channels has waiters a locker sends one keepalive `GET` of
///   a lock key per such channel every command timeout through its
///   subscription connection, then asks the key's primary whether it
///   counts the subscription (`PUBSUB SHARDNUMSUB`) and subscribes again
///   if not: a dropped subscription comes back, and its waiters re-check,
///   within about that time.
/// - With relay on, a lease that is neither released nor dropped (a hung
///   task, `mem::forget`) still counts as its locker's holder for the key,
///   forever. Once it runs out (by its own clock), that locker's callers
///   stop waiting for it at once and go to Redis, where the key is free;
///   they just no longer get relays from it (every pass is then a
///   checkpoint: still one request, but Redis's queue first). Release or
///   drop every lease; a watchdog does not help a task that never returns.
/// - If a locker's pub/sub connection drops (or a slot moves, above), its
///   waiters look dead to other lockers' releases until it is back, and are
///   dropped from the queue (its own releases still serve them in process).
///   The locker reconnects and resubscribes on its own (retrying while
///   Redis is down; on a cluster, redis-rs's cluster connection does) and,
///   once a subscription is confirmed again, wakes its waiters on that
///   channel (all of them after a one-node reconnect), which re-check
///   the lock and re-join the queue at once: they may lose their place in
///   line, never their turn.
///
/// # Lease validity
///
/// A lease handed over by a release is counted from when the waiter's last
/// request that found the lock busy was *sent*: the hand-off happened after
/// that, so the holder's estimate of its remaining time is never longer than
/// Redis's (it is shorter by up to the time it waited). When that leaves
/// less than half the TTL (a long wait in the queue), the acquire confirms
/// the lease with a token-checked refresh before returning it (within its
/// deadline), so it counts a full TTL from that request instead of
/// arriving with nothing left.
///
/// Cheap to clone: clones share the locker and the one pub/sub connection.
#[derive(Clone)]
pub struct HandoffLocker<C: RedisConnection = Connection> {
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
            .field("channel", &backend.subs.channels.base())
            .field(
                "relay_limit",
                &backend.local.relay.as_ref().map_or(0, Relay::limit),
            )
            .finish_non_exhaustive()
    }
}

/// Builds a [`HandoffLocker`]: [`connect`](Self::connect) opens its own
/// [`Locker`] (with the default settings) and pub/sub connection,
/// [`build`](Self::build) goes over a locker you have (sharing its
/// connection and stats). The locker's settings (command timeout, fence
/// counters' lifetime) are set in one place, its [`LockerBuilder`]: for
/// other values than the defaults, build the locker and go over it.
///
/// ```no_run
/// # async fn demo(client: redis::Client) -> leasehold::Result<()> {
/// use std::time::Duration;
/// use leasehold::{HandoffLocker, HandoffStyle, Locker};
///
/// let handoff = HandoffLocker::builder()
///     .relay_limit(0)
///     .connect(&client)
///     .await?;
///
/// // Over a locker of yours, with its own settings: hand-off and
/// // polling share its connection.
/// let locker = Locker::builder()
///     .command_timeout(Duration::from_millis(500))
///     .connect(&client)
///     .await?;
/// let waking = HandoffLocker::builder()
///     .style(HandoffStyle::Wake)
///     .build(locker.clone(), &client)
///     .await?;
/// # let _ = (handoff, waking);
/// # Ok(())
/// # }
/// ```
#[must_use]
#[derive(Debug, Clone)]
pub struct HandoffLockerBuilder {
    style: HandoffStyle,
    relay_limit: u32,
}

impl HandoffLockerBuilder {
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

    /// Opens a locker with the default settings on `redis` (a
    /// `&redis::Client`, or a [`&Sentinel`](crate::Sentinel) whose primary
    /// both connections follow across failovers; a reconnecting
    /// connection, as [`LockerBuilder::connect`]), then the pub/sub
    /// connection, subscribes to this locker's channel and starts the task
    /// that routes hand-offs to waiters (and reconnects the pub/sub
    /// connection when it drops). Every step is bounded by the command
    /// timeout. For a locker with other settings, see
    /// [`build`](Self::build).
    ///
    /// # Errors
    /// As [`LockerBuilder::connect`] ([`Error::Unreachable`], [`Error::Timeout`], [`Error::Auth`], the
    /// TLS errors, and through Sentinel [`Error::UnknownMaster`],
    /// [`Error::SentinelUnreachable`], [`Error::NoPrimary`]), for either
    /// connection; [`Error::Unsupported`] when the server has no sharded
    /// pub/sub (Redis older than 7.0); [`Error::NoPermission`] when the ACL
    /// refuses `SSUBSCRIBE`; [`Error::Random`] when no channel name could
    /// be drawn.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future drops the half-open connections.
    pub async fn connect(self, redis: impl Into<Endpoint>) -> Result<HandoffLocker> {
        let endpoint = redis.into();
        let locker = Locker::builder().connect(endpoint.clone()).await?;
        self.subscribe(locker, endpoint.into()).await
    }

    /// Builds the hand-off locker over `locker` (whose connection sends
    /// the scripts, and whose [`stats`](Locker::stats) then count hand-off
    /// requests too) and `client` (which opens the one sharded pub/sub
    /// connection this locker needs: `&redis::Client` for one node,
    /// [`&Sentinel`](crate::Sentinel) for the primary it names,
    /// `&redis::cluster::ClusterClient` speaking RESP3 for a cluster, see
    /// [`HandoffClient`]): opens that connection, subscribes to this
    /// locker's base channel (which checks that the server has sharded
    /// pub/sub) and starts the task that routes hand-offs to waiters (and
    /// keeps the subscriptions up). Both requests are bounded by the
    /// locker's command timeout.
    ///
    /// # Errors
    /// [`Error::Unreachable`],
    /// [`Error::Timeout`] or [`Error::Auth`] when the pub/sub connection
    /// cannot be opened; [`Error::Unsupported`] when the server has no
    /// sharded pub/sub (Redis older than 7.0); [`Error::InvalidOptions`] for
    /// a cluster client that does not speak RESP3; [`Error::NoPermission`]
    /// when the ACL refuses `SSUBSCRIBE`; [`Error::Random`] when no channel
    /// name could be drawn.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future drops the half-open connection.
    pub async fn build<C: RedisConnection>(
        self,
        locker: Locker<C>,
        client: impl Into<HandoffClient>,
    ) -> Result<HandoffLocker<C>> {
        self.subscribe(locker, client.into()).await
    }

    /// Opens the pub/sub connection for `locker` and starts its listener.
    async fn subscribe<C: RedisConnection>(
        self,
        locker: Locker<C>,
        client: HandoffClient,
    ) -> Result<HandoffLocker<C>> {
        let channels = Channels::new(LeaseToken::generate()?.as_str().to_owned());
        let timeout = locker.command_timeout();
        let node = client.is_node();
        let (subs, pushes) = Subscriptions::open(client, channels, timeout).await?;
        let local = Arc::new(Local {
            waiters: Waiters::default(),
            held: Mutex::default(),
            relay: (self.relay_limit > 0).then(|| Relay::new(self.relay_limit)),
        });
        let backend = Arc::new_cyclic(|this| HandoffBackend {
            node: locker.node.clone(),
            locker: locker.clone(),
            style: self.style,
            local,
            subs,
            this: this.clone(),
        });
        let listener = tokio::spawn(route(pushes, backend.clone(), node));
        Ok(HandoffLocker {
            inner: Arc::new(HandoffInner {
                locker,
                backend,
                listener,
            }),
        })
    }
}

impl HandoffLocker {
    /// A hand-off locker with default settings over its own [`Locker`] on
    /// `redis` (a `&redis::Client` or a [`&Sentinel`](crate::Sentinel); a
    /// reconnecting connection) and the pub/sub connection it needs:
    /// `HandoffLocker::builder().connect(redis)`.
    ///
    /// # Errors
    /// As [`HandoffLockerBuilder::connect`].
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future drops the half-open connections.
    pub async fn connect(redis: impl Into<Endpoint>) -> Result<Self> {
        HandoffLocker::builder().connect(redis).await
    }

    /// A builder for non-default settings, which then opens its own locker
    /// ([`HandoffLockerBuilder::connect`]) or goes over yours
    /// ([`HandoffLockerBuilder::build`]).
    pub fn builder() -> HandoffLockerBuilder {
        HandoffLockerBuilder {
            style: HandoffStyle::default(),
            relay_limit: DEFAULT_RELAY_LIMIT,
        }
    }
}

impl<C: RedisConnection> HandoffLocker<C> {
    /// The underlying locker (its [`stats`](Locker::stats) count hand-off
    /// requests too).
    pub fn locker(&self) -> &Locker<C> {
        &self.inner.locker
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
}

impl<C: RedisConnection> crate::lessor::sealed::Sealed for HandoffLocker<C> {
    fn service(&self) -> crate::service::Service {
        crate::service::Service::REDIS
    }

    fn leader_record<'a>(
        &'a self,
        key: &'a str,
        record_key: &'a str,
    ) -> crate::lease::Reply<'a, Option<(String, i64)>> {
        crate::lessor::sealed::Sealed::leader_record(&self.inner.locker, key, record_key)
    }

    fn hands_over(&self) -> bool {
        self.inner.backend.style == HandoffStyle::Grant
    }
}
