//! Who waits for which key, so that a release wakes the waiters of its
//! own key and no other.
//!
//! A `PgLocker`'s listening connection hears every release on the
//! database (`pg_notify('leasehold_leases', key)`). Waking every waiter of
//! the locker on each one would make each of them send its take again, a
//! statement per waiter per release of any key: a herd on a busy
//! database. So each waiter subscribes to its key, and a notification
//! wakes that key's subscribers alone. When the listening connection ends
//! (notifications may have been missed), every waiter looks again.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use tokio::sync::watch;

/// How many keys the registry holds before it drops those nobody waits
/// for any more (each waiter's subscription ends with its step).
const SWEEP_AT: usize = 1024;

/// The registry: a signal per key someone waits for, and one for all.
#[derive(Debug)]
pub(crate) struct Wakes {
    keys: Mutex<HashMap<String, watch::Sender<()>>>,
    all: watch::Sender<()>,
}

/// One waiter's subscription: its key's signal, and everyone's.
#[derive(Debug)]
pub(crate) struct Woken {
    key: watch::Receiver<()>,
    all: watch::Receiver<()>,
}

impl Woken {
    /// Resolves at the next release of the key (or when every waiter is
    /// told to look again) after the subscription was taken.
    pub(crate) async fn changed(&mut self) {
        tokio::select! {
            _ = self.key.changed() => {}
            _ = self.all.changed() => {}
        }
    }
}

impl Wakes {
    pub(crate) fn new() -> Wakes {
        Wakes {
            keys: Mutex::new(HashMap::new()),
            all: watch::Sender::new(()),
        }
    }

    /// Subscribes to the releases of `key` from now on.
    pub(crate) fn subscribe(&self, key: &str) -> Woken {
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        if keys.len() >= SWEEP_AT {
            keys.retain(|_, sender| sender.receiver_count() > 0);
        }
        let key = match keys.get(key) {
            Some(sender) => sender.subscribe(),
            None => {
                let (sender, receiver) = watch::channel(());
                keys.insert(key.to_owned(), sender);
                receiver
            }
        };
        Woken {
            key,
            all: self.all.subscribe(),
        }
    }

    /// `key` was released: wakes its waiters.
    pub(crate) fn released(&self, key: &str) {
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(sender) = keys.get(key) {
            if sender.receiver_count() == 0 {
                keys.remove(key);
            } else {
                sender.send_replace(());
            }
        }
    }

    /// Wakes every waiter (releases may have been missed).
    pub(crate) fn everyone(&self) {
        self.all.send_replace(());
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.keys
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Waker};

    use super::*;

    /// Whether `woken.changed()` has resolved, without waiting.
    fn is_woken(woken: &mut Woken) -> bool {
        let mut changed = pin!(woken.changed());
        changed
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
            .is_ready()
    }

    #[test]
    fn a_release_wakes_its_keys_waiters_alone() {
        let wakes = Wakes::new();
        let (mut a1, mut a2, mut b) = (
            wakes.subscribe("a"),
            wakes.subscribe("a"),
            wakes.subscribe("b"),
        );
        assert!(!is_woken(&mut a1));
        wakes.released("a");
        assert!(is_woken(&mut a1));
        assert!(is_woken(&mut a2));
        assert!(!is_woken(&mut b), "a release of another key woke b");
        wakes.released("c"); // nobody waits: nothing to do
        assert!(!is_woken(&mut b));
        wakes.everyone();
        assert!(is_woken(&mut b));
    }

    #[test]
    fn a_release_before_the_subscription_is_not_seen_and_one_after_is() {
        let wakes = Wakes::new();
        wakes.released("a");
        let mut late = wakes.subscribe("a");
        assert!(!is_woken(&mut late));
        wakes.released("a");
        assert!(is_woken(&mut late));
    }

    #[test]
    fn keys_nobody_waits_for_are_dropped() {
        let wakes = Wakes::new();
        drop(wakes.subscribe("gone"));
        wakes.released("gone");
        assert_eq!(wakes.len(), 0);
        for n in 0..SWEEP_AT {
            drop(wakes.subscribe(&format!("k{n}")));
        }
        let _live = wakes.subscribe("live");
        assert_eq!(wakes.len(), 1, "the sweep keeps the keys still waited for");
    }
}
