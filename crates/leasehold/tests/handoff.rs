//! Hand-off mode against a real, throwaway redis-server.
#![cfg(feature = "handoff")]

use leasehold::Lessor;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use leasehold::{
    AcquireOptions, CancellationToken, Error, GiveUpReason, HandoffLocker, HandoffStyle, Locker,
    RetryStrategy,
};
use leasehold_testkit::{RedisOptions, RedisServer};
use redis::AsyncCommands;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const SECOND: Duration = Duration::from_secs(1);
/// A hang detector, not a timing assertion: far above what any of these
/// tests needs on a loaded machine.
const HUNG: Duration = Duration::from_secs(20);

struct Setup {
    server: RedisServer,
    client: redis::Client,
    conn: redis::aio::ConnectionManager,
}

async fn setup() -> Result<Setup, Box<dyn std::error::Error>> {
    let server = RedisServer::start()?;
    let client = redis::Client::open(server.url())?;
    let conn = leasehold_testkit::connection(&client, SECOND).await?;
    Ok(Setup {
        server,
        client,
        conn,
    })
}

/// A hand-off locker with its own connections (another "process"), relay
/// off: every waiter queues in Redis (the protocol these tests check).
async fn handoff(s: &Setup, style: HandoffStyle) -> Result<HandoffLocker, Error> {
    relaying(s, style, 0).await
}

/// A hand-off locker that relays up to `limit` leases in process.
async fn relaying(s: &Setup, style: HandoffStyle, limit: u32) -> Result<HandoffLocker, Error> {
    HandoffLocker::builder()
        .style(style)
        .relay_limit(limit)
        .connect(&s.client)
        .await
}

/// Waits until the wait queue of `key` holds at least `n` entries.
async fn until_queued(conn: &mut redis::aio::ConnectionManager, key: &str, n: usize) -> TestResult {
    until_queue(conn, key, |len| len >= n).await
}

/// Waits until the length of `key`'s wait queue satisfies `done`.
async fn until_queue(
    conn: &mut redis::aio::ConnectionManager,
    key: &str,
    done: impl Fn(usize) -> bool,
) -> TestResult {
    let queue = format!("{key}:waitq");
    tokio::time::timeout(HUNG, async {
        loop {
            let len: usize = conn.zcard(&queue).await?;
            if done(len) {
                return Ok::<_, redis::RedisError>(());
            }
            tokio::task::yield_now().await;
        }
    })
    .await??;
    Ok(())
}

async fn many_waiters_are_served_one_at_a_time(style: HandoffStyle, relay: u32) -> TestResult {
    let s = setup().await?;
    let key = "t:handoff:many";
    let lockers = [
        relaying(&s, style, relay).await?,
        relaying(&s, style, relay).await?,
    ];
    let holders = Arc::new(AtomicU32::new(0));
    let most = Arc::new(AtomicU32::new(0));
    let served = Arc::new(AtomicU32::new(0));
    let n = 40;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let locker = lockers[i % 2].clone();
        let (holders, most, served) = (holders.clone(), most.clone(), served.clone());
        tasks.spawn(async move {
            let opts = AcquireOptions::new().wait(HUNG);
            let lease = locker.acquire_with(key, 10 * SECOND, &opts).await?;
            let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            tokio::task::yield_now().await;
            holders.fetch_sub(1, Ordering::SeqCst);
            served.fetch_add(1, Ordering::SeqCst);
            lease.release().await
        });
    }
    tokio::time::timeout(HUNG, async {
        while let Some(joined) = tasks.join_next().await {
            joined??;
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await??;
    assert_eq!(most.load(Ordering::SeqCst), 1, "two holders at once");
    assert_eq!(served.load(Ordering::SeqCst), 40);
    let mut conn = s.conn.clone();
    let left: bool = conn.exists(key).await?;
    assert!(!left, "the last release left the lock behind");
    let queued: usize = conn.zcard(format!("{key}:waitq")).await?;
    assert_eq!(queued, 0, "served waiters left queue entries");

    // No polling: one request to join or take, one to release (grant), plus
    // one to take after a wake-up (wake). The fallback timer (5 s) never
    // fires here.
    let (mut acquires, mut releases, mut taken) = (0, 0, 0);
    for l in &lockers {
        let stats = l.locker().stats();
        acquires += stats.acquire_requests;
        releases += stats.release_requests;
        taken += stats.acquisitions;
    }
    assert_eq!(taken, 40);
    if relay > 0 {
        // Leases passed in process cost no request at all.
        assert!(acquires + releases < 80, "{acquires} + {releases} requests");
    } else {
        assert_eq!(releases, 40);
        match style {
            HandoffStyle::Grant => assert_eq!(acquires, 40),
            _ => assert!(acquires <= 80, "{acquires} acquire requests"),
        }
    }
    drop(s.server);
    Ok(())
}

#[tokio::test]
async fn grant_serves_every_waiter_one_at_a_time() -> TestResult {
    many_waiters_are_served_one_at_a_time(HandoffStyle::Grant, 0).await
}

#[tokio::test]
async fn wake_serves_every_waiter_one_at_a_time() -> TestResult {
    many_waiters_are_served_one_at_a_time(HandoffStyle::Wake, 0).await
}

#[tokio::test]
async fn relay_serves_every_waiter_one_at_a_time_across_two_lockers() -> TestResult {
    many_waiters_are_served_one_at_a_time(HandoffStyle::Grant, 4).await
}

#[tokio::test]
async fn relay_in_wake_style_serves_every_waiter_one_at_a_time() -> TestResult {
    many_waiters_are_served_one_at_a_time(HandoffStyle::Wake, 4).await
}

#[tokio::test]
async fn waiters_are_served_in_arrival_order() -> TestResult {
    let s = setup().await?;
    let key = "t:handoff:fifo";
    let locker = handoff(&s, HandoffStyle::Grant).await?;
    let holder = locker
        .acquire_with(key, 10 * SECOND, &AcquireOptions::new())
        .await?;
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut conn = s.conn.clone();
    let mut tasks = Vec::new();
    for i in 0..5 {
        let (locker, order) = (locker.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let opts = AcquireOptions::new().wait(HUNG);
            let lease = locker.acquire_with(key, 10 * SECOND, &opts).await?;
            order
                .lock()
                .map_err(|_| Error::InvalidOptions("poisoned"))?
                .push(i);
            lease.release().await
        }));
        // Each one queued before the next starts: arrival order is i.
        until_queued(&mut conn, key, i + 1).await?;
    }
    holder.release().await?;
    for task in tasks {
        tokio::time::timeout(HUNG, task).await???;
    }
    assert_eq!(*order.lock().map_err(|_| "poisoned")?, vec![0, 1, 2, 3, 4]);
    Ok(())
}

/// Each role has a locker of its own (a process of its own), so even with
/// relay on every waiter queues in Redis: dead holders and waiters must
/// block the key only until their TTLs whatever the relay setting.
async fn dead_holder_and_dead_waiters(relay: u32) -> TestResult {
    let s = setup().await?;
    let key = "t:handoff:dead";
    let ttl = Duration::from_millis(300);
    let mut conn = s.conn.clone();

    // A holder that dies: its lease is never released, not even in the
    // background.
    let dead_holder = relaying(&s, HandoffStyle::Grant, relay).await?;
    let lease = dead_holder
        .acquire_with(key, ttl, &AcquireOptions::new())
        .await?;
    std::mem::forget(lease);

    // A waiter that enqueues and then vanishes without leaving the queue.
    let ghost = relaying(&s, HandoffStyle::Grant, relay).await?;
    let opts = AcquireOptions::new().wait(HUNG);
    let mut vanished = Box::pin(ghost.acquire_with(key, ttl, &opts));
    tokio::select! {
        got = &mut vanished => return Err(format!("the ghost got {got:?}").into()),
        queued = until_queued(&mut conn, key, 1) => queued?,
    }
    std::mem::forget(vanished);

    // A waiter whose whole process died: its locker, and with it its pub/sub
    // connection, is gone too.
    let dead_process = relaying(&s, HandoffStyle::Grant, relay).await?;
    let mut vanished = Box::pin(dead_process.acquire_with(key, ttl, &opts));
    tokio::select! {
        got = &mut vanished => return Err(format!("the dead process got {got:?}").into()),
        queued = until_queued(&mut conn, key, 2) => queued?,
    }
    std::mem::forget(vanished);
    drop(dead_process);

    // The next live waiter must get the lock: after the holder's TTL, and
    // (if the lock was handed to the ghost first) the ghost's TTL.
    let live = relaying(&s, HandoffStyle::Grant, relay).await?;
    let lease = tokio::time::timeout(
        HUNG,
        live.acquire_with(key, 10 * SECOND, &AcquireOptions::new().wait(HUNG)),
    )
    .await??;
    let stored: String = conn.get(key).await?;
    assert_eq!(stored, lease.token().as_str());
    lease.release().await?;
    Ok(())
}

/// Whatever the strategy, giving up on `key` (held by someone else) comes
/// back as the same variant and reason: deadline (or, with no retries,
/// retries exhausted) after one attempt, cancelled before any, and one
/// attempt with `max_attempts(1)`.
async fn every_strategy_gives_up_the_same_way(locker: &HandoffLocker, key: &str) -> TestResult {
    for strategy in [
        RetryStrategy::none(),
        RetryStrategy::default(),
        RetryStrategy::exponential(Duration::from_millis(16), Duration::from_millis(128))
            .with_full_jitter(),
        RetryStrategy::decorrelated_jitter(Duration::from_millis(5), Duration::from_millis(50)),
    ] {
        let opts = AcquireOptions::new()
            .retry(strategy)
            .wait(Duration::from_millis(30));
        let err = locker.acquire_with(key, SECOND, &opts).await.err();
        let want = if strategy == RetryStrategy::none() {
            GiveUpReason::RetriesExhausted
        } else {
            GiveUpReason::DeadlineExpired
        };
        assert!(
            matches!(err, Some(Error::NotAcquired { reason, attempts: 1, .. }) if reason == want),
            "{strategy:?}: {err:?}"
        );
        let cancel = CancellationToken::new();
        cancel.cancel();
        let opts = AcquireOptions::new().retry(strategy).cancel(cancel);
        let err = locker.acquire_with(key, SECOND, &opts).await.err();
        assert!(
            matches!(
                err,
                Some(Error::NotAcquired {
                    reason: GiveUpReason::Cancelled,
                    attempts: 0,
                    ..
                })
            ),
            "{strategy:?}: {err:?}"
        );
        let opts = AcquireOptions::new().retry(strategy.max_attempts(1));
        let err = locker.acquire_with(key, SECOND, &opts).await.err();
        assert!(
            matches!(
                err,
                Some(Error::NotAcquired {
                    reason: GiveUpReason::RetriesExhausted,
                    attempts: 1,
                    ..
                })
            ),
            "{strategy:?}: {err:?}"
        );
    }

    Ok(())
}

#[tokio::test]
async fn a_dead_holder_and_a_dead_waiter_block_the_key_only_until_their_ttls() -> TestResult {
    dead_holder_and_dead_waiters(0).await
}

#[tokio::test]
async fn with_relay_a_dead_holder_and_a_dead_waiter_block_the_key_only_until_their_ttls()
-> TestResult {
    dead_holder_and_dead_waiters(16).await
}

#[tokio::test]
async fn giving_up_is_not_acquired_with_its_reason_and_leaves_the_queue() -> TestResult {
    let s = setup().await?;
    let key = "t:handoff:giveup";
    let locker = handoff(&s, HandoffStyle::Grant).await?;
    let mut conn = s.conn.clone();
    let holder = locker
        .acquire_with(key, 30 * SECOND, &AcquireOptions::new())
        .await?;

    let opts = AcquireOptions::new().wait(Duration::from_millis(50));
    let err = locker.acquire_with(key, SECOND, &opts).await.err();
    assert!(
        matches!(
            err,
            Some(Error::NotAcquired {
                reason: GiveUpReason::DeadlineExpired,
                attempts: 1,
                ..
            })
        ),
        "{err:?}"
    );

    let opts = AcquireOptions::new().retry(RetryStrategy::none());
    let err = locker.acquire_with(key, SECOND, &opts).await.err();
    assert!(
        matches!(
            err,
            Some(Error::NotAcquired {
                reason: GiveUpReason::RetriesExhausted,
                attempts: 1,
                ..
            })
        ),
        "{err:?}"
    );

    // Two attempts: the join, then one fallback re-check (after one ttl).
    let opts = AcquireOptions::new().retry(RetryStrategy::default().max_attempts(2));
    let err = locker
        .acquire_with(key, Duration::from_millis(100), &opts)
        .await
        .err();
    assert!(
        matches!(
            err,
            Some(Error::NotAcquired {
                reason: GiveUpReason::RetriesExhausted,
                attempts: 2,
                ..
            })
        ),
        "{err:?}"
    );

    let cancel = CancellationToken::new();
    let opts = AcquireOptions::new().wait(HUNG).cancel(cancel.clone());
    let waiter = {
        let locker = locker.clone();
        tokio::spawn(async move { locker.acquire_with(key, SECOND, &opts).await.map(|_| ()) })
    };
    until_queued(&mut conn, key, 1).await?;
    cancel.cancel();
    let err = tokio::time::timeout(HUNG, waiter).await??.err();
    assert!(
        matches!(
            err,
            Some(Error::NotAcquired {
                reason: GiveUpReason::Cancelled,
                attempts: 1,
                ..
            })
        ),
        "{err:?}"
    );

    every_strategy_gives_up_the_same_way(&locker, key).await?;

    // Every waiter that gave up left the queue, so the release deletes the
    // lock instead of handing it to someone who is gone.
    tokio::time::timeout(HUNG, async {
        loop {
            let queued: usize = conn.zcard(format!("{key}:waitq")).await?;
            if queued == 0 {
                return Ok::<_, redis::RedisError>(());
            }
            tokio::task::yield_now().await;
        }
    })
    .await??;
    holder.release().await?;
    let left: bool = conn.exists(key).await?;
    assert!(!left);
    Ok(())
}

#[tokio::test]
async fn a_late_release_spares_the_successor() -> TestResult {
    let s = setup().await?;
    let key = "t:handoff:late";
    let locker = handoff(&s, HandoffStyle::Grant).await?;
    let mut conn = s.conn.clone();
    let a = locker
        .acquire_with(key, Duration::from_millis(5), &AcquireOptions::new())
        .await?;
    let b = locker
        .acquire_with(key, 30 * SECOND, &AcquireOptions::new().wait(HUNG))
        .await?;
    let err = a.release().await.err();
    assert!(matches!(err, Some(Error::NotHeld { .. })), "{err:?}");
    let stored: String = conn.get(key).await?;
    assert_eq!(stored, b.token().as_str());
    b.release().await?;
    Ok(())
}

#[tokio::test]
async fn a_dropped_handoff_lease_is_handed_on_in_the_background() -> TestResult {
    let s = setup().await?;
    let key = "t:handoff:drop";
    let locker = handoff(&s, HandoffStyle::Grant).await?;
    let mut conn = s.conn.clone();
    let lease = locker
        .acquire_with(key, 60 * SECOND, &AcquireOptions::new())
        .await?;
    let waiter = {
        let locker = locker.clone();
        tokio::spawn(async move {
            let opts = AcquireOptions::new().wait(HUNG);
            locker.acquire_with(key, 60 * SECOND, &opts).await
        })
    };
    until_queued(&mut conn, key, 1).await?;
    // Only the background hand-on can pass a 60 s lease on within HUNG.
    drop(lease);
    let next = tokio::time::timeout(HUNG, waiter).await???;
    let stored: String = conn.get(key).await?;
    assert_eq!(stored, next.token().as_str());
    next.release().await?;
    let left: bool = conn.exists(key).await?;
    assert!(!left);
    Ok(())
}

/// Calls of `cmd` the server has run so far (`INFO commandstats`).
async fn calls(
    conn: &mut redis::aio::ConnectionManager,
    cmd: &str,
) -> Result<u64, redis::RedisError> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await?;
    let prefix = format!("cmdstat_{cmd}:calls=");
    Ok(info
        .lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0))
}

#[tokio::test]
async fn fifo_holds_across_lockers_and_own_waiters_are_served_without_publish() -> TestResult {
    let s = setup().await?;
    let key = "t:handoff:local";
    let mut conn = s.conn.clone();
    // Lockers 0 and 1 are two "processes"; waiters alternate 0, 0, 1, 0, 0,
    // 1, ... so hand-offs go both within one process and across.
    let lockers = [
        handoff(&s, HandoffStyle::Grant).await?,
        handoff(&s, HandoffStyle::Grant).await?,
    ];
    let holder = lockers[0]
        .acquire_with(key, 30 * SECOND, &AcquireOptions::new())
        .await?;
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let holders = Arc::new(AtomicU32::new(0));
    let most = Arc::new(AtomicU32::new(0));
    let n = 12;
    let mut tasks = Vec::new();
    for i in 0..n {
        let locker = lockers[usize::from(i % 3 == 2)].clone();
        let (order, holders, most) = (order.clone(), holders.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            let opts = AcquireOptions::new().wait(HUNG);
            let lease = locker.acquire_with(key, 30 * SECOND, &opts).await?;
            let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            order
                .lock()
                .map_err(|_| Error::InvalidOptions("poisoned"))?
                .push(i);
            tokio::task::yield_now().await;
            holders.fetch_sub(1, Ordering::SeqCst);
            lease.release().await
        }));
        until_queued(&mut conn, key, i + 1).await?;
    }
    let published = calls(&mut conn, "spublish").await?;
    holder.release().await?;
    for task in tasks {
        tokio::time::timeout(HUNG, task).await???;
    }
    assert_eq!(most.load(Ordering::SeqCst), 1, "two holders at once");
    let want: Vec<usize> = (0..n).collect();
    assert_eq!(*order.lock().map_err(|_| "poisoned")?, want);
    // Waiter i is told by the release of waiter i - 1 (the first by the
    // holder, of locker 0): over pub/sub only when they are in different
    // lockers, i.e. when one of the two is a locker-1 waiter (i % 3 == 2).
    let across = (0..n)
        .filter(|&i| {
            let prev = i.checked_sub(1).map_or(0, |p| usize::from(p % 3 == 2));
            prev != usize::from(i % 3 == 2)
        })
        .count() as u64;
    let publishes = calls(&mut conn, "spublish").await? - published;
    assert_eq!(publishes, across, "one SPUBLISH per cross-locker hand-off");
    let left: bool = conn.exists(key).await?;
    assert!(!left, "the last release left the lock behind");
    Ok(())
}

#[tokio::test]
async fn an_own_waiter_served_after_it_stopped_waiting_keeps_the_lock_until_its_ttl() -> TestResult
{
    let s = setup().await?;
    let key = "t:handoff:skip";
    let mut conn = s.conn.clone();
    let locker = handoff(&s, HandoffStyle::Grant).await?;
    let holder = locker
        .acquire_with(key, 60 * SECOND, &AcquireOptions::new())
        .await?;
    let waiter = {
        let locker = locker.clone();
        tokio::spawn(async move {
            // A 1 s TTL: its fallback re-check (once per TTL of its own)
            // finds the lock free once the other entry's lease ran out.
            let opts = AcquireOptions::new().wait(HUNG);
            locker.acquire_with(key, SECOND, &opts).await
        })
    };
    until_queued(&mut conn, key, 1).await?;
    // Ahead of the real waiter, an entry of the same locker (its channel)
    // whose waiter this process no longer has: as one that won the lock
    // another way just before the release served it. The release must not
    // take the lock from it; its short TTL then frees the key for the next.
    let queue = format!("{key}:waitq");
    let entries = format!("{key}:waiters");
    let real: Vec<(String, f64)> = conn.zrange_withscores(&queue, 0, 0).await?;
    let (real_token, real_score) = real.first().ok_or("no queued waiter")?.clone();
    let entry: String = conn.hget(&entries, &real_token).await?;
    let channel = entry.splitn(3, ' ').nth(2).ok_or("no channel")?;
    let _: () = conn.zadd(&queue, "won", real_score - 1.0).await?;
    let _: () = conn
        .hset(&entries, "won", format!("99999999999999 300 {channel}"))
        .await?;

    holder.release().await?;
    let stored: String = conn.get(key).await?;
    assert_eq!(
        stored, "won",
        "the release took the lock from a waiter that had it"
    );
    let lease = tokio::time::timeout(HUNG, waiter).await???;
    assert_eq!(lease.token().as_str(), real_token);
    let stored: String = conn.get(key).await?;
    assert_eq!(stored, real_token);
    let queued: usize = conn.zcard(&queue).await?;
    assert_eq!(queued, 0, "served entries stayed queued");
    lease.release().await?;
    let left: bool = conn.exists(key).await?;
    assert!(!left);
    Ok(())
}

#[tokio::test]
async fn own_waiters_that_give_up_while_queued_never_hold_up_the_rest() -> TestResult {
    for style in [HandoffStyle::Grant, HandoffStyle::Wake] {
        let s = setup().await?;
        let key = "t:handoff:giveup-local";
        let mut conn = s.conn.clone();
        let lockers = [handoff(&s, style).await?, handoff(&s, style).await?];
        let holder = lockers[0]
            .acquire_with(key, 60 * SECOND, &AcquireOptions::new())
            .await?;
        let holders = Arc::new(AtomicU32::new(0));
        let most = Arc::new(AtomicU32::new(0));
        let cancel = CancellationToken::new();
        let n = 30;
        let mut tasks = Vec::new();
        for i in 0..n {
            let locker = lockers[usize::from(i % 4 == 3)].clone();
            let (holders, most) = (holders.clone(), most.clone());
            let mut opts = AcquireOptions::new().wait(HUNG);
            if i % 3 == 1 {
                opts = opts.cancel(cancel.clone());
            }
            tasks.push(tokio::spawn(async move {
                // 60 s leases: a hand-off to a waiter that is gone would
                // block the key far beyond HUNG.
                let lease = match locker.acquire_with(key, 60 * SECOND, &opts).await {
                    Ok(lease) => lease,
                    Err(Error::NotAcquired {
                        reason: GiveUpReason::Cancelled,
                        ..
                    }) => return Ok(false),
                    Err(err) => return Err(err),
                };
                let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::task::yield_now().await;
                holders.fetch_sub(1, Ordering::SeqCst);
                lease.release().await?;
                Ok(true)
            }));
        }
        until_queued(&mut conn, key, n).await?;
        // The give-ups race the hand-offs: their leave scripts run before,
        // between or after the releases.
        let release = tokio::spawn(holder.release());
        cancel.cancel();
        release.await??;
        let mut served = 0;
        for task in tasks {
            if tokio::time::timeout(HUNG, task).await??? {
                served += 1;
            }
        }
        assert_eq!(
            most.load(Ordering::SeqCst),
            1,
            "{style:?}: two holders at once"
        );
        assert_eq!(
            served,
            n - n / 3,
            "{style:?}: not every waiter that stayed was served"
        );
        let left: bool = conn.exists(key).await?;
        assert!(!left, "{style:?}: the last release left the lock behind");
    }
    Ok(())
}

// In-process relay: waiters of one locker queue in process and a release
// passes the lock along with one token-checked request.

/// Waits until `n` callers of `locker` wait in process for `key`.
async fn until_queued_in_process(locker: &HandoffLocker, key: &str, n: usize) -> TestResult {
    tokio::time::timeout(HUNG, async {
        while locker.queued_in_process(key) < n {
            tokio::task::yield_now().await;
        }
    })
    .await?;
    Ok(())
}

/// Spawns a waiter that records `name` in `order` when it holds the lock,
/// checks that nobody else holds it at the same time, and releases.
fn spawn_recorder(
    locker: &HandoffLocker,
    key: &'static str,
    name: &'static str,
    order: &Arc<std::sync::Mutex<Vec<&'static str>>>,
    holders: &Arc<AtomicU32>,
) -> tokio::task::JoinHandle<Result<(), Error>> {
    spawn_recorder_with_ttl(locker, key, name, order, holders, 10 * SECOND)
}

/// [`spawn_recorder`] asking for a lease of `ttl`.
fn spawn_recorder_with_ttl(
    locker: &HandoffLocker,
    key: &'static str,
    name: &'static str,
    order: &Arc<std::sync::Mutex<Vec<&'static str>>>,
    holders: &Arc<AtomicU32>,
    ttl: Duration,
) -> tokio::task::JoinHandle<Result<(), Error>> {
    let (locker, order, holders) = (locker.clone(), order.clone(), holders.clone());
    tokio::spawn(async move {
        let opts = AcquireOptions::new().wait(HUNG);
        let lease = locker.acquire_with(key, ttl, &opts).await?;
        if holders.fetch_add(1, Ordering::SeqCst) != 0 {
            return Err(Error::InvalidOptions("two holders at once"));
        }
        order
            .lock()
            .map_err(|_| Error::InvalidOptions("poisoned"))?
            .push(name);
        tokio::task::yield_now().await;
        holders.fetch_sub(1, Ordering::SeqCst);
        lease.release().await
    })
}

async fn join_all(tasks: Vec<tokio::task::JoinHandle<Result<(), Error>>>) -> TestResult {
    for task in tasks {
        tokio::time::timeout(HUNG, task).await???;
    }
    Ok(())
}

#[tokio::test]
async fn relay_serves_local_waiters_in_order_with_one_request_per_acquisition() -> TestResult {
    let s = setup().await?;
    let key = "t:relay:order";
    let locker = relaying(&s, HandoffStyle::Grant, 16).await?;
    let mut conn = s.conn.clone();
    let holder = locker
        .acquire_with(key, 10 * SECOND, &AcquireOptions::new())
        .await?;
    let names = [
        "w0", "w1", "w2", "w3", "w4", "w5", "w6", "w7", "w8", "w9", "w10", "w11", "w12", "w13",
        "w14", "w15", "w16", "w17", "w18", "w19",
    ];
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let holders = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for (i, name) in names.iter().enumerate() {
        tasks.push(spawn_recorder(&locker, key, name, &order, &holders));
        until_queued_in_process(&locker, key, i + 1).await?;
    }
    let queued: usize = conn.zcard(format!("{key}:waitq")).await?;
    assert_eq!(queued, 0, "local waiters must not queue in Redis");
    holder.release().await?;
    join_all(tasks).await?;
    assert_eq!(*order.lock().map_err(|_| "poisoned")?, names.to_vec());
    let left: bool = conn.exists(key).await?;
    assert!(!left, "the last release left the lock behind");

    // 21 leases: the holder's acquire, then one token-checked pass per
    // hand-over (16 relays, one checkpoint, 3 more relays), and the last
    // release: one request per acquisition.
    let stats = locker.locker().stats();
    assert_eq!(stats.acquisitions, 21);
    assert_eq!(stats.acquire_requests, 1);
    assert_eq!(stats.release_requests, 21);
    Ok(())
}

#[tokio::test]
async fn relay_lets_another_process_in_after_limit_passes() -> TestResult {
    let s = setup().await?;
    let key = "t:relay:fair";
    let a = relaying(&s, HandoffStyle::Grant, 2).await?;
    let b = relaying(&s, HandoffStyle::Grant, 2).await?;
    let mut conn = s.conn.clone();
    let holder = a
        .acquire_with(key, 10 * SECOND, &AcquireOptions::new())
        .await?;
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let holders = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for (i, name) in ["a1", "a2", "a3", "a4"].into_iter().enumerate() {
        tasks.push(spawn_recorder(&a, key, name, &order, &holders));
        until_queued_in_process(&a, key, i + 1).await?;
    }
    // B's first waiter queues in Redis on behalf of B's process; its second
    // queues behind it in process.
    tasks.push(spawn_recorder(&b, key, "b1", &order, &holders));
    until_queued(&mut conn, key, 1).await?;
    tasks.push(spawn_recorder(&b, key, "b2", &order, &holders));
    until_queued_in_process(&b, key, 1).await?;
    holder.release().await?;
    join_all(tasks).await?;
    // Two relays in A, then the checkpoint serves B's place in Redis
    // (and b2 behind it), while a3 queues in Redis behind B.
    assert_eq!(
        *order.lock().map_err(|_| "poisoned")?,
        vec!["a1", "a2", "b1", "b2", "a3", "a4"]
    );
    let left: bool = conn.exists(key).await?;
    assert!(!left);
    Ok(())
}

#[tokio::test]
async fn a_waiter_that_fell_back_to_redis_is_served_before_later_local_waiters() -> TestResult {
    let s = setup().await?;
    let key = "t:relay:fellback";
    let a = relaying(&s, HandoffStyle::Grant, 16).await?;
    let b = relaying(&s, HandoffStyle::Grant, 16).await?;
    let mut conn = s.conn.clone();
    // Another process holds the lock; a1 waits in Redis for A's process
    // and a2 queues behind it in process.
    let held = b
        .acquire_with(key, 10 * SECOND, &AcquireOptions::new())
        .await?;
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let holders = Arc::new(AtomicU32::new(0));
    let mut tasks = vec![spawn_recorder(&a, key, "a1", &order, &holders)];
    until_queued(&mut conn, key, 1).await?;
    // a2 asks for a short lease: with no holder of ours alive, it stops
    // waiting in process after that TTL and queues in Redis itself (as after
    // an outage), a second unit of A's there.
    let short = Duration::from_millis(200);
    tasks.push(spawn_recorder_with_ttl(
        &a, key, "a2", &order, &holders, short,
    ));
    until_queued(&mut conn, key, 2).await?;
    assert_eq!(a.queued_in_process(key), 0, "a2 fell back to Redis");
    // Later callers of A queue in process.
    for (i, name) in ["a3", "a4"].into_iter().enumerate() {
        tasks.push(spawn_recorder(&a, key, name, &order, &holders));
        until_queued_in_process(&a, key, i + 1).await?;
    }
    held.release().await?;
    join_all(tasks).await?;
    // a1's release serves Redis's queue first (a2 came before a3 and a4),
    // and relays to a3 and a4 only then.
    assert_eq!(
        *order.lock().map_err(|_| "poisoned")?,
        vec!["a1", "a2", "a3", "a4"]
    );
    let left: bool = conn.exists(key).await?;
    assert!(!left, "the last release left the lock behind");
    let queued: usize = conn.zcard(format!("{key}:waitq")).await?;
    assert_eq!(queued, 0);
    Ok(())
}

#[tokio::test]
async fn relay_gives_up_with_the_same_errors_and_loses_no_turn() -> TestResult {
    let s = setup().await?;
    let key = "t:relay:giveup";
    let locker = relaying(&s, HandoffStyle::Grant, 16).await?;
    let mut conn = s.conn.clone();
    let holder = locker
        .acquire_with(key, 30 * SECOND, &AcquireOptions::new())
        .await?;

    let short = AcquireOptions::new().wait(Duration::from_millis(20));
    let err = locker.acquire_with(key, 30 * SECOND, &short).await.err();
    assert!(
        matches!(
            err,
            Some(Error::NotAcquired {
                reason: GiveUpReason::DeadlineExpired,
                attempts: 1,
                ..
            })
        ),
        "{err:?}"
    );
    let once = AcquireOptions::new().retry(RetryStrategy::none());
    let err = locker.acquire_with(key, 30 * SECOND, &once).await.err();
    assert!(
        matches!(
            err,
            Some(Error::NotAcquired {
                reason: GiveUpReason::RetriesExhausted,
                attempts: 1,
                ..
            })
        ),
        "{err:?}"
    );
    every_strategy_gives_up_the_same_way(&locker, key).await?;
    assert_eq!(
        locker.queued_in_process(key),
        0,
        "a waiter that gave up stayed queued"
    );
    assert_eq!(
        locker.locker().stats().requests(),
        1,
        "waiting in process sent requests"
    );

    let cancel = CancellationToken::new();
    let waiting = {
        let (locker, cancel) = (locker.clone(), cancel.clone());
        tokio::spawn(async move {
            let opts = AcquireOptions::new().wait(HUNG).cancel(cancel);
            locker.acquire_with(key, 30 * SECOND, &opts).await
        })
    };
    until_queued_in_process(&locker, key, 1).await?;
    // A waiter whose future is dropped while queued.
    let forever = AcquireOptions::new().wait(HUNG);
    let mut dropped = Box::pin(locker.acquire_with(key, 30 * SECOND, &forever));
    tokio::select! {
        got = &mut dropped => return Err(format!("the dropped waiter got {got:?}").into()),
        queued = until_queued_in_process(&locker, key, 2) => queued?,
    }
    drop(dropped);
    let last = {
        let locker = locker.clone();
        tokio::spawn(async move {
            let opts = AcquireOptions::new().wait(HUNG);
            locker.acquire_with(key, 30 * SECOND, &opts).await
        })
    };
    until_queued_in_process(&locker, key, 2).await?;
    cancel.cancel();
    let err = tokio::time::timeout(HUNG, waiting).await??.err();
    assert!(
        matches!(
            err,
            Some(Error::NotAcquired {
                reason: GiveUpReason::Cancelled,
                attempts: 1,
                ..
            })
        ),
        "{err:?}"
    );
    assert_eq!(locker.queued_in_process(key), 1);
    holder.release().await?;
    let lease = tokio::time::timeout(HUNG, last).await???;
    let stored: String = conn.get(key).await?;
    assert_eq!(stored, lease.token().as_str());
    lease.release().await?;
    let left: bool = conn.exists(key).await?;
    assert!(!left);
    assert_eq!(locker.queued_in_process(key), 0);
    Ok(())
}

#[tokio::test]
async fn relay_a_dropped_lease_passes_on_and_a_leaked_one_blocks_only_its_ttl() -> TestResult {
    let s = setup().await?;
    let key = "t:relay:dead";
    let locker = relaying(&s, HandoffStyle::Grant, 16).await?;
    let mut conn = s.conn.clone();
    let opts = AcquireOptions::new().wait(HUNG);

    // Dropped: passed on in the background, at once (60 s TTL).
    let lease = locker
        .acquire_with(key, 60 * SECOND, &AcquireOptions::new())
        .await?;
    let next = {
        let (locker, opts) = (locker.clone(), opts.clone());
        tokio::spawn(async move { locker.acquire_with(key, 60 * SECOND, &opts).await })
    };
    until_queued_in_process(&locker, key, 1).await?;
    drop(lease);
    let next = tokio::time::timeout(HUNG, next).await???;

    // Leaked with a short TTL left: the waiter falls back to Redis when it
    // runs out and takes the lock there.
    next.refresh(Duration::from_millis(200)).await?;
    let waiter = {
        let (locker, opts) = (locker.clone(), opts.clone());
        tokio::spawn(async move { locker.acquire_with(key, 10 * SECOND, &opts).await })
    };
    until_queued_in_process(&locker, key, 1).await?;
    let leaked_token = next.token().clone();
    std::mem::forget(next);
    let lease = tokio::time::timeout(HUNG, waiter).await???;
    assert_ne!(lease.token(), &leaked_token);
    let stored: String = conn.get(key).await?;
    assert_eq!(stored, lease.token().as_str());
    lease.release().await?;
    let left: bool = conn.exists(key).await?;
    assert!(!left);

    // The leaked lease still counts as this locker's holder, but it ran
    // out: a later caller goes to Redis at once instead of queuing behind
    // it (queued, it would wait out its own 60 s TTL, past its deadline).
    let opts = AcquireOptions::new().wait(HUNG);
    let later = locker.acquire_with(key, 60 * SECOND, &opts).await?;
    let stored: String = conn.get(key).await?;
    assert_eq!(stored, later.token().as_str());
    later.release().await?;
    Ok(())
}

#[tokio::test]
async fn watchdog_and_replica_options_apply_in_hand_off_mode_relayed_or_not() -> TestResult {
    let s = setup().await?;
    let key = "t:handoff:options";
    let locker = relaying(&s, HandoffStyle::Grant, 16).await?;
    let mut conn = s.conn.clone();
    let watched = AcquireOptions::new().wait(HUNG).watchdog(true);
    let first = locker.acquire_with(key, 10 * SECOND, &watched).await?;
    assert!(first.is_watched());
    let second = {
        let (locker, watched) = (locker.clone(), watched.clone());
        tokio::spawn(async move { locker.acquire_with(key, 10 * SECOND, &watched).await })
    };
    until_queued_in_process(&locker, key, 1).await?;
    first.release().await?;
    let second = tokio::time::timeout(HUNG, second).await???;
    assert!(second.is_watched(), "a relayed lease gets its watchdog too");
    second.release().await?;

    // No replicas here: the lock is taken, found unreplicated and given back.
    let replicated = AcquireOptions::new()
        .wait_replicas(1, Duration::from_millis(20))
        .wait(Duration::from_millis(200));
    let err = locker
        .acquire_with(key, 10 * SECOND, &replicated)
        .await
        .err();
    assert!(
        matches!(
            err,
            Some(Error::NotReplicated {
                acked: 0,
                wanted: 1,
                ..
            })
        ),
        "{err:?}"
    );
    let left: bool = conn.exists(key).await?;
    assert!(!left, "an unreplicated lease must be given back");
    let zero = AcquireOptions::new().wait_replicas(1, Duration::ZERO);
    let err = locker.acquire_with(key, 10 * SECOND, &zero).await.err();
    assert!(matches!(err, Some(Error::InvalidOptions(_))), "{err:?}");
    Ok(())
}

/// Spawns a caller of `locker` that, once it holds `key`, checks that Redis
/// holds the lock for it (the key carries its own token), and releases.
fn spawn_confirmed(
    locker: &HandoffLocker,
    key: &'static str,
    tokens: &Arc<std::sync::Mutex<Vec<String>>>,
    conn: &redis::aio::ConnectionManager,
) -> tokio::task::JoinHandle<Result<(), Error>> {
    let (locker, tokens, mut conn) = (locker.clone(), tokens.clone(), conn.clone());
    tokio::spawn(async move {
        let opts = AcquireOptions::new().wait(HUNG);
        let lease = locker.acquire_with(key, 10 * SECOND, &opts).await?;
        let stored: Option<String> = conn
            .get(key)
            .await
            .map_err(|_| Error::InvalidOptions("could not read the lock"))?;
        if stored.as_deref() != Some(lease.token().as_str()) {
            return Err(Error::InvalidOptions(
                "a holder of ours works without the lock",
            ));
        }
        tokens
            .lock()
            .map_err(|_| Error::InvalidOptions("poisoned"))?
            .push(lease.token().as_str().to_owned());
        lease.release().await
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_hands_over_only_leases_redis_confirms_when_the_key_vanishes() -> TestResult {
    let s = setup().await?;
    let key = "t:relay:vanished";
    let ours = relaying(&s, HandoffStyle::Grant, 16).await?;
    let other = Locker::connect(&s.client).await?;
    let mut conn = s.conn.clone();
    let holder = ours
        .acquire_with(key, 10 * SECOND, &AcquireOptions::new())
        .await?;
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..20 {
        tasks.push(spawn_confirmed(&ours, key, &tokens, &s.conn));
        until_queued_in_process(&ours, key, i + 1).await?;
    }
    // The key vanishes (eviction, restart, failover) and another process
    // takes the lock; it keeps it until its TTL runs out.
    let _: () = conn.del(key).await?;
    let theirs = other.acquire(key, SECOND).await?;
    let err = holder.release().await.err();
    assert!(matches!(err, Some(Error::NotHeld { .. })), "{err:?}");
    join_all(tasks).await?;
    let tokens = tokens.lock().map_err(|_| "poisoned")?.clone();
    assert_eq!(tokens.len(), 20);
    let distinct: std::collections::HashSet<&String> = tokens.iter().collect();
    assert_eq!(distinct.len(), 20, "two holders shared a token");
    assert!(!tokens.contains(&theirs.token().as_str().to_owned()));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_a_lease_dropped_outside_any_runtime_blocks_the_key_only_until_its_ttl() -> TestResult
{
    let s = setup().await?;
    let key = "t:relay:no-runtime";
    let locker = relaying(&s, HandoffStyle::Grant, 16).await?;
    let mut conn = s.conn.clone();
    let lease = locker
        .acquire_with(key, Duration::from_millis(300), &AcquireOptions::new())
        .await?;
    let waiter = {
        let locker = locker.clone();
        tokio::spawn(async move {
            let opts = AcquireOptions::new().wait(HUNG);
            locker.acquire_with(key, 60 * SECOND, &opts).await
        })
    };
    until_queued_in_process(&locker, key, 1).await?;
    std::thread::spawn(move || drop(lease))
        .join()
        .map_err(|_| "the dropping thread panicked")?;
    // Queued behind a lease nobody will pass on, the waiter would wait out
    // its own 60 s TTL; it goes to Redis instead and takes the lock there.
    let got = tokio::time::timeout(HUNG, waiter).await???;
    let stored: String = conn.get(key).await?;
    assert_eq!(stored, got.token().as_str());
    got.release().await?;
    let later = locker
        .acquire_with(key, 60 * SECOND, &AcquireOptions::new().wait(HUNG))
        .await?;
    later.release().await?;
    assert_eq!(locker.queued_in_process(key), 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_served_promptly_after_the_pubsub_connection_is_killed() -> TestResult {
    let s = setup().await?;
    let key = "t:handoff:pubsub-kill";
    let a = handoff(&s, HandoffStyle::Grant).await?;
    let b = handoff(&s, HandoffStyle::Grant).await?;
    let mut conn = s.conn.clone();
    // Long TTLs: a waiter left to its fallback re-check (once per TTL) would
    // wait far past HUNG.
    let holder = b
        .acquire_with(key, 60 * SECOND, &AcquireOptions::new())
        .await?;
    let waiter = {
        let a = a.clone();
        tokio::spawn(async move {
            let opts = AcquireOptions::new().wait(HUNG);
            a.acquire_with(key, 60 * SECOND, &opts).await
        })
    };
    until_queued(&mut conn, key, 1).await?;
    s.server.redis_cli(&["CLIENT", "KILL", "TYPE", "pubsub"])?;
    holder.release().await?;
    let lease = tokio::time::timeout(HUNG, waiter).await???;
    let stored: String = conn.get(key).await?;
    assert_eq!(stored, lease.token().as_str());
    lease.release().await?;

    // And the resubscribed channel carries hand-offs again: B waits, A's
    // release grants it the lock.
    let holder = a
        .acquire_with(key, 60 * SECOND, &AcquireOptions::new())
        .await?;
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move {
            let opts = AcquireOptions::new().wait(HUNG);
            b.acquire_with(key, 60 * SECOND, &opts).await
        })
    };
    until_queued(&mut conn, key, 1).await?;
    holder.release().await?;
    let lease = tokio::time::timeout(HUNG, waiter).await???;
    lease.release().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_waiter_behind_a_plain_holder_still_gets_its_own_fence() -> TestResult {
    let s = setup().await?;
    let keys = leasehold::FencedKeys::for_resource("handoff:mixed")?;
    let key: &'static str = "lock:{handoff:mixed}";
    let a = handoff(&s, HandoffStyle::Grant).await?;
    let b = handoff(&s, HandoffStyle::Grant).await?;
    let mut conn = s.conn.clone();
    // A plain holder cannot issue the fenced waiter's token: its release
    // wakes the waiter, which takes the lock (and its token) itself.
    let plain = a
        .acquire_with(key, 60 * SECOND, &AcquireOptions::new())
        .await?;
    assert_eq!(plain.fence(), None);
    let waiter = {
        let (b, keys) = (b.clone(), keys.clone());
        tokio::spawn(async move {
            let opts = AcquireOptions::new().wait(HUNG);
            b.acquire_with(&keys, 60 * SECOND, &opts).await
        })
    };
    until_queued(&mut conn, key, 1).await?;
    plain.release().await?;
    let fenced = tokio::time::timeout(HUNG, waiter).await???;
    let first = fenced.fence().ok_or("the fenced waiter got no fence")?;
    let stored: String = conn.get(key).await?;
    assert_eq!(stored, fenced.token().as_str());

    // A fenced holder grants a plain waiter the lock (no fence for it) and
    // the next fenced holder a strictly greater token.
    let plain_waiter = {
        let a = a.clone();
        tokio::spawn(async move {
            let opts = AcquireOptions::new().wait(HUNG);
            a.acquire_with(key, 60 * SECOND, &opts).await
        })
    };
    until_queued(&mut conn, key, 1).await?;
    fenced.release().await?;
    let plain = tokio::time::timeout(HUNG, plain_waiter).await???;
    assert_eq!(plain.fence(), None);
    let stored: String = conn.get(key).await?;
    assert_eq!(stored, plain.token().as_str());
    plain.release().await?;
    let next = b
        .acquire_with(&keys, 60 * SECOND, &AcquireOptions::new())
        .await?;
    assert!(
        next.fence().is_some_and(|f| f > first),
        "{:?} after {first}",
        next.fence()
    );
    next.release().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_waiter_is_served_after_redis_restarts_under_it() -> TestResult {
    let mut s = setup().await?;
    let key = "t:handoff:restart";
    let a = handoff(&s, HandoffStyle::Grant).await?;
    let b = handoff(&s, HandoffStyle::Grant).await?;
    let mut conn = s.conn.clone();
    // Long TTLs: a waiter left to its fallback re-check would wait past HUNG.
    let held = a
        .acquire_with(key, 60 * SECOND, &AcquireOptions::new())
        .await?;
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move {
            let opts = AcquireOptions::new().wait(HUNG);
            b.acquire_with(key, 60 * SECOND, &opts).await
        })
    };
    until_queued(&mut conn, key, 1).await?;
    // Restarted empty: the lock and the queue are gone, both lockers'
    // connections are broken. The waiter's pub/sub connection comes back,
    // wakes it, and its re-check (on a reconnected lock connection) takes
    // the free lock.
    s.server.restart()?;
    let lease = tokio::time::timeout(HUNG, waiter).await???;
    let stored: Option<String> = loop {
        match conn.get(key).await {
            Ok(stored) => break stored,
            Err(_) => continue, // this connection reconnects too
        }
    };
    assert_eq!(stored.as_deref(), Some(lease.token().as_str()));
    // The old holder's lock is gone: its release says so (after the one
    // request that finds its connection broken, if it is the first).
    let token = held.token().clone();
    let err = held.release().await.err();
    match err {
        Some(Error::NotHeld { .. }) => {}
        Some(Error::Unreachable { .. }) => {
            let stored: Option<String> = conn.get(key).await?;
            assert_ne!(stored.as_deref(), Some(token.as_str()));
        }
        other => return Err(format!("{other:?}").into()),
    }
    lease.release().await?;
    Ok(())
}

/// Where the release that serves a stale queue entry comes from.
#[derive(Clone, Copy)]
enum Releaser {
    /// Another locker: the hand-off reaches the entry's locker over pub/sub.
    Other,
    /// The entry's own locker: it is served in process.
    Same,
}

/// A queue entry of a waiter that already gave up comes back (as after a
/// failover to a replica that had not seen it leave, or a restart from an
/// old AOF); a release then hands the lock to a token nobody will take.
/// Its locker notices that nobody waits or holds with that token there and
/// passes the lock on; before, the next waiter waited out the stale
/// entry's TTL (60 s here, longer than the test's hang detector).
async fn a_hand_off_to_a_stale_entry(style: HandoffStyle, releaser: Releaser) -> TestResult {
    let s = setup().await?;
    let key = "t:handoff:stale";
    let a = handoff(&s, style).await?;
    let b = handoff(&s, style).await?;
    let mut conn = s.conn.clone();
    let holding = match releaser {
        Releaser::Other => &b,
        Releaser::Same => &a,
    };
    let holder = holding
        .acquire_with(key, 60 * SECOND, &AcquireOptions::new())
        .await?;

    let cancel = CancellationToken::new();
    let gone = {
        let a = a.clone();
        let opts = AcquireOptions::new()
            .wait(120 * SECOND)
            .cancel(cancel.clone());
        tokio::spawn(async move { a.acquire_with(key, 60 * SECOND, &opts).await })
    };
    until_queued(&mut conn, key, 1).await?;
    let queue = format!("{key}:waitq");
    let waiters = format!("{key}:waiters");
    let tokens: Vec<(String, f64)> = conn.zrange_withscores(&queue, 0, 0).await?;
    let [(token, score)] = tokens.as_slice() else {
        return Err(format!("one entry expected, found {tokens:?}").into());
    };
    let entry: String = conn.hget(&waiters, token).await?;
    cancel.cancel();
    let err = tokio::time::timeout(HUNG, gone).await??.err();
    assert!(
        matches!(
            err,
            Some(Error::NotAcquired {
                reason: GiveUpReason::Cancelled,
                ..
            })
        ),
        "{err:?}"
    );
    // Its leave (in the background) empties the queue; then the entry comes
    // back as it was.
    until_queue(&mut conn, key, |len| len == 0).await?;
    let _: () = conn.zadd(&queue, token, *score).await?;
    let _: () = conn.hset(&waiters, token, &entry).await?;

    let next = {
        let b = b.clone();
        let opts = AcquireOptions::new().wait(HUNG);
        tokio::spawn(async move { b.acquire_with(key, 60 * SECOND, &opts).await })
    };
    until_queued(&mut conn, key, 2).await?;
    holder.release().await?;
    let lease = tokio::time::timeout(HUNG, next).await???;
    let stored: String = conn.get(key).await?;
    assert_eq!(stored, lease.token().as_str());
    lease.release().await?;
    let left: bool = conn.exists(key).await?;
    assert!(!left, "the last release left the lock behind");
    let queued: usize = conn.zcard(&queue).await?;
    assert_eq!(queued, 0, "the stale entry was left in the queue");
    Ok(())
}

#[tokio::test]
async fn a_grant_to_a_stale_entry_over_pubsub_is_passed_on() -> TestResult {
    a_hand_off_to_a_stale_entry(HandoffStyle::Grant, Releaser::Other).await
}

#[tokio::test]
async fn a_grant_to_a_stale_entry_in_process_is_passed_on() -> TestResult {
    a_hand_off_to_a_stale_entry(HandoffStyle::Grant, Releaser::Same).await
}

#[tokio::test]
async fn a_wake_for_a_stale_entry_is_passed_on() -> TestResult {
    a_hand_off_to_a_stale_entry(HandoffStyle::Wake, Releaser::Other).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_subscribed_on_a_replica_is_never_handed_a_lock_redis_did_not_give_it()
-> TestResult {
    let primary =
        RedisServer::start_with(RedisOptions::default().args(["--repl-diskless-sync-delay", "0"]))?;
    let replica = RedisServer::start_with(
        RedisOptions::default().replica_of(primary.host(), primary.port()),
    )?;
    let client = redis::Client::open(primary.url())?;
    let mut conn = leasehold_testkit::connection(&client, SECOND).await?;
    let acked: u64 = redis::cmd("WAIT")
        .arg(1)
        .arg(8000)
        .query_async(&mut conn)
        .await?;
    assert_eq!(acked, 1, "the replica never synced:\n{}", replica.log());
    let key = "t:handoff:replica-subscriber";
    let b = HandoffLocker::builder()
        .relay_limit(0)
        .connect(&client)
        .await?;
    // L sends its scripts to the primary, but its subscription sits on a
    // replica (as after a failover that demoted the node it subscribed
    // on). A replica receives what the primary publishes, which the
    // primary's SPUBLISH does not count.
    let l = HandoffLocker::builder()
        .relay_limit(0)
        .build(
            Locker::connect(&client).await?,
            &redis::Client::open(replica.url())?,
        )
        .await?;
    let holder = b
        .acquire_with(key, 60 * SECOND, &AcquireOptions::new())
        .await?;
    let w = {
        let l = l.clone();
        tokio::spawn(async move {
            let opts = AcquireOptions::new().wait(3 * SECOND);
            l.acquire_with(key, 60 * SECOND, &opts).await
        })
    };
    until_queued(&mut conn, key, 1).await?;
    let c = {
        let b = b.clone();
        tokio::spawn(async move {
            let opts = AcquireOptions::new().wait(HUNG);
            b.acquire_with(key, 60 * SECOND, &opts).await
        })
    };
    until_queued(&mut conn, key, 2).await?;
    let listening = replica.redis_cli(&["PUBSUB", "SHARDCHANNELS", "leasehold:handoff:*"])?;
    assert!(
        !listening.trim().is_empty(),
        "L does not listen on the replica"
    );
    // The release skips W (nobody listens for it on the primary) and
    // grants C. W must not take the grant its replica subscription saw.
    holder.release().await?;
    let served = tokio::time::timeout(HUNG, c).await???;
    let stored: String = conn.get(key).await?;
    assert_eq!(stored, served.token().as_str());
    let skipped = tokio::time::timeout(HUNG, w).await??;
    assert!(
        matches!(skipped, Err(Error::NotAcquired { .. })),
        "a waiter was handed a lock Redis gave another: {skipped:?}"
    );
    served.release().await?;
    Ok(())
}
