//! Fenced acquire against a real, throwaway redis-server.

use leasehold::Lessor;
use std::time::Duration;

use leasehold::{Error, FencedKeys, FencingToken};
use redis::AsyncCommands;

mod common;
use common::*;

#[tokio::test]
async fn tokens_increase_with_every_acquisition() -> TestResult {
    let (_server, mut conn, locker) = setup().await?;
    let keys = FencedKeys::for_resource("t:inc")?;
    // A counter ahead of the server's clock counts up by one.
    let ahead = FencingToken::MAX.get() - 100;
    let () = conn.set(keys.fence(), ahead).await?;
    let mut last = FencingToken::new(0);
    for expected in ahead + 1..=ahead + 5 {
        let lease = locker.acquire(&keys, 30 * SECOND).await?;
        let fence = lease.fence().ok_or("a fenced lease has a fence")?;
        assert_eq!(fence, FencingToken::new(expected));
        assert!(fence > last);
        last = fence;
        let stored: String = conn.get(keys.lock()).await?;
        assert_eq!(stored, lease.token().as_str());
        lease.release().await?;
    }
    let counter: u64 = conn.get(keys.fence()).await?;
    assert_eq!(counter, ahead + 5);
    // A counter behind it (or none) jumps to the clock, then grows.
    let () = conn.set(keys.fence(), 32).await?;
    let (seconds, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await?;
    let lease = locker.acquire(&keys, 30 * SECOND).await?;
    let fence = lease.fence().ok_or("a fenced lease has a fence")?;
    assert!(fence.get() >= seconds * 1_000_000 + micros, "{fence}");
    let counter: u64 = conn.get(keys.fence()).await?;
    assert_eq!(counter, fence.get());
    lease.release().await?;
    Ok(())
}

#[tokio::test]
async fn busy_lock_issues_no_token() -> TestResult {
    let (_server, mut conn, locker) = setup().await?;
    let keys = FencedKeys::for_resource("t:busy")?;
    let held = locker.acquire(&keys, 30 * SECOND).await?;
    let fence = held.fence().ok_or("a fenced lease has a fence")?;
    let opts = leasehold::AcquireOptions::new()
        .retry(leasehold::RetryStrategy::none())
        .wait(SECOND);
    let err = locker.acquire_with(&keys, 30 * SECOND, &opts).await.err();
    assert!(matches!(err, Some(Error::NotAcquired { .. })), "{err:?}");
    let counter: u64 = conn.get(keys.fence()).await?;
    assert_eq!(
        counter,
        fence.get(),
        "a refused acquire must not consume a token"
    );
    held.release().await?;
    Ok(())
}

#[tokio::test]
async fn plain_leases_have_no_fence() -> TestResult {
    let (_server, _conn, locker) = setup().await?;
    let lease = locker.acquire("t:plain", 30 * SECOND).await?;
    assert_eq!(lease.fence(), None);
    lease.release().await?;
    Ok(())
}

#[tokio::test]
async fn bad_fence_key_is_a_typed_error_and_leaves_no_lock() -> TestResult {
    let (_server, mut conn, locker) = setup().await?;
    let keys = FencedKeys::for_resource("t:badfence")?;
    for (setup, what) in [
        ("text", "not a number"),
        ("99999999999999999999", "out of range"),
        ("-5", "negative"),
    ] {
        let () = conn.set(keys.fence(), setup).await?;
        let err = locker.acquire(&keys, 30 * SECOND).await.err();
        assert!(
            matches!(&err, Some(Error::InvalidFence { key, .. }) if key == keys.fence()),
            "{what}: {err:?}"
        );
        let exists: bool = conn.exists(keys.lock()).await?;
        assert!(!exists, "{what}: the lock must not be left taken");
    }
    let () = conn.del(keys.fence()).await?;
    let () = conn.hset(keys.fence(), "f", "v").await?;
    let err = locker.acquire(&keys, 30 * SECOND).await.err();
    assert!(matches!(err, Some(Error::InvalidFence { .. })), "{err:?}");
    Ok(())
}

#[tokio::test]
async fn lock_key_of_another_type_is_wrong_type_not_busy() -> TestResult {
    let (_server, mut conn, locker) = setup().await?;
    let keys = FencedKeys::for_resource("t:wrongtype")?;
    let () = conn.rpush(keys.lock(), "x").await?;
    let err = locker.acquire(&keys, 30 * SECOND).await.err();
    assert!(
        matches!(&err, Some(Error::WrongType { key, .. }) if key == keys.lock()),
        "{err:?}"
    );
    Ok(())
}

#[tokio::test]
async fn mismatched_slot_pair_is_refused_without_io() -> TestResult {
    // No server at all: the pair is refused before anything could connect.
    let err = FencedKeys::new("lock:wallet:42", "fence:wallet:42").err();
    assert!(
        matches!(err, Some(Error::KeysInDifferentSlots { .. })),
        "{err:?}"
    );
    let message = err.map(|e| e.to_string()).unwrap_or_default();
    assert!(message.contains("hash tag"), "{message}");
    Ok(())
}

#[tokio::test]
async fn zero_ttl_is_refused_before_io() -> TestResult {
    let (_server, mut conn, locker) = setup().await?;
    let keys = FencedKeys::for_resource("t:ttl")?;
    let err = locker.acquire(&keys, Duration::ZERO).await.err();
    assert!(matches!(err, Some(Error::InvalidTtl { .. })), "{err:?}");
    let exists: bool = conn.exists(keys.fence()).await?;
    assert!(!exists);
    Ok(())
}
