//! Redlock: one lease over several independent Redis servers.
//!
//! # Why a quorum
//!
//! A single Redis server is a single point of failure for the lock, and a
//! replicated one is worse than it looks: replication is asynchronous, so a
//! primary can acknowledge a lock and die before its replica has it; the
//! promoted replica then grants the same lock to someone else. Redlock takes
//! the lock on a majority of `N` *independent* servers (no replication
//! between them), so losing a minority loses no lock.
//!
//! # The algorithm
//!
//! Each attempt sends the acquire (`SET NX PX` plus a read of that node's
//! fence counter, one script) to every node at once, each bounded by a short
//! per-node timeout. A node that errors or times out is a missing vote; it
//! never aborts the attempt. As soon as a majority has voted yes the attempt
//! goes on without waiting for the rest (their requests finish in the
//! background), so a paused node does not slow every lease down by the node
//! timeout; only a failing attempt waits for every answer before it
//! releases everywhere. The attempt wins when a majority voted yes and
//! the remaining validity is positive:
//!
//! ```text
//! validity = ttl - elapsed - drift,   drift = ttl / 100 + 2 ms
//! ```
//!
//! where `elapsed` runs from before the first request was sent. Otherwise the
//! lock is released on *every* node (a node that timed out may still have
//! said yes) and the attempt counts as busy.
//!
//! # Fencing tokens over a quorum
//!
//! A quorum lease also gets a fencing token, in two rounds:
//!
//! 1. each yes vote carries `max(that node's fence counter, its clock in
//!    microseconds)`; the token is one more than the highest vote;
//! 2. the token is written to every node (`counter = max(counter, token)`),
//!    and the write *counts* only on nodes where our lock still holds our
//!    token; a majority must count, or the attempt fails.
//!
//! **The argument.** Let lease L1 get token `t1`, recorded on a majority W1
//! while L1 held the lock on each of those nodes. A later lease L2 wins on a
//! majority R2; W1 and R2 share at least one node `w`. L2 could only take
//! the lock on `w` after L1's key on `w` was gone, which is after L1's
//! lock-checked write of `t1` on `w`. So L2 reads a counter of at least `t1`
//! from `w`, and `t2 >= t1 + 1`: tokens increase with every lease.
//!
//! **When the nodes forget.** The argument needs `w` to still remember
//! `t1`. A node that restarts with an empty dataset (no persistence, or
//! `appendfsync` other than `always`) or fails over to a stale replica
//! breaks it, and that is what the clock in each vote is for: `t1` came
//! from votes no later than the clocks of the nodes that cast them when
//! L1 took the lock, so a node that forgot votes its clock now, which is
//! above `t1` as long as the nodes' clocks differ by less than the time
//! between the two acquires (see [`FencingToken`] for the whole
//! assumption). Like Redlock itself, the token also assumes that the
//! holder's pauses and clock rates stay small relative to the TTL. That is
//! why the token is checked where the write happens: with the database's
//! strict `fence < $token`, a token that went backwards is *refused*
//! (availability suffers, the balance does not), the `leasehold-pg` guard
//! accepts a repeated token only from its first writer, and the
//! check-and-set on the version read (`fence = $read`) keeps the balance
//! right even when two holders overlap.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;

use std::future::Future;

use crate::budget::Budget;
use crate::compare::Step;
use crate::connection::Connection;
use crate::error::{Error, GiveUpReason, Result};
use crate::fencing::{FencedKeys, FencingToken, LockKeys, Target};
use crate::lease::{Backend, Lease, Part, Reply};
use crate::lessor::Lessor;
use crate::node::{Attempt, Node, RedisConnection, ttl_millis};
use crate::options::{AcquireOptions, Supports};
use crate::rounds;
use crate::token::LeaseToken;
use crate::watchdog::Margin;
use crate::way::{self, Way};
use crate::{call, scripts};

/// How long one node may take to answer one request when the caller's
/// deadline is further away: 50 ms. Keep it well below the TTL, so that a
/// dead node costs little of the lease's validity.
pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(50);

/// The votes needed among `nodes`: a strict majority.
pub(crate) const fn majority(nodes: usize) -> usize {
    nodes / 2 + 1
}

/// The clock drift allowance of a lease of `ttl`: 1 % of the TTL plus 2 ms.
pub(crate) fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// The time a quorum lease of `ttl` is still safe to use after an acquire
/// that took `elapsed`: `ttl - elapsed - drift(ttl)`, or `None` when that is
/// not positive (the lease may already have expired on some node).
pub(crate) fn validity(ttl: Duration, elapsed: Duration) -> Option<Duration> {
    ttl.checked_sub(elapsed)
        .and_then(|left| left.checked_sub(drift(ttl)))
        .filter(|left| !left.is_zero())
}

/// Takes leases on a majority of independent Redis servers (Redlock).
///
/// Cheap to clone. Use an odd number of nodes (3 or 5): an even number
/// tolerates no more failures than the odd number below it.
#[derive(Clone)]
pub struct Quorum<C = Connection> {
    inner: Arc<QuorumInner<C>>,
}

struct QuorumInner<C> {
    nodes: Vec<Arc<Node<C>>>,
    node_timeout: Duration,
}

impl<C> std::fmt::Debug for Quorum<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Quorum")
            .field("nodes", &self.inner.nodes.len())
            .field("node_timeout", &self.inner.node_timeout)
            .finish()
    }
}

/// Builds a [`Quorum`] with non-default settings:
/// [`connect`](Self::connect) opens its own connections,
/// [`build`](Self::build) takes one of yours per server.
///
/// ```no_run
/// # async fn demo(clients: Vec<redis::Client>) -> leasehold::Result<()> {
/// use std::time::Duration;
/// use leasehold::Quorum;
///
/// let quorum = Quorum::builder()
///     .node_timeout(Duration::from_millis(20))
///     .connect(clients)
///     .await?;
/// # let _ = quorum;
/// # Ok(())
/// # }
/// ```
#[must_use]
#[derive(Debug, Clone)]
pub struct QuorumBuilder {
    node_timeout: Duration,
    fence_ttl: Option<Duration>,
}

impl QuorumBuilder {
    /// How long a fence counter lives on each node after its last use; see
    /// [`LockerBuilder::fence_ttl`](crate::LockerBuilder::fence_ttl).
    ///
    /// Defaults to [`DEFAULT_FENCE_TTL`](crate::DEFAULT_FENCE_TTL) (30
    /// days).
    pub fn fence_ttl(mut self, ttl: Option<Duration>) -> Self {
        self.fence_ttl = ttl;
        self
    }

    /// Bounds each request to each node; the connections
    /// [`connect`](Self::connect) opens also connect, and bound each
    /// response, within it.
    ///
    /// Defaults to [`DEFAULT_NODE_TIMEOUT`] (50 ms).
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = timeout;
        self
    }

    /// Rejects settings no quorum can use, and an empty list. No I/O.
    fn check(&self, nodes: usize) -> Result<()> {
        if nodes == 0 {
            return Err(Error::InvalidOptions("a quorum needs at least one node"));
        }
        crate::locker::check_fence_ttl(self.fence_ttl)?;
        if self.node_timeout.is_zero() {
            return Err(Error::InvalidOptions("node timeout must be positive"));
        }
        Ok(())
    }

    /// Checks the settings and builds the quorum over `clients`, one per
    /// independent server, with lazily established, self-reconnecting
    /// [`Connection`]s: a server that is down now (or refuses our
    /// credentials) is a missing vote, not an error, and counts again once
    /// it is back (or accepts them). No I/O happens here.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] for no clients, a zero node timeout or
    /// fence TTL.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is sent.
    pub async fn connect(self, clients: Vec<redis::Client>) -> Result<Quorum<Connection>> {
        self.check(clients.len())?;
        let nodes = clients
            .into_iter()
            .map(|client| Connection::lazy(client.into(), self.node_timeout, 1))
            .collect();
        self.build(nodes)
    }

    /// Checks the settings and builds the quorum over `nodes`, one
    /// connection of yours per independent server. No I/O.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] for no nodes, a zero node timeout or fence
    /// TTL.
    pub fn build<C: RedisConnection>(self, nodes: Vec<C>) -> Result<Quorum<C>> {
        self.check(nodes.len())?;
        let nodes = nodes
            .into_iter()
            .map(|conn| Arc::new(Node::new(conn, self.node_timeout, self.fence_ttl)))
            .collect();
        Ok(Quorum {
            inner: Arc::new(QuorumInner {
                nodes,
                node_timeout: self.node_timeout,
            }),
        })
    }
}

impl Quorum<Connection> {
    /// A quorum with default settings over `clients`, one per independent
    /// server, with lazily established, self-reconnecting connections:
    /// `Quorum::builder().connect(clients)`. A server that is down now is
    /// a missing vote, not an error, and counts again once it is back.
    ///
    /// # Errors
    /// As [`QuorumBuilder::connect`]. No I/O happens here.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is sent.
    pub async fn connect(clients: Vec<redis::Client>) -> Result<Self> {
        Quorum::builder().connect(clients).await
    }

    /// A builder for non-default settings, which then opens its own
    /// connections ([`QuorumBuilder::connect`]) or takes yours
    /// ([`QuorumBuilder::build`]).
    pub fn builder() -> QuorumBuilder {
        QuorumBuilder {
            node_timeout: DEFAULT_NODE_TIMEOUT,
            fence_ttl: Some(crate::DEFAULT_FENCE_TTL),
        }
    }
}

impl<C: RedisConnection> Way for Quorum<C> {
    /// A quorum honours every option but `wait_replicas` (its servers are
    /// independent, not replicas of each other).
    const SUPPORTS: Supports = Supports {
        wait_replicas: false,
    };

    const MODE: &'static str = "quorum";

    async fn take(
        &self,
        target: Target,
        ttl: Duration,
        opts: &AcquireOptions,
        budget: Budget,
    ) -> Result<Lease> {
        self.take_one(target, ttl, opts, budget).await
    }

    fn command_timeout(&self) -> Duration {
        self.inner.node_timeout
    }
}

impl<C: RedisConnection> Quorum<C> {
    /// How many servers must agree: a strict majority.
    pub fn needed(&self) -> usize {
        self.inner.needed()
    }

    /// Takes the lease on `keys` for `ttl` with the default
    /// [`AcquireOptions`].
    ///
    /// See [`acquire_with`](Self::acquire_with) for errors and cancel safety.
    pub async fn acquire(&self, keys: impl LockKeys, ttl: Duration) -> Result<Lease> {
        self.acquire_with(keys, ttl, &AcquireOptions::default())
            .await
    }

    /// Takes the lease on `keys` for `ttl` on a majority of the servers,
    /// retrying as `opts` says; given [`FencedKeys`], with a fencing token
    /// (see the [module docs](self) for how it grows). The same keys are
    /// used on every node. The lease's validity is the TTL less the time
    /// the winning attempt took less the drift allowance, and a refresh
    /// (yours or the watchdog's) must reach a majority.
    ///
    /// # Errors
    /// [`Error::InvalidTtl`] / [`Error::InvalidKey`] before any I/O, and
    /// [`Error::InvalidOptions`] when `opts` asks to
    /// [wait for replicas](AcquireOptions::wait_replicas) (a quorum's
    /// servers are independent; that option is for a replicated server);
    /// [`Error::NotAcquired`] when the lock stayed busy;
    /// [`Error::QuorumNotReached`] when, in the last attempt, too many nodes
    /// failed to answer for a majority to be possible.
    ///
    /// # Cancel safety
    /// Cancel safe: if the future is dropped mid-attempt, the lock is
    /// released on every node in the background; the TTL is the fallback.
    pub async fn acquire_with(
        &self,
        keys: impl LockKeys,
        ttl: Duration,
        opts: &AcquireOptions,
    ) -> Result<Lease> {
        way::acquire_with(self, keys, ttl, opts).await
    }

    /// Takes the leases on every one of `keys` on a majority, in one global
    /// order, as one [`Lease`]; see [`Locker::acquire_all`](crate::Locker::acquire_all).
    ///
    /// # Errors
    /// As [`Locker::acquire_all`](crate::Locker::acquire_all).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`acquire_with`](Self::acquire_with).
    pub async fn acquire_all<K: LockKeys>(
        &self,
        keys: impl IntoIterator<Item = K>,
        ttl: Duration,
        opts: &AcquireOptions,
    ) -> Result<Lease> {
        way::acquire_all_of(self, keys, ttl, opts).await
    }

    /// Takes the lease on `keys` on a majority, runs `work` while it is held
    /// and releases it; see [`Locker::with_lock`](crate::Locker::with_lock).
    ///
    /// # Errors
    /// As [`Locker::with_lock`](crate::Locker::with_lock).
    ///
    /// # Cancel safety
    /// As [`Locker::with_lock`](crate::Locker::with_lock).
    pub async fn with_lock<T>(
        &self,
        keys: impl LockKeys,
        ttl: Duration,
        opts: &AcquireOptions,
        work: impl AsyncFnOnce(&Lease) -> T,
    ) -> Result<crate::Finished<T>> {
        Lessor::with_lock(self, keys, ttl, opts, work).await
    }

    async fn take_one(
        &self,
        target: Target,
        ttl: Duration,
        opts: &AcquireOptions,
        budget: Budget,
    ) -> Result<Lease> {
        let token = LeaseToken::generate()?;
        let last_round = std::sync::Mutex::new(Round::default());
        let inner = &self.inner;
        let outcome = rounds::acquire_rounds(
            &target.lock,
            opts,
            budget,
            // Two rounds of votes plus a cleanup round per attempt.
            inner.node_timeout * 3,
            |deadline| inner.attempt(&target, &token, ttl, deadline, &last_round),
            // An attempt undoes its own votes before it returns; this is for
            // one that failed half-way, if ever.
            |_deadline| async {
                inner
                    .release_all(&target.lock, &token, |deleted| *deleted)
                    .await;
                Ok(())
            },
            || inner.spawn_release_all(&target.lock, &token),
        )
        .await;
        match outcome {
            Ok((fence, sent_at)) => {
                let part = Part {
                    key: target.lock,
                    token,
                    fence_key: target.fence,
                    fence,
                };
                Ok(Lease::new(self.inner.clone(), part, ttl, sent_at))
            }
            Err(Error::NotAcquired {
                key,
                attempts,
                waited,
                reason,
            }) if reason != GiveUpReason::Cancelled => {
                let round = last_round.lock().map(|r| *r).unwrap_or_default();
                if self.inner.nodes.len() - round.failed < self.needed() {
                    Err(Error::QuorumNotReached {
                        key,
                        got: round.votes,
                        needed: self.needed(),
                        failed_nodes: round.failed,
                    })
                } else {
                    Err(Error::NotAcquired {
                        key,
                        attempts,
                        waited,
                        reason,
                    })
                }
            }
            Err(other) => Err(other),
        }
    }
}

impl<C: RedisConnection> QuorumInner<C> {
    fn needed(&self) -> usize {
        majority(self.nodes.len())
    }

    /// One round: votes from every node, then (fenced) the fence write.
    async fn attempt(
        &self,
        target: &Target,
        token: &LeaseToken,
        ttl: Duration,
        deadline: Instant,
        last_round: &std::sync::Mutex<Round>,
    ) -> Result<Attempt<Option<FencingToken>>> {
        let started = Instant::now();
        let node_deadline = deadline.min(started + self.node_timeout);
        let px = ttl_millis(ttl);
        let fenced = target.fenced();
        // Nodes whose counter is no counter (NOTFENCE), and one such
        // refusal: reported as such when they cost the majority (the lock
        // cannot be taken until the counters are fixed), not as missing
        // votes to retry.
        let mut not_a_counter = (0, None);
        // Nodes that refused for memory (`OOM`), and one such refusal.
        let mut full = (0, None);
        let (yes, failed, counter) = match &fenced {
            Some(keys) => {
                let votes: Vec<Result<Option<u64>>> = self
                    .script_on_every_node(
                        NodeStep::Vote,
                        keys,
                        token,
                        px,
                        node_deadline,
                        Option::is_some,
                    )
                    .await;
                let failed = votes.iter().filter(|v| v.is_err()).count();
                let mut counters = Vec::new();
                for vote in votes {
                    match vote {
                        Ok(Some(counter)) => counters.push(counter),
                        Ok(None) => {}
                        Err(err @ Error::OutOfMemory { .. }) => {
                            full = (full.0 + 1, Some(err));
                        }
                        Err(err) => {
                            if let Some(err) = bad_fence(err, keys) {
                                not_a_counter = (not_a_counter.0 + 1, Some(err));
                            }
                        }
                    }
                }
                let max = counters.iter().copied().max().unwrap_or(0);
                (counters.len(), failed, Some(max))
            }
            None => {
                let votes = self
                    .on_every_node(
                        |node| {
                            let (key, token) = (target.lock.clone(), token.clone());
                            async move {
                                let won = node.set_nx(&key, &token, px, node_deadline).await?;
                                Ok(matches!(won, Attempt::Won(())))
                            }
                        },
                        |won| *won,
                    )
                    .await;
                let failed = votes.iter().filter(|v| v.is_err()).count();
                let yes = votes.iter().filter(|v| matches!(v, Ok(true))).count();
                for vote in votes {
                    if let Err(err @ Error::OutOfMemory { .. }) = vote {
                        full = (full.0 + 1, Some(err));
                    }
                }
                (yes, failed, None)
            }
        };
        // Every node that failed was full, and that cost the majority: a
        // full server, which the acquire rides out (and names if its wait
        // runs out), not a quorum lost to unreachable nodes.
        if let (oom, Some(err)) = full
            && oom == failed
            && self.nodes.len() - failed < self.needed()
        {
            self.release_all(&target.lock, token, |deleted| *deleted)
                .await;
            return Err(err);
        }
        if let Ok(mut round) = last_round.lock() {
            *round = Round { votes: yes, failed };
        }
        if yes >= self.needed() && validity(ttl, started.elapsed()).is_some() {
            match (&fenced, counter) {
                (Some(keys), Some(max)) => {
                    // Each vote is at most FencingToken::MAX (its script
                    // refuses a counter beyond), so this stays in range or
                    // the script recording it refuses it.
                    let fence = max.saturating_add(1);
                    let (confirmed, refused) =
                        self.record_fence(keys, token, fence, deadline).await;
                    if confirmed >= self.needed() && validity(ttl, started.elapsed()).is_some() {
                        return Ok(Attempt::Won(Some(FencingToken::new(fence))));
                    }
                    if let (n, Some(err)) = refused {
                        not_a_counter = (not_a_counter.0.max(n), Some(err));
                    }
                }
                _ => return Ok(Attempt::Won(None)),
            }
        }
        // Undo every yes vote, including any from nodes that timed out.
        self.release_all(&target.lock, token, |deleted| *deleted)
            .await;
        match not_a_counter {
            (n, Some(err)) if self.nodes.len() - n < self.needed() => Err(err),
            _ => Ok(Attempt::Busy),
        }
    }

    /// Writes `fence` to every node's counter: how many nodes counted it
    /// (our lock still held there), and how many refused the counter (not
    /// one, or `fence` out of range) with one such refusal.
    async fn record_fence(
        &self,
        keys: &FencedKeys,
        token: &LeaseToken,
        fence: u64,
        deadline: Instant,
    ) -> (usize, (usize, Option<Error>)) {
        let node_deadline = deadline.min(Instant::now() + self.node_timeout);
        let outcomes = self
            .script_on_every_node::<i64>(
                NodeStep::Fence,
                keys,
                token,
                fence,
                node_deadline,
                |counted| *counted == 1,
            )
            .await;
        let mut counted = 0;
        let mut refused = (0, None);
        for outcome in outcomes {
            match outcome {
                Ok(1) => counted += 1,
                Ok(_) => {}
                Err(err) => {
                    if let Some(err) = bad_fence(err, keys) {
                        refused = (refused.0 + 1, Some(err));
                    }
                }
            }
        }
        (counted, refused)
    }

    /// Runs one of the quorum scripts on every node.
    async fn script_on_every_node<T>(
        &self,
        step: NodeStep,
        keys: &FencedKeys,
        token: &LeaseToken,
        arg: u64,
        deadline: Instant,
        enough: impl Fn(&T) -> bool,
    ) -> Vec<Result<T>>
    where
        T: redis::FromRedisValue + Send + 'static,
    {
        self.on_every_node(
            |node| {
                let keys = keys.clone();
                let token = token.clone();
                async move {
                    let mut conn = node.conn();
                    let mut invocation = step.script().key(keys.lock());
                    invocation
                        .key(keys.fence())
                        .arg(&token)
                        .arg(arg)
                        .arg(node.fence_ttl_ms());
                    call::bounded(
                        step.op(),
                        keys.lock(),
                        deadline,
                        invocation.invoke_async::<T>(&mut conn),
                    )
                    .await
                }
            },
            enough,
        )
        .await
    }

    /// Runs `step` (release or refresh) on every node: (acted, failed).
    /// `fence_key`: the lock's counter, which a refresh keeps alive.
    async fn checked_on_every_node(
        &self,
        step: Step,
        key: &str,
        fence_key: Option<&str>,
        token: &LeaseToken,
        enough: impl Fn(&bool) -> bool,
    ) -> (usize, usize) {
        let node_deadline = Instant::now() + self.node_timeout;
        let outcomes = self
            .on_every_node(
                |node| {
                    let (key, token) = (key.to_owned(), token.clone());
                    let fence_key = fence_key.map(str::to_owned);
                    async move {
                        node.token_checked(step, &key, fence_key.as_deref(), &token, node_deadline)
                            .await
                    }
                },
                enough,
            )
            .await;
        let acted = outcomes.iter().filter(|o| matches!(o, Ok(true))).count();
        let failed = outcomes.iter().filter(|o| o.is_err()).count();
        (acted, failed)
    }

    /// Releases `key` on every node: (deleted, failed).
    async fn release_all(
        &self,
        key: &str,
        token: &LeaseToken,
        enough: impl Fn(&bool) -> bool,
    ) -> (usize, usize) {
        self.checked_on_every_node(Step::Release, key, None, token, enough)
            .await
    }

    /// The outcome of a step that acted on `acted` nodes with `failed`
    /// unanswered: held (a majority acted), not held (a majority refused),
    /// or unknown (too many failed to tell).
    fn verdict(&self, key: &str, acted: usize, failed: usize) -> Result<bool> {
        let needed = self.needed();
        if acted >= needed {
            Ok(true)
        } else if acted + failed >= needed {
            Err(Error::QuorumNotReached {
                key: key.to_owned(),
                got: acted,
                needed,
                failed_nodes: failed,
            })
        } else {
            Ok(false)
        }
    }

    fn spawn_release_all(self: &Arc<Self>, key: &str, token: &LeaseToken) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (quorum, key, token) = (self.clone(), key.to_owned(), token.clone());
        runtime.spawn(async move {
            let (deleted, failed) = quorum.release_all(&key, &token, |deleted| *deleted).await;
            tracing::debug!(key, deleted, failed, "released abandoned quorum lease");
        });
    }

    /// Sends one request per node at once; returns every node's outcome
    /// once a majority gave an outcome that is `enough` (the rest finish in
    /// the background) or all answered.
    async fn on_every_node<T, F, Fut>(
        &self,
        request: F,
        enough: impl Fn(&T) -> bool,
    ) -> Vec<Result<T>>
    where
        F: Fn(Arc<Node<C>>) -> Fut,
        Fut: Future<Output = Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        let mut tasks = JoinSet::new();
        for (index, node) in self.nodes.iter().enumerate() {
            let request = request(node.clone());
            tasks.spawn(async move { (index, request.await) });
        }
        let mut results: Vec<Result<T>> = (0..self.nodes.len())
            .map(|_| Err(Error::UnexpectedReply { op: "quorum" }))
            .collect();
        let mut satisfied = 0;
        while let Some(joined) = tasks.join_next().await {
            if let Ok((index, outcome)) = joined
                && let Some(slot) = results.get_mut(index)
            {
                if outcome.as_ref().is_ok_and(&enough) {
                    satisfied += 1;
                }
                *slot = outcome;
            }
            if satisfied >= self.needed() {
                tasks.detach_all();
                break;
            }
        }
        results
    }
}

/// A quorum lease: refreshed and released on every node, counted by
/// majority, its validity less the drift allowance.
impl<C: RedisConnection> Backend for QuorumInner<C> {
    fn command_timeout(&self) -> Duration {
        self.node_timeout
    }

    fn margin(&self) -> Margin {
        drift
    }

    fn refresh<'a>(&'a self, part: &'a Part, ttl: Duration, _deadline: Instant) -> Reply<'a, bool> {
        Box::pin(async move {
            let step = Step::Refresh { ttl };
            let (extended, failed) = self
                .checked_on_every_node(
                    step,
                    &part.key,
                    part.fence_key.as_deref(),
                    &part.token,
                    |extended| *extended,
                )
                .await;
            self.verdict(&part.key, extended, failed)
        })
    }

    fn release<'a>(&'a self, part: &'a Part, _deadline: Instant) -> Reply<'a, bool> {
        Box::pin(async move {
            let (deleted, failed) = self
                .release_all(&part.key, &part.token, |deleted| *deleted)
                .await;
            self.verdict(&part.key, deleted, failed)
        })
    }

    fn raise_fence<'a>(
        &'a self,
        fence_key: &'a str,
        at_least: FencingToken,
        _deadline: Instant,
    ) -> Reply<'a, ()> {
        Box::pin(async move {
            let node_deadline = Instant::now() + self.node_timeout;
            let outcomes = self
                .on_every_node(
                    |node| {
                        let fence_key = fence_key.to_owned();
                        async move { node.raise_fence(&fence_key, at_least, node_deadline).await }
                    },
                    |_| true,
                )
                .await;
            let raised = outcomes.iter().filter(|o| o.is_ok()).count();
            if raised >= self.needed() {
                return Ok(());
            }
            // A counter that is not a counter is the caller's to fix.
            if let Some(Err(err @ Error::InvalidFence { .. })) = outcomes
                .into_iter()
                .find(|o| matches!(o, Err(Error::InvalidFence { .. })))
            {
                return Err(err);
            }
            Err(Error::QuorumNotReached {
                key: fence_key.to_owned(),
                got: raised,
                needed: self.needed(),
                failed_nodes: self.nodes.len() - raised,
            })
        })
    }

    fn announce<'a>(
        &'a self,
        part: &'a Part,
        record_key: &'a str,
        body: &'a str,
        _deadline: Instant,
    ) -> Reply<'a, bool> {
        Box::pin(async move {
            let node_deadline = Instant::now() + self.node_timeout;
            let outcomes = self
                .on_every_node(
                    |node| {
                        let (key, record_key) = (part.key.clone(), record_key.to_owned());
                        let (token, body) = (part.token.clone(), body.to_owned());
                        async move {
                            node.announce(&key, &record_key, &token, &body, node_deadline)
                                .await
                        }
                    },
                    |written| *written,
                )
                .await;
            let written = outcomes.iter().filter(|o| matches!(o, Ok(true))).count();
            let failed = outcomes.iter().filter(|o| o.is_err()).count();
            self.verdict(&part.key, written, failed)
        })
    }

    fn release_dropped(self: Arc<Self>, part: Part, _until: Instant) {
        self.spawn_release_all(&part.key, &part.token);
    }
}

#[derive(Debug, Clone, Copy)]
enum NodeStep {
    /// `quorum_acquire.lua`: the lock and this node's fence counter.
    Vote,
    /// `quorum_fence.lua`: raise this node's counter, if our lock is there.
    Fence,
}

impl NodeStep {
    fn script(self) -> &'static redis::Script {
        match self {
            NodeStep::Vote => &scripts::QUORUM_ACQUIRE,
            NodeStep::Fence => &scripts::QUORUM_FENCE,
        }
    }

    fn op(self) -> &'static str {
        match self {
            NodeStep::Vote => "acquire",
            NodeStep::Fence => "fence",
        }
    }
}

/// What the last attempt saw, for the error when giving up.
#[derive(Debug, Clone, Copy, Default)]
struct Round {
    votes: usize,
    failed: usize,
}

/// An election's leader as a majority of the nodes see it: the record a
/// majority agree on (with the shortest time to live they report), none
/// when a majority answered but do not agree on one.
impl<C: RedisConnection> crate::lessor::sealed::Sealed for Quorum<C> {
    fn leader_record<'a>(
        &'a self,
        key: &'a str,
        record_key: &'a str,
    ) -> Reply<'a, Option<(String, i64)>> {
        let quorum = &self.inner;
        Box::pin(async move {
            let node_deadline = Instant::now() + quorum.node_timeout;
            let outcomes = quorum
                .on_every_node(
                    |node| {
                        let (key, record_key) = (key.to_owned(), record_key.to_owned());
                        async move { node.leader(&key, &record_key, node_deadline).await }
                    },
                    |_| false,
                )
                .await;
            let answered: Vec<&Option<(String, i64)>> =
                outcomes.iter().filter_map(|o| o.as_ref().ok()).collect();
            let needed = quorum.needed();
            if answered.len() < needed {
                return Err(Error::QuorumNotReached {
                    key: key.to_owned(),
                    got: answered.len(),
                    needed,
                    failed_nodes: outcomes.len() - answered.len(),
                });
            }
            for (body, _) in answered.iter().copied().flatten() {
                let agreeing = answered
                    .iter()
                    .copied()
                    .flatten()
                    .filter(|(other, _)| other == body);
                let (count, pttl) =
                    agreeing.fold((0, i64::MAX), |(n, ttl), (_, t)| (n + 1, ttl.min(*t)));
                if count >= needed {
                    return Ok(Some((body.clone(), pttl)));
                }
            }
            Ok(None)
        })
    }
}

/// The same calls as the inherent methods.
impl<C: RedisConnection> Lessor for Quorum<C> {
    fn acquire(
        &self,
        keys: impl LockKeys,
        ttl: Duration,
    ) -> impl Future<Output = Result<Lease>> + Send {
        Quorum::acquire(self, keys, ttl)
    }

    fn acquire_with(
        &self,
        keys: impl LockKeys,
        ttl: Duration,
        opts: &AcquireOptions,
    ) -> impl Future<Output = Result<Lease>> + Send {
        Quorum::acquire_with(self, keys, ttl, opts)
    }

    fn acquire_all<K: LockKeys>(
        &self,
        keys: impl IntoIterator<Item = K> + Send,
        ttl: Duration,
        opts: &AcquireOptions,
    ) -> impl Future<Output = Result<Lease>> + Send {
        Quorum::acquire_all(self, keys, ttl, opts)
    }
}

/// `err` as [`Error::InvalidFence`] when a node refused the counter
/// (`NOTFENCE`); `None` for any other failure (a missing vote).
fn bad_fence(err: Error, keys: &FencedKeys) -> Option<Error> {
    match crate::node::not_a_fence(err, keys.fence()) {
        err @ Error::InvalidFence { .. } => Some(err),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn majority_is_strict() {
        assert_eq!(majority(1), 1);
        assert_eq!(majority(2), 2);
        assert_eq!(majority(3), 2);
        assert_eq!(majority(4), 3);
        assert_eq!(majority(5), 3);
    }

    #[test]
    fn drift_is_one_percent_plus_two_ms() {
        assert_eq!(drift(Duration::from_secs(10)), 102 * MS);
        assert_eq!(drift(100 * MS), 3 * MS);
    }

    #[test]
    fn validity_subtracts_elapsed_and_drift() {
        assert_eq!(validity(Duration::from_secs(10), 50 * MS), Some(9848 * MS));
        // 100 ms lease, 97 ms spent: 100 - 97 - 3 = 0, not valid.
        assert_eq!(validity(100 * MS, 97 * MS), None);
        assert_eq!(validity(100 * MS, 96 * MS), Some(MS));
        assert_eq!(validity(MS, Duration::ZERO), None);
        assert_eq!(validity(100 * MS, Duration::from_secs(1)), None);
    }
}
