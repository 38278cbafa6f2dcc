// The README (the repository's, linked here) is the crate's front page; its
// examples compile as doctests, and tests/readme.rs checks that each is a
// file of examples/ shown whole and runs it against throwaway servers. It
// uses every way of taking a lease, so without them the crate docs are a
// pointer to it (and its doctests build in every feature set).
#![cfg_attr(
    all(feature = "quorum", feature = "handoff"),
    doc = include_str!("../README.md")
)]
#![cfg_attr(
    not(all(feature = "quorum", feature = "handoff")),
    doc = "Redis lease locks that keep money right. This build leaves out the \
           `quorum` or `handoff` feature; the front page, which uses both, is \
           the crate's README (and its docs on docs.rs)."
)]
#![cfg_attr(docsrs, feature(doc_cfg))]
// The docs link the opt-in parts (`tls`, `Sentinel`, the cluster client)
// where they are the answer; a build without them (the defaults) leaves
// those links dangling. Checked where every feature is on: docs.rs
// (all-features) and the workspace's doc build.
#![cfg_attr(
    not(all(feature = "tls", feature = "sentinel", feature = "cluster")),
    allow(rustdoc::broken_intra_doc_links)
)]
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
//! These hold for **every** way of taking a lease (polling, hand-off with
//! or without relay, fenced or not, quorum, cluster); each is tested on
//! every path.
//!
//! - **Confirmed hand-over.** A task holds a lease only after Redis (or a
//!   majority of a quorum) confirmed, at or after the moment it was handed
//!   the lease, that the key carries the lease's token: its own `SET NX`,
//!   the release script that granted it the lock, or the token-checked
//!   pass that relayed it in process. No local shortcut grants a lease
//!   Redis does not know about. The lease's validity is counted from when
//!   that confirming request was *sent*, so the holder's idea of its
//!   remaining time is never longer than Redis's.
//! - **Honest release.** Release and refresh act only if the key still holds
//!   our token, in one atomic step, and return [`Error::NotHeld`] whenever
//!   it does not: a late holder never deletes or extends its successor's
//!   lock, and never hears that all is well. Where the server has them
//!   (detected, per step) they are its native commands: `SET ... IFEQ` for
//!   a refresh on Redis 8.4+ and Valkey 8.1+, `DELEX ... IFEQ` (Redis
//!   8.4+) or `DELIFEQ` (Valkey 9.0+) for a release; Lua scripts elsewhere.
//! - **One token per holder.** Every holder gets 128 fresh bits from a
//!   CSPRNG seeded by the OS (a ChaCha12 generator per thread, reseeded
//!   from the OS in a forked child before its first token, each draw mixed
//!   with the monotonic clock, so no process repeats another's tokens; see
//!   [`LeaseToken`]), never shared with
//!   another holder; every fenced holder gets its
//!   own [`FencingToken`], issued in the atomic step that gives it the lock
//!   and strictly greater than every token issued before it for that
//!   resource (as long as Redis keeps the counter; see [`FencingToken`] on
//!   failover, and the [`quorum`] docs for a quorum).
//! - **Every option honoured or refused.** Each [`AcquireOptions`] field is
//!   honoured by every way of taking a lease, or refused with
//!   [`Error::InvalidOptions`] naming it before any I/O. Bad input
//!   ([`Error::InvalidTtl`], [`Error::InvalidKey`],
//!   [`Error::KeysInDifferentSlots`]) is rejected before any I/O too.
//! - **Connections recover, faults are ridden out.** [`Locker::connect`]
//!   opens a reconnecting connection and a [`HandoffLocker`]'s sharded
//!   pub/sub connection resubscribes (on a cluster, also when a slot
//!   moves): after Redis restarts or a connection drops, the next request
//!   reconnects; through a [`Sentinel`] (feature `sentinel`) every
//!   reconnect resolves the primary again, and a `READONLY` reply or the
//!   sentinels naming another primary reconnect too. An acquire retries a
//!   fault that may pass
//!   (a timeout, a lost connection, `LOADING`, `TRYAGAIN`, `MASTERDOWN`,
//!   `CLUSTERDOWN`, a slot's `MOVED` / `ASK` the cluster client stopped
//!   following) until its deadline, as it retries a busy lock; a retry
//!   never holds a lock it does not know of (a possibly-landed attempt is
//!   undone, token-checked, or found by its own token). Release and refresh
//!   retry quick faults while the lease is valid. Every request is bounded
//!   by the caller's deadline (or the command timeout): a paused Redis
//!   costs a release or refresh one command timeout, [`Error::Timeout`].
//! - **Drop never leaks.** Dropping a lease (or an acquire future) never
//!   blocks: its bookkeeping is synchronous and only Redis requests are
//!   spawned; with no runtime the TTL ends the lease and the locker stays
//!   usable.
//! - **Liveness.** A watchdog refreshes every `ttl / 3` and cancels the
//!   work's token when the lease is lost ([`watchdog`] explains why ttl/3,
//!   and what it cannot do). Giving up is always [`Error::NotAcquired`] with
//!   its [`GiveUpReason`]. In hand-off mode waiters are served in arrival
//!   order (within a process; across processes in turns of at most
//!   `relay_limit + 1` leases), and a holder or waiter that dies blocks the
//!   key for at most one TTL. [`AcquireOptions::wait_replicas`] gives the
//!   lock back unless `WAIT` saw it reach the replicas
//!   ([`Error::NotReplicated`]); it narrows the failover window, it does
//!   not close it.
//!
//! # One shape for every way
//!
//! [`Locker`], [`HandoffLocker`] and [`Quorum`] are built alike:
//!
//! - `connect(..)` with the defaults, opening their own reconnecting
//!   connections ([`Locker::connect`], [`HandoffLocker::connect`],
//!   [`Quorum::connect`]); a locker's and a hand-off locker's take an
//!   [`Endpoint`]: a `&redis::Client`, or with the `sentinel` feature a
//!   `&Sentinel` whose primary they follow across failovers (see the
//!   `sentinel` module);
//! - `builder()`, its setters (each documents its default), then
//!   `connect(..)` for their own connections, or `build(..)` over
//!   connections you have (a cluster connection, one per quorum node) or,
//!   for a hand-off locker, over a [`Locker`] you have.
//!
//! A builder refuses settings it cannot use with [`Error::InvalidOptions`]
//! before any I/O. And they take leases with the same four calls, the
//! [`Lessor`] trait (`use leasehold::Lessor`): code that works with any
//! way is generic over it, and a lock service of your own is one
//! [`LockService`] implementation away from the same calls.
//!
//! # What the crate exports, by what you do with it
//!
//! - **Take a lease**: [`Lessor`] (the four calls) and the ways:
//!   [`Locker`], [`HandoffLocker`], [`Quorum`], `MemoryLocker` (feature
//!   `memory`), and in crates of their own `EtcdLocker`
//!   (`leasehold-etcd`), `PgLocker` (`leasehold-pg`) and `ZkLocker`
//!   (`leasehold-zookeeper`); any of them as one type ([`DynLessor`]); [`AcquireOptions`], [`RetryStrategy`]; the keys
//!   ([`LockKeys`], [`FencedKeys`]); connecting ([`client`], [`Endpoint`],
//!   [`Connection`], `Sentinel`).
//! - **The lease**: [`Lease`], [`Finished`], [`LostCause`], the
//!   [`watchdog`] module; [`LeaseToken`], [`HolderId`].
//! - **Fencing**: [`FencingToken`] (the `leasehold-pg` guard stores it).
//! - **Leadership**: [`Election`], [`Term`], [`Leader`], [`Observer`].
//! - **Errors**: [`Error`] (and [`Error::is_retryable`]), [`GiveUpReason`],
//!   [`Service`] (which lock service an error came from).
//! - **Your own lock service**: [`LockService`] and the [`backend`] module
//!   (its contract); the `conformance` suite (feature `conformance`).
//! - **Watching it run**: [`diagnostics`], [`metrics`] (feature
//!   `metrics`), [`LockerStats`].
//!
//! # Leadership
//!
//! An [`Election`] runs a singleton (a scheduler, a migration, a consumer)
//! over any of them (`EtcdLocker`, `PgLocker` and `ZkLocker` too): candidates [`campaign`](Election::campaign), the
//! winner gets a [`Term`] (its lease under the watchdog, and a fencing
//! token greater than every earlier term's), a leader that stops is
//! replaced within its TTL and one that [resigns](Term::resign) at once,
//! and [`Election::observe`] reports who leads. The [`election`] module
//! says what a term protects and what it does not (side effects outside
//! the guarded database).
//!
//! # Tracing
//!
//! Through the `tracing` facade (no subscriber is installed by the
//! library). Targets are the module paths below; filter with them (for
//! example `RUST_LOG=leasehold=debug`, or `leasehold::watchdog=warn`).
//!
//! | level | target | what | fields |
//! |---|---|---|---|
//! | DEBUG | `leasehold::way` | span `leasehold.acquire`, one per lock key taken (so one per key of `acquire_all`), on every way | `key`, `mode` (`poll` / `handoff` / `quorum`), `fenced`, and when it ends, on every path: `attempts`, `waited_ms` (the whole acquire, waits included), `outcome` (`acquired` / `gave_up` / `error` / `dropped`) |
//! | DEBUG | `leasehold::way` | the event that ends it: `acquired`, `gave up`, `acquire failed`, `acquire dropped by its caller` | `outcome`, `attempts`, `waited_ms`; `fence`, the give-up `reason` (`retries_exhausted` / `deadline_expired` / `cancelled`) or the `error` |
//! | DEBUG | `leasehold::lease` | span `leasehold.release` | `key` (the first), `keys` (how many), `outcome` (`released` / `not_held` / `error`) |
//! | DEBUG | `leasehold::lease` | `released`, `release failed`, one per key | `key`, `outcome`, `error` |
//! | **WARN** | `leasehold::lease` | `release found the lease gone` (a **stale release**: it expired or changed hands while held; [`Error::NotHeld`]) | `key`, `outcome = not_held` |
//! | DEBUG / WARN | `leasehold::lease` | a dropped lease given back in the background: `released dropped lease`, `dropped lease had already expired`, `dropped lease ran out before redis answered`; WARN `could not release dropped lease` | `key`, `outcome`, `error` |
//! | DEBUG | `leasehold::lease`, `leasehold::watchdog` | `refreshed`, `refresh failed` (the caller gets the error) | `key`, `ttl_ms`, `by` (`caller` / `watchdog`), `outcome` (`ok` / `not_held` / `error`) |
//! | **WARN** | `leasehold::watchdog` | `lease refresh failed; retrying until the lease's deadline` | `key`, `error`, `remaining` |
//! | **WARN** | `leasehold::watchdog`, `leasehold::lease` | **lease lost**: `lease lost; cancelling the work` (the watchdog), `refresh found the lease gone` (a caller's refresh) | `key`, `cause` (`expired` / `unreachable`) |
//! | DEBUG | `leasehold::handoff` | `handed the lock by a release`: a waiter of ours got the lease without its own `SET` | `key`, `via` (`grant` / `recheck` / `relay`), `fence` |
//! | DEBUG | `leasehold::handoff` | a release passed the lock on: `passed the lock to a waiter of this locker` (relay), `handed the lock to the next waiter in the queue` | `key`, `fence`, `checkpoint`, `local` |
//! | WARN / INFO | `leasehold::handoff` | the pub/sub connection lost / back (one node); WARN `could not subscribe again to a moved shard channel`, `could not leave the wait queue`, `could not give back a lock passed to a waiter that left` | `channel`, `key`, `error` |
//! | INFO | `leasehold::election` | `elected`, `term ended` (an [`Election`]'s terms); WARN when a new leader could not name itself | `election`, `candidate`, `fence`; at the end `end` (`resigned` / `expired` / `unreachable` / `superseded` / `dropped`), `held_ms` |
//! | WARN | `leasehold::replicas` | `could not release an unreplicated lease` | `key`, `error` |
//!
//! In `leasehold-pg`, a write refused as stale is a WARN (the money alarm);
//! see that crate's docs.
//!
//! Keys and fencing tokens are logged; lease tokens, passwords and
//! connection URLs never are (errors in `error` fields never contain them).
//!
//! # Metrics
//!
//! With the crate feature `metrics` (off by default) the library records
//! acquire latency, wait time and attempts (by mode and outcome), give-ups
//! by reason, leases lost by cause, releases (stale ones included),
//! refreshes, hand-offs and the hand-off queue depth through the `metrics`
//! facade. The names, labels and their values are in the [`metrics`]
//! module; no metric is labelled by lock key.
//!
//! # How the crate is built
//!
//! In layers, each using only those below it:
//!
//! 1. **Protocol and the seam**: the connection, the Lua scripts and the
//!    token-checked steps on one server (`node`, `compare`, `call`,
//!    `scripts`), and the public trait every lock service implements,
//!    [`LockService`] (module [`backend`], with its contract). Knows
//!    nothing of leases.
//! 2. **Lease core**: one [`Lease`] type (keys, tokens, validity, fence,
//!    [`watchdog`], `run`, `release`) that talks to whatever granted it
//!    through one small backend interface. Knows nothing of hand-off or
//!    quorum.
//! 3. **Ways of taking a lease**: every [`LockService`] is a [`Lessor`]
//!    through one acquire path (`acquire`), its steps driven by one retry
//!    loop (`rounds::drive`): polling ([`Locker`]), Redlock
//!    ([`Quorum`]), in the crates of their own etcd (`leasehold-etcd`: a
//!    queued service, its place kept across steps, woken by watch),
//!    PostgreSQL and ZooKeeper, and in memory for
//!    tests (`MemoryLocker`, feature `memory`). Hand-off with its relay
//!    ([`HandoffLocker`]) takes the same path and loop, giving them its
//!    queuing through the crate's own `Way`. All
//!    check options in one place, turn the caller's wait into one deadline
//!    at their entry and share one routine for several keys.
//! 4. The crate root: these docs and the `pub use` list.

// Protocol: the connection, the scripts and the token-checked steps.
pub mod backend;
mod budget;
mod call;
mod client;
mod compare;
#[cfg(feature = "conformance")]
#[cfg_attr(docsrs, doc(cfg(feature = "conformance")))]
pub mod conformance;
mod connection;
mod endpoint;
mod error;
mod fencing;
mod lost;
mod node;
mod options;
mod retry;
mod scripts;
mod sentinel_fault;
mod service;
#[cfg(feature = "postgres")]
mod sql;
#[cfg(feature = "sqlx")]
mod sqlx;
mod stats;
mod tls_failure;
mod token;
// Lease core: one lease type, its validity and watchdog.
mod lease;
pub mod watchdog;
// The ways of taking a lease.
pub mod election;
mod erased;
#[cfg(feature = "handoff")]
mod handoff;
mod lessor;
mod locker;
// A lock service in memory, for users' tests.
#[cfg(feature = "memory")]
#[cfg_attr(docsrs, doc(cfg(feature = "memory")))]
pub mod memory;
#[cfg(feature = "quorum")]
#[cfg_attr(docsrs, doc(cfg(feature = "quorum")))]
pub mod quorum;
mod replicas;
mod rounds;
mod served;
mod way;
// The acquire path of every way: above them all, as it gives each its entry.
mod acquire;
// Reading a server's settings.
pub mod diagnostics;
// The guide: how to take, keep and give back a lease (docs only).
#[cfg(all(feature = "quorum", feature = "handoff"))]
pub mod guide {
    #![doc = include_str!("guide.md")]
}
// Metric names (recorded with the `metrics` feature).
pub mod metrics;
// TLS in transit.
#[cfg(feature = "tls")]
pub mod tls;
// The primary found through Redis Sentinel (protocol layer: it opens
// connections).
#[cfg(feature = "sentinel")]
#[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
pub mod sentinel;

#[cfg(test)]
mod give_up_tests;

pub use backend::LockService;
pub use client::client;
pub use connection::Connection;
pub use election::{
    DEFAULT_FAULT_BUDGET, DEFAULT_OBSERVE_EVERY, DEFAULT_STEP_DOWN, DEFAULT_TERM_TTL, Election,
    ElectionBuilder, Leader, Observer, Served, Term, TermOutcome,
};
pub use endpoint::Endpoint;
pub use erased::DynLessor;
pub use error::{ClientError, Error, GiveUpReason, Result, TlsFileRole};
pub use fencing::{FencedKeys, FencingToken, LockKeys, TokenRange};
#[cfg(feature = "handoff")]
#[cfg_attr(docsrs, doc(cfg(feature = "handoff")))]
pub use handoff::{
    DEFAULT_RELAY_LIMIT, HandoffClient, HandoffLocker, HandoffLockerBuilder, HandoffStyle,
};
pub use lease::{Finished, Lease, MAX_TTL};
pub use lessor::Lessor;
pub use locker::{DEFAULT_COMMAND_TIMEOUT, DEFAULT_FENCE_TTL, Locker, LockerBuilder};
pub use lost::LostCause;
#[cfg(feature = "memory")]
#[cfg_attr(docsrs, doc(cfg(feature = "memory")))]
pub use memory::MemoryLocker;
pub use node::RedisConnection;
pub use options::{AcquireOptions, DEFAULT_WAIT};
#[cfg(feature = "quorum")]
#[cfg_attr(docsrs, doc(cfg(feature = "quorum")))]
pub use quorum::{DEFAULT_NODE_TIMEOUT, Quorum, QuorumBuilder};
pub use retry::{RetryStrategy, Waits};
#[cfg(feature = "sentinel")]
#[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
pub use sentinel::Sentinel;
pub use service::Service;
pub use stats::LockerStats;
pub use tls_failure::CertificateProblem;
pub use token::{HolderId, LeaseToken};

/// Re-exported so callers can name the connection and cancellation types
/// without adding matching versions of these crates themselves.
pub use redis;
pub use tokio_util::sync::CancellationToken;
