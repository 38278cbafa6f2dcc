//! What a way of taking a lease gives the one acquire path ([`Way`]).
//!
//! Every acquire walks the same road: its entry checks and resolves the
//! wait, opens its span, claims the lock, hands the claim's attempts to the
//! one retry loop, and, after the win, has the lease confirmed by the
//! replicas and watched. What differs between the ways is small and sits
//! at the ends of that road: how a claim is made (a fresh token, the
//! service's fence key), which attempts the loop drives over it (a
//! [`LockService`](crate::backend::LockService)'s steps, or a hand-off
//! waiter's place in the queues), what a win becomes (a lease built from
//! the claim, or the lease a release handed over), and what a win still
//! needs before the caller gets it. This trait names those ends and
//! nothing else, so the road itself is written once (module `acquire`)
//! and no way has to be visited twice on the way to the wire.
//!
//! It lives apart from that road so that a way declared below it (the
//! hand-off locker) can implement it without importing the road, which
//! imports every way to give each its entry.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::budget::Budget;
use crate::error::Result;
use crate::fencing::Target;
use crate::lease::Lease;
use crate::options::{AcquireOptions, Supports};
use crate::rounds::Attempts;

/// A way of taking a lease, as the one acquire path sees it.
pub(crate) trait Way {
    /// What one take claims before its first attempt (the lock key, a
    /// fresh token): kept by the path while the retry loop drives the
    /// attempts over it, then turned into the lease. A take again (after
    /// a win too few replicas acknowledged) makes a new one.
    type Claim;

    /// What a winning attempt returns.
    type Won;

    /// One take's attempts, over its claim: what the retry loop drives.
    type Attempts<'a>: Attempts<Won = Self::Won>
    where
        Self: 'a;

    /// Which options it honours (the rest are refused before any I/O).
    fn supports(&self) -> Supports;

    /// Its name in traces and metrics: `poll`, `handoff`, `quorum`,
    /// `etcd`, or the service's name for a [`LockService`](crate::backend::LockService).
    fn mode(&self) -> &'static str;

    /// Refuses a TTL this way cannot honour (beyond the crate's own
    /// bounds), before any I/O. Defaults to every TTL accepted.
    fn check_ttl(&self, _ttl: Duration) -> Result<()> {
        Ok(())
    }

    /// Its bound on one Redis request (a `WAIT` for replicas must be
    /// shorter).
    fn command_timeout(&self) -> Duration;

    /// The bound on one attempt the retry loop makes. Defaults to the
    /// command timeout.
    fn step_timeout(&self) -> Duration {
        self.command_timeout()
    }

    /// The claim of one take on one checked target, for `ttl` (no I/O).
    fn claim(&self, target: Target, ttl: Duration) -> Result<Self::Claim>;

    /// The lock key `claim` is for.
    fn key(claim: &Self::Claim) -> &str;

    /// The attempts of one take over `claim`, as `opts` says (checked
    /// against [`supports`](Self::supports)), within `budget` (the
    /// acquire's wait, resolved at its entry). No I/O.
    fn attempts<'a>(
        &'a self,
        claim: &'a Self::Claim,
        opts: &AcquireOptions,
        budget: Budget,
    ) -> Self::Attempts<'a>;

    /// The lease `won` makes of `claim`, counted from `sent_at` (the send
    /// time of the winning attempt).
    fn lease(&self, claim: Self::Claim, won: Self::Won, sent_at: Instant) -> Lease;

    /// What the lease just won still needs before anything else sees it
    /// (hand-off: a lease handed over late is refreshed), by `deadline`;
    /// called before the replicas confirm it. By default, nothing.
    fn after_win(
        &self,
        lease: Lease,
        _ttl: Duration,
        _deadline: Instant,
    ) -> impl Future<Output = Lease> {
        std::future::ready(lease)
    }

    /// The lease just won, once `opts`' replicas acknowledged it on the
    /// server that granted it ([`replicas::confirm`](crate::replicas::confirm)),
    /// waiting until `deadline` at most. Called only when
    /// [`supports`](Self::supports) allows `wait_replicas`; by default (a way
    /// without replicas to wait for) the lease as it is.
    fn confirm_replicas(
        &self,
        lease: Lease,
        _opts: &AcquireOptions,
        _deadline: Instant,
    ) -> impl Future<Output = Result<Lease>> {
        std::future::ready(Ok(lease))
    }
}
