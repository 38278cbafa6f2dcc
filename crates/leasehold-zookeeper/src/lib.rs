//! ZooKeeper as a lock service for [`leasehold`]: [`ZkLocker`].
//!
//! A [`ZkLocker`] is a [`LockService`](leasehold::LockService), so a
//! [`Lessor`](leasehold::Lessor): the same [`Lease`](leasehold::Lease),
//! watchdog, fencing tokens, `acquire_all`, `with_lock` and
//! [`Election`](leasehold::Election) (its leader record too) as every other
//! way of taking a lease, through leasehold's public seam.
//!
//! ```no_run
//! use std::time::Duration;
//! use leasehold::{FencedKeys, Lessor};
//! use leasehold_zookeeper::ZkLocker;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let locker = ZkLocker::builder()
//!     .session_timeout(Duration::from_secs(10))
//!     .root("/apps/billing/locks")
//!     .connect("zk1:2181,zk2:2181,zk3:2181")
//!     .await?;
//! let keys = FencedKeys::for_resource("account:alice")?;
//! let lease = locker.acquire(&keys, Duration::from_secs(5)).await?;
//! let token = lease.fence().ok_or("a fenced lease carries a token")?;
//! // ... write with `token`, checked where the data lives ...
//! # let _ = token;
//! lease.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # When ZooKeeper
//!
//! When a ZooKeeper ensemble is already there (Kafka, Hadoop, HBase, Solr
//! shops), and when JVM services lock with Apache Curator or Python ones
//! with kazoo: a leasehold lock queues with Curator's `InterProcessMutex`
//! and kazoo's `Lock` on the same path (kazoo with
//! [one option](#curator-and-kazoo-on-the-same-lock)). Every lock
//! operation is a write the ensemble commits on a majority (fsync'd on
//! each), so a lock costs more than on a single Redis, and survives the
//! loss of a minority of servers.
//!
//! # What it guarantees
//!
//! **Mutual exclusion while sessions live.** The lock is the lowest
//! ephemeral sequential node in the lock's directory; the node lives as
//! long as the session that made it. The server expires a session a
//! *session timeout* after it last heard from the client, on its own
//! clock. So a holder paused longer than that (a GC pause, a frozen VM, a
//! partition) can wake up believing it holds a lock the ensemble has
//! already given to the next contender. That is why the lock is an
//! *efficiency* lock, and why the fencing token matters.
//!
//! **The TTL rule.** A lease of TTL `t` is counted valid from the send time
//! of the last request the ensemble answered for it (the win, or the
//! watchdog's refresh: a read that finds our node still there and owned by
//! our session). The server heard from us after that send time, so the
//! session, and our node with it, lives for at least the negotiated
//! session timeout after it: a TTL no longer than the negotiated session
//! timeout is honoured ([`ZkLocker::session_timeout`]), and a longer one
//! is refused before any I/O ([`leasehold::Error::InvalidOptions`]), never
//! cut. The holder's blind spot after a pause is therefore bounded by its
//! TTL, as on Redis.
//!
//! **Fencing tokens that grow.** A fenced lease's token is its node's
//! creation zxid (`czxid`). Contenders are served in sequence order, and a
//! node's sequence and its zxid grow together, so every holder's token is
//! above every earlier holder's, while the ensemble keeps its data. The
//! database checks it on every write (the `leasehold-pg` guard refuses a
//! holder older than one that has written), which keeps the data right
//! when the lock does not. A zxid cannot be raised, so the token is
//! guarded in a fence row of its own, `zk:` and the fence key
//! ([`Lease::fence_key_for`](leasehold::Lease::fence_key_for)), never
//! compared with another service's tokens; `raise_fence` is refused. A
//! rebuilt (emptied) ensemble restarts its zxids below the stored fence:
//! see [A rebuilt ensemble](#a-rebuilt-ensemble) for the way back.
//!
//! **A node deleted by hand is a lost lease, at once.** A lease's watchdog
//! watches the holder's own node
//! ([`LockService::watch_held`](leasehold::LockService::watch_held)): when
//! an operator's `deleteall` or a script removes it, or its session ends,
//! the watchdog refreshes there and then instead of up to a third of the
//! TTL later, and that refresh, finding the node gone, ends the lease as
//! lost ([`LostCause::Expired`](leasehold::LostCause::Expired)): the work's
//! token fires. A watch that fires for anything else (a fault while setting
//! it) costs that one refresh, never the lease. The next contender may
//! hold the lock by the time the holder hears of it: the watch narrows the
//! overlap to about a round trip, the fence still guards the data.
//!
//! **Nothing left behind.** A waiter that gives up, is cancelled or
//! dropped, or whose create's answer was lost, has its node found again by
//! the acquire's unique prefix and deleted, in the background while its
//! session lives: an orphan node would hold the lock for the session's
//! whole life. Every request is bounded by the caller's deadline; one cut
//! short whose outcome is unknown is never reported as a success.
//!
//! # A rebuilt ensemble
//!
//! An ensemble rebuilt empty, or restored from a backup older than its
//! last writes, starts its zxids again: every new holder's token is then
//! below the fence the guard stored, and the guard refuses them all, for
//! as long as that fence stands. Deleting the fence rows is not the way
//! back: a holder from before the rebuild, with its larger token, would
//! then be accepted over the new holders' writes.
//!
//! The way back is the locker's **generation**
//! ([`ZkLockerBuilder::generation`]): a token is `generation * 2^56 +
//! czxid`, so every token of generation `g + 1` is above every token of
//! generation `g`, whatever the ensembles' zxids (a zxid stays below 2^56
//! until its ensemble has had 2^24 leader elections; a lock whose czxid
//! does not fit is refused, never given a token that could wrap).
//!
//! 1. Rebuild or restore the ensemble.
//! 2. Give every client of it the next generation (0 by default, so the
//!    first rebuild is `.generation(1)`; at most [`MAX_GENERATION`]) and
//!    restart them.
//! 3. Nothing else: the guard takes the new holders' tokens (above every
//!    stored fence), and refuses a holder still on the old generation (a
//!    lease taken before the rebuild, a client not yet restarted) once a
//!    holder of the new one has written to the resource. Until a client
//!    is restarted its writes are refused, never accepted over newer ones.
//!
//! Keep the generation in the clients' configuration with the connect
//! string: a client started later with an older one is refused as above.
//! Tested in tests/rebuilt.rs,
//! `after_a_rebuild_the_next_generation_is_accepted_and_the_old_one_refused`
//! (a rebuilt ensemble's holder refused at generation 0; at generation 1
//! accepted, and then both the holder from before the rebuild and a
//! client still at generation 0 refused).
//!
//! # The layout (Curator's)
//!
//! - A lock key `k` is the directory `<root>/<k>` ([`DEFAULT_ROOT`] is
//!   `/leasehold`; [`ZkLocker::lock_path`] gives it): letters, digits and
//!   `-_.:{}@=+,` stay as they are, every other byte is `%XX` (so `/`
//!   never makes a subtree). Directories are created as containers, which
//!   the server removes once empty.
//! - Each contender is an `EPHEMERAL_SEQUENTIAL` node
//!   `_c_<uuid>-lock-<sequence>`, as Curator's protected creates name
//!   theirs; the uuid is the acquire's public
//!   [`HolderId`](leasehold::HolderId), never its secret token.
//! - Contenders are ordered by the ten-digit sequence at the end of their
//!   names whatever the prefix, so Curator's `_c_...-lock-` and kazoo's
//!   `__lock__` nodes interleave correctly with ours.
//! - A waiter watches only the contender just ahead of it (no herd), and
//!   lists the directory again when that one goes (it may have been a
//!   waiter that gave up).
//! - An election's leader record is in the holder's own node's data
//!   (written only while the node exists); a reader returns it with its own
//!   negotiated session timeout as the time to live, since ZooKeeper does
//!   not tell one client how long another's session has left.
//!
//! # Curator and kazoo on the same lock
//!
//! Give the other recipe the lock's directory, [`ZkLocker::lock_path`]
//! (`/leasehold/<key>` by default).
//!
//! - **Curator**'s `InterProcessMutex` needs nothing: its nodes are ours
//!   (tests/curator.rs, `curator_and_leasehold_exclude_each_other`, on
//!   Debian's Curator 5.4.0).
//! - **kazoo**'s `Lock` needs `extra_lock_patterns=["-lock-"]`. kazoo
//!   names its contenders `<uuid>__lock__<sequence>` and counts as
//!   contenders only the children matching `(?:<patterns>)(-?\d{10})$`,
//!   its own `__lock__` and the extra patterns (regular expressions,
//!   kazoo 2.7.1 and later). Without the pattern it does not see a
//!   leasehold (or Curator) holder and takes the lock beside it. leasehold
//!   needs nothing either way: kazoo's nodes end in the sequence too.
//!
//! ```python
//! # ZkLocker::lock_path("jobs:nightly") on the Rust side
//! lock = zk.Lock("/leasehold/jobs:nightly", "report-worker",
//!                extra_lock_patterns=["-lock-"])
//! with lock:  # waits behind a leasehold holder, and it behind us
//!     ...
//! ```
//!
//! Tested against Debian's python3-kazoo 2.8.0 in tests/kazoo.rs:
//! `kazoo_with_the_curator_pattern_and_leasehold_exclude_each_other`
//! (whichever holds first, the other waits; kazoo waits behind leasehold's
//! node; its `acquire(timeout=...)` raises `LockTimeout` rather than
//! returning `False`) and
//! `kazoo_without_the_pattern_takes_the_lock_beside_leasehold`.
//!
//! # The client: `zookeeper-client`
//!
//! The connection is kezhuw's [`zookeeper_client`]: async from the ground up
//! (no thread per session, no callbacks; futures and one-shot watchers), it
//! keeps the session across reconnections to any member, reports session
//! expiry as a state and an error, flags the invalid `Stat` that ZooKeeper
//! before 3.8.2 returns from some creates (ZOOKEEPER-4026; the node's own
//! `Stat` is then read back), and is maintained against current ZooKeeper
//! releases. The older `zookeeper` crate is synchronous (a thread per
//! client, callbacks for watches); `zookeeper-async` is a port of it.
//!
//! # Not yet
//!
//! TLS and SASL (the client has them behind features this crate does not
//! turn on yet). (The chaos verifier runs this locker: `leasehold chaos
//! --modes zookeeper,zookeeper-blind,zookeeper-curator`, docs/chaos.md,
//! "ZooKeeper".)

mod fault;
mod layout;
mod locker;
mod service;

pub use locker::{
    DEFAULT_ROOT, DEFAULT_SESSION_TIMEOUT, DEFAULT_ZK_COMMAND_TIMEOUT, MAX_GENERATION, ZkLocker,
    ZkLockerBuilder,
};

/// The README's example, compiled as a doctest (the crate docs above are
/// the reference; the README is the repository and crates.io page).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
