//! The harness against a user's own write path (in memory), under real
//! faults on a throwaway Redis: a blind write is caught with the watchdog
//! on, writes the watchdog stopped count as not written, a check-and-set
//! path holds, a run whose lock never broke says so, a control that
//! catches nothing makes a run with double holders fail, and an error the
//! lock returns to a caller is recorded and judged.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::{Locker, redis};
use leasehold_chaos::{
    Call, ControlVerdict, Fault, Harness, Lab, LabOptions, Lock, NegativeControl, Outcome,
    RunReport, Verdict, Writes,
};

mod common;
use common::account::{account, account_path, final_state};

const MS: Duration = Duration::from_millis(1);

type TestResult = Result<(), Box<dyn std::error::Error>>;

async fn lab() -> Result<Lab, Box<dyn std::error::Error>> {
    Ok(tokio::task::spawn_blocking(|| Lab::start(&LabOptions::default())).await??)
}

async fn lock(lab: &Lab, fenced: bool) -> Result<Lock, Box<dyn std::error::Error>> {
    let client = redis::Client::open(lab.redis_url())?;
    let locker = Locker::builder()
        .command_timeout(Duration::from_millis(500))
        .connect(&client)
        .await?;
    Ok(Lock::new(locker, fenced))
}

/// 6 callers debit one account for 2 s (one fault window) under `harness`'s
/// fault, with the watchdog on (see [`account_path`]).
async fn run_account(
    lab: &Lab,
    harness: Harness,
    checked: bool,
    read: Duration,
) -> Result<RunReport, Box<dyn std::error::Error>> {
    let lock = lock(lab, checked).await?;
    let account = account();
    let state = account.clone();
    let check = async |_: &Writes| final_state(&state);
    Ok(harness
        .callers(6)
        .ttl(Duration::from_millis(40))
        .duration(Duration::from_secs(2))
        .watchdog(true)
        .run(lab, &lock, account_path(account, checked, read), check)
        .await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blind_write_path_is_caught_under_holder_pause_with_the_watchdog_on() -> TestResult {
    let lab = lab().await?;
    let mut caught = 0;
    let mut summaries = Vec::new();
    for seed in 1..=10 {
        let harness = Harness::new("blind")
            .seed(seed)
            .fault(Fault::HolderPause)
            .control(true);
        let report = run_account(&lab, harness, false, MS).await?;
        assert!(report.check.header.as_ref().is_some_and(|h| h.control));
        if report.caught() {
            caught += 1;
        }
        summaries.push(report.summary());
    }
    eprintln!("blind path under holder-pause, watchdog on: caught in {caught} of 10 runs");
    assert!(caught >= 9, "caught in {caught} of 10 runs: {summaries:#?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_and_set_path_holds_under_holder_pause_in_every_run() -> TestResult {
    let lab = lab().await?;
    for seed in 1..=4 {
        let harness = Harness::new("cas")
            .seed(seed)
            .fault(Fault::HolderPause)
            .negative_control(NegativeControl::Off);
        let report = run_account(&lab, harness, true, MS).await?;
        assert!(report.holds(), "seed {seed}: {}", report.summary());
        assert!(report.check.counts.writes.accepted > 0);
        assert!(
            report.check.counts.writes.refused_stale > 0,
            "seed {seed}: the paused holder was not refused: {}",
            report.summary()
        );
        assert_eq!(report.control, ControlVerdict::NotRun);
        // Held, and it says that no control ran.
        assert!(
            matches!(
                report.verdict(),
                Verdict::Held { double_holders, control_caught: false } if double_holders > 0
            ),
            "seed {seed}: {}",
            report.summary()
        );
        assert!(report.summary().contains("no control ran"));
        assert!(report.summary().contains("no negative control ran"));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_the_watchdog_stopped_count_as_not_written_and_the_control_catches() -> TestResult {
    let lab = lab().await?;
    let harness = Harness::new("cas").seed(3).fault(Fault::KeyLoss);
    // A 30 ms read: the watchdog refreshes (every 13 ms) while a write is
    // in it, and finds the key deleted.
    let report = run_account(&lab, harness, true, 30 * MS).await?;
    let writes = &report.check.counts.writes;
    assert!(
        report.stopped() > 0,
        "nothing stopped: {}",
        report.summary()
    );
    assert_eq!(writes.unknown, 0, "{}", report.summary());
    assert!(writes.failed >= report.stopped());
    assert!(
        matches!(report.control, ControlVerdict::Caught { .. }),
        "{}",
        report.summary()
    );
    assert!(report.holds(), "{}", report.summary());
    assert!(
        matches!(
            report.verdict(),
            Verdict::Held {
                control_caught: true,
                ..
            }
        ),
        "{}",
        report.summary()
    );
    assert!(report.summary().starts_with("held: "));
    let html = report.timeline_html();
    assert!(html.contains("key-loss"), "the fault is not drawn");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_lock_never_broke_holds_and_says_nothing_was_exercised() -> TestResult {
    let lab = lab().await?;
    // No fault and a TTL far longer than a write: no lease ever fails, so
    // not even a blind path can lose a write, and the path's check is
    // never exercised. Not a failure (a fault that never breaks the lock
    // is asserted this way), and the summary says what was not shown.
    let lock = lock(&lab, true).await?;
    let account = account();
    let state = account.clone();
    let check = async |_: &Writes| final_state(&state);
    let report = Harness::new("cas")
        .callers(4)
        .ttl(Duration::from_secs(5))
        .duration(Duration::from_millis(500))
        .run(&lab, &lock, account_path(account, true, MS), check)
        .await?;
    assert!(report.check.overlaps.is_empty(), "{}", report.summary());
    assert!(
        matches!(report.control, ControlVerdict::CaughtNothing { writes } if writes > 0),
        "{:?}",
        report.control
    );
    assert_eq!(report.verdict(), Verdict::NeverBroke);
    assert!(report.holds(), "{}", report.summary());
    let summary = report.summary();
    assert!(
        summary.starts_with("never broke: no double holder, nothing exercised"),
        "{summary}"
    );
    assert!(summary.contains("caught NOTHING"), "{summary}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn double_holders_with_a_control_that_caught_nothing_are_inconclusive() -> TestResult {
    let lab = lab().await?;
    // The check-and-set path under holder pauses has double holders and
    // absorbs them; its control here is one that could not fail (the same
    // path, checked, under no fault), so the run proves nothing.
    let harness = Harness::new("cas")
        .seed(1)
        .fault(Fault::HolderPause)
        .negative_control(NegativeControl::Off);
    let report = run_account(&lab, harness, true, MS).await?;
    let blunt = Harness::new("cas/blunt-control")
        .control(true)
        .duration(Duration::from_millis(300));
    let control = run_account(&lab, blunt, true, MS).await?;
    assert!(!control.caught(), "{}", control.summary());
    let report = report.with_control(control);
    let double_holders = report.check.overlaps.len() as u64;
    assert!(double_holders > 0, "{}", report.summary());
    assert!(report.check.holds(), "{}", report.summary());
    assert_eq!(report.verdict(), Verdict::Inconclusive { double_holders });
    assert!(!report.holds(), "an inconclusive run passed");
    let summary = report.summary();
    assert!(summary.starts_with("INCONCLUSIVE: "), "{summary}");
    assert!(summary.contains("caught NOTHING"), "{summary}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_counter_is_checked_by_its_own_invariant() -> TestResult {
    let lab = lab().await?;
    let lock = lock(&lab, false).await?;
    // A job counter per queue, incremented blindly: no balance, no ledger.
    let counters = Arc::new(Mutex::new([0i64; 2]));
    let state = counters.clone();
    let write = async move |call: Call<'_>| {
        let queue = usize::from(call.resource == "jobs:b");
        let seen = state.lock().expect("counters")[queue];
        call.pause_point().await;
        state.lock().expect("counters")[queue] = seen + 1;
        Outcome::Committed
    };
    let check = async |writes: &Writes| {
        let c = *counters.lock().expect("counters");
        vec![
            writes.check_counter("jobs:a", 0, c[0]),
            writes.check_counter("jobs:b", 0, c[1]),
        ]
    };
    let report = Harness::new("jobs")
        .callers(4)
        .ttl(Duration::from_millis(40))
        .duration(Duration::from_secs(2))
        .seed(2)
        .fault(Fault::HolderPause)
        .resources(vec![("jobs:a".to_owned(), 0), ("jobs:b".to_owned(), 0)])
        .control(true)
        .run(&lab, &lock, write, check)
        .await?;
    assert!(
        report.check.violations.iter().all(|v| matches!(
            v,
            leasehold_chaos::Violation::InvariantFailed { detail, .. } if detail.contains("lost")
        )),
        "{}",
        report.summary()
    );
    assert!(report.caught(), "{}", report.summary());
    Ok(())
}

#[test]
fn a_resource_judged_by_its_own_invariant_needs_no_balance() {
    use leasehold_chaos::{Event, Violation, check};
    let event = |at_us, actor: &str, kind| Event {
        at_us,
        actor: actor.to_owned(),
        kind,
    };
    let header = Harness::new("jobs")
        .resources(vec![("jobs:a".to_owned(), 0), ("jobs:b".to_owned(), 0)])
        .header();
    let writes = Writes::default();
    let history = |a_ok: bool| {
        vec![
            event(0, "coordinator", header.clone()),
            event(
                1,
                "checker",
                writes.check("jobs:a", a_ok, "counter 3: 3 committed"),
            ),
            event(2, "checker", writes.check_counter("jobs:b", 0, 0)),
        ]
    };
    let holds = check(&history(true));
    assert!(holds.holds(), "{:?}", holds.violations);
    let broken = check(&history(false));
    assert!(
        matches!(
            broken.violations.as_slice(),
            [Violation::InvariantFailed { detail, .. }] if detail.starts_with("jobs:a: ")
        ),
        "{:?}",
        broken.violations
    );
    // A resource with neither a final state nor its own check is missing.
    let missing = check(&history(true)[..2]);
    assert!(matches!(
        missing.violations.as_slice(),
        [Violation::MissingFinal { resource }] if resource == "jobs:b"
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_the_lock_returns_to_a_caller_is_recorded_and_fails_the_errors_figure()
-> TestResult {
    let lab = lab().await?;
    // A lock over a Redis that is gone for the whole run (killed after the
    // locker connected): every acquire fails with an error that is not
    // `NotAcquired`, and no fault window excuses it.
    let mut gone = tokio::task::spawn_blocking(leasehold_testkit::RedisServer::start).await??;
    let client = redis::Client::open(gone.url())?;
    let locker = Locker::builder()
        .command_timeout(Duration::from_millis(100))
        .connect(&client)
        .await?;
    gone.kill()?;
    let lock = Lock::new(locker, true);
    let write = async |_call: Call<'_>| Outcome::Committed;
    let report = Harness::new("unreachable")
        .callers(2)
        .wait(Duration::from_millis(200))
        .duration(Duration::from_millis(600))
        .negative_control(NegativeControl::Off)
        .run(&lab, &lock, write, async |writes: &Writes| {
            vec![writes.check_counter("account:1", 0, 0)]
        })
        .await?;
    let errors = &report.check.errors;
    assert!(errors.acquire > 0, "{}", report.summary());
    assert!(errors.judged, "{}", report.summary());
    assert!(!errors.holds(), "{}", report.summary());
    assert!(
        report.events.iter().any(|e| matches!(
            &e.kind,
            leasehold_chaos::Kind::CallerError { call, .. } if call == "acquire"
        )),
        "no acquire error in the history"
    );
    let summary = report.summary();
    assert!(
        summary.contains("errors to callers (acquire/release/refresh) ")
            && summary.contains(": FAILED"),
        "{summary}"
    );
    Ok(())
}

/// One caller's own state, as `run_with`'s setup makes it.
struct CallerState {
    caller: u32,
    thread: std::thread::ThreadId,
    calls: u64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_caller_sets_up_once_on_its_own_thread_before_the_run() -> TestResult {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
    const CALLERS: u32 = 4;
    let lab = lab().await?;
    let lock = lock(&lab, false).await?;
    let setups = Arc::new(Mutex::new(Vec::new()));
    let done = Arc::new(AtomicU32::new(0));
    let early = Arc::new(AtomicBool::new(false));
    let (wrong_thread, calls) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let seen: Arc<Mutex<HashMap<u32, u64>>> = Arc::default();
    let setup = {
        let (setups, done) = (setups.clone(), done.clone());
        async move |caller: u32| {
            // A slow setup: without the start waiting for every setup, the
            // other callers would write before this one is ready.
            if caller == 0 {
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            setups.lock().expect("setups").push(caller);
            done.fetch_add(1, Ordering::SeqCst);
            CallerState {
                caller,
                thread: std::thread::current().id(),
                calls: 0,
            }
        }
    };
    let write = {
        let (done, early, wrong_thread, calls, seen) = (
            done.clone(),
            early.clone(),
            wrong_thread.clone(),
            calls.clone(),
            seen.clone(),
        );
        async move |state: &mut CallerState, _call: Call<'_>| {
            if done.load(Ordering::SeqCst) < CALLERS {
                early.store(true, Ordering::SeqCst);
            }
            if state.thread != std::thread::current().id() {
                wrong_thread.store(true, Ordering::SeqCst);
            }
            state.calls += 1;
            calls.fetch_add(1, Ordering::SeqCst);
            seen.lock().expect("seen").insert(state.caller, state.calls);
            Outcome::NotWritten("counting calls".into())
        }
    };
    let report = Harness::new("setup")
        .callers(CALLERS)
        .duration(Duration::from_secs(1))
        .negative_control(NegativeControl::Off)
        .run_with(&lab, &lock, setup, write, async |writes: &Writes| {
            vec![writes.check_counter("account:1", 0, 0)]
        })
        .await?;
    let mut setups = setups.lock().expect("setups").clone();
    setups.sort_unstable();
    assert_eq!(setups, (0..CALLERS).collect::<Vec<_>>());
    assert!(
        !early.load(Ordering::SeqCst),
        "a write ran before every setup had ended"
    );
    assert!(
        !wrong_thread.load(Ordering::SeqCst),
        "a write ran off its caller's thread"
    );
    let seen = seen.lock().expect("seen").clone();
    let total = calls.load(Ordering::SeqCst);
    assert!(total > 0, "{}", report.summary());
    assert_eq!(
        seen.values().sum::<u64>(),
        total,
        "a caller's state did not last: {seen:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_setup_that_panics_stops_the_run_before_it_starts() -> TestResult {
    let lab = lab().await?;
    let lock = lock(&lab, false).await?;
    let setup = async |caller: u32| {
        assert_ne!(caller, 2, "the database is down");
    };
    let write = async |(): &mut (), _call: Call<'_>| Outcome::Committed;
    let outcome = Harness::new("setup-panics")
        .callers(4)
        .duration(Duration::from_secs(30))
        .negative_control(NegativeControl::Off)
        .run_with(&lab, &lock, setup, write, async |_: &Writes| Vec::new())
        .await;
    assert!(
        matches!(outcome, Err(leasehold_chaos::HarnessError::CallerPanicked)),
        "{:?}",
        outcome.map(|r| r.summary())
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_too_short_for_its_fault_is_refused_before_it_starts() -> TestResult {
    let lab = lab().await?;
    let harness = Harness::new("short")
        .ttl(Duration::from_secs(1))
        .duration(Duration::from_secs(4))
        .fault(Fault::RedisRestart);
    let account = account();
    let state = account.clone();
    let check = async |_: &Writes| final_state(&state);
    let refused = harness
        .run(
            &lab,
            &lock(&lab, true).await?,
            account_path(account, true, MS),
            check,
        )
        .await;
    assert!(
        matches!(
            refused,
            Err(leasehold_chaos::HarnessError::NoFaultWindow { .. })
        ),
        "{refused:?}"
    );
    Ok(())
}

/// In terms, a caller keeps one lease for many writes, and its term ends
/// at the first write the path refused (a newer holder has written): it
/// never writes again under that lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_term_keeps_one_lease_for_many_writes_and_ends_at_a_refusal() -> TestResult {
    use leasehold::HolderId;
    use leasehold_chaos::{Kind, WriteOutcome};
    let lab = lab().await?;
    // An in-memory guard, as leasehold-pg's: a token above the last
    // writer's, or equal to it from the same holder.
    let last: Arc<Mutex<(u64, Option<HolderId>, i64)>> = Arc::new(Mutex::new((0, None, 0)));
    let state = last.clone();
    let write = async move |call: Call<'_>| {
        let Some(lease) = call.lease else {
            return Outcome::NotWritten("no lease".into());
        };
        let work = async {
            let (token, holder) = (call.fence().map_or(0, |f| f.get()), lease.holder());
            let seen = {
                let mut s = state.lock().expect("state");
                if token < s.0 || (token == s.0 && s.1 != Some(holder)) {
                    return Outcome::Refused;
                }
                (s.0, s.1) = (token, Some(holder));
                s.2
            };
            call.pause_point().await;
            let mut s = state.lock().expect("state");
            if s.0 != token || s.1 != Some(holder) {
                return Outcome::Refused;
            }
            s.2 = seen + 1;
            Outcome::Committed
        };
        match call.run(work).await {
            Ok(outcome) => outcome,
            Err(stopped) => stopped.into(),
        }
    };
    let check = async |writes: &Writes| {
        let value = last.lock().expect("state").2;
        vec![writes.check_counter("account:1", 0, value)]
    };
    let report = Harness::new("terms")
        .seed(3)
        .callers(6)
        .ttl(Duration::from_millis(40))
        .duration(Duration::from_secs(2))
        .watchdog(true)
        .fault(Fault::HolderPause)
        .negative_control(NegativeControl::Off)
        .resources(vec![("account:1".to_owned(), 0)])
        .term(20)
        .run(&lab, &lock(&lab, true).await?, write, check)
        .await?;
    assert!(report.holds(), "{}", report.summary());
    let (mut leases, mut writes, mut refused) = (0, 0, 0);
    // Per actor: whether its current lease has seen a refused write.
    let mut after_refusal = std::collections::HashMap::<&str, bool>::new();
    for event in &report.events {
        match &event.kind {
            Kind::Acquired { .. } => {
                leases += 1;
                after_refusal.insert(&event.actor, false);
            }
            Kind::Write { outcome, .. } => {
                writes += 1;
                let ended = after_refusal.entry(&event.actor).or_default();
                assert!(
                    !*ended,
                    "{} wrote after a refusal in the same term",
                    event.actor
                );
                if *outcome == WriteOutcome::RefusedStale {
                    refused += 1;
                    *ended = true;
                }
            }
            _ => {}
        }
    }
    assert!(writes > 5 * leases, "{writes} writes under {leases} leases");
    assert!(refused > 0, "no refusal exercised: {}", report.summary());
    Ok(())
}
