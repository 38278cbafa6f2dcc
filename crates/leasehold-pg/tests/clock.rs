//! The database's clock stepped forward under a `PgLocker` lease: expiry
//! is decided on the database's clock, so a step ends the lease early (its
//! holder, counting on its own monotonic clock, still believes it holds),
//! another takes the lock, and the guard keeps the data right.

use std::time::Duration;

use leasehold::{AcquireOptions, Error, FencedKeys, Lessor};
use leasehold_pg::PgLocker;
use leasehold_testkit::PostgresServer;
use tokio_postgres::Client;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// The server's `clock_timestamp()`, in microseconds since the epoch.
async fn server_clock(db: &Client) -> Result<i64, tokio_postgres::Error> {
    let row = db
        .query_one(
            "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint",
            &[],
        )
        .await?;
    row.try_get(0)
}

/// Whether `lease`'s write is taken by the guard (committed if so).
async fn guarded(db: &mut Client, lease: &leasehold::Lease) -> Result<bool, leasehold_pg::Error> {
    let tx = db.transaction().await?;
    let accepted = leasehold_pg::guard(&tx, lease).await?.is_accepted();
    if accepted {
        tx.commit().await?;
    }
    Ok(accepted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_clock_stepped_forward_ends_a_lease_early_and_the_guard_holds() -> TestResult {
    const TTL: Duration = Duration::from_secs(60);
    const STEP: Duration = Duration::from_secs(120);
    let server = PostgresServer::start_with_fake_clock()?;
    let mut db = leasehold_pg::connect(&server.url()).await?;
    leasehold_pg::setup(&mut db).await?;
    let locker = PgLocker::connect(&server.url()).await?;
    locker.setup().await?;
    let other = PgLocker::connect(&server.url()).await?;
    let keys = FencedKeys::for_resource("clock-step")?;

    let first = locker.acquire(&keys, TTL).await?;
    assert!(guarded(&mut db, &first).await?);
    let before = server_clock(&db).await?;
    server.jump_clock(STEP)?;
    let after = server_clock(&db).await?;
    let step_us = i64::try_from(STEP.as_micros())?;
    assert!(
        after - before >= step_us,
        "the server's clock did not follow the step: {before} then {after}"
    );

    // On the database's clock the lease has ended; its holder, on its own
    // clock, still has most of its TTL.
    let opts = AcquireOptions::new().wait(Duration::from_secs(10));
    let second = other.acquire_with(&keys, TTL, &opts).await?;
    assert!(first.remaining() > TTL / 2, "{:?}", first.remaining());
    assert!(second.fence() > first.fence());

    // The data stays right: the newer holder writes; the old one learns
    // at its next refresh that the lock is not its own, and its write is
    // refused.
    assert!(guarded(&mut db, &second).await?);
    let refreshed = first.refresh(TTL).await;
    assert!(
        matches!(refreshed, Err(Error::NotHeld { .. })),
        "{refreshed:?}"
    );
    assert!(!guarded(&mut db, &first).await?);
    second.release().await?;
    Ok(())
}
