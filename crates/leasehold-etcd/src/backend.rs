//! What an etcd lease is to the [`Lease`](leasehold::Lease) it backs: the
//! etcd side of refresh, release, the leader record and a dropped lease,
//! each confirmed by the lock key itself (still there, created at our
//! revision, under our etcd lease), never by a keep-alive alone.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::client::{Cmp, Compare, EtcdClient, EtcdError, KeyValue, Op, Range, Txn};
use leasehold::LeaseToken;
use leasehold::Service;
use leasehold::backend::{Claim, Held as Part};
use leasehold::{Error, Result};

/// The pause between two tries of a delete whose answers were lost.
const SETTLE_PAUSE: Duration = Duration::from_millis(10);

/// One lock this process holds (or is queued for) on etcd: the etcd lease
/// its key lives under, the key, and the key's creation revision (its
/// place in the queue, and the fencing token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Held {
    pub(super) lease: i64,
    pub(super) key: String,
    pub(super) revision: i64,
    /// The TTL the lease was taken with: a keep-alive renews the etcd
    /// lease to its granted TTL (at least this), never to a longer one.
    pub(super) ttl: Duration,
}

impl Held {
    /// Whether `kv` is our key as we created it: same creation revision,
    /// under our lease.
    pub(super) fn is(&self, kv: &KeyValue) -> bool {
        kv.key == self.key.as_bytes()
            && kv.create_revision == self.revision
            && kv.lease == self.lease
    }

    /// Deletes our key if it is still ours.
    fn delete(&self) -> Txn {
        self.still_ours(Txn::new())
            .then(Op::delete(self.key.as_str()))
    }

    /// The conditions of a write that acts only while our key is ours.
    fn still_ours(&self, txn: Txn) -> Txn {
        txn.when(Compare::create_revision(
            self.key.as_str(),
            Cmp::Equal,
            self.revision,
        ))
        .when(Compare::lease(self.key.as_str(), Cmp::Equal, self.lease))
    }
}

/// Whether our key is still ours, by a linearizable read of the key.
async fn is_ours(client: &EtcdClient, held: &Held, deadline: Instant) -> Result<bool> {
    let read = client
        .range(&Range::key(held.key.as_str()), deadline)
        .await
        .map_err(|source| crate::error::failed("refresh", source))?;
    Ok(read.kvs.first().is_some_and(|kv| held.is(kv)))
}

/// The etcd side of every lease an [`EtcdLocker`](super::EtcdLocker) and its
/// clones grant.
#[derive(Debug)]
pub(crate) struct EtcdBackend {
    pub(super) client: EtcdClient,
    pub(super) command_timeout: Duration,
    /// Every key starts with it (ends with `/`).
    pub(super) prefix: String,
    /// What each lease part holds on etcd, by its token (a [`Part`] carries
    /// the lock key and token; the etcd lease and revision live here until
    /// the part is given back). A release that ends with a fault that may
    /// pass (etcd unreachable until its deadline) leaves its entry, a few
    /// dozen bytes, behind: a later try could still need it.
    held: Mutex<HashMap<LeaseToken, Held>>,
}

/// `text` with `%` and `/` escaped, so that one lock's keys are never
/// under another lock's prefix (`a/` would otherwise hold `a/b`'s).
fn escaped(text: &str) -> String {
    text.replace('%', "%25").replace('/', "%2F")
}

impl EtcdBackend {
    pub(super) fn new(client: EtcdClient, command_timeout: Duration, prefix: String) -> Self {
        EtcdBackend {
            client,
            command_timeout,
            prefix,
            held: Mutex::default(),
        }
    }

    /// The prefix of lock `lock`'s queue: every waiter's key starts with it.
    pub(super) fn queue(&self, lock: &str) -> String {
        format!("{}lock/{}/", self.prefix, escaped(lock))
    }

    /// The key of the waiter holding etcd lease `lease` in `lock`'s queue.
    pub(super) fn waiter_key(&self, lock: &str, lease: i64) -> String {
        format!("{}{:016x}", self.queue(lock), lease)
    }

    /// The etcd key of an election's leader record.
    fn record_key(&self, record_key: &str) -> String {
        format!("{}record/{}", self.prefix, escaped(record_key))
    }

    /// What `claim`'s key is on etcd once created under etcd lease `lease`
    /// at `revision`.
    pub(super) fn held_for(&self, claim: &Claim, lease: i64, revision: i64) -> Held {
        Held {
            lease,
            key: self.waiter_key(claim.key(), lease),
            revision,
            ttl: claim.ttl(),
        }
    }

    /// Revokes etcd lease `lease` in the background (a waiter leaving the
    /// queue): see [`revoke_now`](Self::revoke_now). With no runtime, its
    /// TTL ends it.
    pub(super) fn spawn_revoke(&self, lease: i64) {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(self.revoke_now(lease));
        }
    }

    pub(super) fn hold(&self, token: &LeaseToken, held: Held) {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(token.clone(), held);
    }

    fn held(&self, token: &LeaseToken) -> Option<Held> {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(token)
            .cloned()
    }

    fn forget(&self, token: &LeaseToken) {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(token);
    }

    /// Revokes etcd lease `lease` (its keys go with it) within one command
    /// timeout from now, as a future of its own, for a task: what a waiter
    /// leaving the queue (or a lease let go) is allowed. A failure is
    /// logged, and the lease's TTL ends it.
    pub(super) fn revoke_now(&self, lease: i64) -> impl Future<Output = ()> + Send + 'static {
        let (client, until) = (self.client.clone(), Instant::now() + self.command_timeout);
        async move {
            if let Err(err) = client.revoke(lease, until).await {
                tracing::debug!(lease = format_args!("{lease:x}"), error = %err, "could not revoke an etcd lease; its ttl will end it");
            }
        }
    }

    /// Revokes etcd lease `lease` by `deadline`: whether etcd said so (the
    /// lease is gone, or was already).
    pub(super) async fn revoke(&self, lease: i64, deadline: Instant) -> bool {
        match self.client.revoke(lease, deadline).await {
            Ok(_) => true,
            Err(err) => {
                tracing::debug!(lease = format_args!("{lease:x}"), error = %err, "could not revoke an etcd lease by the deadline");
                false
            }
        }
    }

    /// [`revoke_now`](Self::revoke_now) in a task, awaited until `deadline`
    /// (the caller's) at most: past it, the revoke carries on in the
    /// background, so a caller never waits past its deadline for this
    /// cleanup.
    pub(super) async fn revoke_by(&self, lease: i64, deadline: Instant) {
        let _ = tokio::time::timeout_at(deadline, tokio::spawn(self.revoke_now(lease))).await;
    }

    /// A keep-alive of our etcd lease and a read of our key, sent together
    /// (one round trip's wait): the lease is ours only if both say so (on
    /// etcd before 3.4.38 a keep-alive may report a lease renewed after it
    /// was revoked). Sent one after the other they would prove no more: a
    /// key deleted after the read is found by the next refresh either way,
    /// and the renewed lease counts from before both were sent.
    ///
    /// Both are safe to send again on another member (a keep-alive renews
    /// our lease to its granted TTL however often it lands, a read changes
    /// nothing), so each is split into attempts that fit the refresh's
    /// budget: at most half of what is left before the next refresh is due
    /// (`ttl / 3`, the watchdog's period and its bound on a refresh). A
    /// silent member (paused, cut off) costs the first attempt; the second
    /// goes to a member that answers, within the budget, and the members
    /// that fell silent are passed over by the next refreshes too (see
    /// [`EtcdClient`]).
    pub(super) async fn refresh_part(
        &self,
        part: &Part,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<bool> {
        let Some(held) = self.held(part.token()) else {
            return Ok(false);
        };
        if ttl > held.ttl {
            return Err(Error::InvalidOptions(
                "an etcd lease keeps the ttl it was granted: refresh with at most the acquire's ttl",
            ));
        }
        let now = Instant::now();
        let budget = deadline.min(now + ttl / 3);
        let client = self
            .client
            .with_attempt_timeout(budget.saturating_duration_since(now) / 2);
        let (kept, ours) = futures_util::future::join(
            client.keep_alive_once(held.lease, deadline),
            is_ours(&client, &held, deadline),
        )
        .await;
        match kept {
            Ok(_) => ours,
            Err(EtcdError::LeaseNotFound { .. }) => Ok(false),
            Err(source) => Err(crate::error::failed("refresh", source)),
        }
    }

    /// Deletes our key if it is still ours, then revokes our etcd lease
    /// (whatever the delete found: nothing of ours should outlive the
    /// release). A delete whose outcome is unknown is an error, never a
    /// success or a `NotHeld` we cannot know.
    pub(super) async fn release_part(&self, part: &Part, deadline: Instant) -> Result<bool> {
        let Some(held) = self.held(part.token()) else {
            return Ok(false);
        };
        let txn = self.release_txn(&held);
        // Half the time for the delete: one whose answer is lost (its
        // member paused, or lost its leader mid-request) leaves the other
        // half to learn the outcome.
        let now = Instant::now();
        let first_by = now + deadline.saturating_duration_since(now) / 2;
        let deleted = match self.client.txn(&txn, first_by).await {
            Ok(reply) => Ok(reply.succeeded),
            Err(err) if err.is_outcome_unknown() => {
                self.settle_delete(&held, &txn, deadline, err).await
            }
            // A cluster out of space refuses the released key's put (and
            // so the whole transaction, nothing applied) but still
            // deletes: the guarded delete alone, whose lost answer would
            // stay unknown.
            Err(err) if err.is_no_space() => self
                .client
                .txn(&held.delete(), deadline)
                .await
                .map(|reply| reply.succeeded),
            Err(err) => Err(err),
        };
        if !matches!(&deleted, Err(err) if err.is_retryable()) {
            // Definite, or unknown: either way the lease goes, so the lock
            // is free at once (a retry would find nothing to learn from).
            self.revoke_by(held.lease, deadline).await;
            self.forget(part.token());
        }
        deleted.map_err(|source| crate::error::failed("release", source))
    }

    /// The key a release writes under our etcd lease in the transaction
    /// that deletes our lock key: the proof that the delete was applied,
    /// for a release whose answer was lost (the revoke that follows the
    /// release removes it; outside every queue, so no waiter reads it).
    fn released_key(&self, lease: i64) -> String {
        format!("{}released/{lease:016x}", self.prefix)
    }

    /// If our key is still ours: delete it and write the released key
    /// under our lease. If not: read the released key (an earlier try of
    /// ours, whose answer was lost, wrote it).
    fn release_txn(&self, held: &Held) -> Txn {
        let released = self.released_key(held.lease);
        held.delete()
            .then(Op::put(released.as_str(), "", held.lease))
            .otherwise(Op::range(Range::key(released)))
    }

    /// A delete of our key (`txn`, from [`release_txn`](Self::release_txn))
    /// whose answer was lost (`unknown`), sent again until `deadline` (it
    /// acts only while the key is ours, so it is safe to resend): applied
    /// now, or found applied by the lost try (the released key is there),
    /// it is a success we know. Found not applied, with no released key,
    /// it stays unknown, never a `NotHeld`: the lost try may have deleted
    /// the key and our etcd lease ended since (revoked, or run out), taking
    /// the released key with it.
    async fn settle_delete(
        &self,
        held: &Held,
        txn: &Txn,
        deadline: Instant,
        unknown: EtcdError,
    ) -> Result<bool, EtcdError> {
        loop {
            match self.client.txn(txn, deadline).await {
                Ok(reply) if reply.succeeded => return Ok(true),
                Ok(reply) => {
                    let applied = reply
                        .first_range()
                        .first()
                        .is_some_and(|kv| kv.lease == held.lease);
                    return if applied { Ok(true) } else { Err(unknown) };
                }
                // Lost again (the client has moved on to another member):
                // the next try checks the key again, after a short pause.
                Err(err) if err.is_outcome_unknown() => {
                    tokio::time::sleep_until((Instant::now() + SETTLE_PAUSE).min(deadline)).await;
                }
                Err(_) => return Err(unknown),
            }
        }
    }

    /// Writes the leader record under our etcd lease, if our key is still
    /// ours.
    pub(super) async fn announce_part(
        &self,
        part: &Part,
        record_key: &str,
        body: &str,
        deadline: Instant,
    ) -> Result<bool> {
        let Some(held) = self.held(part.token()) else {
            return Ok(false);
        };
        let txn = held.still_ours(Txn::new()).then(Op::put(
            self.record_key(record_key),
            body,
            held.lease,
        ));
        match self.client.txn(&txn, deadline).await {
            Ok(txn) => Ok(txn.succeeded),
            Err(source) => Err(crate::error::failed("announce", source)),
        }
    }

    /// The leader record of the election whose lock is `lock`, if the
    /// lock's owner wrote it (the record lives under the owner's etcd
    /// lease), with the owner's lease's time to live in ms (etcd counts it
    /// in whole seconds).
    pub(super) async fn leader_record(
        &self,
        lock: &str,
        record_key: &str,
    ) -> Result<Option<(String, i64)>> {
        let deadline = Instant::now() + self.command_timeout;
        let read = Txn::new()
            .then(Op::range(
                Range::prefix(self.queue(lock)).oldest_first().limit(1),
            ))
            .then(Op::range(Range::key(self.record_key(record_key))));
        let read = self
            .client
            .txn(&read, deadline)
            .await
            .map_err(|source| crate::error::failed("leader", source))?;
        let mut ranges = read.results.into_iter().filter_map(|result| match result {
            crate::client::OpResult::Range(kvs) => Some(kvs),
            _ => None,
        });
        let (owner, record) = (
            ranges.next().unwrap_or_default(),
            ranges.next().unwrap_or_default(),
        );
        let (Some(owner), Some(record)) = (owner.first(), record.first()) else {
            return Ok(None);
        };
        if record.lease != owner.lease {
            return Ok(None);
        }
        let body = String::from_utf8(record.value.clone()).map_err(|_| Error::UnexpectedReply {
            service: Service::ETCD,
            op: "leader",
        })?;
        let ttl = self
            .client
            .time_to_live(owner.lease, deadline)
            .await
            .map_err(|source| crate::error::failed("leader", source))?;
        Ok(ttl.map(|ttl| (body, ttl.ttl.saturating_mul(1000))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_lock_s_queue_never_holds_another_lock_s_keys() {
        let client = EtcdClient::builder(["http://127.0.0.1:1"])
            .build()
            .unwrap_or_else(|err| panic!("{err}"));
        let backend = EtcdBackend::new(client, Duration::from_secs(1), "p/".to_owned());
        assert_eq!(backend.queue("a"), "p/lock/a/");
        assert_eq!(backend.waiter_key("a", 0xab), "p/lock/a/00000000000000ab");
        for (lock, other) in [("a", "a/b"), ("a%2Fb", "a/b"), ("a", "a%")] {
            let (queue, key) = (backend.queue(lock), backend.waiter_key(other, 1));
            assert!(!key.starts_with(&queue), "{key} is in {queue}");
        }
    }
}
