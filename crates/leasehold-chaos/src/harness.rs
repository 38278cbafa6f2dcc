//! The harness for your own write path: N callers, any TTL and lock, your
//! write and your invariant, under the same faults and with the same
//! report, verdict and timeline as `leasehold chaos`, and a negative
//! control that proves the run could have caught a broken write path.
//!
//! # An honest verdict
//!
//! A run that finds nothing means something only if it could have found
//! something. Three things make sure of that:
//!
//! - **Your path says what it wrote.** The write closure answers with an
//!   [`Outcome`] ([`Outcome::Committed`], [`Outcome::Refused`],
//!   [`Outcome::NotWritten`], [`Outcome::Stopped`], [`Outcome::Unknown`]).
//!   The harness never cuts a write short: the watchdog stops it only
//!   where your path lets it ([`Call::run`], as `with_lock` does in your
//!   service), and a write stopped before it wrote counts as not written,
//!   not as unknown (an unknown write excuses a lost update of its amount,
//!   so calling every stopped write unknown would hide lost updates).
//! - **A holder pause stops the holder for real.** Each caller runs on its
//!   own thread and runtime; the pause point blocks that thread, so the
//!   holder's watchdog stops refreshing its lease too, the lease expires
//!   and another caller writes (see the `isolated` module's docs, in the
//!   source, for why and what it does not freeze).
//! - **Every error the lock returns is recorded.** The callers run the
//!   one caller loop `leasehold chaos`'s workers run: an acquire that
//!   failed other than `NotAcquired`, a release other than `NotHeld` /
//!   `LeaseLost`, a lease the watchdog gave up on as unreachable, each is a
//!   [`Kind::CallerError`] in the history. With the run's wait recorded,
//!   they are judged as in the matrix ([`CallerErrors`](crate::CallerErrors):
//!   a fault shorter than the wait must return none), and the summary says
//!   `errors to callers (acquire/release/refresh) 0/0/0: ok` or `FAILED`
//!   (`report.check.errors.holds()`).
//! - **A negative control runs first.** The same callers, lock, TTL,
//!   watchdog, fault and seed drive a blind read-modify-write of a counter
//!   in memory (read, a 1 ms round trip, [`Call::pause_point`], write back
//!   plus one, under [`Call::run`]): your path with its database check
//!   removed. If that breaks no invariant, the fault and the settings
//!   cannot show a broken path, and a run with double holders is
//!   **inconclusive**: [`RunReport::holds`] is false and
//!   [`RunReport::summary`] says why. You can give your own control
//!   instead ([`RunReport::with_control`]).
//! - **The verdict says what was exercised.** [`RunReport::verdict`]:
//!   *held* (N double holders absorbed; the control caught, or no control
//!   ran), *never broke* (no two callers held the lock at once: nothing
//!   was exercised, which is not a failure, so a fault that never breaks
//!   the lock can be asserted with [`RunReport::holds`]), *inconclusive*
//!   or *broken*, in the words `leasehold chaos` prints for a cell (the
//!   [`verdicts`](mod@crate::verdicts) module).
//!
//! # Where the pause point goes
//!
//! [`Call::pause_point`] is where the holder-pause fault freezes a holder
//! (its watchdog included) past its lease. Where you put it decides what
//! the run tests. The pictures named below are timeline close-ups
//! ([`render_html_between`](crate::timeline::render_html_between), 60 ms
//! either side of the pause) of real runs: 3 callers, a 50 ms TTL, the
//! watchdog on, seed 7, one holder frozen from 784 ms to 1084 ms. The
//! histories they show, cut to 0.7 s to 1.2 s, are saved next to them
//! (`.jsonl`), and `tests/timeline.rs` checks that each shows what is
//! said here.
//!
//! - **Between the read and the write** (after the `SELECT`, before the
//!   `UPDATE`; for check-and-set, before the conditional `UPDATE`): the
//!   stale write a paused holder makes when it wakes. With the watchdog
//!   off, or a write that lands as soon as it is sent (autocommit, memory),
//!   this tests your check: a check-and-set refuses ([`Outcome::Refused`]),
//!   a blind write overwrites. With the watchdog on and a transaction, the
//!   woken holder's watchdog finds its lease past its validity before the
//!   write's round trip ends and stops the work ([`Outcome::Stopped`]): the
//!   run then tests the watchdog, not your check.
//!
//!   Picture: `docs/pause-point-check-and-set.png` in the repository (the
//!   in-memory check-and-set of `examples/own_write_path.rs`). `w0.t1`
//!   read, then froze holding the lease (its bar, and the thin line of its
//!   write from its start); the others took the lock as soon as that
//!   lease expired (red hatching: two holders at once); when it woke, its
//!   write reached the check with its old fence and was refused (the blue
//!   diamond). What this placement tests: that your check refuses a
//!   holder that outlived its lease.
//! - **Just before the commit, inside its shield**: a pause the watchdog
//!   cannot stop (a GC pause as the `COMMIT` is sent). This tests the
//!   database check for real. With the fence **guard** first in the
//!   transaction, the paused holder keeps the guard's row lock, so a newer
//!   holder's guard waits for it, then wins; without the guard, the newer
//!   holder reads the same state and both commit. `leasehold-pg`'s
//!   `guarded_with_hook` (`leasehold_pg::sqlx::guarded_with_hook` on sqlx)
//!   runs a hook of yours there, after your work returned `Ok` and inside
//!   the commit's shield:
//!
//!   ```no_run
//!   use leasehold_chaos::{Call, Outcome};
//!   use leasehold_pg::{Error, GuardOptions, Guarded, tokio_postgres::Client};
//!
//!   /// A debit of `call.amount` from `call.resource`'s balance, guarded,
//!   /// with the pause point just before the commit.
//!   async fn debit(db: &mut Client, call: Call<'_>) -> Outcome {
//!       let Some(lease) = call.lease else {
//!           return Outcome::NotWritten("no lease".into());
//!       };
//!       let done = leasehold_pg::guarded_with_hook(
//!           db,
//!           lease,
//!           &GuardOptions::default(),
//!           async |tx| {
//!               tx.execute(
//!                   "UPDATE accounts SET balance = balance - $1 WHERE name = $2",
//!                   &[&call.amount, &call.resource],
//!               )
//!               .await?;
//!               Ok::<_, Error>(())
//!           },
//!           async || call.pause_point().await,
//!       )
//!       .await;
//!       match done {
//!           Ok(Guarded::Committed(())) => Outcome::Committed,
//!           Ok(Guarded::Refused { .. }) => Outcome::Refused,
//!           // Stopped by the watchdog before the commit: rolled back.
//!           Ok(Guarded::Lost(_)) => Outcome::Stopped,
//!           Ok(_) => Outcome::Unknown("an outcome this path does not know".into()),
//!           Err(err @ Error::CommitUnknown(_)) => Outcome::Unknown(err.to_string()),
//!           Err(err) => Outcome::NotWritten(err.to_string()),
//!       }
//!   }
//!   ```
//!
//!   The hook borrows `call` for as long as the call runs; nothing needs
//!   to be `'static`. `guarded` runs your work under the lease's watchdog
//!   (and starts it, with [`Harness::watchdog`] off too), so no
//!   [`Call::run`] is needed around it. A pause there longer than the
//!   guard's idle bound (the lease's TTL, at least 1 s) has the server end
//!   the paused holder's session: nothing written (`SessionEnded`, or
//!   `CommitUnknown` when the woken client had not read the close yet,
//!   which the checker accepts either way). In a transaction of your own,
//!   the same place is
//!   `lease.shield(async { call.pause_point().await; tx.commit().await })`,
//!   as in the `examples/job-runner` crate.
//!
//!   Picture: `docs/pause-point-guard.png` in the repository (the
//!   job-runner's guarded `run_next` on PostgreSQL). `w0.t2` froze just
//!   before its commit, with the guard's row lock; `w0.t1` took the lock
//!   at 842 ms and its transaction (the thin line from 842 ms) waited on
//!   that row lock; `w0.t2` woke, its commit landed (it had passed the
//!   guard while its lease was valid) and its lease was found lost; then
//!   `w0.t1`'s guard saw the newer fence and its commit landed 2.6 ms later.
//!   Nothing refused, nothing lost: the writes were serialised. What this
//!   placement tests: that a write already past your check cannot be
//!   overtaken by a newer holder's (the guard's row lock), which no check
//!   before the commit can show.
//! - **Before the guard**: only that the guard refuses a stale token, the
//!   easy case.
//! - **Nowhere**: the holder-pause fault does nothing (a control without a
//!   pause point catches nothing, and the run says so).
//!
//! # State of each caller's own
//!
//! A caller of your service keeps things between requests: a database
//! connection, a prepared statement, a client. [`Harness::run_with`] runs
//! a setup once per caller, on the caller's own thread and runtime, and
//! gives the write that caller's state with each call; every setup ends
//! before the run starts, so a connection's authentication is never
//! inside a caller's first lease (where, with a short TTL, it would cost
//! the lease) and never part of the run's clock or faults.
//!
//! # On your own infrastructure
//!
//! The [`Lab`] can stand in front of your own Redis over TLS
//! (`rediss://` with [`LabOptions::tls`](crate::LabOptions::tls): a CA, a
//! client certificate), as an ACL user of yours; build the callers'
//! locker from [`Lab::client`]. Against your Redis the lab sends only the
//! harness's documented ACL ([`ACL_RULES`](crate::ACL_RULES), the lock
//! user's, plus per fault [`Fault::needs_commands`], at most
//! [`HARNESS_ACL_RULES`](crate::HARNESS_ACL_RULES)), and [`Harness::run`]
//! checks them before anything runs ([`Lab::check_fault`]): a user who
//! lacks one gets [`LabError::Permission`]
//! naming the command. The fault proxy's port
//! ([`LabOptions::proxy_port`](crate::LabOptions::proxy_port)) and the
//! host name the callers dial
//! ([`LabOptions::proxy_host`](crate::LabOptions::proxy_host), which the
//! certificate must name) can be chosen, or the proxy left out
//! ([`LabOptions::proxy`](crate::LabOptions::proxy)`(false)`: the network
//! faults are refused). The faults that need the Redis process run on
//! throwaway servers started with your configuration
//! ([`LabOptions::redis_options`](crate::LabOptions::redis_options): TLS
//! with client certificates, a password, persistence). The harness never
//! connects to your PostgreSQL: your write does, with your TLS settings
//! (a throwaway one for the PostgreSQL faults can run TLS too:
//! `PostgresServer::start_tls` in `leasehold-testkit`).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant, SystemTime};

use leasehold::CancellationToken;

use crate::callers::{Call, Lock, Stall, lock_key};
use crate::check::{RunCheck, check};
use crate::fault::Fault;
use crate::history::{Event, Kind};
use crate::isolated::{self, CallerFailure};
use crate::lab::{Lab, LabError, run_nemesis};
use crate::leaders::{self, Candidate};
use crate::outcome::{Outcome, STOPPED, Writes};
use crate::recorder::Recorder;
use crate::schedule::schedule;
use crate::timeline;
pub use crate::verdicts::ControlVerdict;
use crate::verdicts::Verdict;

/// Which negative control a [`Harness`] runs before your write path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum NegativeControl {
    /// The harness's own blind read-modify-write of an in-memory counter,
    /// under the same lock and settings (the default).
    #[default]
    Builtin,
    /// None: the report says that no control ran, and
    /// [`RunReport::holds`] is the check alone. For a control of your own
    /// ([`RunReport::with_control`]) or a quick local loop.
    Off,
}

/// What went wrong running the harness (a violation is not an error: see
/// [`RunReport::holds`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HarnessError {
    /// A fault could not be injected: the run would not mean what it says.
    #[error("the lab could not inject a fault")]
    Lab(#[from] LabError),
    /// A caller's thread or runtime could not be started.
    #[error("could not start a caller thread")]
    Runtime(#[source] std::io::Error),
    /// [`Harness::run_leaders`] was given [`Lock::none`]: an election
    /// needs a lock.
    #[error("a leader run needs a lock: Lock::none was given")]
    NoLock,
    /// A caller panicked: in your write path, or taking the lock.
    #[error("a caller panicked (the write path or the lock)")]
    CallerPanicked,
    /// The run is too short for one window of its fault (a window lasts
    /// three TTLs, at least 300 ms, starts after a quarter of the run and
    /// is followed by a quiet gap of four TTLs, at least 1 s): it would
    /// inject nothing and say nothing. Lengthen the run or shorten the TTL.
    #[error("a {duration:?} run with a {ttl:?} ttl has no window for fault {fault}")]
    NoFaultWindow {
        /// The fault asked for.
        fault: Fault,
        /// The run's duration.
        duration: Duration,
        /// The lease TTL.
        ttl: Duration,
    },
}

impl From<CallerFailure> for HarnessError {
    fn from(failure: CallerFailure) -> HarnessError {
        match failure {
            CallerFailure::Runtime(err) => HarnessError::Runtime(err),
            CallerFailure::Panicked => HarnessError::CallerPanicked,
        }
    }
}

/// How long the built-in control's read takes (a database round trip).
const CONTROL_READ: Duration = Duration::from_millis(1);

/// One run of a workload under one fault schedule, in this process.
///
/// Defaults: 8 callers, a 100 ms TTL, a 1 s acquire wait, no watchdog,
/// 5 s, seed 1, no fault, one resource `account:1` with an initial value
/// of 1 000 000, amounts 1 to 9, the built-in negative control.
#[derive(Debug, Clone)]
#[must_use]
pub struct Harness {
    mode: String,
    callers: u32,
    ttl: Duration,
    wait: Duration,
    watchdog: bool,
    duration: Duration,
    seed: u64,
    fault: Fault,
    control: bool,
    negative: NegativeControl,
    resources: Vec<(String, i64)>,
    amounts: std::ops::RangeInclusive<i64>,
    writes_per_lease: u32,
}

impl Harness {
    /// A harness for a mode named `mode` (a label in the report, e.g.
    /// `my-transfer`).
    pub fn new(mode: impl Into<String>) -> Harness {
        Harness {
            mode: mode.into(),
            callers: 8,
            ttl: Duration::from_millis(100),
            wait: Duration::from_secs(1),
            watchdog: false,
            duration: Duration::from_secs(5),
            seed: 1,
            fault: Fault::None,
            control: false,
            negative: NegativeControl::Builtin,
            resources: vec![("account:1".to_owned(), 1_000_000)],
            amounts: 1..=9,
            writes_per_lease: 1,
        }
    }

    /// How many concurrent callers (each on its own thread). Defaults to 8.
    pub fn callers(mut self, n: u32) -> Self {
        self.callers = n.max(1);
        self
    }

    /// The lease TTL (the tutorial's Step 6 uses 1 ms). Defaults to 100 ms.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long an acquire waits for the lock. Defaults to 1 s.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Whether each lease has a watchdog that refreshes it, and stops the
    /// work your path runs under [`Call::run`] when the lease is lost.
    /// Defaults to off.
    pub fn watchdog(mut self, on: bool) -> Self {
        self.watchdog = on;
        self
    }

    /// How long the callers run (the negative control runs as long again,
    /// first). Defaults to 5 s.
    pub fn duration(mut self, duration: Duration) -> Self {
        self.duration = duration;
        self
    }

    /// The seed of the workload and the fault schedule. Defaults to 1.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// The fault to inject (its seeded schedule). Defaults to none.
    pub fn fault(mut self, fault: Fault) -> Self {
        self.fault = fault;
        self
    }

    /// Marks this run as a negative control itself: a write path expected
    /// to break under the fault (then no other control runs, and
    /// [`RunReport::caught`] is what it is for). Defaults to false.
    pub fn control(mut self, control: bool) -> Self {
        self.control = control;
        self
    }

    /// Which negative control runs before your write path. Defaults to
    /// [`NegativeControl::Builtin`].
    pub fn negative_control(mut self, negative: NegativeControl) -> Self {
        self.negative = negative;
        self
    }

    /// The resources the callers write and their initial values (the
    /// history's header; your invariant check decides what is right).
    /// Defaults to `account:1` at 1 000 000.
    pub fn resources(mut self, resources: Vec<(String, i64)>) -> Self {
        self.resources = resources;
        self
    }

    /// The amounts drawn for each write ([`Call::amount`]). Defaults to 1
    /// to 9.
    pub fn amounts(mut self, amounts: std::ops::RangeInclusive<i64>) -> Self {
        self.amounts = amounts;
        self
    }

    /// Each lease a **term** of up to `writes` writes on its resource, as a
    /// leader holds one lease for many jobs: a pause (the holder-pause
    /// fault stalls a caller at its [`Call::pause_point`]) or a fault then
    /// falls inside a term, and a holder that wakes up writes again with
    /// its old lease until it learns the lease is lost. A term ends early
    /// when the lease is found lost or a write comes back
    /// [`Outcome::Refused`] (the caller then marks the lease superseded,
    /// [`Lease::mark_superseded`](leasehold::Lease::mark_superseded), as a
    /// leader must). The negative control runs in terms too.
    ///
    /// Defaults to 1: a lock per write. 0 counts as 1.
    pub fn term(mut self, writes: u32) -> Self {
        self.writes_per_lease = writes.max(1);
        self
    }

    /// Runs the negative control (unless off, or this run is one), then
    /// the callers with `lock` against your `write` for the duration, under
    /// the fault's schedule on `lab`; then asks `check_state` for your
    /// final state, given what the writes reported ([`Writes`]), and checks
    /// the whole history.
    ///
    /// `write` answers each [`Call`] with an [`Outcome`]; it runs on the
    /// callers' own threads (so it is `Send + Sync + 'static`: share your
    /// state through an `Arc`), but the futures it returns need not be
    /// `Send`. Call [`Call::pause_point`] between the read and the write,
    /// and run the work under [`Call::run`] to let the watchdog stop it.
    ///
    /// `check_state` returns one event per resource of
    /// [`resources`](Self::resources): [`Kind::Final`] (a balance and its
    /// ledger, checked by the harness) or [`Kind::ResourceCheck`] (your own
    /// invariant, e.g. [`Writes::check_counter`]); a resource with neither
    /// is a violation.
    ///
    /// # Errors
    /// [`HarnessError::Lab`] when a fault could not be injected,
    /// [`HarnessError::CallerPanicked`] when the write path panicked,
    /// [`HarnessError::Runtime`] when a caller's thread could not start.
    /// Violations are not errors: see [`RunReport::holds`].
    pub async fn run<W, C>(
        &self,
        lab: &Lab,
        lock: &Lock,
        write: W,
        check_state: C,
    ) -> Result<RunReport, HarnessError>
    where
        W: AsyncFn(Call<'_>) -> Outcome + Send + Sync + 'static,
        C: AsyncFnOnce(&Writes) -> Vec<Kind>,
    {
        let write = async move |(): &mut (), call: Call<'_>| write(call).await;
        self.run_with(lab, lock, async |_| (), write, check_state)
            .await
    }

    /// [`run`](Self::run), with state of each caller's own: `setup` runs
    /// once per caller (given its number, from 0), on the caller's own
    /// thread and runtime, and `write` gets that caller's state with each
    /// [`Call`]. Every caller's setup ends before the run starts (before
    /// its first lock, its clock and its first fault), so what a setup
    /// costs is not part of the run.
    ///
    /// What a caller of your service would keep between requests goes
    /// here: its database connection (opened on the caller's runtime, so a
    /// holder pause freezes it too), a prepared statement, a client. A
    /// setup that can fail returns a `Result` and the write answers
    /// [`Outcome::NotWritten`] when it holds an error. The run waits for
    /// every setup, so bound yours (a connect timeout).
    ///
    /// # Errors
    /// As [`run`](Self::run); a setup that panics is
    /// [`HarnessError::CallerPanicked`] (the run does not start).
    pub async fn run_with<S, F, W, C>(
        &self,
        lab: &Lab,
        lock: &Lock,
        setup: F,
        write: W,
        check_state: C,
    ) -> Result<RunReport, HarnessError>
    where
        S: 'static,
        F: AsyncFn(u32) -> S + Send + Sync + 'static,
        W: AsyncFn(&mut S, Call<'_>) -> Outcome + Send + Sync + 'static,
        C: AsyncFnOnce(&Writes) -> Vec<Kind>,
    {
        let control = self.prepare(lab, lock).await?;
        let body = Arc::new(isolated::writer(Arc::new(write)));
        let (recorder, writes) = self.drive(lab, lock, Arc::new(setup), body).await?;
        self.judged(control, recorder, writes, check_state).await
    }

    /// Runs your own leader loop on every caller (see the
    /// [`leaders`] module): the negative control first
    /// (unless off, or this run is one), then `lead` on each caller, given
    /// its state from `setup` and its [`Candidate`] (the lab's lock to
    /// build your [`Election`](leasehold::Election) on, the TTL, the run's
    /// shutdown, the records of its terms and writes), until the run ends
    /// and your loop returns; then asks `check_state` for your final
    /// state and checks the whole history, as [`run`](Self::run) does.
    ///
    /// `lead` is called once per caller; an error it returns is recorded
    /// as the campaign's error and that candidate stops. It must return
    /// once [`Candidate::shutdown`] is cancelled
    /// ([`Election::serve`](leasehold::Election::serve) does).
    ///
    /// The built-in negative control is the harness's own (a lease per
    /// term of [`term`](Self::term) writes, a blind counter): it shows
    /// that the fault and the settings can break a write path without its
    /// check; a control of your own loop with its check removed is
    /// stronger ([`RunReport::with_control`]).
    ///
    /// # Errors
    /// As [`run_with`](Self::run_with); [`HarnessError::NoLock`] for
    /// [`Lock::none`] (an election needs a lock).
    pub async fn run_leaders<S, F, L, C>(
        &self,
        lab: &Lab,
        lock: &Lock,
        setup: F,
        lead: L,
        check_state: C,
    ) -> Result<RunReport, HarnessError>
    where
        S: 'static,
        F: AsyncFn(u32) -> S + Send + Sync + 'static,
        L: AsyncFn(&mut S, &Candidate<'_>) -> leasehold::Result<()> + Send + Sync + 'static,
        C: AsyncFnOnce(&Writes) -> Vec<Kind>,
    {
        if lock.is_none() {
            return Err(HarnessError::NoLock);
        }
        let control = self.prepare(lab, lock).await?;
        let body = Arc::new(leaders::leader(Arc::new(lead)));
        let (recorder, writes) = self.drive(lab, lock, Arc::new(setup), body).await?;
        self.judged(control, recorder, writes, check_state).await
    }

    /// The run's final state from `check_state`, recorded, and the whole
    /// history checked, with `control` as its negative control.
    async fn judged<C>(
        &self,
        control: Option<RunReport>,
        recorder: Recorder,
        writes: Writes,
        check_state: C,
    ) -> Result<RunReport, HarnessError>
    where
        C: AsyncFnOnce(&Writes) -> Vec<Kind>,
    {
        for kind in check_state(&writes).await {
            recorder.record("checker", kind);
        }
        let events = recorder.take();
        let report = RunReport::new(events);
        Ok(match control {
            Some(control) => report.with_control(control),
            None => report,
        })
    }

    /// Checks the settings and the lab, then runs the built-in negative
    /// control unless it is off or this run is one: its report.
    async fn prepare(&self, lab: &Lab, lock: &Lock) -> Result<Option<RunReport>, HarnessError> {
        if self.fault != Fault::None && self.windows(self.callers).is_empty() {
            return Err(HarnessError::NoFaultWindow {
                fault: self.fault,
                duration: self.duration,
                ttl: self.ttl,
            });
        }
        self.check_lab(lab).await?;
        Ok(if self.control || self.negative == NegativeControl::Off {
            None
        } else {
            Some(self.run_builtin_control(lab, lock).await?)
        })
    }

    /// Whether `lab` can inject this run's fault as asked (its servers, the
    /// user's ACL: [`Lab::check_fault`]), before anything runs.
    async fn check_lab(&self, lab: &Lab) -> Result<(), HarnessError> {
        let (lab, fault) = (lab.clone(), self.fault);
        let keys: Vec<String> = self.resources.iter().map(|(r, _)| lock_key(r)).collect();
        tokio::task::spawn_blocking(move || lab.check_fault(fault, &keys))
            .await
            .map_err(|_| LabError::Options("the lab's check did not finish"))??;
        Ok(())
    }

    /// The built-in negative control: a blind read-modify-write of an
    /// in-memory counter per resource, under the same lock and settings.
    async fn run_builtin_control(&self, lab: &Lab, lock: &Lock) -> Result<RunReport, HarnessError> {
        let harness = Harness {
            mode: format!("{}/control", self.mode),
            control: true,
            resources: self.resources.iter().map(|(r, _)| (r.clone(), 0)).collect(),
            ..self.clone()
        };
        let counters: Arc<std::sync::Mutex<std::collections::HashMap<String, i64>>> =
            Arc::default();
        let state = counters.clone();
        let write = async move |call: Call<'_>| {
            let work = async {
                let seen = read_counter(&state, call.resource);
                tokio::time::sleep(CONTROL_READ).await;
                call.pause_point().await;
                state
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .insert(call.resource.to_owned(), seen + 1);
            };
            match call.run(work).await {
                Ok(()) => Outcome::Committed,
                Err(stopped) => stopped.into(),
            }
        };
        let check = async |writes: &Writes| {
            harness
                .resources
                .iter()
                .map(|(r, _)| writes.check_counter(r, 0, read_counter(&counters, r)))
                .collect()
        };
        Box::pin(harness.run(lab, lock, write, check)).await
    }

    /// Starts the callers and waits for their setups; then runs them under
    /// the fault schedule: the history so far and what the writes reported.
    async fn drive<S, F, B>(
        &self,
        lab: &Lab,
        lock: &Lock,
        setup: Arc<F>,
        body: Arc<B>,
    ) -> Result<(Recorder, Writes), HarnessError>
    where
        S: 'static,
        F: AsyncFn(u32) -> S + Send + Sync + 'static,
        B: AsyncFn(isolated::Seat<'_>, &mut S) -> Writes + Send + Sync + 'static,
    {
        let settings = self.callers_of(0, self.callers);
        let stall = Stall::freezing();
        let stop = CancellationToken::new();
        // Stops the callers if this future is dropped mid-run.
        let _stop_on_drop = stop.clone().drop_guard();
        let mut callers = isolated::start(&settings, lock, &stop, &stall, setup, body);
        let ready = callers.ready().await;
        if !ready {
            // A caller failed before the run: stop the others, report it.
            stop.cancel();
            callers.join().await?;
            return Err(HarnessError::CallerPanicked);
        }
        let start = SystemTime::now();
        let t0 = Instant::now();
        let recorder = Recorder::in_memory(start);
        recorder.record("coordinator", self.header());
        // The callers' budget: with it, the errors they were returned are
        // judged (see `check`), as in `leasehold chaos`.
        recorder.record(
            "coordinator",
            Kind::Budget {
                wait_ms: u64::try_from(self.wait.as_millis()).unwrap_or(u64::MAX),
            },
        );
        // Where faults marked from outside go (`RunReport::with_fault_marks`).
        recorder.record_at(
            0,
            "coordinator",
            Kind::WallClock {
                unix_us: crate::recorder::start_to_micros(start),
            },
        );
        let windows = schedule(self.fault, self.seed, self.duration, self.ttl, self.callers);
        let keys: Vec<String> = self.resources.iter().map(|(r, _)| lock_key(r)).collect();
        let stopped = Arc::new(AtomicBool::new(false));
        let nemesis = {
            let (lab, recorder, stall, stopped) = (
                lab.clone(),
                recorder.clone(),
                stall.clone(),
                stopped.clone(),
            );
            std::thread::spawn(move || {
                run_nemesis(&lab, &windows, &keys, &recorder, &stall, t0, &stopped)
            })
        };
        callers.go(&recorder);
        let (writes, ()) = tokio::join!(callers.join(), async {
            tokio::time::sleep(self.duration).await;
            stop.cancel();
        });
        stopped.store(true, std::sync::atomic::Ordering::SeqCst);
        let nemesis = tokio::task::spawn_blocking(move || nemesis.join())
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or(Ok(()));
        let writes = writes?;
        nemesis?;
        Ok((recorder, writes))
    }

    /// The run's header event.
    pub fn header(&self) -> Kind {
        Kind::Run {
            mode: self.mode.clone(),
            fault: self.fault.name().to_owned(),
            seed: self.seed,
            ttl_ms: u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX),
            control: self.control,
            reported_only: false,
            initial: self.resources.clone(),
        }
    }

    /// The callers of worker `worker`, `tasks` of them, with this harness's
    /// settings (for worker processes of your own; [`Harness::run`] runs
    /// its callers on threads of its own).
    pub fn callers_of(&self, worker: u32, tasks: u32) -> crate::callers::Callers {
        crate::callers::Callers {
            worker,
            tasks,
            resources: self.resources.iter().map(|(r, _)| r.clone()).collect(),
            ttl: self.ttl,
            wait: self.wait,
            watchdog: self.watchdog,
            amounts: self.amounts.clone(),
            seed: self.seed,
            writes_per_lease: self.writes_per_lease,
        }
    }

    /// The fault schedule of this harness for `workers` workers.
    pub fn windows(&self, workers: u32) -> Vec<crate::schedule::Window> {
        schedule(self.fault, self.seed, self.duration, self.ttl, workers)
    }

    /// The lock keys of the resources.
    pub fn lock_keys(&self) -> Vec<String> {
        self.resources.iter().map(|(r, _)| lock_key(r)).collect()
    }

    /// The run's duration.
    pub fn run_duration(&self) -> Duration {
        self.duration
    }
}

fn read_counter(
    counters: &std::sync::Mutex<std::collections::HashMap<String, i64>>,
    resource: &str,
) -> i64 {
    counters
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(resource)
        .copied()
        .unwrap_or(0)
}

/// A run's history and its check, and its negative control's.
#[derive(Debug, Clone)]
pub struct RunReport {
    /// Every event, sorted by time.
    pub events: Vec<Event>,
    /// What the checker found.
    pub check: RunCheck,
    /// What the negative control showed.
    pub control: ControlVerdict,
    /// The negative control's own report (its history and timeline), when
    /// one ran.
    pub control_report: Option<Box<RunReport>>,
}

impl RunReport {
    /// Checks `events` (no control: [`ControlVerdict::NotRun`]).
    pub fn new(mut events: Vec<Event>) -> RunReport {
        events.sort_by_key(|event| event.at_us);
        let check = check(&events);
        RunReport {
            events,
            check,
            control: ControlVerdict::NotRun,
            control_report: None,
        }
    }

    /// This report with `control` as its negative control: a run of your
    /// write path with its protection removed (`Harness::control(true)`,
    /// and e.g. the fence check skipped), under the same fault and
    /// settings. Replaces the built-in control's verdict.
    pub fn with_control(mut self, control: RunReport) -> RunReport {
        self.control = if control.check.violations.is_empty() {
            ControlVerdict::CaughtNothing {
                writes: control.check.counts.writes.total(),
            }
        } else {
            ControlVerdict::Caught {
                violations: control.check.violations.len(),
            }
        };
        self.control_report = Some(Box::new(control));
        self
    }

    /// What the run showed, given its negative control: held (with how
    /// many double holders were absorbed, and whether the control was
    /// caught or none ran), never broke (nothing exercised), inconclusive
    /// (double holders, but the control caught nothing) or broken; for a
    /// run that is a control itself, caught or missed. The same
    /// [`Verdict`] `leasehold chaos` prints for a matrix cell (see the
    /// [`verdicts`](mod@crate::verdicts) module).
    #[must_use]
    pub fn verdict(&self) -> Verdict {
        self.check.verdict_with(&self.control)
    }

    /// True when no invariant was violated and the run is not
    /// inconclusive ([`verdict`](Self::verdict)): what to assert in CI.
    /// A run whose lock never broke holds (nothing failed, though nothing
    /// was exercised: [`Verdict::NeverBroke`]), so a fault that never
    /// breaks the lock can be asserted too; a run that is a negative
    /// control holds when it caught nothing (assert [`caught`](Self::caught)
    /// instead). The errors returned to the callers are judged apart:
    /// `check.errors.holds()`.
    pub fn holds(&self) -> bool {
        self.check.holds() && !matches!(self.verdict(), Verdict::Inconclusive { .. })
    }

    /// For a run that is a negative control itself: true when its check
    /// found a violation (what a control is for).
    pub fn caught(&self) -> bool {
        !self.check.violations.is_empty()
    }

    /// Writes the watchdog stopped before they wrote ([`Outcome::Stopped`]),
    /// counted among the not-written (`check.counts.writes.failed`).
    pub fn stopped(&self) -> u64 {
        self.events
            .iter()
            .filter(|e| matches!(&e.kind, Kind::Write { detail: Some(d), .. } if d == STOPPED))
            .count() as u64
    }

    /// The verdict in a few lines: the [`verdict`](Self::verdict) (`held:
    /// ...`, `never broke: ...`, `INCONCLUSIVE: ...`, `BROKEN: ...`, for a
    /// control `control caught: ...` or `FAILED: control missed ...`), the
    /// write counts, the violations, the errors returned to the callers,
    /// and what the control showed.
    pub fn summary(&self) -> String {
        let w = &self.check.counts.writes;
        let mut out = format!(
            "{}\n  writes: {} committed, {} refused, {} not written ({} stopped by the watchdog), {} unknown; {} double holders",
            self.verdict(),
            w.accepted,
            w.refused_stale,
            w.failed + w.insufficient,
            self.stopped(),
            w.unknown,
            self.check.overlaps.len(),
        );
        for violation in &self.check.violations {
            out.push_str(&format!("\n  violation: {violation}"));
        }
        if self.check.is_control() && !self.caught() {
            for reason in self.not_caught_because() {
                out.push_str(&format!("\n  not caught: {reason}"));
            }
        }
        out.push_str(&format!("\n  {}", self.check.errors));
        out.push_str(&match &self.control {
            ControlVerdict::NotRun if self.check.is_control() => {
                "\n  this run is a negative control: it must be caught".to_owned()
            }
            ControlVerdict::NotRun => "\n  no negative control ran: this run cannot say whether it could catch a broken write path".to_owned(),
            ControlVerdict::Caught { violations } => format!(
                "\n  negative control: the write path without its check was caught ({violations} violations): the test can detect a broken write path"
            ),
            ControlVerdict::CaughtNothing { writes } => {
                let mut text = format!(
                    "\n  negative control caught NOTHING in {writes} writes: under this fault and these settings a write path without its check breaks no invariant, so double holders here prove nothing"
                );
                let reasons = self
                    .control_report
                    .as_deref()
                    .map(RunReport::not_caught_because)
                    .unwrap_or_default();
                for reason in reasons {
                    text.push_str(&format!("\n  control not caught: {reason}"));
                }
                text
            }
        });
        out
    }

    /// For a run that broke no invariant (a control that was not caught):
    /// what kept its writes right, from its history, most telling first.
    /// A write path without its check can still be safe: something else in
    /// it refused the stale writes (a primary key, a unique constraint, a
    /// conditional update), the watchdog stopped them before they wrote,
    /// they came back unknown (which excuses a lost update), or the lock
    /// never broke where a write was in flight. Empty for a run that
    /// caught something.
    pub fn not_caught_because(&self) -> Vec<String> {
        if self.caught() {
            return Vec::new();
        }
        let w = &self.check.counts.writes;
        let mut reasons = Vec::new();
        if self.check.overlaps.is_empty() {
            reasons.push(
                "no two callers held the lock at once: the fault never broke the lock (use a fault that does: holder-pause with a pause point in the path, key-loss, early-expiry; a shorter TTL; a longer run)"
                    .to_owned(),
            );
        }
        if w.refused_stale > 0 {
            reasons.push(format!(
                "{} writes were refused by the path itself: it still checks something (a fence, a primary key, a unique constraint, a conditional update); a control is the path with every such check removed",
                w.refused_stale
            ));
        }
        let stopped = self.stopped();
        if stopped > 0 {
            reasons.push(format!(
                "the watchdog stopped {stopped} writes before they wrote: a holder that woke past its lease was stopped before its write; to test the database instead, put the pause point just before the commit, inside its shield"
            ));
        }
        if w.unknown > 0 {
            reasons.push(format!(
                "{} writes came back unknown: an unknown write excuses a lost update of its amount",
                w.unknown
            ));
        }
        let failed = (w.failed + w.insufficient).saturating_sub(stopped);
        if failed > 0 {
            reasons.push(format!(
                "{failed} writes failed before they wrote (rolled back, a business rule, an error): a stale holder's write that fails writes nothing wrong"
            ));
        }
        if reasons.is_empty() {
            reasons.push(format!(
                "{} double holders, but no stale write landed between another holder's read and write (no pause point between the read and the write, or none reached during a double holding)",
                self.check.overlaps.len()
            ));
        }
        reasons
    }

    /// The run's timeline: one self-contained HTML page with an SVG.
    pub fn timeline_html(&self) -> String {
        timeline::render_html_judged(&self.events, &self.check, self.verdict())
    }

    /// Writes the history as JSON lines (re-check it with
    /// `leasehold chaos check FILE`).
    ///
    /// # Errors
    /// When writing fails.
    pub fn write_history(
        &self,
        out: impl std::io::Write,
    ) -> Result<(), crate::history::HistoryError> {
        crate::history::write_jsonl(out, &self.events)
    }
}

impl std::fmt::Display for RunReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.summary())
    }
}
