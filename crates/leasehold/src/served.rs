//! Every [`LockService`] as a way of taking a lease: the one retry loop
//! drives its steps ([`rounds::drive`]), the lease core talks to it as a
//! [`Backend`], and it is a [`Lessor`] (so an
//! [`Election`](crate::Election) takes it). Nothing here is per service:
//! a service is its [`LockService`] implementation alone.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Claim, Held, LockService, Reply, StepKind, Wake};
use crate::budget::Budget;
use crate::error::Result;
use crate::fencing::{FencingToken, LockKeys, Target};
use crate::lease::{
    Backend, Lease, Part, release_retrying, release_runtime, spawn_dropped_release,
};
use crate::lessor::{Lessor, sealed::Sealed};
use crate::node::Attempt;
use crate::options::{AcquireOptions, Supports};
use crate::rounds::{self, Attempts};
use crate::service::Service;
use crate::token::LeaseToken;
use crate::watchdog::Margin;
use crate::way::{self, Way};

/// A service as the lease core sees it.
struct Served<S>(S);

/// Gives back `held` (a lock of `service`'s, valid until `until`) in the
/// background: its release, retried while faults may pass until `until`
/// (when the TTL frees it anyway); never blocks. With no runtime, the TTL
/// ends it.
pub(crate) fn spawn_release<S: LockService>(service: S, held: Held, until: Instant) {
    let Some(runtime) = release_runtime(&held.key) else {
        return;
    };
    let key = held.key.clone();
    spawn_dropped_release(&runtime, key, async move {
        let per_try = service.command_timeout();
        release_retrying(&Served(service), &held, until, per_try).await
    });
}

impl<S: LockService> Backend for Served<S> {
    fn service(&self) -> Service {
        self.0.service()
    }

    fn command_timeout(&self) -> Duration {
        self.0.command_timeout()
    }

    fn margin(&self) -> Margin {
        S::margin
    }

    fn refresh<'a>(&'a self, part: &'a Part, ttl: Duration, deadline: Instant) -> Reply<'a, bool> {
        self.0.refresh(part, ttl, deadline)
    }

    fn release<'a>(&'a self, part: &'a Part, deadline: Instant) -> Reply<'a, bool> {
        self.0.release(part, deadline)
    }

    fn raise_fence<'a>(
        &'a self,
        fence_key: &'a str,
        at_least: FencingToken,
        deadline: Instant,
    ) -> Reply<'a, ()> {
        self.0.raise_fence(fence_key, at_least, deadline)
    }

    fn announce<'a>(
        &'a self,
        part: &'a Part,
        record_key: &'a str,
        body: &'a str,
        deadline: Instant,
    ) -> Reply<'a, bool> {
        self.0.announce(part, record_key, body, deadline)
    }

    fn watch_held(&self, part: &Part) -> Option<Wake> {
        self.0.watch_held(part)
    }

    fn release_dropped(self: Arc<Self>, part: Part, until: Instant) {
        spawn_release(self.0.clone(), part, until);
    }
}

/// A service as a way of taking a lease, for one call.
struct Stepped<'s, S>(&'s S);

impl<S: LockService> Way for Stepped<'_, S> {
    fn supports(&self) -> Supports {
        Supports {
            wait_replicas: self.0.offers_replicas(),
        }
    }

    fn mode(&self) -> &'static str {
        self.0.mode()
    }

    fn check_ttl(&self, ttl: Duration) -> Result<()> {
        self.0.check_ttl(ttl)
    }

    fn command_timeout(&self) -> Duration {
        self.0.command_timeout()
    }

    async fn confirm_replicas(
        &self,
        lease: Lease,
        opts: &AcquireOptions,
        deadline: Instant,
    ) -> Result<Lease> {
        let service = self.0;
        crate::replicas::confirm(lease, opts, deadline, |key, replicas, timeout| async move {
            service.wait_replicas(&key, replicas, timeout).await
        })
        .await
    }

    async fn take(
        &self,
        target: Target,
        ttl: Duration,
        opts: &AcquireOptions,
        budget: Budget,
    ) -> Result<Lease> {
        let service = self.0;
        let claim = Claim {
            key: target.lock,
            token: LeaseToken::generate()?,
            fence_key: target.fence.map(|fence| service.fence_key_of(&fence)),
            ttl,
        };
        let steps = Steps {
            service,
            claim: &claim,
            entry: Some(S::Entry::default()),
            wake: None,
        };
        let step_timeout = service.step_timeout();
        let (fence, sent_at) = rounds::drive(&claim.key, opts, budget, step_timeout, steps).await?;
        let held = Held {
            key: claim.key,
            token: claim.token,
            fence_key: claim.fence_key,
            fence,
        };
        Ok(Lease::new(
            Arc::new(Served(service.clone())),
            held,
            ttl,
            sent_at,
        ))
    }
}

/// One acquire of a service, as the retry loop drives it: its claim, its
/// entry (the service's state across steps) and the last step's wake-up.
struct Steps<'s, S: LockService> {
    service: &'s S,
    claim: &'s Claim,
    /// Always `Some` until [`abandon`](Attempts::abandon) takes it.
    entry: Option<S::Entry>,
    wake: Option<Wake>,
}

impl<S: LockService> Steps<'_, S> {
    fn entry(&mut self) -> &mut S::Entry {
        self.entry.get_or_insert_with(S::Entry::default)
    }
}

impl<S: LockService> Attempts for Steps<'_, S> {
    type Won = Option<FencingToken>;

    async fn attempt(&mut self, deadline: Instant) -> Result<Attempt<Option<FencingToken>>> {
        let (service, claim) = (self.service, self.claim);
        let step = service.step(claim, self.entry(), deadline).await?;
        Ok(match step.kind {
            StepKind::Won(fence) => Attempt::Won(fence),
            StepKind::Busy(wake) => {
                self.wake = wake;
                Attempt::Busy
            }
        })
    }

    async fn undo(&mut self, deadline: Instant) -> Result<()> {
        let (service, claim) = (self.service, self.claim);
        service.undo(claim, self.entry(), deadline).await
    }

    fn abandon(&mut self, maybe_taken: bool) {
        let entry = self.entry.take().unwrap_or_default();
        self.service.abandon(self.claim.clone(), entry, maybe_taken);
    }

    /// A busy step's wake-up says when to look again (the deadline still
    /// bounds the wait); without one, the strategy's wait.
    async fn pause(&mut self, until: Instant, deadline: Instant) {
        match self.wake.take() {
            None => tokio::time::sleep_until(until).await,
            Some(wake) => {
                tokio::select! {
                    () = tokio::time::sleep_until(deadline) => {}
                    () = wake => {}
                }
            }
        }
    }

    async fn leave(&mut self, deadline: Instant) {
        let (service, claim) = (self.service, self.claim);
        if let Err(err) = service.leave(claim, self.entry(), deadline).await {
            tracing::debug!(key = claim.key(), error = %err, "could not leave the queue; abandoning");
        }
    }
}

impl<S: LockService> Sealed for S {
    fn service(&self) -> Service {
        LockService::service(self)
    }

    fn leader_record<'a>(
        &'a self,
        key: &'a str,
        record_key: &'a str,
    ) -> Reply<'a, Option<(String, i64)>> {
        LockService::leader_record(self, key, record_key)
    }
}

/// Every service is a [`Lessor`]: its four calls are the ways' shared
/// routines, the one retry loop driving the service's steps.
impl<S: LockService> Lessor for S {
    async fn acquire(&self, keys: impl LockKeys, ttl: Duration) -> Result<Lease> {
        way::acquire_with(&Stepped(self), keys, ttl, &AcquireOptions::default()).await
    }

    async fn acquire_with(
        &self,
        keys: impl LockKeys,
        ttl: Duration,
        opts: &AcquireOptions,
    ) -> Result<Lease> {
        way::acquire_with(&Stepped(self), keys, ttl, opts).await
    }

    async fn acquire_all<K: LockKeys>(
        &self,
        keys: impl IntoIterator<Item = K> + Send,
        ttl: Duration,
        opts: &AcquireOptions,
    ) -> Result<Lease> {
        way::acquire_all_of(&Stepped(self), keys, ttl, opts).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    use tokio::time::Instant;

    use crate::backend::{Claim, Held, LockService, Reply, Step};
    use crate::{AcquireOptions, Lessor, RetryStrategy, Service};

    /// A queued service: busy until `free_at`, and says so with a wake-up
    /// at that moment.
    #[derive(Clone)]
    struct Queued {
        free_at: Instant,
        steps: Arc<AtomicU32>,
        left: Arc<AtomicU32>,
    }

    impl LockService for Queued {
        type Entry = ();

        fn service(&self) -> Service {
            Service::named("queued")
        }

        fn command_timeout(&self) -> Duration {
            Duration::from_secs(1)
        }

        fn step<'a>(&'a self, _: &'a Claim, (): &'a mut (), _: Instant) -> Reply<'a, Step> {
            self.steps.fetch_add(1, Ordering::SeqCst);
            let free_at = self.free_at;
            Box::pin(async move {
                Ok(if Instant::now() >= free_at {
                    Step::won(None)
                } else {
                    Step::busy_until(tokio::time::sleep_until(free_at))
                })
            })
        }

        fn undo<'a>(&'a self, _: &'a Claim, (): &'a mut (), _: Instant) -> Reply<'a, ()> {
            Box::pin(async { Ok(()) })
        }

        fn leave<'a>(&'a self, _: &'a Claim, (): &'a mut (), _: Instant) -> Reply<'a, ()> {
            self.left.fetch_add(1, Ordering::SeqCst);
            Box::pin(async { Ok(()) })
        }

        fn refresh<'a>(&'a self, _: &'a Held, _: Duration, _: Instant) -> Reply<'a, bool> {
            Box::pin(async { Ok(true) })
        }

        fn release<'a>(&'a self, _: &'a Held, _: Instant) -> Reply<'a, bool> {
            Box::pin(async { Ok(true) })
        }
    }

    /// A busy step with a wake-up is stepped again at the wake-up, not at
    /// the strategy's (much shorter) waits: two steps, where polling every
    /// millisecond made thousands.
    #[tokio::test(start_paused = true)]
    async fn a_queued_service_is_stepped_again_at_its_wake_up_alone() -> crate::Result<()> {
        let service = Queued {
            free_at: Instant::now() + Duration::from_secs(5),
            steps: Arc::default(),
            left: Arc::default(),
        };
        let opts = AcquireOptions::new()
            .retry(RetryStrategy::constant(Duration::from_millis(1)))
            .wait(Duration::from_secs(10));
        let lease = service
            .acquire_with("k", Duration::from_secs(1), &opts)
            .await?;
        lease.release().await?;
        assert_eq!(service.steps.load(Ordering::SeqCst), 2);
        Ok(())
    }

    /// An acquire that gives up leaves its place (the service's `leave`)
    /// before the caller hears it, once; one that wins does not.
    #[tokio::test(start_paused = true)]
    async fn an_acquire_that_gives_up_leaves_before_it_returns() -> crate::Result<()> {
        let service = Queued {
            free_at: Instant::now() + Duration::from_secs(5),
            steps: Arc::default(),
            left: Arc::default(),
        };
        let opts = AcquireOptions::new().wait(Duration::from_secs(1));
        let gave_up = service
            .acquire_with("k", Duration::from_secs(1), &opts)
            .await;
        assert!(
            matches!(gave_up, Err(crate::Error::NotAcquired { .. })),
            "{gave_up:?}"
        );
        assert_eq!(service.left.load(Ordering::SeqCst), 1);
        let opts = AcquireOptions::new().wait(Duration::from_secs(10));
        let lease = service
            .acquire_with("k", Duration::from_secs(1), &opts)
            .await?;
        lease.release().await?;
        assert_eq!(service.left.load(Ordering::SeqCst), 1);
        Ok(())
    }
}
