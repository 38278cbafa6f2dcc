//! Every Redis request goes through [`bounded`]: one deadline, one error map.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::service::Service;

/// Runs `request`, failing with [`Error::Timeout`] if it has not answered by
/// `deadline`. A paused Redis therefore costs the caller its own deadline, not
/// the client's socket timeout.
pub(crate) fn bounded<T, F>(
    op: &'static str,
    key: &str,
    deadline: Instant,
    request: F,
) -> impl Future<Output = Result<T>>
where
    F: Future<Output = redis::RedisResult<T>>,
{
    bounded_since(op, key, Instant::now(), deadline, request)
}

/// [`bounded`], for a request that starts at `start`: a clock read the
/// caller made anyway (a timeout reports how long after it).
pub(crate) async fn bounded_since<T, F>(
    op: &'static str,
    key: &str,
    start: Instant,
    deadline: Instant,
    request: F,
) -> Result<T>
where
    F: Future<Output = redis::RedisResult<T>>,
{
    match tokio::time::timeout_at(deadline, request).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(err)) if err.is_timeout() => Err(Error::Timeout {
            service: Service::REDIS,
            op,
            after: start.elapsed(),
        }),
        Ok(Err(err)) => Err(Error::from_redis(op, key, err)),
        Err(_elapsed) => Err(Error::Timeout {
            service: Service::REDIS,
            op,
            after: start.elapsed(),
        }),
    }
}

/// The TTL in whole milliseconds, rounded up: Redis may keep the key a little
/// longer than the holder believes (harmless), never shorter.
pub(crate) fn ttl_millis(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

/// Runs `request` (given each try's deadline), starting at `now` (the
/// caller's clock read), until it answers, or fails for a reason that
/// cannot pass, or `until` comes: a fault that may pass
/// quickly (a lost or refused connection while Redis restarts, `LOADING`,
/// `TRYAGAIN`, `MASTERDOWN`, ...) is retried after a short backoff (10 ms,
/// doubling to 200 ms). A timeout is not retried: a server that does not
/// answer has had the whole `per_try` (the command timeout), which is what
/// the caller was promised. Every try is bounded by `per_try`, and there is
/// always at least one, even if `until` has passed.
///
/// Only for requests that are safe to repeat: token-checked steps, which act
/// only while the key holds our token.
pub(crate) async fn retrying<T, F, Fut>(
    mut now: Instant,
    until: Instant,
    per_try: Duration,
    mut request: F,
) -> Result<T>
where
    F: FnMut(Instant) -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let end = until.max(now + per_try);
    let mut backoff = Duration::from_millis(10);
    loop {
        match request(end.min(now + per_try)).await {
            Err(err)
                if fault_may_pass(&err)
                    && !matches!(err, Error::Timeout { .. })
                    && Instant::now() + backoff < end =>
            {
                tracing::debug!(error = %err, "request failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(200));
                now = Instant::now();
            }
            outcome => return outcome,
        }
    }
}

/// Whether `err` is a fault of Redis or the network that may pass (not
/// contention, not bad input, not a refusal).
pub(crate) fn fault_may_pass(err: &Error) -> bool {
    err.is_retryable() && !matches!(err, Error::NotAcquired { .. })
}

/// Whether a request that failed with `err` may still have acted on Redis
/// (or etcd): its outcome is unknown. A timeout, or a connection that broke
/// while the request was out, may have (on etcd: a write whose answer was
/// lost); a refused connection or a failed write (the request never left),
/// or an error reply (Redis refused it), did not.
pub(crate) fn may_have_acted(err: &Error) -> bool {
    match err {
        Error::Timeout { .. } => true,
        Error::Unreachable { source, .. } => !never_sent(source),
        Error::Service { fault, .. } => *fault == crate::error::ServiceFault::Unknown,
        _ => false,
    }
}

/// Whether the client error says the request never reached the server.
fn never_sent(err: &redis::RedisError) -> bool {
    use std::io::ErrorKind;
    type Shared = std::sync::Arc<dyn std::error::Error + Send + Sync>;
    let io = std::error::Error::source(err).and_then(|source| {
        // redis-rs keeps an I/O error behind an `Arc<dyn Error>`.
        source.downcast_ref::<std::io::Error>().or_else(|| {
            source
                .downcast_ref::<Shared>()
                .and_then(|shared| shared.downcast_ref::<std::io::Error>())
        })
    });
    err.is_connection_refusal()
        || io.is_some_and(|io| {
            matches!(
                io.kind(),
                ErrorKind::BrokenPipe | ErrorKind::NotConnected | ErrorKind::ConnectionRefused
            )
        })
}
