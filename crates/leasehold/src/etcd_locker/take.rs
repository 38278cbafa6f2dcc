//! Taking one lock on etcd: join the lock's queue (a key under an etcd
//! lease of our own, created only if absent), wait by watch for the key
//! just before ours to go, and confirm by the key itself before the lease
//! is handed over. See the [module docs](super) for why each step is safe.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::budget::Budget;
use crate::error::{Error, GiveUpReason, Result};
use crate::etcd::{
    Cmp, Compare, EtcdError, EventKind, KeyValue, Op, Range, Txn, TxnResult, WatchKeys,
};
use crate::fencing::{FencingToken, Target};
use crate::lease::{Lease, Part};
use crate::options::AcquireOptions;
use crate::rounds::Rounds;
use crate::service::Service;
use crate::token::LeaseToken;

use super::backend::{EtcdBackend, Held};

/// Our place in a lock's queue until the lease is handed over: dropped
/// before that (an error, giving up, the caller dropping the acquire), it
/// revokes our etcd lease, and our key goes with it.
struct Queued {
    backend: Arc<EtcdBackend>,
    lease: i64,
    armed: bool,
}

impl Queued {
    /// Leaves the queue: revokes our etcd lease, so our key goes with it.
    /// The revoke is awaited until `deadline` (the caller's) at most, and
    /// carries on in the background past it (bounded by the command
    /// timeout; if etcd cannot be reached, the lease's TTL ends it): a
    /// caller never waits past its deadline for it. With time left, as on
    /// an error early in the wait, no key of ours is left when the caller
    /// hears we gave up; at the deadline itself, it goes a moment later.
    async fn leave(mut self, deadline: Instant) {
        self.armed = false;
        self.backend.revoke_by(self.lease, deadline).await;
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(self.backend.revoke_now(self.lease));
    }
}

/// The error of an etcd request made while taking a lock.
fn failed(source: EtcdError) -> Error {
    Error::Etcd {
        op: "acquire",
        source,
    }
}

/// Takes the lock on `target` for `ttl` within `budget`, as `opts` says.
pub(super) async fn take(
    backend: &Arc<EtcdBackend>,
    target: Target,
    ttl: Duration,
    opts: &AcquireOptions,
    budget: Budget,
) -> Result<Lease> {
    let token = LeaseToken::generate()?;
    let mut rounds = Rounds::new(&target.lock, opts, budget, backend.command_timeout);
    loop {
        // A grant is safe to send again: a lease granted by a try whose
        // answer was lost has no key, and its TTL ends it.
        let (sent_at, grant) = loop {
            let (sent_at, deadline) = rounds.attempt()?;
            match backend.client.grant(ttl, deadline).await {
                Ok(grant) => break (sent_at, grant),
                Err(err) if err.is_retryable() => {
                    rounds.met(failed(err));
                    pause(&rounds).await?;
                }
                Err(err) => return Err(failed(err)),
            }
        };
        rounds.answered();
        let queued = Queued {
            backend: backend.clone(),
            lease: grant.id,
            armed: true,
        };
        let waiting = async {
            let key = backend.waiter_key(&target.lock, grant.id);
            let queue = backend.queue(&target.lock);
            let (held, first) = join(backend, &key, &queue, grant.id, ttl, &mut rounds).await?;
            let won = if first {
                Won::AtOnce
            } else {
                wait_turn(backend, &target, &held, ttl, &mut rounds).await?
            };
            Ok::<_, Error>((held, won))
        };
        let (held, won) = match waiting.await {
            Ok(taken) => taken,
            // Our etcd lease ended while we waited (its keep-alives failed
            // for a whole TTL, or an operator revoked it): our place is
            // gone, so we join again at the back, within the same wait.
            Err(Error::Etcd {
                source: EtcdError::LeaseNotFound { .. },
                ..
            }) => {
                queued.leave(rounds.deadline()).await;
                tracing::debug!(
                    key = target.lock,
                    "our waiter key went with its etcd lease; joining the queue again"
                );
                continue;
            }
            Err(err) => {
                queued.leave(rounds.deadline()).await;
                return Err(err);
            }
        };
        // The lease counts from the send time of the request that proved
        // it ours: first in line at once, the grant's (the read after our
        // create saw our key first, under the etcd lease granted then);
        // after a wait, the keep-alive's, sent with the confirming read.
        let confirmed_at = match won {
            Won::AtOnce => sent_at,
            Won::After { confirmed_at } => confirmed_at,
        };
        let fence = match target.fence {
            Some(_) => Some(fence_of(held.revision)?),
            None => None,
        };
        let part = Part {
            key: target.lock,
            token,
            // Its own resource name in a fence table: an etcd revision is
            // not comparable with a Redis counter (see the module docs).
            fence_key: target.fence.map(|fence| format!("etcd:{fence}")),
            fence,
        };
        let mut queued = queued;
        queued.armed = false;
        backend.hold(&part.token, held);
        return Ok(Lease::new(backend.clone(), part, ttl, confirmed_at));
    }
}

/// The fencing token of a key created at `revision`.
fn fence_of(revision: i64) -> Result<FencingToken> {
    FencingToken::try_from(revision).map_err(|_| Error::UnexpectedReply {
        service: Service::ETCD,
        op: "acquire",
    })
}

/// How we got to the head of the queue.
enum Won {
    /// First in line when our key was created.
    AtOnce,
    /// After waiting; confirmed by a keep-alive sent at `confirmed_at` and
    /// a read of the queue sent with it (our key there, first: so our
    /// etcd lease was alive when the read was served, after the send).
    After { confirmed_at: Instant },
}

/// Creates our key `key` under etcd lease `lease`, if absent: our place in
/// the queue, at the key's creation revision. The create is safe to send
/// again, so a fault that may pass (and a create whose answer was lost) is
/// ridden out within the budget: a try that landed unseen makes the next
/// one find the key under our lease.
async fn join(
    backend: &EtcdBackend,
    key: &str,
    queue: &str,
    lease: i64,
    ttl: Duration,
    rounds: &mut Rounds<'_>,
) -> Result<(Held, bool)> {
    // The queue's oldest key, read in the same transaction (after our put:
    // a read in a transaction sees the transaction's own writes), so an
    // uncontended acquire knows it holds the lock without another request.
    let oldest = || Op::range(Range::prefix(queue).oldest_first().limit(1));
    let create = Txn::new()
        .when(Compare::create_revision(key, Cmp::Equal, 0))
        .then(Op::put(key, "", lease))
        .then(oldest())
        .otherwise(Op::range(Range::key(key)))
        .otherwise(oldest());
    loop {
        let (_, deadline) = rounds.attempt()?;
        let (revision, owner) = match backend.client.txn(&create, deadline).await {
            Ok(txn) if txn.succeeded => (txn.header.revision, txn.ranges().next().cloned()),
            // The key exists: ours (our lease's ID is in its name) only if
            // under our lease, which a try whose answer was lost made.
            Ok(txn) => {
                let mut ranges = txn.ranges();
                match ranges
                    .next()
                    .and_then(|mine| mine.first().filter(|kv| kv.lease == lease))
                {
                    Some(kv) => (kv.create_revision, ranges.next().cloned()),
                    None => return Err(failed(EtcdError::LeaseNotFound { lease })),
                }
            }
            Err(err) if err.is_retryable() || err.is_outcome_unknown() => {
                rounds.met(failed(err));
                pause(rounds).await?;
                continue;
            }
            // Our etcd lease ended while the create was refused or out of
            // reach (no keep-alive goes before we are in the queue): our
            // caller grants a new one, within the same wait.
            Err(err) if err.is_lease_not_found() => {
                return Err(failed(EtcdError::LeaseNotFound { lease }));
            }
            Err(err) => return Err(failed(err)),
        };
        let held = Held {
            lease,
            key: key.to_owned(),
            revision,
            ttl,
        };
        let first = owner
            .as_deref()
            .and_then(<[KeyValue]>::first)
            .is_some_and(|kv| held.is(kv));
        if first {
            rounds.answered();
        } else {
            rounds.busy();
        }
        return Ok((held, first));
    }
}

/// Where we stand in the queue, as read at one revision.
enum Place {
    /// Our key is the oldest: we hold the lock.
    First,
    /// `ahead` is the key just before ours.
    Behind { ahead: KeyValue },
    /// Our key is gone (our etcd lease ended while we waited).
    Gone,
}

/// The read that tells our [`Place`], in one read-only transaction: our
/// key, and the newest key of the queue created before it (the one just
/// ahead). Its answer is two keys at most, however long the queue: a
/// waiter woken by every turn does not read the whole queue each time.
fn place_read(queue: &str, held: &Held) -> Txn {
    Txn::new()
        .then(Op::range(Range::key(held.key.as_str())))
        .then(Op::range(
            Range::prefix(queue)
                .created_before(held.revision)
                .newest_first()
                .limit(1),
        ))
}

/// Our place, from the answer to [`place_read`].
fn place(read: &TxnResult, held: &Held) -> Place {
    let mut ranges = read.ranges();
    let (mine, ahead) = (ranges.next(), ranges.next());
    if !mine
        .and_then(|kvs| kvs.first())
        .is_some_and(|kv| held.is(kv))
    {
        return Place::Gone;
    }
    match ahead
        .and_then(|kvs| kvs.first())
        .filter(|kv| kv.create_revision < held.revision)
    {
        None => Place::First,
        Some(ahead) => Place::Behind {
            ahead: ahead.clone(),
        },
    }
}

/// The pause before asking again after a fault that may pass (etcd
/// electing a leader, a member going away).
const FAULT_PAUSE: Duration = Duration::from_millis(50);

/// Waits, by watch, until our key is the oldest in the queue, keeping our
/// etcd lease alive meanwhile; gives up at the budget's deadline or when
/// the caller cancels. A fault that may pass (no leader for a while, a
/// member gone) is ridden out within the budget, and returned if the
/// deadline comes during it, as the Redis ways do.
async fn wait_turn(
    backend: &EtcdBackend,
    target: &Target,
    held: &Held,
    ttl: Duration,
    rounds: &mut Rounds<'_>,
) -> Result<Won> {
    let client = &backend.client;
    let read_place = place_read(&backend.queue(&target.lock), held);
    let keep_every = (ttl / 3).max(Duration::from_millis(1));
    // A keep-alive is due every `keep_every`: its attempts fit in half of
    // that, so a silent member costs one and the next member renews our
    // etcd lease in time, as a held lease's refresh does.
    let keeper = client.with_attempt_timeout(keep_every / 2);
    let mut waited = false;
    let mut next_keep_alive = Instant::now() + keep_every;
    loop {
        let (sent_at, deadline) = rounds.attempt()?;
        // After a wait, a keep-alive of our etcd lease goes with the read:
        // if the read finds us first, the lock is ours, and the lease
        // counts from the keep-alive's send time (see `Won::After`).
        let (read, kept) = if waited {
            let (read, kept) = futures_util::future::join(
                client.txn(&read_place, deadline),
                client.keep_alive_once(held.lease, deadline),
            )
            .await;
            (read, Some(kept))
        } else {
            (client.txn(&read_place, deadline).await, None)
        };
        let read = match (read, kept) {
            (Ok(_), Some(Err(EtcdError::LeaseNotFound { .. }))) => {
                return Err(failed(EtcdError::LeaseNotFound { lease: held.lease }));
            }
            (Ok(read), None | Some(Ok(_))) => read,
            (Err(err), _) | (Ok(_), Some(Err(err))) if err.is_retryable() => {
                rounds.met(failed(err));
                pause(rounds).await?;
                continue;
            }
            (Err(err), _) | (Ok(_), Some(Err(err))) => return Err(failed(err)),
        };
        rounds.answered();
        let ahead = match place(&read, held) {
            Place::First if !waited => return Ok(Won::AtOnce),
            Place::First => {
                return Ok(Won::After {
                    confirmed_at: sent_at,
                });
            }
            Place::Gone => return Err(failed(EtcdError::LeaseNotFound { lease: held.lease })),
            Place::Behind { ahead } => {
                rounds.busy();
                ahead
            }
        };
        if !waited {
            // A strategy with no wait (one attempt) gives up at once.
            rounds.next_wait()?;
            waited = true;
        }
        // The key ahead of ours can only go: wait for its delete, from
        // the revision just after the read that saw it.
        let mut from = read.header.revision + 1;
        'watch: loop {
            let (_, deadline) = rounds.attempt()?;
            let mut watch = match client
                .watch(&WatchKeys::key(ahead.key.clone()), from, deadline)
                .await
            {
                Ok(watch) => watch,
                Err(EtcdError::Compacted { .. }) => break 'watch,
                Err(err) if err.is_retryable() => {
                    rounds.met(failed(err));
                    pause(rounds).await?;
                    continue 'watch;
                }
                Err(err) => return Err(failed(err)),
            };
            rounds.answered();
            loop {
                tokio::select! {
                    biased;
                    () = rounds.cancelled() => return Err(rounds.give_up(GiveUpReason::Cancelled)),
                    () = tokio::time::sleep_until(rounds.deadline()) => {
                        return Err(rounds.ran_out(GiveUpReason::DeadlineExpired));
                    }
                    () = tokio::time::sleep_until(next_keep_alive) => {
                        let (_, deadline) = rounds.attempt()?;
                        match keeper.keep_alive_once(held.lease, deadline).await {
                            Ok(_) => {
                                rounds.answered();
                                next_keep_alive = Instant::now() + keep_every;
                            }
                            // Our etcd lease lives on for a while: try
                            // again soon; if it ends, our key goes and the
                            // next read says so.
                            Err(err) if err.is_retryable() => {
                                rounds.met(failed(err));
                                next_keep_alive = Instant::now() + FAULT_PAUSE;
                            }
                            Err(err) => return Err(failed(err)),
                        }
                        // The keep-alive found the watch's member silent
                        // (and moved on): the watch there would wait for
                        // the connection's own ping to fail (seconds), so
                        // it moves now, missing nothing.
                        if client.is_demoted(watch.endpoint()) {
                            from = watch.next_revision();
                            continue 'watch;
                        }
                    }
                    batch = watch.next() => match batch {
                        Ok(batch) if batch.events.iter().any(|e| e.kind == EventKind::Delete) => {
                            break 'watch;
                        }
                        Ok(_) => {}
                        Err(EtcdError::WatchLost { .. }) => {
                            from = watch.next_revision();
                            continue 'watch;
                        }
                        Err(EtcdError::Compacted { .. }) => break 'watch,
                        Err(err) => return Err(failed(err)),
                    },
                }
            }
        }
    }
}

/// A short pause after a fault, cut short by the budget's deadline; gives
/// up if the caller cancels meanwhile.
async fn pause(rounds: &Rounds<'_>) -> Result<()> {
    let wake = (Instant::now() + FAULT_PAUSE).min(rounds.deadline());
    tokio::select! {
        biased;
        () = rounds.cancelled() => Err(rounds.give_up(GiveUpReason::Cancelled)),
        () = tokio::time::sleep_until(wake) => Ok(()),
    }
}
