//! The harness driving a user's own leader loop (`Harness::run_leaders`):
//! `Election::serve` with a term's work of many writes, under a holder
//! pause on a throwaway Redis. A checked path holds and its refused
//! leader ends its own term; the same loop with a blind write is caught;
//! the terms, the writes and how each term ended are in the history.

use std::future::pending;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::{Election, Locker, redis};
use leasehold_chaos::{
    Candidate, Fault, Harness, HarnessError, Kind, Lab, LabOptions, Lock, NegativeControl, Outcome,
    RunReport, Writes,
};

mod common;
use common::account::{Account, account, account_path, final_state};

type TestResult = Result<(), Box<dyn std::error::Error>>;

async fn lab() -> Result<Lab, Box<dyn std::error::Error>> {
    Ok(tokio::task::spawn_blocking(|| Lab::start(&LabOptions::default())).await??)
}

async fn lock(lab: &Lab) -> Result<Lock, Box<dyn std::error::Error>> {
    let client = redis::Client::open(lab.redis_url())?;
    let locker = Locker::builder()
        .command_timeout(Duration::from_millis(500))
        .connect(&client)
        .await?;
    Ok(Lock::new(locker, true))
}

/// The user's leader loop: `Election::serve` on the candidate's lock, each
/// term writing the account until it ends; a refused write ends the term
/// (`mark_superseded`, as the `leasehold-pg` guard does itself).
async fn serve_account(
    candidate: &Candidate<'_>,
    account: Arc<Mutex<Account>>,
    checked: bool,
) -> leasehold::Result<()> {
    let election = Election::builder(candidate.lessor(), "ledger")
        .candidate(candidate.actor())
        .ttl(candidate.ttl())
        .budget(candidate.wait())
        .build()?;
    let path = account_path(account, checked, Duration::from_millis(1));
    election
        .serve(candidate.shutdown(), async |term| {
            let record = candidate.term(term);
            loop {
                match record.write(&path).await {
                    Outcome::Refused => {
                        term.mark_superseded();
                        return pending().await;
                    }
                    // The term is lost: `serve` ends the work.
                    Outcome::Stopped => return pending().await,
                    _ => {}
                }
            }
        })
        .await?;
    Ok(())
}

/// 3 candidates, a 100 ms term, 2 s, one holder-pause window.
async fn run(lab: &Lab, harness: Harness, checked: bool) -> Result<RunReport, HarnessError> {
    let lock = lock(lab).await.map_err(|_| HarnessError::CallerPanicked)?;
    let account = account();
    let (state, written) = (account.clone(), account.clone());
    harness
        .callers(3)
        .ttl(Duration::from_millis(100))
        .wait(Duration::from_secs(1))
        .duration(Duration::from_secs(2))
        .fault(Fault::HolderPause)
        .run_leaders(
            lab,
            &lock,
            async |_| (),
            async move |(): &mut (), candidate: &Candidate<'_>| {
                serve_account(candidate, written.clone(), checked).await
            },
            async |_: &Writes| final_state(&state),
        )
        .await
}

fn terms(report: &RunReport) -> Vec<&str> {
    report
        .events
        .iter()
        .filter(|e| matches!(e.kind, Kind::Acquired { .. }))
        .map(|e| e.actor.as_str())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_election_loop_holds_under_holder_pause_and_its_refused_leader_ends_its_term()
-> TestResult {
    let lab = lab().await?;
    for seed in 1..=2 {
        let harness = Harness::new("ledger-leader")
            .seed(seed)
            .negative_control(NegativeControl::Off);
        let report = run(&lab, harness, true).await?;
        assert!(report.holds(), "seed {seed}: {}", report.summary());
        let writes = &report.check.counts.writes;
        assert!(writes.accepted > 0, "seed {seed}: {}", report.summary());
        // The paused leader woke and wrote under its old term: refused,
        // and its loop ended the term (recorded lost, superseded).
        assert!(
            writes.refused_stale > 0,
            "seed {seed}: the paused leader was not refused: {}",
            report.summary()
        );
        let superseded = report
            .events
            .iter()
            .any(|e| matches!(&e.kind, Kind::Lost { cause, .. } if cause == "superseded"));
        assert!(superseded, "seed {seed}: no term ended superseded");
        // Leadership moved: terms of more than one candidate.
        let mut leaders = terms(&report);
        leaders.sort_unstable();
        leaders.dedup();
        assert!(
            leaders.len() > 1,
            "seed {seed}: one leader only: {leaders:?}"
        );
        assert!(
            !report.check.overlaps.is_empty(),
            "seed {seed}: no double holder"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_election_loop_with_a_blind_write_is_caught() -> TestResult {
    let lab = lab().await?;
    let mut summaries = Vec::new();
    for seed in 1..=3 {
        let harness = Harness::new("ledger-leader-blind").seed(seed).control(true);
        let report = run(&lab, harness, false).await?;
        if report.caught() {
            return Ok(());
        }
        summaries.push(report.summary());
    }
    panic!("the blind leader loop was never caught: {summaries:#?}");
}

#[tokio::test]
async fn a_leader_run_without_a_lock_is_refused() -> TestResult {
    let lab = lab().await?;
    let outcome = Harness::new("no-lock")
        .run_leaders(
            &lab,
            &Lock::none(),
            async |_| (),
            async |(): &mut (), _: &Candidate<'_>| Ok(()),
            async |_: &Writes| Vec::new(),
        )
        .await;
    assert!(matches!(outcome, Err(HarnessError::NoLock)), "{outcome:?}");
    Ok(())
}
