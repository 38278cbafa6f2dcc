//! The release side of hand-off: the backend a hand-off lease gives its
//! lock back through, serving the next waiter (in process by a relay, or
//! in Redis's queue by the release script), and leaving the queue.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::LockService;
use crate::call;
use crate::error::{Error, Result};
use crate::fencing::FencingToken;
use crate::lease::{Backend, Part, Reply, release_runtime, spawn_dropped_release};
use crate::locker::Locker;
use crate::node::{Node, RedisConnection, not_a_fence, ttl_millis};
use crate::token::LeaseToken;
use crate::watchdog::{Shared, Validity};

use super::local::{Local, Signal};
use super::relay::{Next, Turn};
use super::subscriptions::Subscriptions;
use super::{HandoffStyle, TARGET};

/// What a hand-off lease gives its lock back through: the node, the style,
/// and the locker's own waiters (served in process).
pub(crate) struct HandoffBackend<C> {
    pub(super) node: Arc<Node<C>>,
    /// The polling locker on the same node: a held lock is a plain
    /// lease's, refreshed and fenced as one.
    pub(super) locker: Locker<C>,
    pub(super) style: HandoffStyle,
    pub(super) local: Arc<Local>,
    /// The subscriptions, and the channel names that reach our waiters.
    pub(super) subs: Arc<Subscriptions>,
    /// Itself, to spawn the requests that pass on an orphan hand-off.
    pub(super) this: Weak<HandoffBackend<C>>,
}

impl<C> HandoffBackend<C> {
    /// Who a lease of ours on `key` that ends serves next: the relay's
    /// decision (synchronous), or nobody in process with relay off.
    fn next(&self, key: &str) -> Next {
        self.local
            .relay
            .as_ref()
            .map_or(Next::Nobody, |r| r.next(key))
    }
}

impl<C: RedisConnection> HandoffBackend<C> {
    /// A hand-off reached `token` (on `key`), which neither waits nor holds
    /// a lease here: nobody will take that lock or give it back, so we leave
    /// the queue on the token's behalf. The leave script is token-checked:
    /// it passes the lock on if the lock still holds `token` (or serves the
    /// queue if the lock is free), and changes nothing else. Without it the
    /// lock sat with nobody until its TTL ran out, once per stale queue entry
    /// a failover or a restart from disk brought back.
    pub(super) fn pass_orphan(&self, key: &str, token: &str) {
        let Some(token) = LeaseToken::parse(token) else {
            return;
        };
        if !self.local.orphan(&token) {
            tracing::debug!(
                target: TARGET,
                key,
                "served waiter no longer waits: it won the lock another way"
            );
            return;
        }
        let Some(this) = self.this.upgrade() else {
            return;
        };
        tracing::debug!(target: TARGET, key, "hand-off to a waiter gone from here; passing it on");
        spawn_leave(
            this,
            Part {
                key: key.to_owned(),
                token,
                fence_key: None,
                fence: None,
            },
        );
    }
}

impl<C: RedisConnection> Backend for HandoffBackend<C> {
    fn service(&self) -> crate::service::Service {
        crate::service::Service::REDIS
    }

    fn command_timeout(&self) -> Duration {
        self.node.command_timeout()
    }

    fn refresh<'a>(&'a self, part: &'a Part, ttl: Duration, deadline: Instant) -> Reply<'a, bool> {
        // The lock itself is a plain lease's.
        LockService::refresh(&self.locker, part, ttl, deadline)
    }

    fn release<'a>(&'a self, part: &'a Part, deadline: Instant) -> Reply<'a, bool> {
        self.local.held().remove(&part.token);
        Box::pin(release(self, part, deadline))
    }

    fn raise_fence<'a>(
        &'a self,
        fence_key: &'a str,
        at_least: FencingToken,
        deadline: Instant,
    ) -> Reply<'a, ()> {
        LockService::raise_fence(&self.locker, fence_key, at_least, deadline)
    }

    fn announce<'a>(
        &'a self,
        part: &'a Part,
        record_key: &'a str,
        body: &'a str,
        deadline: Instant,
    ) -> Reply<'a, bool> {
        LockService::announce(&self.locker, part, record_key, body, deadline)
    }

    fn held(&self, key: &str, shared: &Arc<Shared>) {
        if let Some(relay) = &self.local.relay {
            relay.hold(key, shared);
        }
    }

    fn release_dropped(self: Arc<Self>, part: Part, _until: Instant) {
        self.local.held().remove(&part.token);
        release_dropped(self, part);
    }
}

/// A fence from a script or message: `None` for 0 (unfenced).
pub(super) fn fence_of(value: u64) -> Option<FencingToken> {
    (value > 0).then(|| FencingToken::new(value))
}

/// The queue and waiter-entry keys of lock `key`.
pub(super) fn queue_keys(key: &str) -> [String; 2] {
    [format!("{key}:waitq"), format!("{key}:waiters")]
}

/// What a run of the release script is for.
#[derive(Debug, Clone, Copy)]
enum Mode<'a> {
    /// The holder gives the lock back: the next waiter in Redis's queue, or
    /// nobody, gets it.
    Release,
    /// A waiter gives up: it leaves Redis's queue, passing on a lock that
    /// was handed to it meanwhile.
    Leave,
    /// A checkpoint: the holder serves Redis's queue first and, with nobody
    /// live there, moves the lock to a waiter of its own process (`next`,
    /// TTL `px` ms), token-checked; a fenced waiter gets its fencing token.
    Checkpoint {
        px: u64,
        next: &'a str,
        fenced: bool,
    },
}

/// What one run of the release script did: its code, the token of one of
/// our own waiters it served (we must tell it), and the fence it issued to
/// that waiter or to the next local holder.
struct Served {
    code: i64,
    local: Option<String>,
    /// The fence issued (0: none; negative: woken, not granted).
    fence: i64,
}

/// Gives back the lock of `part`: to the next waiter of this locker if relay
/// is on and one waits, else to the next waiter in Redis's queue.
/// `Ok(false)`: the lock did not hold our token.
async fn release<C: RedisConnection>(
    backend: &HandoffBackend<C>,
    part: &Part,
    deadline: Instant,
) -> Result<bool> {
    serve(backend, part, backend.next(&part.key), deadline).await
}

/// The release of a lease dropped without [`Lease::release`]: who is served
/// next is decided here, synchronously, and only the Redis requests are
/// spawned. With no runtime to spawn them on, the local head goes to Redis
/// itself and the lock's TTL ends the dropped lease.
fn release_dropped<C: RedisConnection>(backend: Arc<HandoffBackend<C>>, part: Part) {
    let next = backend.next(&part.key);
    let Some(runtime) = release_runtime(&part.key) else {
        if let (Next::Relay(queued) | Next::Checkpoint(queued), Some(relay)) =
            (next, &backend.local.relay)
        {
            relay.pass_place(&part.key, Some(queued));
        }
        return;
    };
    spawn_dropped_release(&runtime, part.key.clone(), async move {
        let deadline = Instant::now() + backend.node.command_timeout();
        serve(&backend, &part, next, deadline).await
    });
}

/// Serves `next` (what the relay decided) with the lock of `part`. Every
/// move of the lock is one token-checked script run, so a local waiter is
/// handed a lease only after Redis moved the lock to its own fresh token
/// (and issued its own fencing token).
async fn serve<C: RedisConnection>(
    backend: &HandoffBackend<C>,
    part: &Part,
    mut next: Next,
    deadline: Instant,
) -> Result<bool> {
    let key = part.key.as_str();
    let Some(relay) = &backend.local.relay else {
        return release_in_redis(backend, part, Mode::Release, deadline).await;
    };
    let mut holding = part.clone();
    // Set once a pass moved the lock from the releasing lease's token: that
    // lease was then held until its release, whatever happens after.
    let mut confirmed = false;
    loop {
        let (queued, serve_queue) = match next {
            Next::Nobody => {
                let released = release_in_redis(backend, &holding, Mode::Release, deadline).await;
                return settle(key, confirmed, released);
            }
            Next::Relay(queued) => (queued, false),
            Next::Checkpoint(queued) => (queued, true),
        };
        let Ok(next_token) = LeaseToken::generate() else {
            relay.pass_place(key, Some(queued));
            next = Next::Nobody;
            continue;
        };
        // The counter that issues the next holder's token (and any fenced
        // Redis waiter's): the waiter's own, else ours.
        let fence_key = queued.fence_key().or(holding.fence_key.as_deref());
        let sent_at = Instant::now();
        let moved = if serve_queue {
            let mode = Mode::Checkpoint {
                px: ttl_millis(queued.ttl()),
                next: next_token.as_str(),
                fenced: queued.fence_key().is_some(),
            };
            release_once(backend, &holding, fence_key, mode, deadline).await
        } else {
            relay_once(backend, &holding, &next_token, &queued, deadline).await
        };
        match moved {
            Ok(Served { code: 3, fence, .. }) => {
                confirmed = true;
                let fence = fence_of(u64::try_from(fence).unwrap_or(0));
                tracing::debug!(
                    target: TARGET,
                    key,
                    fence = fence.map(FencingToken::get),
                    checkpoint = serve_queue,
                    "passed the lock to a waiter of this locker"
                );
                let validity = Validity::new(sent_at, queued.ttl());
                let turn = Turn::Lease {
                    token: next_token.clone(),
                    validity,
                    fence,
                };
                let fence_key = queued.fence_key().map(str::to_owned);
                if queued.hand(turn).is_ok() {
                    return Ok(true);
                }
                // It stopped waiting: the lock now holds a token nobody has;
                // pass it on (or give it back) for it.
                holding = Part {
                    key: key.to_owned(),
                    token: next_token,
                    fence_key,
                    fence,
                };
                next = relay.next(key);
            }
            Ok(served) => {
                if served.code == 2 && served.local.is_some() {
                    // The checkpoint served a unit of ours that waited in
                    // Redis: our local head waits on, behind it.
                    relay.keep_first(key, queued);
                } else {
                    relay.pass_place(key, Some(queued));
                }
                tell_served(key, backend, &served);
                return Ok(confirmed || served.code != 0);
            }
            // A full server refuses the pass (it writes the next holder's
            // token): give the lock back in Redis instead, which needs no
            // memory, and send the waiter there.
            Err(Error::OutOfMemory { .. }) => {
                relay.pass_place(key, Some(queued));
                next = Next::Nobody;
            }
            Err(err) => {
                relay.pass_place(key, Some(queued));
                return settle(key, confirmed, Err(err));
            }
        }
    }
}

/// The outcome of a release whose last step was `last`: once a pass had
/// confirmed the releasing lease, a failure after it (on the lock moved to a
/// waiter that then left) is not that lease's; the TTL ends it.
fn settle(key: &str, confirmed: bool, last: Result<bool>) -> Result<bool> {
    if !confirmed {
        return last;
    }
    if let Err(err) = last {
        tracing::warn!(target: TARGET, key, error = %err, "could not give back a lock passed to a waiter that left; the ttl will end it");
    }
    Ok(true)
}

/// Gives back (or, with [`Mode::Leave`], leaves the queue for) the lock in
/// Redis, handing it to the next waiter there. `Ok(false)`: the lock did not
/// hold our token.
async fn release_in_redis<C: RedisConnection>(
    backend: &HandoffBackend<C>,
    part: &Part,
    mode: Mode<'_>,
    deadline: Instant,
) -> Result<bool> {
    let served = release_once(backend, part, part.fence_key.as_deref(), mode, deadline).await?;
    if served.code == 2 {
        tracing::debug!(
            target: TARGET,
            key = part.key,
            local = served.local.is_some(),
            "handed the lock to the next waiter in the queue"
        );
    }
    tell_served(&part.key, backend, &served);
    Ok(served.code != 0)
}

/// When a release served one of this locker's own Redis waiters, the script
/// did not tell it: we do. If it no longer waits and holds no lease, the
/// hand-off is an orphan and is passed on
/// ([`HandoffBackend::pass_orphan`]); if it won the lock another way
/// meanwhile (a re-check found it handed over, or another client's script
/// granted it), the lock is rightly its and is left alone. (Handing the lock
/// on whenever the waiter was gone took it, under load, from a waiter that
/// had just won it.)
fn tell_served<C: RedisConnection>(key: &str, backend: &HandoffBackend<C>, served: &Served) {
    let signal = match (backend.style, u64::try_from(served.fence)) {
        (HandoffStyle::Grant, Ok(fence)) => Signal::Granted(fence),
        // Woken instead of granted (a fenced waiter we could not issue a
        // token to): it takes the lock itself.
        (HandoffStyle::Grant, Err(_)) | (HandoffStyle::Wake, _) => Signal::Woken,
    };
    if let Some(next) = &served.local
        && !backend.local.tell(next, signal)
    {
        backend.pass_orphan(key, next);
    }
}

/// One run of the release script for the lock of `part`, with `fence_key`
/// (if any) as the counter that issues fencing tokens to the waiters it
/// serves.
async fn release_once<C: RedisConnection>(
    backend: &HandoffBackend<C>,
    part: &Part,
    fence_key: Option<&str>,
    mode: Mode<'_>,
    deadline: Instant,
) -> Result<Served> {
    let key = part.key.as_str();
    backend.node.counters.release_request();
    let [queue, waiters] = queue_keys(key);
    let mut conn = backend.node.conn();
    let mut invocation = crate::scripts::HANDOFF_RELEASE.key(key);
    invocation.key(&queue).key(&waiters);
    if let Some(fence_key) = fence_key {
        invocation.key(fence_key);
    }
    let (mode, px, next, fenced) = match mode {
        Mode::Release => ("", 0, "", false),
        Mode::Leave => ("leave", 0, "", false),
        Mode::Checkpoint { px, next, fenced } => ("pass", px, next, fenced),
    };
    invocation
        .arg(&part.token)
        .arg(backend.style.as_arg())
        .arg(mode)
        .arg(backend.subs.channels.for_key(key))
        .arg(px)
        .arg(next)
        .arg(if fenced { "f" } else { "-" })
        .arg(backend.node.fence_ttl_ms());
    let reply = call::bounded("release", key, deadline, invocation.invoke_async(&mut conn)).await;
    let (code, local, fence): (i64, String, i64) = match reply {
        Ok(reply) => reply,
        Err(err) => return Err(not_a_fence(err, fence_key.unwrap_or(""))),
    };
    Ok(Served {
        code,
        local: Some(local).filter(|t| !t.is_empty()),
        fence,
    })
}

/// One run of the relay script: moves the lock of `part` to `next` (the
/// local waiter `queued`'s token), with its fencing token if it is fenced.
/// Code 3 when it moved, 0 when the lock did not hold `part`'s token.
async fn relay_once<C: RedisConnection>(
    backend: &HandoffBackend<C>,
    part: &Part,
    next: &LeaseToken,
    queued: &super::relay::Queued,
    deadline: Instant,
) -> Result<Served> {
    let key = part.key.as_str();
    backend.node.counters.release_request();
    let mut conn = backend.node.conn();
    let mut invocation = crate::scripts::RELAY.key(key);
    if let Some(fence_key) = queued.fence_key() {
        invocation.key(fence_key);
    }
    invocation
        .arg(&part.token)
        .arg(next)
        .arg(ttl_millis(queued.ttl()))
        .arg(backend.node.fence_ttl_ms());
    let reply = call::bounded("release", key, deadline, invocation.invoke_async(&mut conn)).await;
    let (moved, fence): (i64, i64) = match reply {
        Ok(reply) => reply,
        Err(err) => return Err(not_a_fence(err, queued.fence_key().unwrap_or(""))),
    };
    Ok(Served {
        code: if moved == 1 { 3 } else { 0 },
        local: None,
        fence,
    })
}

/// Leaves Redis's queue in the background (the waiter gave up).
pub(super) fn spawn_leave<C: RedisConnection>(backend: Arc<HandoffBackend<C>>, part: Part) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::debug!(
            target: TARGET,
            key = part.key,
            "no tokio runtime to leave the wait queue; the entry expires"
        );
        return;
    };
    runtime.spawn(async move {
        let deadline = Instant::now() + backend.node.command_timeout();
        let left = release_in_redis(&backend, &part, Mode::Leave, deadline);
        if let Err(err) = left.await {
            tracing::warn!(target: TARGET, key = part.key, error = %err, "could not leave the wait queue; the entry expires");
        }
    });
}
