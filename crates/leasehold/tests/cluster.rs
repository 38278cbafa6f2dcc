//! The lease lock on a real local Redis Cluster (three masters).

use std::time::Duration;

use leasehold::{Error, GiveUpReason, Locker};
use leasehold_testkit::RedisCluster;
use redis::AsyncCommands;

type TestResult = Result<(), Box<dyn std::error::Error>>;

#[tokio::test]
async fn leases_work_across_slots_and_redirects() -> TestResult {
    let cluster = RedisCluster::start(3)?;
    let client = redis::cluster::ClusterClient::new(cluster.urls())?;
    let mut conn = client.get_async_connection().await?;
    let locker = Locker::new(conn.clone());

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
        .try_acquire(&keys[0], Duration::from_secs(30))
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
