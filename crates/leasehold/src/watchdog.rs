//! Keeping a lease while the work runs, and stopping the work when it is lost.
//!
//! A lease expires after its TTL whether or not the holder has finished. Work
//! that can outlast the TTL (a slow query, a long pause, a retry loop) needs
//! a **watchdog**: a task, owned by the [`Lease`](crate::Lease), that extends
//! the lease with a token-checked refresh while the work runs, and that
//! cancels a [`CancellationToken`] the moment it can no longer vouch for the
//! lease, so the work stops instead of carrying on after the lease is gone.
//!
//! # The schedule, and why ttl/3
//!
//! The watchdog refreshes every `ttl / 3`, counted from the send time of the
//! last refresh (the acquire, at first), and bounds each refresh by `ttl / 3`
//! as well (and never past the confirmed deadline below). Refreshing at a third of the TTL leaves two more chances before
//! the lease runs out: if the refresh at `ttl / 3` is lost (a dropped
//! connection, a failover, a slow server), the one at `2 * ttl / 3` can
//! still save the lease, and because each refresh gives up after `ttl / 3`,
//! a hung request never delays the next one. Refreshing more often costs
//! Redis round trips for little gain; refreshing at `ttl / 2` leaves a
//! single retry.
//!
//! # When the work is cancelled
//!
//! The lease's **confirmed deadline** is the send time of the last request
//! that proved we hold the key (the acquire or a successful refresh) plus the
//! TTL, on the monotonic clock. Redis cannot expire the key before it, since
//! Redis started its countdown after we sent. The watchdog cancels the token:
//!
//! - at once when a refresh says the key no longer holds our token
//!   ([`LostCause::Expired`]: it expired or changed hands), and
//! - when refreshes keep failing (timeouts, connection errors) until the
//!   confirmed deadline passes ([`LostCause::Unreachable`]): after that
//!   instant the key may have expired and been taken, and nothing we can
//!   learn later undoes the overlap.
//!
//! A service that can say at once that the lock may be gone (ZooKeeper's
//! watch on the holder's own node: see
//! [`LockService::watch_held`](crate::LockService::watch_held)) wakes the
//! watchdog between refreshes: it confirms with one refresh there and
//! then, and cancels the token only if that refresh says the key no longer
//! holds our token ([`LostCause::Expired`], as above). A signal alone never
//! ends a lease, and one the refresh finds spurious costs that refresh.
//!
//! A failed refresh that is not yet fatal has no caller to report to; it is
//! logged as a `tracing` warning (target `leasehold::watchdog`).
//!
//! # What it cannot do
//!
//! The watchdog **narrows the window; it does not close it**. It learns of a
//! loss at best one refresh period late (one round trip late, on a service
//! that signals a loss), the work must notice the
//! cancellation (an `.await` that does not reach a cancellation point keeps
//! running), and a holder paused by the operating system, a garbage
//! collector or a stopped VM runs nothing at all, watchdog included, until it
//! wakes, possibly after its lease has passed to someone else and just
//! before its write. So the watchdog is an *efficiency* measure that makes
//! such overlaps rare. The write itself must still be fenced in the
//! database (a fencing token or check-and-set that refuses a stale writer)
//! for the data to stay correct.
//!
//! # Blocking the thread stops the watchdog too
//!
//! The watchdog is a task on your tokio runtime, so it runs only when a
//! worker thread is free. Work that blocks its thread instead of awaiting
//! (a synchronous client, CPU-heavy code, `std::thread::sleep`) starves it
//! on a current-thread runtime, or on a multi-thread one whose workers are
//! all blocked: the lease expires while the work runs, and the watchdog
//! stops the work at its next `.await`. That is the correct outcome (the
//! lease was lost), but it is lost work. Seen in this repository's job
//! runner test: opening a PostgreSQL connection inside a 50 ms lease, on a
//! current-thread runtime, in a debug build (whose SCRAM authentication
//! runs unoptimised on the calling thread), lost the first lease of every
//! caller (its chaos test now opens each caller's connection before the
//! run, with the harness's `run_with`). Open connections before taking
//! the lease (a pool), and move blocking or heavy steps to
//! `tokio::task::spawn_blocking`.

use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::Wake;
use crate::error::{Error, Result};
use crate::service::Service;

pub use crate::lost::LostCause;

/// The last moment we know we held the key, and for how long after it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Validity {
    /// Send time of the last request that proved we hold the key.
    pub(crate) confirmed_at: Instant,
    /// The TTL that request set.
    pub(crate) ttl: Duration,
    /// Taken off the TTL for clock drift between us and the servers (a
    /// quorum's; zero for a single server, whose clock alone counts).
    pub(crate) margin: Duration,
}

impl Validity {
    /// A validity of `ttl` from `confirmed_at`, with no drift margin.
    #[cfg(feature = "handoff")]
    pub(crate) fn new(confirmed_at: Instant, ttl: Duration) -> Validity {
        Validity {
            confirmed_at,
            ttl,
            margin: Duration::ZERO,
        }
    }

    pub(crate) fn until(self) -> Instant {
        self.confirmed_at + self.ttl.saturating_sub(self.margin)
    }
}

/// The drift margin for a TTL.
pub(crate) type Margin = fn(Duration) -> Duration;

/// No drift margin: the single server's clock alone counts.
pub(crate) fn no_margin(_: Duration) -> Duration {
    Duration::ZERO
}

/// What a lease and its watchdog share.
#[derive(Debug)]
pub(crate) struct Shared {
    validity: Mutex<Validity>,
    margin: Margin,
    lost: OnceLock<LostCause>,
    signal: Mutex<Signal>,
}

/// The token cancelled when the lease is lost or ends, made on first ask:
/// most leases are released without anyone watching them, and a
/// `CancellationToken` is an allocation and a locked tree node to cancel.
#[derive(Debug, Default)]
struct Signal {
    token: Option<CancellationToken>,
    /// Lost or ended: a token made from now on starts cancelled.
    done: bool,
}

impl Shared {
    /// Shared state of a lease confirmed at `confirmed_at` for `ttl`, with
    /// no drift margin.
    #[cfg(test)]
    pub(crate) fn new(confirmed_at: Instant, ttl: Duration) -> Arc<Shared> {
        Shared::with_margin(confirmed_at, ttl, no_margin)
    }

    /// Shared state of a lease confirmed at `confirmed_at` for `ttl`, every
    /// confirmation less `margin(ttl)`.
    pub(crate) fn with_margin(confirmed_at: Instant, ttl: Duration, margin: Margin) -> Arc<Shared> {
        Arc::new(Shared {
            validity: Mutex::new(Validity {
                confirmed_at,
                ttl,
                margin: margin(ttl),
            }),
            margin,
            lost: OnceLock::new(),
            signal: Mutex::default(),
        })
    }

    pub(crate) fn validity(&self) -> Validity {
        *self.validity.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records a refresh sent at `sent_at` that succeeded. A slower reply to
    /// an earlier request never moves the validity back.
    pub(crate) fn confirm(&self, sent_at: Instant, ttl: Duration) {
        let mut validity = self.validity.lock().unwrap_or_else(PoisonError::into_inner);
        if sent_at >= validity.confirmed_at {
            *validity = Validity {
                confirmed_at: sent_at,
                ttl,
                margin: (self.margin)(ttl),
            };
        }
    }

    /// Lowers the validity to `other` if that ends sooner (a lease that
    /// takes in another lock is valid until the earlier of the two ends).
    pub(crate) fn lower_to(&self, other: Validity) {
        let mut validity = self.validity.lock().unwrap_or_else(PoisonError::into_inner);
        if other.until() < validity.until() {
            *validity = other;
        }
    }

    /// Marks the lease lost (the first cause wins, and only it is counted
    /// in the metrics) and cancels the signal.
    pub(crate) fn lose(&self, cause: LostCause) {
        if self.lost.set(cause).is_ok() {
            crate::metrics::lease_lost(cause.label());
        }
        self.cancel();
    }

    /// Cancels the signal without a cause: the lease ended (released or
    /// dropped), so work protected by it must stop too.
    pub(crate) fn end(&self) {
        self.cancel();
    }

    fn cancel(&self) {
        let token = {
            let mut signal = self.signal.lock().unwrap_or_else(PoisonError::into_inner);
            signal.done = true;
            signal.token.clone()
        };
        if let Some(token) = token {
            token.cancel();
        }
    }

    pub(crate) fn lost(&self) -> Option<LostCause> {
        self.lost.get().copied()
    }

    /// The token cancelled when the lease is lost or ends (already
    /// cancelled if it has).
    pub(crate) fn signal(&self) -> CancellationToken {
        let mut signal = self.signal.lock().unwrap_or_else(PoisonError::into_inner);
        let done = signal.done;
        signal
            .token
            .get_or_insert_with(|| {
                let token = CancellationToken::new();
                if done {
                    token.cancel();
                }
                token
            })
            .clone()
    }
}

/// The refresh period for `ttl`: a third of it.
pub(crate) fn period(ttl: Duration) -> Duration {
    ttl / 3
}

/// Resolves when `gone` (armed) does, disarming it; never while unarmed.
async fn fired(gone: &mut Option<Wake>) {
    match gone {
        Some(wake) => {
            wake.await;
            *gone = None;
        }
        None => std::future::pending().await,
    }
}

/// The watchdog loop: refreshes through `refresh(ttl, deadline)` every
/// `ttl / 3` until the signal is cancelled, cancelling it when the lease is
/// lost. Generic over `refresh` so the schedule can be tested with a fake
/// backend under paused time. `refresh` returns `Ok(false)` when the key no
/// longer holds our token.
///
/// `arm` gives the service's signal that the lease may be gone
/// ([`LockService::watch_held`](crate::LockService::watch_held); `None`:
/// none): when it resolves, one refresh is sent at once to confirm, and
/// only its `Ok(false)` loses the lease. It is armed at the start and
/// again after each refresh on the timer that confirmed the lease, never
/// right after a wake, so a signal that keeps firing costs at most one
/// extra refresh per period.
pub(crate) async fn keep<F, Fut, A>(
    shared: Arc<Shared>,
    key: String,
    service: Service,
    mut refresh: F,
    mut arm: A,
) where
    F: FnMut(Duration, Instant) -> Fut,
    Fut: Future<Output = Result<bool>>,
    A: FnMut() -> Option<Wake>,
{
    let signal = shared.signal();
    let mut last_sent = shared.validity().confirmed_at;
    // Whether a refresh failed since the last confirmation.
    let mut failing = false;
    let mut gone = arm();
    loop {
        let validity = shared.validity();
        let period = period(validity.ttl);
        let valid_until = validity.until();
        let next = last_sent.max(validity.confirmed_at) + period;
        // Whether the service's signal woke us (rather than the timer).
        let woken = tokio::select! {
            biased;
            () = signal.cancelled() => return,
            () = tokio::time::sleep_until(next.min(valid_until)) => false,
            () = fired(&mut gone) => true,
        };
        let validity = shared.validity();
        let now = Instant::now();
        if now >= validity.until() {
            let cause = if failing {
                LostCause::Unreachable
            } else {
                LostCause::Expired
            };
            lost(&shared, &key, cause);
            return;
        }
        if woken {
            tracing::debug!(
                target: "leasehold::watchdog",
                key,
                "the service signalled the lease may be gone; confirming with a refresh"
            );
        } else if now < next {
            // Woken early by a changed validity (a manual refresh); re-plan.
            continue;
        }
        let sent_at = now;
        last_sent = sent_at;
        let bound = (sent_at + period).min(validity.until());
        let outcome = tokio::select! {
            biased;
            () = signal.cancelled() => return,
            outcome = tokio::time::timeout_at(bound, refresh(validity.ttl, bound)) => outcome,
        };
        let outcome = outcome.unwrap_or_else(|_elapsed| {
            Err(Error::Timeout {
                service,
                op: "refresh",
                after: sent_at.elapsed(),
            })
        });
        let ttl_ms = validity.ttl.as_millis();
        match outcome {
            Ok(true) => {
                crate::metrics::refresh("watchdog", "ok");
                tracing::debug!(target: "leasehold::watchdog", key, ttl_ms, by = "watchdog", outcome = "ok", "refreshed");
                shared.confirm(sent_at, validity.ttl);
                failing = false;
                if woken {
                    tracing::debug!(
                        target: "leasehold::watchdog",
                        key,
                        "the lease is still ours: the signal was spurious; it is armed again after the next refresh"
                    );
                } else if gone.is_none() {
                    gone = arm();
                }
            }
            Ok(false) | Err(Error::WrongType { .. }) => {
                crate::metrics::refresh("watchdog", "not_held");
                lost(&shared, &key, LostCause::Expired);
                return;
            }
            Err(err) => {
                crate::metrics::refresh("watchdog", "error");
                // A timeout seen more than a period after its bound: this
                // process (or its runtime) did not run meanwhile (stopped,
                // paused), so the service's silence is not shown. If the
                // lease runs out now, it ran out while we were not running:
                // expired, not unreachable.
                let stalled =
                    matches!(err, Error::Timeout { .. }) && Instant::now() > bound + period;
                failing = !stalled;
                let left = shared
                    .validity()
                    .until()
                    .saturating_duration_since(Instant::now());
                tracing::warn!(
                    target: "leasehold::watchdog",
                    key,
                    ttl_ms,
                    by = "watchdog",
                    outcome = "error",
                    error = %err,
                    remaining = ?left,
                    "lease refresh failed; retrying until the lease's deadline"
                );
            }
        }
    }
}

/// The watchdog found the lease lost: one WARN, then the lease is marked
/// lost (which cancels the work).
fn lost(shared: &Shared, key: &str, cause: LostCause) {
    tracing::warn!(
        target: "leasehold::watchdog",
        key,
        cause = cause.label(),
        "lease lost; cancelling the work: {cause}"
    );
    shared.lose(cause);
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    const MS: Duration = Duration::from_millis(1);
    const TTL: Duration = Duration::from_millis(300);

    /// What the fake backend answers to one refresh.
    #[derive(Clone)]
    enum Reply {
        Held,
        NotHeld,
        Fail,
        Hang,
    }

    /// A scripted backend: answers each refresh with the next reply and
    /// records when (since `start`) each refresh was sent.
    struct Fake {
        start: Instant,
        replies: Mutex<Vec<Reply>>,
        sent: Mutex<Vec<Duration>>,
        deadlines: Mutex<Vec<Duration>>,
    }

    impl Fake {
        fn new(replies: Vec<Reply>) -> Arc<Fake> {
            Arc::new(Fake {
                start: Instant::now(),
                replies: Mutex::new(replies.into_iter().rev().collect()),
                sent: Mutex::new(Vec::new()),
                deadlines: Mutex::new(Vec::new()),
            })
        }

        fn sent(&self) -> Vec<Duration> {
            self.sent.lock().expect("lock").clone()
        }

        fn refresher(
            self: Arc<Self>,
        ) -> impl FnMut(Duration, Instant) -> std::pin::Pin<Box<dyn Future<Output = Result<bool>> + Send>>
        {
            let fake = self;
            move |ttl, deadline| {
                assert_eq!(ttl, TTL);
                let fake = fake.clone();
                Box::pin(async move {
                    fake.sent.lock().expect("lock").push(fake.start.elapsed());
                    fake.deadlines
                        .lock()
                        .expect("lock")
                        .push(deadline - fake.start);
                    let reply = fake
                        .replies
                        .lock()
                        .expect("lock")
                        .pop()
                        .unwrap_or(Reply::Held);
                    match reply {
                        Reply::Held => Ok(true),
                        Reply::NotHeld => Ok(false),
                        Reply::Fail => Err(Error::UnexpectedReply {
                            service: Service::REDIS,
                            op: "refresh",
                        }),
                        Reply::Hang => std::future::pending().await,
                    }
                })
            }
        }
    }

    fn start(fake: &Arc<Fake>) -> (Arc<Shared>, tokio::task::JoinHandle<()>) {
        let shared = Shared::new(fake.start, TTL);
        let task = tokio::spawn(keep(
            shared.clone(),
            "k".into(),
            Service::REDIS,
            fake.clone().refresher(),
            || None,
        ));
        (shared, task)
    }

    #[tokio::test(start_paused = true)]
    async fn refreshes_every_third_of_the_ttl_and_extends_the_deadline() {
        let fake = Fake::new(vec![]);
        let (shared, task) = start(&fake);
        tokio::time::sleep(1050 * MS).await;
        assert_eq!(
            fake.sent(),
            [100, 200, 300, 400, 500, 600, 700, 800, 900, 1000].map(|m| m * MS)
        );
        // Each refresh is bounded by a third of the TTL.
        let deadlines = fake.deadlines.lock().expect("lock").clone();
        assert_eq!(deadlines[0], 200 * MS);
        assert_eq!(shared.validity().until() - fake.start, 1300 * MS);
        assert_eq!(shared.lost(), None);
        assert!(!shared.signal().is_cancelled());
        shared.end();
        task.await.expect("watchdog task");
    }

    #[tokio::test(start_paused = true)]
    async fn not_held_cancels_at_once_with_expired() {
        let fake = Fake::new(vec![Reply::Held, Reply::NotHeld]);
        let (shared, task) = start(&fake);
        shared.signal().cancelled().await;
        assert_eq!(fake.start.elapsed(), 200 * MS);
        assert_eq!(shared.lost(), Some(LostCause::Expired));
        task.await.expect("watchdog task");
        assert_eq!(fake.sent().len(), 2, "refreshed after the loss");
    }

    #[tokio::test(start_paused = true)]
    async fn hanging_refreshes_cancel_at_the_confirmed_deadline() {
        let fake = Fake::new(vec![Reply::Held, Reply::Hang, Reply::Hang, Reply::Hang]);
        let (shared, task) = start(&fake);
        shared.signal().cancelled().await;
        // Confirmed at 100 ms (the first refresh's send time) + 300 ms ttl.
        assert_eq!(fake.start.elapsed(), 400 * MS);
        assert_eq!(shared.lost(), Some(LostCause::Unreachable));
        // Each hung refresh gave up after ttl/3, in time for the next one.
        assert_eq!(fake.sent(), [100, 200, 300].map(|m| m * MS));
        task.await.expect("watchdog task");
    }

    /// The process stopped (SIGSTOP) with a refresh in flight, and woken
    /// after the lease ran out: the lease expired while this process was
    /// not running; nothing showed the service unreachable.
    #[tokio::test(start_paused = true)]
    async fn a_refresh_timed_out_only_by_a_stopped_process_loses_the_lease_as_expired() {
        let fake = Fake::new(vec![Reply::Hang]);
        let (shared, task) = start(&fake);
        tokio::time::sleep(101 * MS).await;
        assert_eq!(fake.sent(), [100 * MS]);
        // Nothing runs from 101 ms to 701 ms: the clock jumps.
        tokio::time::advance(600 * MS).await;
        shared.signal().cancelled().await;
        assert_eq!(shared.lost(), Some(LostCause::Expired));
        task.await.expect("watchdog task");
    }

    #[tokio::test(start_paused = true)]
    async fn fast_failures_retry_on_schedule_then_cancel_at_the_deadline() {
        let fake = Fake::new(vec![Reply::Fail; 10]);
        let (shared, task) = start(&fake);
        shared.signal().cancelled().await;
        assert_eq!(fake.start.elapsed(), 300 * MS);
        assert_eq!(shared.lost(), Some(LostCause::Unreachable));
        assert_eq!(fake.sent(), [100, 200].map(|m| m * MS));
        task.await.expect("watchdog task");
    }

    #[tokio::test(start_paused = true)]
    async fn one_failure_is_survived_by_the_next_refresh() {
        let fake = Fake::new(vec![Reply::Fail, Reply::Held]);
        let (shared, task) = start(&fake);
        tokio::time::sleep(650 * MS).await;
        assert_eq!(shared.lost(), None);
        assert_eq!(fake.sent(), [100, 200, 300, 400, 500, 600].map(|m| m * MS));
        assert_eq!(shared.validity().until() - fake.start, 900 * MS);
        shared.end();
        task.await.expect("watchdog task");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_past_its_validity_is_lost_without_a_refresh() {
        let fake = Fake::new(vec![]);
        tokio::time::advance(400 * MS).await;
        let (shared, task) = start(&fake);
        shared.signal().cancelled().await;
        assert_eq!(shared.lost(), Some(LostCause::Expired));
        assert!(fake.sent().is_empty());
        task.await.expect("watchdog task");
    }

    #[tokio::test(start_paused = true)]
    async fn aborting_the_task_stops_the_refreshes() {
        let calls = Arc::new(AtomicU32::new(0));
        let shared = Shared::new(Instant::now(), TTL);
        let counter = calls.clone();
        let task = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(keep(
            shared.clone(),
            "k".into(),
            Service::REDIS,
            move |_, _| {
                counter.fetch_add(1, Ordering::Relaxed);
                async { Ok(true) }
            },
            || None,
        )));
        tokio::time::sleep(250 * MS).await;
        assert_eq!(calls.load(Ordering::Relaxed), 2);
        drop(task);
        tokio::time::sleep(2000 * MS).await;
        assert_eq!(calls.load(Ordering::Relaxed), 2);
        assert!(!shared.signal().is_cancelled(), "aborting is not a loss");
    }

    /// A service's loss signal that fires every time it is armed, beside
    /// refreshes that always find the lease ours: each wake costs one
    /// refresh, and the signal is armed again only after a refresh on the
    /// timer, so it adds at most one refresh per period (and the lease is
    /// kept).
    #[tokio::test(start_paused = true)]
    async fn a_signal_that_keeps_firing_costs_at_most_one_refresh_per_period() {
        let fake = Fake::new(vec![]);
        let arms = Arc::new(AtomicU32::new(0));
        let counter = arms.clone();
        let shared = Shared::new(fake.start, TTL);
        let task = tokio::spawn(keep(
            shared.clone(),
            "k".into(),
            Service::REDIS,
            fake.clone().refresher(),
            move || -> Option<Wake> {
                counter.fetch_add(1, Ordering::Relaxed);
                Some(Box::pin(std::future::ready(())))
            },
        ));
        tokio::time::sleep(350 * MS).await;
        // A wake at 0 (armed at the start), then each timed refresh at
        // 100, 200, 300 re-arms it, and it wakes at once again.
        assert_eq!(
            fake.sent(),
            [0, 100, 100, 200, 200, 300, 300].map(|m| m * MS)
        );
        assert_eq!(arms.load(Ordering::Relaxed), 4);
        assert_eq!(shared.lost(), None);
        assert_eq!(shared.validity().until() - fake.start, 600 * MS);
        shared.end();
        task.await.expect("watchdog task");
    }

    /// A lock service whose holder hears of a loss between refreshes: its
    /// locks are ours until `delete` (by hand, elsewhere), and every
    /// `watch_held` wake-up resolves once the lock is gone.
    #[derive(Clone)]
    struct Watched {
        /// The keys whose lock was deleted.
        deleted: Arc<Mutex<Vec<String>>>,
        /// Bumped by every deletion: what the armed wake-ups wait on.
        deletions: Arc<tokio::sync::watch::Sender<u32>>,
        /// How many refreshes were sent, told to whoever waits.
        refreshes: Arc<tokio::sync::watch::Sender<u32>>,
        /// How many wake-ups were handed out.
        arms: Arc<AtomicU32>,
        /// When set, a wake-up resolves although nothing was deleted (a
        /// session event).
        spurious: Arc<tokio::sync::Notify>,
    }

    impl Watched {
        fn new() -> Watched {
            Watched {
                deleted: Arc::default(),
                deletions: Arc::new(tokio::sync::watch::Sender::new(0)),
                refreshes: Arc::new(tokio::sync::watch::Sender::new(0)),
                arms: Arc::default(),
                spurious: Arc::default(),
            }
        }

        fn is_deleted(&self, key: &str) -> bool {
            self.deleted.lock().expect("lock").iter().any(|k| k == key)
        }

        fn delete(&self, key: &str) {
            self.deleted.lock().expect("lock").push(key.to_owned());
            self.deletions.send_modify(|n| *n += 1);
        }

        fn refreshes(&self) -> u32 {
            *self.refreshes.borrow()
        }

        async fn until_refreshes(&self, n: u32) {
            let mut seen = self.refreshes.subscribe();
            seen.wait_for(|sent| *sent >= n).await.expect("sender kept");
        }
    }

    impl crate::backend::LockService for Watched {
        type Entry = ();

        fn service(&self) -> Service {
            Service::named("watched")
        }

        fn command_timeout(&self) -> Duration {
            Duration::from_secs(1)
        }

        fn step<'a>(
            &'a self,
            _: &'a crate::backend::Claim,
            (): &'a mut (),
            _: Instant,
        ) -> crate::backend::Reply<'a, crate::backend::Step> {
            Box::pin(async { Ok(crate::backend::Step::won(None)) })
        }

        fn undo<'a>(
            &'a self,
            _: &'a crate::backend::Claim,
            (): &'a mut (),
            _: Instant,
        ) -> crate::backend::Reply<'a, ()> {
            Box::pin(async { Ok(()) })
        }

        fn refresh<'a>(
            &'a self,
            held: &'a crate::backend::Held,
            _: Duration,
            _: Instant,
        ) -> crate::backend::Reply<'a, bool> {
            self.refreshes.send_modify(|n| *n += 1);
            let ours = !self.is_deleted(held.key());
            Box::pin(async move { Ok(ours) })
        }

        fn release<'a>(
            &'a self,
            held: &'a crate::backend::Held,
            _: Instant,
        ) -> crate::backend::Reply<'a, bool> {
            let ours = !self.is_deleted(held.key());
            Box::pin(async move { Ok(ours) })
        }

        fn watch_held(&self, held: &crate::backend::Held) -> Option<Wake> {
            self.arms.fetch_add(1, Ordering::SeqCst);
            let (service, key) = (self.clone(), held.key().to_owned());
            let mut deletions = self.deletions.subscribe();
            Some(Box::pin(async move {
                let spurious = service.spurious.notified();
                let mut spurious = std::pin::pin!(spurious);
                loop {
                    if service.is_deleted(&key) {
                        return;
                    }
                    tokio::select! {
                        () = &mut spurious => return,
                        changed = deletions.changed() => {
                            if changed.is_err() {
                                return;
                            }
                        }
                    }
                }
            }))
        }
    }

    const LONG: Duration = Duration::from_secs(9);

    /// A lock deleted by hand is a lost lease at once: the service's signal
    /// wakes the watchdog, one refresh confirms it is not ours, and the
    /// work's token fires, before the first refresh on the timer was due
    /// (the paused clock has not moved).
    #[tokio::test(start_paused = true)]
    async fn a_signalled_loss_is_confirmed_by_one_refresh_and_ends_the_lease() -> Result<()> {
        use crate::Lessor;
        let service = Watched::new();
        let opts = crate::AcquireOptions::new().watchdog(true);
        let lease = service.acquire_with("k", LONG, &opts).await?;
        let token = lease.watch()?;
        let start = Instant::now();
        service.delete("k");
        token.cancelled().await;
        assert_eq!(lease.lost(), Some(LostCause::Expired));
        assert_eq!(service.refreshes(), 1, "one confirming refresh");
        assert_eq!(
            Instant::now(),
            start,
            "found by a timed refresh, not the signal"
        );
        assert!(matches!(lease.release().await, Err(Error::NotHeld { .. })));
        Ok(())
    }

    /// A wake-up with the lock still ours (a session event) costs one
    /// refresh, which keeps the lease; the signal is armed again only after
    /// the next refresh on the timer, and a deletion then ends the lease at
    /// once.
    #[tokio::test(start_paused = true)]
    async fn a_spurious_signal_costs_one_refresh_and_keeps_the_lease() -> Result<()> {
        use crate::Lessor;
        let service = Watched::new();
        let opts = crate::AcquireOptions::new().watchdog(true);
        let lease = service.acquire_with("k", LONG, &opts).await?;
        let token = lease.watch()?;
        let start = lease.confirmed_at();
        // The watchdog armed its signal and waits on it.
        tokio::task::yield_now().await;
        assert_eq!(service.arms.load(Ordering::SeqCst), 1);
        service.spurious.notify_waiters();
        service.until_refreshes(1).await;
        assert_eq!(Instant::now(), start, "the refresh was the signal's");
        assert_eq!(lease.lost(), None);
        assert!(!token.is_cancelled());
        // Not armed again until the timed refresh, a period after the
        // signal's.
        assert_eq!(service.arms.load(Ordering::SeqCst), 1);
        service.until_refreshes(2).await;
        assert_eq!(Instant::now(), start + period(LONG));
        assert_eq!(lease.lost(), None);
        tokio::task::yield_now().await;
        assert_eq!(service.arms.load(Ordering::SeqCst), 2);
        let deleted_at = Instant::now();
        service.delete("k");
        token.cancelled().await;
        assert_eq!(lease.lost(), Some(LostCause::Expired));
        assert_eq!(service.refreshes(), 3);
        assert_eq!(Instant::now(), deleted_at);
        Ok(())
    }

    /// A lease on several locks: the loss of any one, signalled, ends it.
    #[tokio::test(start_paused = true)]
    async fn a_signalled_loss_of_one_of_several_locks_ends_the_lease() -> Result<()> {
        use crate::Lessor;
        let service = Watched::new();
        let opts = crate::AcquireOptions::new().watchdog(true);
        let lease = service.acquire_all(["a", "b"], LONG, &opts).await?;
        let token = lease.watch()?;
        let start = Instant::now();
        service.delete("b");
        token.cancelled().await;
        assert_eq!(lease.lost(), Some(LostCause::Expired));
        assert_eq!(Instant::now(), start);
        assert_eq!(service.arms.load(Ordering::SeqCst), 2, "one signal a lock");
        Ok(())
    }

    #[test]
    fn the_signal_made_after_the_end_starts_cancelled_and_one_made_before_is_cancelled() {
        let before = Shared::new(Instant::now(), TTL);
        let early = before.signal();
        assert!(!early.is_cancelled());
        before.end();
        assert!(early.is_cancelled());
        assert!(before.signal().is_cancelled());
        let after = Shared::new(Instant::now(), TTL);
        after.lose(LostCause::Expired);
        assert!(after.signal().is_cancelled());
    }

    #[test]
    fn a_late_reply_never_moves_the_validity_back() {
        let t0 = Instant::now();
        let shared = Shared::new(t0, TTL);
        shared.confirm(t0 + 200 * MS, TTL);
        shared.confirm(t0 + 100 * MS, TTL);
        assert_eq!(shared.validity().until(), t0 + 500 * MS);
        shared.lose(LostCause::Unreachable);
        shared.lose(LostCause::Expired);
        assert_eq!(shared.lost(), Some(LostCause::Unreachable));
    }
}
