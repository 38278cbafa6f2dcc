//! The acquire side of hand-off: a caller queues in process behind a unit
//! of its locker (relay on), then in Redis's queue, until a release hands
//! it the lock, its re-check takes it, or it gives up.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::budget::Budget;
use crate::call;
use crate::error::{Error, GiveUpReason, Result};
use crate::fencing::{FencingToken, Target};
use crate::lease::Lease;
use crate::node::{RedisConnection, not_a_fence, ttl_millis};
use crate::options::{AcquireOptions, Supports};
use crate::rounds::{Rounds, unless_cancelled};
use crate::service::Service;
use crate::token::LeaseToken;
use crate::way::Way;

use super::local::Signal;
use super::relay::{Entry, Relay, Ticket, Turn};
use super::release::{fence_of, queue_keys};
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

/// The hand-off way: its acquire queues for one checked target (what
/// follows the win is [`Way`]'s, for every way).
impl<C: RedisConnection> Way for HandoffLocker<C> {
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

    async fn take(
        &self,
        target: Target,
        ttl: Duration,
        opts: &AcquireOptions,
        budget: Budget,
    ) -> Result<Lease> {
        let mut rounds = Rounds::new(&target.lock, opts, budget, self.command_timeout());
        let lease = self.wait_queued(&target, ttl, &mut rounds).await?;
        // A lease found handed over to us is counted from our last request
        // that saw the lock busy (the hand-over came later, at a time we do
        // not know): after a long wait in the queue it may arrive with
        // nothing left, and the watchdog would give it up as unreachable
        // though Redis holds it for a full TTL. Confirm such a lease with a
        // token-checked refresh (it lands only while the key holds our
        // token, so no one else can have held it since the hand-over): its
        // TTL then counts from that request's send time. Within the
        // caller's deadline; if it fails, the lease keeps its own (short,
        // hence safe) validity, or is marked lost if Redis says it is gone.
        if lease.remaining() < ttl / 2 {
            let deadline = budget.deadline().max(Instant::now());
            if let Ok(Err(err)) = tokio::time::timeout_at(deadline, lease.refresh(ttl)).await {
                tracing::debug!(target: TARGET, key = lease.key(), error = %err, "could not confirm a lease handed over late");
            }
        }
        Ok(lease)
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

impl<C: RedisConnection> HandoffLocker<C> {
    /// The waiting part of an acquire, in `rounds`: in process, then in
    /// Redis.
    async fn wait_queued(
        &self,
        target: &Target,
        ttl: Duration,
        rounds: &mut Rounds<'_>,
    ) -> Result<Lease> {
        let key = target.lock.as_str();
        let fence_key = target.fence.as_deref();
        let backend = &self.inner.backend;
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
                        let waited = self.wait_in_process(relay, target, ttl, ticket, rounds);
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
        // Subscribed (below, before each request that may queue us) while we
        // wait, so that a release's `SPUBLISH` finds us.
        let listening = backend
            .subs
            .use_channel(backend.subs.channels.for_key(key), key);

        let mut last_busy = rounds.start();
        loop {
            let (sent_at, call_deadline) = rounds.attempt()?;
            counters.acquire_request();
            let lifetime = ttl_millis(rounds.deadline().saturating_duration_since(sent_at));
            let request = self.try_or_enqueue(
                target,
                &token,
                &listening.channel,
                px,
                lifetime,
                call_deadline,
            );
            let holder_left = match unless_cancelled!(rounds, request)? {
                Ok(Found::TookIt(fence)) => return Ok(waiting.into_lease(sent_at, fence)),
                Ok(Found::HandedOver(fence)) => {
                    handed(key, "recheck", fence_of(fence));
                    return Ok(waiting.into_lease(last_busy, fence));
                }
                Ok(Found::Waiting(holder_left)) => {
                    // Only a reply that saw the lock busy bounds when a
                    // later hand-over can have happened.
                    last_busy = sent_at;
                    rounds.busy();
                    holder_left
                }
                // A waiter rides out a fault that may pass (a dropped
                // connection, a Redis restart, `LOADING`, ...) until its
                // deadline: the connection reconnects for the next request,
                // which re-joins the queue (a restarted Redis has lost it)
                // with the same token. If a request whose reply was lost had
                // taken the lock, the next finds our token on it and we own
                // it (`HandedOver`, counted from before that request).
                Err(err) if call::fault_may_pass(&err) => {
                    tracing::debug!(target: TARGET, key, error = %err, "re-check failed; the waiter retries");
                    rounds.met(err);
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

    /// One run of the acquire script, once `channel` (ours for this key) is
    /// subscribed.
    async fn try_or_enqueue(
        &self,
        target: &Target,
        token: &LeaseToken,
        channel: &str,
        px: u64,
        lifetime: u64,
        deadline: Instant,
    ) -> Result<Found> {
        let key = target.lock.as_str();
        let backend = &self.inner.backend;
        backend.subs.ensure(channel, deadline).await?;
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
            .arg(channel)
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
            _ => Err(Error::UnexpectedReply {
                service: Service::REDIS,
                op: "acquire",
            }),
        }
    }
}
