//! The lease lock on a real local Redis Cluster (three masters).
#![cfg(feature = "cluster")]

use std::time::Duration;

use leasehold::{Error, GiveUpReason, Locker};
use leasehold_testkit::RedisCluster;
use redis::AsyncCommands;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// One attempt, no retry.
fn once() -> leasehold::AcquireOptions {
    leasehold::AcquireOptions::new()
        .retry(leasehold::RetryStrategy::none())
        .wait(Duration::from_secs(1))
}

#[tokio::test]
async fn leases_work_across_slots_and_redirects() -> TestResult {
    let cluster = RedisCluster::start(3)?;
    let client = redis::cluster::ClusterClient::new(cluster.urls())?;
    let mut conn = client.get_async_connection().await?;
    let locker = Locker::builder().build(conn.clone())?;

    // Keys spread over all three nodes; the client follows MOVED itself.
    let keys: Vec<String> = (0..30).map(|i| format!("lock:cluster:{i}")).collect();
    let mut leases = Vec::new();
    for key in &keys {
        leases.push(locker.acquire(key, Duration::from_secs(30)).await?);
    }
    for node in cluster.nodes() {
        let keys = node.redis_cli(&["DBSIZE"])?;
        assert_ne!(keys, "0", "a node holds no lock: {keys}");
    }
    let err = locker
        .acquire_with(&keys[0], Duration::from_secs(30), &once())
        .await
        .err();
    assert!(
        matches!(
            err,
            Some(Error::NotAcquired {
                reason: GiveUpReason::RetriesExhausted,
                ..
            })
        ),
        "{err:?}"
    );
    for lease in leases {
        lease.release().await?;
    }
    for key in &keys {
        let exists: bool = conn.exists(key).await?;
        assert!(!exists, "{key} left behind");
    }
    Ok(())
}

#[tokio::test]
async fn ask_and_moved_redirects_are_followed_during_a_slot_migration() -> TestResult {
    let cluster = RedisCluster::start(3)?;
    let client = redis::cluster::ClusterClient::new(cluster.urls())?;
    let conn = client.get_async_connection().await?;
    let locker = Locker::builder().build(conn)?;
    let (held, fresh) = ("lock:{migrating}:held", "lock:{migrating}:fresh");
    let slot = cluster.slot_of(held)?;
    let from = cluster
        .nodes()
        .iter()
        .position(|n| Some(n.port()) == cluster.node_for_slot(slot).map(|o| o.port()))
        .ok_or("no owner")?;
    let to = (from + 1) % 3;

    let lease = locker.acquire(held, Duration::from_secs(30)).await?;
    cluster.begin_slot_migration(slot, from, to)?;
    // `fresh` is not on the source: the source answers ASK, the client
    // retries on the target with ASKING.
    let during = locker.acquire(fresh, Duration::from_secs(30)).await?;
    cluster.finish_slot_migration(slot, from, to)?;
    // Both keys now live on the target (one migrated, one written there
    // after ASK); the client follows MOVED to release them.
    assert_eq!(cluster.nodes()[to].redis_cli(&["DBSIZE"])?, "2");
    assert_eq!(cluster.nodes()[from].redis_cli(&["DBSIZE"])?, "0");
    lease.release().await?;
    during.release().await?;
    assert_eq!(cluster.nodes()[to].redis_cli(&["DBSIZE"])?, "0");
    let again = locker
        .acquire_with(held, Duration::from_secs(30), &once())
        .await?;
    assert_eq!(cluster.nodes()[to].redis_cli(&["EXISTS", held])?, "1");
    again.release().await?;
    Ok(())
}

#[tokio::test]
async fn fenced_acquire_works_because_both_keys_share_a_slot() -> TestResult {
    let cluster = RedisCluster::start(3)?;
    let client = redis::cluster::ClusterClient::new(cluster.urls())?;
    let locker = Locker::builder().build(client.get_async_connection().await?)?;
    let mut last = 0;
    for resource in ["wallet:1", "wallet:2", "wallet:42"] {
        let keys = leasehold::FencedKeys::for_resource(resource)?;
        for _ in 0..3 {
            let lease = locker.acquire(&keys, Duration::from_secs(30)).await?;
            let fence = lease.fence().ok_or("no fence")?.get();
            assert!(fence > 0);
            if resource == "wallet:42" {
                assert!(fence > last, "{fence} after {last}");
                last = fence;
            }
            lease.release().await?;
        }
    }
    // A pair in two slots would fail with CROSSSLOT on a cluster; it is
    // refused before any I/O instead.
    let err = leasehold::FencedKeys::new("lock:wallet:42", "fence:wallet:42").err();
    assert!(
        matches!(err, Some(Error::KeysInDifferentSlots { .. })),
        "{err:?}"
    );
    Ok(())
}
