//! The hand-off locker's subscriptions: one sharded pub/sub connection
//! (`SSUBSCRIBE`, RESP3 pushes), to one node or across a Redis Cluster, and
//! the shard channels its waiters need.
//!
//! # Why sharded, and one channel per hash tag
//!
//! A release tells a waiter from inside its script, and counts the
//! receivers to tell a live waiter from a dead one. Classic `PUBLISH` on a
//! cluster counts only the subscribers on the node that runs the script, so
//! a waiter connected to another node looked dead. `SPUBLISH` routes by
//! slot: the subscriber sits on the node that owns the channel's slot, and
//! in a script the channel counts as a key for the slot check. So each lock
//! key's waiters listen on a channel in the key's own slot:
//! `leasehold:handoff:{<tag>}:<locker id>` for a key with hash tag `<tag>`
//! (on a cluster every hand-off key has one: its three keys must share a
//! slot), `leasehold:handoff:<locker id>` otherwise. A single Redis 7 node
//! takes the same commands, so there is one code path.
//!
//! A locker subscribes to a tag's channel when a waiter of its first needs
//! it (before the waiter's request that may queue it, so no hand-off is
//! missed), and unsubscribes a while ([`LINGER`]) after the last one left.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::call;
use crate::error::{Error, Result};
use crate::service::Service;

use super::TARGET;
use super::client::{HandoffClient, Source};

/// How long a tag's channel stays subscribed after its last waiter left, so
/// that a key contended again soon does not pay a subscribe again.
pub(super) const LINGER: Duration = Duration::from_secs(5);

/// The hash tag of `key`, as Redis Cluster finds it: what lies between the
/// first `{` and the first `}` after it, if that is not empty.
fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let rest = &key[open + 1..];
    let close = rest.find('}')?;
    (close > 0).then(|| &rest[..close])
}

/// The channel names of one locker.
#[derive(Debug)]
pub(super) struct Channels {
    id: String,
}

impl Channels {
    pub(super) fn new(id: String) -> Self {
        Channels { id }
    }

    /// The channel for keys without a hash tag (one node only): also the
    /// one subscribed at connect, which checks that the server has sharded
    /// pub/sub.
    pub(super) fn base(&self) -> String {
        format!("leasehold:handoff:{}", self.id)
    }

    /// The channel that reaches this locker's waiters on lock key `key`:
    /// in the key's slot when it has a hash tag.
    pub(super) fn for_key(&self, key: &str) -> String {
        match hash_tag(key) {
            Some(tag) => format!("leasehold:handoff:{{{tag}}}:{}", self.id),
            None => self.base(),
        }
    }
}

/// The subscription connection.
enum Conn {
    Node(redis::aio::MultiplexedConnection),
    #[cfg(feature = "cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Conn {
    /// Opens the connection, its pushes (messages, subscription
    /// confirmations, server-side unsubscriptions, disconnections) sent to
    /// `pushes`.
    async fn open(
        client: &HandoffClient,
        pushes: mpsc::UnboundedSender<redis::PushInfo>,
        timeout: Duration,
    ) -> redis::RedisResult<Conn> {
        match &client.source {
            Source::Node(endpoint) => {
                // Through Sentinel: the primary the sentinels name now.
                let config = redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(timeout))
                    .set_response_timeout(Some(timeout));
                let client = endpoint.client(&config).await?;
                let info = client.get_connection_info().clone();
                let settings = info
                    .redis_settings()
                    .clone()
                    .set_protocol(redis::ProtocolVersion::RESP3);
                let client = redis::Client::open(info.set_redis_settings(settings))?;
                let config = redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(timeout))
                    .set_response_timeout(Some(timeout))
                    .set_push_sender(pushes);
                let conn = client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?;
                Ok(Conn::Node(conn))
            }
            #[cfg(feature = "cluster")]
            Source::Cluster(client) => {
                let config = redis::cluster::ClusterConfig::new()
                    .set_connection_timeout(timeout)
                    .set_response_timeout(timeout)
                    .set_push_sender(pushes);
                let conn = client.get_async_connection_with_config(config).await?;
                Ok(Conn::Cluster(conn))
            }
        }
    }

    async fn ssubscribe(&mut self, channel: &str) -> redis::RedisResult<()> {
        match self {
            Conn::Node(conn) => redis::cmd("SSUBSCRIBE").arg(channel).exec_async(conn).await,
            #[cfg(feature = "cluster")]
            Conn::Cluster(conn) => conn.ssubscribe(channel).await,
        }
    }

    /// Points a cluster connection's slot map at the current primary of
    /// `key`'s slot: a `GET` there follows `MOVED` (a node demoted by a
    /// failover answers it; it would take an `SSUBSCRIBE`, and then the
    /// subscription would sit on a replica, whose messages releases do not
    /// count). The reply and any error are of no interest.
    async fn find_primary(&mut self, key: &str, deadline: Instant) {
        #[cfg(feature = "cluster")]
        if let Conn::Cluster(conn) = self {
            let mut get = redis::cmd("GET");
            get.arg(key);
            let _ = tokio::time::timeout_at(deadline, get.query_async::<redis::Value>(conn)).await;
        }
        #[cfg(not(feature = "cluster"))]
        let _ = (key, deadline);
    }

    /// Whether `key`'s slot primary counts no subscriber of ours on
    /// `channel` (cluster only; `false` when it cannot tell).
    async fn lost_on_primary(&mut self, key: &str, channel: &str, deadline: Instant) -> bool {
        #[cfg(feature = "cluster")]
        if let Conn::Cluster(conn) = self {
            use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
            let mut numsub = redis::cmd("PUBSUB");
            numsub.arg("SHARDNUMSUB").arg(channel);
            let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(
                Route::with_key(key, SlotAddr::Master),
            ));
            let asked = tokio::time::timeout_at(deadline, conn.route_command(numsub, route)).await;
            let Ok(Ok(reply)) = asked else {
                return false;
            };
            let counts = redis::from_redis_value::<(String, u64)>(reply);
            return matches!(counts, Ok((_, 0)));
        }
        let _ = (key, channel, deadline);
        false
    }

    async fn sunsubscribe(&mut self, channel: &str) -> redis::RedisResult<()> {
        match self {
            Conn::Node(conn) => {
                redis::cmd("SUNSUBSCRIBE")
                    .arg(channel)
                    .exec_async(conn)
                    .await
            }
            #[cfg(feature = "cluster")]
            Conn::Cluster(conn) => conn.sunsubscribe(channel).await,
        }
    }
}

/// Maps a failed subscribe: a server without sharded pub/sub, a cluster
/// client without RESP3, or the usual outcomes.
fn subscribe_error(err: redis::RedisError) -> Error {
    if err.kind() == redis::ErrorKind::InvalidClientConfig {
        return Error::InvalidOptions(
            "hand-off on a cluster needs a RESP3 cluster client: ClusterClientBuilder::use_protocol(ProtocolVersion::RESP3)",
        );
    }
    let unknown = err.code() == Some("ERR")
        && err
            .detail()
            .is_some_and(|d| d.to_ascii_lowercase().contains("unknown command"));
    if unknown {
        return Error::Unsupported {
            what: "sharded pub/sub (SSUBSCRIBE), which hand-off waits on",
            needs: "7.0",
            source: err.into(),
        };
    }
    Error::from_redis("subscribe", "", err)
}

/// What the command lock guards: the connection, so subscribe and
/// unsubscribe commands go out in the order they were decided.
struct Commands {
    conn: Conn,
}

/// The locker's subscriptions: which channels its waiters use, which are
/// subscribed, and the connection.
pub(super) struct Subscriptions {
    pub(super) channels: Channels,
    client: HandoffClient,
    pushes: mpsc::UnboundedSender<redis::PushInfo>,
    timeout: Duration,
    commands: tokio::sync::Mutex<Commands>,
    /// Channels confirmed subscribed (changed only under `commands`).
    subscribed: Mutex<HashSet<String>>,
    /// How many waiters use each channel.
    uses: Mutex<HashMap<String, usize>>,
    /// A lock key of each channel's slot (the last one a waiter used it
    /// for), to point the connection at the slot's primary.
    keys: Mutex<HashMap<String, String>>,
    /// Confirmations of our own `SSUBSCRIBE`s not yet seen among the pushes
    /// (they wake nobody: the waiter that asked re-checks anyway).
    own: Mutex<HashMap<String, usize>>,
}

impl Subscriptions {
    /// Opens the connection and subscribes to the base channel, within
    /// `timeout`. Returns the pushes, for the routing task.
    ///
    /// # Errors
    /// [`Error::Unsupported`] on a Redis older than 7.0,
    /// [`Error::InvalidOptions`] for a RESP2 cluster client, else as any
    /// connect.
    pub(super) async fn open(
        client: HandoffClient,
        channels: Channels,
        timeout: Duration,
    ) -> Result<(Arc<Self>, mpsc::UnboundedReceiver<redis::PushInfo>)> {
        let deadline = Instant::now() + timeout;
        let (tx, rx) = mpsc::unbounded_channel();
        let base = channels.base();
        let mut conn = connect(&client, tx.clone(), timeout, deadline).await?;
        subscribe_on(&mut conn, &base, deadline).await?;
        let subs = Subscriptions {
            channels,
            client,
            pushes: tx,
            timeout,
            commands: tokio::sync::Mutex::new(Commands { conn }),
            subscribed: Mutex::new(HashSet::from([base])),
            uses: Mutex::default(),
            keys: Mutex::default(),
            own: Mutex::default(),
        };
        Ok((Arc::new(subs), rx))
    }

    fn subscribed(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.subscribed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn uses(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        self.uses.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts a waiter as a user of `channel` until the returned guard
    /// drops (then, with no user left, the channel is unsubscribed after
    /// [`LINGER`]).
    pub(super) fn use_channel(self: &Arc<Self>, channel: String, key: &str) -> ChannelUse {
        *self.uses().entry(channel.clone()).or_default() += 1;
        self.keys
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(channel.clone(), key.to_owned());
        ChannelUse {
            subs: self.clone(),
            channel,
        }
    }

    /// Makes sure `channel` is subscribed (one `SSUBSCRIBE` unless it is),
    /// by `deadline`.
    ///
    /// # Errors
    /// As the subscribe ([`Error::Timeout`], [`Error::Unreachable`],
    /// [`Error::NoPermission`], ...).
    pub(super) async fn ensure(&self, channel: &str, deadline: Instant) -> Result<()> {
        if self.subscribed().contains(channel) {
            return Ok(());
        }
        let started = Instant::now();
        let mut commands = tokio::time::timeout_at(deadline, self.commands.lock())
            .await
            .map_err(|_| Error::Timeout {
                service: Service::REDIS,
                op: "subscribe",
                after: started.elapsed(),
            })?;
        if self.subscribed().contains(channel) {
            return Ok(());
        }
        *self.own().entry(channel.to_owned()).or_default() += 1;
        let done = subscribe_on(&mut commands.conn, channel, deadline).await;
        if let Err(err) = &done
            && !matches!(err, Error::Timeout { .. })
        {
            // Refused: no confirmation will come.
            self.confirmed_own(channel);
        }
        done?;
        self.subscribed().insert(channel.to_owned());
        Ok(())
    }

    fn own(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        self.own.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a confirmed subscription to `channel` answers one of our
    /// own [`ensure`](Self::ensure)s (then counted off); `false` for one
    /// the connection made by itself (a cluster connection resubscribing
    /// after a reconnect), whose waiters must re-check.
    pub(super) fn confirmed_own(&self, channel: &str) -> bool {
        let mut own = self.own();
        match own.get_mut(channel) {
            Some(n) if *n > 1 => {
                *n -= 1;
                true
            }
            Some(_) => {
                own.remove(channel);
                true
            }
            None => false,
        }
    }

    /// The server dropped our subscription to `channel` (its slot moved to
    /// another node): subscribes again if we still want it, which reaches the
    /// slot's new owner (a `MOVED` on the way makes the cluster connection
    /// refresh its slot map: tried again). Tries for a few command
    /// timeouts. `false` when the channel is left unsubscribed: its waiters
    /// should re-check at once (their next request subscribes again).
    pub(super) async fn resubscribe(&self, channel: &str) -> bool {
        let until = Instant::now() + 3 * self.timeout;
        let mut commands = self.commands.lock().await;
        if !self.subscribed().contains(channel) {
            return true; // we unsubscribed it ourselves
        }
        let key = self
            .keys
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(channel)
            .cloned();
        let mut pause = Duration::from_millis(10);
        let outcome = loop {
            let deadline = Instant::now() + self.timeout;
            if let Some(key) = &key {
                commands.conn.find_primary(key, deadline).await;
            }
            match subscribe_on(&mut commands.conn, channel, deadline).await {
                Err(err) if refusal(&err).is_none() && Instant::now() + pause < until => {
                    tracing::debug!(target: TARGET, channel, error = %err, "subscribing again to a moved shard channel failed; retrying");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(200));
                }
                outcome => break outcome,
            }
        };
        match outcome {
            Ok(()) => {
                tracing::debug!(target: TARGET, channel, "shard channel moved; subscribed again");
                true
            }
            Err(err) => {
                self.subscribed().remove(channel);
                tracing::warn!(target: TARGET, channel, error = %err, "could not subscribe again to a moved shard channel");
                false
            }
        }
    }

    /// The node connection dropped: reconnects (retrying with a growing
    /// pause, up to 1 s, while Redis is down) and subscribes to every
    /// channel again. Only for a node client: a cluster connection does it
    /// itself.
    pub(super) async fn reconnect(&self) {
        let mut commands = self.commands.lock().await;
        let mut pause = Duration::from_millis(20);
        loop {
            let deadline = Instant::now() + self.timeout;
            let channels: Vec<String> = self.subscribed().iter().cloned().collect();
            let attempt = async {
                let mut conn =
                    connect(&self.client, self.pushes.clone(), self.timeout, deadline).await?;
                for channel in &channels {
                    subscribe_on(&mut conn, channel, deadline).await?;
                }
                Ok::<_, Error>(conn)
            };
            match attempt.await {
                Ok(conn) => {
                    commands.conn = conn;
                    return;
                }
                Err(err) => {
                    tracing::debug!(target: TARGET, error = %err, "hand-off pub/sub reconnect failed; retrying");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
            }
        }
    }

    /// How often a cluster subscription is checked ([`poke`](Self::poke)).
    pub(super) fn keepalive(&self) -> Duration {
        self.timeout
    }

    /// Sends a `GET` of a lock key of every channel in use, through the
    /// cluster subscription connection, to that slot's primary. redis-rs's
    /// cluster connection notices a dropped node connection (killed, a
    /// node restart) only when a request fails on it, and only then
    /// reconnects and subscribes again; an idle subscription connection
    /// sends none. So a waiter whose subscription was dropped is reached
    /// again within about one command timeout, not at its fallback timer.
    /// Then asks that primary whether it counts our subscription, and
    /// subscribes again where it does not (whatever redis-rs did):
    /// returns those channels, whose waiters should re-check. Skipped while
    /// a subscribe command is under way.
    pub(super) async fn poke(&self) -> Vec<String> {
        let used: HashSet<String> = self.uses().keys().cloned().collect();
        let keys: Vec<(String, String)> = self
            .keys
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|(channel, _)| used.contains(*channel))
            .map(|(channel, key)| (channel.clone(), key.clone()))
            .collect();
        let mut again = Vec::new();
        if keys.is_empty() {
            return again;
        }
        let Ok(mut commands) = self.commands.try_lock() else {
            return again;
        };
        for (channel, key) in keys {
            let deadline = Instant::now() + self.timeout;
            commands.conn.find_primary(&key, deadline).await;
            if !self.subscribed().contains(&channel)
                || !commands
                    .conn
                    .lost_on_primary(&key, &channel, deadline)
                    .await
            {
                continue;
            }
            if subscribe_on(&mut commands.conn, &channel, deadline)
                .await
                .is_ok()
            {
                tracing::debug!(target: TARGET, channel, "shard subscription lost; subscribed again");
                again.push(channel);
            }
        }
        again
    }

    /// Unsubscribes `channel` if nobody uses it (after [`LINGER`]).
    async fn unsubscribe_unused(&self, channel: &str) {
        let mut commands = self.commands.lock().await;
        if self.uses().contains_key(channel) || !self.subscribed().remove(channel) {
            return;
        }
        self.keys
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(channel);
        let deadline = Instant::now() + self.timeout;
        let done = call::bounded(
            "unsubscribe",
            "",
            deadline,
            commands.conn.sunsubscribe(channel),
        );
        if let Err(err) = done.await {
            // Harmless: a message on it finds no waiter and is passed on.
            tracing::debug!(target: TARGET, channel, error = %err, "could not unsubscribe an unused shard channel");
        }
    }
}

/// `Some` for an error that trying again cannot fix (an ACL refusal, a
/// server or client that cannot do sharded pub/sub).
fn refusal(err: &Error) -> Option<&Error> {
    matches!(
        err,
        Error::NoPermission { .. } | Error::Unsupported { .. } | Error::InvalidOptions(_)
    )
    .then_some(err)
}

async fn connect(
    client: &HandoffClient,
    pushes: mpsc::UnboundedSender<redis::PushInfo>,
    timeout: Duration,
    deadline: Instant,
) -> Result<Conn> {
    call::bounded(
        "subscribe",
        "",
        deadline,
        Conn::open(client, pushes, timeout),
    )
    .await
}

async fn subscribe_on(conn: &mut Conn, channel: &str, deadline: Instant) -> Result<()> {
    let started = Instant::now();
    match tokio::time::timeout_at(deadline, conn.ssubscribe(channel)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(err)) if err.is_timeout() => Err(Error::Timeout {
            service: Service::REDIS,
            op: "subscribe",
            after: started.elapsed(),
        }),
        Ok(Err(err)) => Err(subscribe_error(err)),
        Err(_) => Err(Error::Timeout {
            service: Service::REDIS,
            op: "subscribe",
            after: started.elapsed(),
        }),
    }
}

/// A waiter's use of a channel (see [`Subscriptions::use_channel`]).
pub(super) struct ChannelUse {
    subs: Arc<Subscriptions>,
    pub(super) channel: String,
}

impl Drop for ChannelUse {
    fn drop(&mut self) {
        let last = {
            let mut uses = self.subs.uses();
            match uses.get_mut(&self.channel) {
                Some(n) if *n > 1 => {
                    *n -= 1;
                    false
                }
                Some(_) => {
                    uses.remove(&self.channel);
                    true
                }
                None => false,
            }
        };
        if !last || self.channel == self.subs.channels.base() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let subs = Arc::downgrade(&self.subs);
        let channel = std::mem::take(&mut self.channel);
        runtime.spawn(async move {
            tokio::time::sleep(LINGER).await;
            if let Some(subs) = subs.upgrade() {
                subs.unsubscribe_unused(&channel).await;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server_error(text: &str) -> redis::RedisError {
        match redis::parse_redis_value(format!("-{text}\r\n").as_bytes())
            .and_then(redis::Value::extract_error)
        {
            Err(err) => err,
            Ok(value) => panic!("{text} parsed as {value:?}"),
        }
    }

    #[test]
    fn a_channel_shares_its_lock_keys_slot() {
        let channels = Channels::new("id".to_owned());
        assert_eq!(
            channels.for_key("lock:{wallet:42}"),
            "leasehold:handoff:{wallet:42}:id"
        );
        // Redis Cluster's rule: the first `{`, the first `}` after it.
        assert_eq!(channels.for_key("a{b{c}d}"), "leasehold:handoff:{b{c}:id");
        for untagged in ["lock:wallet", "lock:{}x", "lock:}{", "lock:{open"] {
            assert_eq!(
                channels.for_key(untagged),
                "leasehold:handoff:id",
                "{untagged}"
            );
        }
    }

    #[test]
    fn a_server_without_sharded_pubsub_is_unsupported() {
        let err = subscribe_error(server_error(
            "ERR unknown command 'SSUBSCRIBE', with args beginning with: 'leasehold:handoff:x' ",
        ));
        assert!(
            matches!(err, Error::Unsupported { needs: "7.0", .. }),
            "{err:?}"
        );
        assert!(!err.is_retryable());
        let err = subscribe_error(server_error(
            "NOPERM this user has no permissions to run the 'ssubscribe' command",
        ));
        assert!(matches!(err, Error::NoPermission { .. }), "{err:?}");
    }
}
