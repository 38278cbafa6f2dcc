//! [`ZkLocker`]: the lock service's handle, its settings and its session.
//!
//! One locker keeps one ZooKeeper session (clones share it). The
//! client reconnects within the session by itself (to any member of the
//! connect string); a session that ended (expired on the server's clock,
//! closed, refused) is replaced by a new one at the next request, and
//! every node of the old one is gone with it: a lease it held is lost,
//! which its watch on its node (or its next refresh) reports.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use leasehold::backend::ServiceFault;
use leasehold::{Error, LeaseToken, Result};
use tokio::sync::Mutex;
use tokio::time::Instant;
use zookeeper_client::{Client, SessionState};

use crate::fault::{NO_ANSWER, ZOOKEEPER, zk_fault};

/// The session timeout a locker asks for unless told otherwise: 10 s.
/// The servers grant between 2 and 20 ticks (4 to 40 s with ZooKeeper's
/// default 2 s tick), whatever is asked.
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// How long one request may take when the caller's deadline is further
/// away: 2 s.
pub const DEFAULT_ZK_COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

/// The node under which every lock's directory lives: `/leasehold`.
pub const DEFAULT_ROOT: &str = "/leasehold";

/// The highest [generation](ZkLockerBuilder::generation): 127, so that a
/// token (`generation * 2^56 + czxid`) fits the guard's signed 64-bit
/// fence column.
pub const MAX_GENERATION: u8 = 127;

/// Takes leases on a ZooKeeper ensemble: see the [crate docs](crate).
/// Cheap to clone: clones share one session.
#[derive(Clone)]
pub struct ZkLocker {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    connect_string: String,
    asked: Duration,
    pub(crate) command_timeout: Duration,
    /// The generation above every token's `czxid`.
    pub(crate) generation: u8,
    root: String,
    /// The session's client, replaced when its session ended.
    client: Mutex<Client>,
    /// The session timeout the servers granted the current session, in
    /// milliseconds.
    negotiated_ms: AtomicU64,
    /// The node of every lock this locker holds, by its lease's token.
    held: std::sync::Mutex<HashMap<LeaseToken, String>>,
}

impl std::fmt::Debug for ZkLocker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkLocker")
            .field("root", &self.inner.root)
            .field("session_timeout", &self.session_timeout())
            .field("command_timeout", &self.inner.command_timeout)
            .field("generation", &self.inner.generation)
            .finish_non_exhaustive()
    }
}

/// Builds a [`ZkLocker`] with non-default settings.
#[derive(Debug, Clone)]
#[must_use]
pub struct ZkLockerBuilder {
    session_timeout: Duration,
    command_timeout: Duration,
    root: String,
    generation: u8,
}

impl ZkLockerBuilder {
    /// The session timeout to ask for. The servers grant one between 2 and
    /// 20 ticks whatever is asked; a lease's TTL may not exceed the one
    /// granted ([`ZkLocker::session_timeout`]). Defaults to
    /// [`DEFAULT_SESSION_TIMEOUT`] (10 s).
    pub fn session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    /// The bound on one request when the caller's deadline is further
    /// away. Defaults to [`DEFAULT_ZK_COMMAND_TIMEOUT`] (2 s).
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// The node under which each lock key gets its directory: an absolute
    /// path (`/leasehold`, `/apps/billing/locks`), created as needed.
    /// Defaults to [`DEFAULT_ROOT`].
    pub fn root(mut self, root: impl Into<String>) -> Self {
        self.root = root.into();
        self
    }

    /// The ensemble's generation, set above every fencing token: a token
    /// is `generation * 2^56 + czxid`. Raise it by one (on every client of
    /// the ensemble) after the ensemble was rebuilt or restored from an
    /// older backup: its zxids start again below the fences the guard
    /// stored, and without a new generation the guard refuses every
    /// holder until the fence rows are dealt with. With it, the new
    /// holders' tokens are above every token of the old ensemble, so the
    /// guard takes them, and a holder still on the old generation (a
    /// client not yet given the setting, or a lease taken before the
    /// rebuild) is refused once a holder of the new one has written: never
    /// accepted over a newer write. The crate docs, "A rebuilt ensemble",
    /// give the steps. Defaults to 0 (the token is the `czxid` itself).
    ///
    /// [`connect`](Self::connect) refuses a generation above
    /// [`MAX_GENERATION`].
    pub fn generation(mut self, generation: u8) -> Self {
        self.generation = generation;
        self
    }

    /// A locker on the ensemble `connect_string` (`host:port,host:port`,
    /// optionally with a chroot, `host:port/chroot`), with its session
    /// established now.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] for a zero timeout, a root that is not
    /// an absolute path without a trailing `/`, or a generation above
    /// [`MAX_GENERATION`]; [`Error::Service`] when no
    /// session could be established within about the session timeout
    /// (transient) or the connect string is wrong (refused).
    ///
    /// # Cancel safety
    /// Dropping the future before it returns leaves no session.
    pub async fn connect(self, connect_string: &str) -> Result<ZkLocker> {
        if self.session_timeout.is_zero() || self.command_timeout.is_zero() {
            return Err(Error::InvalidOptions(
                "session_timeout and command_timeout must be positive",
            ));
        }
        if !valid_root(&self.root) {
            return Err(Error::InvalidOptions(
                "root must be an absolute zookeeper path without a trailing /",
            ));
        }
        if self.generation > MAX_GENERATION {
            return Err(Error::InvalidOptions(
                "generation must be at most 127 (MAX_GENERATION)",
            ));
        }
        let client = open(connect_string, self.session_timeout).await?;
        let negotiated = millis(client.session_timeout());
        Ok(ZkLocker {
            inner: Arc::new(Inner {
                connect_string: connect_string.to_owned(),
                asked: self.session_timeout,
                command_timeout: self.command_timeout,
                generation: self.generation,
                root: self.root,
                client: Mutex::new(client),
                negotiated_ms: AtomicU64::new(negotiated),
                held: std::sync::Mutex::new(HashMap::new()),
            }),
        })
    }
}

fn valid_root(root: &str) -> bool {
    root.len() > 1
        && root.starts_with('/')
        && !root.ends_with('/')
        && !root.contains("//")
        && root
            .split('/')
            .skip(1)
            .all(|part| part != "." && part != "..")
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A new session on `connect_string`.
async fn open(connect_string: &str, session_timeout: Duration) -> Result<Client> {
    Client::connector()
        .with_session_timeout(session_timeout)
        .connect(connect_string)
        .await
        .map_err(|err| zk_fault("connect", err, false))
}

impl ZkLocker {
    /// A locker on the ensemble `connect_string` with the default
    /// settings: as [`ZkLockerBuilder::connect`].
    ///
    /// # Errors
    /// As [`ZkLockerBuilder::connect`].
    pub async fn connect(connect_string: &str) -> Result<ZkLocker> {
        ZkLocker::builder().connect(connect_string).await
    }

    /// A builder with the default settings.
    pub fn builder() -> ZkLockerBuilder {
        ZkLockerBuilder {
            session_timeout: DEFAULT_SESSION_TIMEOUT,
            command_timeout: DEFAULT_ZK_COMMAND_TIMEOUT,
            root: DEFAULT_ROOT.to_owned(),
            generation: 0,
        }
    }

    /// The session timeout the servers granted (the current session's):
    /// the longest TTL a lease of this locker may have.
    pub fn session_timeout(&self) -> Duration {
        Duration::from_millis(self.inner.negotiated_ms.load(Ordering::Relaxed))
    }

    /// The directory of the lock `key`: `<root>/<escaped key>`.
    pub fn lock_path(&self, key: &str) -> String {
        format!("{}/{}", self.inner.root, crate::layout::escape(key))
    }

    /// The current session's client, as it is (its session may have
    /// ended: a held lock's requests ask it, not a new session).
    pub(crate) async fn current(&self, deadline: Instant) -> Result<Client> {
        match tokio::time::timeout_at(deadline, self.inner.client.lock()).await {
            Ok(slot) => Ok(slot.clone()),
            Err(_elapsed) => Err(Error::service(
                ZOOKEEPER,
                "connect",
                ServiceFault::Transient,
                NO_ANSWER,
            )),
        }
    }

    /// A client whose session has not ended: the current one, or a new
    /// session if it has, by `deadline`.
    pub(crate) async fn client(&self, deadline: Instant) -> Result<Client> {
        let mut slot = match tokio::time::timeout_at(deadline, self.inner.client.lock()).await {
            Ok(slot) => slot,
            Err(_elapsed) => {
                return Err(Error::service(
                    ZOOKEEPER,
                    "connect",
                    ServiceFault::Transient,
                    NO_ANSWER,
                ));
            }
        };
        if !ended(slot.state()) {
            return Ok(slot.clone());
        }
        tracing::info!(
            target: "leasehold_zookeeper",
            session = %slot.session_id(),
            state = %slot.state(),
            "the zookeeper session ended; opening a new one"
        );
        let opened = open(&self.inner.connect_string, self.inner.asked);
        let client = match tokio::time::timeout_at(deadline, opened).await {
            Ok(client) => client?,
            Err(_elapsed) => {
                return Err(Error::service(
                    ZOOKEEPER,
                    "connect",
                    ServiceFault::Transient,
                    NO_ANSWER,
                ));
            }
        };
        self.inner
            .negotiated_ms
            .store(millis(client.session_timeout()), Ordering::Relaxed);
        *slot = client.clone();
        Ok(client)
    }

    /// Remembers `path` as the node of the lock held under `token`.
    pub(crate) fn remember(&self, token: &LeaseToken, path: String) {
        let mut held = self
            .inner
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        held.insert(token.clone(), path);
    }

    /// The node of the lock held under `token`, if this locker won it.
    pub(crate) fn recall(&self, token: &LeaseToken) -> Option<String> {
        let held = self
            .inner
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        held.get(token).cloned()
    }

    /// Forgets the lock held under `token` (released or lost).
    pub(crate) fn forget(&self, token: &LeaseToken) {
        let mut held = self
            .inner
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        held.remove(token);
    }
}

/// Whether a session in `state` has ended (its ephemeral nodes with it,
/// or it can make no more requests).
pub(crate) fn ended(state: SessionState) -> bool {
    state.is_terminated()
}
