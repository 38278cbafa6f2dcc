//! The reconnecting connection: [`Connection`], and why it is not
//! redis-rs's `ConnectionManager`.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures_util::future::{BoxFuture, FutureExt, Shared};
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Cmd, Pipeline, RedisError, RedisFuture, RedisResult, Value};
use tokio::time::Instant;

use crate::endpoint::Endpoint;

/// How often an attempt that could not reach Redis is retried before the
/// requests waiting for it fail (the next request starts a new attempt).
pub(crate) const RECONNECT_RETRIES: usize = 2;

/// The first pause between tries within an attempt; it doubles.
const RETRY_DELAY: Duration = Duration::from_millis(20);

/// The first pause before a refused handshake is tried again; it doubles
/// up to [`REFUSED_MAX_DELAY`].
const REFUSED_DELAY: Duration = Duration::from_millis(50);

/// The longest pause before a refused handshake is tried again.
const REFUSED_MAX_DELAY: Duration = Duration::from_millis(500);

/// Through Sentinel, how often a request asks the sentinels whether the
/// primary moved: 500 ms.
const SWITCH_CHECK: Duration = Duration::from_millis(500);

/// A Redis connection that reconnects when it drops, and authenticates
/// again when the server refused it.
///
/// The default connection of [`Locker`](crate::Locker),
/// [`HandoffLocker`](crate::HandoffLocker) and [`Quorum`](crate::Quorum):
/// [`Locker::connect`](crate::Locker::connect),
/// [`HandoffLocker::connect`](crate::HandoffLocker::connect) and
/// [`Quorum::connect`](crate::Quorum::connect) (and their builders'
/// `connect`) open it. It is a
/// [`ConnectionLike`], so it also runs your own commands
/// (`redis::AsyncCommands`). Cheap to clone: clones share the connection
/// and its reconnects.
///
/// # Why not redis-rs's `ConnectionManager`
///
/// [`ConnectionManager`](redis::aio::ConnectionManager) reconnects after an
/// I/O error, but when the new connection's handshake is refused (the
/// server no longer accepts our credentials: an ACL user lost on an empty
/// restart, a user switched off, a password being rotated) it keeps that
/// failed attempt and answers every later request with the same error at
/// once, forever: redis-rs 1.x starts a new attempt only after an I/O
/// error. A long-lived locker then never recovers, although a fresh process
/// connects at once.
///
/// # How it reconnects
///
/// - A request that finds the connection dropped (Redis restarted, the
///   connection was killed) fails, and a new connection is started at once;
///   requests sent meanwhile wait for it, each bounded by its own deadline.
/// - An attempt that cannot reach Redis is retried within the attempt
///   (twice, a few tens of milliseconds apart, for a locker's connection);
///   if Redis is still down, the requests waiting for it fail
///   ([`Error::Unreachable`](crate::Error::Unreachable)) and the next
///   request starts a new attempt.
/// - A handshake the server refuses (credentials, or a command the
///   handshake needs, such as `SELECT`) is tried again by the first request
///   after a backoff: 50 ms, doubling up to 500 ms, starting over once a
///   handshake succeeds. Requests in between fail at once with the same
///   error ([`Error::Auth`](crate::Error::Auth), retryable). So a server
///   that refuses us sees at most two or three handshakes a second from
///   each connection, and the connection works again within about half a
///   second of the server accepting it.
///
/// Through a [`Sentinel`](crate::Sentinel) (feature `sentinel`), every
/// attempt asks the sentinels for the primary first and checks its role,
/// and a `READONLY` reply (the node was demoted) starts a new attempt like
/// a dropped connection: see [`sentinel`](crate::sentinel).
///
/// A request that waited for a connection that could not be opened never
/// reached Redis, so it was not applied. No error or `Debug` output shows
/// the URL or its password.
#[derive(Clone)]
pub struct Connection {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Connection {
    /// Never shows the client: its URL may hold a password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("db", &self.get_db())
            .finish_non_exhaustive()
    }
}

struct Inner {
    endpoint: Endpoint,
    /// Timeouts for opening the connection, and for Sentinel's own
    /// requests. A connection to one server is opened without its response
    /// timeout (see [`Endpoint::open`]).
    config: AsyncConnectionConfig,
    /// Bounds each response to a request of the user's (through
    /// [`ConnectionLike`]); the library's own requests have deadlines of
    /// their own (see [`Connection::send_within`]).
    response_timeout: Duration,
    /// How often one attempt retries when Redis cannot be reached.
    retries: usize,
    state: Mutex<State>,
}

/// The connection requests go out on: one attempt to open it, resolved or
/// not, shared by every request.
type Attempt = Shared<BoxFuture<'static, Result<Opened, Failure>>>;

/// An open connection, and through Sentinel the primary's address it went
/// to.
type Opened = (MultiplexedConnection, Option<(String, u16)>);

/// Why an attempt failed, and when.
#[derive(Clone)]
struct Failure {
    error: RedisError,
    at: Instant,
}

impl Failure {
    /// The server answered and refused us, as opposed to not being
    /// reachable: worth trying again only after a pause.
    fn refused(&self) -> bool {
        !self.error.is_io_error()
    }
}

struct State {
    /// Counts attempts, so that a request reporting a dropped connection
    /// never replaces an attempt newer than the one it used.
    generation: u64,
    attempt: Attempt,
    /// Handshakes refused in a row: the backoff's exponent.
    refused: u32,
    /// Through Sentinel: when a request last asked the sentinels whether
    /// the primary moved.
    checked: Instant,
}

impl Connection {
    /// A connection to `endpoint` (a server, or the primary the sentinels
    /// name) that connects on its first request. `timeout` bounds each
    /// connect and each response; an attempt that cannot reach Redis is
    /// tried `retries` more times. No I/O.
    pub(crate) fn lazy(endpoint: Endpoint, timeout: Duration, retries: usize) -> Connection {
        #[cfg(feature = "tls")]
        crate::tls::install_provider();
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout));
        let attempt = open(endpoint.clone(), config.clone(), retries);
        Connection {
            inner: Arc::new(Inner {
                endpoint,
                config,
                response_timeout: timeout,
                retries,
                state: Mutex::new(State {
                    generation: 0,
                    attempt,
                    refused: 0,
                    checked: Instant::now(),
                }),
            }),
        }
    }

    /// Waits until the connection is open (or the attempt failed).
    ///
    /// # Cancel safety
    /// Cancel safe: the attempt goes on for the next request.
    pub(crate) async fn established(&self) -> RedisResult<()> {
        self.connection().await.map(drop)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The connection for one request, and its generation. Starts a new
    /// attempt first when the last one failed and its retry is due.
    ///
    /// Through Sentinel, at most every [`SWITCH_CHECK`], a request also
    /// starts a background check that asks the sentinels whether the
    /// primary moved (a failover promotes a replica while the old primary,
    /// not yet demoted, still takes writes: Sentinel demotes it seconds
    /// later). If it did, the check starts a new attempt, which resolves
    /// the primary again, and later requests go out on that one. The
    /// request itself does not wait for the check: sentinels that are slow
    /// or down never delay a request.
    async fn connection(&self) -> RedisResult<(u64, MultiplexedConnection)> {
        let (generation, conn, addr) = self.current().await?;
        if let Some(addr) = addr {
            self.check_primary(generation, addr);
        }
        Ok((generation, conn))
    }

    /// Starts the check of [`connection`](Self::connection) if it is due.
    fn check_primary(&self, generation: u64, addr: (String, u16)) {
        {
            let mut state = self.state();
            if state.generation != generation || state.checked.elapsed() < SWITCH_CHECK {
                return;
            }
            state.checked = Instant::now();
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let this = self.clone();
        runtime.spawn(async move {
            if this.inner.endpoint.moved(&addr, &this.inner.config).await {
                let mut state = this.state();
                if state.generation == generation {
                    tracing::info!("the sentinels name another primary; reconnecting to it");
                    this.replace(&mut state);
                    runtime_spawn(state.attempt.clone().map(drop));
                }
            }
        });
    }

    /// The current attempt's connection (see [`connection`](Self::connection)).
    async fn current(&self) -> RedisResult<(u64, MultiplexedConnection, Option<(String, u16)>)> {
        let (generation, attempt) = {
            let mut state = self.state();
            match state.attempt.peek() {
                Some(Err(failure)) => {
                    let refused = failure.refused();
                    let due = if refused {
                        failure.at + refused_delay(state.refused)
                    } else {
                        failure.at
                    };
                    if Instant::now() >= due {
                        state.refused = if refused {
                            state.refused.saturating_add(1)
                        } else {
                            0
                        };
                        self.replace(&mut state);
                    }
                }
                // Open: the request goes out on it without waiting on
                // the shared attempt.
                Some(Ok((conn, addr))) => {
                    let (conn, addr) = (conn.clone(), addr.clone());
                    state.refused = 0;
                    return Ok((state.generation, conn, addr));
                }
                _ => {}
            }
            (state.generation, state.attempt.clone())
        };
        match attempt.await {
            Ok((conn, addr)) => Ok((generation, conn, addr)),
            Err(failure) => Err(failure.error),
        }
    }

    fn replace(&self, state: &mut State) {
        state.generation = state.generation.wrapping_add(1);
        state.attempt = open(
            self.inner.endpoint.clone(),
            self.inner.config.clone(),
            self.inner.retries,
        );
    }

    /// After a request on generation `generation`: if its error says the
    /// connection is gone, starts a new one at once (unless a newer one is
    /// already there), so that the next request finds it ready. Through
    /// Sentinel, a `READONLY` reply (the node is no longer the primary)
    /// does too: the new connection resolves the primary again.
    fn after<T>(&self, generation: u64, result: &RedisResult<T>) {
        let Err(err) = result else {
            return;
        };
        let moved = self.inner.endpoint.follows_primary() && err.code() == Some("READONLY");
        if !err.is_unrecoverable_error() && !moved {
            return;
        }
        let mut state = self.state();
        if state.generation != generation {
            return;
        }
        state.refused = 0;
        self.replace(&mut state);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(state.attempt.clone().map(drop));
        }
    }
}

/// Drives `attempt` on the current runtime, if there is one.
fn runtime_spawn(attempt: impl Future<Output = ()> + Send + 'static) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(attempt);
    }
}

/// One attempt to open a connection, retried `retries` times while Redis
/// cannot be reached; a refused handshake ends it at once.
fn open(endpoint: Endpoint, config: AsyncConnectionConfig, retries: usize) -> Attempt {
    async move {
        let mut delay = RETRY_DELAY;
        let mut left = retries;
        loop {
            match endpoint.open(&config).await {
                Ok(opened) => return Ok(opened),
                Err(error) if error.is_io_error() && left > 0 => {
                    left -= 1;
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
                Err(error) => {
                    return Err(Failure {
                        error,
                        at: Instant::now(),
                    });
                }
            }
        }
    }
    .boxed()
    .shared()
}

/// The pause before trying a handshake again after `refused` refusals in a
/// row (before this one).
fn refused_delay(refused: u32) -> Duration {
    REFUSED_DELAY
        .saturating_mul(1 << refused.min(16))
        .min(REFUSED_MAX_DELAY)
}

impl Connection {
    /// Sends `cmd` and returns its reply, for a caller that bounds the
    /// whole request itself by a deadline no later than the command
    /// timeout (`Node`'s steps do, through `call::bounded`). So on a
    /// connection to one server no response timer of redis-rs's runs
    /// beside the caller's: one timer per request, not two. (Through
    /// Sentinel the data connection keeps redis-rs's response timer, which
    /// then runs too.) What happens to the connection after a failure is
    /// the same as for any request.
    pub(crate) async fn send_within(&self, cmd: &Cmd) -> RedisResult<Value> {
        let (generation, mut conn) = self.connection().await?;
        let result = conn.send_packed_command(cmd).await;
        self.after(generation, &result);
        result
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (generation, mut conn) = self.connection().await?;
            conn.set_response_timeout(self.inner.response_timeout);
            let result = conn.send_packed_command(cmd).await;
            self.after(generation, &result);
            result
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (generation, mut conn) = self.connection().await?;
            conn.set_response_timeout(self.inner.response_timeout);
            let result = conn.send_packed_commands(pipeline, offset, count).await;
            self.after(generation, &result);
            result
        })
    }

    fn get_db(&self) -> i64 {
        self.inner.endpoint.db()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_handshakes_back_off_up_to_half_a_second() {
        let delays: Vec<u128> = (0..6).map(|n| refused_delay(n).as_millis()).collect();
        assert_eq!(delays, [50, 100, 200, 400, 500, 500]);
        assert_eq!(refused_delay(u32::MAX), REFUSED_MAX_DELAY);
    }
}
