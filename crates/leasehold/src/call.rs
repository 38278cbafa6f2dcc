//! Every Redis request goes through [`bounded`]: one deadline, one error map.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{Error, Result};

/// Runs `request`, failing with [`Error::Timeout`] if it has not answered by
/// `deadline`. A paused Redis therefore costs the caller its own deadline, not
/// the client's socket timeout.
pub(crate) async fn bounded<T, F>(
    op: &'static str,
    key: &str,
    deadline: Instant,
    request: F,
) -> Result<T>
where
    F: Future<Output = redis::RedisResult<T>>,
{
    let start = Instant::now();
    match tokio::time::timeout_at(deadline, request).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(err)) if err.is_timeout() => Err(Error::Timeout {
            op,
            after: start.elapsed(),
        }),
        Ok(Err(err)) => Err(Error::from_redis(op, key, err)),
        Err(_elapsed) => Err(Error::Timeout {
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
