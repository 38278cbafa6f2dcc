//! The in-memory lock service (`MemoryLocker`, feature `memory`): the same
//! lease as every way, with faults a test causes, on tokio's paused clock
//! (no server, deterministic).
#![cfg(feature = "memory")]

use std::time::Duration;

use leasehold::{
    AcquireOptions, Election, Error, FencedKeys, GiveUpReason, Lessor, LostCause, MemoryLocker,
    Service,
};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const TTL: Duration = Duration::from_secs(2);

#[tokio::test(start_paused = true)]
async fn a_busy_lock_gives_up_at_the_deadline_and_the_next_caller_wins_after_release() -> TestResult
{
    let lock = MemoryLocker::new();
    let keys = FencedKeys::for_resource("wallet:1")?;
    let first = lock.acquire(&keys, TTL).await?;
    assert!(lock.is_held(keys.lock()));
    let opts = AcquireOptions::new().wait(Duration::from_millis(500));
    match lock.acquire_with(&keys, TTL, &opts).await {
        Err(Error::NotAcquired {
            reason: GiveUpReason::DeadlineExpired,
            fault: None,
            attempts,
            ..
        }) => assert!(attempts > 1),
        other => panic!("{other:?}"),
    }
    let fence = first.fence().ok_or("fenced")?;
    first.release().await?;
    let second = lock.acquire_with(&keys, TTL, &opts).await?;
    assert!(second.fence().ok_or("fenced")? > fence);
    assert_eq!(second.service(), Service::named("memory"));
    second.release().await?;
    assert!(!lock.is_held(keys.lock()));
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn an_expired_lease_is_found_gone_and_the_watchdog_stops_the_work() -> TestResult {
    let lock = MemoryLocker::new();
    let lease = lock.acquire("job:1", TTL).await?;
    lock.expire("job:1");
    assert!(matches!(
        lease.refresh(TTL).await,
        Err(Error::LeaseLost {
            cause: LostCause::Expired,
            ..
        }) | Err(Error::NotHeld { .. })
    ));
    let lease = lock.acquire("job:1", TTL).await?;
    let (started, running) = tokio::sync::oneshot::channel();
    let work = lease.run(async move {
        let _ = started.send(());
        std::future::pending::<()>().await;
    });
    let expire = async {
        running.await.ok();
        lock.expire("job:1");
    };
    let (ran, ()) = tokio::join!(work, expire);
    let err = ran.err().ok_or("the work ran on without its lease")?;
    assert!(matches!(err, Error::LeaseLost { .. }), "{err:?}");
    assert!(err.to_string().contains("on memory"), "{err}");
    assert!(matches!(lease.release().await, Err(Error::NotHeld { .. })));
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn the_watchdog_keeps_a_lease_past_its_ttl_while_the_work_runs() -> TestResult {
    let lock = MemoryLocker::new();
    let lease = lock.acquire("job:long", TTL).await?;
    let done = lease.run(tokio::time::sleep(TTL * 5)).await;
    assert!(done.is_ok(), "{done:?}");
    // Still ours: nobody else can take it.
    let opts = AcquireOptions::new().wait(Duration::ZERO);
    assert!(matches!(
        lock.acquire_with("job:long", TTL, &opts).await,
        Err(Error::NotAcquired { .. })
    ));
    lease.release().await?;
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn fencing_tokens_grow_until_the_counter_is_lost() -> TestResult {
    let lock = MemoryLocker::new();
    let keys = FencedKeys::for_resource("wallet:2")?;
    let mut last = None;
    for _ in 0..3 {
        let lease = lock.acquire(&keys, TTL).await?;
        let fence = lease.fence().ok_or("fenced")?;
        assert!(
            last.is_none_or(|last| fence > last),
            "{fence:?} after {last:?}"
        );
        last = Some(fence);
        lease.release().await?;
    }
    lock.lose_fences();
    let lease = lock.acquire(&keys, TTL).await?;
    let repeated = lease.fence().ok_or("fenced")?;
    assert!(last.is_some_and(|last| repeated < last));
    lease.release().await?;
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_paused_service_times_out_naming_memory_and_answers_once_resumed() -> TestResult {
    let lock = MemoryLocker::with_command_timeout(Duration::from_millis(300))?;
    let lease = lock.acquire("k", TTL).await?;
    lock.pause();
    let err = lease
        .refresh(TTL)
        .await
        .err()
        .ok_or("refreshed while paused")?;
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "memory did not answer refresh within 300ms"
    );
    // An acquire that never hears an answer returns the fault.
    let opts = AcquireOptions::new().wait(Duration::from_millis(500));
    let err = lock.acquire_with("other", TTL, &opts).await.err();
    assert!(matches!(err, Some(Error::Timeout { .. })), "{err:?}");
    lock.resume();
    lease.refresh(TTL).await?;
    lease.release().await?;
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_dropped_acquire_or_lease_leaves_no_lock() -> TestResult {
    let lock = MemoryLocker::new();
    let holder = lock.acquire("k", TTL).await?;
    // A waiter dropped mid-wait.
    let opts = AcquireOptions::new().wait(Duration::from_secs(60));
    let waiting = lock.acquire_with("k", TTL, &opts);
    assert!(
        tokio::time::timeout(Duration::from_millis(100), waiting)
            .await
            .is_err()
    );
    drop(holder);
    // Given back in the background: the next caller gets the lock well
    // before the TTL (2 s) would have freed it.
    let soon = AcquireOptions::new().wait(Duration::from_secs(1));
    lock.acquire_with("k", TTL, &soon).await?.release().await?;
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn bad_input_is_refused_before_anything() -> TestResult {
    let lock = MemoryLocker::new();
    assert!(matches!(
        lock.acquire("", TTL).await,
        Err(Error::InvalidKey { .. })
    ));
    assert!(matches!(
        lock.acquire("k", Duration::ZERO).await,
        Err(Error::InvalidTtl { .. })
    ));
    let replicas = AcquireOptions::new().wait_replicas(1, Duration::from_millis(10));
    assert!(matches!(
        lock.acquire_with("k", TTL, &replicas).await,
        Err(Error::InvalidOptions(_))
    ));
    assert!(matches!(
        MemoryLocker::with_command_timeout(Duration::ZERO),
        Err(Error::InvalidOptions(_))
    ));
    assert!(!lock.is_held("k"));
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn an_election_runs_on_it_with_fenced_terms() -> TestResult {
    let lock = MemoryLocker::new();
    let a = Election::builder(lock.clone(), "scheduler")
        .candidate("a")
        .build()?;
    let b = Election::builder(lock.clone(), "scheduler")
        .candidate("b")
        .build()?;
    let term = a.campaign().await?;
    let leader = b.leader().await?.ok_or("no leader")?;
    assert_eq!(leader.candidate, "a");
    assert_eq!(leader.fence, term.fence());
    let first = term.fence();
    term.resign().await?;
    let term = b.campaign().await?;
    assert!(term.fence() > first);
    term.resign().await?;
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn code_generic_over_lessor_takes_it() -> TestResult {
    async fn debit(lock: &impl Lessor) -> leasehold::Result<bool> {
        let keys = FencedKeys::for_resource("wallet:3")?;
        let opts = AcquireOptions::new().wait(Duration::from_secs(1));
        let done = lock
            .with_lock(&keys, TTL, &opts, async |lease| lease.fence().is_some())
            .await?;
        done.release?;
        Ok(done.output)
    }
    assert!(debit(&MemoryLocker::new()).await?);
    Ok(())
}

/// `serve`: a candidate's whole life in one call. It leads, runs the work
/// under each term, campaigns again after a lost term (a newer fence) and
/// after a fault longer than its budget, and on shutdown resigns, so the
/// next candidate leads at once.
#[tokio::test(start_paused = true)]
async fn serve_leads_until_shutdown_riding_out_lost_terms_and_faults() -> TestResult {
    let lock = MemoryLocker::new();
    let build = |candidate: &str| {
        Election::builder(lock.clone(), "jobs")
            .candidate(candidate)
            .ttl(TTL)
            .budget(Duration::from_secs(5))
            .build()
    };
    let (a, b) = (build("a")?, build("b")?);
    let lock_key = FencedKeys::for_resource("leader:jobs")?.lock().to_owned();
    let shutdown = leasehold::CancellationToken::new();
    let (terms_tx, mut terms) = tokio::sync::mpsc::unbounded_channel();
    let serving = a.serve(&shutdown, async |term| {
        let _ = terms_tx.send(term.fence());
        std::future::pending::<()>().await
    });
    let drive = async {
        let first = terms.recv().await.ok_or("no first term")?;
        // Lost behind the leader's back: its work stops, and it wins a
        // newer term.
        lock.expire(&lock_key);
        let second = terms.recv().await.ok_or("no second term")?;
        assert!(second > first);
        // The service stops answering for longer than the campaign's
        // budget (tokio's paused clock: no real time passes).
        lock.pause();
        tokio::time::sleep(Duration::from_secs(30)).await;
        lock.resume();
        let third = terms.recv().await.ok_or("no third term")?;
        assert!(third > second);
        // Another candidate waits; shutdown hands leadership to it.
        let next = async {
            let term = b.campaign().await?;
            let fence = term.fence();
            term.resign().await?;
            Ok::<_, leasehold::Error>(fence)
        };
        let (next, ()) = tokio::join!(next, async { shutdown.cancel() });
        assert!(next? > third);
        Ok::<_, Box<dyn std::error::Error>>(())
    };
    let (served, driven) = tokio::join!(serving, drive);
    driven?;
    let served = served?;
    assert_eq!((served.terms, served.finished), (3, 0), "{served:?}");
    assert!(served.lost >= 2, "{served:?}");
    assert!(served.faults >= 1, "{served:?}");
    Ok(())
}

/// A term whose loss was reported ends quietly: `resign` is `Ok`.
#[tokio::test(start_paused = true)]
async fn resigning_a_term_already_lost_is_quiet() -> TestResult {
    let lock = MemoryLocker::new();
    let election = Election::builder(lock.clone(), "quiet").build()?;
    let term = election.campaign().await?;
    lock.expire(FencedKeys::for_resource("leader:quiet")?.lock());
    let ran = term.run(std::future::pending::<()>()).await;
    assert!(matches!(ran, Err(Error::LeaseLost { .. })), "{ran:?}");
    term.resign().await?;
    Ok(())
}

/// The in-memory service keeps the `LockService` contract: the
/// conformance suite passes every check, each fault included (none is
/// skipped: the table offers them all).
#[tokio::test(start_paused = true)]
async fn it_passes_the_conformance_suite_with_every_fault() {
    use leasehold::conformance::{self, Settings, Verdict};
    let lock = MemoryLocker::new();
    let report = conformance::run(&lock, &lock, &Settings::default()).await;
    assert!(report.is_ok(), "{report}");
    assert!(
        report.checks.iter().all(|c| c.verdict == Verdict::Passed),
        "{report}"
    );
}

/// The negative control: the suite can fail. A `Faults` that says it
/// expires a lock but does not makes the checks that need it fail (the old
/// holder's lock is still there, so no successor ever takes it).
#[tokio::test(start_paused = true)]
async fn the_conformance_suite_fails_when_a_fault_is_not_caused() {
    use leasehold::conformance::{self, Faults, Offered, Settings};

    struct Broken;
    impl Faults for Broken {
        fn offers(&self) -> Offered {
            Offered::NONE.expire(true)
        }
        async fn expire(&self, _key: &str) -> leasehold::Result<()> {
            Ok(())
        }
    }

    let lock = MemoryLocker::new();
    let settings = Settings::default().hang(Duration::from_secs(1));
    let report = conformance::run(&lock, &Broken, &settings).await;
    let failed: Vec<_> = report.failures().map(|c| c.name).collect();
    assert!(failed.contains(&"release_is_token_checked"), "{report}");
    assert!(failed.contains(&"a_lost_lease_stops_the_work"), "{report}");
}
