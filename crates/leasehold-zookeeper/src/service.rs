//! [`ZkLocker`] as a [`LockService`]: taking a lock step by step in
//! Curator's layout (see [`layout`](crate::layout)), and refreshing,
//! releasing and announcing a lock held.
//!
//! # One acquire
//!
//! The first step creates the acquire's contender node (its directory
//! first, as containers, if it is missing) and every step then lists the
//! directory: the lowest sequence holds the lock. A waiter watches only
//! the contender just ahead of it (no herd) and steps again when that one
//! goes; the next listing decides, since the one ahead may have been a
//! waiter that gave up rather than the holder. A contender whose node is
//! gone (deleted by hand, or its session ended) joins again at the back.
//!
//! A create whose answer was lost may have made a node: the step's error
//! says the outcome is unknown, and the undo the crate then runs lists the
//! directory and deletes every node with the acquire's unique prefix. An
//! acquire that ends without a win (gave up, cancelled, dropped) does the
//! same in the background, trying again while its session lives: a node
//! left behind would hold the lock for as long as the session lives, which
//! is as long as this process keeps the locker.
//!
//! # The fencing token
//!
//! The winner's token is its node's creation zxid (`czxid`). Contenders
//! are served in sequence order, and a node's sequence and its zxid grow
//! together (both are given when the ensemble commits the create), so
//! each holder's token is above every earlier holder's. ZooKeeper 3.8.0
//! (Debian bookworm's) sometimes answers a create with an invalid `Stat`
//! (ZOOKEEPER-4026: `czxid` -1); the node's own `Stat` is then read back
//! before the win.
//!
//! # The holder's watch
//!
//! A lease's watchdog arms [`LockService::watch_held`]: a watch on the
//! holder's own node (an `exists` with a watch, on the session that made
//! it). It resolves when the node is deleted (by hand: an operator's
//! `deleteall`, a script), when the session ends (expired, closed), when
//! the node is missing or not ours as it is armed, and when it cannot be
//! armed (a fault): the watchdog then refreshes at once, and only that
//! refresh (the node still there, owned by our session) decides. A change
//! of the node's data (an election's leader record, written by this
//! holder) is not a loss: the watch is set again. ZooKeeper keeps a watch
//! across a reconnection within the session, and delivers a deletion that
//! happened meanwhile when it sets it again.
//!
//! # Why a win lasts the TTL
//!
//! The lock is the node, and the node lives as long as the session. The
//! server expires a session a session timeout after it last heard from
//! the client, and it heard from us after the step (or refresh) began:
//! so a TTL no longer than the *negotiated* session timeout is honoured,
//! counted from the request's send time, as the crate counts it. A longer
//! TTL is refused before any I/O ([`LockService::check_ttl`]).

use std::time::Duration;

use leasehold::backend::{Claim, Held, Reply, ServiceFault, Step, Wake};
use leasehold::{Error, FencingToken, LeaseToken, LockService, Result, Service};
use tokio::time::Instant;
use zookeeper_client::{Acls, Client, CreateMode, Error as ZkError, EventType};

use crate::fault::{ZOOKEEPER, within, zk_fault};
use crate::layout::{contenders, decode_record, encode_record, node_prefix};
use crate::locker::{ZkLocker, ended};

/// One acquire's place in a lock's queue, kept across its steps.
#[derive(Debug, Default)]
pub struct Contender {
    /// Our node, once a create was answered.
    node: Option<Node>,
    /// A create was sent whose node we may not know of (its answer was
    /// lost): found again by the acquire's prefix.
    sent: bool,
}

#[derive(Debug, Clone)]
struct Node {
    /// Its name in the lock's directory.
    name: String,
    /// The session that created it (the node goes with it).
    session: i64,
    /// Its creation zxid, when the create's answer carried a valid one.
    czxid: Option<i64>,
}

/// How often a step lists the directory again at most, when the contender
/// ahead is gone before its watch is set.
const RELISTS: usize = 8;

/// How often a create is sent again at most when the lock's directory
/// vanished in between (an empty container removed by the server).
const CREATES: usize = 3;

fn ephemeral_sequential() -> zookeeper_client::CreateOptions<'static> {
    CreateMode::EphemeralSequential.with_acls(Acls::anyone_all())
}

fn container() -> zookeeper_client::CreateOptions<'static> {
    CreateMode::Container.with_acls(Acls::anyone_all())
}

/// Where a fencing token's generation starts: the low 56 bits are the
/// lock node's `czxid`, the bits above them the locker's
/// [generation](crate::ZkLockerBuilder::generation).
const GENERATION_SHIFT: u32 = 56;

/// Why a won lock could not be fenced.
const CZXID_OUT_OF_RANGE: &str =
    "the lock node's czxid does not fit below the generation bits (2^56)";

/// The fencing token of a lock node created at `czxid`, under the
/// locker's `generation`: `generation * 2^56 + czxid`. A zxid is the
/// ensemble's epoch (32 bits, one per leader election) above a counter
/// (32 bits), so it stays below 2^56 until 2^24 elections; `None` past
/// that (never a token that could wrap below an earlier one), or for a
/// negative `czxid`.
pub(crate) fn fence_of(generation: u8, czxid: i64) -> Option<FencingToken> {
    let czxid = u64::try_from(czxid).ok()?;
    (czxid < 1 << GENERATION_SHIFT)
        .then(|| FencingToken::new((u64::from(generation) << GENERATION_SHIFT) | czxid))
}

fn unexpected(op: &'static str) -> Error {
    Error::UnexpectedReply {
        service: ZOOKEEPER,
        op,
    }
}

impl ZkLocker {
    /// The prefix of the nodes an acquire with `token` creates.
    fn prefix(token: &LeaseToken) -> String {
        node_prefix(&token.holder())
    }

    /// Creates our contender node in `dir` (and `dir`, if missing).
    async fn create(
        &self,
        client: &Client,
        claim: &Claim,
        dir: &str,
        entry: &mut Contender,
        deadline: Instant,
    ) -> Result<()> {
        let prefix = Self::prefix(claim.token());
        let path = format!("{dir}/{prefix}");
        for _ in 0..CREATES {
            entry.sent = true;
            match within(deadline, client.create(&path, &[], &ephemeral_sequential())).await {
                Ok((stat, sequence)) => {
                    entry.sent = false;
                    entry.node = Some(Node {
                        name: format!("{prefix}{sequence}"),
                        session: client.session_id().0,
                        czxid: (stat.czxid > 0).then_some(stat.czxid),
                    });
                    return Ok(());
                }
                Err(ZkError::NoNode) => {
                    entry.sent = false;
                    within(deadline, client.mkdir(dir, &container()))
                        .await
                        .map_err(|err| zk_fault("acquire", err, false))?;
                }
                Err(err @ (ZkError::Timeout | ZkError::ConnectionLoss)) => {
                    return Err(zk_fault("acquire", err, true));
                }
                Err(err) => {
                    entry.sent = false;
                    return Err(zk_fault("acquire", err, false));
                }
            }
        }
        Err(Error::service(
            ZOOKEEPER,
            "acquire",
            ServiceFault::Transient,
            "the lock's directory kept vanishing",
        ))
    }

    /// The names of the nodes in `dir` with `prefix` (none if `dir` is
    /// gone).
    async fn find(
        client: &Client,
        dir: &str,
        prefix: &str,
        op: &'static str,
        deadline: Instant,
    ) -> Result<Vec<String>> {
        match within(deadline, client.list_children(dir)).await {
            Ok(mut children) => {
                children.retain(|name| name.starts_with(prefix));
                Ok(children)
            }
            Err(ZkError::NoNode) => Ok(Vec::new()),
            Err(err) => Err(zk_fault(op, err, false)),
        }
    }

    /// The node of the lock `key` held under `token`: remembered at the
    /// win, else found by its prefix.
    async fn held_path(
        &self,
        client: &Client,
        key: &str,
        token: &LeaseToken,
        op: &'static str,
        deadline: Instant,
    ) -> Result<Option<String>> {
        if let Some(path) = self.recall(token) {
            return Ok(Some(path));
        }
        let dir = self.lock_path(key);
        let found = Self::find(client, &dir, &Self::prefix(token), op, deadline).await?;
        Ok(found.first().map(|name| format!("{dir}/{name}")))
    }

    /// Deletes every node `entry` may have made for `claim`.
    async fn remove(&self, claim: &Claim, entry: &mut Contender, deadline: Instant) -> Result<()> {
        if entry.node.is_none() && !entry.sent {
            return Ok(());
        }
        let client = self.client(deadline).await?;
        let dir = self.lock_path(claim.key());
        let names = match &entry.node {
            Some(node) => vec![node.name.clone()],
            None => {
                Self::find(
                    &client,
                    &dir,
                    &Self::prefix(claim.token()),
                    "acquire",
                    deadline,
                )
                .await?
            }
        };
        for name in names {
            match within(deadline, client.delete(&format!("{dir}/{name}"), None)).await {
                Ok(()) | Err(ZkError::NoNode) => {}
                Err(err) => return Err(zk_fault("acquire", err, true)),
            }
        }
        *entry = Contender::default();
        Ok(())
    }

    async fn take(&self, claim: &Claim, entry: &mut Contender, deadline: Instant) -> Result<Step> {
        let client = self.client(deadline).await?;
        let session = client.session_id().0;
        let dir = self.lock_path(claim.key());
        if entry
            .node
            .as_ref()
            .is_some_and(|node| node.session != session)
        {
            // Our node went with the session that made it.
            *entry = Contender::default();
        }
        for _ in 0..RELISTS {
            if entry.node.is_none() {
                self.create(&client, claim, &dir, entry, deadline).await?;
            }
            let node = entry.node.clone().ok_or_else(|| unexpected("acquire"))?;
            let children = match within(deadline, client.list_children(&dir)).await {
                Ok(children) => children,
                Err(ZkError::NoNode) => Vec::new(),
                Err(err) => return Err(zk_fault("acquire", err, false)),
            };
            let order = contenders(&children);
            let Some(place) = order.iter().position(|(_, name)| *name == node.name) else {
                tracing::debug!(
                    target: "leasehold_zookeeper",
                    key = claim.key(),
                    "our contender node is gone; joining the queue again"
                );
                *entry = Contender::default();
                continue;
            };
            let Some(ahead) = place.checked_sub(1).and_then(|i| order.get(i)) else {
                return self.won(&client, claim, entry, &dir, node, deadline).await;
            };
            let ahead = format!("{dir}/{}", ahead.1);
            let watched = within(deadline, client.check_and_watch_stat(&ahead)).await;
            let (stat, watcher) = watched.map_err(|err| zk_fault("acquire", err, false))?;
            if stat.is_none() {
                continue;
            }
            // The watch fires when the node ahead goes (or changes, or the
            // session ends); the fallback covers anything else.
            let fallback = tokio::time::sleep(self.session_timeout());
            return Ok(Step::busy_until(async move {
                tokio::select! {
                    _ = watcher.changed() => {}
                    () = fallback => {}
                }
            }));
        }
        Ok(Step::busy())
    }

    /// Returns once the node of the lock `key` held under `token` may be
    /// gone: deleted, not ours, its session ended, or a fault while
    /// watching it (the watchdog's refresh then decides).
    async fn until_gone(&self, key: &str, token: &LeaseToken) {
        loop {
            let deadline = Instant::now() + self.inner.command_timeout;
            let Ok(client) = self.current(deadline).await else {
                return;
            };
            if ended(client.state()) {
                return;
            }
            let Ok(Some(path)) = self.held_path(&client, key, token, "watch", deadline).await
            else {
                return;
            };
            let watcher = match within(deadline, client.check_and_watch_stat(&path)).await {
                Ok((Some(stat), watcher)) if stat.ephemeral_owner == client.session_id().0 => {
                    watcher
                }
                _ => return,
            };
            let event = watcher.changed().await;
            if event.event_type != EventType::NodeDataChanged {
                return;
            }
            // Our own leader record was written: still ours; watch again.
        }
    }

    /// Our node is the lowest: the lock is ours, fenced by the node's
    /// `czxid` (read back when the create's answer did not carry it).
    async fn won(
        &self,
        client: &Client,
        claim: &Claim,
        entry: &mut Contender,
        dir: &str,
        node: Node,
        deadline: Instant,
    ) -> Result<Step> {
        let path = format!("{dir}/{}", node.name);
        let czxid = match node.czxid {
            Some(czxid) => czxid,
            None => match within(deadline, client.check_stat(&path)).await {
                Ok(Some(stat)) if stat.ephemeral_owner == node.session && stat.czxid > 0 => {
                    stat.czxid
                }
                Ok(_) => {
                    *entry = Contender::default();
                    return Ok(Step::busy_until(std::future::ready(())));
                }
                Err(err) => return Err(zk_fault("acquire", err, false)),
            },
        };
        let fence = match claim.fence_key() {
            None => None,
            Some(_) => Some(fence_of(self.inner.generation, czxid).ok_or_else(|| {
                Error::service(
                    ZOOKEEPER,
                    "acquire",
                    ServiceFault::Refused,
                    CZXID_OUT_OF_RANGE,
                )
            })?),
        };
        self.remember(claim.token(), path);
        Ok(Step::won(fence))
    }
}

impl LockService for ZkLocker {
    type Entry = Contender;

    fn service(&self) -> Service {
        ZOOKEEPER
    }

    fn command_timeout(&self) -> Duration {
        self.inner.command_timeout
    }

    /// `zk:` and the caller's fence key: a zxid can be neither compared
    /// with another service's tokens nor raised.
    fn fence_key_of(&self, fence_key: &str) -> String {
        format!("zk:{fence_key}")
    }

    /// Refuses a TTL above the negotiated session timeout.
    fn check_ttl(&self, ttl: Duration) -> Result<()> {
        if ttl > self.session_timeout() {
            return Err(Error::InvalidOptions(
                "the ttl is above the negotiated zookeeper session timeout",
            ));
        }
        Ok(())
    }

    fn step<'a>(
        &'a self,
        claim: &'a Claim,
        entry: &'a mut Contender,
        deadline: Instant,
    ) -> Reply<'a, Step> {
        Box::pin(self.take(claim, entry, deadline))
    }

    fn undo<'a>(
        &'a self,
        claim: &'a Claim,
        entry: &'a mut Contender,
        deadline: Instant,
    ) -> Reply<'a, ()> {
        Box::pin(self.remove(claim, entry, deadline))
    }

    /// Deletes the acquire's node in the background, trying again (at
    /// most every second) while the session that made it lives.
    fn abandon(&self, claim: Claim, entry: Contender, maybe_taken: bool) {
        let mut entry = entry;
        if maybe_taken {
            entry.sent = true;
        }
        if entry.node.is_none() && !entry.sent {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let locker = self.clone();
        runtime.spawn(async move {
            let mut pause = Duration::from_millis(50);
            loop {
                let deadline = Instant::now() + locker.inner.command_timeout;
                let session = match locker.current(deadline).await {
                    Ok(client) if !ended(client.state()) => client.session_id().0,
                    // The session ended: so did its nodes.
                    _ => return,
                };
                if entry
                    .node
                    .as_ref()
                    .is_some_and(|node| node.session != session)
                {
                    return;
                }
                match locker.remove(&claim, &mut entry, deadline).await {
                    Ok(()) => return,
                    Err(err) => tracing::debug!(
                        target: "leasehold_zookeeper",
                        key = claim.key(),
                        error = %err,
                        "could not delete an abandoned contender node; trying again"
                    ),
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
        });
    }

    /// Whether our node is still there, made by our session: a request
    /// the server answers only while the session lives.
    fn refresh<'a>(&'a self, held: &'a Held, ttl: Duration, deadline: Instant) -> Reply<'a, bool> {
        Box::pin(async move {
            self.check_ttl(ttl)?;
            let client = self.current(deadline).await?;
            if ended(client.state()) {
                self.forget(held.token());
                return Ok(false);
            }
            let path = self
                .held_path(&client, held.key(), held.token(), "refresh", deadline)
                .await?;
            let Some(path) = path else {
                return Ok(false);
            };
            let ours = match within(deadline, client.check_stat(&path)).await {
                Ok(Some(stat)) => stat.ephemeral_owner == client.session_id().0,
                Ok(None) | Err(ZkError::SessionExpired) => false,
                Err(err) => return Err(zk_fault("refresh", err, false)),
            };
            if !ours {
                self.forget(held.token());
            }
            Ok(ours)
        })
    }

    /// A watch on our node: resolves when it is deleted or its session
    /// ends (the crate docs say what that gives a holder).
    fn watch_held(&self, held: &Held) -> Option<Wake> {
        let (locker, key, token) = (self.clone(), held.key().to_owned(), held.token().clone());
        Some(Box::pin(
            async move { locker.until_gone(&key, &token).await },
        ))
    }

    /// Deletes our node: `Ok(false)` when it was already gone.
    fn release<'a>(&'a self, held: &'a Held, deadline: Instant) -> Reply<'a, bool> {
        Box::pin(async move {
            let client = self.current(deadline).await?;
            if ended(client.state()) {
                self.forget(held.token());
                return Ok(false);
            }
            let path = self
                .held_path(&client, held.key(), held.token(), "release", deadline)
                .await?;
            let Some(path) = path else {
                return Ok(false);
            };
            let released = match within(deadline, client.delete(&path, None)).await {
                Ok(()) => true,
                Err(ZkError::NoNode | ZkError::SessionExpired) => false,
                Err(err) => return Err(zk_fault("release", err, true)),
            };
            self.forget(held.token());
            Ok(released)
        })
    }

    /// Writes the record into our own node's data, only while it exists.
    fn announce<'a>(
        &'a self,
        held: &'a Held,
        record_key: &'a str,
        body: &'a str,
        deadline: Instant,
    ) -> Reply<'a, bool> {
        Box::pin(async move {
            let client = self.current(deadline).await?;
            if ended(client.state()) {
                return Ok(false);
            }
            let path = self
                .held_path(&client, held.key(), held.token(), "announce", deadline)
                .await?;
            let Some(path) = path else {
                return Ok(false);
            };
            let data = encode_record(record_key, body);
            match within(deadline, client.set_data(&path, &data, None)).await {
                Ok(stat) => Ok(stat.ephemeral_owner == client.session_id().0),
                Err(ZkError::NoNode | ZkError::SessionExpired) => Ok(false),
                Err(err) => Err(zk_fault("announce", err, true)),
            }
        })
    }

    /// The record in the lowest contender node's data, with this
    /// locker's negotiated session timeout as its time to live: how long
    /// the holder's lock may outlive the last time the ensemble heard
    /// from it, if it negotiated the same timeout (ZooKeeper does not tell
    /// a client how long another session has left).
    fn leader_record<'a>(
        &'a self,
        key: &'a str,
        record_key: &'a str,
    ) -> Reply<'a, Option<(String, i64)>> {
        let deadline = Instant::now() + self.inner.command_timeout;
        Box::pin(async move {
            let client = self.client(deadline).await?;
            let dir = self.lock_path(key);
            let children = match within(deadline, client.list_children(&dir)).await {
                Ok(children) => children,
                Err(ZkError::NoNode) => return Ok(None),
                Err(err) => return Err(zk_fault("read leader", err, false)),
            };
            let Some((_, lowest)) = contenders(&children).first().copied() else {
                return Ok(None);
            };
            let data = match within(deadline, client.get_data(&format!("{dir}/{lowest}"))).await {
                Ok((data, _stat)) => data,
                Err(ZkError::NoNode) => return Ok(None),
                Err(err) => return Err(zk_fault("read leader", err, false)),
            };
            let ttl = i64::try_from(self.session_timeout().as_millis()).unwrap_or(i64::MAX);
            Ok(decode_record(&data, record_key).map(|body| (body, ttl)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_the_generation_above_the_czxid_and_never_wraps() {
        let token = |generation, czxid| fence_of(generation, czxid).map(FencingToken::get);
        assert_eq!(token(0, 0x2_0000_0005), Some(0x2_0000_0005));
        assert_eq!(token(1, 5), Some((1 << 56) + 5));
        // Every token of a generation is above every token of the one
        // before, whatever the czxids.
        assert!(token(1, 1) > token(0, (1 << 56) - 1));
        assert_eq!(
            token(crate::MAX_GENERATION, (1 << 56) - 1),
            Some(i64::MAX.unsigned_abs())
        );
        assert_eq!(token(0, 1 << 56), None);
        assert_eq!(token(0, -1), None);
    }
}
