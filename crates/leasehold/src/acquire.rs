//! One acquire, from its entry to the lease, for every way of taking one.
//!
//! Why one file: an acquire is read by following its wait, from the call
//! the user made down to the request on the wire. When that walk crossed
//! a file to resolve the wait, came back for the way's take, left for the
//! loop and came back again for the step, every reader paid for it, and
//! each way grew its own copy of what follows a win. So everything that
//! is the same for every way sits here, in the order an acquire meets it:
//! the entry ([`Lessor`]'s calls, for every [`LockService`] and for the
//! hand-off locker), the door (the checks, before any I/O, and the wait
//! resolved into one [`Budget`]: nothing below reads the options' wait
//! again), the span and metrics, the claim handed to the one retry loop
//! ([`rounds::drive`]), and what follows a win (the way's own step after
//! it, the replicas' confirmation, the watchdog). The walk enters this
//! file once, goes on to the loop (`rounds`, which also drives a
//! service's steps) and ends in the way's step: three files, no return.
//! What differs between ways is the small [`Way`] trait.
//!
//! # Several locks in one lease
//!
//! A transfer between two wallets needs both. Taking them in the order the
//! caller names them deadlocks two transfers in opposite directions (each
//! holds one lock and waits for the other until its deadline); taking them
//! in one global order (sorted by lock key) cannot: whoever holds the
//! smaller key is never waiting for someone who waits for it. Every way of
//! taking a lease uses this one routine, so the order is the same whatever
//! the mode.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Claim, Held, LockService, Reply};
use crate::budget::Budget;
use crate::error::{Error, GiveUpReason, Result};
use crate::fencing::{FencingToken, LockKeys, Target};
#[cfg(feature = "handoff")]
use crate::handoff::HandoffLocker;
use crate::lease::{Lease, check_ttl};
use crate::lessor::{Lessor, sealed::Sealed};
use crate::metrics::{self, AcquireOutcome};
#[cfg(feature = "handoff")]
use crate::node::RedisConnection;
use crate::options::{AcquireOptions, Supports};
use crate::rounds::{self, Progress, Steps};
use crate::service::Service;
use crate::token::LeaseToken;
use crate::way::Way;

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

/// Every service is a [`Lessor`]: its four calls are the path below, the
/// one retry loop driving the service's steps.
impl<S: LockService> Lessor for S {
    async fn acquire(&self, keys: impl LockKeys, ttl: Duration) -> Result<Lease> {
        let opts = AcquireOptions::default();
        let target = Target::of(&keys)?;
        let budget = door(self, ttl, &opts)?;
        traced_take(self, target, ttl, &opts, budget).await
    }

    async fn acquire_with(
        &self,
        keys: impl LockKeys,
        ttl: Duration,
        opts: &AcquireOptions,
    ) -> Result<Lease> {
        let target = Target::of(&keys)?;
        let budget = door(self, ttl, opts)?;
        traced_take(self, target, ttl, opts, budget).await
    }

    async fn acquire_all<K: LockKeys>(
        &self,
        keys: impl IntoIterator<Item = K> + Send,
        ttl: Duration,
        opts: &AcquireOptions,
    ) -> Result<Lease> {
        acquire_all_of(self, keys, ttl, opts).await
    }
}

/// Its four calls (`use leasehold::Lessor`): see [Taking a
/// lease](HandoffLocker#taking-a-lease) for what hand-off adds.
#[cfg(feature = "handoff")]
impl<C: RedisConnection> Lessor for HandoffLocker<C> {
    async fn acquire(&self, keys: impl LockKeys, ttl: Duration) -> Result<Lease> {
        let opts = AcquireOptions::default();
        let target = Target::of(&keys)?;
        let budget = door(self, ttl, &opts)?;
        traced_take(self, target, ttl, &opts, budget).await
    }

    async fn acquire_with(
        &self,
        keys: impl LockKeys,
        ttl: Duration,
        opts: &AcquireOptions,
    ) -> Result<Lease> {
        let target = Target::of(&keys)?;
        let budget = door(self, ttl, opts)?;
        traced_take(self, target, ttl, opts, budget).await
    }

    async fn acquire_all<K: LockKeys>(
        &self,
        keys: impl IntoIterator<Item = K> + Send,
        ttl: Duration,
        opts: &AcquireOptions,
    ) -> Result<Lease> {
        acquire_all_of(self, keys, ttl, opts).await
    }
}

/// Every service as a way of taking a lease: its claim is the service's
/// [`Claim`], its attempts the service's steps ([`Steps`]), its lease one
/// the lease core refreshes and releases through the service.
impl<S: LockService> Way for S {
    type Claim = Claim;
    type Won = Option<FencingToken>;
    type Attempts<'a>
        = Steps<'a, S>
    where
        Self: 'a;

    fn supports(&self) -> Supports {
        Supports {
            wait_replicas: self.offers_replicas(),
        }
    }

    fn mode(&self) -> &'static str {
        LockService::mode(self)
    }

    fn check_ttl(&self, ttl: Duration) -> Result<()> {
        LockService::check_ttl(self, ttl)
    }

    fn command_timeout(&self) -> Duration {
        LockService::command_timeout(self)
    }

    fn step_timeout(&self) -> Duration {
        LockService::step_timeout(self)
    }

    fn claim(&self, target: Target, ttl: Duration) -> Result<Claim> {
        Ok(Claim {
            key: target.lock,
            token: LeaseToken::generate()?,
            fence_key: target.fence.map(|fence| self.fence_key_of(&fence)),
            ttl,
        })
    }

    fn key(claim: &Claim) -> &str {
        &claim.key
    }

    fn attempts<'a>(&'a self, claim: &'a Claim, _: &AcquireOptions, _: Budget) -> Steps<'a, S> {
        Steps::new(self, claim)
    }

    fn lease(&self, claim: Claim, fence: Option<FencingToken>, sent_at: Instant) -> Lease {
        let held = Held {
            key: claim.key,
            token: claim.token,
            fence_key: claim.fence_key,
            fence,
        };
        crate::served::lease(self, held, claim.ttl, sent_at)
    }

    async fn confirm_replicas(
        &self,
        lease: Lease,
        opts: &AcquireOptions,
        deadline: Instant,
    ) -> Result<Lease> {
        let service = self;
        crate::replicas::confirm(lease, opts, deadline, |key, replicas, timeout| async move {
            service.wait_replicas(&key, replicas, timeout).await
        })
        .await
    }
}

/// The door of every acquire, after its keys: the TTL and the options
/// checked (no I/O), and the wait `opts` gives resolved into one
/// [`Budget`] from now.
fn door<W: Way>(way: &W, ttl: Duration, opts: &AcquireOptions) -> Result<Budget> {
    check_ttl(ttl)?;
    way.check_ttl(ttl)?;
    opts.check(way.supports(), way.command_timeout())?;
    Ok(opts.budget(Instant::now()))
}

/// One lock taken on `target`, within `budget`: the way's claim, its
/// attempts driven by the one retry loop, the lease the win makes, then
/// what follows the win ([`won`]); inside a `leasehold.acquire` span (key,
/// mode, fenced; at the end attempts, waited_ms and outcome, on every
/// path, a dropped future included), which ends with one DEBUG event
/// saying how it went; the acquire's metrics are recorded at the same
/// point.
///
/// With `wait_replicas`, a win too few replicas acknowledged
/// ([`Error::NotReplicated`]: the lease was given back) is a fault that
/// may pass, like a Redis restart: a replica reconnecting, a failover's
/// new primary without its replica yet. So it is taken again (a new claim:
/// no two takes share a token), after the retry strategy's next wait,
/// within `budget`; if the strategy ends or the next take would start past
/// the deadline, the caller gets the `NotReplicated`.
async fn traced_take<W: Way>(
    way: &W,
    target: Target,
    ttl: Duration,
    opts: &AcquireOptions,
    budget: Budget,
) -> Result<Lease> {
    use tracing::Instrument;
    use tracing::field::Empty;
    let span = tracing::debug_span!(
        "leasehold.acquire",
        key = %target.lock,
        mode = way.mode(),
        fenced = target.fence.is_some(),
        attempts = Empty,
        waited_ms = Empty,
        outcome = Empty,
    );
    let mut pending = Pending {
        span: span.clone(),
        mode: way.mode(),
        start: budget.start(),
        progress: Arc::default(),
        reported: false,
    };
    let progress = pending.progress.clone();
    let observed = &pending.progress;
    let take = async move {
        let deadline = budget.deadline();
        let mut target = target;
        // The last win too few replicas acknowledged, if any.
        let mut unreplicated: Option<Error> = None;
        loop {
            // Kept for a take again, which only a replica wait can need.
            let again = opts.wait_replicas.is_some().then(|| target.clone());
            let claim = way.claim(target, ttl)?;
            let attempts = way.attempts(&claim, opts, budget);
            let key = W::key(&claim);
            let outcome = rounds::drive(key, opts, budget, way.step_timeout(), attempts).await;
            let (winning, sent_at) = match (outcome, unreplicated) {
                (Ok(won), _) => won,
                // Out of wait after a win the replicas did not confirm:
                // that kept the lock from the caller, not contention (as
                // an acquire that gives up during a fault returns the
                // fault).
                (
                    Err(Error::NotAcquired {
                        reason: GiveUpReason::DeadlineExpired | GiveUpReason::RetriesExhausted,
                        ..
                    }),
                    Some(err),
                ) => return Err(err),
                (Err(err), _) => return Err(err),
            };
            let lease = way.lease(claim, winning, sent_at);
            let lease = way.after_win(lease, ttl, deadline).await;
            let err = match won(way, lease, opts, deadline).await {
                Err(err @ Error::NotReplicated { .. }) => err,
                other => return other,
            };
            let (Some(next), Some(wake)) = (again, take_again_at(opts, observed, deadline)) else {
                return Err(err);
            };
            tracing::debug!(key = %next.lock, error = %err, "too few replicas acknowledged; retrying within the deadline");
            unreplicated = Some(err);
            tokio::select! {
                biased;
                () = opts.cancelled() => {
                    return Err(Error::NotAcquired {
                        key: next.lock,
                        attempts: Progress::read(observed, Instant::now()).attempts,
                        waited: budget.start().elapsed(),
                        reason: GiveUpReason::Cancelled,
                        fault: None,
                    });
                }
                () = tokio::time::sleep_until(wake) => {}
            }
            target = next;
        }
    };
    // With no subscriber interested in the span, entering and leaving it
    // on every poll is work for nothing.
    let result = if span.is_disabled() {
        Progress::observe(progress, take).await
    } else {
        Progress::observe(progress, take.instrument(span)).await
    };
    pending.end(&result);
    result
}

/// When to take again after a win too few replicas acknowledged: after
/// the strategy's wait that follows the attempts made so far (every take
/// counts on from the last: `max_attempts` bounds them all); `None` if
/// the strategy ends or the take would start past `deadline`.
fn take_again_at(
    opts: &AcquireOptions,
    progress: &Mutex<Progress>,
    deadline: Instant,
) -> Option<Instant> {
    let made = Progress::read(progress, Instant::now()).attempts;
    opts.retry
        .waits()
        .nth(usize::try_from(made.saturating_sub(1)).unwrap_or(usize::MAX))
        .map(|wait| Instant::now() + wait)
        .filter(|&wake| wake < deadline)
}

/// What follows a win, written once for every way and every path (each key
/// of [`acquire_all`] included): the replicas confirm the lease, for a way
/// that supports `wait_replicas`, by the acquire's `deadline`; then its
/// watchdog starts if `opts` asks for one.
async fn won<W: Way>(
    way: &W,
    lease: Lease,
    opts: &AcquireOptions,
    deadline: Instant,
) -> Result<Lease> {
    let lease = if way.supports().wait_replicas && opts.wait_replicas.is_some() {
        // Boxed: a path most acquires never take, and inline its state
        // would enlarge every acquire's future (moved at every layer).
        Box::pin(way.confirm_replicas(lease, opts, deadline)).await?
    } else {
        lease
    };
    watched(lease, opts)
}

/// `lease`, its watchdog started if `opts` asks for one.
fn watched(lease: Lease, opts: &AcquireOptions) -> Result<Lease> {
    if opts.watchdog {
        lease.watch()?;
    }
    Ok(lease)
}

/// An acquire under way: its span, start and progress, reported once it
/// ends, or as `dropped` if its future is dropped first.
struct Pending {
    span: tracing::Span,
    mode: &'static str,
    start: Instant,
    progress: Arc<Mutex<Progress>>,
    reported: bool,
}

impl Pending {
    /// Reports the acquire's end: span fields, one DEBUG event, metrics.
    fn end(&mut self, result: &Result<Lease>) {
        let (outcome, reason) = match result {
            Ok(_) => (AcquireOutcome::Acquired, None),
            Err(Error::NotAcquired { reason, .. }) => (AcquireOutcome::GaveUp, Some(*reason)),
            Err(_) => (AcquireOutcome::Error, None),
        };
        let (progress, elapsed) = self.report(outcome, reason);
        let span = &self.span;
        let (attempts, waited_ms) = (progress.attempts, millis(elapsed));
        match result {
            Ok(lease) => {
                let fence = lease.fence().map(crate::FencingToken::get);
                tracing::debug!(parent: span, outcome = outcome.as_str(), attempts, waited_ms, fence, "acquired");
            }
            Err(Error::NotAcquired { reason, .. }) => {
                let reason = reason.label();
                tracing::debug!(parent: span, outcome = outcome.as_str(), reason, attempts, waited_ms, "gave up");
            }
            Err(err) => {
                tracing::debug!(parent: span, outcome = outcome.as_str(), attempts, waited_ms, error = %err, "acquire failed");
            }
        }
    }

    /// Records the span fields and metrics of an acquire that ended with
    /// `outcome`; returns its progress and how long it took (one clock
    /// read for both).
    fn report(
        &mut self,
        outcome: AcquireOutcome,
        reason: Option<GiveUpReason>,
    ) -> (Progress, Duration) {
        self.reported = true;
        let now = Instant::now();
        let progress = Progress::read(&self.progress, now);
        let elapsed = now.saturating_duration_since(self.start);
        self.span.record("attempts", progress.attempts);
        self.span.record("waited_ms", millis(elapsed));
        self.span.record("outcome", outcome.as_str());
        metrics::acquire(
            self.mode,
            outcome,
            reason.map(GiveUpReason::label),
            elapsed,
            progress.waited(),
            progress.attempts,
        );
        (progress, elapsed)
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.reported {
            let (progress, elapsed) = self.report(AcquireOutcome::Dropped, None);
            tracing::debug!(
                parent: &self.span,
                outcome = AcquireOutcome::Dropped.as_str(),
                attempts = progress.attempts,
                waited_ms = millis(elapsed),
                "acquire dropped by its caller"
            );
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `acquire_all` of every way: checks (no I/O), then every lock in order,
/// all within the wait `opts` gives, resolved here into one [`Budget`].
async fn acquire_all_of<W: Way, K: LockKeys>(
    way: &W,
    keys: impl IntoIterator<Item = K>,
    ttl: Duration,
    opts: &AcquireOptions,
) -> Result<Lease> {
    let targets = targets(keys)?;
    let budget = door(way, ttl, opts)?;
    // Each lock without its own watchdog: the merged lease gets one.
    let each = opts.clone().watchdog(false);
    let lease = acquire_all(targets, budget, |target, rest| {
        traced_take(way, target, ttl, &each, rest)
    })
    .await?;
    watched(lease, opts)
}

/// The targets of `keys`, sorted by lock key, duplicates dropped. No I/O.
///
/// # Errors
/// [`Error::InvalidKey`] for no keys at all, an empty key, or one lock key
/// named with two different fence keys.
pub(crate) fn targets<K: LockKeys>(keys: impl IntoIterator<Item = K>) -> Result<Vec<Target>> {
    let mut targets = keys
        .into_iter()
        .map(|k| Target::of(&k))
        .collect::<Result<Vec<_>>>()?;
    if targets.is_empty() {
        return Err(Error::InvalidKey {
            key: String::new(),
            reason: "no keys to lock",
        });
    }
    targets.sort();
    targets.dedup();
    if let Some(pair) = targets.windows(2).find(|w| w[0].lock == w[1].lock) {
        return Err(Error::InvalidKey {
            key: pair[0].lock.clone(),
            reason: "the same lock key is named with two different fence keys",
        });
    }
    Ok(targets)
}

/// Takes every target in order through `one`, each with what is left of
/// `budget` (one deadline for all), merging the leases into one; on
/// failure, gives back what it took and returns the error.
async fn acquire_all<F, Fut>(targets: Vec<Target>, budget: Budget, mut one: F) -> Result<Lease>
where
    F: FnMut(Target, Budget) -> Fut,
    Fut: Future<Output = Result<Lease>>,
{
    let mut held: Option<Lease> = None;
    for target in targets {
        let part = match one(target, budget.rest()).await {
            Ok(part) => part,
            Err(err) => {
                if let Some(taken) = held {
                    let key = taken.key().to_owned();
                    if let Err(release) = taken.release().await {
                        tracing::debug!(key, error = %release, "could not give back a lock of an incomplete acquire_all; the ttl will end it");
                    }
                }
                return Err(err);
            }
        };
        match &mut held {
            None => held = Some(part),
            Some(lease) => lease.absorb(part),
        }
    }
    held.ok_or(Error::InvalidKey {
        key: String::new(),
        reason: "no keys to lock",
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fencing::FencedKeys;

    #[test]
    fn targets_are_sorted_and_deduplicated_whatever_the_order_given() -> Result<()> {
        let a = targets(["wallet:b", "wallet:a", "wallet:b"])?;
        let b = targets(["wallet:a", "wallet:b"])?;
        assert_eq!(a, b);
        assert_eq!(a[0].lock, "wallet:a");
        let fenced = targets([
            FencedKeys::for_resource("w:2")?,
            FencedKeys::for_resource("w:1")?,
        ])?;
        assert_eq!(fenced[0].lock, "lock:{w:1}");
        assert_eq!(fenced[0].fence.as_deref(), Some("fence:{w:1}"));
        Ok(())
    }

    #[test]
    fn no_keys_empty_keys_and_conflicting_fences_are_refused() -> Result<()> {
        assert!(matches!(
            targets(Vec::<&str>::new()),
            Err(Error::InvalidKey { .. })
        ));
        assert!(matches!(targets(["a", ""]), Err(Error::InvalidKey { .. })));
        let conflicting = [
            FencedKeys::new("lock:{x}", "fence:{x}")?,
            FencedKeys::new("lock:{x}", "fence2:{x}")?,
        ];
        assert!(matches!(
            targets(conflicting),
            Err(Error::InvalidKey { .. })
        ));
        Ok(())
    }
}

#[cfg(test)]
mod size_tests {
    use std::time::Duration;

    use crate::connection::Connection;
    use crate::{AcquireOptions, Lessor, Locker};

    /// An uncontended acquire's future stays small. Every layer of the
    /// acquire builds the next one's future and moves it into its own
    /// (a `memcpy` of its whole size): at 8.4 KB (an `async fn` that took
    /// a future as its argument held it twice, and the replica wait was
    /// inline) those moves were a visible part of the client's CPU per
    /// lease under load (perf).
    #[test]
    fn an_acquire_future_stays_under_four_kilobytes() -> Result<(), Box<dyn std::error::Error>> {
        let client = redis::Client::open("redis://127.0.0.1:1/")?;
        let conn = Connection::lazy(client.into(), Duration::from_secs(1), 1);
        let locker = Locker::builder().build(conn)?;
        let ttl = Duration::from_secs(1);
        let acquire = std::mem::size_of_val(&locker.acquire("k", ttl));
        assert!(acquire <= 4096, "Locker::acquire's future: {acquire} bytes");
        let opts = AcquireOptions::new().wait(Duration::from_secs(1));
        let waiting = std::mem::size_of_val(&locker.acquire_with("k", ttl, &opts));
        assert!(
            waiting <= 4096,
            "Locker::acquire_with's future: {waiting} bytes"
        );
        Ok(())
    }
}

#[cfg(test)]
mod send_tests {
    use std::time::Duration;

    use crate::node::RedisConnection;
    use crate::{AcquireOptions, Lessor, Locker};

    fn assert_send<T: Send>(_: &T) {}

    /// Every acquire future is `Send` for any connection type, so callers
    /// can `tokio::spawn` it (a compile-time check; nothing runs).
    #[allow(dead_code)]
    fn acquire_futures_are_send<C: RedisConnection>(
        locker: &Locker<C>,
        #[cfg(feature = "handoff")] handoff: &crate::HandoffLocker<C>,
        #[cfg(feature = "quorum")] quorum: &crate::Quorum<C>,
    ) {
        let (ttl, opts) = (Duration::from_secs(1), AcquireOptions::new());
        assert_send(&locker.acquire_with("k", ttl, &opts));
        assert_send(&locker.acquire_all(["a", "b"], ttl, &opts));
        assert_send(&locker.with_lock("k", ttl, &opts, async |_| ()));
        #[cfg(feature = "handoff")]
        {
            assert_send(&handoff.acquire_with("k", ttl, &opts));
            assert_send(&handoff.acquire_all(["a", "b"], ttl, &opts));
        }
        #[cfg(feature = "quorum")]
        {
            assert_send(&quorum.acquire_with("k", ttl, &opts));
            assert_send(&quorum.acquire_all(["a", "b"], ttl, &opts));
        }
    }
}

#[cfg(test)]
mod replica_retry_tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    use tokio::time::Instant;

    use crate::backend::{Claim, Held, LockService, Reply, Step};
    use crate::{AcquireOptions, Error, Lessor, RetryStrategy, Service};

    /// A service whose lock is free at the first step, busy for the next
    /// three, then free again, and whose replicas never acknowledge.
    #[derive(Clone, Default)]
    struct Unreplicated {
        steps: Arc<AtomicU32>,
    }

    impl LockService for Unreplicated {
        type Entry = ();

        fn service(&self) -> Service {
            Service::named("test")
        }

        fn command_timeout(&self) -> Duration {
            Duration::from_secs(1)
        }

        fn step<'a>(&'a self, _: &'a Claim, (): &'a mut (), _: Instant) -> Reply<'a, Step> {
            let n = self.steps.fetch_add(1, Ordering::SeqCst) + 1;
            Box::pin(async move {
                Ok(if n == 1 || n > 4 {
                    Step::won(None)
                } else {
                    Step::busy()
                })
            })
        }

        fn undo<'a>(&'a self, _: &'a Claim, (): &'a mut (), _: Instant) -> Reply<'a, ()> {
            Box::pin(async { Ok(()) })
        }

        fn refresh<'a>(&'a self, _: &'a Held, _: Duration, _: Instant) -> Reply<'a, bool> {
            Box::pin(async { Ok(true) })
        }

        fn release<'a>(&'a self, _: &'a Held, _: Instant) -> Reply<'a, bool> {
            Box::pin(async { Ok(true) })
        }

        fn offers_replicas(&self) -> bool {
            true
        }

        fn wait_replicas<'a>(&'a self, _: &'a str, _: u32, _: Duration) -> Reply<'a, u64> {
            Box::pin(async { Ok(0) })
        }
    }

    /// `max_attempts` bounds every attempt of an acquire, those of its
    /// take again after an unreplicated win included: three attempts here
    /// (an unreplicated win, then two busy), where a take counting its own
    /// from zero made four (and, busy longer, up to n x n).
    #[tokio::test(start_paused = true)]
    async fn max_attempts_counts_across_takes_after_unreplicated_wins() {
        let service = Unreplicated::default();
        let opts = AcquireOptions::new()
            .retry(RetryStrategy::constant(Duration::from_millis(10)).max_attempts(3))
            .wait(Duration::from_secs(10))
            .wait_replicas(1, Duration::from_millis(50));
        let got = service
            .acquire_with("k", Duration::from_secs(1), &opts)
            .await;
        assert!(matches!(got, Err(Error::NotReplicated { .. })), "{got:?}");
        assert_eq!(service.steps.load(Ordering::SeqCst), 3);
    }
}
