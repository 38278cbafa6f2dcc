//! The harness against a user's own write path (an in-memory account),
//! under real faults on a throwaway Redis: a blind write is caught, a
//! check-and-set write holds.

use std::sync::Mutex;
use std::time::Duration;

use leasehold::{Locker, redis};
use leasehold_chaos::{
    Call, Fault, Harness, Kind, Lab, LabOptions, Lock, RunReport, WriteOutcome, Written,
};

type TestResult = Result<(), Box<dyn std::error::Error>>;

struct Account {
    balance: i64,
    fence: u64,
    ledger: Vec<i64>,
}

async fn lock(lab: &Lab, fenced: bool) -> Result<Lock, Box<dyn std::error::Error>> {
    let client = redis::Client::open(lab.redis_url())?;
    let locker = Locker::builder()
        .command_timeout(Duration::from_millis(500))
        .connect(&client)
        .await?;
    Ok(Lock::new(locker, fenced))
}

/// Runs 6 callers on one account for 2 s under `fault`; `checked` makes
/// the write a check-and-set on the fence, otherwise it is blind.
async fn run(
    fault: Fault,
    checked: bool,
    seed: u64,
) -> Result<RunReport, Box<dyn std::error::Error>> {
    let lab = tokio::task::spawn_blocking(|| Lab::start(&LabOptions::default())).await??;
    let lock = lock(&lab, checked).await?;
    let account = Mutex::new(Account {
        balance: 1_000_000,
        fence: 0,
        ledger: Vec::new(),
    });
    let write = async |call: Call<'_>| {
        let (balance, seen) = {
            let a = account.lock().expect("account");
            (a.balance, a.fence)
        };
        call.pause_point().await;
        tokio::time::sleep(Duration::from_millis(2)).await;
        let token = call.fence().map_or(0, |f| f.get());
        let mut a = account.lock().expect("account");
        if checked && (a.fence != seen || token <= a.fence) {
            return Written::from(WriteOutcome::RefusedStale);
        }
        a.balance = balance - call.amount;
        a.fence = a.fence.max(token);
        a.ledger.push(call.amount);
        Written::from(WriteOutcome::Accepted)
    };
    let check = async || {
        let a = account.lock().expect("account");
        vec![Kind::Final {
            resource: "account:1".to_owned(),
            balance: a.balance,
            ledger_sum: a.ledger.iter().sum(),
            ledger_rows: a.ledger.len() as u64,
        }]
    };
    Ok(Harness::new(if checked { "cas" } else { "blind" })
        .callers(6)
        .ttl(Duration::from_millis(40))
        .duration(Duration::from_secs(2))
        .seed(seed)
        .fault(fault)
        .control(!checked)
        .run(&lab, &lock, write, check)
        .await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blind_write_path_is_caught_when_the_lock_key_is_deleted() -> TestResult {
    let report = run(Fault::KeyLoss, false, 3).await?;
    assert!(
        !report.check.overlaps.is_empty(),
        "no double holder under key loss"
    );
    assert!(
        !report.holds(),
        "the blind write lost no update: {:?}",
        report.check
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_and_set_write_path_holds_when_the_lock_key_is_deleted() -> TestResult {
    let report = run(Fault::KeyLoss, true, 3).await?;
    assert!(report.holds(), "{:?}", report.check.violations);
    assert!(report.check.counts.writes.accepted > 0);
    assert!(
        report.check.counts.writes.refused_stale > 0,
        "no stale write refused"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_holder_is_refused_by_the_check_and_the_timeline_shows_it() -> TestResult {
    let report = run(Fault::HolderPause, true, 5).await?;
    assert!(report.holds(), "{:?}", report.check.violations);
    let html = report.timeline_html();
    assert!(html.contains("holder-pause"), "the fault is not drawn");
    assert!(
        report
            .events
            .iter()
            .any(|e| matches!(e.kind, Kind::FaultStart { .. }))
    );
    Ok(())
}
