//! What granted a lease, as the lease sees it: one [`Backend`] interface
//! (the token-checked steps on one lock), implemented by each way of taking
//! a lease, and the [`Part`] of a lease it acts on.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::fencing::FencingToken;
use crate::service::Service;
use crate::watchdog::{self, Margin, Shared};

#[cfg(doc)]
use super::Lease;

/// One lock a lease holds (the public [`Held`](crate::backend::Held)).
pub(crate) use crate::backend::Held as Part;

pub(crate) use crate::backend::Reply;
use crate::backend::Wake;

/// What granted a lease, as the lease sees it: the token-checked steps on
/// one lock. Implemented by each way of taking a lease.
pub(crate) trait Backend: Send + Sync + 'static {
    /// The service it talks to, as errors name it.
    fn service(&self) -> Service;

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

    /// A signal that `part`'s lock may be gone, which the watchdog confirms
    /// with a refresh at once ([`LockService::watch_held`]); `None`: no
    /// signal, refreshes alone find a loss.
    ///
    /// [`LockService::watch_held`]: crate::LockService::watch_held
    fn watch_held(&self, _part: &Part) -> Option<Wake> {
        None
    }

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
