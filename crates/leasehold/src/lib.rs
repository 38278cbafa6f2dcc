#![doc = include_str!("../README.md")]
//!
//! # Why a lease is not a mutex
//!
//! A Redis lock is a key with an expiry. The expiry is what makes it safe to
//! use across processes that crash: a dead holder cannot block the key
//! forever. It is also what makes it *not* a mutex: the key disappears after
//! the TTL whether or not the holder has finished, so a holder that is slow,
//! paused (garbage collection, a stopped VM) or partitioned can keep working
//! after its lease has passed to someone else. Nothing the holder checks
//! before writing can rule this out, because the pause can fall between the
//! check and the write.
//!
//! So in leasehold a Redis lock is an **efficiency lock**: it makes
//! conflicting work rare and keeps contention down. When a lock failure
//! would corrupt data (money), the write path is made **correct** by the
//! database: a conditional write that refuses stale fencing tokens and stale
//! reads (see the `leasehold-pg` crate).
//!
//! # What this crate guarantees
//!
//! - A lease is taken with one `SET key token NX PX ttl`, so key and expiry
//!   are created atomically; the token is 128 bits from the OS CSPRNG.
//! - Release deletes the key only if it still holds our token (one Lua
//!   script), so a late holder never deletes its successor's lock, and
//!   reports [`Error::NotHeld`] when the lease was already gone.
//! - Refresh extends the TTL only if the key still holds our token, and
//!   never creates or deletes the key. On Redis 8.4+ release and refresh
//!   are the `DELEX ... IFEQ` and `SET ... IFEQ` commands; older servers
//!   get the same steps as Lua scripts (detected once per locker).
//! - A lease's watchdog refreshes it every `ttl / 3` and cancels the work's
//!   token when the lease is lost ([`watchdog`] explains why ttl/3, and
//!   what it cannot do).
//! - Every Redis request is bounded by the caller's deadline (or the
//!   locker's command timeout): a paused Redis fails fast with
//!   [`Error::Timeout`].
//! - [`Locker::acquire_fenced`] takes the lock and issues a [`FencingToken`]
//!   in one script, so only a holder gets a token and tokens grow with every
//!   acquisition (as long as Redis keeps the counter; see
//!   [`FencingToken`] on failover).
//! - Bad input ([`Error::InvalidTtl`], [`Error::InvalidKey`],
//!   [`Error::KeysInDifferentSlots`]) is rejected before any I/O.
//! - Giving up is always [`Error::NotAcquired`] with its [`GiveUpReason`],
//!   whatever the retry strategy and options (and in hand-off mode).
//! - In hand-off mode ([`HandoffLocker`]) waiters are served in arrival
//!   order (within a process; across processes in turns of at most
//!   `relay_limit` leases, or caller by caller with relay off), each release
//!   hands the lock to the next live waiter in the same atomic step or, in
//!   process, continues its own lease for it, and a holder or waiter that
//!   dies blocks the key for at most one TTL.
//! - A [`Quorum`] (Redlock) lease holds on a majority of independent servers;
//!   a node that errors or hangs is a missing vote, never an abort, and its
//!   fencing token grows across leases within the limits its
//!   [module docs](quorum) spell out.
//! - [`AcquireOptions::wait_replicas`] gives the lock back unless `WAIT`
//!   saw it reach the replicas ([`Error::NotReplicated`]); it narrows the
//!   failover window, it does not close it.

mod call;
mod compare;
pub mod diagnostics;
mod error;
mod fencing;
mod handoff;
mod lease;
mod locker;
mod options;
pub mod quorum;
mod relay;
mod replicas;
mod retry;
mod rounds;
mod scripts;
mod stats;
mod token;
pub mod watchdog;

#[cfg(test)]
mod give_up_tests;

pub use error::{Error, GiveUpReason, Result};
pub use fencing::{FencedKeys, FencingToken};
pub use handoff::{DEFAULT_RELAY_LIMIT, HandoffLocker, HandoffLockerBuilder, HandoffStyle};
pub use lease::Lease;
pub use locker::{DEFAULT_COMMAND_TIMEOUT, Locker, LockerBuilder, MAX_TTL, connect};
pub use options::{AcquireOptions, DEFAULT_WAIT};
pub use quorum::{
    DEFAULT_NODE_TIMEOUT, Quorum, QuorumBuilder, QuorumLease, drift, majority, validity,
};
pub use retry::{RetryStrategy, Waits};
pub use stats::LockerStats;
pub use token::LeaseToken;
pub use watchdog::LostCause;

/// Re-exported so callers can name the connection and cancellation types
/// without adding matching versions of these crates themselves.
pub use redis;
pub use tokio_util::sync::CancellationToken;

/// A Redis connection a [`Locker`] can use: any clonable async redis-rs
/// connection, such as a
/// [`ConnectionManager`](redis::aio::ConnectionManager) (the default, which
/// reconnects), a cluster connection, or a
/// [`ConnectionManager`](redis::aio::ConnectionManager) (which does
/// not: see [`Locker`]).
pub trait RedisConnection: redis::aio::ConnectionLike + Clone + Send + Sync + 'static {}

impl<T> RedisConnection for T where T: redis::aio::ConnectionLike + Clone + Send + Sync + 'static {}
