//! A lock service in memory, for tests: [`MemoryLocker`].
//!
//! A service's own lock logic (what it does when the lock is busy, when
//! the lease is lost mid-work, when the service stalls) is worth testing
//! without a Redis server. A [`MemoryLocker`] is a [`Lessor`](crate::Lessor) like the
//! others: the same [`Lease`](crate::Lease), watchdog, fencing tokens, `with_lock`,
//! `acquire_all` and [`Election`](crate::Election), over a table held in
//! the process, with faults a test causes on purpose. It runs on tokio's
//! clock, so under `#[tokio::test(start_paused = true)]` a test that
//! waits out a TTL takes no time and gives the same result every run.
//!
//! ```
//! use std::time::Duration;
//! use leasehold::{Error, FencedKeys, Lessor, MemoryLocker};
//!
//! /// The user's function under test: pays once under the lock.
//! async fn pay(lock: &impl Lessor, wallet: &str) -> leasehold::Result<u64> {
//!     let keys = FencedKeys::for_resource(wallet)?;
//!     let lease = lock.acquire(&keys, Duration::from_secs(2)).await?;
//!     let fence = lease.fence().map_or(0, |f| f.get());
//!     lease.release().await?;
//!     Ok(fence)
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Error> {
//! let lock = MemoryLocker::new();
//! let first = pay(&lock, "wallet:1").await?;
//! // The store loses its data: the lock and the fence counter with it.
//! lock.lose_data();
//! let second = pay(&lock, "wallet:1").await?;
//! // Tokens repeat after the store lost its counter: what the database
//! // guard (leasehold-pg) is for.
//! assert_eq!(first, second);
//! # Ok(())
//! # }
//! ```
//!
//! # What it is not
//!
//! It is one process's table: it proves what the caller does with the
//! lease, never that two processes exclude each other (for that, test
//! against a real server; the `leasehold-testkit` crate starts throwaway
//! ones). The fence guard of `leasehold-pg` still needs PostgreSQL: a
//! test of the guarded write path runs against a throwaway PostgreSQL
//! (`leasehold_testkit::PostgresServer`), with the locks here or on Redis.
//!
//! # The faults
//!
//! - [`expire`](MemoryLocker::expire): a lease ends now, as if its TTL had
//!   run out (or its key were deleted by hand): the holder's next refresh
//!   or release finds it gone, and its watchdog stops the work.
//! - [`lose_data`](MemoryLocker::lose_data): every lock and fence counter
//!   is gone, as after a restart without persistence: fencing tokens
//!   start again from 1; [`lose_fences`](MemoryLocker::lose_fences): the
//!   counters alone.
//! - [`pause`](MemoryLocker::pause) and [`resume`](MemoryLocker::resume):
//!   the service stops answering; every request waits until it resumes or
//!   its deadline passes ([`Error::Timeout`], naming the service
//!   `memory`), as a paused or partitioned server. Leases run out on the
//!   clock meanwhile, as on a real server.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::backend::{Claim, Held, LockService, Reply, Step};
use crate::error::{Error, Result};
use crate::fencing::FencingToken;
use crate::service::Service;
use crate::token::LeaseToken;

/// The name errors give the in-memory service.
const MEMORY: Service = Service::named("memory");

/// A lock service in memory, for tests (feature `memory`): see the
/// [module docs](self). Clones share one table.
#[derive(Clone, Debug)]
pub struct MemoryLocker {
    store: Arc<Store>,
}

/// The table: locks, fence counters, leader records, and whether the
/// service answers.
#[derive(Debug)]
struct Store {
    state: Mutex<State>,
    /// `true` while paused.
    paused: watch::Sender<bool>,
    command_timeout: Duration,
}

#[derive(Debug, Default)]
struct State {
    /// Lock key to its holder's token and expiry.
    locks: HashMap<String, (LeaseToken, Instant)>,
    /// Fence key to the last token issued.
    fences: HashMap<String, u64>,
    /// Record key to its body.
    records: HashMap<String, String>,
}

impl State {
    /// The holder of `key` now, forgetting an expired one.
    fn holder(&mut self, key: &str, now: Instant) -> Option<&LeaseToken> {
        if self.locks.get(key).is_some_and(|(_, until)| *until <= now) {
            self.locks.remove(key);
        }
        self.locks.get(key).map(|(token, _)| token)
    }

    fn is_ours(&mut self, key: &str, token: &LeaseToken, now: Instant) -> bool {
        self.holder(key, now) == Some(token)
    }
}

impl Default for MemoryLocker {
    fn default() -> Self {
        MemoryLocker::new()
    }
}

impl MemoryLocker {
    /// An empty table, answering, with the default command timeout
    /// ([`DEFAULT_COMMAND_TIMEOUT`](crate::DEFAULT_COMMAND_TIMEOUT)).
    pub fn new() -> MemoryLocker {
        MemoryLocker::build(crate::DEFAULT_COMMAND_TIMEOUT)
    }

    /// An empty table whose requests give up after `timeout` while
    /// [paused](Self::pause) (and bound a release with no tighter
    /// deadline), as a locker's command timeout does.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] for a zero timeout.
    pub fn with_command_timeout(timeout: Duration) -> Result<MemoryLocker> {
        if timeout.is_zero() {
            return Err(Error::InvalidOptions("command_timeout: must be positive"));
        }
        Ok(MemoryLocker::build(timeout))
    }

    fn build(command_timeout: Duration) -> MemoryLocker {
        MemoryLocker {
            store: Arc::new(Store {
                state: Mutex::default(),
                paused: watch::Sender::new(false),
                command_timeout,
            }),
        }
    }

    /// Ends the lease on `key` now, as its TTL running out or a delete by
    /// hand would: the holder's next refresh or release finds it gone
    /// ([`Error::NotHeld`]), its watchdog stops the work
    /// ([`Error::LeaseLost`]), and the next caller takes the lock.
    pub fn expire(&self, key: &str) {
        self.store.state().locks.remove(key);
    }

    /// Forgets every lock, fence counter and leader record, as a store
    /// restarted without persistence: holders find their leases gone, and
    /// fencing tokens start again from 1 (a token repeats, which a
    /// database guard refuses).
    pub fn lose_data(&self) {
        *self.store.state() = State::default();
    }

    /// Forgets every fence counter (the locks stay): the next fencing
    /// tokens start again from 1, below those issued before, as after a
    /// counter lost on its own (evicted, deleted by hand). A database guard
    /// refuses the repeated tokens.
    pub fn lose_fences(&self) {
        self.store.state().fences.clear();
    }

    /// Stops answering: every request waits until [`resume`](Self::resume)
    /// or its deadline ([`Error::Timeout`]). Leases run out meanwhile.
    pub fn pause(&self) {
        self.store.paused.send_replace(true);
    }

    /// Answers again after [`pause`](Self::pause).
    pub fn resume(&self) {
        self.store.paused.send_replace(false);
    }

    /// Whether someone holds `key` now.
    pub fn is_held(&self, key: &str) -> bool {
        self.store.state().holder(key, Instant::now()).is_some()
    }
}

impl Store {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until the service answers, or gives up at `deadline` with
    /// [`Error::Timeout`] for `op`.
    async fn answering(&self, op: &'static str, deadline: Instant) -> Result<()> {
        let start = Instant::now();
        let mut paused = self.paused.subscribe();
        let resumed = paused.wait_for(|paused| !*paused);
        match tokio::time::timeout_at(deadline, resumed).await {
            Ok(_) => Ok(()),
            Err(_elapsed) => Err(Error::Timeout {
                service: MEMORY,
                op,
                after: start.elapsed(),
            }),
        }
    }

    /// Deletes `key` if `token` holds it.
    fn release_now(&self, key: &str, token: &LeaseToken) -> bool {
        let mut state = self.state();
        let ours = state.is_ours(key, token, Instant::now());
        if ours {
            state.locks.remove(key);
        }
        ours
    }
}

/// The table as a lock service: each step asks afresh (no queue), the
/// expiry is decided on tokio's clock, and fence counters can be raised.
impl LockService for MemoryLocker {
    type Entry = ();

    fn service(&self) -> Service {
        MEMORY
    }

    fn command_timeout(&self) -> Duration {
        self.store.command_timeout
    }

    fn step<'a>(&'a self, claim: &'a Claim, _: &'a mut (), deadline: Instant) -> Reply<'a, Step> {
        Box::pin(async move {
            let store = &self.store;
            store.answering("acquire", deadline).await?;
            let now = Instant::now();
            let mut state = store.state();
            if state.holder(claim.key(), now).is_some() {
                return Ok(Step::busy());
            }
            state.locks.insert(
                claim.key().to_owned(),
                (claim.token().clone(), now + claim.ttl()),
            );
            let fence = claim.fence_key().map(|fence_key| {
                let next = state.fences.entry(fence_key.to_owned()).or_insert(0);
                *next += 1;
                FencingToken::new(*next)
            });
            Ok(Step::won(fence))
        })
    }

    fn undo<'a>(&'a self, claim: &'a Claim, _: &'a mut (), deadline: Instant) -> Reply<'a, ()> {
        Box::pin(async move {
            self.store.answering("acquire", deadline).await?;
            self.store.release_now(claim.key(), claim.token());
            Ok(())
        })
    }

    /// No I/O to spawn: the table is at hand. While paused, the lock is
    /// left to its TTL, as on a server that does not answer.
    fn abandon(&self, claim: Claim, (): (), maybe_taken: bool) {
        if maybe_taken && !*self.store.paused.borrow() {
            self.store.release_now(claim.key(), claim.token());
        }
    }

    fn refresh<'a>(&'a self, held: &'a Held, ttl: Duration, deadline: Instant) -> Reply<'a, bool> {
        Box::pin(async move {
            self.store.answering("refresh", deadline).await?;
            let now = Instant::now();
            let mut state = self.store.state();
            if !state.is_ours(held.key(), held.token(), now) {
                return Ok(false);
            }
            state
                .locks
                .insert(held.key().to_owned(), (held.token().clone(), now + ttl));
            Ok(true)
        })
    }

    fn release<'a>(&'a self, held: &'a Held, deadline: Instant) -> Reply<'a, bool> {
        Box::pin(async move {
            self.store.answering("release", deadline).await?;
            Ok(self.store.release_now(held.key(), held.token()))
        })
    }

    fn raise_fence<'a>(
        &'a self,
        fence_key: &'a str,
        at_least: FencingToken,
        deadline: Instant,
    ) -> Reply<'a, ()> {
        Box::pin(async move {
            self.store.answering("raise fence", deadline).await?;
            let mut state = self.store.state();
            let counter = state.fences.entry(fence_key.to_owned()).or_insert(0);
            *counter = (*counter).max(at_least.get());
            Ok(())
        })
    }

    fn announce<'a>(
        &'a self,
        held: &'a Held,
        record_key: &'a str,
        body: &'a str,
        deadline: Instant,
    ) -> Reply<'a, bool> {
        Box::pin(async move {
            self.store.answering("announce", deadline).await?;
            let mut state = self.store.state();
            if !state.is_ours(held.key(), held.token(), Instant::now()) {
                return Ok(false);
            }
            state.records.insert(record_key.to_owned(), body.to_owned());
            Ok(true)
        })
    }

    fn leader_record<'a>(
        &'a self,
        key: &'a str,
        record_key: &'a str,
    ) -> Reply<'a, Option<(String, i64)>> {
        let deadline = Instant::now() + self.store.command_timeout;
        Box::pin(async move {
            self.store.answering("read leader", deadline).await?;
            let now = Instant::now();
            let mut state = self.store.state();
            if state.holder(key, now).is_none() {
                return Ok(None);
            }
            let Some(&(_, until)) = state.locks.get(key) else {
                return Ok(None);
            };
            let pttl =
                i64::try_from(until.saturating_duration_since(now).as_millis()).unwrap_or(i64::MAX);
            Ok(state
                .records
                .get(record_key)
                .map(|body| (body.clone(), pttl)))
        })
    }
}

/// The faults the conformance suite causes, on the table itself.
#[cfg(feature = "conformance")]
impl crate::conformance::Faults for MemoryLocker {
    fn offers(&self) -> crate::conformance::Offered {
        crate::conformance::Offered::ALL
    }

    async fn expire(&self, key: &str) -> Result<()> {
        MemoryLocker::expire(self, key);
        Ok(())
    }

    async fn lose_fence(&self, fence_key: &str) -> Result<()> {
        self.store.state().fences.remove(fence_key);
        Ok(())
    }

    async fn pause(&self) -> Result<()> {
        MemoryLocker::pause(self);
        Ok(())
    }

    async fn resume(&self) -> Result<()> {
        MemoryLocker::resume(self);
        Ok(())
    }
}
