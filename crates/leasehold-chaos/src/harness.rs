//! The harness for your own write path: N callers, any TTL and lock, your
//! write and your invariant, under the same faults and with the same
//! report and timeline as `leasehold chaos`.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant, SystemTime};

use leasehold::CancellationToken;

use crate::callers::{Call, Callers, Lock, Stall, Written, lock_key};
use crate::check::{RunCheck, check};
use crate::fault::{Fault, schedule};
use crate::history::{Event, Kind};
use crate::lab::{Lab, LabError, run_nemesis};
use crate::recorder::Recorder;
use crate::timeline;

/// One run of a workload under one fault schedule, in this process.
///
/// Defaults: 8 callers, a 100 ms TTL, a 1 s acquire wait, no watchdog,
/// 5 s, seed 1, no fault, one resource `account:1` with an initial value
/// of 1 000 000, amounts 1 to 9.
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
    resources: Vec<(String, i64)>,
    amounts: std::ops::RangeInclusive<i64>,
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
            resources: vec![("account:1".to_owned(), 1_000_000)],
            amounts: 1..=9,
        }
    }

    /// How many concurrent callers. Defaults to 8.
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

    /// Whether the watchdog refreshes leases and stops writes whose lease
    /// was lost. Defaults to off.
    pub fn watchdog(mut self, on: bool) -> Self {
        self.watchdog = on;
        self
    }

    /// How long the callers run. Defaults to 5 s.
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

    /// Marks the run a negative control: a write path expected to break
    /// under the fault. Defaults to false.
    pub fn control(mut self, control: bool) -> Self {
        self.control = control;
        self
    }

    /// The resources the callers write and their initial values (the
    /// history's header; your invariant check decides what is right).
    /// Defaults to `account:1` at 1 000 000.
    pub fn resources(mut self, resources: Vec<(String, i64)>) -> Self {
        self.resources = resources;
        self
    }

    /// The amounts drawn for each write. Defaults to 1 to 9.
    pub fn amounts(mut self, amounts: std::ops::RangeInclusive<i64>) -> Self {
        self.amounts = amounts;
        self
    }

    /// Runs the callers with `lock` against your `write` for the duration,
    /// under the fault's schedule on `lab`, then asks `check` for the final
    /// state ([`Kind::Final`] per resource, or [`Kind::Invariant`]) and
    /// checks the whole history.
    ///
    /// `write` runs concurrently on the current task (it need not be
    /// `Send`); call [`Call::pause_point`] between its read and its write so
    /// the holder-pause fault can stall it there.
    ///
    /// # Errors
    /// [`LabError`] when a fault could not be injected (the run would not
    /// mean what it says). Violations are not errors: see
    /// [`RunReport::holds`].
    pub async fn run<W, C>(
        &self,
        lab: &Lab,
        lock: &Lock,
        write: W,
        check_state: C,
    ) -> Result<RunReport, LabError>
    where
        W: AsyncFn(Call<'_>) -> Written,
        C: AsyncFnOnce() -> Vec<Kind>,
    {
        let start = SystemTime::now();
        let t0 = Instant::now();
        let recorder = Recorder::in_memory(start);
        recorder.record("coordinator", self.header());
        let windows = schedule(self.fault, self.seed, self.duration, self.ttl, self.callers);
        let keys: Vec<String> = self.resources.iter().map(|(r, _)| lock_key(r)).collect();
        let stall = Stall::default();
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
        let stop = CancellationToken::new();
        let callers = self.callers_of(0, self.callers);
        tokio::join!(callers.run(lock, &recorder, &stop, &stall, &write), async {
            tokio::time::sleep(self.duration).await;
            stop.cancel();
        });
        stopped.store(true, std::sync::atomic::Ordering::SeqCst);
        let nemesis = tokio::task::spawn_blocking(move || nemesis.join())
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or(Ok(()));
        for kind in check_state().await {
            recorder.record("checker", kind);
        }
        nemesis?;
        Ok(RunReport::new(recorder.take()))
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
    /// settings.
    pub fn callers_of(&self, worker: u32, tasks: u32) -> Callers {
        Callers {
            worker,
            tasks,
            resources: self.resources.iter().map(|(r, _)| r.clone()).collect(),
            ttl: self.ttl,
            wait: self.wait,
            watchdog: self.watchdog,
            amounts: self.amounts.clone(),
            seed: self.seed,
        }
    }

    /// The fault schedule of this harness for `workers` workers.
    pub fn windows(&self, workers: u32) -> Vec<crate::fault::Window> {
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

/// A run's history and its check.
#[derive(Debug, Clone)]
pub struct RunReport {
    /// Every event, sorted by time.
    pub events: Vec<Event>,
    /// What the checker found.
    pub check: RunCheck,
}

impl RunReport {
    /// Checks `events`.
    pub fn new(mut events: Vec<Event>) -> RunReport {
        events.sort_by_key(|event| event.at_us);
        let check = check(&events);
        RunReport { events, check }
    }

    /// True when no invariant was violated.
    pub fn holds(&self) -> bool {
        self.check.holds()
    }

    /// The run's timeline: one self-contained HTML page with an SVG.
    pub fn timeline_html(&self) -> String {
        timeline::render_html(&self.events, &self.check)
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
