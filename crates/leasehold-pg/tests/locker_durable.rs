//! `PgLocker`'s commits are durable whatever the role's default: every
//! write that confirms a lease or issues a token commits with
//! `synchronous_commit = on`, pinned in its own statement. Shown with a
//! synchronous standby that does not exist (a take is never confirmed,
//! while a plain statement of the same role commits at once), and with
//! PostgreSQL restarted fast and crashed (`immediate`) right after a take
//! on a server whose default is `synchronous_commit = off`: the lease
//! confirmed before is still recorded, and the next token is above every
//! token issued before.

use std::sync::Arc;
use std::time::Duration;

use leasehold::{AcquireOptions, Election, Error, FencedKeys, FencingToken, Lessor, RetryStrategy};
use leasehold_pg::PgLocker;
use leasehold_pg::tokio_postgres::Client;
use leasehold_testkit::PostgresServer;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A hang detector, not a timing assertion.
const HUNG: Duration = Duration::from_secs(60);

/// The role the locker logs in as, and its password.
const ROLE: &str = "leasehold_locker";
const ROLE_PASSWORD: &str = "locker-password";

/// A standby that never connects.
const MISSING_STANDBY: &str = "leasehold_missing_standby";

/// `url` with the locker's role in place of the superuser.
fn as_role(server: &PostgresServer) -> String {
    format!(
        "postgres://{ROLE}:{ROLE_PASSWORD}@{}:{}/postgres",
        server.host(),
        server.port()
    )
}

/// A fenced lease's token.
fn token(lease: &leasehold::Lease) -> Result<u64, &'static str> {
    lease
        .fence()
        .map(FencingToken::get)
        .ok_or("a fenced take without a token")
}

async fn count(db: &Client, sql: &str, arg: &str) -> Result<i64, Box<dyn std::error::Error>> {
    Ok(db.query_one(sql, &[&arg]).await?.get(0))
}

/// Returns once the server makes a commit that asks for
/// `synchronous_commit = on` wait for the missing standby: the reload
/// reaches the backends through the checkpointer some time after
/// `pg_reload_conf()` returns. A probe commit is seen waiting on
/// `SyncRep`, then cancelled (it stays committed locally).
async fn until_commits_wait(url: &str, admin: &Client) -> TestResult {
    loop {
        let probe = leasehold_pg::connect(url).await?;
        let pid: i32 = probe
            .query_one("SELECT pg_backend_pid()", &[])
            .await?
            .get(0);
        let write = tokio::spawn(async move {
            probe
                .batch_execute("SET synchronous_commit = on; INSERT INTO sync_probe VALUES (0)")
                .await
        });
        loop {
            if write.is_finished() {
                // Committed without waiting: not in force yet.
                write.await??;
                break;
            }
            let waiting: i64 = admin
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity
                     WHERE pid = $1 AND wait_event = 'SyncRep'",
                    &[&pid],
                )
                .await?
                .get(0);
            if waiting == 1 {
                admin
                    .execute("SELECT pg_cancel_backend($1)", &[&pid])
                    .await?;
                tokio::time::timeout(HUNG, write).await???;
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// The locker's statements, by how their text begins: each must be seen
/// waiting for the standby.
const WRITES: [(&str, &str); 4] = [
    ("fenced take", "WITH won AS"),
    ("refresh", "UPDATE leasehold_leases"),
    ("release", "DELETE FROM leasehold_leases\n"),
    ("raise fence", "INSERT INTO leasehold_lease_counters"),
];

/// Returns once a statement of each of [`WRITES`], run as the locker's
/// role, is seen waiting on `SyncRep`; an error naming those never seen
/// after [`HUNG`].
async fn until_each_waits(admin: &Client) -> TestResult {
    let hung = tokio::time::Instant::now() + HUNG;
    loop {
        let waiting: Vec<String> = admin
            .query(
                "SELECT query FROM pg_stat_activity
                 WHERE usename = $1 AND wait_event = 'SyncRep'",
                &[&ROLE],
            )
            .await?
            .iter()
            .map(|row| row.get(0))
            .collect();
        let missing: Vec<&str> = WRITES
            .iter()
            .filter(|(_, start)| !waiting.iter().any(|q| q.starts_with(start)))
            .map(|(name, _)| *name)
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        if tokio::time::Instant::now() > hung {
            return Err(format!("never seen waiting for the standby: {missing:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// With `synchronous_standby_names` naming a standby that does not exist
/// and the locker's role defaulting to `synchronous_commit = local`, a
/// plain statement of that role commits at once (the control: the role's
/// default is in force), but no write of `PgLocker` is confirmed: a take
/// (fenced, with its counter), a refresh, a release and a raised fence
/// are each seen waiting for the standby (each request's deadline far
/// away), and the acquire ends with an error at its deadline. The waiting
/// take is not visible while it waits; at the acquire's deadline the
/// locker cancels it, so it commits locally (visible) and its lease ends
/// with its TTL: once the standby setting is cleared, another locker takes
/// the lock, with a token above the one the waiting take spent. (Fails
/// with any one pin removed: with the take's, the lease is confirmed; with
/// another's, its statement is never seen waiting.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_waits_for_the_synchronous_standby_whatever_the_roles_default() -> TestResult {
    let ttl = Duration::from_secs(3);
    let server = tokio::task::spawn_blocking(PostgresServer::start).await??;
    let admin = leasehold_pg::connect(&server.url()).await?;
    PgLocker::connect(&server.url()).await?.setup().await?;
    admin
        .batch_execute(&format!(
            "CREATE TABLE sync_probe (n int);
             CREATE ROLE {ROLE} LOGIN PASSWORD '{ROLE_PASSWORD}';
             GRANT ALL ON leasehold_leases, leasehold_lease_counters,
                 leasehold_leader_records, sync_probe TO {ROLE};
             ALTER ROLE {ROLE} SET synchronous_commit = local"
        ))
        .await?;
    // Leases to refresh, release and raise the fence of, each through a
    // locker (a connection) of its own, taken before the standby is named.
    let long = Duration::from_secs(30);
    let mut held = Vec::new();
    for keys in [
        FencedKeys::new("{sync}:refresh", "{sync}:other")?,
        FencedKeys::new("{sync}:release", "{sync}:other")?,
        FencedKeys::new("{sync}:raise", "{sync}:other")?,
    ] {
        // Requests that wait until they are seen waiting: a request
        // cancels its statement at its deadline.
        let locker = PgLocker::builder()
            .command_timeout(HUNG)
            .connect(&as_role(&server))
            .await?;
        held.push(locker.acquire(&keys, long).await?);
    }
    admin
        .batch_execute(&format!(
            "ALTER SYSTEM SET synchronous_standby_names = '{MISSING_STANDBY}'"
        ))
        .await?;
    admin.batch_execute("SELECT pg_reload_conf()").await?;
    until_commits_wait(&server.url(), &admin).await?;

    // The control: the role's own statements do not wait.
    let as_locker = leasehold_pg::connect(&as_role(&server)).await?;
    let default: String = as_locker
        .query_one("SHOW synchronous_commit", &[])
        .await?
        .get(0);
    assert_eq!(default, "local");
    tokio::time::timeout(
        HUNG,
        as_locker.execute("INSERT INTO sync_probe VALUES (1)", &[]),
    )
    .await??;

    let (refreshed, released, raised) = match <[_; 3]>::try_from(held) {
        Ok([a, b, c]) => (a, b, c),
        Err(_) => return Err("three leases".into()),
    };
    let writes = [
        tokio::spawn(async move { refreshed.refresh(long).await }),
        tokio::spawn(async move { released.release().await }),
        tokio::spawn(async move { raised.raise_fence(FencingToken::new(100)).await }),
    ];

    let locker = PgLocker::builder()
        .command_timeout(HUNG)
        .connect(&as_role(&server))
        .await?;
    let keys = FencedKeys::new("{sync}:job", "{sync}:fence")?;
    let taking = keys.clone();
    let acquire = tokio::spawn(async move {
        let opts = AcquireOptions::new().wait(Duration::from_secs(15));
        locker.acquire_with(&taking, ttl, &opts).await
    });
    until_each_waits(&admin).await?;
    let seen = count(
        &admin,
        "SELECT count(*) FROM leasehold_leases WHERE resource = $1",
        "{sync}:job",
    )
    .await?;
    assert_eq!(seen, 0, "a waiting commit is not visible to others yet");
    let taken = tokio::time::timeout(HUNG, acquire).await??;
    let err = match taken {
        Ok(lease) => panic!(
            "a lease confirmed while its commit had no synchronous standby: {:?}",
            lease.fence()
        ),
        Err(err) => err,
    };
    eprintln!("the acquire ended with: {err:?}");
    assert!(
        matches!(err, Error::NotAcquired { .. } | Error::Timeout { .. }),
        "{err:?}"
    );
    for write in writes {
        if write.is_finished() {
            let outcome = write.await?;
            assert!(outcome.is_err(), "a write confirmed without the standby");
        } else {
            write.abort();
        }
    }
    // The locker cancelled its take's wait at the acquire's deadline: the
    // take committed locally, and its token is now visible in the
    // counter. (Its lease row is visible until its TTL, or removed by the
    // acquire's token-checked undo if that ran after the cancel: which of
    // the two comes first is the scheduler's, so the counter is what is
    // awaited.)
    let hung = tokio::time::Instant::now() + HUNG;
    let waited = loop {
        let row = admin
            .query_opt(
                "SELECT last FROM leasehold_lease_counters WHERE fence_key = $1",
                &[&"{sync}:fence"],
            )
            .await?;
        if let Some(row) = row {
            break u64::try_from(row.get::<_, i64>(0))?;
        }
        if tokio::time::Instant::now() > hung {
            return Err("the timed-out take's wait was never cancelled".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };

    admin
        .batch_execute("ALTER SYSTEM RESET synchronous_standby_names")
        .await?;
    admin.batch_execute("SELECT pg_reload_conf()").await?;
    let other = PgLocker::connect(&server.url()).await?;
    let lease = other
        .acquire_with(&keys, ttl, &AcquireOptions::new().wait(HUNG))
        .await?;
    let fence = token(&lease)?;
    eprintln!("after the standby setting was cleared, another locker's token: {fence}");
    assert!(
        fence > waited,
        "the waiting take's token ({waited}) issued again: {fence}"
    );
    lease.release().await?;
    Ok(())
}

#[derive(Debug, Clone, Copy)]
enum Stop {
    /// `pg_ctl stop -m fast`: a shutdown checkpoint writes everything out.
    Fast,
    /// `pg_ctl stop -m immediate`: nothing is written out.
    Crash,
}

/// Fenced leases taken and given back, one held, an election won, then
/// PostgreSQL stopped right away (fast, then crashed) and started again,
/// on a server whose default is `synchronous_commit = off` (an
/// acknowledged commit may still be in memory): the held lease is still
/// recorded (its row keeps the lock from another locker, and its holder
/// gives it back), the leader is still named by its record, and the next
/// token is above every token issued before. (The crash fails with the
/// take's pin removed: the last takes are lost, the held lock is taken
/// again, and tokens repeat; with the leader record's, no leader is
/// named.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_never_repeat_across_a_restart_and_a_crash() -> TestResult {
    let ttl = Duration::from_secs(60);
    let server = Arc::new(tokio::task::spawn_blocking(PostgresServer::start).await??);
    let url = server.url();
    let locker = PgLocker::connect(&url).await?;
    locker.setup().await?;
    let fence = "{restart}:fence";
    let wait = AcquireOptions::new().wait(HUNG);
    let once = AcquireOptions::new().retry(RetryStrategy::none());
    let mut issued: Vec<u64> = Vec::new();
    for (round, stop) in [Stop::Fast, Stop::Crash].into_iter().enumerate() {
        for n in 0..5 {
            let keys = FencedKeys::new(format!("{{restart}}:{round}:free:{n}"), fence)?;
            let lease = locker.acquire_with(&keys, ttl, &wait).await?;
            issued.push(token(&lease)?);
            lease.release().await?;
        }
        let held_keys = FencedKeys::new(format!("{{restart}}:{round}:held"), fence)?;
        let held = locker.acquire_with(&held_keys, ttl, &wait).await?;
        issued.push(token(&held)?);
        let election = Election::builder(locker.clone(), format!("restart-{round}"))
            .ttl(ttl)
            .build()?;
        let term = election.campaign().await?;

        let pg = server.clone();
        tokio::task::spawn_blocking(move || {
            match stop {
                Stop::Fast => pg.stop()?,
                Stop::Crash => pg.crash()?,
            }
            pg.start_again()
        })
        .await??;

        let other = PgLocker::connect(&url).await?;
        let busy = other.acquire_with(&held_keys, ttl, &once).await;
        assert!(
            matches!(busy, Err(Error::NotAcquired { .. })),
            "{stop:?}: a lease confirmed before is gone: {:?}",
            busy.map(|lease| lease.fence())
        );
        let observed = Election::builder(other.clone(), format!("restart-{round}"))
            .build()?
            .leader()
            .await?;
        assert_eq!(
            observed.map(|leader| leader.fence),
            Some(term.fence()),
            "{stop:?}: the leader's record is gone"
        );
        term.resign().await?;
        let keys = FencedKeys::new(format!("{{restart}}:{round}:next"), fence)?;
        let next = other.acquire_with(&keys, ttl, &wait).await?;
        let after = token(&next)?;
        assert!(
            issued.iter().all(|&before| after > before),
            "{stop:?}: token {after} after {issued:?} were issued"
        );
        issued.push(after);
        next.release().await?;
        held.release().await?;
    }
    Ok(())
}
