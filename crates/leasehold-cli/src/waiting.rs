//! How a caller waits for a busy lock, and what the lock was used for: the
//! pieces `backoff` and `bench contention` share.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use hdrhistogram::Histogram;
use leasehold::{
    AcquireOptions, DynLessor, HandoffClient, HandoffLocker, HandoffStyle, Lease, Lessor, Locker,
    LockerStats, RedisConnection, RetryStrategy,
};
use tokio::time::Instant;

use crate::env::Env;

/// One way of waiting for the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Polling with this strategy.
    Poll(&'static str, RetryStrategy),
    /// Hand-off lockers set up like this.
    Handoff(&'static str, Handoff),
}

/// How the hand-off lockers of a run are set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Handoff {
    pub(crate) style: HandoffStyle,
    /// [`leasehold::HandoffLockerBuilder::relay_limit`]; 0 is off.
    pub(crate) relay_limit: u32,
    /// This many lockers (as if in separate processes: a pub/sub channel
    /// and a local queue each), callers spread over them in turn.
    pub(crate) lockers: usize,
}

impl Handoff {
    /// What `leasehold` does by default: grant, relay on, one locker.
    pub(crate) const DEFAULT: Handoff = Handoff {
        style: HandoffStyle::Grant,
        relay_limit: leasehold::DEFAULT_RELAY_LIMIT,
        lockers: 1,
    };
}

impl Mode {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Mode::Poll(name, _) | Mode::Handoff(name, _) => name,
        }
    }
}

/// A connected way of waiting: the lessors of one way (one for polling;
/// one or more hand-off lockers, each caller always using the same one, as
/// a task of one process would), over one [`Locker`] whose stats count
/// them all; or one lessor of another way ([`Waiter::of`]), which waits as
/// it is built to and counts nothing.
#[derive(Clone)]
pub(crate) struct Waiter {
    /// The one locker's [`Locker::stats`], if the way has one.
    stats: Option<Arc<dyn Fn() -> LockerStats + Send + Sync>>,
    lessors: Arc<[DynLessor]>,
    /// Polling's strategy, set on the options of every acquire; `None`
    /// keeps the options' own (a hand-off waiter sleeps until it is handed
    /// the lock).
    retry: Option<RetryStrategy>,
}

impl Waiter {
    /// Connects `mode` with a fresh locker on `env`'s connection, so its
    /// stats count this run only.
    pub(crate) async fn connect(env: &Env, mode: Mode) -> anyhow::Result<Waiter> {
        Waiter::connect_to(
            env.redis.clone(),
            &HandoffClient::from(env.client.clone()),
            env.locker.command_timeout(),
            mode,
        )
        .await
    }

    /// Connects `mode` with a fresh locker over `conn` (one server's, or a
    /// cluster's), each hand-off locker subscribing through `subscriber`,
    /// every request bounded by `command_timeout`.
    pub(crate) async fn connect_to<C: RedisConnection>(
        conn: C,
        subscriber: &HandoffClient,
        command_timeout: Duration,
        mode: Mode,
    ) -> anyhow::Result<Waiter> {
        let locker = Locker::builder()
            .command_timeout(command_timeout)
            .build(conn)?;
        let how = match mode {
            Mode::Poll(_, strategy) => {
                return Ok(Waiter::new(locker.clone(), [locker], Some(strategy)));
            }
            Mode::Handoff(_, how) => how,
        };
        let n = how.lockers.max(1);
        let mut lockers = Vec::with_capacity(n);
        for _ in 0..n {
            lockers.push(
                HandoffLocker::builder()
                    .style(how.style)
                    .relay_limit(how.relay_limit)
                    .build(locker.clone(), subscriber.clone())
                    .await?,
            );
        }
        Ok(Waiter::new(locker, lockers, None))
    }

    fn new<C: RedisConnection, L: Lessor>(
        locker: Locker<C>,
        lessors: impl IntoIterator<Item = L>,
        retry: Option<RetryStrategy>,
    ) -> Waiter {
        Waiter {
            stats: Some(Arc::new(move || locker.stats())),
            lessors: lessors.into_iter().map(DynLessor::new).collect(),
            retry,
        }
    }

    /// `lessor` (an etcd locker, say) as a way of waiting: every caller
    /// uses it, with the options' own strategy; no request counts.
    pub(crate) fn of(lessor: impl Lessor) -> Waiter {
        Waiter {
            stats: None,
            lessors: Arc::new([DynLessor::new(lessor)]),
            retry: None,
        }
    }

    /// What the locker under every lessor of this way asked of Redis;
    /// `None` for a way with no such locker ([`Waiter::of`]).
    pub(crate) fn stats(&self) -> Option<LockerStats> {
        self.stats.as_ref().map(|stats| stats())
    }

    /// The lessor caller number 0 uses.
    pub(crate) fn lessor(&self) -> &DynLessor {
        &self.lessors[0]
    }

    /// Takes the lease for caller number `caller`; `opts` gives the
    /// deadline and cancellation, the mode the strategy.
    pub(crate) async fn acquire(
        &self,
        caller: usize,
        key: &str,
        ttl: Duration,
        opts: AcquireOptions,
    ) -> leasehold::Result<Lease> {
        let opts = match self.retry {
            Some(strategy) => opts.retry(strategy),
            None => opts,
        };
        self.lessors[caller % self.lessors.len()]
            .acquire_with(key, ttl, &opts)
            .await
    }
}

/// The tutorial's Step 4 strategy: exponential backoff from `min` to `max`.
pub(crate) fn exponential(min: Duration, max: Duration, jitter: bool) -> RetryStrategy {
    let s = RetryStrategy::exponential(min, max);
    if jitter { s.with_full_jitter() } else { s }
}

/// How much the lock was used: time held, and the gap from each release to
/// the next acquisition.
pub(crate) struct Meter {
    acquisitions: AtomicU64,
    held_ns: AtomicU64,
    last_release: Mutex<Option<Instant>>,
    gaps_us: Mutex<Histogram<u64>>,
}

impl Meter {
    pub(crate) fn new() -> anyhow::Result<Arc<Meter>> {
        Ok(Arc::new(Meter {
            acquisitions: AtomicU64::new(0),
            held_ns: AtomicU64::new(0),
            last_release: Mutex::new(None),
            gaps_us: Mutex::new(Histogram::new(3)?),
        }))
    }

    /// Call as soon as the lease is in hand; returns when that was.
    pub(crate) fn acquired(&self) -> Instant {
        let now = Instant::now();
        self.acquisitions.fetch_add(1, Ordering::Relaxed);
        if let Some(released) = *self
            .last_release
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
        {
            let gap = u64::try_from(now.duration_since(released).as_micros()).unwrap_or(u64::MAX);
            let _ = self
                .gaps_us
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .record(gap.max(1));
        }
        now
    }

    /// Call just before releasing a lease acquired at `since`.
    pub(crate) fn releasing(&self, since: Instant) {
        let now = Instant::now();
        let held = u64::try_from(now.duration_since(since).as_nanos()).unwrap_or(u64::MAX);
        self.held_ns.fetch_add(held, Ordering::Relaxed);
        *self
            .last_release
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(now);
    }

    /// How many leases [`acquired`](Self::acquired) was told of.
    pub(crate) fn acquisitions(&self) -> u64 {
        self.acquisitions.load(Ordering::Relaxed)
    }

    pub(crate) fn held(&self) -> Duration {
        Duration::from_nanos(self.held_ns.load(Ordering::Relaxed))
    }

    /// The gap at `quantile` (0..=1), if any was recorded.
    pub(crate) fn gap(&self, quantile: f64) -> Option<Duration> {
        let h = self.gaps_us.lock().unwrap_or_else(PoisonError::into_inner);
        (!h.is_empty()).then(|| Duration::from_micros(h.value_at_quantile(quantile)))
    }
}

/// Held time over elapsed time.
pub(crate) fn utilisation(held: Duration, elapsed: Duration) -> f64 {
    if elapsed.is_zero() {
        return 0.0;
    }
    held.as_secs_f64() / elapsed.as_secs_f64()
}

/// Deletes the lock key and its hand-off queue.
pub(crate) async fn clear(env: &Env, key: &str) -> anyhow::Result<()> {
    clear_on(&env.redis, key).await
}

/// Deletes the lock key and its hand-off queue through `conn` (on a
/// cluster, `key` has a hash tag, so the three share its slot).
pub(crate) async fn clear_on<C: RedisConnection>(conn: &C, key: &str) -> anyhow::Result<()> {
    let mut conn = conn.clone();
    let () = redis::cmd("DEL")
        .arg(key)
        .arg(format!("{key}:waitq"))
        .arg(format!("{key}:waiters"))
        .query_async(&mut conn)
        .await?;
    Ok(())
}
