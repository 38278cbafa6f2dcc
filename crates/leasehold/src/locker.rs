//! The single-node lease lock: `SET key token NX PX ttl`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::Value;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::lease::Lease;
use crate::options::AcquireOptions;
pub(crate) use crate::rounds::{self, Attempt};
use crate::stats::{Counters, LockerStats};
use crate::token::LeaseToken;
use crate::{RedisConnection, RetryStrategy, call};

/// The longest TTL a lease may have: 24 hours. A lease longer than that is
/// almost certainly a unit mistake (seconds passed as milliseconds), and a
/// crashed holder would block the key for as long.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// How long a single Redis request may take when the caller gave no tighter
/// deadline: 1 s.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(1);

/// Takes leases on one Redis server (or one Redis Cluster).
///
/// Cheap to clone: clones share the connection, which redis-rs multiplexes.
/// Generic over the connection type; the default, from [`Locker::connect`]
/// or [`connect`], is a reconnecting [`ConnectionManager`]: after Redis
/// restarts or the connection drops, the request that finds it broken fails
/// ([`Error::Unreachable`], which [`is_retryable`](Error::is_retryable))
/// and starts a reconnect, and the next request goes out on the new
/// connection. A cluster connection works too. A bare
/// [`ConnectionManager`](redis::aio::ConnectionManager) never
/// reconnects: once it breaks, every request fails until you build a new
/// locker, so use it only where something else replaces it.
#[derive(Clone)]
pub struct Locker<C = ConnectionManager> {
    pub(crate) inner: Arc<Inner<C>>,
}

pub(crate) struct Inner<C> {
    pub(crate) conn: C,
    pub(crate) command_timeout: Duration,
    /// `SET ... NX GET` needs Redis 7.0; older servers get plain `SET NX`.
    set_nx_get: AtomicBool,
    /// Whether release and refresh use Redis 8.4 commands or Lua.
    pub(crate) compare: crate::compare::Detected,
    pub(crate) counters: Counters,
}

impl<C> std::fmt::Debug for Locker<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Locker")
            .field("command_timeout", &self.inner.command_timeout)
            .finish_non_exhaustive()
    }
}

/// Builds a [`Locker`] with non-default settings.
#[must_use]
#[derive(Debug)]
pub struct LockerBuilder<C> {
    conn: C,
    command_timeout: Duration,
}

impl<C: RedisConnection> LockerBuilder<C> {
    /// Bounds every Redis request that has no tighter deadline of its own
    /// (release, and each attempt of an acquire whose deadline is further
    /// away).
    ///
    /// Defaults to [`DEFAULT_COMMAND_TIMEOUT`] (1 s).
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// Checks the settings and builds the locker. No I/O.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] for a zero command timeout.
    pub fn build(self) -> Result<Locker<C>> {
        if self.command_timeout.is_zero() {
            return Err(Error::InvalidOptions("command timeout must be positive"));
        }
        Ok(Locker::from_parts(self.conn, self.command_timeout))
    }
}

impl Locker<ConnectionManager> {
    /// Opens a reconnecting connection to `client`'s server (see
    /// [`connect`]) and wraps it in a locker with default settings. This is
    /// the way in for a long-lived service: the locker outlives Redis
    /// restarts and dropped connections.
    ///
    /// # Errors
    /// [`Error::Unreachable`] when nothing listens, [`Error::Timeout`] when
    /// the server accepts the connection but does not answer (a paused
    /// process), [`Error::Auth`] for wrong credentials.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future drops the half-open connection.
    pub async fn connect(client: &redis::Client) -> Result<Self> {
        let conn = connect(client, DEFAULT_COMMAND_TIMEOUT).await?;
        Locker::builder(conn).build()
    }
}

/// How often a broken connection is retried before the request waiting for
/// it fails (the next request starts a new round).
const RECONNECT_RETRIES: usize = 2;

/// Opens a reconnecting connection ([`ConnectionManager`]) whose connect and
/// response timeouts are both `timeout`, mapping failures to [`Error`].
///
/// When a request finds the connection broken (Redis restarted, the
/// connection was killed or timed out at the TCP level), that request fails
/// and a reconnect starts at once, retried twice within a few hundred
/// milliseconds; requests sent meanwhile wait for it (bounded by their own
/// deadlines). If Redis is still down, those requests fail and the next one
/// starts a new reconnect, so a caller that retries recovers as soon as
/// Redis is back.
///
/// # Errors
/// See [`Locker::connect`].
pub async fn connect(client: &redis::Client, timeout: Duration) -> Result<ConnectionManager> {
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout))
        .set_number_of_retries(RECONNECT_RETRIES)
        .set_min_delay(Duration::from_millis(20))
        .set_max_delay(Duration::from_millis(200));
    let deadline = Instant::now() + timeout;
    call::bounded(
        "connect",
        "",
        deadline,
        ConnectionManager::new_with_config(client.clone(), config),
    )
    .await
}

/// Rejects TTLs Redis would refuse or that cannot be meant. No I/O.
pub(crate) fn check_ttl(ttl: Duration) -> Result<()> {
    if ttl < Duration::from_millis(1) || ttl > MAX_TTL {
        return Err(Error::InvalidTtl { ttl, max: MAX_TTL });
    }
    Ok(())
}

/// Rejects keys that cannot name a lock. No I/O.
pub(crate) fn check_key(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(Error::InvalidKey {
            key: key.to_owned(),
            reason: "key is empty",
        });
    }
    Ok(())
}

/// The TTL in whole milliseconds, rounded up: Redis may keep the key a little
/// longer than the holder believes (harmless), never shorter.
pub(crate) fn ttl_millis(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

impl<C: RedisConnection> Locker<C> {
    /// A locker over `conn` with default settings.
    pub fn new(conn: C) -> Self {
        Locker::from_parts(conn, DEFAULT_COMMAND_TIMEOUT)
    }

    fn from_parts(conn: C, command_timeout: Duration) -> Self {
        Locker {
            inner: Arc::new(Inner {
                conn,
                command_timeout,
                set_nx_get: AtomicBool::new(true),
                compare: crate::compare::Detected::default(),
                counters: Counters::default(),
            }),
        }
    }

    /// A builder over `conn`, for non-default settings.
    pub fn builder(conn: C) -> LockerBuilder<C> {
        LockerBuilder {
            conn,
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
        }
    }

    /// The bound on a single Redis request; see
    /// [`LockerBuilder::command_timeout`].
    pub fn command_timeout(&self) -> Duration {
        self.inner.command_timeout
    }

    /// What this locker and its clones have asked of Redis so far.
    pub fn stats(&self) -> LockerStats {
        self.inner.counters.snapshot()
    }

    /// Takes the lease on `key` for `ttl`, waiting with the default
    /// [`AcquireOptions`] (up to 10 s, random 5 to 15 ms between attempts).
    ///
    /// See [`acquire_with`](Self::acquire_with) for errors and cancel safety.
    pub async fn acquire(&self, key: &str, ttl: Duration) -> Result<Lease<C>> {
        self.acquire_with(key, ttl, &AcquireOptions::default())
            .await
    }

    /// One attempt: the lease if the key is free now, else
    /// [`Error::NotAcquired`] with
    /// [`GiveUpReason::RetriesExhausted`](crate::GiveUpReason::RetriesExhausted).
    ///
    /// See [`acquire_with`](Self::acquire_with) for errors and cancel safety.
    pub async fn try_acquire(&self, key: &str, ttl: Duration) -> Result<Lease<C>> {
        let opts = AcquireOptions::new()
            .retry(RetryStrategy::none())
            .wait(self.inner.command_timeout);
        self.acquire_with(key, ttl, &opts).await
    }

    /// Takes the lease on `key` for `ttl`: `SET key token NX PX ttl` with a
    /// fresh 128-bit token, retried while the key is busy, as `opts` says.
    ///
    /// The lease's validity is counted from the moment the winning request
    /// was *sent*, so the holder's idea of its remaining time is never longer
    /// than Redis's.
    ///
    /// # Errors
    /// - [`Error::InvalidTtl`] / [`Error::InvalidKey`] before any I/O;
    /// - [`Error::NotAcquired`] when the key stayed busy, with the reason:
    ///   retries exhausted, deadline expired, or cancelled;
    /// - [`Error::Timeout`] when Redis did not answer in time (each request
    ///   is bounded by the deadline and the command timeout),
    ///   [`Error::Unreachable`], [`Error::Auth`], [`Error::WrongType`] (the
    ///   key holds a non-string value), returned at once without retrying;
    /// - [`Error::InvalidOptions`] when [`AcquireOptions::watchdog`] is set
    ///   but there is no tokio runtime to run it on (the lease just taken is
    ///   then released in the background), or for a zero
    ///   [`wait_replicas`](AcquireOptions::wait_replicas) timeout (before
    ///   any I/O);
    /// - [`Error::NotReplicated`] when
    ///   [`AcquireOptions::wait_replicas`] is set and too few replicas
    ///   acknowledged the lock: it was released again.
    ///
    /// # Cancel safety
    /// Cancel safe. If the future is dropped (or times out) while a `SET` is
    /// in flight, the `SET` may still land; a best-effort token-checked
    /// release is then spawned, and the TTL is the fallback. Dropped while
    /// waiting for replicas, the lease already exists and its drop releases
    /// it in the background.
    pub async fn acquire_with(
        &self,
        key: &str,
        ttl: Duration,
        opts: &AcquireOptions,
    ) -> Result<Lease<C>> {
        check_key(key)?;
        check_ttl(ttl)?;
        crate::replicas::check(opts)?;
        let token = LeaseToken::generate()?;
        let px = ttl_millis(ttl);
        let deadline = opts.deadline_from(Instant::now());
        let ((), sent_at) = self
            .acquire_loop(key, &token, opts, |deadline| {
                self.set_nx(key, &token, px, deadline)
            })
            .await?;
        let lease = Lease::new(self.clone(), key.to_owned(), token, ttl, sent_at);
        let mut lease = self.confirm_replicated(lease, opts, deadline).await?;
        if opts.watchdog {
            lease.watch()?;
        }
        Ok(lease)
    }

    /// The retry loop every way of taking a lease shares: one `attempt` per
    /// round, each bounded by the caller's deadline and the command timeout
    /// and raced against the caller's cancellation token, waits from the
    /// retry strategy in between. Returns what the winning attempt returned
    /// and when it was sent.
    ///
    /// If an attempt is abandoned mid-flight (timeout, cancel, or the whole
    /// future dropped), its request may still land, so a token-checked
    /// release is spawned for `token`.
    pub(crate) async fn acquire_loop<T, F, Fut>(
        &self,
        key: &str,
        token: &LeaseToken,
        opts: &AcquireOptions,
        mut attempt: F,
    ) -> Result<(T, Instant)>
    where
        F: FnMut(Instant) -> Fut,
        Fut: Future<Output = Result<Attempt<T>>>,
    {
        let (won, sent_at) = rounds::acquire_rounds(
            key,
            opts,
            self.inner.command_timeout,
            |deadline| {
                self.inner.counters.acquire_request();
                attempt(deadline)
            },
            || crate::lease::spawn_release(self.clone(), key.to_owned(), token.clone()),
        )
        .await?;
        self.inner.counters.acquisition();
        Ok((won, sent_at))
    }

    /// One `SET key token NX PX ttl` round trip.
    async fn set_nx(
        &self,
        key: &str,
        token: &LeaseToken,
        px: u64,
        deadline: Instant,
    ) -> Result<Attempt<()>> {
        let with_get = self.inner.set_nx_get.load(Ordering::Relaxed);
        let mut cmd = redis::cmd("SET");
        cmd.arg(key).arg(token).arg("NX").arg("PX").arg(px);
        if with_get {
            // With GET, a key of another type fails with WRONGTYPE instead of
            // looking busy forever.
            cmd.arg("GET");
        }
        let mut conn = self.inner.conn.clone();
        let reply = call::bounded(
            "acquire",
            key,
            deadline,
            cmd.query_async::<Value>(&mut conn),
        )
        .await;
        let reply = match reply {
            Err(Error::Redis { source, .. })
                if with_get && source.code() == Some("ERR") && is_syntax_error(&source) =>
            {
                // Redis before 7.0 refuses NX together with GET.
                self.inner.set_nx_get.store(false, Ordering::Relaxed);
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

    /// Deletes `key` if it still holds `token`. `Ok(false)`: it did not.
    pub(crate) async fn release_token(
        &self,
        key: &str,
        token: &LeaseToken,
        deadline: Instant,
    ) -> Result<bool> {
        self.inner.counters.release_request();
        self.token_checked(crate::compare::Step::Release, key, token, deadline)
            .await
    }
}

fn is_syntax_error(err: &redis::RedisError) -> bool {
    err.detail().is_some_and(|d| d.contains("syntax error"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_bounds() {
        assert!(check_ttl(Duration::ZERO).is_err());
        assert!(check_ttl(Duration::from_micros(999)).is_err());
        assert!(check_ttl(Duration::from_millis(1)).is_ok());
        assert!(check_ttl(MAX_TTL).is_ok());
        assert!(matches!(
            check_ttl(MAX_TTL + Duration::from_millis(1)),
            Err(Error::InvalidTtl { .. })
        ));
    }

    #[test]
    fn ttl_rounds_up_to_whole_milliseconds() {
        assert_eq!(ttl_millis(Duration::from_millis(1)), 1);
        assert_eq!(ttl_millis(Duration::from_micros(1001)), 2);
        assert_eq!(ttl_millis(Duration::from_secs(2)), 2000);
    }

    #[test]
    fn empty_key_rejected() {
        assert!(matches!(check_key(""), Err(Error::InvalidKey { .. })));
        assert!(check_key("lock:wallet:42").is_ok());
    }
}
