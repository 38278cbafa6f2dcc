//! A waiter's guards, until it wins the lease or leaves: registered for
//! its pub/sub messages while it waits in Redis's queue, queued in process,
//! holding its locker's relay place. Dropped without the lease, each passes
//! on what reached it; a waiter that wins becomes a lease of its locker.

use std::sync::PoisonError;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::fencing::{FencingToken, Target};
use crate::lease::{Lease, Part};
use crate::node::RedisConnection;
use crate::token::LeaseToken;
use crate::watchdog::Validity;

use super::HandoffLocker;
use super::local::{Signal, Waiter};
use super::relay::{Relay, Ticket, Turn};
use super::release::{fence_of, spawn_leave};

impl<C: RedisConnection> HandoffLocker<C> {
    /// A lease passed to us in process.
    pub(super) fn relayed(
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
    pub(super) fn lease(
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
}

/// A registered waiter: routes its signals while it waits, and leaves the
/// queue (passing on a lock handed to it) if it stops waiting without the
/// lease.
pub(super) struct Waiting<'a, C: RedisConnection> {
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
    pub(super) fn enter(
        handoff: &'a HandoffLocker<C>,
        target: &'a Target,
        token: &'a LeaseToken,
        ttl: Duration,
        signals: mpsc::UnboundedSender<Signal>,
        unit: Option<Unit<'a>>,
    ) -> Self {
        let backend = &handoff.inner.backend;
        let waiter = Waiter {
            channel: backend.subs.channels.for_key(&target.lock),
            signals,
        };
        backend
            .local
            .waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(token.as_str().to_owned(), waiter);
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

    pub(super) fn into_lease(mut self, acquired_at: Instant, fence: u64) -> Lease {
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
pub(super) struct Unit<'a> {
    pub(super) relay: &'a Relay,
    pub(super) key: &'a str,
    pub(super) armed: bool,
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
pub(super) struct LocalWaiting<'a, C: RedisConnection> {
    pub(super) handoff: &'a HandoffLocker<C>,
    pub(super) target: &'a Target,
    pub(super) ticket: Option<Ticket>,
    /// Counts us among the waiters queued in process while we wait.
    pub(super) _counted: crate::metrics::Waiter,
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
