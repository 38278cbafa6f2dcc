//! Taking one lock on etcd, step by step, as the crate's one retry loop
//! drives every [`LockService`](leasehold::backend::LockService): join the
//! lock's queue (a key under an etcd lease of our own, created only if
//! absent), then, while a key is ahead of ours, a wake-up that watches it
//! go (and keeps our etcd lease alive meanwhile), and a step that confirms
//! our place by the key itself before the lease is handed over. See the
//! [module docs](super) for why each step is safe.
//!
//! The acquire's place in the queue is its [`Entry`]: the loop hands it to
//! every step of the same acquire, so a step after a wait (or after a
//! fault) reads where the last one left off, and the acquire's end without
//! a win revokes its etcd lease ([`EtcdLocker::abandon`](super::EtcdLocker)).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::client::{
    Cmp, Compare, EtcdClient, EtcdError, EventKind, KeyValue, Op, Range, Txn, TxnResult, WatchKeys,
};
use leasehold::FencingToken;
use leasehold::Service;
use leasehold::backend::{Claim, Step};
use leasehold::{Error, Result};

use super::backend::{EtcdBackend, Held};

/// One acquire's place in a lock's queue, kept across its steps: the etcd
/// lease it was granted, and once the create landed, its key's creation
/// revision.
#[derive(Debug, Default)]
pub struct Entry {
    joined: Option<Joined>,
}

#[derive(Debug)]
struct Joined {
    lease: i64,
    /// Our key's creation revision: `None` until a create was answered
    /// (the first one, or one sent again after a lost answer).
    revision: Option<i64>,
}

impl Entry {
    /// The etcd lease a step may have left behind: revoked when the acquire
    /// ends without a win.
    pub(super) fn lease(&self) -> Option<i64> {
        self.joined.as_ref().map(|joined| joined.lease)
    }

    /// Our etcd lease was revoked: nothing is left to give back.
    pub(super) fn left(&mut self) {
        self.joined = None;
    }
}

/// The error of an etcd request made while taking a lock.
fn failed(source: EtcdError) -> Error {
    crate::error::failed("acquire", source)
}

/// The pause before asking again after a fault that may pass (etcd
/// electing a leader, a member going away), inside a wake-up.
const FAULT_PAUSE: Duration = Duration::from_millis(50);

/// One step towards the lock `claim` names, within `deadline`: join the
/// queue if this acquire has no place in it yet (grant an etcd lease, then
/// create our key under it: two requests, one after the other), else read
/// our place and renew our etcd lease (two requests, sent together). Won
/// when our key is the oldest; else busy until the key just ahead of ours
/// goes. A place that is gone (our etcd lease ended: its keep-alives failed
/// for a whole TTL, or an operator revoked it) is given up and the acquire
/// joins again at the back, in the same step.
pub(super) async fn step(
    backend: &Arc<EtcdBackend>,
    claim: &Claim,
    entry: &mut Entry,
    deadline: Instant,
) -> Result<Step> {
    let mut rejoined = false;
    loop {
        let place = match &entry.joined {
            None => join(backend, claim, entry, deadline).await?,
            Some(Joined {
                lease,
                revision: None,
            }) => {
                let lease = *lease;
                create(backend, claim, entry, lease, deadline).await?
            }
            Some(Joined {
                lease,
                revision: Some(revision),
            }) => {
                let held = backend.held_for(claim, *lease, *revision);
                look(backend, claim, &held, deadline).await?
            }
        };
        let (held, place, read_at) = match place {
            Some(found) => found,
            None => {
                // Our place is gone: leave it (its etcd lease may still
                // live), and join again at the back: at once the first
                // time, after the loop's next wait if the new place went
                // too.
                if let Some(lease) = entry.joined.take().map(|joined| joined.lease) {
                    backend.spawn_revoke(lease);
                }
                tracing::debug!(
                    key = claim.key(),
                    "our waiter key went with its etcd lease; joining the queue again"
                );
                if rejoined {
                    return Ok(Step::busy());
                }
                rejoined = true;
                continue;
            }
        };
        return match place {
            Place::First => {
                let fence = match claim.fence_key() {
                    Some(_) => Some(fence_of(held.revision)?),
                    None => None,
                };
                backend.hold(claim.token(), held);
                Ok(Step::won(fence))
            }
            Place::Behind { ahead } => Ok(Step::busy_until(wait_turn(
                backend.client.clone(),
                held.lease,
                claim.ttl(),
                ahead.key,
                read_at + 1,
            ))),
        };
    }
}

/// Grants our etcd lease (safe to send again: a lease granted by a try
/// whose answer was lost has no key, and its TTL ends it), then creates our
/// key under it.
async fn join(
    backend: &Arc<EtcdBackend>,
    claim: &Claim,
    entry: &mut Entry,
    deadline: Instant,
) -> Result<Option<(Held, Place, i64)>> {
    let grant = backend
        .client
        .grant(claim.ttl(), deadline)
        .await
        .map_err(failed)?;
    // Kept before the create goes out: an acquire that ends during it
    // revokes the lease, and the key with it.
    entry.joined = Some(Joined {
        lease: grant.id,
        revision: None,
    });
    create(backend, claim, entry, grant.id, deadline).await
}

/// Creates our key `key` under etcd lease `lease`, if absent: our place in
/// the queue, at the key's creation revision. The create is safe to send
/// again: a try whose answer was lost (the step's error says so, and the
/// next step sends it again) makes the next one find the key under our
/// lease. `None` when our etcd lease ended before the key was made.
async fn create(
    backend: &EtcdBackend,
    claim: &Claim,
    entry: &mut Entry,
    lease: i64,
    deadline: Instant,
) -> Result<Option<(Held, Place, i64)>> {
    let key = backend.waiter_key(claim.key(), lease);
    let queue = backend.queue(claim.key());
    // The two newest keys of the queue, read in the same transaction (after
    // our put: a read in a transaction sees its own writes): ours, and the
    // one just ahead of it, if any. So an uncontended acquire knows it
    // holds the lock, and a contended one what to watch, without another
    // request.
    let create = Txn::new()
        .when(Compare::create_revision(key.as_str(), Cmp::Equal, 0))
        .then(Op::put(key.as_str(), "", lease))
        .then(Op::range(
            Range::prefix(queue.as_str()).newest_first().limit(2),
        ))
        .otherwise(Op::range(Range::key(key.as_str())));
    let txn = match backend.client.txn(&create, deadline).await {
        Ok(txn) => txn,
        // Our etcd lease ended while the create was refused or out of reach
        // (no keep-alive goes before we are in the queue).
        Err(err) if err.is_lease_not_found() => return Ok(None),
        Err(err) => return Err(failed(err)),
    };
    let read_at = txn.header.revision;
    if txn.succeeded {
        let held = backend.held_for(claim, lease, read_at);
        entry.joined = Some(Joined {
            lease,
            revision: Some(read_at),
        });
        let newest = txn.ranges().next().cloned().unwrap_or_default();
        let place = match newest.as_slice() {
            [mine] if held.is(mine) => Place::First,
            [mine, ahead] if held.is(mine) => Place::Behind {
                ahead: ahead.clone(),
            },
            _ => {
                return Err(Error::UnexpectedReply {
                    service: Service::ETCD,
                    op: "acquire",
                });
            }
        };
        return Ok(Some((held, place, read_at)));
    }
    // The key exists: ours (our lease's ID is in its name) only if under
    // our lease, which a try whose answer was lost made. Then where it
    // stands is read as after a wait.
    let Some(mine) = txn.first_range().first().filter(|kv| kv.lease == lease) else {
        return Ok(None);
    };
    let held = backend.held_for(claim, lease, mine.create_revision);
    entry.joined = Some(Joined {
        lease,
        revision: Some(held.revision),
    });
    look(backend, claim, &held, deadline).await
}

/// Reads our place and renews our etcd lease, sent together: if the read
/// finds us first, the lock is ours, and the lease counts from the step's
/// start, before the keep-alive was sent (its renewal counts from when it
/// landed). `None` when our place is gone.
async fn look(
    backend: &EtcdBackend,
    claim: &Claim,
    held: &Held,
    deadline: Instant,
) -> Result<Option<(Held, Place, i64)>> {
    let client = &backend.client;
    let read_place = place_read(&backend.queue(claim.key()), held);
    let (read, kept) = futures_util::future::join(
        client.txn(&read_place, deadline),
        client.keep_alive_once(held.lease, deadline),
    )
    .await;
    let read = match (read, kept) {
        (Ok(_), Err(EtcdError::LeaseNotFound { .. })) => return Ok(None),
        (Ok(read), Ok(_)) => read,
        (Err(err), _) | (Ok(_), Err(err)) => return Err(failed(err)),
    };
    Ok(place(&read, held).map(|place| (held.clone(), place, read.header.revision)))
}

/// The fencing token of a key created at `revision`.
fn fence_of(revision: i64) -> Result<FencingToken> {
    FencingToken::try_from(revision).map_err(|_| Error::UnexpectedReply {
        service: Service::ETCD,
        op: "acquire",
    })
}

/// Where we stand in the queue, as read at one revision.
enum Place {
    /// Our key is the oldest: we hold the lock.
    First,
    /// `ahead` is the key just before ours.
    Behind { ahead: KeyValue },
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

/// Our place, from the answer to [`place_read`]; `None` when our key is
/// gone (our etcd lease ended while we waited).
fn place(read: &TxnResult, held: &Held) -> Option<Place> {
    let mut ranges = read.ranges();
    let (mine, ahead) = (ranges.next(), ranges.next());
    if !mine
        .and_then(|kvs| kvs.first())
        .is_some_and(|kv| held.is(kv))
    {
        return None;
    }
    Some(
        match ahead
            .and_then(|kvs| kvs.first())
            .filter(|kv| kv.create_revision < held.revision)
        {
            None => Place::First,
            Some(ahead) => Place::Behind {
                ahead: ahead.clone(),
            },
        },
    )
}

/// The wake-up of a waiter whose key is behind `ahead`: resolves when
/// `ahead` is deleted (from revision `from` on), keeping our etcd lease
/// `lease` alive meanwhile (every `ttl / 3`). It also resolves when there
/// is something to read (our etcd lease is gone, the history from `from`
/// was compacted, a fault that is not a member's silence): the next step
/// reads our place and says. The loop drops it at the acquire's deadline
/// or cancellation.
///
/// A watch whose member falls silent moves to another member, missing
/// nothing (it starts again from the revision after the last one it saw):
/// when its stream breaks, and as soon as a keep-alive finds its member
/// silent, not when the connection's own ping gives up (seconds later).
async fn wait_turn(client: EtcdClient, lease: i64, ttl: Duration, ahead: Vec<u8>, from: i64) {
    let keep_every = (ttl / 3).max(Duration::from_millis(1));
    // A keep-alive is due every `keep_every`: its attempts fit in half of
    // that, so a silent member costs one and the next member renews our
    // etcd lease in time, as a held lease's refresh does.
    let keeper = client.with_attempt_timeout(keep_every / 2);
    let bound = keep_every.max(Duration::from_secs(1));
    let mut next_keep_alive = Instant::now() + keep_every;
    let mut from = from;
    loop {
        let mut watch = match client
            .watch(&WatchKeys::key(ahead.clone()), from, Instant::now() + bound)
            .await
        {
            Ok(watch) => watch,
            Err(err) if err.is_retryable() => {
                tokio::time::sleep(FAULT_PAUSE).await;
                continue;
            }
            Err(_) => return,
        };
        loop {
            tokio::select! {
                biased;
                () = tokio::time::sleep_until(next_keep_alive) => {
                    match keeper.keep_alive_once(lease, Instant::now() + bound).await {
                        Ok(_) => next_keep_alive = Instant::now() + keep_every,
                        // Our etcd lease lives on for a while: try again
                        // soon; if it ends, our key goes and the next
                        // read says so.
                        Err(err) if err.is_retryable() => {
                            next_keep_alive = Instant::now() + FAULT_PAUSE;
                        }
                        Err(_) => return,
                    }
                    if client.is_demoted(watch.endpoint()) {
                        from = watch.next_revision();
                        break;
                    }
                }
                batch = watch.next() => match batch {
                    Ok(batch) if batch.events.iter().any(|e| e.kind == EventKind::Delete) => return,
                    Ok(_) => {}
                    Err(EtcdError::WatchLost { .. }) => {
                        from = watch.next_revision();
                        break;
                    }
                    Err(_) => return,
                },
            }
        }
    }
}
