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
use crate::compare::{Detected, Fallback, Path, Paths, Step};
use crate::connection::Connection;
use crate::error::{Error, Result};
use crate::fencing::{FencedKeys, FencingToken};
use crate::service::Service;
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
    /// How release and refresh are sent: a command where the server has
    /// one (Redis 8.4, Valkey 8.1 and 9.0), else Lua.
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
            _ => Err(Error::UnexpectedReply {
                service: Service::REDIS,
                op: "acquire",
            }),
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
                _ => Err(Error::UnexpectedReply {
                    service: Service::REDIS,
                    op: "acquire",
                }),
            },
            Ok(Value::Nil) => Ok(Attempt::Busy),
            Ok(_) => Err(Error::UnexpectedReply {
                service: Service::REDIS,
                op: "acquire",
            }),
            Err(err) => Err(not_a_fence(err, keys.fence())),
        }
    }

    /// Runs `step` (release or refresh) for `key` if it holds `token`, in
    /// one atomic step: `Ok(true)` if it acted, `Ok(false)` when the key did
    /// not hold our token. Sent as a command (Redis 8.4, Valkey 8.1 and
    /// 9.0) or a Lua script, as detected (see the `compare` module).
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
        let path = step.path(self.paths(key, deadline).await, fence);
        match self
            .send_step(step, path, key, fence, token, deadline)
            .await
        {
            Err(err) if path != Path::Lua => {
                let Some(fallback) = Fallback::of(&err) else {
                    return Err(err);
                };
                if fallback == Fallback::ForGood {
                    tracing::debug!(
                        error = %err,
                        op = step.op(),
                        "the server refused the command; using lua for this step from now on"
                    );
                    self.compare.fall_back(step);
                }
                self.send_step(step, Path::Lua, key, fence, token, deadline)
                    .await
            }
            outcome => outcome,
        }
    }

    /// Sends `step` on `path` and maps the reply (a script the server's
    /// cache lacks is sent again as `EVAL` of its source).
    async fn send_step(
        &self,
        step: Step,
        path: Path,
        key: &str,
        fence: Option<(&str, u64)>,
        token: &LeaseToken,
        deadline: Instant,
    ) -> Result<bool> {
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
            .await?;
        step.acted(path, &reply)
    }

    /// The paths this node uses, detecting them on first use.
    async fn paths(&self, key: &str, deadline: Instant) -> Paths {
        if let Some(paths) = self.compare.get() {
            return paths;
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
        let paths = match info {
            Ok(info) => Paths::from_info(&info).unwrap_or(Paths::LUA),
            // Transient: ask again next time; this call uses Lua.
            Err(Error::Timeout { .. } | Error::Unreachable { .. }) => return Paths::LUA,
            // Refused or unparseable: Lua is correct everywhere.
            Err(err) => {
                tracing::debug!(error = %err, "could not detect the server version; using lua");
                Paths::LUA
            }
        };
        self.compare.settle(paths);
        // A step that fell back meanwhile stays on Lua.
        self.compare.get().unwrap_or(paths)
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

    /// The paths this node has settled on, if it has decided (test hook).
    #[cfg(test)]
    pub(crate) fn detected_paths(&self) -> Option<Paths> {
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

    type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

    const NATIVE_REDIS: Paths = Paths {
        release: Path::Delex,
        refresh: Path::SetIfeq,
    };
    const NATIVE_VALKEY: Paths = Paths {
        release: Path::Delifeq,
        refresh: Path::SetIfeq,
    };

    /// The paths of the servers these tests run on (Debian's Redis 7,
    /// `scripts/valkey.sh`'s Valkey 8.1), as their docs and a try on them
    /// say; `None` for another server.
    fn known_paths(server: &leasehold_testkit::RedisServer) -> Option<Paths> {
        let info = server.redis_cli(&["INFO", "server"]).ok()?;
        if info.contains("valkey_version:8.1.") {
            Some(Paths {
                release: Path::Lua,
                refresh: Path::SetIfeq,
            })
        } else if !info.contains("valkey_version") && info.contains("redis_version:7.") {
            Some(Paths::LUA)
        } else {
            None
        }
    }

    fn pttl(
        server: &leasehold_testkit::RedisServer,
        key: &str,
    ) -> std::result::Result<i64, Box<dyn std::error::Error>> {
        Ok(server.redis_cli(&["PTTL", key])?.parse()?)
    }

    #[tokio::test]
    async fn the_server_is_detected_and_steps_work() -> TestResult {
        let server = leasehold_testkit::RedisServer::start()?;
        let node = node(&server).await?;
        let token = LeaseToken::generate()?;
        let deadline = Instant::now() + Duration::from_secs(1);
        assert_eq!(node.detected_paths(), None);
        let won = node.set_nx("t:detect", &token, 5000, deadline).await?;
        assert!(matches!(won, Attempt::Won(())));
        let refresh = Step::Refresh {
            ttl: Duration::from_secs(9),
        };
        assert!(
            node.token_checked(refresh, "t:detect", None, &token, deadline)
                .await?
        );
        let detected = node.detected_paths().ok_or("not detected")?;
        if let Some(known) = known_paths(&server) {
            assert_eq!(detected, known);
        }
        assert!(pttl(&server, "t:detect")? > 5000, "refresh did not extend");
        assert!(
            node.token_checked(Step::Release, "t:detect", None, &token, deadline)
                .await?
        );
        assert!(
            !node
                .token_checked(Step::Release, "t:detect", None, &token, deadline)
                .await?
        );
        // Nothing fell back on the way.
        assert_eq!(node.detected_paths(), Some(detected));
        Ok(())
    }

    /// The invariants on every path, forced, on whatever server runs the
    /// tests: a command it lacks falls back to the script, which must keep
    /// them too.
    #[tokio::test]
    async fn every_path_acts_only_on_our_token_and_refresh_never_creates_a_key() -> TestResult {
        let server = leasehold_testkit::RedisServer::start()?;
        let refresh = Step::Refresh {
            ttl: Duration::from_secs(60),
        };
        let forced = [
            Paths::LUA,
            Paths {
                release: Path::Lua,
                refresh: Path::SetIfeq,
            },
            NATIVE_REDIS,
            NATIVE_VALKEY,
        ];
        for (n, paths) in forced.into_iter().enumerate() {
            let node = node(&server).await?;
            node.compare.settle(paths);
            let ours = LeaseToken::generate()?;
            let theirs = LeaseToken::generate()?;
            let key = format!("t:paths:{n}");
            let deadline = Instant::now() + Duration::from_secs(1);
            let checked = |step| node.token_checked(step, &key, None, &ours, deadline);

            // Gone: a refresh does not bring it back.
            assert!(!checked(refresh).await?, "{paths:?}");
            assert_eq!(server.redis_cli(&["EXISTS", &key])?, "0", "{paths:?}");
            assert!(!checked(Step::Release).await?, "{paths:?}");

            // Someone else's: left as it is.
            server.redis_cli(&["SET", &key, theirs.as_str(), "PX", "5000"])?;
            assert!(!checked(refresh).await?, "{paths:?}");
            assert!(!checked(Step::Release).await?, "{paths:?}");
            assert_eq!(
                server.redis_cli(&["GET", &key])?,
                theirs.as_str(),
                "{paths:?}"
            );
            assert!(pttl(&server, &key)? <= 5000, "{paths:?}: extended theirs");

            // Ours: extended, then deleted.
            server.redis_cli(&["SET", &key, ours.as_str(), "PX", "5000"])?;
            assert!(checked(refresh).await?, "{paths:?}");
            assert!(pttl(&server, &key)? > 5000, "{paths:?}: not extended");
            assert_eq!(
                server.redis_cli(&["GET", &key])?,
                ours.as_str(),
                "{paths:?}"
            );
            assert!(checked(Step::Release).await?, "{paths:?}");
            assert_eq!(server.redis_cli(&["EXISTS", &key])?, "0", "{paths:?}");

            // A wrong-type key is reported, on every path, and kept.
            server.redis_cli(&["DEL", &key])?;
            server.redis_cli(&["HSET", &key, "f", "v"])?;
            for step in [refresh, Step::Release] {
                let err = checked(step).await.err();
                assert!(
                    matches!(err, Some(Error::WrongType { .. })),
                    "{paths:?}: {err:?}"
                );
            }
            assert_eq!(server.redis_cli(&["TYPE", &key])?, "hash", "{paths:?}");

            // Each step is on its own path or fell back to Lua.
            let now = node.detected_paths().ok_or("undecided")?;
            assert!([paths.release, Path::Lua].contains(&now.release), "{now:?}");
            assert!([paths.refresh, Path::Lua].contains(&now.refresh), "{now:?}");
            if let Some(known) = known_paths(&server) {
                let kept = |forced: Path, has: Path| if forced == has { forced } else { Path::Lua };
                assert_eq!(now.release, kept(paths.release, known.release), "{paths:?}");
                assert_eq!(now.refresh, kept(paths.refresh, known.refresh), "{paths:?}");
            }
        }
        Ok(())
    }

    /// A user with the README's minimal ACL and `+info` (so detection
    /// works) but not the command: `NOPERM` once, then the script, which
    /// needs only what that ACL grants.
    #[tokio::test]
    async fn a_command_the_acl_refuses_falls_back_to_lua_for_good() -> TestResult {
        let server = leasehold_testkit::RedisServer::start()?;
        // No +set (a lock taken by another user), +delex, +delifeq.
        let rules = [
            "~t:*", "+get", "+del", "+pexpire", "+evalsha", "+eval", "+info",
        ];
        server.set_acl_user("without-set", "pw", &rules)?;
        let client = redis::Client::open(format!(
            "redis://without-set:pw@{}:{}",
            server.host(),
            server.port()
        ))?;
        let conn = redis::aio::ConnectionManager::new(client).await?;
        let node = Node::new(conn, Duration::from_secs(1), None);
        node.compare.settle(NATIVE_VALKEY);
        let token = LeaseToken::generate()?;
        server.redis_cli(&["SET", "t:acl", token.as_str(), "PX", "5000"])?;
        let deadline = Instant::now() + Duration::from_secs(1);
        let refresh = Step::Refresh {
            ttl: Duration::from_secs(60),
        };
        for _ in 0..2 {
            assert!(
                node.token_checked(refresh, "t:acl", None, &token, deadline)
                    .await?
            );
        }
        assert!(pttl(&server, "t:acl")? > 5000);
        assert_eq!(node.detected_paths().map(|p| p.refresh), Some(Path::Lua));
        // SET was refused once: the second refresh went straight to Lua.
        // (redis-rs's CLIENT SETINFO on connect may be refused too.)
        let refused: Vec<_> = server
            .acl_log()?
            .into_iter()
            .filter(|r| r.reason == "command" && !r.object.starts_with("client|"))
            .map(|r| (r.object, r.count))
            .collect();
        assert_eq!(refused, [("set".to_owned(), 1)]);
        assert!(
            node.token_checked(Step::Release, "t:acl", None, &token, deadline)
                .await?
        );
        assert_eq!(node.detected_paths(), Some(Paths::LUA));
        Ok(())
    }

    /// `SET` is refused under `maxmemory` where the script's `PEXPIRE` is
    /// not: that refresh goes through Lua, and the next one tries `SET`
    /// again.
    #[tokio::test]
    async fn out_of_memory_sends_that_refresh_as_the_script() -> TestResult {
        let server = leasehold_testkit::RedisServer::start()?;
        let node = node(&server).await?;
        node.compare.settle(NATIVE_VALKEY);
        let token = LeaseToken::generate()?;
        server.redis_cli(&["SET", "t:oom", token.as_str(), "PX", "5000"])?;
        server.redis_cli(&["CONFIG", "SET", "maxmemory", "1"])?;
        let full = server.redis_cli(&["SET", "t:other", "x"]).err();
        assert!(full.is_some_and(|e| e.to_string().contains("OOM")));
        let refresh = Step::Refresh {
            ttl: Duration::from_secs(60),
        };
        let deadline = Instant::now() + Duration::from_secs(1);
        let refreshed = node
            .token_checked(refresh, "t:oom", None, &token, deadline)
            .await;
        server.redis_cli(&["CONFIG", "SET", "maxmemory", "0"])?;
        assert!(refreshed?);
        assert!(pttl(&server, "t:oom")? > 5000);
        assert_eq!(
            node.detected_paths().map(|p| p.refresh),
            Some(Path::SetIfeq)
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
            .paths("t:x", Instant::now() + Duration::from_millis(50))
            .await;
        server.resume()?;
        assert_eq!(path, Paths::LUA);
        assert_eq!(node.detected_paths(), None);
        Ok(())
    }
}
