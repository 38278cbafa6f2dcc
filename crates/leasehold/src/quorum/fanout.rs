//! The quorum's fan-out: one request per node at once, counted by
//! majority. An acquire's round of votes (and, fenced, the second round
//! that records the token), and every step of a held lease (refresh,
//! release, raise the fence, announce a leader), as the steps of a
//! quorum lease.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::compare::Step;
use crate::error::{Error, Result};
use crate::fencing::{FencedKeys, FencingToken, Target};
use crate::lease::{Part, Reply};
use crate::node::{Attempt, Node, RedisConnection, ttl_millis};
use crate::service::Service;
use crate::token::LeaseToken;
use crate::{call, scripts};

use super::QuorumInner;

/// The target of this file's tracing events: the module's.
const TARGET: &str = "leasehold::quorum";

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

impl<C: RedisConnection> QuorumInner<C> {
    pub(super) fn needed(&self) -> usize {
        majority(self.nodes.len())
    }

    /// One round: votes from every node, then (fenced) the fence write.
    pub(super) async fn attempt(
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
    pub(super) async fn release_all(
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

    pub(super) fn spawn_release_all(self: &Arc<Self>, key: &str, token: &LeaseToken) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (quorum, key, token) = (self.clone(), key.to_owned(), token.clone());
        runtime.spawn(async move {
            let (deleted, failed) = quorum.release_all(&key, &token, |deleted| *deleted).await;
            tracing::debug!(target: TARGET, key, deleted, failed, "released abandoned quorum lease");
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
            .map(|_| {
                Err(Error::UnexpectedReply {
                    service: Service::REDIS,
                    op: "quorum",
                })
            })
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

    /// An election's leader as a majority of the nodes see it: the record a
    /// majority agree on (with the shortest time to live they report), none
    /// when a majority answered but do not agree on one.
    pub(super) async fn leader_record(
        &self,
        key: &str,
        record_key: &str,
    ) -> Result<Option<(String, i64)>> {
        let quorum = self;
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
    }
}

/// A quorum lease's steps: refreshed and released on every node, counted
/// by majority (the quorum's [`LockService`](crate::LockService) calls).
impl<C: RedisConnection> QuorumInner<C> {
    pub(super) fn refresh<'a>(
        &'a self,
        part: &'a Part,
        ttl: Duration,
        _deadline: Instant,
    ) -> Reply<'a, bool> {
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

    pub(super) fn release<'a>(&'a self, part: &'a Part, _deadline: Instant) -> Reply<'a, bool> {
        Box::pin(async move {
            let (deleted, failed) = self
                .release_all(&part.key, &part.token, |deleted| *deleted)
                .await;
            self.verdict(&part.key, deleted, failed)
        })
    }

    pub(super) fn raise_fence<'a>(
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

    pub(super) fn announce<'a>(
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
pub(super) struct Round {
    pub(super) votes: usize,
    pub(super) failed: usize,
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
