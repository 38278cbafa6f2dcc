//! Building an [`Election`]: its settings, checked once by
//! [`ElectionBuilder::build`].

use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::fencing::FencedKeys;
use crate::lessor::Lessor;
use crate::options::AcquireOptions;
use crate::retry::RetryStrategy;

use tokio_util::sync::CancellationToken;

use super::{
    DEFAULT_FAULT_BUDGET, DEFAULT_OBSERVE_EVERY, DEFAULT_STEP_DOWN, DEFAULT_TERM_TTL, Election,
    Inner,
};

#[cfg(doc)]
use super::Observer;

impl<L: Lessor> Election<L> {
    /// An election named `name` over `lessor` (a [`Locker`](crate::Locker),
    /// [`HandoffLocker`](crate::HandoffLocker), [`Quorum`](crate::Quorum),
    /// `MemoryLocker` (feature `memory`), or a lessor of another crate:
    /// `leasehold-etcd`'s `EtcdLocker`, `leasehold-pg`'s `PgLocker`,
    /// `leasehold-zookeeper`'s `ZkLocker`, any
    /// [`LockService`](crate::LockService) that keeps a leader record).
    /// Its lock is `lock:{leader:<name>}`, its fence counter
    /// `fence:{leader:<name>}` and its leader record
    /// `lock:{leader:<name>}:leader` (one slot; the README's ACL covers
    /// them).
    pub fn builder(lessor: L, name: impl Into<String>) -> ElectionBuilder<L> {
        ElectionBuilder {
            lessor,
            name: name.into(),
            candidate: None,
            ttl: DEFAULT_TERM_TTL,
            budget: DEFAULT_FAULT_BUDGET,
            options: AcquireOptions::new(),
            observe_every: DEFAULT_OBSERVE_EVERY,
            step_down: DEFAULT_STEP_DOWN,
        }
    }
}

/// Builds an [`Election`]: [`Election::builder`], the setters, then
/// [`build`](Self::build).
#[must_use]
#[derive(Debug)]
pub struct ElectionBuilder<L> {
    lessor: L,
    name: String,
    candidate: Option<String>,
    ttl: Duration,
    budget: Duration,
    options: AcquireOptions,
    observe_every: Duration,
    step_down: Duration,
}

impl<L: Lessor> ElectionBuilder<L> {
    /// The name this process campaigns under: what [`Election::leader`]
    /// and [`Observer`]s report, and what the `elected` event logs. Not
    /// checked for uniqueness: give each process its own (a host name and
    /// a process id, a pod name). Must not be empty.
    ///
    /// Defaults to `pid <process id>`.
    pub fn candidate(mut self, candidate: impl Into<String>) -> Self {
        self.candidate = Some(candidate.into());
        self
    }

    /// A term's lease TTL: a leader that stops without resigning is
    /// replaced within it. The watchdog refreshes every `ttl / 3`.
    ///
    /// Defaults to [`DEFAULT_TERM_TTL`] (10 s).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long a campaign (or an observer) rides out faults before
    /// returning one: faults must keep every acquire round from winning
    /// for this long. Must be positive.
    ///
    /// Defaults to [`DEFAULT_FAULT_BUDGET`] (30 s).
    pub fn budget(mut self, budget: Duration) -> Self {
        self.budget = budget;
        self
    }

    /// How often a follower tries again (on a way whose followers poll:
    /// [`Locker`](crate::Locker), [`Quorum`](crate::Quorum)). A strategy
    /// that gives up before its deadline (`none()`, `max_attempts`) is
    /// refused by [`build`](Self::build): a follower keeps waiting. How
    /// long each acquire of a campaign waits is the campaign's own.
    ///
    /// Defaults to [`RetryStrategy::default`] (5 to 15 ms apart).
    pub fn retry(mut self, retry: RetryStrategy) -> Self {
        self.options = self.options.retry(retry);
        self
    }

    /// Each term's lease is confirmed by `replicas` replicas within
    /// `timeout`, as [`AcquireOptions::wait_replicas`] says (on a way
    /// without replicas, the campaign's first acquire returns
    /// [`Error::InvalidOptions`]).
    ///
    /// Defaults to no replica wait.
    pub fn wait_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.options = self.options.wait_replicas(replicas, timeout);
        self
    }

    /// Cancelling `token` ends a campaign (and an observer's wait) with
    /// [`Error::NotAcquired`] (reason `Cancelled`).
    ///
    /// Defaults to none.
    pub fn cancel(mut self, token: CancellationToken) -> Self {
        self.options = self.options.cancel(token);
        self
    }

    /// How often an [`Observer`] asks who leads. Must be positive.
    ///
    /// Defaults to [`DEFAULT_OBSERVE_EVERY`] (100 ms).
    pub fn observe_every(mut self, every: Duration) -> Self {
        self.observe_every = every;
        self
    }

    /// How long a candidate that resigned waits before it campaigns
    /// again, on a way whose followers poll ([`Locker`](crate::Locker),
    /// [`Quorum`](crate::Quorum)): a resigner that campaigned at once
    /// would usually win its own lock back before a follower's next
    /// attempt, and resigning would hand nothing on. Set it above the
    /// followers' longest wait between attempts. A
    /// [`HandoffLocker`](crate::HandoffLocker) hands the lock to the first
    /// waiting candidate in the resign itself, so it never waits.
    ///
    /// Defaults to [`DEFAULT_STEP_DOWN`] (50 ms, above the default 5 to
    /// 15 ms between attempts).
    pub fn step_down(mut self, pause: Duration) -> Self {
        self.step_down = pause;
        self
    }

    /// The election, checked. No I/O.
    ///
    /// # Errors
    /// - [`Error::InvalidKey`] for an empty name (or one whose keys would
    ///   not share a slot);
    /// - [`Error::InvalidTtl`] for a TTL Redis would refuse;
    /// - [`Error::InvalidOptions`] for an empty candidate, a zero budget or
    ///   observation period, or a retry strategy that gives up early (see
    ///   [`retry`](Self::retry)).
    pub fn build(self) -> Result<Election<L>> {
        if self.name.is_empty() {
            return Err(Error::InvalidKey {
                key: String::new(),
                reason: "election name is empty",
            });
        }
        crate::lease::check_ttl(self.ttl)?;
        let candidate = self
            .candidate
            .unwrap_or_else(|| format!("pid {}", std::process::id()));
        if candidate.is_empty() {
            return Err(Error::InvalidOptions(
                "election: the candidate name is empty",
            ));
        }
        if self.budget.is_zero() {
            return Err(Error::InvalidOptions(
                "election: the fault budget must be positive",
            ));
        }
        if self.observe_every.is_zero() {
            return Err(Error::InvalidOptions(
                "election: the observation period must be positive",
            ));
        }
        if self.options.retry.gives_up_early() {
            return Err(Error::InvalidOptions(
                "election: a retry strategy that gives up before the deadline would make followers spin",
            ));
        }
        let keys = FencedKeys::for_resource(&format!("leader:{}", self.name))?;
        let record_key = format!("{}:leader", keys.lock());
        Ok(Election {
            inner: Arc::new(Inner {
                lessor: self.lessor,
                name: self.name,
                candidate,
                keys,
                record_key,
                ttl: self.ttl,
                budget: self.budget,
                options: self.options.watchdog(true),
                observe_every: self.observe_every,
                step_down: self.step_down,
                resigned_at: Arc::default(),
            }),
        })
    }
}
