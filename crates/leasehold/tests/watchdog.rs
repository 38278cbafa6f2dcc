//! Refresh, the watchdog and `Lease::run` against a real, throwaway
//! redis-server (7.0 here, so release and refresh take the Lua path).

use leasehold::Lessor;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use leasehold::{AcquireOptions, Error, Locker, LostCause};
use redis::AsyncCommands;

mod common;
use common::*;

const MS: Duration = Duration::from_millis(1);

#[tokio::test]
async fn refresh_extends_the_ttl_and_keeps_the_token() -> TestResult {
    let (_server, mut conn, locker) = setup().await?;
    let lease = locker.acquire("t:refresh", 2 * SECOND).await?;
    let before = lease.valid_until();
    lease.refresh(30 * SECOND).await?;
    let pttl: i64 = conn.pttl("t:refresh").await?;
    assert!(pttl > 2000 && pttl <= 30_000, "pttl {pttl}");
    let stored: String = conn.get("t:refresh").await?;
    assert_eq!(stored, lease.token().as_str());
    assert_eq!(lease.ttl(), 30 * SECOND);
    assert!(lease.valid_until() > before);
    assert!(lease.confirmed_at() >= lease.acquired_at());
    lease.release().await?;
    Ok(())
}

#[tokio::test]
async fn refresh_of_an_expired_lease_is_not_held_and_creates_nothing() -> TestResult {
    let (_server, mut conn, locker) = setup().await?;
    let lease = locker.acquire("t:refresh:expired", 5 * MS).await?;
    until_gone(&mut conn, "t:refresh:expired").await?;

    let err = lease.refresh(30 * SECOND).await.err();
    assert!(matches!(err, Some(Error::NotHeld { .. })), "{err:?}");
    let exists: bool = conn.exists("t:refresh:expired").await?;
    assert!(!exists, "refresh recreated the key");
    assert_eq!(lease.lost(), Some(LostCause::Expired));

    // A lost lease stays lost, without asking Redis again.
    let err = lease.refresh(30 * SECOND).await.err();
    assert!(
        matches!(
            err,
            Some(Error::LeaseLost {
                cause: LostCause::Expired,
                ..
            })
        ),
        "{err:?}"
    );
    let err = lease.release().await.err();
    assert!(matches!(err, Some(Error::NotHeld { .. })), "{err:?}");
    Ok(())
}

#[tokio::test]
async fn refresh_of_a_taken_lease_leaves_the_successor_alone() -> TestResult {
    let (_server, mut conn, locker) = setup().await?;
    let lease = locker.acquire("t:refresh:taken", 30 * SECOND).await?;
    let () = redis::cmd("SET")
        .arg("t:refresh:taken")
        .arg("token-of-b")
        .arg("PX")
        .arg(5_000)
        .query_async(&mut conn)
        .await?;

    let err = lease.refresh(60 * SECOND).await.err();
    assert!(matches!(err, Some(Error::NotHeld { .. })), "{err:?}");
    let stored: String = conn.get("t:refresh:taken").await?;
    assert_eq!(stored, "token-of-b");
    let pttl: i64 = conn.pttl("t:refresh:taken").await?;
    assert!(pttl > 0 && pttl <= 5_000, "B's ttl was touched: {pttl}");
    Ok(())
}

#[tokio::test]
async fn refresh_rejects_a_bad_ttl_without_io() -> TestResult {
    let (server, _conn, locker) = setup().await?;
    let lease = locker.acquire("t:refresh:bad", 30 * SECOND).await?;
    server.pause()?;
    for ttl in [
        Duration::ZERO,
        Duration::from_micros(10),
        leasehold::MAX_TTL * 2,
    ] {
        let err = lease.refresh(ttl).await.err();
        assert!(
            matches!(err, Some(Error::InvalidTtl { .. })),
            "{ttl:?}: {err:?}"
        );
    }
    server.resume()?;
    lease.release().await?;
    Ok(())
}

#[tokio::test]
async fn refresh_against_a_paused_redis_fails_fast_with_timeout() -> TestResult {
    let (server, conn, _) = setup().await?;
    let locker = Locker::builder().command_timeout(200 * MS).build(conn)?;
    let lease = locker.acquire("t:refresh:paused", 30 * SECOND).await?;
    server.pause()?;
    let outcome = tokio::time::timeout(HUNG, lease.refresh(30 * SECOND)).await;
    server.resume()?;
    let err = outcome.map_err(|_| "refresh hung on a paused redis")?.err();
    assert!(
        matches!(err, Some(Error::Timeout { op: "refresh", .. })),
        "{err:?}"
    );
    // A refresh that could not ask does not lose the lease.
    assert_eq!(lease.lost(), None);
    lease.release().await?;
    Ok(())
}

#[tokio::test]
async fn the_watchdog_keeps_a_lease_past_its_ttl() -> TestResult {
    let (_server, mut conn, locker) = setup().await?;
    let lease = locker.acquire("t:wd:keep", 150 * MS).await?;
    // The work sleeps for several TTLs: without refreshes the key would go.
    let out = tokio::time::timeout(
        HUNG,
        lease.run(async {
            tokio::time::sleep(600 * MS).await;
            42
        }),
    )
    .await??;
    assert_eq!(out, 42);
    assert_eq!(lease.lost(), None);
    let stored: String = conn.get("t:wd:keep").await?;
    assert_eq!(stored, lease.token().as_str());
    lease.release().await?;
    Ok(())
}

#[tokio::test]
async fn a_key_deleted_behind_the_holders_back_cancels_the_work() -> TestResult {
    let (_server, conn, locker) = setup().await?;
    let lease = locker.acquire("t:wd:deleted", 300 * MS).await?;
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let deleter = {
        let mut conn = conn.clone();
        tokio::spawn(async move {
            started_rx.await.map_err(|_| "work never started")?;
            let _: i64 = conn.del("t:wd:deleted").await?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        })
    };
    let finished = Arc::new(AtomicBool::new(false));
    let work = {
        let finished = finished.clone();
        async move {
            let _ = started_tx.send(());
            // Long enough that only a cancellation ends it within HUNG.
            tokio::time::sleep(60 * SECOND).await;
            finished.store(true, Ordering::SeqCst);
        }
    };
    let outcome = tokio::time::timeout(HUNG, lease.run(work))
        .await
        .map_err(|_| "the loss was never noticed")?;
    deleter.await?.map_err(|e| e.to_string())?;
    assert!(
        matches!(
            &outcome,
            Err(Error::LeaseLost {
                cause: LostCause::Expired,
                key,
                service: leasehold::Service::REDIS,
            }) if key == "t:wd:deleted"
        ),
        "{outcome:?}"
    );
    assert!(
        !finished.load(Ordering::SeqCst),
        "the work ran to completion"
    );
    assert_eq!(lease.lost(), Some(LostCause::Expired));
    let err = lease.release().await.err();
    assert!(matches!(err, Some(Error::NotHeld { .. })), "{err:?}");
    Ok(())
}

#[tokio::test]
async fn a_paused_redis_cancels_the_work_as_unreachable() -> TestResult {
    let (server, _conn, locker) = setup().await?;
    let lease = locker.acquire("t:wd:paused", 300 * MS).await?;
    server.pause()?;
    let outcome = tokio::time::timeout(HUNG, lease.run(std::future::pending::<()>())).await;
    server.resume()?;
    let outcome = outcome.map_err(|_| "the watchdog never gave up on a paused redis")?;
    assert!(
        matches!(
            outcome,
            Err(Error::LeaseLost {
                cause: LostCause::Unreachable,
                ..
            })
        ),
        "{outcome:?}"
    );
    assert!(outcome.as_ref().err().is_some_and(Error::is_contention));
    // The lease may still be in Redis: release asks (and succeeds or not).
    let _ = lease.release().await;
    Ok(())
}

#[tokio::test]
async fn acquire_option_starts_the_watchdog() -> TestResult {
    let (_server, mut conn, locker) = setup().await?;
    let opts = AcquireOptions::new().watchdog(true);
    let lease = locker.acquire_with("t:wd:option", 300 * MS, &opts).await?;
    assert!(lease.is_watched());
    let lost = lease.watch()?;
    let _: i64 = conn.del("t:wd:option").await?;
    tokio::time::timeout(HUNG, lost.cancelled())
        .await
        .map_err(|_| "the loss was never noticed")?;
    assert_eq!(lease.lost(), Some(LostCause::Expired));
    let plain = locker.acquire("t:wd:plain", SECOND).await?;
    assert!(!plain.is_watched());
    plain.release().await?;
    Ok(())
}

#[tokio::test]
async fn release_and_drop_stop_the_watchdog_and_cancel_its_token() -> TestResult {
    let (_server, mut conn, locker) = setup().await?;
    let lease = locker.acquire("t:wd:release", 300 * MS).await?;
    let token = lease.watch()?;
    lease.release().await?;
    assert!(token.is_cancelled());
    let exists: bool = conn.exists("t:wd:release").await?;
    assert!(!exists);

    let lease = locker.acquire("t:wd:drop", 60 * SECOND).await?;
    let token = lease.watch()?;
    drop(lease);
    assert!(token.is_cancelled());
    // Only the background release frees a 60 s lease within this wait.
    let again = locker
        .acquire_with("t:wd:drop", SECOND, &AcquireOptions::new().wait(HUNG))
        .await?;
    again.release().await?;
    Ok(())
}

/// Connections killed more often than the watchdog refreshes (every 30
/// ms against a 600 ms TTL, refreshed every 200 ms), with Redis up
/// throughout: the request that finds its connection killed fails, the
/// next goes out on a new one, and the lease outlives the kills.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_keeps_a_lease_through_connections_killed_faster_than_it_refreshes()
-> TestResult {
    let (server, mut conn, locker) = setup().await?;
    let opts = AcquireOptions::new().watchdog(true);
    let lease = locker.acquire_with("t:killed", 600 * MS, &opts).await?;
    for _ in 0..60 {
        server.command(&["CLIENT", "KILL", "TYPE", "normal"])?;
        tokio::time::sleep(30 * MS).await;
    }
    assert_eq!(lease.lost(), None);
    // The test's own connection was killed too: its first request may
    // fail, and the next goes out anew.
    let stored: Option<String> = match conn.get("t:killed").await {
        Ok(stored) => stored,
        Err(_) => conn.get("t:killed").await?,
    };
    assert_eq!(stored.as_deref(), Some(lease.token().as_str()));
    lease.release().await?;
    Ok(())
}
