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

// This file holds the public `Quorum`, its builder and its calls; the
// fan-out to the nodes (one round of votes, the fence's second round, the
// steps of a held lease on every node, counted by majority) is `fanout`'s.
mod fanout;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Claim, Held, LockService, Reply, Step};
use crate::connection::Connection;
use crate::error::{Error, Result};
use crate::fencing::{FencingToken, Target};
use crate::node::{Attempt, Node, RedisConnection};
use crate::service::Service;

use self::fanout::Round;

#[cfg(doc)]
use crate::fencing::FencedKeys;

/// How long one node may take to answer one request when the caller's
/// deadline is further away: 50 ms. Keep it well below the TTL, so that a
/// dead node costs little of the lease's validity.
pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(50);

/// Takes leases on a majority of independent Redis servers (Redlock).
///
/// Cheap to clone. Use an odd number of nodes (3 or 5): an even number
/// tolerates no more failures than the odd number below it.
///
/// It is a [`LockService`], so a [`Lessor`](crate::Lessor) (`use
/// leasehold::Lessor` for its calls). The same keys are used on every
/// node; given [`FencedKeys`], a lease gets a fencing token (see the
/// [module docs](self) for how it grows). A lease's validity is the TTL
/// less the time the winning attempt took less the drift allowance, and a
/// refresh (yours or the watchdog's) must reach a majority. Besides the
/// errors every way has, an acquire that gives up when, in its last
/// attempt, too many nodes failed for a majority to be possible returns
/// [`Error::QuorumNotReached`] (carried by the
/// [`Error::NotAcquired`] when the lock was also seen busy);
/// [`AcquireOptions::wait_replicas`](crate::AcquireOptions::wait_replicas)
/// is refused (the servers are independent, not replicas). Cancel safe:
/// an acquire dropped mid-attempt releases the lock on every node in the
/// background; the TTL is the fallback.
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

/// Each step is one round of votes (and, fenced, the round that records
/// the token), undone on every node unless it won.
impl<C: RedisConnection> LockService for Quorum<C> {
    type Entry = ();

    fn service(&self) -> Service {
        Service::REDIS
    }

    fn command_timeout(&self) -> Duration {
        self.inner.node_timeout
    }

    /// Two rounds of votes plus a cleanup round.
    fn step_timeout(&self) -> Duration {
        self.inner.node_timeout * 3
    }

    fn margin(ttl: Duration) -> Duration {
        fanout::drift(ttl)
    }

    fn mode(&self) -> &'static str {
        "quorum"
    }

    fn step<'a>(&'a self, claim: &'a Claim, (): &'a mut (), deadline: Instant) -> Reply<'a, Step> {
        Box::pin(async move {
            let inner = &self.inner;
            let target = Target {
                lock: claim.key().to_owned(),
                fence: claim.fence_key().map(str::to_owned),
            };
            let last_round = std::sync::Mutex::new(Round::default());
            match inner
                .attempt(&target, claim.token(), claim.ttl(), deadline, &last_round)
                .await?
            {
                Attempt::Won(fence) => Ok(Step::won(fence)),
                Attempt::Busy => {
                    let round = last_round.lock().map(|r| *r).unwrap_or_default();
                    // Too many nodes failed for a majority to be possible:
                    // a fault that may pass, not a busy lock.
                    if inner.nodes.len() - round.failed < inner.needed() {
                        return Err(Error::QuorumNotReached {
                            key: target.lock,
                            got: round.votes,
                            needed: inner.needed(),
                            failed_nodes: round.failed,
                        });
                    }
                    Ok(Step::busy())
                }
            }
        })
    }

    /// An attempt undoes its own votes before it returns; this is for one
    /// that failed half-way, if ever.
    fn undo<'a>(&'a self, claim: &'a Claim, (): &'a mut (), _deadline: Instant) -> Reply<'a, ()> {
        Box::pin(async move {
            self.inner
                .release_all(claim.key(), claim.token(), |deleted| *deleted)
                .await;
            Ok(())
        })
    }

    fn abandon(&self, claim: Claim, (): (), maybe_taken: bool) {
        if maybe_taken {
            self.inner.spawn_release_all(claim.key(), claim.token());
        }
    }

    fn refresh<'a>(&'a self, held: &'a Held, ttl: Duration, deadline: Instant) -> Reply<'a, bool> {
        self.inner.refresh(held, ttl, deadline)
    }

    fn release<'a>(&'a self, held: &'a Held, deadline: Instant) -> Reply<'a, bool> {
        self.inner.release(held, deadline)
    }

    fn raise_fence<'a>(
        &'a self,
        fence_key: &'a str,
        at_least: FencingToken,
        deadline: Instant,
    ) -> Reply<'a, ()> {
        self.inner.raise_fence(fence_key, at_least, deadline)
    }

    fn announce<'a>(
        &'a self,
        held: &'a Held,
        record_key: &'a str,
        body: &'a str,
        deadline: Instant,
    ) -> Reply<'a, bool> {
        self.inner.announce(held, record_key, body, deadline)
    }

    /// An election's leader as a majority of the nodes see it.
    fn leader_record<'a>(
        &'a self,
        key: &'a str,
        record_key: &'a str,
    ) -> Reply<'a, Option<(String, i64)>> {
        Box::pin(self.inner.leader_record(key, record_key))
    }
}

impl<C: RedisConnection> Quorum<C> {
    /// How many servers must agree: a strict majority.
    pub fn needed(&self) -> usize {
        self.inner.needed()
    }
}
