//! Giving a lease back and keeping it, with faults that may pass retried
//! while the lease is still valid: the one retry of a release (a caller's
//! and a dropped lease's) and the one of a refresh (a caller's and the
//! watchdog's), and how a release is reported.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::lost::LostCause;
use crate::metrics;

use super::TARGET;
use super::backend::{Backend, Part};

/// Gives `part`'s lock back, retrying a fault that may pass until `until`
/// (the lease's confirmed deadline: after it the TTL frees the key anyway),
/// at least one `per_try`. A try that faulted may have landed, so if a later
/// try then finds the key no longer ours, we cannot tell "released by that
/// try" from "lost before": the fault is the outcome, never a `NotHeld` we
/// do not know.
pub(crate) async fn release_retrying(
    backend: &dyn Backend,
    part: &Part,
    until: Instant,
    per_try: Duration,
) -> Result<bool> {
    let start = Instant::now();
    let faulted = std::sync::atomic::AtomicBool::new(false);
    let released = crate::call::retrying(start, until, per_try, |deadline| {
        let faulted = &faulted;
        async move {
            let tried = backend.release(part, deadline).await;
            if matches!(&tried, Err(err) if crate::call::may_have_acted(err)) {
                faulted.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            tried
        }
    })
    .await;
    let faulted = faulted.into_inner();
    match released {
        // No definite answer came for the try that may have acted, and a
        // later try found the key gone while the lease was still valid:
        // that try's delete, or the key lost (a restart, an eviction, a
        // delete). We cannot tell which, and claim neither.
        Ok(false) if faulted && Instant::now() < until => Err(Error::Timeout {
            service: backend.service(),
            op: "release",
            after: start.elapsed(),
        }),
        // The same once the lease ran out: whether our try deleted the key
        // or its TTL ended it, nothing is left to give back and the lease
        // is over, as below.
        Ok(false) if faulted => {
            tracing::debug!(target: TARGET,
                key = part.key,
                "release unconfirmed until the lease ran out"
            );
            Err(Error::LeaseLost {
                key: part.key.clone(),
                service: backend.service(),
                cause: LostCause::Unreachable,
            })
        }
        // Redis stayed out of reach until the lease ran out, or a try's
        // outcome stayed unknown to the end (an etcd delete whose answer
        // was lost and which no later try could settle): there is nothing
        // left to give back (its TTL has ended it, on the same
        // conservative clock as `remaining`), and the lease is lost; the
        // fault is not the caller's news. Never a success we cannot know.
        Err(err)
            if (crate::call::fault_may_pass(&err) || crate::call::may_have_acted(&err))
                && Instant::now() >= until =>
        {
            tracing::debug!(target: TARGET, key = part.key, error = %err, "release unanswered until the lease ran out");
            Err(Error::LeaseLost {
                key: part.key.clone(),
                service: backend.service(),
                cause: LostCause::Unreachable,
            })
        }
        released => released,
    }
}

/// Reports how giving back the lock `key` went: one event (a WARN when the
/// lease was found gone: it expired or changed hands while held) and the
/// release metric. `dropped`: the lease was dropped without release.
pub(super) fn log_release(key: &str, released: &Result<bool>, dropped: bool) {
    let outcome = match released {
        Ok(true) => "released",
        Ok(false) => "not_held",
        Err(_) => "error",
    };
    metrics::release(outcome, dropped);
    match (released, dropped) {
        (Ok(true), false) => tracing::debug!(target: TARGET, key, outcome, "released"),
        (Ok(true), true) => tracing::debug!(target: TARGET, key, outcome, "released dropped lease"),
        (Ok(false), false) => tracing::warn!(target: TARGET,
            key,
            outcome,
            "release found the lease gone: it expired or changed hands while held"
        ),
        (Ok(false), true) => {
            tracing::debug!(target: TARGET, key, outcome, "dropped lease had already expired")
        }
        (Err(err), false) => {
            tracing::debug!(target: TARGET, key, outcome, error = %err, "release failed")
        }
        (Err(Error::LeaseLost { .. }), true) => tracing::debug!(target: TARGET,
            key,
            outcome,
            "dropped lease ran out before redis answered; its ttl ended it"
        ),
        (Err(err), true) => {
            tracing::warn!(target: TARGET, key, outcome, error = %err, "could not release dropped lease; the ttl will end it")
        }
    }
}

/// The runtime to spawn a dropped lease's release on; `None` (logged) when
/// there is none, and the TTL ends the lease.
pub(crate) fn release_runtime(key: &str) -> Option<tokio::runtime::Handle> {
    let runtime = tokio::runtime::Handle::try_current().ok();
    if runtime.is_none() {
        tracing::debug!(target: TARGET,
            key,
            "no tokio runtime to release a dropped lease; the ttl will end it"
        );
    }
    runtime
}

/// Spawns `release` (the Redis part of giving back a dropped lease's lock
/// `key`) on `runtime` and logs how it went; never blocks.
pub(crate) fn spawn_dropped_release<F>(runtime: &tokio::runtime::Handle, key: String, release: F)
where
    F: Future<Output = Result<bool>> + Send + 'static,
{
    runtime.spawn(async move {
        log_release(&key, &release.await, true);
    });
}

/// [`refresh_all`], with a fault that may pass retried from `start` until
/// `until` (at least one command timeout): the one retry of a caller's
/// refresh and the watchdog's. Each try is token-checked, so repeating one
/// that may have landed is harmless.
pub(super) async fn refresh_retrying(
    backend: &dyn Backend,
    parts: &[Part],
    ttl: Duration,
    start: Instant,
    until: Instant,
) -> Result<Option<String>> {
    crate::call::retrying(start, until, backend.command_timeout(), |deadline| {
        refresh_all(backend, parts, ttl, deadline)
    })
    .await
}

/// Refreshes every part; `Some(key)` names the first whose key no longer
/// held our token (the rest are left as they are).
async fn refresh_all(
    backend: &dyn Backend,
    parts: &[Part],
    ttl: Duration,
    deadline: Instant,
) -> Result<Option<String>> {
    for part in parts {
        if !backend.refresh(part, ttl, deadline).await? {
            return Ok(Some(part.key.clone()));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::fencing::FencingToken;
    use crate::lease::Reply;
    use crate::token::LeaseToken;

    /// A backend whose first release deletes the key but whose answer is
    /// lost (`lost()`, after `lost_for`), and whose later releases find
    /// the key gone.
    struct LostAnswer {
        lost_for: Duration,
        lost: fn() -> Error,
        tries: std::sync::atomic::AtomicU32,
    }

    /// A connection reset with the request out.
    fn reset() -> Error {
        Error::Unreachable {
            op: "release",
            source: redis::RedisError::from(std::io::Error::from(
                std::io::ErrorKind::ConnectionReset,
            ))
            .into(),
        }
    }

    impl Backend for LostAnswer {
        fn service(&self) -> crate::service::Service {
            crate::service::Service::REDIS
        }
        fn command_timeout(&self) -> Duration {
            Duration::from_millis(100)
        }
        fn refresh<'a>(&'a self, _: &'a Part, _: Duration, _: Instant) -> Reply<'a, bool> {
            Box::pin(async { Ok(false) })
        }
        fn release<'a>(&'a self, _: &'a Part, _: Instant) -> Reply<'a, bool> {
            let first = self.tries.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
            let (lost_for, lost) = (self.lost_for, self.lost);
            Box::pin(async move {
                if first {
                    tokio::time::sleep(lost_for).await;
                    return Err(lost());
                }
                Ok(false)
            })
        }
        fn raise_fence<'a>(&'a self, _: &'a str, _: FencingToken, _: Instant) -> Reply<'a, ()> {
            Box::pin(async { Ok(()) })
        }
        fn announce<'a>(
            &'a self,
            _: &'a Part,
            _: &'a str,
            _: &'a str,
            _: Instant,
        ) -> Reply<'a, bool> {
            Box::pin(async { Ok(false) })
        }
        fn release_dropped(self: Arc<Self>, _: Part, _: Instant) {}
    }

    fn part() -> Part {
        Part {
            key: "k".to_owned(),
            token: LeaseToken::generate().unwrap_or_else(|_| unreachable!()),
            fence_key: None,
            fence: None,
        }
    }

    /// Releases through a [`LostAnswer`] whose first answer is `lost()`
    /// after `lost_for`, for a lease valid `lease_for` more: the outcome
    /// and the number of tries.
    async fn release_lost(
        lost_for: Duration,
        lost: fn() -> Error,
        lease_for: Duration,
    ) -> (Result<bool>, u32) {
        let backend = LostAnswer {
            lost_for,
            lost,
            tries: Default::default(),
        };
        let until = Instant::now() + lease_for;
        let outcome = release_retrying(&backend, &part(), until, backend.command_timeout()).await;
        (outcome, backend.tries.into_inner())
    }

    /// The first try's connection broke with the request out (it may have
    /// deleted the key), the retry finds the key gone: before the lease ran
    /// out that is a timeout (the key may have been lost), after it the
    /// lease is over (lost, unreachable). Never `Ok` and never `NotHeld`.
    #[tokio::test(start_paused = true)]
    async fn a_release_that_may_have_acted_never_claims_what_it_cannot_know() {
        for (lost_for, lease_for, expired) in [
            (Duration::from_millis(10), Duration::from_secs(5), false),
            (Duration::from_millis(60), Duration::from_millis(50), true),
        ] {
            let (outcome, tries) = release_lost(lost_for, reset, lease_for).await;
            match (&outcome, expired) {
                (Err(Error::Timeout { op: "release", .. }), false)
                | (
                    Err(Error::LeaseLost {
                        cause: LostCause::Unreachable,
                        ..
                    }),
                    true,
                ) => {}
                _ => panic!("lease for {lease_for:?}: {outcome:?}"),
            }
            assert_eq!(tries, 2);
        }
    }
}
