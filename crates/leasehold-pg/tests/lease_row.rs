//! The guard that knows its lock (`GuardOptions::check_lease_row`), against
//! a real PostgreSQL holding both the lease (a `PgLocker`'s) and the data:
//! a holder that froze after its guard and thawed past its lease's end,
//! with nobody taking the lock since, commits without the option (the
//! fence alone cannot see it) and is refused at commit with it, on
//! tokio-postgres and on sqlx; the guard alone refuses an ended lease
//! and accepts a live one; a lease of another service is refused by the
//! option rather than ignored.

use std::sync::Arc;
use std::time::Duration;

use leasehold::{FencedKeys, Lease, Lessor, LostCause, MemoryLocker};
use leasehold_pg::tokio_postgres::Client;
use leasehold_pg::{Error, Guard, GuardOptions, Guarded, PgLocker};
use leasehold_testkit::PostgresServer;

mod common;
use common::server;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Long: the lease ends on the database's clock when the test says so
/// (see [`freeze_while_it_expires`]), never by a busy machine's delays.
const TTL: Duration = Duration::from_secs(30);

/// The server's address, and the server (kept alive while a test holds
/// it).
type Db = (Client, PgLocker, String, Arc<PostgresServer>);

/// A database with the fence table, the lease tables and a one-row table
/// of the test's own; a locker on it.
async fn db(table: &str) -> Result<Db, Box<dyn std::error::Error>> {
    // The tests share a server, and set it up at once: each setup is
    // serialized by its advisory lock.
    let server = server()?;
    let url = server.url();
    let mut db = leasehold_pg::connect(&url).await?;
    let locker = PgLocker::connect(&url).await?;
    leasehold_pg::setup(&mut db).await?;
    locker.setup().await?;
    db.batch_execute(&format!(
        "CREATE TABLE {table} (id int PRIMARY KEY, n bigint NOT NULL);
         INSERT INTO {table} VALUES (1, 0);"
    ))
    .await?;
    Ok((db, locker, url, server))
}

async fn value(db: &Client, table: &str) -> Result<i64, Box<dyn std::error::Error>> {
    Ok(db
        .query_one(&format!("SELECT n FROM {table} WHERE id = 1"), &[])
        .await?
        .get(0))
}

/// Freezes this thread, and with it the whole current-thread runtime (the
/// lease's watchdog included, as a stopped process), while another
/// session ends `lease`'s row on the database's clock (`expires_at` set to
/// `clock_timestamp()`, and read back past): a holder frozen past its
/// lease's end, with nobody taking the lock meanwhile, without waiting
/// out a TTL.
fn freeze_while_it_expires(url: &str, lease: &Lease) {
    let (url, key) = (url.to_owned(), lease.key().to_owned());
    let expirer = std::thread::spawn(move || -> Result<(), String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|err| err.to_string())?;
        runtime.block_on(async {
            let db = leasehold_pg::connect(&url)
                .await
                .map_err(|err| err.to_string())?;
            let ended = db
                .execute(
                    "UPDATE leasehold_leases SET expires_at = clock_timestamp() \
                     WHERE resource = $1",
                    &[&key],
                )
                .await
                .map_err(|err| err.to_string())?;
            if ended != 1 {
                return Err(format!("{ended} lease rows for {key}"));
            }
            let past: bool = db
                .query_one(
                    "SELECT expires_at < clock_timestamp() FROM leasehold_leases \
                     WHERE resource = $1",
                    &[&key],
                )
                .await
                .map_err(|err| err.to_string())?
                .get(0);
            if past {
                Ok(())
            } else {
                Err("the lease row is not past its end".to_owned())
            }
        })
    });
    match expirer.join() {
        Ok(Ok(())) => {}
        Ok(Err(err)) => panic!("{err}"),
        Err(_) => panic!("the expirer panicked"),
    }
}

/// Without the option the thawed holder commits (the hole); with it, the
/// commit's check finds the lease row expired and nothing is written.
#[tokio::test(flavor = "current_thread")]
async fn a_holder_thawed_past_its_lease_is_refused_at_commit_only_with_the_check() -> TestResult {
    let table = "lease_row_thawed";
    let (mut db, locker, url, _server) = db(table).await?;
    for check in [false, true] {
        let keys = FencedKeys::for_resource(&format!("lease-row:{check}"))?;
        let lease = locker.acquire(keys, TTL).await?;
        let options = GuardOptions::new().check_lease_row(check);
        let before = value(&db, table).await?;
        let outcome = leasehold_pg::guarded_with_hook(
            &mut db,
            &lease,
            &options,
            async |tx| {
                tx.execute(&format!("UPDATE {table} SET n = n + 1"), &[])
                    .await?;
                Ok::<_, Error>(())
            },
            async || freeze_while_it_expires(&url, &lease),
        )
        .await?;
        let after = value(&db, table).await?;
        if check {
            assert_eq!(outcome, Guarded::Lost(LostCause::Expired));
            assert_eq!(after, before, "a refused commit wrote");
        } else {
            assert_eq!(outcome, Guarded::Committed(()));
            assert_eq!(after, before + 1);
        }
    }
    Ok(())
}

/// The same on sqlx, whose check goes where its `SELECT 1` went.
#[tokio::test(flavor = "current_thread")]
async fn on_sqlx_a_thawed_holder_is_refused_at_commit_with_the_check() -> TestResult {
    use sqlx::Connection;

    let table = "lease_row_thawed_sqlx";
    let (db, locker, url, _server) = db(table).await?;
    let mut conn = sqlx::PgConnection::connect(&url).await?;
    for check in [false, true] {
        let keys = FencedKeys::for_resource(&format!("lease-row-sqlx:{check}"))?;
        let lease = locker.acquire(keys, TTL).await?;
        let options = GuardOptions::new().check_lease_row(check);
        let before = value(&db, table).await?;
        let outcome = leasehold_pg::sqlx::guarded_with_hook(
            &mut conn,
            &lease,
            &options,
            async |tx| {
                sqlx::query(&format!("UPDATE {table} SET n = n + 1"))
                    .execute(&mut *tx)
                    .await
                    .map_err(Error::from)?;
                Ok::<_, Error>(())
            },
            async || freeze_while_it_expires(&url, &lease),
        )
        .await?;
        let after = value(&db, table).await?;
        if check {
            assert_eq!(outcome, Guarded::Lost(LostCause::Expired));
            assert_eq!(after, before, "a refused commit wrote");
        } else {
            assert_eq!(outcome, Guarded::Committed(()));
            assert_eq!(after, before + 1);
        }
    }
    Ok(())
}

/// The guard alone: a live lease is accepted; one whose row expired (no
/// taker) is refused with `LeaseLost`, though the fence would accept it.
#[tokio::test(flavor = "current_thread")]
async fn the_guard_alone_checks_the_lease_row_too() -> TestResult {
    let (mut db, locker, url, _server) = db("lease_row_guard").await?;
    let options = GuardOptions::new().check_lease_row(true);
    let keys = FencedKeys::for_resource("lease-row:guard")?;
    let lease = locker.acquire(keys, Duration::from_secs(30)).await?;
    let tx = db.transaction().await?;
    let found = leasehold_pg::guard_with_options(&tx, &lease, &options).await?;
    assert_eq!(found, Guard::Accepted);
    tx.rollback().await?;
    lease.release().await?;

    let keys = FencedKeys::for_resource("lease-row:guard-ended")?;
    let lease = locker.acquire(keys, TTL).await?;
    freeze_while_it_expires(&url, &lease);
    let tx = db.transaction().await?;
    let found = leasehold_pg::guard_with_options(&tx, &lease, &options).await;
    assert!(
        matches!(
            &found,
            Err(Error::Lease(leasehold::Error::LeaseLost {
                cause: LostCause::Expired,
                ..
            }))
        ),
        "{found:?}"
    );
    // Without the option, the fence alone accepts it.
    let found = leasehold_pg::guard_with_options(&tx, &lease, &GuardOptions::new()).await?;
    assert_eq!(found, Guard::Accepted);
    Ok(())
}

/// A lease another service granted has no row here: the option refuses
/// it, typed, rather than checking nothing.
#[tokio::test(flavor = "current_thread")]
async fn the_check_refuses_a_lease_of_another_service() -> TestResult {
    let (mut db, _locker, _url, _server) = db("lease_row_other").await?;
    let memory = MemoryLocker::new();
    let lease = memory
        .acquire(FencedKeys::for_resource("lease-row:other")?, TTL)
        .await?;
    let options = GuardOptions::new().check_lease_row(true);
    let tx = db.transaction().await?;
    let found = leasehold_pg::guard_with_options(&tx, &lease, &options).await;
    assert!(
        matches!(
            &found,
            Err(Error::Lease(leasehold::Error::InvalidOptions(_)))
        ),
        "{found:?}"
    );
    Ok(())
}
