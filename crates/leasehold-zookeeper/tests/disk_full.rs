//! A full disk on the leader, as the test kit makes one
//! (`ZooKeeperMember::fill_disk`: a file size limit at the end of its
//! transaction log, so its next logged write fails with "File too
//! large"): ZooKeeper 3.8 stops the member on the failed write, and once
//! the disk is freed (and the member restarted on its data, as an
//! operator would) the ensemble takes locks again.

use std::time::{Duration, Instant};

use leasehold::{FencedKeys, Lessor};
use leasehold_testkit::ZooKeeperEnsemble;
use leasehold_zookeeper::ZkLocker;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const TTL: Duration = Duration::from_secs(4);

/// Generous for a loaded machine: an election, a JVM started.
const WAIT: Duration = Duration::from_secs(30);

async fn locker(ensemble: &ZooKeeperEnsemble) -> leasehold::Result<ZkLocker> {
    ZkLocker::builder()
        .session_timeout(TTL)
        .connect(&ensemble.connect_string())
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_stops_the_leader_and_freed_it_serves_again() -> TestResult {
    let ensemble = ZooKeeperEnsemble::start(3)?;
    let keys = FencedKeys::for_resource("wallet")?;
    locker(&ensemble)
        .await?
        .acquire(&keys, TTL)
        .await?
        .release()
        .await?;

    let leader = ensemble.wait_for_leader(WAIT)?;
    let member = ensemble.member(leader);
    member.fill_disk()?;
    assert!(member.is_disk_full());
    // A take is a write, which the leader logs first: that fails. Its
    // outcome is not the point (the client may ride it out elsewhere).
    let writer = locker(&ensemble).await?;
    let _ = tokio::time::timeout(WAIT, writer.acquire(&keys, TTL)).await;
    let deadline = Instant::now() + WAIT;
    while !(member.log().contains("File too large") && member.mode().is_none()) {
        assert!(
            Instant::now() < deadline,
            "no failed write in the log, or it still serves"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    if member.is_running() {
        member.free_disk()?;
        assert!(!member.is_disk_full());
    }
    member.restart()?;
    ensemble.wait_healthy(WAIT)?;
    ensemble.wait_for_leader(WAIT)?;
    locker(&ensemble)
        .await?
        .acquire(&keys, TTL)
        .await?
        .release()
        .await?;
    Ok(())
}
