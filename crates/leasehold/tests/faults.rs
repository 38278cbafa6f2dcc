//! Everyday faults a caller should not see: within its deadline, an
//! acquire rides out a Redis restart, and a release rides out a short
//! outage. Each test stops Redis for real (the process is killed and
//! started again on the same port).

use std::time::Duration;

use leasehold::{AcquireOptions, Error, FencedKeys, HandoffLocker, Lessor, Locker};
use leasehold_testkit::{RedisOptions, RedisServer};
use redis::AsyncCommands;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const MS: Duration = Duration::from_millis(1);
/// A hang detector, not a timing assertion.
const HUNG: Duration = Duration::from_secs(30);

/// Kills `server` and, after `outage`, starts it again on its port (with
/// whatever its persistence kept). Returns once it is down; the handle
/// resolves once it is back.
async fn outage(
    mut server: RedisServer,
    outage: Duration,
) -> Result<
    tokio::task::JoinHandle<Result<RedisServer, leasehold_testkit::Error>>,
    Box<dyn std::error::Error>,
> {
    let mut server = tokio::task::spawn_blocking(move || {
        server.kill()?;
        Ok::<_, leasehold_testkit::Error>(server)
    })
    .await??;
    Ok(tokio::spawn(async move {
        tokio::time::sleep(outage).await;
        tokio::task::spawn_blocking(move || {
            server.restart()?;
            Ok(server)
        })
        .await
        .map_err(|e| leasehold_testkit::Error::Io {
            path: std::path::PathBuf::new(),
            source: std::io::Error::other(e),
        })?
    }))
}

/// A caller waiting for a held lock (wait 5 s) while Redis is down for
/// about 1 s gets the lock once Redis is back, not `Unreachable`: polling
/// and hand-off alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_acquire_rides_out_a_restart_every_way() -> TestResult {
    let server = RedisServer::start()?;
    let client = redis::Client::open(server.url())?;
    let server = waits_through_a_restart(Locker::connect(&client).await?, &client, server).await?;
    let handoff = HandoffLocker::connect(&client).await?;
    drop(waits_through_a_restart(handoff, &client, server).await?);
    Ok(())
}

async fn waits_through_a_restart<L: Lessor>(
    lock: L,
    client: &redis::Client,
    server: RedisServer,
) -> Result<RedisServer, Box<dyn std::error::Error>> {
    // Someone else holds the lock; the restart (no persistence) frees it.
    let mut conn = client.get_multiplexed_async_connection().await?;
    let () = conn.set_ex("lock:faults:wait", "someone-else", 60).await?;
    let waiter = tokio::spawn(async move {
        let opts = AcquireOptions::new().wait(5000 * MS);
        lock.acquire_with("lock:faults:wait", 2000 * MS, &opts)
            .await
    });
    let back = outage(server, 1000 * MS).await?;
    let server = back.await??;
    let lease = tokio::time::timeout(HUNG, waiter).await???;
    assert_eq!(lease.key(), "lock:faults:wait");
    lease.release().await?;
    Ok(server)
}

/// A long-lived locker's first calls after a restart return no error (the
/// broken connection is the library's to ride out, not the caller's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_lived_lockers_calls_across_a_restart_return_no_error() -> TestResult {
    let mut server = RedisServer::start()?;
    let locker = Locker::connect(&redis::Client::open(server.url())?).await?;
    let keys = FencedKeys::for_resource("faults:restart")?;
    locker.acquire(&keys, 2000 * MS).await?.release().await?;

    for _ in 0..3 {
        server = tokio::task::spawn_blocking(move || {
            server.restart_empty()?;
            Ok::<_, leasehold_testkit::Error>(server)
        })
        .await??;
        let lease = tokio::time::timeout(HUNG, locker.acquire(&keys, 2000 * MS)).await??;
        assert!(lease.fence().is_some());
        lease.release().await?;
    }
    Ok(())
}

/// A release during a short outage is retried while the lease can still be
/// given back (its TTL has time left), and succeeds once Redis is back with
/// the lock (persisted): the next holder does not wait out the TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_rides_out_a_short_outage() -> TestResult {
    let server = RedisServer::start_with(RedisOptions::default().appendonly())?;
    let client = redis::Client::open(server.url())?;
    let locker = Locker::connect(&client).await?;
    let lease = locker.acquire("lock:faults:release", 10_000 * MS).await?;

    let back = outage(server, 300 * MS).await?;
    // The release starts while Redis is down.
    let released = tokio::time::timeout(HUNG, lease.release()).await?;
    let server = back.await??;
    assert!(released.is_ok(), "{released:?}");
    let mut conn = client.get_multiplexed_async_connection().await?;
    let left: bool = conn.exists("lock:faults:release").await?;
    assert!(!left, "the release did not remove the lock");
    drop(server);
    Ok(())
}

/// Bad input is still refused at once, whatever the deadline: the retry
/// rides out faults, not refusals.
#[tokio::test]
async fn refusals_are_not_retried() -> TestResult {
    let server = RedisServer::start()?;
    let client = redis::Client::open(server.url())?;
    let locker = Locker::connect(&client).await?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let () = conn.hset("lock:faults:hash", "field", "value").await?;
    let opts = AcquireOptions::new().wait(HUNG);
    let err = tokio::time::timeout(
        HUNG / 2,
        locker.acquire_with("lock:faults:hash", 1000 * MS, &opts),
    )
    .await?
    .err();
    assert!(matches!(err, Some(Error::WrongType { .. })), "{err:?}");
    Ok(())
}

/// Counts the warnings that a dropped lease's background release gave up
/// ("could not release dropped lease; the ttl will end it") on this
/// thread.
#[derive(Clone, Default)]
struct DroppedLeftToTtl(std::sync::Arc<std::sync::atomic::AtomicU64>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for DroppedLeftToTtl {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Message(bool);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 |= format!("{value:?}").contains("could not release dropped lease");
                }
            }
        }
        let mut message = Message(false);
        event.record(&mut message);
        if message.0 {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

/// What the job runner's callers were told.
#[derive(Debug, Default)]
struct Told {
    done: u64,
    /// Acquires that failed with anything but `NotAcquired`.
    acquire_errors: Vec<String>,
    /// `NotAcquired` after the whole wait (contention).
    not_acquired: u64,
    /// Work stopped because the watchdog could not keep the lease.
    lost: Vec<String>,
    /// Releases that failed with anything but `NotHeld` / `LeaseLost`.
    release_errors: Vec<String>,
    /// Releases that found the lease gone (it really was).
    release_not_held: u64,
}

/// The job-runner target: 3 lockers (as 3 processes would have, each its
/// own connection), 12 callers, TTL 200 ms, wait 4 s, work 20 ms under the
/// watchdog; half the runs give the lease back, half drop it (an early
/// return); Redis is killed and started again on its port after ~1.7 s
/// down (empty). The callers must not be told of the outage: no acquire or
/// release error, and no dropped lease left to its TTL.
///
/// The scenario waits 2 s. Then a caller whose wait began while
/// the lock was busy, some time before Redis went down, can have its
/// deadline fall inside the outage: traced, one began 0.31 s before the
/// kill, Redis answered again 1.735 s after it, and the caller's 2 s ran
/// out 41 ms before that (45 attempts, the last cut short): the fault
/// outlasted what was left of its wait, and it rightly gets the fault,
/// not `NotAcquired`. At 2 s that happened to one caller in about half the
/// runs (7 of 14, 2026-12-04), never to a caller whose wait outlasted the
/// outage. 4 s keeps every wait longer than the fault plus whatever
/// contention came before it, whatever the load, which is what is
/// tested.
#[tokio::test(flavor = "current_thread")]
async fn the_job_runner_rides_out_a_redis_restart_shorter_than_the_wait() -> TestResult {
    use tracing_subscriber::prelude::*;
    let dropped = DroppedLeftToTtl::default();
    let _guard = tracing_subscriber::registry()
        .with(dropped.clone())
        .set_default();
    let server = RedisServer::start()?;
    let client = redis::Client::open(server.url())?;
    let mut lockers = Vec::new();
    for _ in 0..3 {
        lockers.push(Locker::connect(&client).await?);
    }
    let told = std::rc::Rc::new(std::cell::RefCell::new(Told::default()));
    let stop = leasehold::CancellationToken::new();
    let caller = |index: usize| {
        let (locker, told, stop) = (lockers[index % 3].clone(), told.clone(), stop.clone());
        async move {
            let opts = AcquireOptions::new().wait(4000 * MS).cancel(stop.clone());
            let mut run = 0usize;
            while !stop.is_cancelled() {
                run += 1;
                let keys = FencedKeys::for_resource(&format!("job-runner:{}", (index + run) % 4))?;
                let lease = match locker.acquire_with(&keys, 200 * MS, &opts).await {
                    Ok(lease) => lease,
                    Err(Error::NotAcquired { .. }) => {
                        told.borrow_mut().not_acquired += 1;
                        continue;
                    }
                    Err(err) => {
                        told.borrow_mut().acquire_errors.push(err.to_string());
                        continue;
                    }
                };
                match lease.run(tokio::time::sleep(20 * MS)).await {
                    Ok(()) => told.borrow_mut().done += 1,
                    Err(err) => told.borrow_mut().lost.push(err.to_string()),
                }
                if run.is_multiple_of(2) {
                    drop(lease);
                    continue;
                }
                match lease.release().await {
                    Ok(()) => {}
                    Err(Error::NotHeld { .. } | Error::LeaseLost { .. }) => {
                        told.borrow_mut().release_not_held += 1;
                    }
                    Err(err) => told.borrow_mut().release_errors.push(err.to_string()),
                }
            }
            Ok::<_, Error>(())
        }
    };
    let callers = futures_util::future::join_all((0..12).map(caller));
    let scenario = async {
        tokio::time::sleep(500 * MS).await;
        let back = outage(server, 1700 * MS).await?;
        let server = back.await??;
        // Time for everything the outage touched to settle: every wait that
        // began in it ends within 4 s.
        tokio::time::sleep(4500 * MS).await;
        stop.cancel();
        Ok::<_, Box<dyn std::error::Error>>(server)
    };
    let (outcomes, server) =
        tokio::time::timeout(HUNG, async { tokio::join!(callers, scenario) }).await?;
    let _server = server?;
    for outcome in outcomes {
        outcome?;
    }
    let told = told.borrow();
    let left_to_ttl = dropped.0.load(std::sync::atomic::Ordering::SeqCst);
    eprintln!(
        "job runner across a 1.7 s restart: {told:#?}, dropped leases left to the ttl: {left_to_ttl}"
    );
    assert!(told.done > 0, "{told:?}");
    assert!(told.acquire_errors.is_empty(), "{told:#?}");
    assert!(told.release_errors.is_empty(), "{told:#?}");
    assert_eq!(left_to_ttl, 0, "{told:#?}");
    Ok(())
}

/// A lease handed over through Redis after a wait in the queue longer than
/// its TTL reaches its holder with time left (counted from the hand-over,
/// not from the waiter's entry in the queue), and the watchdog keeps it:
/// a waiter is not given a lease that is lost on arrival.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_handed_over_after_a_long_wait_keeps_a_full_ttl() -> TestResult {
    let server = RedisServer::start()?;
    let client = redis::Client::open(server.url())?;
    // Two lockers, as two processes: the hand-over goes through Redis.
    let (a, b) = (
        HandoffLocker::connect(&client).await?,
        HandoffLocker::connect(&client).await?,
    );
    let key = "lock:faults:handed";
    // A long lease: the waiter's next check is due only at its expiry.
    let held = a.acquire(key, 60_000 * MS).await?;
    let waiter = tokio::spawn(async move {
        let opts = AcquireOptions::new().wait(HUNG / 2).watchdog(true);
        b.acquire_with(key, 200 * MS, &opts).await
    });
    let mut conn = client.get_multiplexed_async_connection().await?;
    // Queued: its last request found the lock busy.
    loop {
        let queued: i64 = redis::cmd("ZCARD")
            .arg(format!("{key}:waitq"))
            .query_async(&mut conn)
            .await?;
        if queued > 0 {
            break;
        }
        tokio::time::sleep(5 * MS).await;
    }
    // Longer than the waiter's TTL in the queue, then the hand-over.
    tokio::time::sleep(400 * MS).await;
    held.release().await?;
    let lease = tokio::time::timeout(HUNG, waiter).await???;
    let stored: Option<String> = conn.get(key).await?;
    assert_eq!(stored.as_deref(), Some(lease.token().as_str()));
    assert!(
        lease.remaining() > 100 * MS,
        "handed over with {:?} left",
        lease.remaining()
    );
    // The watchdog keeps it: its first refresh is due a third of a TTL on.
    tokio::time::sleep(300 * MS).await;
    assert_eq!(lease.lost(), None);
    lease.release().await?;
    Ok(())
}

/// A caller that waited behind a live holder and then met an outage that
/// lasted past its wait gives up as busy (`NotAcquired`, its reason the
/// deadline), carrying the fault it also met, not the fault alone: what it
/// acts on is "busy", polling and hand-off alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_behind_a_holder_that_ends_in_an_outage_gives_up_as_busy_every_way() -> TestResult {
    for handoff in [false, true] {
        let mut server = RedisServer::start()?;
        let client = redis::Client::open(server.url())?;
        let key = "lock:faults:busy-then-down";
        let mut conn = client.get_multiplexed_async_connection().await?;
        let () = conn.set_ex(key, "someone-else", 60).await?;
        let opts = AcquireOptions::new().wait(1500 * MS);
        // The waiter's own TTL is short: a hand-off waiter checks the lock
        // again at least once per TTL of its own, so it meets the outage.
        let ttl = 300 * MS;
        let waiter = if handoff {
            let lock = HandoffLocker::connect(&client).await?;
            let waiter = tokio::spawn(async move { lock.acquire_with(key, ttl, &opts).await });
            // Queued in Redis: it asked, and was told the lock is busy.
            let queue = format!("{key}:waitq");
            while conn.zcard::<_, u64>(&queue).await? != 1 {
                tokio::time::sleep(MS).await;
            }
            waiter
        } else {
            let lock = Locker::connect(&client).await?;
            let stats = lock.clone();
            let waiter = tokio::spawn(async move { lock.acquire_with(key, ttl, &opts).await });
            // A second request goes only once the first was answered busy.
            while stats.stats().acquire_requests < 2 {
                tokio::time::sleep(MS).await;
            }
            waiter
        };
        server = tokio::task::spawn_blocking(move || {
            server.kill()?;
            Ok::<_, leasehold_testkit::Error>(server)
        })
        .await??;
        let err = tokio::time::timeout(HUNG, waiter)
            .await??
            .err()
            .ok_or("the lock was taken while its server was down")?;
        let Error::NotAcquired {
            reason: leasehold::GiveUpReason::DeadlineExpired,
            fault: Some(fault),
            ..
        } = &err
        else {
            return Err(format!("handoff {handoff}: {err:?}").into());
        };
        assert!(fault.is_retryable(), "handoff {handoff}: {fault:?}");
        assert!(err.is_contention() && err.is_retryable(), "{err:?}");
        assert!(
            format!("{err}").contains("busy and then its service failing"),
            "{err}"
        );
        drop(server);
    }
    Ok(())
}
