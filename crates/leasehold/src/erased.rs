//! One type for every way of taking a lease, chosen at run time:
//! [`DynLessor`].
//!
//! [`Lessor`] is the seam code is generic over; but a program that picks
//! the way from its configuration, or keeps lessors of several ways in one
//! list, needs one type for all of them. A [`DynLessor`] is any lessor
//! behind a pointer, its futures boxed: one allocation per call, the same
//! leases with the same guarantees (it only forwards), and itself a
//! [`Lessor`], so an [`Election`](crate::Election) or generic code takes
//! it as it takes the way inside: one of the crate's ways, or a lock
//! service of yours ([`LockService`](crate::LockService)).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::error::Result;
use crate::fencing::LockKeys;
use crate::lease::Lease;
use crate::lessor::{Lessor, sealed::Sealed};
use crate::options::AcquireOptions;

/// A boxed future of a forwarded call.
type Boxed<'a, T> = Pin<Box<dyn Future<Output = Result<T>> + Send + 'a>>;

/// Any [`Lessor`] ([`Locker`](crate::Locker),
/// [`HandoffLocker`](crate::HandoffLocker) or [`Quorum`](crate::Quorum)
/// over any connection, `MemoryLocker` (feature `memory`), or a lessor of
/// another crate: `leasehold-etcd`'s `EtcdLocker`, `leasehold-pg`'s
/// `PgLocker`, `leasehold-zookeeper`'s `ZkLocker`, your own
/// [`LockService`](crate::LockService)) as one type, so the way can be
/// chosen at run time.
/// Cheap to clone (it shares the lessor). Its calls are the lessor's, with
/// the same errors and cancel safety.
///
/// ```no_run
/// # #[cfg(feature = "handoff")]
/// # async fn demo(redis: leasehold::redis::Client) -> leasehold::Result<()> {
/// use std::time::Duration;
/// use leasehold::{DynLessor, FencedKeys, HandoffLocker, Lessor, Locker};
///
/// async fn job(lock: &impl Lessor) -> leasehold::Result<()> {
///     let keys = FencedKeys::for_resource("report")?;
///     lock.acquire(&keys, Duration::from_secs(5)).await?.release().await
/// }
///
/// let queued = std::env::var_os("QUEUED").is_some();
/// let lock = if queued {
///     DynLessor::new(HandoffLocker::connect(&redis).await?)
/// } else {
///     DynLessor::new(Locker::connect(&redis).await?)
/// };
/// job(&lock).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct DynLessor {
    lessor: Arc<dyn Erased>,
}

impl fmt::Debug for DynLessor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DynLessor")
            .field("way", &self.lessor.way())
            .finish()
    }
}

impl DynLessor {
    /// Erases `lessor`'s type.
    pub fn new(lessor: impl Lessor) -> DynLessor {
        DynLessor {
            lessor: Arc::new(lessor),
        }
    }

    /// [`Lessor::acquire`] of the lessor inside.
    ///
    /// # Errors
    /// As the lessor's.
    ///
    /// # Cancel safety
    /// As the lessor's: cancel safe.
    pub async fn acquire(&self, keys: impl LockKeys, ttl: Duration) -> Result<Lease> {
        self.lessor.acquire(&keys, ttl).await
    }

    /// [`Lessor::acquire_with`] of the lessor inside.
    ///
    /// # Errors
    /// As the lessor's.
    ///
    /// # Cancel safety
    /// As the lessor's: cancel safe.
    pub async fn acquire_with(
        &self,
        keys: impl LockKeys,
        ttl: Duration,
        opts: &AcquireOptions,
    ) -> Result<Lease> {
        self.lessor.acquire_with(&keys, ttl, opts).await
    }

    /// [`Lessor::acquire_all`] of the lessor inside.
    ///
    /// # Errors
    /// As the lessor's.
    ///
    /// # Cancel safety
    /// As the lessor's: cancel safe.
    pub async fn acquire_all<K: LockKeys>(
        &self,
        keys: impl IntoIterator<Item = K>,
        ttl: Duration,
        opts: &AcquireOptions,
    ) -> Result<Lease> {
        let keys: Vec<K> = keys.into_iter().collect();
        let keys = keys.iter().map(|k| k as &dyn LockKeys).collect();
        self.lessor.acquire_all(keys, ttl, opts).await
    }
}

/// The lessor behind a [`DynLessor`]: [`Lessor`] and its seal, object safe.
trait Erased: Send + Sync {
    fn way(&self) -> &'static str;
    fn acquire<'a>(&'a self, keys: &'a dyn LockKeys, ttl: Duration) -> Boxed<'a, Lease>;
    fn acquire_with<'a>(
        &'a self,
        keys: &'a dyn LockKeys,
        ttl: Duration,
        opts: &'a AcquireOptions,
    ) -> Boxed<'a, Lease>;
    fn acquire_all<'a>(
        &'a self,
        keys: Vec<&'a dyn LockKeys>,
        ttl: Duration,
        opts: &'a AcquireOptions,
    ) -> Boxed<'a, Lease>;
    fn leader_record<'a>(
        &'a self,
        key: &'a str,
        record_key: &'a str,
    ) -> Boxed<'a, Option<(String, i64)>>;
    fn hands_over(&self) -> bool;
    fn service(&self) -> crate::service::Service;
}

impl<L: Lessor> Erased for L {
    fn way(&self) -> &'static str {
        std::any::type_name::<L>()
    }
    fn acquire<'a>(&'a self, keys: &'a dyn LockKeys, ttl: Duration) -> Boxed<'a, Lease> {
        Box::pin(Lessor::acquire(self, keys, ttl))
    }
    fn acquire_with<'a>(
        &'a self,
        keys: &'a dyn LockKeys,
        ttl: Duration,
        opts: &'a AcquireOptions,
    ) -> Boxed<'a, Lease> {
        Box::pin(Lessor::acquire_with(self, keys, ttl, opts))
    }
    fn acquire_all<'a>(
        &'a self,
        keys: Vec<&'a dyn LockKeys>,
        ttl: Duration,
        opts: &'a AcquireOptions,
    ) -> Boxed<'a, Lease> {
        Box::pin(Lessor::acquire_all(self, keys, ttl, opts))
    }
    fn leader_record<'a>(
        &'a self,
        key: &'a str,
        record_key: &'a str,
    ) -> Boxed<'a, Option<(String, i64)>> {
        Sealed::leader_record(self, key, record_key)
    }
    fn hands_over(&self) -> bool {
        Sealed::hands_over(self)
    }
    fn service(&self) -> crate::service::Service {
        Sealed::service(self)
    }
}

impl Sealed for DynLessor {
    fn service(&self) -> crate::service::Service {
        self.lessor.service()
    }

    fn leader_record<'a>(
        &'a self,
        key: &'a str,
        record_key: &'a str,
    ) -> Boxed<'a, Option<(String, i64)>> {
        self.lessor.leader_record(key, record_key)
    }

    fn hands_over(&self) -> bool {
        self.lessor.hands_over()
    }
}

/// The same calls as the inherent methods.
impl Lessor for DynLessor {
    fn acquire(
        &self,
        keys: impl LockKeys,
        ttl: Duration,
    ) -> impl Future<Output = Result<Lease>> + Send {
        DynLessor::acquire(self, keys, ttl)
    }

    fn acquire_with(
        &self,
        keys: impl LockKeys,
        ttl: Duration,
        opts: &AcquireOptions,
    ) -> impl Future<Output = Result<Lease>> + Send {
        DynLessor::acquire_with(self, keys, ttl, opts)
    }

    fn acquire_all<K: LockKeys>(
        &self,
        keys: impl IntoIterator<Item = K> + Send,
        ttl: Duration,
        opts: &AcquireOptions,
    ) -> impl Future<Output = Result<Lease>> + Send {
        DynLessor::acquire_all(self, keys, ttl, opts)
    }
}

#[cfg(all(test, feature = "handoff"))]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{Election, FencedKeys, HandoffLocker, Locker};

    type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

    /// Each way behind a `DynLessor` takes and gives back leases as
    /// itself, tells an election what it would (the record, whether a
    /// release hands over), and an election runs on it.
    #[tokio::test]
    async fn a_dyn_lessor_is_its_way() -> TestResult {
        let server = leasehold_testkit::RedisServer::start()?;
        let client = redis::Client::open(server.url())?;
        let ways = [
            (DynLessor::new(Locker::connect(&client).await?), false),
            (DynLessor::new(HandoffLocker::connect(&client).await?), true),
        ];
        let ttl = Duration::from_secs(5);
        let opts = AcquireOptions::new().wait(Duration::from_secs(2));
        for (i, (lock, hands_over)) in ways.iter().enumerate() {
            assert_eq!(Sealed::hands_over(lock), *hands_over);
            let keys = FencedKeys::for_resource(&format!("dyn:{i}"))?;
            let lease = lock.acquire(&keys, ttl).await?;
            let first = lease.fence().ok_or("a fenced lease without a fence")?;
            lease.release().await?;
            let done =
                Lessor::with_lock(lock, &keys, ttl, &opts, async |lease| lease.fence()).await?;
            assert!(done.output.is_some_and(|fence| fence > first));
            done.release?;
            let plain = [format!("lock:{{dyn:{i}}}:a"), format!("lock:{{dyn:{i}}}:b")];
            lock.acquire_all(&plain, ttl, &opts)
                .await?
                .release()
                .await?;

            let election = Election::builder(lock.clone(), format!("dyn-{i}"))
                .candidate("c1")
                .ttl(ttl)
                .build()?;
            let term = election.campaign().await?;
            let leader = election.leader().await?.ok_or("no leader recorded")?;
            assert_eq!(
                (leader.candidate.as_str(), leader.fence),
                ("c1", term.fence())
            );
            term.resign().await?;
        }
        Ok(())
    }
}
