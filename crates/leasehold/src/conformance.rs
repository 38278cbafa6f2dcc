//! A conformance suite any lock service runs (feature `conformance`).
//!
//! The [`LockService`](crate::LockService) contract is only worth what
//! checks it. [`run`] drives a [`Lessor`] through a table of checks, one
//! per invariant, against a running service, causing the faults its
//! [`Faults`] can cause (a lock lost on the service, a fence counter lost,
//! the service paused), and returns a [`Report`]: each check passed,
//! failed (with what was seen), or skipped (a fault the service cannot be
//! put through). This repository runs it against every way it ships (the
//! in-memory one, polling, hand-off, Redlock, etcd) and against a backend
//! written outside the crate (`examples/map-service`); a backend of yours
//! runs the same suite in its own tests:
//!
//! ```
//! # #[cfg(feature = "memory")]
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use leasehold::MemoryLocker;
//! use leasehold::conformance::{self, Settings};
//!
//! let service = MemoryLocker::new();
//! // A `Faults` that can expire a lock, lose counters and pause the
//! // service makes every check run; `NoFaults` skips those that need one.
//! let report = conformance::run(&service, &service, &Settings::default()).await;
//! assert!(report.is_ok(), "{report}");
//! # }
//! # #[cfg(not(feature = "memory"))]
//! # fn main() {}
//! ```
//!
//! What it cannot prove: that two *processes* exclude each other (every
//! check runs in one), that the service keeps its data across its own
//! crashes, or anything about timing beyond "each call returns". Those are
//! the fault-matrix verifier's (`leasehold chaos`).
//!
//! Each check uses its own keys (`Settings::prefix`, the check's name, a
//! random suffix), so the suite can run against a shared server and in
//! parallel with itself.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::election::Election;
use crate::error::{Error, GiveUpReason, Result};
use crate::fencing::{FencedKeys, LockKeys};
use crate::lessor::Lessor;
use crate::options::AcquireOptions;
use crate::service::Service;

/// The faults a service can be put through by the suite. Each method
/// defaults to "not offered" (the checks that need it are skipped); say
/// which ones are offered in [`offers`](Self::offers).
pub trait Faults: Send + Sync {
    /// Which faults this can cause.
    fn offers(&self) -> Offered;

    /// Ends the lock `key` on the service now, as its TTL running out or
    /// a delete by hand would.
    ///
    /// # Errors
    /// When the fault could not be caused.
    fn expire(&self, _key: &str) -> impl Future<Output = Result<()>> + Send {
        not_offered("expire")
    }

    /// Loses the fence counter `fence_key` (the lock stays).
    ///
    /// # Errors
    /// When the fault could not be caused.
    fn lose_fence(&self, _fence_key: &str) -> impl Future<Output = Result<()>> + Send {
        not_offered("lose_fence")
    }

    /// Stops the service answering, until [`resume`](Self::resume).
    ///
    /// # Errors
    /// When the fault could not be caused.
    fn pause(&self) -> impl Future<Output = Result<()>> + Send {
        not_offered("pause")
    }

    /// Lets the service answer again.
    ///
    /// # Errors
    /// When the service could not be resumed.
    fn resume(&self) -> impl Future<Output = Result<()>> + Send {
        not_offered("resume")
    }
}

fn not_offered(what: &'static str) -> impl Future<Output = Result<()>> + Send {
    std::future::ready(Err(Error::NotOffered {
        service: Service::named("the suite's faults"),
        what,
    }))
}

/// Which faults a [`Faults`] can cause.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Offered {
    /// [`Faults::expire`].
    pub expire: bool,
    /// [`Faults::lose_fence`].
    pub lose_fence: bool,
    /// [`Faults::pause`] and [`Faults::resume`].
    pub pause: bool,
}

impl Offered {
    /// Every fault.
    pub const ALL: Offered = Offered {
        expire: true,
        lose_fence: true,
        pause: true,
    };

    /// No fault.
    pub const NONE: Offered = Offered {
        expire: false,
        lose_fence: false,
        pause: false,
    };

    /// These, with `expire` set to `on`.
    #[must_use]
    pub const fn expire(mut self, on: bool) -> Offered {
        self.expire = on;
        self
    }

    /// These, with `lose_fence` set to `on`.
    #[must_use]
    pub const fn lose_fence(mut self, on: bool) -> Offered {
        self.lose_fence = on;
        self
    }

    /// These, with `pause` set to `on`.
    #[must_use]
    pub const fn pause(mut self, on: bool) -> Offered {
        self.pause = on;
        self
    }
}

/// No faults: the checks that need one are skipped.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoFaults;

impl Faults for NoFaults {
    fn offers(&self) -> Offered {
        Offered::NONE
    }
}

/// How the suite runs.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Settings {
    /// The prefix of every key the suite uses. Defaults to `conformance`.
    pub prefix: String,
    /// The TTL of the leases a check holds while it looks at them; long
    /// enough that none runs out on a busy machine unless the check wants
    /// it to. Defaults to 10 s.
    pub ttl: Duration,
    /// The TTL of the lease the watchdog check keeps past its TTL (its
    /// work runs for 2.5 of them). Defaults to 1 s.
    pub watched_ttl: Duration,
    /// How long past its deadline (or past the command timeout, with the
    /// service paused) a call may take before the suite calls it a hang.
    /// Defaults to 10 s.
    pub hang: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            prefix: "conformance".to_owned(),
            ttl: Duration::from_secs(10),
            watched_ttl: Duration::from_secs(1),
            hang: Duration::from_secs(10),
        }
    }
}

impl Settings {
    /// These settings with `prefix`.
    #[must_use]
    pub fn prefix(mut self, prefix: impl Into<String>) -> Settings {
        self.prefix = prefix.into();
        self
    }

    /// These settings with `ttl` for the leases the checks hold.
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Settings {
        self.ttl = ttl;
        self
    }

    /// These settings with `ttl` for the watchdog checks' leases.
    #[must_use]
    pub fn watched_ttl(mut self, ttl: Duration) -> Settings {
        self.watched_ttl = ttl;
        self
    }

    /// These settings with `hang` as the allowance past a deadline.
    #[must_use]
    pub fn hang(mut self, hang: Duration) -> Settings {
        self.hang = hang;
        self
    }
}

/// How one check ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The invariant held.
    Passed,
    /// The check needs a fault the service's [`Faults`] does not offer.
    Skipped(&'static str),
    /// The invariant did not hold: what was seen.
    Failed(String),
}

/// One check's result.
#[derive(Debug, Clone)]
pub struct Checked {
    /// The check's name.
    pub name: &'static str,
    /// The invariant it checks.
    pub invariant: &'static str,
    /// How it ended.
    pub verdict: Verdict,
}

/// The suite's results, one per check, in the table's order.
#[derive(Debug, Clone)]
pub struct Report {
    /// The service, as its errors name it.
    pub service: Service,
    /// Every check's result.
    pub checks: Vec<Checked>,
}

impl Report {
    /// Whether no check failed (skipped ones aside).
    pub fn is_ok(&self) -> bool {
        self.failures().next().is_none()
    }

    /// The checks that failed.
    pub fn failures(&self) -> impl Iterator<Item = &Checked> {
        self.checks
            .iter()
            .filter(|c| matches!(c.verdict, Verdict::Failed(_)))
    }

    /// The checks that ran and passed.
    pub fn passed(&self) -> impl Iterator<Item = &Checked> {
        self.checks.iter().filter(|c| c.verdict == Verdict::Passed)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "conformance of {}:", self.service)?;
        for check in &self.checks {
            match &check.verdict {
                Verdict::Passed => writeln!(f, "  ok      {}", check.name)?,
                Verdict::Skipped(why) => writeln!(f, "  skipped {} ({why})", check.name)?,
                Verdict::Failed(seen) => writeln!(
                    f,
                    "  FAILED  {}: {}\n          seen: {seen}",
                    check.name, check.invariant
                )?,
            }
        }
        Ok(())
    }
}

/// What a check returns: `Ok(())` passed, `Err(Skip)` skipped,
/// `Err(Fail)` failed.
enum Miss {
    Skip(&'static str),
    Fail(String),
}

type Outcome = std::result::Result<(), Miss>;

fn fail(seen: impl fmt::Display) -> Miss {
    Miss::Fail(seen.to_string())
}

/// Fails with `what` and the result seen unless `ok`.
fn expect<T: fmt::Debug>(ok: bool, what: &str, seen: &T) -> Outcome {
    if ok {
        Ok(())
    } else {
        Err(fail(format_args!("{what}: got {seen:?}")))
    }
}

/// The table: every check, its name and the invariant it checks.
const CHECKS: &[(&str, &str)] = &[
    (
        "bad_input_is_refused",
        "an empty key or a TTL out of bounds is refused before any I/O",
    ),
    (
        "one_holder_at_a_time",
        "while a lease is held, another acquire of its key gives up as busy; once released, it wins",
    ),
    (
        "with_lock_returns_the_output",
        "with_lock runs the work under the lease and returns its output with the release's outcome",
    ),
    (
        "fencing_tokens_grow",
        "each fenced acquire's token is above every token issued before for its fence key",
    ),
    (
        "release_is_token_checked",
        "a holder whose lock was lost gets NotHeld from release and never deletes its successor's lock",
    ),
    (
        "refresh_is_token_checked",
        "a holder whose lock was lost cannot refresh it and never extends its successor's lock",
    ),
    (
        "a_lost_lease_stops_the_work",
        "the watchdog stops work under a lease the service no longer holds (LeaseLost)",
    ),
    (
        "the_watchdog_keeps_a_lease_past_its_ttl",
        "work that runs for 2.5 TTLs under the watchdog keeps its lease and releases it",
    ),
    (
        "acquire_all_never_deadlocks",
        "two acquire_all of the same keys named in opposite orders both finish",
    ),
    (
        "a_cancelled_or_dropped_acquire_leaves_no_lock",
        "a cancelled acquire gives up as cancelled, and a dropped lease's lock is freed",
    ),
    (
        "a_paused_service_is_never_success",
        "with the service paused, a release and a refresh fail (never Ok), and an acquire returns by its deadline without a lease",
    ),
    (
        "an_election_names_its_leader",
        "a campaign wins a fenced term whose leader another candidate reads; the next term's token is above it (skipped when the service offers no leader record)",
    ),
    (
        "a_lost_counter_is_healed_or_said",
        "after the fence counter is lost, the next token is above the last, or the lease's raise_fence lifts the counter past it",
    ),
];

/// Runs every check against `lessor`, with the faults `faults` offers,
/// one after another. Never panics; a check that hangs past
/// [`Settings::hang`] fails. A lessor that keeps state in process (a
/// relay, a cache) should run [`run_pair`], so that a successor is
/// another client as another process would be.
pub async fn run<L: Lessor, F: Faults>(lessor: &L, faults: &F, settings: &Settings) -> Report {
    run_pair(lessor, lessor, faults, settings).await
}

/// [`run`], with `other` (a second client of the same service, made
/// apart from `lessor`, as another process would have it) taking the lock
/// where a check needs a successor to the holder.
pub async fn run_pair<L: Lessor, F: Faults>(
    lessor: &L,
    other: &L,
    faults: &F,
    settings: &Settings,
) -> Report {
    let mut checks = Vec::with_capacity(CHECKS.len());
    for (index, &(name, invariant)) in CHECKS.iter().enumerate() {
        let ctx = Ctx {
            lessor,
            other,
            faults,
            settings,
            name,
        };
        // Every check gets its whole budget: a few leases, each wait
        // bounded, plus the hang allowance.
        let budget = settings.ttl * 4 + settings.hang;
        let verdict = match tokio::time::timeout(budget, ctx.check(index)).await {
            Err(_elapsed) => Verdict::Failed(format!("did not finish within {budget:?}")),
            Ok(Ok(())) => Verdict::Passed,
            Ok(Err(Miss::Skip(why))) => Verdict::Skipped(why),
            Ok(Err(Miss::Fail(seen))) => Verdict::Failed(seen),
        };
        if faults.offers().pause {
            // A failed check may have left the service paused.
            let _ = faults.resume().await;
        }
        checks.push(Checked {
            name,
            invariant,
            verdict,
        });
    }
    Report {
        service: crate::lessor::sealed::Sealed::service(lessor),
        checks,
    }
}

/// One check's surroundings.
struct Ctx<'a, L, F> {
    lessor: &'a L,
    /// Another client of the service, for a successor.
    other: &'a L,
    faults: &'a F,
    settings: &'a Settings,
    name: &'static str,
}

impl<L: Lessor, F: Faults> Ctx<'_, L, F> {
    async fn check(&self, index: usize) -> Outcome {
        match index {
            0 => self.bad_input_is_refused().await,
            1 => self.one_holder_at_a_time().await,
            2 => self.with_lock_returns_the_output().await,
            3 => self.fencing_tokens_grow().await,
            4 => self.release_is_token_checked().await,
            5 => self.refresh_is_token_checked().await,
            6 => self.a_lost_lease_stops_the_work().await,
            7 => self.the_watchdog_keeps_a_lease_past_its_ttl().await,
            8 => self.acquire_all_never_deadlocks().await,
            9 => self.a_cancelled_or_dropped_acquire_leaves_no_lock().await,
            10 => self.a_paused_service_is_never_success().await,
            11 => self.an_election_names_its_leader().await,
            _ => self.a_lost_counter_is_healed_or_said().await,
        }
    }

    /// A resource name of this check's own: prefix, check, random part.
    fn resource(&self, part: &str) -> std::result::Result<String, Miss> {
        let suffix: u64 = rand::random();
        Ok(format!(
            "{}:{}:{part}:{suffix:016x}",
            self.settings.prefix, self.name
        ))
    }

    fn keys(&self, part: &str) -> std::result::Result<FencedKeys, Miss> {
        FencedKeys::for_resource(&self.resource(part)?).map_err(fail)
    }

    fn need(&self, offered: bool, what: &'static str) -> Outcome {
        if offered {
            Ok(())
        } else {
            Err(Miss::Skip(what))
        }
    }

    /// A wait long enough for a free lock on a busy machine.
    fn long(&self) -> AcquireOptions {
        AcquireOptions::new().wait(self.settings.hang)
    }

    /// A short wait, for a lock that must be found busy.
    fn short() -> AcquireOptions {
        AcquireOptions::new().wait(Duration::from_millis(200))
    }

    async fn bad_input_is_refused(&self) -> Outcome {
        let ttl = self.settings.ttl;
        let empty = self.lessor.acquire("", ttl).await;
        expect(
            matches!(empty, Err(Error::InvalidKey { .. })),
            "empty key",
            &empty,
        )?;
        for bad in [Duration::ZERO, crate::MAX_TTL + Duration::from_secs(1)] {
            let got = self.lessor.acquire(self.resource("ttl")?, bad).await;
            expect(
                matches!(got, Err(Error::InvalidTtl { .. })),
                "ttl out of bounds",
                &got,
            )?;
        }
        Ok(())
    }

    async fn one_holder_at_a_time(&self) -> Outcome {
        let key = self.resource("lock")?;
        let ttl = self.settings.ttl;
        let first = self
            .lessor
            .acquire_with(&key, ttl, &self.long())
            .await
            .map_err(fail)?;
        let second = self.lessor.acquire_with(&key, ttl, &Self::short()).await;
        expect(
            matches!(
                &second,
                Err(Error::NotAcquired {
                    reason: GiveUpReason::DeadlineExpired | GiveUpReason::RetriesExhausted,
                    ..
                })
            ),
            "a second acquire while held",
            &second,
        )?;
        first.release().await.map_err(fail)?;
        let third = self.lessor.acquire_with(&key, ttl, &self.long()).await;
        let third = third.map_err(|e| fail(format_args!("after release: {e}")))?;
        third.release().await.map_err(fail)
    }

    async fn with_lock_returns_the_output(&self) -> Outcome {
        let keys = self.keys("scoped")?;
        let done = self
            .lessor
            .with_lock(&keys, self.settings.ttl, &self.long(), async |lease| {
                lease.fence().is_some()
            })
            .await
            .map_err(fail)?;
        expect(
            done.output,
            "the work's output (a fenced lease)",
            &done.output,
        )?;
        expect(done.release.is_ok(), "the release", &done.release)
    }

    async fn fencing_tokens_grow(&self) -> Outcome {
        let keys = self.keys("fenced")?;
        let mut last = None;
        for _ in 0..5 {
            let lease = self
                .lessor
                .acquire_with(&keys, self.settings.ttl, &self.long())
                .await
                .map_err(fail)?;
            let fence = lease.fence();
            lease.release().await.map_err(fail)?;
            let Some(fence) = fence else {
                return Err(fail("a fenced acquire issued no token"));
            };
            if let Some(last) = last {
                expect(fence > last, "a token above the last", &(last, fence))?;
            }
            last = Some(fence);
        }
        Ok(())
    }

    async fn release_is_token_checked(&self) -> Outcome {
        self.need(self.faults.offers().expire, "needs the expire fault")?;
        let keys = self.keys("release")?;
        let ttl = self.settings.ttl;
        let old = self
            .lessor
            .acquire_with(&keys, ttl, &self.long())
            .await
            .map_err(fail)?;
        self.faults.expire(old.key()).await.map_err(fail)?;
        let new = self
            .other
            .acquire_with(&keys, ttl, &self.long())
            .await
            .map_err(|e| fail(format_args!("after the old lock expired: {e}")))?;
        expect(
            new.fence() > old.fence(),
            "the successor's token above the old one",
            &(old.fence(), new.fence()),
        )?;
        let late = old.release().await;
        expect(
            matches!(late, Err(Error::NotHeld { .. })),
            "the old holder's release",
            &late,
        )?;
        let third = self.other.acquire_with(&keys, ttl, &Self::short()).await;
        expect(
            matches!(third, Err(Error::NotAcquired { .. })),
            "the successor's lock after the old holder's release (still held)",
            &third,
        )?;
        new.release().await.map_err(fail)
    }

    async fn refresh_is_token_checked(&self) -> Outcome {
        self.need(self.faults.offers().expire, "needs the expire fault")?;
        let key = self.resource("refresh")?;
        let ttl = self.settings.ttl;
        let old = self
            .lessor
            .acquire_with(&key, ttl, &self.long())
            .await
            .map_err(fail)?;
        self.faults.expire(&key).await.map_err(fail)?;
        let new = self
            .other
            .acquire_with(&key, ttl, &self.long())
            .await
            .map_err(|e| fail(format_args!("after the old lock expired: {e}")))?;
        let late = old.refresh(ttl).await;
        expect(
            matches!(late, Err(Error::NotHeld { .. } | Error::LeaseLost { .. })),
            "the old holder's refresh",
            &late,
        )?;
        drop(old);
        // The successor still holds its lock: its own refresh succeeds.
        let own = new.refresh(ttl).await;
        expect(own.is_ok(), "the successor's refresh", &own)?;
        new.release().await.map_err(fail)
    }

    async fn a_lost_lease_stops_the_work(&self) -> Outcome {
        self.need(self.faults.offers().expire, "needs the expire fault")?;
        let key = self.resource("watched")?;
        let faults = self.faults;
        let got = self
            .lessor
            .with_lock(
                &key,
                self.settings.watched_ttl,
                &self.long(),
                async |lease| {
                    faults.expire(lease.key()).await?;
                    // Only the watchdog ends this: it stops the work when it
                    // finds the lease gone.
                    std::future::pending::<()>().await;
                    Ok::<(), Error>(())
                },
            )
            .await;
        expect(
            matches!(got, Err(Error::LeaseLost { .. })),
            "work under a lease expired on the service",
            &got.map(|done| done.output),
        )
    }

    async fn the_watchdog_keeps_a_lease_past_its_ttl(&self) -> Outcome {
        let key = self.resource("kept")?;
        let ttl = self.settings.watched_ttl;
        let done = self
            .lessor
            .with_lock(&key, ttl, &self.long(), async |lease| {
                tokio::time::sleep(ttl * 5 / 2).await;
                lease.lost()
            })
            .await
            .map_err(fail)?;
        expect(
            done.output.is_none(),
            "the lease after 2.5 TTLs",
            &done.output,
        )?;
        expect(done.release.is_ok(), "the release", &done.release)
    }

    async fn acquire_all_never_deadlocks(&self) -> Outcome {
        let (a, b) = (self.resource("a")?, self.resource("b")?);
        let ttl = self.settings.ttl;
        let opts = self.long();
        let one = async {
            for _ in 0..5 {
                let lease = self.lessor.acquire_all([&a, &b], ttl, &opts).await?;
                lease.release().await?;
            }
            Ok::<(), Error>(())
        };
        let other = async {
            for _ in 0..5 {
                let lease = self.lessor.acquire_all([&b, &a], ttl, &opts).await?;
                lease.release().await?;
            }
            Ok::<(), Error>(())
        };
        let (one, other) = tokio::join!(one, other);
        expect(one.is_ok() && other.is_ok(), "both", &(one, other))
    }

    async fn a_cancelled_or_dropped_acquire_leaves_no_lock(&self) -> Outcome {
        let key = self.resource("cancelled")?;
        let ttl = self.settings.ttl;
        let cancel = crate::CancellationToken::new();
        cancel.cancel();
        let opts = self.long().cancel(cancel);
        let got = self.lessor.acquire_with(&key, ttl, &opts).await;
        expect(
            matches!(
                got,
                Err(Error::NotAcquired {
                    reason: GiveUpReason::Cancelled,
                    ..
                })
            ),
            "an acquire cancelled before it began",
            &got,
        )?;
        let dropped = self
            .lessor
            .acquire_with(&key, ttl, &self.long())
            .await
            .map_err(fail)?;
        drop(dropped);
        // The dropped lease's lock is given back in the background (the
        // TTL, longer than this wait, is only the fallback).
        let next = self
            .lessor
            .acquire_with(&key, ttl, &AcquireOptions::new().wait(ttl / 2))
            .await;
        let next = next.map_err(|e| fail(format_args!("after a dropped lease: {e}")))?;
        next.release().await.map_err(fail)
    }

    async fn a_paused_service_is_never_success(&self) -> Outcome {
        self.need(self.faults.offers().pause, "needs the pause fault")?;
        let key = self.resource("paused")?;
        let ttl = self.settings.ttl;
        let lease = self
            .lessor
            .acquire_with(&key, ttl, &self.long())
            .await
            .map_err(fail)?;
        let other = self.resource("paused-other")?;
        self.faults.pause().await.map_err(fail)?;
        let refresh = lease.refresh(ttl).await;
        let wait = Duration::from_millis(500);
        let start = Instant::now();
        let acquire = self
            .lessor
            .acquire_with(&other, ttl, &AcquireOptions::new().wait(wait))
            .await;
        let took = start.elapsed();
        let release = lease.release().await;
        self.faults.resume().await.map_err(fail)?;
        expect(refresh.is_err(), "a refresh while paused", &refresh)?;
        expect(
            !matches!(release, Ok(()) | Err(Error::NotHeld { .. })),
            "a release while paused (its outcome is unknown)",
            &release,
        )?;
        expect(
            acquire.is_err(),
            "an acquire while paused",
            &acquire.as_ref().map(|_| "a lease"),
        )?;
        expect(
            took < wait + self.settings.hang,
            "an acquire while paused returns by its deadline",
            &took,
        )?;
        // Clean up: the lock may still be there until its TTL.
        if let Ok(lease) = self.lessor.acquire_with(&key, ttl, &self.long()).await {
            let _ = lease.release().await;
        }
        Ok(())
    }

    async fn an_election_names_its_leader(&self) -> Outcome {
        let name = self.resource("election")?;
        let build = |lessor: &L, candidate: &str| {
            Election::builder(lessor.clone(), name.clone())
                .candidate(candidate)
                .ttl(self.settings.ttl)
                .build()
                .map_err(fail)
        };
        let (a, b) = (build(self.lessor, "a")?, build(self.other, "b")?);
        let term = match a.campaign().await {
            Err(Error::NotOffered { .. }) => {
                return Err(Miss::Skip("the service offers no leader record"));
            }
            other => other.map_err(fail)?,
        };
        let first = term.fence();
        let leader = match b.leader().await {
            Err(Error::NotOffered { .. }) => {
                term.resign().await.map_err(fail)?;
                return Err(Miss::Skip("the service offers no leader record"));
            }
            other => other.map_err(fail)?,
        };
        expect(
            leader
                .as_ref()
                .is_some_and(|l| l.candidate == "a" && l.fence == first),
            "the leader another candidate reads",
            &leader.map(|l| (l.candidate, l.fence)),
        )?;
        term.resign().await.map_err(fail)?;
        let next = b.campaign().await.map_err(fail)?;
        let second = next.fence();
        next.resign().await.map_err(fail)?;
        expect(
            second > first,
            "the next term's token above the first",
            &(first, second),
        )
    }

    async fn a_lost_counter_is_healed_or_said(&self) -> Outcome {
        self.need(
            self.faults.offers().lose_fence,
            "needs the lose_fence fault",
        )?;
        let keys = self.keys("healed")?;
        let ttl = self.settings.ttl;
        let first = self
            .lessor
            .acquire_with(&keys, ttl, &self.long())
            .await
            .map_err(fail)?;
        let Some(high) = first.fence() else {
            return Err(fail("a fenced acquire issued no token"));
        };
        first.release().await.map_err(fail)?;
        self.faults
            .lose_fence(keys.fence_key().unwrap_or_default())
            .await
            .map_err(fail)?;
        let second = self
            .lessor
            .acquire_with(&keys, ttl, &self.long())
            .await
            .map_err(fail)?;
        let Some(next) = second.fence() else {
            return Err(fail("a fenced acquire issued no token"));
        };
        if next > high {
            return second.release().await.map_err(fail);
        }
        // A repeated token: the database guard refuses it, and the holder
        // heals the counter past the stored fence.
        match second.raise_fence(high).await {
            Ok(()) => {}
            Err(Error::NotOffered { .. }) => {
                return second.release().await.map_err(fail);
            }
            Err(err) => return Err(fail(format_args!("raise_fence: {err}"))),
        }
        second.release().await.map_err(fail)?;
        let third = self
            .lessor
            .acquire_with(&keys, ttl, &self.long())
            .await
            .map_err(fail)?;
        let healed = third.fence();
        third.release().await.map_err(fail)?;
        expect(
            healed.is_some_and(|t| t > high),
            "the token after raise_fence above the stored fence",
            &(high, healed),
        )
    }
}
