//! `AcquireOptions::wait_replicas` against a real primary and replica.

use leasehold::Lessor;
use std::time::Duration;

use leasehold::{AcquireOptions, Connection, Error, FencedKeys, Locker};
use leasehold_testkit::{RedisOptions, RedisServer};
use redis::AsyncCommands;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const SECOND: Duration = Duration::from_secs(1);

struct Pair {
    /// Kept alive for the test; stopped on drop.
    _primary: RedisServer,
    replica: RedisServer,
    conn: Connection,
    locker: Locker,
}

/// A primary and its replica, synced: a write has been acknowledged by the
/// replica before this returns.
async fn pair() -> Result<Pair, Box<dyn std::error::Error>> {
    let primary =
        RedisServer::start_with(RedisOptions::default().args(["--repl-diskless-sync-delay", "0"]))?;
    let replica = RedisServer::start_with(
        RedisOptions::default().replica_of(primary.host(), primary.port()),
    )?;
    let client = redis::Client::open(primary.url())?;
    // The locker's WAIT waits for the writes of its connection: ours too.
    let locker = Locker::builder()
        .command_timeout(10 * SECOND)
        .connect(&client)
        .await?;
    let mut conn = locker.connection().clone();
    let () = conn.set("t:synced", 1).await?;
    let acked: u64 = redis::cmd("WAIT")
        .arg(1)
        .arg(8000)
        .query_async(&mut conn)
        .await?;
    assert_eq!(acked, 1, "the replica never synced:\n{}", replica.log());
    Ok(Pair {
        _primary: primary,
        replica,
        conn,
        locker,
    })
}

fn wait_for_one(timeout: Duration) -> AcquireOptions {
    AcquireOptions::new()
        .wait(2 * SECOND)
        .wait_replicas(1, timeout)
}

#[tokio::test]
async fn healthy_replica_acknowledges_the_lock() -> TestResult {
    let p = pair().await?;
    let lease = p
        .locker
        .acquire_with("t:wait:ok", 30 * SECOND, &wait_for_one(2 * SECOND))
        .await?;
    // WAIT returned 1, so the replica has the key now, not eventually.
    let on_replica = p.replica.redis_cli(&["GET", "t:wait:ok"])?;
    assert_eq!(on_replica, lease.token().as_str());

    let keys = FencedKeys::for_resource("t:wait:fenced")?;
    let fenced = p
        .locker
        .acquire_with(&keys, 30 * SECOND, &wait_for_one(2 * SECOND))
        .await?;
    let fence = fenced.fence().ok_or("fenced")?;
    assert_eq!(
        p.replica.redis_cli(&["GET", keys.fence()])?,
        fence.to_string()
    );
    lease.release().await?;
    fenced.release().await?;
    Ok(())
}

/// A win too few replicas acknowledged is given back and taken again
/// within the caller's wait: a replica that stalls for a moment costs the
/// caller time, not an error. The replica comes back only once a first
/// win was given back, so the first try is known to have failed.
#[tokio::test]
async fn a_replica_back_within_the_wait_gives_the_lock_not_an_error() -> TestResult {
    let p = pair().await?;
    let before = p.locker.stats();
    p.replica.pause()?;
    let acquire = tokio::spawn({
        let locker = p.locker.clone();
        let opts = wait_for_one(Duration::from_millis(100)).wait(20 * SECOND);
        async move { locker.acquire_with("t:wait:back", 30 * SECOND, &opts).await }
    });
    let hung = std::time::Instant::now() + 20 * SECOND;
    while p.locker.stats().release_requests == before.release_requests {
        assert!(
            std::time::Instant::now() < hung,
            "no unreplicated win given back"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    p.replica.resume()?;
    let lease = acquire.await??;
    let after = p.locker.stats();
    assert!(
        after.acquisitions >= before.acquisitions + 2,
        "{before:?} {after:?}"
    );
    let on_replica = p.replica.redis_cli(&["GET", "t:wait:back"])?;
    assert_eq!(on_replica, lease.token().as_str());
    lease.release().await?;
    Ok(())
}

/// A replica that does not come back within the wait: the caller gets
/// `NotReplicated` at its deadline, and no lock is left behind.
#[tokio::test]
async fn paused_replica_means_not_replicated_and_no_lock_left() -> TestResult {
    let mut p = pair().await?;
    p.replica.pause()?;
    let err = p
        .locker
        .acquire_with(
            "t:wait:lost",
            30 * SECOND,
            &wait_for_one(Duration::from_millis(200)).wait(SECOND / 2),
        )
        .await
        .err();
    let Some(Error::NotReplicated { key, acked, wanted }) = &err else {
        panic!("expected NotReplicated, got {err:?}");
    };
    assert_eq!((key.as_str(), *acked, *wanted), ("t:wait:lost", 0, 1));
    assert!(err.as_ref().is_some_and(Error::is_retryable));
    let left: Option<String> = p.conn.get("t:wait:lost").await?;
    assert_eq!(left, None, "the unreplicated lock must be released");

    let keys = FencedKeys::for_resource("t:wait:fenced-lost")?;
    let err = p
        .locker
        .acquire_with(
            &keys,
            30 * SECOND,
            &wait_for_one(Duration::from_millis(200)).wait(SECOND / 2),
        )
        .await
        .err();
    assert!(
        matches!(err, Some(Error::NotReplicated { acked: 0, .. })),
        "{err:?}"
    );
    let left: Option<String> = p.conn.get(keys.lock()).await?;
    assert_eq!(left, None, "the unreplicated fenced lock must be released");

    // Without waiting for replicas the same acquire succeeds: the lock is
    // only on the primary, which is exactly the failover hazard.
    let lease = p.locker.acquire("t:wait:lost", 30 * SECOND).await?;
    lease.release().await?;
    Ok(())
}

#[tokio::test]
async fn zero_wait_timeout_is_refused_before_any_io() -> TestResult {
    let p = pair().await?;
    let opts = AcquireOptions::new().wait_replicas(1, Duration::ZERO);
    let err = p
        .locker
        .acquire_with("t:wait:zero", SECOND, &opts)
        .await
        .err();
    assert!(matches!(err, Some(Error::InvalidOptions(_))), "{err:?}");
    let keys = FencedKeys::for_resource("t:wait:zero")?;
    let err = p.locker.acquire_with(&keys, SECOND, &opts).await.err();
    assert!(matches!(err, Some(Error::InvalidOptions(_))), "{err:?}");
    let mut conn = p.conn.clone();
    let left: Option<String> = conn.get("t:wait:zero").await?;
    assert_eq!(left, None);
    Ok(())
}

#[tokio::test]
#[cfg(feature = "quorum")]
async fn a_quorum_refuses_to_wait_for_replicas() -> TestResult {
    let p = pair().await?;
    let quorum = leasehold::Quorum::builder().build(vec![p.conn.clone()])?;
    let keys = FencedKeys::for_resource("t:wait:quorum")?;
    let err = quorum
        .acquire_with(&keys, SECOND, &wait_for_one(SECOND))
        .await
        .err();
    assert!(matches!(err, Some(Error::InvalidOptions(_))), "{err:?}");
    let mut conn = p.conn.clone();
    let left: Option<String> = conn.get(keys.lock()).await?;
    assert_eq!(left, None);
    Ok(())
}
