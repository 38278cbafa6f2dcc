//! The way back after a ZooKeeper ensemble is rebuilt empty (or restored
//! from an older backup): its zxids start again below the fences the
//! `leasehold-pg` guard stored, so its holders' tokens are refused until
//! the clients are given the next generation
//! (`ZkLockerBuilder::generation`). Then the new holders' tokens are above
//! every token of the old ensemble: accepted by the guard, while a holder
//! still on the old ensemble or the old generation is refused, never
//! accepted over a newer write.
//!
//! The "rebuilt" ensemble is a second, empty server beside the first: for
//! the tokens that is what a rebuild is (the same ports would change
//! nothing), and the first keeps its holder's lease alive, as a holder
//! that has not yet heard of the rebuild still believes it holds.

use std::time::Duration;

use leasehold::{Error, FencedKeys, FencingToken, Lease, Lessor};
use leasehold_pg::Guard;
use leasehold_testkit::{PostgresServer, ZooKeeperEnsemble};
use leasehold_zookeeper::{MAX_GENERATION, ZkLocker};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const TTL: Duration = Duration::from_secs(10);

async fn locker(ensemble: &ZooKeeperEnsemble, generation: u8) -> leasehold::Result<ZkLocker> {
    ZkLocker::builder()
        .session_timeout(Duration::from_secs(20))
        .generation(generation)
        .connect(&ensemble.connect_string())
        .await
}

fn fence(lease: &Lease) -> Result<FencingToken, &'static str> {
    lease.fence().ok_or("a fenced lease carries a token")
}

/// The guard's verdict on `lease`'s write, committed when accepted.
async fn write(
    db: &mut tokio_postgres::Client,
    lease: &Lease,
) -> Result<Guard, leasehold_pg::Error> {
    let tx = db.transaction().await?;
    let verdict = leasehold_pg::guard(&tx, lease).await?;
    if verdict.is_accepted() {
        tx.commit().await?;
    }
    Ok(verdict)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_rebuild_the_next_generation_is_accepted_and_the_old_one_refused() -> TestResult {
    let pg = PostgresServer::start()?;
    let mut db = leasehold_pg::connect(&pg.url()).await?;
    leasehold_pg::setup(&mut db).await?;
    let keys = FencedKeys::for_resource("wallet")?;

    // The ensemble before: some history (each lease a few writes), then a
    // holder whose write the guard takes.
    let before = ZooKeeperEnsemble::start_with(1, Duration::from_secs(1))?;
    let old_locker = locker(&before, 0).await?;
    let history = FencedKeys::for_resource("history")?;
    for _ in 0..5 {
        old_locker.acquire(&history, TTL).await?.release().await?;
    }
    let old = old_locker.acquire(&keys, TTL).await?;
    assert!(write(&mut db, &old).await?.is_accepted());

    // Rebuilt empty: its zxids start again, below the stored fence.
    let rebuilt = ZooKeeperEnsemble::start_with(1, Duration::from_secs(1))?;
    let same_generation = locker(&rebuilt, 0).await?;
    let restarted = same_generation.acquire(&keys, TTL).await?;
    assert!(
        fence(&restarted)? < fence(&old)?,
        "a rebuilt ensemble's first token is below the old one's: {:?} against {:?}",
        restarted.fence(),
        old.fence()
    );
    // Refused, and it would be for as long as the old fence stands.
    assert!(!write(&mut db, &restarted).await?.is_accepted());
    let _ = restarted.release().await;

    // The way back: the next generation on every client of the rebuilt
    // ensemble.
    let next = locker(&rebuilt, 1).await?;
    let new = next.acquire(&keys, TTL).await?;
    assert!(
        fence(&new)? > fence(&old)?,
        "{:?} against {:?}",
        new.fence(),
        old.fence()
    );
    assert!(write(&mut db, &new).await?.is_accepted());

    // Never accepted over the newer write: the holder from before the
    // rebuild (its lease still alive on the old ensemble)...
    let stale = write(&mut db, &old).await?;
    assert!(!stale.is_accepted(), "{stale:?}");
    // ...and a client of the rebuilt ensemble not yet given the setting.
    new.release().await?;
    let lagging = same_generation.acquire(&keys, TTL).await?;
    assert!(!write(&mut db, &lagging).await?.is_accepted());
    let _ = lagging.release().await;
    let _ = old.release().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generation_above_the_maximum_is_refused_before_any_io() -> TestResult {
    // Nothing listens there: the setting is checked first.
    let refused = ZkLocker::builder()
        .generation(MAX_GENERATION + 1)
        .connect("127.0.0.1:9")
        .await;
    assert!(
        matches!(refused, Err(Error::InvalidOptions(_))),
        "{refused:?}"
    );
    Ok(())
}
