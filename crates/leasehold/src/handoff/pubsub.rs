//! Routing the subscription connection's pushes: each message to the waiter
//! it names, and the subscription's own events (a channel whose slot moved,
//! a connection that dropped and came back) to the waiters that must
//! re-check the lock.

use std::sync::Arc;

use tokio::sync::mpsc;

use crate::node::RedisConnection;

use super::TARGET;
use super::local::Signal;
use super::release::HandoffBackend;

/// Reads a bulk string push item as text.
fn text(value: Option<&redis::Value>) -> Option<&str> {
    match value? {
        redis::Value::BulkString(bytes) => std::str::from_utf8(bytes).ok(),
        redis::Value::SimpleString(text) => Some(text),
        _ => None,
    }
}

/// Delivers each `g <token> <key> <fence>` / `w <token> <key>` message to
/// the local waiter. A message for a waiter that is no longer registered
/// is dropped when the token holds a lease here (it won the lock another
/// way: a re-check found it handed over); otherwise the hand-off is an
/// orphan and is passed on ([`HandoffBackend::pass_orphan`]).
///
/// Keeps the subscriptions up: when the server drops one because its slot
/// moved to another node (`sunsubscribe` we did not ask for), it subscribes
/// again, which reaches the new owner; when a one-node connection drops
/// (Redis restarted, the connection was killed), it reconnects and
/// subscribes again (a cluster connection does both itself, once a request
/// fails on the dropped node connection: while channels are in use, a
/// keepalive request per channel each command timeout makes sure one
/// does, [`Subscriptions::poke`](super::subscriptions::Subscriptions::poke)). Each time a
/// subscription is confirmed that no waiter of ours asked for (one made
/// again) it wakes this locker's waiters on that channel (after a
/// reconnect, all of them): a message sent while nobody listened is lost, and a release that found
/// nobody listening dropped our waiter from Redis's queue, so each one
/// re-checks the lock (and re-joins the queue) at once instead of at its
/// fallback timer.
pub(super) async fn route<C: RedisConnection>(
    mut pushes: mpsc::UnboundedReceiver<redis::PushInfo>,
    backend: Arc<HandoffBackend<C>>,
    node: bool,
) {
    let local = &backend.local;
    let mut keepalive = tokio::time::interval(backend.subs.keepalive());
    keepalive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let push = tokio::select! {
            push = pushes.recv() => match push {
                Some(push) => push,
                None => return,
            },
            _ = keepalive.tick(), if !node => {
                let backend = backend.clone();
                tokio::spawn(async move {
                    for channel in backend.subs.poke().await {
                        backend.local.wake_channel(&channel);
                    }
                });
                continue;
            }
        };
        match push.kind {
            redis::PushKind::SMessage | redis::PushKind::Message => {
                let Some(payload) = text(push.data.get(1)) else {
                    continue;
                };
                let mut parts = payload.split(' ');
                let (Some(kind), Some(token), Some(key)) =
                    (parts.next(), parts.next(), parts.next())
                else {
                    continue;
                };
                let signal = match kind {
                    "g" => match parts.next().map(str::parse::<u64>) {
                        Some(Ok(fence)) => Signal::Granted(fence),
                        None => Signal::Granted(0),
                        // Never a fenced lease without its token: the
                        // waiter learns of the grant from its queue entry
                        // ("granted <fence>") when it checks again.
                        Some(Err(_)) => {
                            tracing::warn!(
                                key,
                                "ignored a grant whose fencing token is not a number"
                            );
                            continue;
                        }
                    },
                    "w" => Signal::Woken,
                    _ => continue,
                };
                if !local.tell(token, signal) {
                    backend.pass_orphan(key, token);
                }
            }
            redis::PushKind::SSubscribe => {
                if let Some(channel) = text(push.data.first())
                    && !backend.subs.confirmed_own(channel)
                {
                    local.wake_channel(channel);
                }
            }
            redis::PushKind::SUnsubscribe => {
                let Some(channel) = text(push.data.first()) else {
                    continue;
                };
                let (backend, channel) = (backend.clone(), channel.to_owned());
                tokio::spawn(async move {
                    if !backend.subs.resubscribe(&channel).await {
                        backend.local.wake_all();
                    }
                });
            }
            redis::PushKind::Disconnection if node => {
                tracing::warn!(target: TARGET, "hand-off pub/sub connection lost; reconnecting");
                backend.subs.reconnect().await;
                tracing::info!(
                    target: TARGET,
                    "hand-off pub/sub connection back; waiters re-check the lock"
                );
                local.wake_all();
            }
            _ => {}
        }
    }
}
