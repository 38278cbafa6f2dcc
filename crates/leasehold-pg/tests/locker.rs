//! PostgreSQL as the lock service (`PgLocker`): the conformance suite
//! against a throwaway server, straight and through PgBouncer in
//! transaction mode, with every fault it can be put through (a lease row
//! or a counter deleted by hand, the server's processes stopped with
//! SIGSTOP).

use leasehold::backend::ServiceFault;
use leasehold::conformance::{self, Faults, Offered, Settings, Verdict};
use leasehold::{Error, Service};
use leasehold_pg::PgLocker;
use leasehold_testkit::{PgBouncer, PostgresServer};

type TestResult = Result<(), Box<dyn std::error::Error>>;

struct OnPostgres<'a> {
    server: &'a PostgresServer,
    raw: tokio_postgres::Client,
}

fn testkit(err: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::service(
        Service::named("testkit"),
        "fault",
        ServiceFault::Refused,
        err,
    )
}

impl Faults for OnPostgres<'_> {
    fn offers(&self) -> Offered {
        Offered::ALL
    }

    async fn expire(&self, key: &str) -> leasehold::Result<()> {
        self.raw
            .execute("DELETE FROM leasehold_leases WHERE resource = $1", &[&key])
            .await
            .map_err(testkit)?;
        Ok(())
    }

    async fn lose_fence(&self, fence_key: &str) -> leasehold::Result<()> {
        self.raw
            .execute(
                "DELETE FROM leasehold_lease_counters WHERE fence_key = $1",
                &[&fence_key],
            )
            .await
            .map_err(testkit)?;
        Ok(())
    }

    async fn pause(&self) -> leasehold::Result<()> {
        self.server.pause().map_err(testkit)
    }

    async fn resume(&self) -> leasehold::Result<()> {
        self.server.resume().map_err(testkit)
    }
}

/// The conformance suite on lockers connected to `url` (the server's
/// or PgBouncer's), listening or not, its faults made on the server
/// itself.
async fn conforms(server: &PostgresServer, url: &str, listen: bool) -> TestResult {
    let locker = PgLocker::builder().listen(listen).connect(url).await?;
    locker.setup().await?;
    let other = PgLocker::builder().listen(listen).connect(url).await?;
    let faults = OnPostgres {
        server,
        raw: leasehold_pg::connect(&server.url()).await?,
    };
    let report = conformance::run_pair(&locker, &other, &faults, &Settings::default()).await;
    assert!(report.is_ok(), "{report}");
    assert!(
        report.checks.iter().all(|c| c.verdict == Verdict::Passed),
        "{report}"
    );
    Ok(())
}

/// Every check passes, the election's included (its leader record in
/// the database).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_passes_the_conformance_suite() -> TestResult {
    let server = PostgresServer::start()?;
    conforms(&server, &server.url(), true).await
}

/// The same through PgBouncer in transaction mode (pool of 2), with
/// listening off as the docs say: each statement is one transaction with
/// no session state, unnamed, so it runs on whichever server connection
/// is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_passes_the_conformance_suite_through_pgbouncer() -> TestResult {
    let server = PostgresServer::start()?;
    let bouncer = PgBouncer::start(&server)?;
    conforms(&server, &bouncer.url(), false).await
}

/// A waiter is woken by a release's notification, not by its poll: with
/// a poll every minute and a wait of 20 s, it still gets the lock once
/// the holder gives it back. (If the release lands before the waiter's
/// first request, that request takes the lock: the test passes without
/// the wake-up, never fails for it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_by_the_release_not_its_poll() -> TestResult {
    use std::time::Duration;

    use leasehold::{AcquireOptions, Lessor, RetryStrategy};

    let server = PostgresServer::start()?;
    let holder = PgLocker::connect(&server.url()).await?;
    holder.setup().await?;
    let waiter = PgLocker::builder()
        .poll_every(Duration::from_secs(60))
        .connect(&server.url())
        .await?;
    let ttl = Duration::from_secs(30);
    let lease = holder.acquire("job", ttl).await?;
    // The waiter's locker listens from its first request on.
    let once = AcquireOptions::new().retry(RetryStrategy::none());
    let busy = waiter.acquire_with("job", ttl, &once).await;
    assert!(matches!(busy, Err(Error::NotAcquired { .. })), "{busy:?}");
    let waiting = tokio::spawn(async move {
        let opts = AcquireOptions::new().wait(Duration::from_secs(20));
        waiter.acquire_with("job", ttl, &opts).await
    });
    lease.release().await?;
    let won = waiting.await??;
    won.release().await?;
    Ok(())
}

/// Through PgBouncer in transaction mode, where `LISTEN` cannot work (the
/// listening session is a pooled server connection, and no client is
/// linked to it when a notification comes): a waiter is served by its
/// poll once the holder releases, with listening off (as the docs say)
/// and left on (it must not hang or fail the locker).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_pgbouncer_a_waiter_is_served_by_its_poll() -> TestResult {
    use std::time::Duration;

    use leasehold::{AcquireOptions, Lessor, RetryStrategy};

    let server = PostgresServer::start()?;
    let bouncer = PgBouncer::start(&server)?;
    let holder = PgLocker::builder()
        .listen(false)
        .connect(&bouncer.url())
        .await?;
    holder.setup().await?;
    let ttl = Duration::from_secs(30);
    for listen in [false, true] {
        let waiter = PgLocker::builder()
            .listen(listen)
            .poll_every(Duration::from_millis(100))
            .connect(&bouncer.url())
            .await?;
        let lease = holder.acquire("job", ttl).await?;
        let once = AcquireOptions::new().retry(RetryStrategy::none());
        let busy = waiter.acquire_with("job", ttl, &once).await;
        assert!(
            matches!(busy, Err(Error::NotAcquired { .. })),
            "listen {listen}: {busy:?}"
        );
        let waiting = tokio::spawn(async move {
            let opts = AcquireOptions::new().wait(Duration::from_secs(20));
            waiter.acquire_with("job", ttl, &opts).await
        });
        lease.release().await?;
        let won = waiting.await??;
        won.release().await?;
    }
    Ok(())
}
