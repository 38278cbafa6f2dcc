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
//! 1. each yes vote carries that node's fence counter; the token is
//!    `max(counters) + 1`;
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
//! **Its limits.** The argument needs `w` to still remember `t1`. A node that
//! restarts with an empty dataset (no persistence, or `appendfsync` other
//! than `always`) or fails over to a stale replica breaks it: if every node
//! of W1 that L2 reaches lost its data, `t2` can be at or below `t1`. Writing
//! the token to all reachable nodes (not only the majority) makes that rarer,
//! not impossible. Like Redlock itself, the token also assumes that the
//! holder's pauses and clock rates stay small relative to the TTL. That is
//! why the token is checked where the write happens: with the database's
//! strict `fence < $token`, a token that went backwards is *refused*
//! (availability suffers, the balance does not), and the check-and-set on
//! the version read (`fence = $read`) keeps the balance right even when two
//! holders overlap.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionManager;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::call;
use crate::compare::Step;
use crate::error::{Error, GiveUpReason, Result};
use crate::fencing::{FencedKeys, FencingToken};
use crate::locker::{Locker, check_ttl, ttl_millis};
use crate::options::AcquireOptions;
use crate::rounds::{self, Attempt};
use crate::token::LeaseToken;
use crate::{RedisConnection, scripts};

/// How long one node may take to answer one request when the caller's
/// deadline is further away: 50 ms. Keep it well below the TTL, so that a
/// dead node costs little of the lease's validity.
pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(50);

/// The votes needed among `nodes`: a strict majority.
pub const fn majority(nodes: usize) -> usize {
    nodes / 2 + 1
}

/// The clock drift allowance of a lease of `ttl`: 1 % of the TTL plus 2 ms.
pub fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// The time a quorum lease of `ttl` is still safe to use after an acquire
/// that took `elapsed`: `ttl - elapsed - drift(ttl)`, or `None` when that is
/// not positive (the lease may already have expired on some node).
pub fn validity(ttl: Duration, elapsed: Duration) -> Option<Duration> {
    ttl.checked_sub(elapsed)
        .and_then(|left| left.checked_sub(drift(ttl)))
        .filter(|left| !left.is_zero())
}

/// Takes leases on a majority of independent Redis servers (Redlock).
///
/// Cheap to clone. Use an odd number of nodes (3 or 5): an even number
/// tolerates no more failures than the odd number below it.
#[derive(Clone)]
pub struct Quorum<C = ConnectionManager> {
    inner: Arc<QuorumInner<C>>,
}

struct QuorumInner<C> {
    nodes: Vec<Locker<C>>,
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

/// Builds a [`Quorum`] with non-default settings.
#[must_use]
#[derive(Debug)]
pub struct QuorumBuilder<C> {
    nodes: Vec<C>,
    node_timeout: Duration,
}

impl<C: RedisConnection> QuorumBuilder<C> {
    /// Bounds each request to each node.
    ///
    /// Defaults to [`DEFAULT_NODE_TIMEOUT`] (50 ms).
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = timeout;
        self
    }

    /// Checks the settings and builds the quorum. No I/O.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] for no nodes or a zero node timeout.
    pub fn build(self) -> Result<Quorum<C>> {
        if self.nodes.is_empty() {
            return Err(Error::InvalidOptions("a quorum needs at least one node"));
        }
        if self.node_timeout.is_zero() {
            return Err(Error::InvalidOptions("node timeout must be positive"));
        }
        let nodes = self
            .nodes
            .into_iter()
            .map(|conn| {
                Locker::builder(conn)
                    .command_timeout(self.node_timeout)
                    .build()
            })
            .collect::<Result<_>>()?;
        Ok(Quorum {
            inner: Arc::new(QuorumInner {
                nodes,
                node_timeout: self.node_timeout,
            }),
        })
    }
}

impl Quorum<ConnectionManager> {
    /// A quorum over `clients`, one per independent server, with lazily
    /// established, self-reconnecting connections: a server that is down now
    /// is a missing vote, not an error, and counts again once it is back.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] for an empty list; [`Error::Redis`] if a
    /// client's settings are unusable. No I/O happens here.
    pub async fn connect(clients: Vec<redis::Client>) -> Result<Self> {
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(DEFAULT_NODE_TIMEOUT))
            .set_response_timeout(Some(DEFAULT_NODE_TIMEOUT))
            .set_number_of_retries(1);
        let nodes = clients
            .into_iter()
            .map(|client| {
                ConnectionManager::new_lazy_with_config(client, config.clone()).map_err(|source| {
                    Error::Redis {
                        op: "connect",
                        source,
                    }
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Quorum::builder(nodes).build()
    }
}

impl<C: RedisConnection> Quorum<C> {
    /// A builder over one connection per independent server.
    pub fn builder(nodes: Vec<C>) -> QuorumBuilder<C> {
        QuorumBuilder {
            nodes,
            node_timeout: DEFAULT_NODE_TIMEOUT,
        }
    }

    /// A quorum with default settings.
    ///
    /// # Errors
    /// As for [`QuorumBuilder::build`].
    pub fn new(nodes: Vec<C>) -> Result<Self> {
        Quorum::builder(nodes).build()
    }

    /// The number of servers.
    pub fn len(&self) -> usize {
        self.inner.nodes.len()
    }

    /// Always false: a quorum has at least one node.
    pub fn is_empty(&self) -> bool {
        self.inner.nodes.is_empty()
    }

    /// The votes a lease needs: a strict majority of [`len`](Self::len).
    pub fn needed(&self) -> usize {
        majority(self.len())
    }

    /// Takes the lease on `keys` for `ttl` on a majority of the servers,
    /// with a fencing token, retrying as `opts` says. The same two keys are
    /// used on every node.
    ///
    /// # Errors
    /// [`Error::InvalidTtl`] / [`Error::InvalidKey`] before any I/O, and
    /// [`Error::InvalidOptions`] when `opts` asks to
    /// [wait for replicas](AcquireOptions::wait_replicas) (a quorum's
    /// servers are independent; that option is for a replicated server) or
    /// for a [watchdog](AcquireOptions::watchdog) (a quorum lease has none:
    /// refresh it yourself);
    /// [`Error::NotAcquired`] when the lock stayed busy;
    /// [`Error::QuorumNotReached`] when, in the last attempt, too many nodes
    /// failed to answer for a majority to be possible.
    ///
    /// # Cancel safety
    /// Cancel safe: if the future is dropped mid-attempt, the lock is
    /// released on every node in the background; the TTL is the fallback.
    pub async fn acquire(
        &self,
        keys: &FencedKeys,
        ttl: Duration,
        opts: &AcquireOptions,
    ) -> Result<QuorumLease<C>> {
        check_ttl(ttl)?;
        if opts.wait_replicas.is_some() {
            return Err(Error::InvalidOptions(
                "wait_replicas does not apply to a quorum: its servers are independent",
            ));
        }
        if opts.watchdog {
            return Err(Error::InvalidOptions(
                "watchdog is not available for a quorum lease: refresh it with QuorumLease::refresh",
            ));
        }
        let keys = keys.clone();
        let token = LeaseToken::generate()?;
        let last_round = std::sync::Mutex::new(Round::default());
        let outcome = rounds::acquire_rounds(
            keys.lock(),
            opts,
            // Two rounds of votes plus a cleanup round per attempt.
            self.inner.node_timeout * 3,
            |deadline| self.attempt(&keys, &token, ttl, deadline, &last_round),
            || self.spawn_release_all(&keys, &token),
        )
        .await;
        match outcome {
            Ok((won, _sent_at)) => Ok(QuorumLease {
                quorum: self.clone(),
                keys,
                token,
                ttl,
                fence: won.fence,
                votes: won.votes,
                valid_until: won.valid_until,
                released: false,
            }),
            Err(Error::NotAcquired {
                key,
                attempts,
                waited,
                reason,
            }) if reason != GiveUpReason::Cancelled => {
                let round = last_round.lock().map(|r| *r).unwrap_or_default();
                if self.len() - round.failed < self.needed() {
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

    /// One round: votes from every node, then the fence write.
    async fn attempt(
        &self,
        keys: &FencedKeys,
        token: &LeaseToken,
        ttl: Duration,
        deadline: Instant,
        last_round: &std::sync::Mutex<Round>,
    ) -> Result<Attempt<Won>> {
        let started = Instant::now();
        let node_deadline = deadline.min(started + self.inner.node_timeout);
        let px = ttl_millis(ttl);
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
        let counters: Vec<u64> = votes.into_iter().filter_map(|v| v.ok().flatten()).collect();
        if let Ok(mut round) = last_round.lock() {
            *round = Round {
                votes: counters.len(),
                failed,
            };
        }
        let mut won = None;
        if counters.len() >= self.needed() && validity(ttl, started.elapsed()).is_some() {
            let fence = counters
                .iter()
                .copied()
                .max()
                .unwrap_or(0)
                .saturating_add(1);
            let confirmed = self.record_fence(keys, token, fence, deadline).await;
            if confirmed >= self.needed()
                && let Some(left) = validity(ttl, started.elapsed())
            {
                won = Some(Won {
                    fence: FencingToken::from(fence),
                    votes: confirmed,
                    valid_until: Instant::now() + left,
                });
            }
        }
        match won {
            Some(won) => Ok(Attempt::Won(won)),
            None => {
                // Undo every yes vote, including any from nodes that timed out.
                self.release_all(keys, token, |deleted| *deleted).await;
                Ok(Attempt::Busy)
            }
        }
    }

    /// Writes `fence` everywhere; returns how many nodes it counts on.
    async fn record_fence(
        &self,
        keys: &FencedKeys,
        token: &LeaseToken,
        fence: u64,
        deadline: Instant,
    ) -> usize {
        let node_deadline = deadline.min(Instant::now() + self.inner.node_timeout);
        self.script_on_every_node::<i64>(
            NodeStep::Fence,
            keys,
            token,
            fence,
            node_deadline,
            |counted| *counted == 1,
        )
        .await
        .into_iter()
        .filter(|counted| matches!(counted, Ok(1)))
        .count()
    }

    /// Runs a quorum script (`KEYS = lock, fence`, `ARGV = token, arg`) on
    /// every node, each bounded by `deadline`.
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
                    let mut conn = node.inner.conn.clone();
                    let mut invocation = step.script().key(keys.lock());
                    invocation.key(keys.fence()).arg(&token).arg(arg);
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

    /// Token-checked release on every node; returns the number of nodes on
    /// which our key was deleted and the number that failed to answer.
    /// Cleanup gets its own node timeout, even when the caller's deadline
    /// has passed.
    /// Returns once a majority of answers satisfy `enough` (see
    /// [`on_every_node`](Self::on_every_node)).
    async fn release_all(
        &self,
        keys: &FencedKeys,
        token: &LeaseToken,
        enough: impl Fn(&bool) -> bool,
    ) -> (usize, usize) {
        let node_deadline = Instant::now() + self.inner.node_timeout;
        let outcomes = self
            .on_every_node(
                |node| {
                    let lock = keys.lock().to_owned();
                    let token = token.clone();
                    async move { node.release_token(&lock, &token, node_deadline).await }
                },
                enough,
            )
            .await;
        let deleted = outcomes.iter().filter(|o| matches!(o, Ok(true))).count();
        let failed = outcomes.iter().filter(|o| o.is_err()).count();
        (deleted, failed)
    }

    fn spawn_release_all(&self, keys: &FencedKeys, token: &LeaseToken) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (quorum, keys, token) = (self.clone(), keys.clone(), token.clone());
        runtime.spawn(async move {
            let (deleted, failed) = quorum.release_all(&keys, &token, |deleted| *deleted).await;
            tracing::debug!(
                key = keys.lock(),
                deleted,
                failed,
                "released abandoned quorum lease"
            );
        });
    }

    /// Runs `request` against every node concurrently; one result per node.
    ///
    /// Returns as soon as a majority of answers satisfy `enough`: a slow or
    /// paused node then costs a winning round nothing. The requests still
    /// running finish in the background (their answers are reported as not
    /// received); a vote that lands late is part of the lease and is
    /// released with it. Otherwise waits for every node, each bounded by its
    /// own deadline: a losing round hears every answer before it releases,
    /// which also spaces out the retries of colliding waiters (measured: not
    /// waiting made runs with a paused node slower and erratic).
    async fn on_every_node<T, F, Fut>(
        &self,
        request: F,
        enough: impl Fn(&T) -> bool,
    ) -> Vec<Result<T>>
    where
        F: Fn(Locker<C>) -> Fut,
        Fut: Future<Output = Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        let mut tasks = JoinSet::new();
        for (index, node) in self.inner.nodes.iter().enumerate() {
            let request = request(node.clone());
            tasks.spawn(async move { (index, request.await) });
        }
        let mut results: Vec<Result<T>> = (0..self.len())
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

/// The two per-node scripts of a quorum acquire.
#[derive(Debug, Clone, Copy)]
enum NodeStep {
    /// `scripts/quorum_acquire.lua`.
    Vote,
    /// `scripts/quorum_fence.lua`.
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

/// What a winning attempt learned.
struct Won {
    fence: FencingToken,
    votes: usize,
    valid_until: Instant,
}

/// A lease held on a majority of a [`Quorum`]'s servers.
///
/// Use it only until [`valid_until`](Self::valid_until): that is the TTL
/// minus the time the acquire took minus the drift allowance. Dropping it
/// without [`release`](Self::release) releases it in the background.
#[must_use = "a lease should be released with `release().await`; dropping it releases in the background"]
pub struct QuorumLease<C: RedisConnection = ConnectionManager> {
    quorum: Quorum<C>,
    keys: FencedKeys,
    token: LeaseToken,
    ttl: Duration,
    fence: FencingToken,
    votes: usize,
    valid_until: Instant,
    released: bool,
}

impl<C: RedisConnection> std::fmt::Debug for QuorumLease<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuorumLease")
            .field("key", &self.keys.lock())
            .field("fence", &self.fence)
            .field("votes", &self.votes)
            .field("remaining", &self.remaining())
            .finish()
    }
}

impl<C: RedisConnection> QuorumLease<C> {
    /// The lock key, `lock:{resource}`.
    pub fn key(&self) -> &str {
        self.keys.lock()
    }

    /// This holder's token.
    pub fn token(&self) -> &LeaseToken {
        &self.token
    }

    /// The fencing token: higher than that of every earlier lease on the
    /// resource, within the limits explained in the [module docs](crate::quorum).
    pub fn fence(&self) -> FencingToken {
        self.fence
    }

    /// The TTL requested.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// How many nodes confirmed the lease: at least the majority. Answers
    /// beyond the majority are not waited for, so this is usually exactly
    /// the majority even when every node holds the lock.
    pub fn votes(&self) -> usize {
        self.votes
    }

    /// The end of the lease's validity: acquire start + TTL - time the
    /// acquire took - drift.
    pub fn valid_until(&self) -> Instant {
        self.valid_until
    }

    /// Time left until [`valid_until`](Self::valid_until), zero once passed.
    pub fn remaining(&self) -> Duration {
        self.valid_until.saturating_duration_since(Instant::now())
    }

    /// Extends the lease to `ttl` on every node that still holds our token
    /// (token-checked, like [`Lease::refresh`](crate::Lease::refresh)); it
    /// succeeds when a majority did, and the validity is then recomputed
    /// from this refresh's start.
    ///
    /// # Errors
    /// [`Error::InvalidTtl`] before any I/O; [`Error::NotHeld`] when fewer
    /// than a majority still held our token; [`Error::QuorumNotReached`]
    /// when too many nodes failed to answer to tell. On error the validity
    /// is unchanged.
    ///
    /// # Cancel safety
    /// If dropped mid-way, some nodes may have been extended; the validity
    /// is unchanged, which errs on the safe side.
    pub async fn refresh(&mut self, ttl: Duration) -> Result<()> {
        check_ttl(ttl)?;
        let started = Instant::now();
        let deadline = started + self.quorum.inner.node_timeout;
        let step = Step::Refresh { ttl };
        let outcomes = self
            .quorum
            .on_every_node(
                |node| {
                    let lock = self.keys.lock().to_owned();
                    let token = self.token.clone();
                    async move { node.token_checked(step, &lock, &token, deadline).await }
                },
                |extended| *extended,
            )
            .await;
        let extended = outcomes.iter().filter(|o| matches!(o, Ok(true))).count();
        let failed = outcomes.iter().filter(|o| o.is_err()).count();
        let needed = self.quorum.needed();
        if extended >= needed
            && let Some(left) = validity(ttl, started.elapsed())
        {
            self.ttl = ttl;
            self.votes = extended;
            self.valid_until = Instant::now() + left;
            return Ok(());
        }
        if extended + failed >= needed {
            return Err(Error::QuorumNotReached {
                key: self.keys.lock().to_owned(),
                got: extended,
                needed,
                failed_nodes: failed,
            });
        }
        Err(Error::NotHeld {
            key: self.keys.lock().to_owned(),
        })
    }

    /// Releases the lease on every node (token-checked).
    ///
    /// # Errors
    /// [`Error::NotHeld`] when fewer than a majority of nodes still held our
    /// token (the lease had expired or been taken); [`Error::QuorumNotReached`]
    /// when too many nodes failed to answer to tell.
    ///
    /// # Cancel safety
    /// If dropped mid-way, some nodes may keep the key until its TTL.
    pub async fn release(mut self) -> Result<()> {
        self.released = true;
        let (deleted, failed) = self
            .quorum
            .release_all(&self.keys, &self.token, |deleted| *deleted)
            .await;
        let needed = self.quorum.needed();
        if deleted >= needed {
            Ok(())
        } else if deleted + failed >= needed {
            Err(Error::QuorumNotReached {
                key: self.keys.lock().to_owned(),
                got: deleted,
                needed,
                failed_nodes: failed,
            })
        } else {
            Err(Error::NotHeld {
                key: self.keys.lock().to_owned(),
            })
        }
    }
}

impl<C: RedisConnection> Drop for QuorumLease<C> {
    fn drop(&mut self) {
        if !self.released {
            self.quorum.spawn_release_all(&self.keys, &self.token);
        }
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
