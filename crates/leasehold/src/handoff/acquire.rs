//! The acquire side of hand-off: a caller queues in process behind a unit
//! of its locker (relay on), then in Redis's queue, until a release hands
//! it the lock, its re-check takes it, or it gives up. The waiting is the
//! one retry loop's ([`rounds::drive`](crate::rounds::drive)): hand-off gives it one step per
//! attempt (a place taken in process, or one run of the acquire script)
//! and one wait per pause ([`Queuing`]), and keeps its place across
//! rounds. The acquire path (module `acquire`) reaches these steps
//! through the hand-off [`Way`]: it claims, has the loop drive the
//! [`Queuing`] over the claim, and after a win runs hand-off's refresh of
//! a lease handed over late ([`Way::after_win`]); each step goes from
//! [`Queuing::attempt`](Attempts::attempt) to the wire in one more stop
//! at most (`in_redis`, one run of the acquire script).

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::budget::Budget;
use crate::call;
use crate::error::{Error, Result};
use crate::fencing::{FencingToken, Target};
use crate::lease::Lease;
use crate::node::Attempt;
use crate::node::{RedisConnection, not_a_fence, ttl_millis};
use crate::options::{AcquireOptions, Supports};
use crate::rounds::{Attempts, Progress};
use crate::service::Service;
use crate::token::LeaseToken;
use crate::way::Way;

use super::local::Signal;
use super::relay::{Entry, Turn};
use super::release::{fence_of, queue_keys};
use super::subscriptions::ChannelUse;
use super::waiting::{LocalWaiting, Unit, Waiting};
use super::{HandoffLocker, TARGET};

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
    tracing::debug!(target: TARGET, key, via, fence, "handed the lock by a release");
}

/// One hand-off take's claim: the checked target, a fresh token and the
/// TTL.
pub(crate) struct Claim {
    target: Target,
    token: LeaseToken,
    ttl: Duration,
}

/// The hand-off way: its attempts queue for one checked target, in
/// process then in Redis ([`Queuing`]); a win is the lease itself (taken,
/// granted or relayed). What follows the win is the acquire path's, for
/// every way, after [`after_win`](Way::after_win)'s refresh of a lease
/// handed over late.
impl<C: RedisConnection> Way for HandoffLocker<C> {
    type Claim = Claim;
    type Won = Lease;
    type Attempts<'a>
        = Queuing<'a, C>
    where
        Self: 'a;

    /// A hand-off locker honours every option.
    fn supports(&self) -> Supports {
        Supports {
            wait_replicas: true,
        }
    }

    fn mode(&self) -> &'static str {
        "handoff"
    }

    fn command_timeout(&self) -> Duration {
        self.inner.locker.node.command_timeout()
    }

    fn claim(&self, target: Target, ttl: Duration) -> Result<Claim> {
        Ok(Claim {
            target,
            token: LeaseToken::generate()?,
            ttl,
        })
    }

    fn key(claim: &Claim) -> &str {
        &claim.target.lock
    }

    fn attempts<'a>(
        &'a self,
        claim: &'a Claim,
        opts: &AcquireOptions,
        budget: Budget,
    ) -> Queuing<'a, C> {
        let made = usize::try_from(Progress::attempts_so_far()).unwrap_or(usize::MAX);
        Queuing {
            may_wait: opts.retry.waits().nth(made).is_some(),
            handoff: self,
            target: &claim.target,
            token: &claim.token,
            ttl: claim.ttl,
            start: budget.start(),
            deadline: budget.deadline(),
            place: Place::Start,
        }
    }

    /// The lease is the win itself.
    fn lease(&self, _: Claim, lease: Lease, _: Instant) -> Lease {
        lease
    }

    /// A lease found handed over to us is counted from our last request
    /// that saw the lock busy (the hand-over came later, at a time we do
    /// not know): after a long wait in the queue it may arrive with
    /// nothing left, and the watchdog would give it up as unreachable
    /// though Redis holds it for a full TTL. Confirm such a lease with a
    /// token-checked refresh (it lands only while the key holds our token,
    /// so no one else can have held it since the hand-over): its TTL then
    /// counts from that request's send time. Within the caller's
    /// `deadline`; if it fails, the lease keeps its own (short, hence
    /// safe) validity, or is marked lost if Redis says it is gone.
    async fn after_win(&self, lease: Lease, ttl: Duration, deadline: Instant) -> Lease {
        if lease.remaining() < ttl / 2 {
            let deadline = deadline.max(Instant::now());
            if let Ok(Err(err)) = tokio::time::timeout_at(deadline, lease.refresh(ttl)).await {
                tracing::debug!(target: TARGET, key = lease.key(), error = %err, "could not confirm a lease handed over late");
            }
        }
        lease
    }

    async fn confirm_replicas(
        &self,
        lease: Lease,
        opts: &AcquireOptions,
        deadline: Instant,
    ) -> Result<Lease> {
        let locker = &self.inner.locker;
        crate::replicas::confirm(lease, opts, deadline, |key, replicas, timeout| async move {
            crate::backend::LockService::wait_replicas(locker, &key, replicas, timeout).await
        })
        .await
    }
}

/// One acquire's place, as the one retry loop ([`rounds::drive`](crate::rounds::drive)) drives
/// it: each attempt is one step (a place taken in process, or one run of
/// the acquire script), each pause one wait (for our turn in process, a
/// release's signal, or the re-check); give-up, cancel and a dropped
/// future leave the queue through the guards the place holds.
pub(crate) struct Queuing<'a, C: RedisConnection> {
    handoff: &'a HandoffLocker<C>,
    target: &'a Target,
    token: &'a LeaseToken,
    ttl: Duration,
    /// When the acquire started: the earliest a lease handed to it can
    /// count from.
    start: Instant,
    /// The acquire's deadline: how long our entry in Redis's queue lives.
    deadline: Instant,
    /// Whether the retry strategy allows a wait after the first attempt
    /// (else a caller behind a unit of ours is told busy, not queued).
    may_wait: bool,
    place: Place<'a, C>,
}

/// Where an acquire waits.
enum Place<'a, C: RedisConnection> {
    /// Nowhere yet.
    Start,
    /// In this locker's queue, behind a unit of ours (relay on).
    InProcess(InProcess<'a, C>),
    /// In Redis's queue, as a unit of its own.
    Redis(Box<InRedis<'a, C>>),
    /// Won: the lease exists.
    Won,
}

/// Queued in process: our ticket, and what the last pause brought.
struct InProcess<'a, C: RedisConnection> {
    waiting: LocalWaiting<'a, C>,
    /// Our turn, once it came.
    came: Option<Came>,
}

/// What our turn in process brought.
enum Came {
    /// The lease, passed on by a holder of ours (a lease at once, so that
    /// dropped before it is handed out, its drop passes it on).
    Lease(Lease),
    /// The place in Redis's queue (or the unit passing to us was dropped
    /// mid-way): go to Redis as the unit.
    Place,
}

/// In Redis's queue: our registration and subscription, and what the last
/// reply and pause said.
struct InRedis<'a, C: RedisConnection> {
    waiting: Waiting<'a, C>,
    /// Subscribed while we wait, so that a release's `SPUBLISH` finds us.
    listening: ChannelUse,
    signals: mpsc::UnboundedReceiver<Signal>,
    /// The send time of our last request that saw the lock busy: a
    /// hand-over came after it.
    last_busy: Instant,
    /// A release granted us the lock (in process: no request needed).
    granted: Option<u64>,
    /// How soon to look again with no signal.
    recheck: Duration,
}

impl<C: RedisConnection> Attempts for Queuing<'_, C> {
    type Won = Lease;

    async fn attempt(&mut self, deadline: Instant) -> Result<Attempt<Lease>> {
        let key = self.target.lock.as_str();
        let relay = self.handoff.inner.backend.local.relay.as_ref();
        let unit = match (std::mem::replace(&mut self.place, Place::Won), relay) {
            (Place::Redis(queued), _) => return self.in_redis(queued, deadline).await,
            (Place::Start, None) => None,
            (Place::Start, Some(relay)) => {
                match relay.enter(key, self.ttl, self.target.fence.as_deref(), self.may_wait) {
                    Entry::Represent => Some(relay),
                    // Busy behind a unit of ours, for a caller that may not
                    // wait: an attempt answered locally.
                    Entry::Busy => {
                        self.place = Place::Start;
                        return Ok(Attempt::Busy);
                    }
                    // Queuing in process is an attempt, answered locally.
                    Entry::Queued(ticket) => {
                        self.place = Place::InProcess(InProcess {
                            waiting: LocalWaiting {
                                handoff: self.handoff,
                                target: self.target,
                                ticket: Some(ticket),
                                _counted: crate::metrics::Waiter::enter(
                                    crate::metrics::Queue::Process,
                                ),
                            },
                            came: None,
                        });
                        return Ok(Attempt::Busy);
                    }
                }
            }
            (Place::InProcess(mut local), Some(relay)) => {
                match local.came.take() {
                    Some(Came::Lease(lease)) => return Ok(Attempt::Won(lease)),
                    Some(Came::Place) => Some(relay),
                    // Our fallback came: while a holder of ours is alive we
                    // stay behind it; else we go to Redis as a unit.
                    None if relay
                        .held_until(key)
                        .is_some_and(|until| until > Instant::now()) =>
                    {
                        self.place = Place::InProcess(local);
                        return Ok(Attempt::Busy);
                    }
                    None => {
                        let ticket = local.waiting.ticket.take();
                        match ticket.and_then(|t| relay.leave(key, t, true)) {
                            Some(Turn::Lease {
                                token,
                                validity,
                                fence,
                            }) => {
                                handed(key, "relay", fence);
                                let lease =
                                    self.handoff.relayed(self.target, token, validity, fence);
                                return Ok(Attempt::Won(lease));
                            }
                            Some(Turn::Represent) | None => Some(relay),
                        }
                    }
                }
            }
            (Place::InProcess(_), None) | (Place::Won, _) => None,
        };
        let unit = unit.map(|relay| Unit {
            relay,
            key,
            armed: true,
        });
        let backend = &self.handoff.inner.backend;
        let (tx, signals) = mpsc::unbounded_channel();
        let waiting = Waiting::enter(self.handoff, self.target, self.token, self.ttl, tx, unit);
        let listening = backend
            .subs
            .use_channel(backend.subs.channels.for_key(key), key);
        let queued = Box::new(InRedis {
            waiting,
            listening,
            signals,
            last_busy: self.start,
            granted: None,
            recheck: self.ttl,
        });
        self.in_redis(queued, deadline).await
    }

    /// Nothing to undo: the next run of the acquire script, with the same
    /// token, finds a lock an unanswered run took (handed over, counted
    /// from before that run).
    async fn undo(&mut self, _deadline: Instant) -> Result<()> {
        Ok(())
    }

    /// The place's guards leave the queues when the place is dropped.
    fn abandon(&mut self, _maybe_taken: bool) {}

    async fn pause(&mut self, _until: Instant, deadline: Instant) {
        let key = self.target.lock.as_str();
        match &mut self.place {
            Place::InProcess(local) => {
                let Some(ticket) = local.waiting.ticket.as_mut() else {
                    return;
                };
                // Due when our holders' leases run out (as they know it),
                // so a holder that never gives its lease back blocks us at
                // most until then; with no holder of ours alive, after our
                // own TTL.
                let relay = self.handoff.inner.backend.local.relay.as_ref();
                let fallback = relay
                    .and_then(|relay| relay.held_until(key))
                    .map_or(Instant::now() + self.ttl, |until| {
                        until + Duration::from_millis(1)
                    })
                    .min(deadline);
                tokio::select! {
                    turn = ticket.turn() => {
                        local.waiting.ticket = None;
                        local.came = Some(match turn {
                            Some(Turn::Lease { token, validity, fence }) => {
                                handed(key, "relay", fence);
                                Came::Lease(self.handoff.relayed(self.target, token, validity, fence))
                            }
                            // `None`: the unit that was passing to us was
                            // dropped mid-way; its place is ours.
                            Some(Turn::Represent) | None => Came::Place,
                        });
                    }
                    () = tokio::time::sleep_until(fallback) => {}
                }
            }
            Place::Redis(queued) => {
                let wake = deadline.min(Instant::now() + queued.recheck);
                tokio::select! {
                    signal = queued.signals.recv() => {
                        if let Some(Signal::Granted(fence)) = signal {
                            queued.granted = Some(fence);
                        }
                    }
                    () = tokio::time::sleep_until(wake) => {}
                }
            }
            Place::Start | Place::Won => {}
        }
    }
}

impl<'a, C: RedisConnection> Queuing<'a, C> {
    /// One step in Redis's queue: a grant that came is the win; else one
    /// run of the acquire script (which joins the queue, or finds the lock
    /// ours).
    async fn in_redis(
        &mut self,
        mut queued: Box<InRedis<'a, C>>,
        deadline: Instant,
    ) -> Result<Attempt<Lease>> {
        let key = self.target.lock.as_str();
        if let Some(fence) = queued.granted.take() {
            handed(key, "grant", fence_of(fence));
            return Ok(Attempt::Won(
                queued.waiting.into_lease(queued.last_busy, fence),
            ));
        }
        let backend = &self.handoff.inner.backend;
        let sent_at = Instant::now();
        backend.node.counters.acquire_request();
        let lifetime = ttl_millis(self.deadline.saturating_duration_since(sent_at));
        // One run of the acquire script, once our channel for this key is
        // subscribed.
        let channel = queued.listening.channel.as_str();
        let found = match backend.subs.ensure(channel, deadline).await {
            Ok(()) => {
                let fence_ttl = backend.node.fence_ttl_ms();
                let script = acquire_script(
                    self.target,
                    self.token,
                    channel,
                    self.ttl,
                    lifetime,
                    fence_ttl,
                );
                let mut conn = backend.node.conn();
                let reply = call::bounded("acquire", key, deadline, script.invoke_async(&mut conn));
                found(reply.await, self.target)
            }
            Err(err) => Err(err),
        };
        let found = match found {
            Ok(Found::TookIt(fence)) => {
                return Ok(Attempt::Won(queued.waiting.into_lease(sent_at, fence)));
            }
            Ok(Found::HandedOver(fence)) => {
                handed(key, "recheck", fence_of(fence));
                return Ok(Attempt::Won(
                    queued.waiting.into_lease(queued.last_busy, fence),
                ));
            }
            Ok(Found::Waiting(holder_left)) => {
                // Due no later than the holder's expiry (as last seen), so
                // a dead holder is noticed at once; at least once per TTL
                // of our own.
                queued.last_busy = sent_at;
                queued.recheck = holder_left.map_or(self.ttl, |left| {
                    (left + Duration::from_millis(1)).min(self.ttl)
                });
                Ok(Attempt::Busy)
            }
            // A waiter rides out a fault that may pass (a dropped
            // connection, a Redis restart, `LOADING`, ...) until its
            // deadline: the connection reconnects for the next request,
            // which re-joins the queue (a restarted Redis has lost it) with
            // the same token.
            Err(err) => {
                tracing::debug!(target: TARGET, key, error = %err, "re-check failed");
                queued.recheck = RECHECK_AFTER_FAILURE;
                Err(err)
            }
        };
        self.place = Place::Redis(queued);
        found
    }
}

/// The acquire script for `target` and `token`: its lock for `ttl`, its
/// waiter's entry living `lifetime` ms, its grants sent on `channel`, a
/// fence counter kept `fence_ttl` ms.
fn acquire_script(
    target: &Target,
    token: &LeaseToken,
    channel: &str,
    ttl: Duration,
    lifetime: u64,
    fence_ttl: u64,
) -> redis::ScriptInvocation<'static> {
    let key = target.lock.as_str();
    let [queue, waiters] = queue_keys(key);
    let mut invocation = crate::scripts::HANDOFF_ACQUIRE.key(key);
    invocation.key(&queue).key(&waiters);
    if let Some(fence_key) = &target.fence {
        invocation.key(fence_key);
    }
    invocation
        .arg(token)
        .arg(ttl_millis(ttl))
        .arg(channel)
        .arg(lifetime.max(1))
        .arg(fence_ttl);
    invocation
}

/// What the acquire script's `reply` for `target` says.
fn found(reply: Result<(i64, i64, u64)>, target: &Target) -> Result<Found> {
    let (code, pttl, fence) = match reply {
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
        _ => Err(Error::UnexpectedReply {
            service: Service::REDIS,
            op: "acquire",
        }),
    }
}
