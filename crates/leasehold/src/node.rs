//! One Redis server (or one Redis Cluster) as the lock protocol sees it: a
//! connection and the atomic, token-checked steps sent over it.
//!
//! This is the protocol layer. Each step is one request (a command or one Lua
//! script from `scripts/`), bounded by a deadline, mapped to an outcome. It
//! knows nothing of leases, retries or queues: the ways of taking a lease
//! (`locker`, `handoff`, `quorum`) are built on top of it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::{Cmd, ErrorKind, RedisResult, ServerErrorKind, Value};
use tokio::time::Instant;

use crate::call;
use crate::compare::{Detected, Path, Step, supports_commands};
use crate::connection::Connection;
use crate::error::{Error, Result};
use crate::fencing::{FencedKeys, FencingToken};
use crate::stats::Counters;
use crate::token::LeaseToken;

/// A Redis connection a [`Locker`](crate::Locker) can use: any clonable async redis-rs
/// connection, such as a [`Connection`](crate::Connection) (the default,
/// which reconnects and authenticates again), a
/// [`ConnectionManager`](redis::aio::ConnectionManager) (which reconnects,
/// but not after the server refused its credentials once), a cluster
/// connection, or a
/// [`MultiplexedConnection`](redis::aio::MultiplexedConnection) (which does
/// not: see [`Locker`](crate::Locker)).
pub trait RedisConnection: redis::aio::ConnectionLike + Clone + Send + Sync + 'static {}

impl<T> RedisConnection for T where T: redis::aio::ConnectionLike + Clone + Send + Sync + 'static {}

/// What one attempt to take a lock found.
pub(crate) enum Attempt<T> {
    /// The lock is ours (with what the attempt returned).
    Won(T),
    /// Someone else holds it.
    Busy,
}

pub(crate) use crate::call::ttl_millis;

/// A connection to one server and what we learnt about the server.
pub(crate) struct Node<C> {
    conn: C,
    command_timeout: Duration,
    /// `SET ... NX GET` needs Redis 7.0; older servers get plain `SET NX`.
    set_nx_get: AtomicBool,
    /// Whether release and refresh use Redis 8.4 commands or Lua.
    compare: Detected,
    /// How long a fence counter lives after its last use, in ms (0: forever).
    fence_ttl_ms: u64,
    pub(crate) counters: Counters,
}

impl<C: RedisConnection> Node<C> {
    pub(crate) fn new(conn: C, command_timeout: Duration, fence_ttl: Option<Duration>) -> Node<C> {
        Node {
            conn,
            command_timeout,
            set_nx_get: AtomicBool::new(true),
            compare: Detected::default(),
            fence_ttl_ms: fence_ttl.map_or(0, ttl_millis),
            counters: Counters::default(),
        }
    }

    /// How long a fence counter lives after its last use, in ms (0:
    /// forever): the last argument of every script that issues a token.
    #[cfg(any(feature = "quorum", feature = "handoff"))]
    pub(crate) fn fence_ttl_ms(&self) -> u64 {
        self.fence_ttl_ms
    }

    /// The connection itself.
    pub(crate) fn connection(&self) -> &C {
        &self.conn
    }

    /// A clone of the connection, for one request.
    #[cfg(any(test, feature = "quorum", feature = "handoff"))]
    pub(crate) fn conn(&self) -> C {
        self.conn.clone()
    }

    /// The bound on one request with no tighter deadline of its own.
    pub(crate) fn command_timeout(&self) -> Duration {
        self.command_timeout
    }

    /// `request` ([`call::bounded`]), by the caller's `deadline` but never
    /// later than the command timeout from now; the one clock read is also
    /// the request's start.
    fn bounded<T, F>(
        &self,
        op: &'static str,
        key: &str,
        deadline: Instant,
        request: F,
    ) -> impl Future<Output = Result<T>>
    where
        F: Future<Output = RedisResult<T>>,
    {
        let now = Instant::now();
        let deadline = deadline.min(now + self.command_timeout);
        call::bounded_since(op, key, now, deadline, request)
    }

    /// Sends `cmd` and returns its reply (a server error as `Err`), for a
    /// caller that bounds the request by [`bounded`](Self::bounded). On the
    /// library's own [`Connection`] the request goes out with that one
    /// timer ([`Connection::send_within`]); on any other connection as
    /// redis-rs sends it.
    async fn send(&self, cmd: &Cmd) -> RedisResult<Value> {
        let reply = match (&self.conn as &dyn std::any::Any).downcast_ref::<Connection>() {
            // Boxed, as redis-rs boxes every request: inline, its future
            // would make every acquire's future kilobytes larger, and
            // moving that costs more than the allocation.
            Some(own) => Box::pin(own.send_within(cmd)).await?,
            None => {
                let mut conn = self.conn.clone();
                redis::aio::ConnectionLike::req_packed_command(&mut conn, cmd).await?
            }
        };
        reply.extract_error()
    }

    /// One `SET key token NX PX ttl` round trip.
    pub(crate) async fn set_nx(
        &self,
        key: &str,
        token: &LeaseToken,
        px: u64,
        deadline: Instant,
    ) -> Result<Attempt<()>> {
        let with_get = self.set_nx_get.load(Ordering::Relaxed);
        // Sized up front: growing the command's buffers argument by
        // argument costs more than the rest of building it.
        let mut cmd = redis::Cmd::with_capacity(7, 64 + key.len());
        cmd.arg("SET")
            .arg(key)
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(px);
        if with_get {
            // With GET, a key of another type fails with WRONGTYPE instead of
            // looking busy forever.
            cmd.arg("GET");
        }
        let reply = self
            .bounded("acquire", key, deadline, self.send(&cmd))
            .await;
        let reply = match reply {
            Err(Error::Redis { source, .. })
                if with_get && source.code() == Some("ERR") && is_syntax_error(&source) =>
            {
                // Redis before 7.0 refuses NX together with GET.
                self.set_nx_get.store(false, Ordering::Relaxed);
                return Box::pin(self.set_nx(key, token, px, deadline)).await;
            }
            other => other?,
        };
        match (with_get, reply) {
            (true, Value::Nil) | (false, Value::Okay) => Ok(Attempt::Won(())),
            (true, Value::BulkString(_) | Value::SimpleString(_)) | (false, Value::Nil) => {
                Ok(Attempt::Busy)
            }
            _ => Err(Error::UnexpectedReply { op: "acquire" }),
        }
    }

    /// One run of the fenced acquire script: the lock and, only if that
    /// worked, the next fencing token.
    pub(crate) async fn set_nx_fenced(
        &self,
        keys: &FencedKeys,
        token: &LeaseToken,
        px: u64,
        deadline: Instant,
    ) -> Result<Attempt<FencingToken>> {
        let mut conn = self.conn.clone();
        let mut invocation = crate::scripts::ACQUIRE_FENCED.key(keys.lock());
        invocation
            .key(keys.fence())
            .arg(token)
            .arg(px)
            .arg(self.fence_ttl_ms);
        let reply = self
            .bounded(
                "acquire",
                keys.lock(),
                deadline,
                invocation.invoke_async::<Value>(&mut conn),
            )
            .await;
        match reply {
            Ok(Value::Int(fence)) => match u64::try_from(fence) {
                Ok(fence) if fence > 0 && fence <= FencingToken::MAX.get() => {
                    Ok(Attempt::Won(FencingToken::new(fence)))
                }
                _ => Err(Error::UnexpectedReply { op: "acquire" }),
            },
            Ok(Value::Nil) => Ok(Attempt::Busy),
            Ok(_) => Err(Error::UnexpectedReply { op: "acquire" }),
            Err(err) => Err(not_a_fence(err, keys.fence())),
        }
    }

    /// Runs `step` (release or refresh) for `key` if it holds `token`, in
    /// one atomic step: `Ok(true)` if it acted, `Ok(false)` when the key did
    /// not hold our token. Sent as a Redis 8.4 command or a Lua script, as
    /// detected (see the `compare` module).
    ///
    /// `fence_key`, the lock's fence counter if it is fenced: a refresh
    /// keeps it alive for the node's fence TTL too.
    pub(crate) async fn token_checked(
        &self,
        step: Step,
        key: &str,
        fence_key: Option<&str>,
        token: &LeaseToken,
        deadline: Instant,
    ) -> Result<bool> {
        if step == Step::Release {
            self.counters.release_request();
        }
        let fence = fence_key
            .filter(|_| self.fence_ttl_ms > 0)
            .map(|fence_key| (fence_key, self.fence_ttl_ms));
        self.checked(step, key, fence, token, deadline).await
    }

    async fn checked(
        &self,
        step: Step,
        key: &str,
        fence: Option<(&str, u64)>,
        token: &LeaseToken,
        deadline: Instant,
    ) -> Result<bool> {
        let detected = self.path(key, deadline).await;
        let path = step.path(detected, fence);
        let sent = step.cmd(path, key, token, fence);
        let reply = self
            .bounded(step.op(), key, deadline, async {
                match self.send(&sent).await {
                    Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                        self.send(&step.eval_cmd(key, token, fence)).await
                    }
                    other => other,
                }
            })
            .await;
        match reply {
            Ok(reply) => step.acted(path, &reply),
            Err(Error::Redis { source, .. })
                if path == Path::Commands && is_unknown_syntax(&source) =>
            {
                tracing::debug!(
                    "server claims redis 8.4 but refused the command; using lua from now on"
                );
                self.compare.set(Path::Lua);
                Box::pin(self.checked(step, key, fence, token, deadline)).await
            }
            Err(err) => Err(err),
        }
    }

    /// The path this node uses, detecting it on first use.
    async fn path(&self, key: &str, deadline: Instant) -> Path {
        if let Some(path) = self.compare.get() {
            return path;
        }
        let mut conn = self.conn.clone();
        let info = call::bounded(
            "detect",
            key,
            deadline,
            redis::cmd("INFO")
                .arg("server")
                .query_async::<String>(&mut conn),
        )
        .await;
        let path = match info {
            Ok(info) if supports_commands(&info) == Some(true) => Path::Commands,
            Ok(_) => Path::Lua,
            // Transient: ask again next time; this call uses Lua.
            Err(Error::Timeout { .. } | Error::Unreachable { .. }) => return Path::Lua,
            // Refused or unparseable: Lua is correct everywhere.
            Err(err) => {
                tracing::debug!(error = %err, "could not detect the server version; using lua");
                Path::Lua
            }
        };
        self.compare.set(path);
        path
    }

    /// Raises the counter `fence_key` to at least `at_least` (never
    /// lowering it); returns its value afterwards.
    pub(crate) async fn raise_fence(
        &self,
        fence_key: &str,
        at_least: FencingToken,
        deadline: Instant,
    ) -> Result<u64> {
        let mut conn = self.conn.clone();
        let mut invocation = crate::scripts::RAISE_FENCE.key(fence_key);
        invocation.arg(at_least.get()).arg(self.fence_ttl_ms);
        call::bounded(
            "raise fence",
            fence_key,
            deadline,
            invocation.invoke_async::<u64>(&mut conn),
        )
        .await
        .map_err(|err| not_a_fence(err, fence_key))
    }

    /// Writes an election's leader record `record_key` (`body`, after the
    /// hash of `token`) if the lock `key` holds `token`; `Ok(false)` when it
    /// does not (nothing written). The record lives as long as a fence
    /// counter after its last use.
    pub(crate) async fn announce(
        &self,
        key: &str,
        record_key: &str,
        token: &LeaseToken,
        body: &str,
        deadline: Instant,
    ) -> Result<bool> {
        let mut conn = self.conn.clone();
        let mut invocation = crate::scripts::ANNOUNCE.key(key);
        invocation
            .key(record_key)
            .arg(token)
            .arg(body)
            .arg(self.fence_ttl_ms);
        call::bounded(
            "announce",
            key,
            deadline,
            invocation.invoke_async::<bool>(&mut conn),
        )
        .await
    }

    /// The leader record of the election whose lock is `key`, with the
    /// lock's time to live in ms, when the lock's holder wrote it.
    pub(crate) async fn leader(
        &self,
        key: &str,
        record_key: &str,
        deadline: Instant,
    ) -> Result<Option<(String, i64)>> {
        let mut conn = self.conn.clone();
        let mut invocation = crate::scripts::LEADER.key(key);
        invocation.key(record_key);
        call::bounded(
            "read leader",
            key,
            deadline,
            invocation.invoke_async::<Option<(String, i64)>>(&mut conn),
        )
        .await
    }

    /// `WAIT replicas timeout` on this connection: how many replicas
    /// acknowledged every write it sent so far.
    pub(crate) async fn wait_replicas(
        &self,
        key: &str,
        replicas: u32,
        timeout: Duration,
    ) -> Result<u64> {
        // Never 0: `WAIT n 0` would block forever.
        let timeout = timeout.max(Duration::from_millis(1));
        let mut cmd = redis::cmd("WAIT");
        cmd.arg(replicas).arg(ttl_millis(timeout));
        let mut conn = self.conn.clone();
        call::bounded(
            "wait",
            key,
            Instant::now() + timeout + self.command_timeout,
            cmd.query_async::<u64>(&mut conn),
        )
        .await
    }

    /// The path this node has settled on, if it has decided (test hook).
    #[cfg(test)]
    pub(crate) fn detected_path(&self) -> Option<Path> {
        self.compare.get()
    }
}

/// A `NOTFENCE` reply means the fence key holds no integer counter.
pub(crate) fn not_a_fence(err: Error, fence_key: &str) -> Error {
    match err {
        Error::Redis { source, .. } if source.code() == Some("NOTFENCE") => Error::InvalidFence {
            key: fence_key.to_owned(),
            source,
        },
        err => err,
    }
}

fn is_syntax_error(err: &redis::RedisError) -> bool {
    err.detail().is_some_and(|d| d.contains("syntax error"))
}

fn is_unknown_syntax(err: &redis::RedisError) -> bool {
    err.code() == Some("ERR")
        && err.detail().is_some_and(|d| {
            let d = d.to_ascii_lowercase();
            d.contains("unknown command") || d.contains("syntax error")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_rounds_up_to_whole_milliseconds() {
        assert_eq!(ttl_millis(Duration::from_millis(1)), 1);
        assert_eq!(ttl_millis(Duration::from_micros(1001)), 2);
        assert_eq!(ttl_millis(Duration::from_secs(2)), 2000);
    }

    async fn node(
        server: &leasehold_testkit::RedisServer,
    ) -> std::result::Result<Node<redis::aio::ConnectionManager>, Box<dyn std::error::Error>> {
        let client = redis::Client::open(server.url())?;
        let conn = redis::aio::ConnectionManager::new(client).await?;
        Ok(Node::new(conn, Duration::from_secs(1), None))
    }

    #[tokio::test]
    async fn redis_7_is_detected_as_lua_and_steps_work()
    -> std::result::Result<(), Box<dyn std::error::Error>> {
        let server = leasehold_testkit::RedisServer::start()?;
        let node = node(&server).await?;
        let token = LeaseToken::generate()?;
        let deadline = Instant::now() + Duration::from_secs(1);
        assert_eq!(node.detected_path(), None);
        let won = node.set_nx("t:detect", &token, 5000, deadline).await?;
        assert!(matches!(won, Attempt::Won(())));
        let refresh = Step::Refresh {
            ttl: Duration::from_secs(9),
        };
        assert!(
            node.token_checked(refresh, "t:detect", None, &token, deadline)
                .await?
        );
        assert_eq!(node.detected_path(), Some(Path::Lua));
        let pttl: i64 = redis::cmd("PTTL")
            .arg("t:detect")
            .query_async(&mut node.conn())
            .await?;
        assert!(pttl > 5000, "refresh did not extend: {pttl}");
        assert!(
            node.token_checked(Step::Release, "t:detect", None, &token, deadline)
                .await?
        );
        assert!(
            !node
                .token_checked(Step::Release, "t:detect", None, &token, deadline)
                .await?
        );
        Ok(())
    }

    #[tokio::test]
    async fn a_paused_server_during_detection_is_not_remembered()
    -> std::result::Result<(), Box<dyn std::error::Error>> {
        let server = leasehold_testkit::RedisServer::start()?;
        let node = node(&server).await?;
        server.pause()?;
        let path = node
            .path("t:x", Instant::now() + Duration::from_millis(50))
            .await;
        server.resume()?;
        assert_eq!(path, Path::Lua);
        assert_eq!(node.detected_path(), None);
        Ok(())
    }
}
