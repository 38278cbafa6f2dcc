//! `PgLocker` across a promoted standby (a failover). Synchronous: every
//! lease and token the primary confirmed is on the standby, so after its
//! promotion a held lock is still held and the next token is above every
//! one issued. Asynchronous, with the standby behind: a lease the primary
//! confirmed can be lost (another takes the lock: that remains, and the
//! guard is what keeps the data right then), but no token is issued
//! twice, since a token is never below the server's timeline times 2^40
//! and a promotion starts a new timeline.

use std::time::Duration;

use leasehold::{AcquireOptions, Error, FencedKeys, FencingToken, Lease, Lessor};
use leasehold_pg::PgLocker;
use leasehold_pg::tokio_postgres::Client;
use leasehold_testkit::{FaultProxy, PostgresServer, Replication};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A hang guard for what must happen, never a timing assertion.
const PATIENCE: Duration = Duration::from_secs(30);

/// Long enough that only a failover ends a lease in these tests.
const TTL: Duration = Duration::from_secs(120);

fn fence(lease: &Lease) -> Result<FencingToken, &'static str> {
    lease.fence().ok_or("a fenced lease carries a token")
}

/// Polls `sql` (one boolean) on `db` until it is true; a hang guard of
/// `PATIENCE`. (The server offers no signal for a replication state.)
async fn until(db: &Client, sql: &str) -> TestResult {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let row = db.query_opt(sql, &[]).await?;
        if row.is_some_and(|row| row.get::<_, Option<bool>>(0) == Some(true)) {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!("never true: {sql}").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The standby has replayed everything the primary has written so far.
const CAUGHT_UP: &str = "SELECT replay_lsn >= pg_current_wal_lsn() FROM pg_stat_replication";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_synchronous_standby_keeps_every_lease_and_token() -> TestResult {
    let primary = PostgresServer::start()?;
    let standby = primary.start_standby(Replication::Sync)?;
    let admin = leasehold_pg::connect(&primary.url()).await?;
    until(
        &admin,
        "SELECT sync_state = 'sync' AND state = 'streaming' FROM pg_stat_replication",
    )
    .await?;
    let locker = PgLocker::connect(&primary.url()).await?;
    locker.setup().await?;
    until(&admin, CAUGHT_UP).await?;

    let held_keys = FencedKeys::for_resource("held")?;
    let held = locker.acquire(&held_keys, TTL).await?;
    let released_keys = FencedKeys::for_resource("released")?;
    let released = locker.acquire(&released_keys, TTL).await?;
    let last = fence(&released)?;
    released.release().await?;

    primary.crash()?;
    standby.promote()?;
    let after = PgLocker::connect(&standby.url()).await?;
    // The held lease was confirmed, so the standby has it: still busy.
    // A wait long enough that a loaded machine's first step (a new
    // connection, then the take) ends inside it, so that the answer is the
    // lock's state rather than a request cut off by the deadline (a
    // `Timeout` after 24 ms of a 500 ms wait, seen under CI load).
    let once = AcquireOptions::new().wait(Duration::from_secs(5));
    let busy = after.acquire_with(&held_keys, TTL, &once).await;
    assert!(
        matches!(busy, Err(Error::NotAcquired { .. })),
        "a confirmed lease lost in a synchronous failover: {:?}",
        busy.map(|lease| lease.fence())
    );
    // And the next token is above every one issued.
    let next = after.acquire(&released_keys, TTL).await?;
    assert!(fence(&next)? > last, "{:?} after {last:?}", next.fence());
    assert!(fence(&next)? > fence(&held)?);
    next.release().await?;
    drop(held);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_asynchronous_standby_may_lose_a_lease_but_never_repeats_a_token() -> TestResult
{
    let primary = PostgresServer::start()?;
    let stream = FaultProxy::start(primary.addr())?;
    let standby = primary.start_standby_through(Replication::Async, stream.addr())?;
    let admin = leasehold_pg::connect(&primary.url()).await?;
    until(
        &admin,
        "SELECT state = 'streaming' FROM pg_stat_replication",
    )
    .await?;
    let locker = PgLocker::connect(&primary.url()).await?;
    locker.setup().await?;
    let keys = FencedKeys::for_resource("async")?;
    let before = locker.acquire(&keys, TTL).await?;
    let first = fence(&before)?;
    before.release().await?;
    until(&admin, CAUGHT_UP).await?;

    // The standby falls behind (its stream held back, then cut with the
    // primary's crash): the primary confirms a lease it never sees.
    stream.blackhole(true);
    let lost = locker.acquire(&keys, TTL).await?;
    assert!(fence(&lost)? > first);
    primary.crash()?;
    stream.cut();
    stream.refuse(true);
    standby.promote()?;

    let after = PgLocker::connect(&standby.url()).await?;
    let once = AcquireOptions::new().wait(Duration::from_secs(5));
    let taken = after.acquire_with(&keys, TTL, &once).await?;
    assert!(
        fence(&taken)? > first,
        "the promoted standby lacks the first lease's counter"
    );
    // What remains: the confirmed lease is gone with the primary, and
    // another holds the lock (the guard refuses the older holder's writes
    // once the newer one has written, as after any lost lease).
    // What does not: a token issued twice, or one below the lost lease's.
    assert!(
        fence(&taken)? > fence(&lost)?,
        "the promoted standby issued {:?} after the lost lease's {:?}",
        taken.fence(),
        lost.fence()
    );
    taken.release().await?;
    drop(lost);
    Ok(())
}
