//! The lease lock on a real local Redis Cluster (three masters).
#![cfg(feature = "cluster")]

use leasehold::Lessor;
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

/// The index of the node that serves `slot`.
fn owner(cluster: &RedisCluster, slot: u16) -> Result<usize, Box<dyn std::error::Error>> {
    let port = cluster.node_for_slot(slot).map(|o| o.port());
    Ok(cluster
        .nodes()
        .iter()
        .position(|n| Some(n.port()) == port)
        .ok_or("no owner")?)
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
    let from = owner(&cluster, slot)?;
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

/// The moment in a slot migration where the nodes disagree on the owner:
/// the source already names the target, the target still imports and
/// names the source. Requests bounce between the two until the target
/// takes the slot; the cluster client stops following the redirects and
/// returns `MOVED`. Redis ran nothing, so that is a fault that may pass:
/// retryable, and an acquire waiting through it gets the lock once the
/// slot settles, not an error.
#[tokio::test]
async fn an_acquire_rides_out_the_moment_the_nodes_disagree_on_a_slot() -> TestResult {
    let cluster = RedisCluster::start(3)?;
    let client = redis::cluster::ClusterClient::builder(cluster.urls())
        .min_retry_wait(1)
        .max_retry_wait(50)
        .build()?;
    let locker = Locker::builder().build(client.get_async_connection().await?)?;
    let keys = leasehold::FencedKeys::for_resource("wallet:disputed")?;
    let slot = cluster.slot_of(keys.lock())?;
    let from = owner(&cluster, slot)?;
    let to = (from + 1) % 3;
    // The lock is warm on the source, then the slot starts to move and the
    // source alone is told that the target owns it.
    locker
        .acquire(&keys, Duration::from_secs(30))
        .await?
        .release()
        .await?;
    cluster.begin_slot_migration(slot, from, to)?;
    cluster.nodes()[from].redis_cli(&[
        "MIGRATE",
        cluster.nodes()[to].host(),
        &cluster.nodes()[to].port().to_string(),
        keys.fence(),
        "0",
        "5000",
    ])?;
    let target = cluster.nodes()[to].redis_cli(&["CLUSTER", "MYID"])?;
    let slot_arg = slot.to_string();
    cluster.nodes()[from].redis_cli(&["CLUSTER", "SETSLOT", &slot_arg, "NODE", &target])?;

    let opts = leasehold::AcquireOptions::new().wait(Duration::from_millis(300));
    let err = locker
        .acquire_with(&keys, Duration::from_secs(30), &opts)
        .await
        .err()
        .ok_or("acquired while no node served the slot")?;
    assert!(err.is_retryable(), "{err:?}");

    let waiting = tokio::spawn({
        let locker = locker.clone();
        let keys = keys.clone();
        async move {
            let opts = leasehold::AcquireOptions::new().wait(Duration::from_secs(20));
            locker
                .acquire_with(&keys, Duration::from_secs(30), &opts)
                .await
        }
    });
    for node in std::iter::once(to).chain((0..3).filter(|&i| i != to && i != from)) {
        cluster.nodes()[node].redis_cli(&["CLUSTER", "SETSLOT", &slot_arg, "NODE", &target])?;
    }
    let lease = waiting.await??;
    assert_eq!(
        cluster.nodes()[to].redis_cli(&["EXISTS", keys.lock()])?,
        "1"
    );
    lease.release().await?;
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

/// The conformance suite's faults on a Redis Cluster: a lock or counter
/// deleted on the node that serves its slot. Pausing is not offered: with
/// every node stopped, the cluster's own failure detection, not the lock,
/// is what a check would see.
struct OnCluster<'a>(&'a RedisCluster);

fn testkit(err: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::service(
        leasehold::Service::named("testkit"),
        "fault",
        leasehold::backend::ServiceFault::Refused,
        err,
    )
}

impl OnCluster<'_> {
    fn del(&self, key: &str) -> leasehold::Result<()> {
        let slot = self.0.slot_of(key).map_err(testkit)?;
        let node = self
            .0
            .node_for_slot(slot)
            .ok_or_else(|| testkit(std::io::Error::other("no node serves the slot")))?;
        node.redis_cli(&["DEL", key]).map_err(testkit)?;
        Ok(())
    }
}

impl leasehold::conformance::Faults for OnCluster<'_> {
    fn offers(&self) -> leasehold::conformance::Offered {
        leasehold::conformance::Offered::ALL.pause(false)
    }

    async fn expire(&self, key: &str) -> leasehold::Result<()> {
        self.del(key)
    }

    async fn lose_fence(&self, fence_key: &str) -> leasehold::Result<()> {
        self.del(fence_key)
    }
}

/// Polling over a Redis Cluster connection keeps the `LockService`
/// contract: every check passes but the paused one, which is skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_passes_the_conformance_suite() -> TestResult {
    use leasehold::conformance::{self, Settings, Verdict};
    let cluster = RedisCluster::start(3)?;
    let client = redis::cluster::ClusterClient::new(cluster.urls())?;
    let locker = Locker::builder().build(client.get_async_connection().await?)?;
    let report = conformance::run(&locker, &OnCluster(&cluster), &Settings::default()).await;
    assert!(report.is_ok(), "{report}");
    let skipped: Vec<_> = report
        .checks
        .iter()
        .filter(|c| c.verdict != Verdict::Passed)
        .map(|c| c.name)
        .collect();
    assert_eq!(skipped, ["a_paused_service_is_never_success"], "{report}");
    Ok(())
}
