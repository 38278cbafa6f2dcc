//! The lease lock against a real, throwaway redis-server.

use leasehold::Lessor;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use leasehold::{AcquireOptions, CancellationToken, Error, GiveUpReason, Locker, RetryStrategy};
use leasehold_testkit::{RedisOptions, RedisServer};
use redis::AsyncCommands;

mod common;
use common::*;

#[tokio::test]
async fn second_holder_is_refused_until_release() -> TestResult {
    let (_server, mut conn, locker) = setup().await?;
    let a = locker.acquire("t:busy", 30 * SECOND).await?;
    let stored: String = conn.get("t:busy").await?;
    assert_eq!(stored, a.token().as_str());

    let err = locker
        .acquire_with("t:busy", 30 * SECOND, &once())
        .await
        .err();
    assert!(
        matches!(
            err,
            Some(Error::NotAcquired {
                attempts: 1,
                reason: GiveUpReason::RetriesExhausted,
                ..
            })
        ),
        "{err:?}"
    );

    a.release().await?;
    let b = locker.acquire_with("t:busy", 30 * SECOND, &once()).await?;
    b.release().await?;
    let exists: bool = conn.exists("t:busy").await?;
    assert!(!exists, "release left the key behind");
    Ok(())
}

#[tokio::test]
async fn ttl_is_set_on_the_key() -> TestResult {
    let (_server, mut conn, locker) = setup().await?;
    let lease = locker.acquire("t:ttl", 2 * SECOND).await?;
    let pttl: i64 = conn.pttl("t:ttl").await?;
    assert!(pttl > 0 && pttl <= 2000, "pttl {pttl}");
    lease.release().await?;
    Ok(())
}

#[tokio::test]
async fn release_never_deletes_another_holders_lock() -> TestResult {
    let (_server, mut conn, locker) = setup().await?;
    let a = locker.acquire("t:other", 30 * SECOND).await?;
    // The lease changed hands behind A's back.
    let () = conn.set("t:other", "token-of-b").await?;

    let err = a.release().await.err();
    assert!(matches!(err, Some(Error::NotHeld { .. })), "{err:?}");
    let stored: String = conn.get("t:other").await?;
    assert_eq!(stored, "token-of-b");
    Ok(())
}

#[tokio::test]
async fn expired_lease_release_reports_not_held_and_spares_the_successor() -> TestResult {
    let (_server, mut conn, locker) = setup().await?;
    let a = locker
        .acquire("t:expired", Duration::from_millis(5))
        .await?;
    until_gone(&mut conn, "t:expired").await?;
    assert_eq!(a.remaining(), Duration::ZERO);

    let b = locker.acquire("t:expired", 30 * SECOND).await?;
    let err = a.release().await.err();
    assert!(matches!(err, Some(Error::NotHeld { .. })), "{err:?}");
    let stored: String = conn.get("t:expired").await?;
    assert_eq!(
        stored,
        b.token().as_str(),
        "A's late release touched B's lock"
    );
    b.release().await?;
    Ok(())
}

#[tokio::test]
async fn bad_ttl_and_key_are_rejected_without_io() -> TestResult {
    let (server, _conn, locker) = setup().await?;
    // Any request to a stopped server would time out instead.
    server.pause()?;
    for ttl in [
        Duration::ZERO,
        Duration::from_micros(500),
        leasehold::MAX_TTL * 2,
    ] {
        let err = locker.acquire_with("t:bad", ttl, &once()).await.err();
        assert!(
            matches!(err, Some(Error::InvalidTtl { .. })),
            "{ttl:?}: {err:?}"
        );
    }
    let err = locker.acquire_with("", SECOND, &once()).await.err();
    assert!(matches!(err, Some(Error::InvalidKey { .. })), "{err:?}");
    assert!(matches!(
        Locker::builder()
            .command_timeout(Duration::ZERO)
            .build(_conn.clone()),
        Err(Error::InvalidOptions(_))
    ));
    server.resume()?;
    Ok(())
}

#[tokio::test]
async fn paused_redis_fails_fast_with_timeout() -> TestResult {
    let (server, _conn, locker) = setup().await?;
    server.pause()?;
    let opts = AcquireOptions::new().wait(Duration::from_millis(200));
    let outcome = tokio::time::timeout(HUNG, locker.acquire_with("t:paused", SECOND, &opts)).await;
    server.resume()?;
    let err = outcome.map_err(|_| "acquire hung on a paused redis")?.err();
    assert!(
        matches!(err, Some(Error::Timeout { op: "acquire", .. })),
        "{err:?}"
    );
    assert!(err.as_ref().is_some_and(Error::is_retryable));
    Ok(())
}

/// On the locker's own reconnecting connection a paused Redis costs each
/// request its command timeout, never a hang: the library's requests
/// (bounded by their deadlines alone: that connection carries no response
/// timer of redis-rs's for them) and a command of the user's through
/// `Locker::connection` (bounded per response by the command timeout).
#[tokio::test]
async fn a_paused_redis_bounds_every_request_on_the_lockers_own_connection() -> TestResult {
    let server = RedisServer::start()?;
    let client = redis::Client::open(server.url())?;
    let locker = Locker::builder()
        .command_timeout(Duration::from_millis(200))
        .connect(&client)
        .await?;
    let held = locker.acquire("t:own:held", 10 * SECOND).await?;
    server.pause()?;
    let opts = AcquireOptions::new().wait(Duration::from_millis(500));
    let acquired =
        tokio::time::timeout(HUNG, locker.acquire_with("t:own:paused", SECOND, &opts)).await;
    let mut conn = locker.connection().clone();
    let user = tokio::time::timeout(
        HUNG,
        redis::cmd("GET")
            .arg("t:own:paused")
            .query_async::<Option<String>>(&mut conn),
    )
    .await;
    let released = tokio::time::timeout(HUNG, held.release()).await;
    server.resume()?;
    // (Its last failure may be the undo of an attempt that timed out,
    // reported as op "release".)
    let err = acquired
        .map_err(|_| "acquire hung on a paused redis")?
        .err();
    assert!(matches!(err, Some(Error::Timeout { .. })), "{err:?}");
    let err = user
        .map_err(|_| "a user command hung on a paused redis")?
        .err();
    assert!(
        err.as_ref().is_some_and(redis::RedisError::is_timeout),
        "{err:?}"
    );
    let err = released
        .map_err(|_| "release hung on a paused redis")?
        .err();
    assert!(
        matches!(err, Some(Error::Timeout { op: "release", .. })),
        "{err:?}"
    );
    Ok(())
}

#[tokio::test]
async fn connecting_to_a_paused_redis_times_out() -> TestResult {
    let server = RedisServer::start()?;
    server.pause()?;
    let client = redis::Client::open(server.url())?;
    let outcome = tokio::time::timeout(
        HUNG,
        Locker::builder()
            .command_timeout(Duration::from_millis(200))
            .connect(&client),
    )
    .await;
    server.resume()?;
    let err = outcome.map_err(|_| "connect hung on a paused redis")?.err();
    assert!(matches!(err, Some(Error::Timeout { .. })), "{err:?}");
    Ok(())
}

#[tokio::test]
async fn unreachable_redis_is_reported_as_such() -> TestResult {
    let port = leasehold_testkit::free_port()?;
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
    let err = Locker::connect(&client).await.err();
    assert!(matches!(err, Some(Error::Unreachable { .. })), "{err:?}");

    let (mut server, _conn, locker) = setup().await?;
    server.kill()?;
    let err = locker.acquire_with("t:gone", SECOND, &once()).await.err();
    assert!(
        matches!(err, Some(Error::Unreachable { .. } | Error::Timeout { .. })),
        "{err:?}"
    );
    Ok(())
}

#[tokio::test]
async fn wrong_password_and_missing_password_are_auth_errors() -> TestResult {
    let server = RedisServer::start_with(RedisOptions::default().password("right-horse"))?;
    let wrong = redis::Client::open(format!("redis://:wrong-horse@127.0.0.1:{}/", server.port()))?;
    let err = Locker::connect(&wrong).await.err();
    assert!(matches!(err, Some(Error::Auth(_))), "{err:?}");
    assert!(
        !format!(
            "{:?} {}",
            err,
            err.as_ref().map(ToString::to_string).unwrap_or_default()
        )
        .contains("wrong-horse")
    );

    let anonymous = redis::Client::open(format!("redis://127.0.0.1:{}/", server.port()))?;
    let outcome = match Locker::connect(&anonymous).await {
        Ok(locker) => locker
            .acquire_with("t:auth", SECOND, &once())
            .await
            .map(|_| ()),
        Err(err) => Err(err),
    };
    assert!(matches!(outcome, Err(Error::Auth(_))), "{outcome:?}");

    let right = redis::Client::open(server.url())?;
    let lease = Locker::connect(&right)
        .await?
        .acquire_with("t:auth", SECOND, &once())
        .await?;
    lease.release().await?;
    Ok(())
}

#[tokio::test]
async fn key_of_the_wrong_type_is_reported() -> TestResult {
    let (_server, mut conn, locker) = setup().await?;
    let () = conn.hset("t:hash", "field", "value").await?;
    let err = locker.acquire_with("t:hash", SECOND, &once()).await.err();
    assert!(matches!(err, Some(Error::WrongType { .. })), "{err:?}");
    let kind: String = redis::cmd("TYPE")
        .arg("t:hash")
        .query_async(&mut conn)
        .await?;
    assert_eq!(kind, "hash", "the other value was touched");
    Ok(())
}

#[tokio::test]
async fn deadline_and_cancel_are_distinguished_from_busy() -> TestResult {
    let (_server, _conn, locker) = setup().await?;
    let holder = locker.acquire("t:wait", 30 * SECOND).await?;

    let opts = AcquireOptions::new().wait(Duration::from_millis(50));
    let err = locker.acquire_with("t:wait", SECOND, &opts).await.err();
    assert!(
        matches!(err, Some(Error::NotAcquired { reason: GiveUpReason::DeadlineExpired, attempts, .. }) if attempts >= 1),
        "{err:?}"
    );

    let cancel = CancellationToken::new();
    let opts = AcquireOptions::new()
        .wait(30 * SECOND)
        .cancel(cancel.clone());
    let waiter = {
        let locker = locker.clone();
        tokio::spawn(async move {
            locker
                .acquire_with("t:wait", SECOND, &opts)
                .await
                .map(|_| ())
        })
    };
    cancel.cancel();
    let err = waiter.await?.err();
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
    assert!(!err.as_ref().is_some_and(Error::is_retryable));

    let opts = AcquireOptions::new()
        .retry(RetryStrategy::constant(Duration::from_millis(1)).max_attempts(3));
    let err = locker.acquire_with("t:wait", SECOND, &opts).await.err();
    assert!(
        matches!(
            err,
            Some(Error::NotAcquired {
                reason: GiveUpReason::RetriesExhausted,
                attempts: 3,
                ..
            })
        ),
        "{err:?}"
    );
    holder.release().await?;
    Ok(())
}

#[tokio::test]
async fn the_lock_serialises_a_read_modify_write() -> TestResult {
    let (_server, conn, locker) = setup().await?;
    let () = conn.clone().set("t:counter", 0).await?;
    let lost = Arc::new(AtomicI64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..40 {
        let (locker, mut conn, lost) = (locker.clone(), conn.clone(), lost.clone());
        tasks.spawn(async move {
            let lease = locker.acquire("t:counter:lock", 5 * SECOND).await?;
            let n: i64 = conn
                .get("t:counter")
                .await
                .map_err(|_| Error::InvalidOptions("get"))?;
            tokio::task::yield_now().await;
            let () = conn
                .set("t:counter", n + 1)
                .await
                .map_err(|_| Error::InvalidOptions("set"))?;
            if lease.release().await.is_err() {
                lost.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, Error>(())
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined??;
    }
    let n: i64 = conn.clone().get("t:counter").await?;
    assert_eq!(n, 40);
    assert_eq!(lost.load(Ordering::Relaxed), 0);
    Ok(())
}

#[tokio::test]
async fn a_dropped_lease_is_released_in_the_background() -> TestResult {
    let (_server, _conn, locker) = setup().await?;
    let lease = locker.acquire("t:drop", 60 * SECOND).await?;
    drop(lease);
    // Only the background release can free a 60 s lease within this wait.
    let again = locker
        .acquire_with("t:drop", SECOND, &AcquireOptions::new().wait(HUNG))
        .await?;
    again.release().await?;
    Ok(())
}

#[tokio::test]
async fn a_timed_out_acquire_leaves_no_orphaned_lock() -> TestResult {
    let (server, mut conn, locker) = setup().await?;
    server.pause()?;
    let opts = AcquireOptions::new().wait(Duration::from_millis(100));
    let err = locker
        .acquire_with("t:orphan", 60 * SECOND, &opts)
        .await
        .err();
    assert!(matches!(err, Some(Error::Timeout { .. })), "{err:?}");
    // The SET is still queued in the socket and lands on resume; the release
    // spawned on timeout must follow it.
    server.resume()?;
    until_gone(&mut conn, "t:orphan").await?;
    Ok(())
}

/// Takes `key` with single attempts until one wins, counting the failures
/// (each must say a retry can succeed). Bounded by [`HUNG`].
async fn first_win(
    locker: &Locker,
    key: &str,
) -> Result<(leasehold::Lease, u32), Box<dyn std::error::Error>> {
    let mut failures = 0;
    let lease = tokio::time::timeout(HUNG, async {
        loop {
            match locker.acquire_with(key, SECOND, &once()).await {
                Ok(lease) => return Ok::<_, Error>(lease),
                Err(err) if err.is_retryable() => failures += 1,
                Err(err) => return Err(err),
            }
        }
    })
    .await??;
    Ok((lease, failures))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_lived_locker_works_again_after_redis_restarts() -> TestResult {
    let mut server = RedisServer::start()?;
    let client = redis::Client::open(server.url())?;
    let locker = Locker::connect(&client).await?;
    let key = "t:restart";
    locker.acquire(key, SECOND).await?.release().await?;
    for round in 0..2 {
        server.restart()?;
        // The request that finds the old connection broken fails and starts
        // the reconnect; the next one goes out on the new connection.
        let (lease, failures) = first_win(&locker, key).await?;
        assert!(
            failures <= 1,
            "round {round}: {failures} failures after the restart"
        );
        lease.release().await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_connection_is_replaced_by_the_next_request() -> TestResult {
    let (server, _conn, _) = setup().await?;
    let client = redis::Client::open(server.url())?;
    let locker = Locker::connect(&client).await?;
    let key = "t:client-kill";
    locker.acquire(key, SECOND).await?.release().await?;
    server.redis_cli(&["CLIENT", "KILL", "TYPE", "normal"])?;
    let (lease, failures) = first_win(&locker, key).await?;
    assert!(failures <= 1, "{failures} failures after the kill");
    lease.release().await?;
    Ok(())
}

#[tokio::test]
async fn a_permission_error_is_not_retryable() -> TestResult {
    let (server, _conn, _) = setup().await?;
    server.set_acl_user("noset", "pw", &["~*", "+@all", "-set"])?;
    let url = format!("redis://noset:pw@{}:{}", server.host(), server.port());
    let locker = Locker::connect(&redis::Client::open(url)?).await?;
    let err = locker.acquire_with("t:noperm", SECOND, &once()).await.err();
    assert!(
        matches!(&err, Some(Error::NoPermission { command, .. }) if command == "SET"),
        "{err:?}"
    );
    assert!(
        !err.as_ref().is_some_and(Error::is_retryable),
        "{err:?} must not be retryable"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mode_works_under_the_minimal_acl() -> TestResult {
    let (server, _conn, _) = setup().await?;
    server.set_acl_user("locker", "pw", LOCK_USER_ACL)?;
    let client = redis::Client::open(format!(
        "redis://locker:pw@{}:{}",
        server.host(),
        server.port()
    ))?;
    let locker = Locker::connect(&client).await?;
    let ttl = 10 * SECOND;

    let plain = locker.acquire("lock:acl", ttl).await?;
    plain.refresh(ttl).await?;
    plain.release().await?;

    let keys = leasehold::FencedKeys::for_resource("acl")?;
    let fenced = locker.acquire(&keys, ttl).await?;
    fenced
        .raise_fence(leasehold::FencingToken::new(100))
        .await?;
    fenced.release().await?;

    #[cfg(feature = "handoff")]
    {
        let handoff = leasehold::HandoffLocker::builder()
            .build(locker.clone(), &client)
            .await?;
        let first = handoff.acquire(&keys, ttl).await?;
        let waiter = {
            let (handoff, keys) = (handoff.clone(), keys.clone());
            tokio::spawn(async move {
                let opts = AcquireOptions::new().wait(HUNG);
                handoff.acquire_with(&keys, ttl, &opts).await
            })
        };
        while handoff.queued_in_process(keys.lock()) < 1 {
            tokio::task::yield_now().await;
        }
        first.release().await?;
        let second = tokio::time::timeout(HUNG, waiter).await???;
        assert!(second.fence() > Some(leasehold::FencingToken::new(100)));
        second.release().await?;

        // Waiters queued in Redis (relay off, another "process").
        let fifo = leasehold::HandoffLocker::builder()
            .relay_limit(0)
            .build(locker.clone(), &client)
            .await?;
        let other = leasehold::HandoffLocker::builder()
            .relay_limit(0)
            .connect(&client)
            .await?;
        let first = fifo.acquire(&keys, ttl).await?;
        let waiter = {
            let (other, keys) = (other.clone(), keys.clone());
            tokio::spawn(async move {
                let opts = AcquireOptions::new().wait(HUNG);
                other.acquire_with(&keys, ttl, &opts).await
            })
        };
        while server.redis_cli(&["ZCARD", "lock:{acl}:waitq"])? != "1" {
            tokio::task::yield_now().await;
        }
        first.release().await?;
        tokio::time::timeout(HUNG, waiter)
            .await???
            .release()
            .await?;
    }

    // WAIT is allowed: no replica here, so the lock is given back.
    let replicated = AcquireOptions::new()
        .wait_replicas(1, Duration::from_millis(10))
        .wait(Duration::from_millis(100));
    let err = locker
        .acquire_with("lock:acl:wait", ttl, &replicated)
        .await
        .err();
    assert!(matches!(err, Some(Error::NotReplicated { .. })), "{err:?}");

    // Outside the key patterns: refused, typed.
    let err = locker.acquire("elsewhere", ttl).await.err();
    assert!(matches!(err, Some(Error::NoPermission { .. })), "{err:?}");
    Ok(())
}
