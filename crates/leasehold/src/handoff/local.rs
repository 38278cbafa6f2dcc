//! One hand-off locker's own waiters and the leases it holds: what the
//! pub/sub routing delivers to, and what a release consults to tell a live
//! waiter from an orphan hand-off.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, PoisonError};

use tokio::sync::mpsc;

use crate::token::LeaseToken;

use super::relay::Relay;

/// What a waiter's pub/sub message said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Signal {
    /// The lock is ours, with this fencing token (0: unfenced).
    Granted(u64),
    /// Re-check the lock: it was released to us (take it), or messages may
    /// have been lost.
    Woken,
}

/// One waiter of ours in Redis's queue: the shard channel that reaches it,
/// and where its signals go.
pub(super) struct Waiter {
    pub(super) channel: String,
    pub(super) signals: mpsc::UnboundedSender<Signal>,
}

/// Our waiters in Redis's queue, by token.
pub(super) type Waiters = Mutex<HashMap<String, Waiter>>;

/// One locker's own waiters. A release by this locker that serves one of
/// them tells it through here instead of `SPUBLISH` (the queue names them by
/// this locker's channels).
pub(super) struct Local {
    pub(super) waiters: Waiters,
    /// The tokens of this locker's leases not yet given back (released or
    /// dropped). With `waiters`, it tells an *orphan* hand-off: one to a
    /// token that neither waits nor holds here any more.
    pub(super) held: Mutex<HashSet<LeaseToken>>,
    /// The in-process queues, unless relay is off.
    pub(super) relay: Option<Relay>,
}

impl Local {
    /// Tells every waiter of ours to re-check the lock.
    pub(super) fn wake_all(&self) {
        for sender in self
            .waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
        {
            let _ = sender.signals.send(Signal::Woken);
        }
    }

    /// Tells every waiter of ours reached through `channel` to re-check
    /// the lock.
    pub(super) fn wake_channel(&self, channel: &str) {
        for waiter in self
            .waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .filter(|waiter| waiter.channel == channel)
        {
            let _ = waiter.signals.send(Signal::Woken);
        }
    }

    /// Delivers `signal` to our waiter `token`; `false` when it no longer
    /// waits (it won another way, or gave up and is leaving the queue).
    pub(super) fn tell(&self, token: &str, signal: Signal) -> bool {
        self.waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(token)
            .is_some_and(|waiter| waiter.signals.send(signal).is_ok())
    }

    pub(super) fn held(&self) -> std::sync::MutexGuard<'_, HashSet<LeaseToken>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Nobody here waits with `token` or holds a lease with it. A waiter
    /// that wins becomes a lease before it stops being a waiter, so a
    /// token in neither was given up, given back, or never ours in this
    /// life of the queue (an entry a failover or a restart from disk
    /// brought back).
    pub(super) fn orphan(&self, token: &LeaseToken) -> bool {
        !self
            .waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(token.as_str())
            && !self.held().contains(token)
    }
}
