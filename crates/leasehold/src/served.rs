//! A service as the lease core sees it: the lease core refreshes,
//! releases, fences and announces through one small backend interface,
//! and every [`LockService`] is that interface here, once. So a lease
//! taken from any service (by the acquire path, module `acquire`) is the
//! same [`Lease`], and a dropped one is given back the same way. Nothing
//! here is per service: a service is its [`LockService`] implementation
//! alone.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Held, LockService, Reply, Wake};
use crate::fencing::FencingToken;
use crate::lease::{
    Backend, Lease, Part, release_retrying, release_runtime, spawn_dropped_release,
};
use crate::service::Service;
use crate::watchdog::Margin;

/// A service as the lease core sees it.
struct Served<S>(S);

/// The lease `held` makes: a lock of `service`'s for `ttl`, counted from
/// `sent_at` (the send time of the request that won it).
pub(crate) fn lease<S: LockService>(
    service: &S,
    held: Held,
    ttl: Duration,
    sent_at: Instant,
) -> Lease {
    Lease::new(Arc::new(Served(service.clone())), held, ttl, sent_at)
}

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
