//! Who waits for which key, in what order, so that a release wakes one
//! waiter of its own key and no other.
//!
//! A `PgLocker`'s listening connection hears every release on the
//! database (`pg_notify('leasehold_leases', key)`). Waking every waiter of
//! the locker on each one would make each of them send its take again, a
//! statement per waiter per release: a herd, of which one wins. So each
//! acquire takes a [`Place`] in its key's queue at its first step and
//! keeps it until it ends, and a release wakes the first waiter of the
//! key that has not been woken yet: the locker's waiters are woken in the
//! order they came (first in, first out within a locker; across lockers,
//! whoever's take lands first wins).
//!
//! A wake is never lost to a waiter that cannot use it: a waiter woken
//! while it is still sending a take keeps the wake and steps again at
//! once (the release may have come after its take found the lock held),
//! and a place given up (the acquire won, gave up or was cancelled) with
//! a wake it never took passes that wake to the next waiter. When the
//! listening connection ends (notifications may have been missed), every
//! waiter looks again. Each waiter also polls on its own timer, so a wake
//! lost anyway (an acquire cancelled between its wake and its take) costs
//! at most one poll interval.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;

/// The registry: each key's waiters, in the order they came.
#[derive(Debug, Default)]
pub(crate) struct Wakes {
    queues: Mutex<HashMap<String, BTreeMap<u64, Arc<Waiter>>>>,
    next: AtomicU64,
}

/// One waiter's signal: a permit its next wait takes, and whether a wake
/// was given to it that it has not taken yet.
#[derive(Debug, Default)]
struct Waiter {
    notify: Notify,
    pending: AtomicBool,
}

impl Waiter {
    fn wake(&self) {
        self.pending.store(true, Ordering::SeqCst);
        self.notify.notify_one();
    }
}

/// One acquire's place in its key's queue, from its first step to its
/// end; leaving it (drop) takes it out of the queue.
#[derive(Debug)]
pub(crate) struct Place {
    wakes: Arc<Wakes>,
    key: String,
    ticket: u64,
    waiter: Arc<Waiter>,
}

impl Place {
    /// Resolves at the first wake given to this place that it has not
    /// taken yet (one may have come while its take was under way).
    pub(crate) fn woken(&self) -> impl Future<Output = ()> + Send + 'static {
        let waiter = self.waiter.clone();
        async move {
            waiter.notify.notified().await;
            waiter.pending.store(false, Ordering::SeqCst);
        }
    }
}

impl Place {
    /// Whether a waiter ahead of this one in its key's queue has a wake it
    /// has not taken yet (it is about to take the lock).
    pub(crate) fn is_behind_a_woken_waiter(&self) -> bool {
        let queues = self.wakes.lock();
        queues.get(&self.key).is_some_and(|queue| {
            queue
                .range(..self.ticket)
                .any(|(_, waiter)| waiter.pending.load(Ordering::SeqCst))
        })
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut queues = self.wakes.lock();
        if let Some(queue) = queues.get_mut(&self.key) {
            queue.remove(&self.ticket);
            if queue.is_empty() {
                queues.remove(&self.key);
            }
        }
        drop(queues);
        if self.waiter.pending.load(Ordering::SeqCst) {
            // A wake it never took: the next waiter's.
            self.wakes.released(&self.key);
        }
    }
}

impl Wakes {
    pub(crate) fn new() -> Wakes {
        Wakes::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, BTreeMap<u64, Arc<Waiter>>>> {
        self.queues.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place in `key`'s queue, behind every place taken before: it sees
    /// every release from now on that reaches it.
    pub(crate) fn enter(self: &Arc<Self>, key: &str) -> Place {
        let ticket = self.next.fetch_add(1, Ordering::Relaxed);
        let waiter = Arc::new(Waiter::default());
        self.lock()
            .entry(key.to_owned())
            .or_default()
            .insert(ticket, waiter.clone());
        Place {
            wakes: self.clone(),
            key: key.to_owned(),
            ticket,
            waiter,
        }
    }

    /// `key` was released: wakes its first waiter not woken yet (none if
    /// every one of them has a wake it has not taken: each of them steps
    /// again anyway).
    pub(crate) fn released(&self, key: &str) {
        let queues = self.lock();
        let next = queues.get(key).and_then(|queue| {
            queue
                .values()
                .find(|waiter| !waiter.pending.load(Ordering::SeqCst))
        });
        if let Some(waiter) = next {
            waiter.wake();
        }
    }

    /// Wakes every waiter (releases may have been missed).
    pub(crate) fn everyone(&self) {
        for waiter in self.lock().values().flat_map(BTreeMap::values) {
            waiter.wake();
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use std::pin::pin;
    use std::task::{Context, Waker};

    use super::*;

    /// Whether `place` has a wake it has not taken (and takes it),
    /// without waiting.
    fn is_woken(place: &Place) -> bool {
        let mut woken = pin!(place.woken());
        woken
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
            .is_ready()
    }

    #[test]
    fn a_release_wakes_the_first_waiter_of_its_key_alone() {
        let wakes = Arc::new(Wakes::new());
        let (a1, a2, b) = (wakes.enter("a"), wakes.enter("a"), wakes.enter("b"));
        assert!(!is_woken(&a1));
        wakes.released("a");
        assert!(is_woken(&a1), "the first waiter of a was not woken");
        assert!(!is_woken(&a2), "a release woke two waiters");
        assert!(!is_woken(&b), "a release of another key woke b");
        wakes.released("a");
        assert!(
            is_woken(&a1),
            "the first waiter, still waiting, comes first"
        );
        wakes.released("c"); // nobody waits: nothing to do
        wakes.everyone();
        assert!(is_woken(&a2) && is_woken(&b), "everyone() missed a waiter");
    }

    #[test]
    fn a_second_release_before_the_first_wake_is_taken_wakes_the_next() {
        let wakes = Arc::new(Wakes::new());
        let (first, second, third) = (wakes.enter("a"), wakes.enter("a"), wakes.enter("a"));
        wakes.released("a");
        wakes.released("a");
        assert!(is_woken(&first));
        assert!(is_woken(&second));
        assert!(!is_woken(&third), "two releases woke three waiters");
    }

    #[test]
    fn a_wake_given_during_a_take_is_kept_for_the_next_wait() {
        let wakes = Arc::new(Wakes::new());
        let place = wakes.enter("a");
        wakes.released("a"); // while its take is under way
        assert!(is_woken(&place));
        assert!(!is_woken(&place), "one wake was taken twice");
    }

    #[test]
    fn a_place_left_with_a_wake_it_never_took_passes_it_on() {
        let wakes = Arc::new(Wakes::new());
        let (gone, next) = (wakes.enter("a"), wakes.enter("a"));
        wakes.released("a");
        drop(gone);
        assert!(is_woken(&next), "the wake went with the waiter that left");
    }

    #[test]
    fn a_place_that_took_its_wake_passes_nothing_on() {
        let wakes = Arc::new(Wakes::new());
        let (first, next) = (wakes.enter("a"), wakes.enter("a"));
        wakes.released("a");
        assert!(is_woken(&first));
        drop(first);
        assert!(!is_woken(&next));
    }

    #[test]
    fn a_waiter_behind_a_woken_one_knows_it_and_one_ahead_does_not() {
        let wakes = Arc::new(Wakes::new());
        let (first, second) = (wakes.enter("a"), wakes.enter("a"));
        let other = wakes.enter("b");
        assert!(!second.is_behind_a_woken_waiter());
        wakes.released("a");
        assert!(second.is_behind_a_woken_waiter());
        assert!(!first.is_behind_a_woken_waiter());
        assert!(!other.is_behind_a_woken_waiter(), "another key's wake");
        assert!(is_woken(&first)); // it takes its wake: its turn to take
        assert!(!second.is_behind_a_woken_waiter());
    }

    #[test]
    fn a_key_leaves_the_registry_with_its_last_waiter() {
        let wakes = Arc::new(Wakes::new());
        let place = wakes.enter("a");
        let other = wakes.enter("b");
        assert_eq!(wakes.len(), 2);
        drop(place);
        assert_eq!(wakes.len(), 1);
        drop(other);
        assert_eq!(wakes.len(), 0);
    }

    #[test]
    fn a_release_before_the_place_was_taken_is_not_seen() {
        let wakes = Arc::new(Wakes::new());
        wakes.released("a");
        let late = wakes.enter("a");
        assert!(!is_woken(&late));
        wakes.released("a");
        assert!(is_woken(&late));
    }
}
