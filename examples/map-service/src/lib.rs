//! A lock service written outside leasehold, as a backend crate would be:
//! [`MapService`] implements [`leasehold::LockService`] and nothing else,
//! and so is a [`leasehold::Lessor`] with the same `Lease`, watchdog,
//! fencing tokens, `acquire_all` and `with_lock` as the services leasehold
//! ships. Its tests run leasehold's conformance suite.
//!
//! The "service" is a table shared by every clone, behind an async mutex,
//! standing in for a remote store: each call below would be one request
//! to it. What a real backend adds is its client: turn its errors into
//! [`Error::service`] (saying whether the request may have acted), and
//! bound every request by the deadline it is given.
//!
//! It offers no fence heal (a counter cannot be raised here) and no leader
//! record: the trait's defaults refuse those (an `Election` over it still
//! elects, but `leader` and `observe` return `Error::NotOffered`).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> leasehold::Result<()> {
//! use std::time::Duration;
//! use leasehold::{FencedKeys, Lessor};
//! use map_service::MapService;
//!
//! let service = MapService::new(Duration::from_secs(1));
//! let keys = FencedKeys::for_resource("wallet:7")?;
//! let lease = service.acquire(&keys, Duration::from_secs(5)).await?;
//! assert!(lease.fence().is_some());
//! lease.release().await?;
//! # Ok(())
//! # }
//! ```

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use leasehold::backend::{Claim, Held, Reply, ServiceFault, Step};
use leasehold::{Error, FencingToken, LeaseToken, LockService, Service};
use tokio::sync::{Mutex, watch};
use tokio::time::Instant;

/// How its errors name it.
const SERVICE: Service = Service::named("map");

/// A lock service over a shared table. Clones share it.
#[derive(Clone, Debug)]
pub struct MapService {
    table: Arc<Mutex<Table>>,
    /// `true` while the service is down (for tests).
    down: Arc<watch::Sender<bool>>,
    command_timeout: Duration,
}

#[derive(Debug, Default)]
struct Table {
    /// Lock key to its holder's token and expiry.
    locks: HashMap<String, (LeaseToken, Instant)>,
    /// Fence key to the last token issued.
    fences: HashMap<String, u64>,
}

impl Table {
    fn holds(&self, key: &str, token: &LeaseToken, now: Instant) -> bool {
        self.locks
            .get(key)
            .is_some_and(|(holder, until)| holder == token && *until > now)
    }
}

impl MapService {
    /// An empty table whose requests give up after `command_timeout`.
    pub fn new(command_timeout: Duration) -> MapService {
        MapService {
            table: Arc::default(),
            down: Arc::new(watch::Sender::new(false)),
            command_timeout,
        }
    }

    /// Deletes the lock `key`, as an operator would.
    pub async fn delete(&self, key: &str) {
        self.table.lock().await.locks.remove(key);
    }

    /// Forgets the fence counter `fence_key`.
    pub async fn forget_fence(&self, fence_key: &str) {
        self.table.lock().await.fences.remove(fence_key);
    }

    /// Takes the service down (`true`) or back up (`false`): while down,
    /// every request waits until its deadline and fails with an unknown
    /// outcome, as a request to an unresponsive server does.
    pub fn set_down(&self, down: bool) {
        self.down.send_replace(down);
    }

    /// One request: `op` on the table, unless the service is down until
    /// `deadline`.
    async fn request<T>(
        &self,
        op: &'static str,
        deadline: Instant,
        f: impl FnOnce(&mut Table, Instant) -> T,
    ) -> leasehold::Result<T> {
        let mut down = self.down.subscribe();
        let up = down.wait_for(|down| !*down);
        if tokio::time::timeout_at(deadline, up).await.is_err() {
            // The request may have reached a server that then stalled:
            // its outcome is unknown.
            return Err(Error::service(
                SERVICE,
                op,
                ServiceFault::Unknown,
                "no answer before the deadline",
            ));
        }
        let mut table = self.table.lock().await;
        Ok(f(&mut table, Instant::now()))
    }
}

impl LockService for MapService {
    /// Each step asks afresh: no queue to keep a place in.
    type Entry = ();

    fn service(&self) -> Service {
        SERVICE
    }

    fn command_timeout(&self) -> Duration {
        self.command_timeout
    }

    fn step<'a>(&'a self, claim: &'a Claim, _: &'a mut (), deadline: Instant) -> Reply<'a, Step> {
        Box::pin(self.request("acquire", deadline, |table, now| {
            let free = table
                .locks
                .get(claim.key())
                .is_none_or(|(_, until)| *until <= now);
            if !free {
                return Step::busy();
            }
            let until = now + claim.ttl();
            table
                .locks
                .insert(claim.key().to_owned(), (claim.token().clone(), until));
            let fence = claim.fence_key().map(|fence_key| {
                let counter = table.fences.entry(fence_key.to_owned()).or_insert(0);
                *counter += 1;
                FencingToken::new(*counter)
            });
            Step::won(fence)
        }))
    }

    fn undo<'a>(&'a self, claim: &'a Claim, _: &'a mut (), deadline: Instant) -> Reply<'a, ()> {
        Box::pin(self.request("acquire", deadline, |table, now| {
            if table.holds(claim.key(), claim.token(), now) {
                table.locks.remove(claim.key());
            }
        }))
    }

    fn refresh<'a>(&'a self, held: &'a Held, ttl: Duration, deadline: Instant) -> Reply<'a, bool> {
        Box::pin(self.request("refresh", deadline, move |table, now| {
            if !table.holds(held.key(), held.token(), now) {
                return false;
            }
            table
                .locks
                .insert(held.key().to_owned(), (held.token().clone(), now + ttl));
            true
        }))
    }

    fn release<'a>(&'a self, held: &'a Held, deadline: Instant) -> Reply<'a, bool> {
        Box::pin(self.request("release", deadline, |table, now| {
            let ours = table.holds(held.key(), held.token(), now);
            if ours {
                table.locks.remove(held.key());
            }
            ours
        }))
    }
}
