//! The hand-off locker's one pub/sub connection: subscribing to its
//! channel, routing each message to the waiter it names, and reconnecting
//! when the connection drops.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::time::Instant;

use crate::call;
use crate::endpoint::Endpoint;
use crate::error::Result;
use crate::node::RedisConnection;

use super::TARGET;
use super::local::Signal;
use super::release::HandoffBackend;

/// Opens a pub/sub connection subscribed to `channel`, each request bounded
/// by `timeout`. Through Sentinel, on the primary the sentinels name now:
/// a hand-off locker's messages are published there.
pub(super) async fn subscribe(
    endpoint: &Endpoint,
    channel: &str,
    timeout: Duration,
) -> Result<redis::aio::PubSubStream> {
    let deadline = Instant::now() + timeout;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout));
    let client = call::bounded("subscribe", "", deadline, endpoint.client(&config)).await?;
    let mut pubsub = call::bounded("subscribe", "", deadline, client.get_async_pubsub()).await?;
    call::bounded("subscribe", "", deadline, pubsub.subscribe(channel)).await?;
    Ok(pubsub.into_on_message())
}

/// Delivers each `g <token> <key> <fence>` / `w <token> <key>` message to
/// the local waiter. A message for a waiter that is no longer registered
/// is dropped when the token holds a lease here (it won the lock another
/// way: a re-check found it handed over); otherwise the hand-off is an
/// orphan and is passed on ([`HandoffBackend::pass_orphan`]).
///
/// When the connection drops (Redis restarted, the connection was killed),
/// it reconnects and resubscribes, retrying with a growing pause (up to 1 s)
/// while Redis is down, then wakes every waiter of this locker: a message
/// sent while nobody listened is lost, and a release that found nobody
/// listening dropped our waiter from Redis's queue, so each one re-checks
/// the lock (and re-joins the queue) at once instead of at its fallback
/// timer.
pub(super) async fn route<C: RedisConnection>(
    endpoint: Endpoint,
    mut messages: redis::aio::PubSubStream,
    backend: Arc<HandoffBackend<C>>,
    timeout: Duration,
) {
    let local = &backend.local;
    loop {
        while let Some(msg) = messages.next().await {
            let Ok(payload) = std::str::from_utf8(msg.get_payload_bytes()) else {
                continue;
            };
            let mut parts = payload.split(' ');
            let (Some(kind), Some(token), Some(key)) = (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let signal = match kind {
                "g" => {
                    let fence = parts.next().and_then(|f| f.parse().ok()).unwrap_or(0);
                    Signal::Granted(fence)
                }
                "w" => Signal::Woken,
                _ => continue,
            };
            if !local.tell(token, signal) {
                backend.pass_orphan(key, token);
            }
        }
        tracing::warn!(
            target: TARGET,
            channel = local.channel,
            "hand-off pub/sub connection lost; reconnecting"
        );
        let mut pause = Duration::from_millis(20);
        messages = loop {
            match subscribe(&endpoint, &local.channel, timeout).await {
                Ok(messages) => break messages,
                Err(err) => {
                    tracing::debug!(target: TARGET, error = %err, "hand-off pub/sub reconnect failed; retrying");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
            }
        };
        tracing::info!(
            target: TARGET,
            channel = local.channel,
            "hand-off pub/sub connection back; waiters re-check the lock"
        );
        local.wake_all();
    }
}
