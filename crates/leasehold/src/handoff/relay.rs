//! In-process relay: the waiters of one [`HandoffLocker`](crate::HandoffLocker)
//! queue in process, and a release passes the lease straight to the next of
//! them with one token-checked request.
//!
//! # Why
//!
//! In hand-off mode without relay every acquisition costs Redis two
//! requests (a waiter's join, its release), and each arrives alone: the
//! holder's work separates them. On a small machine a lone request costs the
//! server tens of microseconds of CPU, mostly socket system calls, whatever
//! the script does. A service with many tasks waiting on one key in one
//! process does not need Redis to *order* them: it can keep them in a local
//! FIFO, keep *one* of them in Redis's queue on everyone's behalf, and pass
//! the lock it holds from task to task. It does need Redis to *confirm*
//! every hand-over: the lock key can vanish (expiry, eviction, a restart or
//! failover) and be taken by another process at any time, and only Redis
//! knows.
//!
//! # The rules (per key, per locker)
//!
//! - **Units.** A task that holds the lock, or waits for it in Redis, is a
//!   *unit*. A caller that finds no unit becomes one and goes to Redis (the
//!   usual join script); a caller that finds one queues locally and sleeps.
//!   Every unit, when it ends, serves the local queue: a holder passes its
//!   lease to the head, a Redis waiter that gives up hands it its place (the
//!   head then goes to Redis itself). So a local waiter is never left behind
//!   with nobody to serve it.
//! - **Relay.** A release passes the lock to the local head with one run of
//!   a small script (`relay.lua`): it checks that the key still holds
//!   the releasing holder's token, and sets it to a fresh token of the new
//!   holder with the TTL that holder asked for, in one atomic step. The new
//!   holder's lease is counted from when that request was sent. If the key
//!   no longer held our token, nothing moves: the release reports
//!   [`NotHeld`](crate::Error::NotHeld) and the head goes to Redis as a
//!   unit of its own. So every holder was confirmed by Redis at its
//!   hand-over, and has a token no other holder had. A fenced head gets its
//!   own fencing token in the same step.
//! - **Checkpoint.** After `limit` relays in a row the pass runs the release
//!   script in "pass" mode instead: if a live waiter sits in Redis's queue (another process,
//!   or one of ours), the lock goes to it as in a plain hand-off and the
//!   local head goes to Redis to queue behind it; if nobody waits there, the
//!   lock moves to the local head as in a relay. That bounds how long other
//!   processes wait (at most `limit` local turns). Every pass is a
//!   checkpoint while another unit of ours waits in Redis (a waiter that
//!   fell back there, below): it came before everyone queued here. When the
//!   checkpoint serves that unit, the local head stays first in line behind
//!   it instead of going to Redis, so the process is back to one unit.
//! - **Fallback.** A local waiter stops waiting locally and goes to Redis as
//!   a unit of its own once every live lease of ours on the key has run out
//!   by its holder's clock (or, with none alive, after its own TTL). That
//!   only matters when a holder neither releases nor drops its lease (a
//!   leaked guard, a hung task): Redis frees the key after the TTL and
//!   serves whoever waits there.
//!
//! Safety does not rest on this bookkeeping: every transfer of the lock,
//! local or not, is decided by Redis with a token check. The bookkeeping
//! only decides who asks Redis next.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::fencing::FencingToken;
use crate::token::LeaseToken;
use crate::watchdog::{Shared, Validity};

/// What a local waiter is handed when its turn comes.
#[derive(Debug)]
pub(crate) enum Turn {
    /// The lease: Redis moved the lock to `token` (ours alone) by the
    /// request whose send time and TTL `validity` records, and issued
    /// `fence` to us in the same step (a fenced waiter).
    Lease {
        token: LeaseToken,
        validity: Validity,
        fence: Option<FencingToken>,
    },
    /// No unit of ours is left for this key: go to Redis.
    Represent,
}

/// How a caller enters the relay.
pub(crate) enum Entry {
    /// Nobody of ours holds or waits: go to Redis (as a unit).
    Represent,
    /// Queued behind a unit of ours: wait on the ticket.
    Queued(Ticket),
    /// Busy, and the caller may not wait.
    Busy,
}

/// A local waiter's place in the queue.
pub(crate) struct Ticket {
    id: u64,
    turn: oneshot::Receiver<Turn>,
}

impl Ticket {
    /// Waits for the turn. Cancel safe: dropping the future keeps the ticket.
    pub(crate) async fn turn(&mut self) -> Option<Turn> {
        (&mut self.turn).await.ok()
    }
}

/// Who is served next by a unit that ends holding the lease.
pub(crate) enum Next {
    /// Nobody waits locally: the unit ended, release to Redis.
    Nobody,
    /// Move the lock to this waiter (`relay.lua`).
    Relay(Queued),
    /// Serve Redis's queue first, else move the lock to this waiter (the
    /// "pass" mode of the release script).
    Checkpoint(Queued),
}

/// A waiter in the local queue.
pub(crate) struct Queued {
    /// Its ticket's id.
    id: u64,
    ttl: Duration,
    fence_key: Option<String>,
    tx: oneshot::Sender<Turn>,
}

impl Queued {
    /// The TTL the waiter asked for.
    pub(crate) fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The fence counter of a fenced waiter.
    pub(crate) fn fence_key(&self) -> Option<&str> {
        self.fence_key.as_deref()
    }

    /// Hands the waiter its turn; gives the turn back if it stopped waiting.
    pub(crate) fn hand(self, turn: Turn) -> std::result::Result<(), Turn> {
        self.tx.send(turn)
    }
}

#[derive(Default)]
struct Slot {
    /// Tasks of this locker that hold the lock or wait for it in Redis.
    units: u32,
    /// Relays since the last checkpoint.
    streak: u32,
    /// The leases of our holders that may still be alive (a `Weak` that no
    /// longer upgrades is a lease released or dropped): for when they run
    /// out, and to tell a hung holder from a live one.
    holders: Vec<Weak<Shared>>,
    queue: VecDeque<Queued>,
}

/// The local queues of one locker.
pub(crate) struct Relay {
    limit: u32,
    slots: Mutex<HashMap<String, Slot>>,
    next_id: std::sync::atomic::AtomicU64,
}

impl Relay {
    pub(crate) fn new(limit: u32) -> Relay {
        Relay {
            limit,
            slots: Mutex::default(),
            next_id: std::sync::atomic::AtomicU64::new(0),
        }
    }

    pub(crate) fn limit(&self) -> u32 {
        self.limit
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<String, Slot>> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A caller asks for `key`: it becomes a unit if none exists, else it
    /// queues (or, when it `may_wait` not, is told the lock is busy).
    pub(crate) fn enter(
        &self,
        key: &str,
        ttl: Duration,
        fence_key: Option<&str>,
        may_wait: bool,
    ) -> Entry {
        let mut slots = self.slots();
        let slot = slots.entry(key.to_owned()).or_default();
        if slot.units == 0 {
            slot.units = 1;
            return Entry::Represent;
        }
        if !may_wait {
            return Entry::Busy;
        }
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let fence_key = fence_key.map(str::to_owned);
        slot.queue.push_back(Queued {
            id,
            ttl,
            fence_key,
            tx,
        });
        Entry::Queued(Ticket { id, turn: rx })
    }

    /// The waiter stops waiting locally (its fallback timer, or it gives up).
    /// `None`: it left the queue, and, with `as_unit`, became a unit of its
    /// own. `Some(turn)`: its turn had already been handed to it, and it must
    /// take or pass on that turn.
    pub(crate) fn leave(&self, key: &str, mut ticket: Ticket, as_unit: bool) -> Option<Turn> {
        let mut slots = self.slots();
        let slot = slots.entry(key.to_owned()).or_default();
        if let Some(at) = slot.queue.iter().position(|q| q.id == ticket.id) {
            slot.queue.remove(at);
        } else {
            // Popped already: the turn was sent, or is about to be. Closing
            // makes a send after this point fail (the sender then serves
            // the next waiter); a turn sent before it is still received.
            ticket.turn.close();
            if let Ok(turn) = ticket.turn.try_recv() {
                return Some(turn);
            }
        }
        if as_unit {
            slot.units = slot.units.saturating_add(1);
        } else {
            forget_if_idle(&mut slots, key);
        }
        None
    }

    /// A unit of ours now holds `key` with the lease that shares `shared`.
    pub(crate) fn hold(&self, key: &str, shared: &Arc<Shared>) {
        if let Some(slot) = self.slots().get_mut(key) {
            slot.holders.retain(|h| h.strong_count() > 0);
            slot.holders.push(Arc::downgrade(shared));
        }
    }

    /// Until when our holders of `key` can still hold it (the latest of
    /// their leases' ends), while one of them is alive (not yet released
    /// or dropped).
    pub(crate) fn held_until(&self, key: &str) -> Option<Instant> {
        self.slots()
            .get(key)?
            .holders
            .iter()
            .filter_map(until)
            .max()
    }

    /// How many callers wait in process for `key`.
    pub(crate) fn queued(&self, key: &str) -> usize {
        self.slots().get(key).map_or(0, |slot| slot.queue.len())
    }

    /// A unit that holds the lease ends: who is served next. Synchronous,
    /// so a lease dropped where nothing can be spawned still serves the
    /// local queue.
    pub(crate) fn next(&self, key: &str) -> Next {
        let mut slots = self.slots();
        let Some(slot) = slots.get_mut(key) else {
            return Next::Nobody;
        };
        while let Some(queued) = slot.queue.pop_front() {
            if queued.tx.is_closed() {
                continue;
            }
            // Another unit of ours waits in Redis (a waiter that fell back
            // there during an outage): it came before everyone queued here,
            // so the pass serves Redis's queue first.
            if slot.streak < self.limit && slot.units <= 1 {
                slot.streak = slot.streak.saturating_add(1);
                return Next::Relay(queued);
            }
            slot.streak = 0;
            return Next::Checkpoint(queued);
        }
        end_unit(&mut slots, key);
        Next::Nobody
    }

    /// A unit ends without the lease (or after the lease went elsewhere):
    /// its place goes to `first`, else to the next live local waiter, who
    /// goes to Redis; with nobody waiting the unit is gone.
    pub(crate) fn pass_place(&self, key: &str, first: Option<Queued>) {
        let mut turn = Turn::Represent;
        if let Some(queued) = first {
            match queued.hand(turn) {
                Ok(()) => return,
                Err(back) => turn = back,
            }
        }
        let mut slots = self.slots();
        if let Some(slot) = slots.get_mut(key) {
            while let Some(queued) = slot.queue.pop_front() {
                match queued.hand(turn) {
                    Ok(()) => return,
                    Err(back) => turn = back,
                }
            }
        }
        end_unit(&mut slots, key);
    }

    /// A checkpoint handed the lock to another unit of ours that waited in
    /// Redis: the releasing unit ends, and `first` (the local head the pass
    /// was for) stays first in line, now behind that unit, instead of going
    /// to Redis as a unit of its own. If that unit is gone already (it gave
    /// up meanwhile), the releasing unit's place goes to `first`.
    pub(crate) fn keep_first(&self, key: &str, first: Queued) {
        {
            let mut slots = self.slots();
            let slot = slots.entry(key.to_owned()).or_default();
            if slot.units > 1 {
                slot.units -= 1;
                slot.queue.push_front(first);
                return;
            }
        }
        self.pass_place(key, Some(first));
    }
}

/// When the lease behind `holder` ends, if it is still alive.
fn until(holder: &Weak<Shared>) -> Option<Instant> {
    holder.upgrade().map(|shared| shared.validity().until())
}

/// One unit of `key` ended with nobody to serve.
fn end_unit(slots: &mut HashMap<String, Slot>, key: &str) {
    if let Some(slot) = slots.get_mut(key) {
        slot.units = slot.units.saturating_sub(1);
    }
    forget_if_idle(slots, key);
}

/// Drops `key`'s slot once no unit and no waiter is left in it.
fn forget_if_idle(slots: &mut HashMap<String, Slot>, key: &str) {
    if slots
        .get(key)
        .is_some_and(|slot| slot.units == 0 && slot.queue.is_empty())
    {
        slots.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(2);

    fn queued(relay: &Relay, key: &str) -> Ticket {
        match relay.enter(key, TTL, None, true) {
            Entry::Queued(ticket) => ticket,
            _ => panic!("expected to queue"),
        }
    }

    #[tokio::test]
    async fn the_first_caller_is_the_unit_and_the_rest_queue_in_order() {
        let relay = Relay::new(4);
        assert!(matches!(
            relay.enter("k", TTL, None, true),
            Entry::Represent
        ));
        assert!(matches!(relay.enter("k", TTL, None, false), Entry::Busy));
        let mut first = queued(&relay, "k");
        let mut second = queued(&relay, "k");
        let Next::Relay(q) = relay.next("k") else {
            panic!("expected a relay");
        };
        assert!(q.hand(Turn::Represent).is_ok());
        assert!(matches!(first.turn().await, Some(Turn::Represent)));
        let Next::Relay(q) = relay.next("k") else {
            panic!("expected a relay");
        };
        assert!(q.hand(Turn::Represent).is_ok());
        assert!(matches!(second.turn().await, Some(Turn::Represent)));
        assert!(matches!(relay.next("k"), Next::Nobody));
        assert!(relay.slots().is_empty(), "the last unit ended");
    }

    #[tokio::test]
    async fn every_limit_plus_first_pass_is_a_checkpoint() {
        let relay = Relay::new(2);
        let _unit = relay.enter("k", TTL, None, true);
        let _waiters: Vec<Ticket> = (0..6).map(|_| queued(&relay, "k")).collect();
        assert!(matches!(relay.next("k"), Next::Relay(_)));
        assert!(matches!(relay.next("k"), Next::Relay(_)));
        assert!(matches!(relay.next("k"), Next::Checkpoint(_)), "limit");
        assert!(matches!(relay.next("k"), Next::Relay(_)), "reset");
    }

    #[tokio::test]
    async fn a_waiter_that_left_is_skipped_and_its_turn_goes_to_the_next() {
        let relay = Relay::new(4);
        let _unit = relay.enter("k", TTL, None, true);
        let gone = queued(&relay, "k");
        let mut next = queued(&relay, "k");
        assert!(relay.leave("k", gone, false).is_none());
        relay.pass_place("k", None);
        assert!(matches!(next.turn().await, Some(Turn::Represent)));
    }

    #[tokio::test]
    async fn a_turn_sent_before_leaving_is_returned_not_lost() {
        let relay = Relay::new(4);
        let _unit = relay.enter("k", TTL, None, true);
        let ticket = queued(&relay, "k");
        relay.pass_place("k", None);
        assert!(matches!(
            relay.leave("k", ticket, true),
            Some(Turn::Represent)
        ));
    }

    #[tokio::test]
    async fn a_turn_sent_after_leaving_comes_back_to_the_sender() {
        let relay = Relay::new(4);
        let _unit = relay.enter("k", TTL, None, true);
        let ticket = queued(&relay, "k");
        let Next::Relay(q) = relay.next("k") else {
            panic!("expected a relay");
        };
        assert!(relay.leave("k", ticket, false).is_none());
        assert!(matches!(q.hand(Turn::Represent), Err(Turn::Represent)));
    }

    #[tokio::test]
    async fn with_another_unit_of_ours_in_redis_every_pass_is_a_checkpoint() {
        let relay = Relay::new(4);
        let _holder = relay.enter("k", TTL, None, true);
        let fell_back = queued(&relay, "k");
        assert!(relay.leave("k", fell_back, true).is_none());
        let _waiters: Vec<Ticket> = (0..3).map(|_| queued(&relay, "k")).collect();
        assert!(matches!(relay.next("k"), Next::Checkpoint(_)));
        assert!(matches!(relay.next("k"), Next::Checkpoint(_)));
    }

    #[tokio::test]
    async fn a_head_kept_first_behind_our_served_unit_is_its_next_pass() {
        let relay = Relay::new(4);
        let _holder = relay.enter("k", TTL, None, true);
        let fell_back = queued(&relay, "k");
        assert!(relay.leave("k", fell_back, true).is_none());
        let mut head = queued(&relay, "k");
        let mut second = queued(&relay, "k");
        let Next::Checkpoint(q) = relay.next("k") else {
            panic!("expected a checkpoint");
        };
        // The checkpoint served the unit that fell back: the releasing unit
        // ends, the head waits on behind the served one, which relays to it.
        relay.keep_first("k", q);
        assert_eq!(relay.queued("k"), 2);
        let Next::Relay(q) = relay.next("k") else {
            panic!("one unit left: a relay");
        };
        assert!(q.hand(Turn::Represent).is_ok());
        assert!(matches!(head.turn().await, Some(Turn::Represent)));
        // Had the served unit gone meanwhile, the head takes the place.
        let Next::Relay(q) = relay.next("k") else {
            panic!("expected a relay");
        };
        relay.keep_first("k", q);
        assert!(matches!(second.turn().await, Some(Turn::Represent)));
    }

    #[tokio::test]
    async fn a_waiter_that_falls_back_becomes_a_unit_of_its_own() {
        let relay = Relay::new(4);
        let _unit = relay.enter("k", TTL, None, true);
        let ticket = queued(&relay, "k");
        assert!(relay.leave("k", ticket, true).is_none());
        assert!(matches!(relay.next("k"), Next::Nobody));
        assert!(matches!(relay.enter("k", TTL, None, false), Entry::Busy));
        relay.pass_place("k", None);
        assert!(matches!(
            relay.enter("k", TTL, None, false),
            Entry::Represent
        ));
    }
}
