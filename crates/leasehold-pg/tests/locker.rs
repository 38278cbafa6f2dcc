//! PostgreSQL as the lock service (`PgLocker`): the conformance suite
//! against a throwaway server, straight, through PgBouncer in transaction
//! mode and on a deadpool pool, with every fault it can be put through (a
//! lease row or a counter deleted by hand, the server's processes stopped
//! with SIGSTOP); a statement stuck on a row lock holds up no later
//! request, on the locker's own connection or a pool.

use leasehold::backend::ServiceFault;
use leasehold::conformance::{self, Faults, Offered, Settings, Verdict};
use leasehold::{Error, Service};
use leasehold_pg::PgLocker;
use leasehold_pg::deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
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
    let other = PgLocker::builder().listen(listen).connect(url).await?;
    conforms_with(server, &locker, &other).await
}

/// The conformance suite on `locker` and `other`, its faults made on the
/// server itself.
async fn conforms_with(server: &PostgresServer, locker: &PgLocker, other: &PgLocker) -> TestResult {
    locker.setup().await?;
    let faults = OnPostgres {
        server,
        raw: leasehold_pg::connect(&server.url()).await?,
    };
    let report = conformance::run_pair(locker, other, &faults, &Settings::default()).await;
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

/// A deadpool-postgres pool of at most `size` connections to `url`, built
/// as the crate docs say (`leasehold_pg::config`); none is opened yet.
fn pool(url: &str, size: usize) -> Result<Pool, Box<dyn std::error::Error>> {
    let (config, connector) = leasehold_pg::config(url)?;
    let manager = Manager::from_config(
        config,
        connector,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Ok(Pool::builder(manager).max_size(size).build()?)
}

/// Every check passes on lockers built on pools (a connection per
/// request, waiters polling), the faults' included: the server paused
/// (requests time out, their connections are taken out of the pool) and
/// resumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_pool_it_passes_the_conformance_suite() -> TestResult {
    let server = PostgresServer::start()?;
    let locker = PgLocker::from_pool(pool(&server.url(), 4)?)?;
    let other = PgLocker::builder()
        .poll_every(std::time::Duration::from_millis(100))
        .pool(pool(&server.url(), 4)?)?;
    conforms_with(&server, &locker, &other).await
}

/// A locker on a pool cannot listen: asking for it is refused before
/// anything is connected, not ignored.
#[tokio::test]
async fn on_a_pool_listening_is_refused() -> TestResult {
    let built = PgLocker::builder()
        .listen(true)
        .pool(pool("postgres://nobody@127.0.0.1:1/none", 1)?);
    assert!(
        matches!(
            built,
            Err(leasehold_pg::Error::Lease(Error::InvalidOptions(_)))
        ),
        "{built:?}"
    );
    PgLocker::builder()
        .listen(false)
        .pool(pool("postgres://nobody@127.0.0.1:1/none", 1)?)?;
    Ok(())
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

/// A hang detector, not a timing assertion.
const HUNG: std::time::Duration = std::time::Duration::from_secs(60);

/// The server process of the one statement of `locker`'s lease table
/// seen waiting for a lock, once there is one.
async fn waiting_take(raw: &tokio_postgres::Client) -> Result<i32, Box<dyn std::error::Error>> {
    let hung = tokio::time::Instant::now() + HUNG;
    loop {
        let pids: Vec<i32> = raw
            .query(
                "SELECT pid FROM pg_stat_activity
                 WHERE wait_event_type = 'Lock'
                   AND query LIKE 'INSERT INTO leasehold_leases%'",
                &[],
            )
            .await?
            .iter()
            .map(|row| row.get(0))
            .collect();
        match pids[..] {
            [pid] => return Ok(pid),
            [] if tokio::time::Instant::now() < hung => {}
            _ => return Err(format!("waiting takes: {pids:?}").into()),
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// Another session holds the lease row of `stuck` (`SELECT ... FOR
/// UPDATE` in an open transaction), so `locker`'s take of that key waits
/// for the row lock: that acquire ends with an error at its deadline;
/// then an acquire of another key on a clone of the same locker is served
/// (within a generous wait), and the stuck statement's server session
/// ends (its statement cancelled, its connection closed, not kept for
/// later requests) while the row is still locked. `raw` is a superuser
/// session on the server itself.
async fn a_stuck_statement_holds_up_no_later_request(
    locker: &PgLocker,
    raw: &tokio_postgres::Client,
    blocker: &mut tokio_postgres::Client,
) -> TestResult {
    use std::time::Duration;

    use leasehold::{AcquireOptions, Lessor, RetryStrategy};

    let ttl = Duration::from_secs(30);
    raw.execute(
        "INSERT INTO leasehold_leases (resource, holder, expires_at)
         VALUES ('stuck', 'someone else', clock_timestamp() - interval '1 hour')
         ON CONFLICT (resource) DO NOTHING",
        &[],
    )
    .await?;
    let tx = blocker.transaction().await?;
    let locked = tx
        .query(
            "SELECT 1 FROM leasehold_leases WHERE resource = 'stuck' FOR UPDATE",
            &[],
        )
        .await?;
    assert_eq!(locked.len(), 1, "the stuck key's row is locked");

    let taker = locker.clone();
    let stuck = tokio::spawn(async move {
        let once = AcquireOptions::new().retry(RetryStrategy::none());
        taker
            .acquire_with("stuck", ttl, &once)
            .await
            .map(|lease| lease.fence())
    });
    let pid = waiting_take(raw).await?;
    let stuck = tokio::time::timeout(HUNG, stuck).await??;
    assert!(
        matches!(
            stuck,
            Err(Error::Timeout { .. } | Error::NotAcquired { .. })
        ),
        "{stuck:?}"
    );

    let clone = locker.clone();
    let wait = AcquireOptions::new().wait(Duration::from_secs(10));
    let free = tokio::time::timeout(HUNG, clone.acquire_with("free", ttl, &wait))
        .await?
        .map_err(|err| format!("another key, after a stuck statement: {err:?}"))?;
    free.release().await?;

    // The stuck take's session ended: cancelled (else it would still wait
    // for the row) and its connection closed (else it would sit idle,
    // kept for later requests).
    let hung = tokio::time::Instant::now() + HUNG;
    loop {
        let state: Option<String> = raw
            .query_opt(
                "SELECT coalesce(wait_event_type, '') || ' ' || coalesce(state, '')
                 FROM pg_stat_activity WHERE pid = $1",
                &[&pid],
            )
            .await?
            .map(|row| row.get(0));
        let Some(state) = state else { break };
        if tokio::time::Instant::now() > hung {
            return Err(format!("the stuck take's session is still there: {state}").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tx.rollback().await?;
    Ok(())
}

/// A request that timed out behind a row lock leaves the locker's
/// connection free for the next ones (its statement is cancelled and the
/// connection retired), listening or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_statement_holds_up_no_later_request_on_its_connection() -> TestResult {
    let server = PostgresServer::start()?;
    let raw = leasehold_pg::connect(&server.url()).await?;
    let mut blocker = leasehold_pg::connect(&server.url()).await?;
    for listen in [true, false] {
        let locker = PgLocker::builder()
            .listen(listen)
            .connect(&server.url())
            .await?;
        locker.setup().await?;
        a_stuck_statement_holds_up_no_later_request(&locker, &raw, &mut blocker)
            .await
            .map_err(|err| format!("listen {listen}: {err}"))?;
    }
    Ok(())
}

/// The same on a pool of one connection: the connection whose statement
/// is stuck is taken out of the pool (and its statement cancelled), so
/// the pool opens another for the next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_pool_a_stuck_statement_holds_up_no_later_request() -> TestResult {
    let server = PostgresServer::start()?;
    let raw = leasehold_pg::connect(&server.url()).await?;
    let mut blocker = leasehold_pg::connect(&server.url()).await?;
    let locker = PgLocker::from_pool(pool(&server.url(), 1)?)?;
    locker.setup().await?;
    a_stuck_statement_holds_up_no_later_request(&locker, &raw, &mut blocker).await
}

/// A take cancelled by a `lock_timeout` shorter than the acquire's wait
/// (an operator's setting for the role or the database; here the
/// connection's), while another session holds the lease row, is retried
/// within the wait, not returned to the caller: the server rolled the
/// statement back (`55P03`), as one `statement_timeout` cancels (`57014`,
/// retried already). The acquire wins once the row is free.
#[tokio::test]
async fn a_take_cancelled_by_lock_timeout_is_retried_within_the_wait() -> TestResult {
    use std::time::Duration;

    use leasehold::{AcquireOptions, Lessor};

    let server = PostgresServer::start()?;
    let url = format!("{}?options=-c%20lock_timeout%3D50ms", server.url());
    let locker = PgLocker::builder().listen(false).connect(&url).await?;
    locker.setup().await?;
    let raw = leasehold_pg::connect(&server.url()).await?;
    let mut blocker = leasehold_pg::connect(&server.url()).await?;
    raw.execute(
        "INSERT INTO leasehold_leases (resource, holder, expires_at)
         VALUES ('timed', 'someone else', clock_timestamp() - interval '1 hour')",
        &[],
    )
    .await?;
    let tx = blocker.transaction().await?;
    tx.query(
        "SELECT 1 FROM leasehold_leases WHERE resource = 'timed' FOR UPDATE",
        &[],
    )
    .await?;
    let taker = tokio::spawn(async move {
        let opts = AcquireOptions::new().wait(HUNG);
        locker
            .acquire_with("timed", Duration::from_secs(30), &opts)
            .await
    });
    // The server says so in its log once a take was cancelled.
    let hung = tokio::time::Instant::now() + HUNG;
    while !server
        .log()
        .contains("canceling statement due to lock timeout")
    {
        assert!(tokio::time::Instant::now() < hung, "{}", server.log());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tx.rollback().await?;
    let lease = taker.await??;
    assert!(
        lease.keys().any(|key| key == "timed"),
        "the lease of the key"
    );
    lease.release().await?;
    Ok(())
}
