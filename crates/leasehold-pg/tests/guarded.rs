//! `guarded`, the safe path in one call, against a real PostgreSQL and
//! Redis: committed, refused (the work never runs), the work's error and a
//! swallowed statement error rolled back, a lease lost mid-work rolled
//! back, a plain lease refused, a session the server ended before the
//! commit, a holder frozen in its transaction ended by the server once
//! its lease has run out (the next holder commits), the guard's idle
//! bound set for the transaction alone, a holder frozen mid-statement
//! taken over by the next (and a take-over sparing its own and a newer
//! holder's transaction), a refused term ended with no call of the
//! user's; the hook before the commit (after the work, inside the
//! commit's shield, the transaction still open; not run when nothing is
//! committed); and `FencingToken` as a `bigint`.

use leasehold::Lessor;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use leasehold::{AcquireOptions, FencedKeys, FencingToken, Locker, LostCause, MemoryLocker};
use leasehold_pg::tokio_postgres::Client;
use leasehold_pg::tokio_postgres::error::SqlState;
use leasehold_pg::{Error, GuardOptions, Guarded};
use leasehold_testkit::{Direction, FaultProxy, RedisServer};
use tokio::sync::oneshot;

mod common;
use common::{chain, frozen_lease, server, superseded_term};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const TTL: Duration = Duration::from_secs(30);
/// A hang detector, not a timing assertion.
const HUNG: Duration = Duration::from_secs(30);
/// The lease of a holder that freezes: the next one waits about this long.
const SHORT: Duration = Duration::from_secs(1);

/// A database with the fence table and a one-row table of the test's own.
async fn db(
    table: &str,
) -> Result<(Client, std::sync::Arc<leasehold_testkit::PostgresServer>), Box<dyn std::error::Error>>
{
    let server = server()?;
    let mut db = leasehold_pg::connect(&server.url()).await?;
    leasehold_pg::setup(&mut db).await?;
    db.batch_execute(&format!(
        "CREATE TABLE {table} (id int PRIMARY KEY, n bigint NOT NULL, fence bigint);
         INSERT INTO {table} VALUES (1, 0, NULL);"
    ))
    .await?;
    Ok((db, server))
}

async fn value(db: &Client, table: &str) -> Result<i64, Box<dyn std::error::Error>> {
    Ok(db
        .query_one(&format!("SELECT n FROM {table} WHERE id = 1"), &[])
        .await?
        .get(0))
}

/// `UPDATE table SET n = n + 1`, returning the new value.
async fn bump(
    tx: &leasehold_pg::tokio_postgres::Transaction<'_>,
    table: &str,
) -> Result<i64, Error> {
    let row = tx
        .query_one(
            &format!("UPDATE {table} SET n = n + 1 WHERE id = 1 RETURNING n"),
            &[],
        )
        .await?;
    Ok(row.get(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_outcome_says_what_the_database_holds() -> TestResult {
    let redis = RedisServer::start()?;
    let locker = Locker::connect(&leasehold::redis::Client::open(redis.url())?).await?;
    let (mut db, _server) = db("guarded_outcomes").await?;
    let table = "guarded_outcomes";
    let keys = FencedKeys::for_resource("guarded:outcomes")?;

    // Committed: the output, and the row.
    let lease = locker.acquire(&keys, TTL).await?;
    let done = leasehold_pg::guarded(&mut db, &lease, async |tx| bump(tx, table).await).await?;
    assert_eq!(done, Guarded::Committed(1));
    assert_eq!(value(&db, table).await?, 1);

    // The work's error: rolled back.
    let failed: Result<Guarded<i64>, Error> = leasehold_pg::guarded(&mut db, &lease, async |tx| {
        bump(tx, table).await?;
        Err(Error::NotFenced)
    })
    .await;
    assert!(matches!(failed, Err(Error::NotFenced)), "{failed:?}");
    assert_eq!(value(&db, table).await?, 1);

    // A statement error the work swallowed: PostgreSQL would roll back at
    // COMMIT and report success; guarded says so instead.
    let swallowed = leasehold_pg::guarded(&mut db, &lease, async |tx| {
        bump(tx, table).await?;
        let _ = tx
            .execute("SELECT no_such_column FROM guarded_outcomes", &[])
            .await;
        Ok::<_, Error>(7)
    })
    .await;
    assert!(matches!(swallowed, Err(Error::Aborted(_))), "{swallowed:?}");
    assert_eq!(value(&db, table).await?, 1);
    // The connection is usable afterwards (the aborted transaction ended).
    assert_eq!(
        leasehold_pg::guarded(&mut db, &lease, async |tx| bump(tx, table).await).await?,
        Guarded::Committed(2)
    );

    // The lease lost mid-work: stopped before its commit, rolled back.
    let lost = leasehold_pg::guarded(&mut db, &lease, async |tx| {
        bump(tx, table).await?;
        lease.mark_superseded();
        // The next `.await` is where the watchdog stops the work.
        tokio::task::yield_now().await;
        Ok::<_, Error>(0)
    })
    .await?;
    assert_eq!(lost, Guarded::Lost(LostCause::Superseded));
    assert_eq!(value(&db, table).await?, 2);
    let _ = lease.release().await;

    // A holder whose lock was lost under it (its key deleted), while a
    // newer holder took the lock and wrote: the old token is refused, and
    // the work never runs.
    let old = locker.acquire(&keys, TTL).await?;
    let mut conn = locker.connection().clone();
    leasehold::redis::cmd("DEL")
        .arg(keys.lock())
        .query_async::<()>(&mut conn)
        .await?;
    let newer = locker.acquire(&keys, TTL).await?;
    assert_eq!(
        leasehold_pg::guarded(&mut db, &newer, async |tx| bump(tx, table).await).await?,
        Guarded::Committed(3)
    );
    let ran = AtomicBool::new(false);
    let stale = leasehold_pg::guarded(&mut db, &old, async |tx| {
        ran.store(true, Ordering::SeqCst);
        bump(tx, table).await
    })
    .await?;
    let first = old.fence().ok_or("fenced")?;
    assert!(
        matches!(&stale, Guarded::Refused { token, current, .. } if *token == first && *current > first),
        "{stale:?}"
    );
    assert!(!ran.load(Ordering::SeqCst), "the work ran after a refusal");
    assert_eq!(value(&db, table).await?, 3);
    assert_eq!(stale.committed(), None);
    drop(old);
    newer.release().await?;

    // A plain lease has no fence to guard with: a typed error, nothing run.
    let plain = locker.acquire("lock:guarded:plain", TTL).await?;
    let refused = leasehold_pg::guarded(&mut db, &plain, async |tx| bump(tx, table).await).await;
    assert!(matches!(refused, Err(Error::NotFenced)), "{refused:?}");
    assert_eq!(value(&db, table).await?, 3);
    plain.release().await?;
    Ok(())
}

/// The server ends the session of a guarded transaction before its
/// commit (its idle-in-transaction timeout, set for this transaction
/// alone): `SessionEnded`, retryable, not `CommitUnknown`; nothing written.
#[tokio::test]
async fn a_session_the_server_ended_before_the_commit_did_not_commit() -> TestResult {
    let redis = RedisServer::start()?;
    let locker = Locker::connect(&leasehold::redis::Client::open(redis.url())?).await?;
    let table = "guarded_ended";
    let (mut db, server) = db(table).await?;
    let watcher = leasehold_pg::connect(&server.url()).await?;
    let lease = locker
        .acquire(&FencedKeys::for_resource("guarded:ended")?, TTL)
        .await?;

    let ended = tokio::time::timeout(
        HUNG,
        leasehold_pg::guarded(&mut db, &lease, async |tx| {
            bump(tx, table).await?;
            tx.batch_execute(
                "SET LOCAL idle_in_transaction_session_timeout = '100ms';
                 SELECT pg_advisory_xact_lock(3701);",
            )
            .await?;
            // The transaction now sits idle past its timeout, which is the
            // fault under test: the server ends the session, and its end
            // frees the advisory lock the watcher waits for (the signal,
            // no sleep).
            watcher
                .batch_execute("SELECT pg_advisory_lock(3701); SELECT pg_advisory_unlock(3701);")
                .await?;
            // The server's last word (25P03, then the close) reached our
            // socket before the lock was freed; let the connection's task
            // read it, so the client knows it is closed before guarded
            // commits (a COMMIT queued before that may have gone out, for
            // all the client can tell: CommitUnknown).
            while !tx.client().is_closed() {
                tokio::task::yield_now().await;
            }
            Ok::<_, Error>(())
        }),
    )
    .await?;

    let err = ended.err().ok_or("an ended session committed")?;
    assert!(matches!(err, Error::SessionEnded(_)), "{err:?}");
    assert!(err.is_retryable());
    // tokio-postgres's connection task took the server's 25P03 (nothing
    // was waiting for an answer then): the client only knows it closed.
    assert_eq!(
        err.to_string(),
        "the connection ended before the commit was sent: the transaction did not commit",
        "{}",
        chain(&err)
    );
    assert_eq!(value(&watcher, table).await?, 0);
    Ok(())
}

/// A holder that freezes inside its guarded transaction (after the
/// guard, before its commit) stalls the next holder only until its lease
/// would have run out: the guard set the transaction's
/// `idle_in_transaction_session_timeout` to the lease's TTL (at least
/// 1 s), so the server ends the frozen session and its row lock goes with
/// it. The next holder commits; the frozen one's write is not there,
/// and its commit, once it thaws, says it did not commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_frozen_in_its_transaction_stalls_the_next_only_for_its_lease() -> TestResult {
    frozen_between_statements("guarded_frozen", false).await
}

/// The same through PgBouncer in transaction mode (pool of 2): the
/// guard's bound is transaction-local (`SET LOCAL`), so it holds on the
/// pooled server connection the frozen transaction runs on; the server
/// ends that connection, PgBouncer ends the frozen client's with it, and
/// the next holder, on the other server connection, commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_pgbouncer_a_frozen_holder_stalls_the_next_only_for_its_lease() -> TestResult {
    frozen_between_statements("guarded_frozen_pgbouncer", true).await
}

/// A holder frozen between statements, and the next holder, on
/// connections straight to the server or through PgBouncer.
async fn frozen_between_statements(table: &str, through_pgbouncer: bool) -> TestResult {
    let redis = RedisServer::start()?;
    let (db, server) = db(table).await?;
    let bouncer = match through_pgbouncer {
        true => Some(leasehold_testkit::PgBouncer::start(&server)?),
        false => None,
    };
    let url = bouncer.as_ref().map_or_else(|| server.url(), |b| b.url());
    let mut next_db = leasehold_pg::connect(&url).await?;
    let mut frozen_db = leasehold_pg::connect(&url).await?;
    let keys = FencedKeys::for_resource("guarded:frozen")?;
    let (frozen, runtime) = frozen_lease(redis.url(), keys.clone(), SHORT)?;
    let locker = Locker::connect(&leasehold::redis::Client::open(redis.url())?).await?;
    let (guarded_tx, guarded_rx) = tokio::sync::oneshot::channel();
    let (committed_tx, committed_rx) = tokio::sync::oneshot::channel();

    let frozen_holder = leasehold_pg::guarded(&mut frozen_db, &frozen, async |tx| {
        bump(tx, table).await?;
        let _ = guarded_tx.send(());
        // Frozen: the transaction (and the guard's row lock) held, nothing
        // sent, until the next holder has committed.
        let _ = committed_rx.await;
        // That commit means this session has ended: the row lock is freed
        // only when its transaction ends, and the server wrote its last
        // word (25P03, then the close) before. Let the connection's task
        // read it before guarded commits: a COMMIT queued before that may
        // have gone out, for all the client can tell (`CommitUnknown`,
        // also true, but not what this test is about).
        while !tx.client().is_closed() {
            tokio::task::yield_now().await;
        }
        Ok::<_, Error>(())
    });
    let next_holder = async {
        // Once the frozen holder holds the row lock; its lease runs out in
        // Redis (nothing refreshes it), then this one is taken.
        guarded_rx.await?;
        let opts = AcquireOptions::new().wait(HUNG);
        let lease = locker.acquire_with(&keys, TTL, &opts).await?;
        let done =
            leasehold_pg::guarded(&mut next_db, &lease, async |tx| bump(tx, table).await).await?;
        let _ = committed_tx.send(());
        lease.release().await?;
        Ok::<_, Box<dyn std::error::Error>>(done)
    };
    let (frozen_outcome, next_outcome) =
        tokio::time::timeout(HUNG, async { tokio::join!(frozen_holder, next_holder) }).await?;

    assert_eq!(next_outcome?, Guarded::Committed(1));
    let err = frozen_outcome.err().ok_or("a frozen holder committed")?;
    assert!(matches!(err, Error::SessionEnded(_)), "{}", chain(&err));
    assert!(err.is_retryable());
    // Read on the direct connection (a statement outside a transaction
    // through PgBouncer may not find its prepared statement).
    assert_eq!(value(&db, table).await?, 1);
    drop(frozen);
    runtime.shutdown_background();
    Ok(())
}

/// A holder frozen *during* a statement (its client stopped reading while
/// the server writes a large answer: the backend blocks writing to the
/// socket, active, so no idle timeout ends it) holds the guard's row for
/// the whole freeze; a next holder whose guard takes over
/// (`take_over_after`) ends that older holder's session once its lease
/// has run out, and commits. The frozen holder's write is not there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_frozen_mid_statement_is_taken_over_by_the_next() -> TestResult {
    let redis = RedisServer::start()?;
    let table = "guarded_mid_statement";
    let (mut next_db, server) = db(table).await?;
    let proxy = FaultProxy::start(server.addr())?;
    let through_proxy = server
        .url()
        .replace(&server.port().to_string(), &proxy.port().to_string());
    let mut frozen_db = leasehold_pg::connect(&through_proxy).await?;
    let keys = FencedKeys::for_resource("guarded:mid-statement")?;
    let (frozen, runtime) = frozen_lease(redis.url(), keys.clone(), SHORT)?;
    let locker = Locker::connect(&leasehold::redis::Client::open(redis.url())?).await?;
    let (sent_tx, sent_rx) = tokio::sync::oneshot::channel();
    // Every holder of the resource guards the same way (its first row is
    // not committed yet: the take-over finds its writer by its marks).
    let take_over = GuardOptions::new().take_over_after(Duration::from_millis(100));

    let frozen_holder =
        leasehold_pg::guarded_with_options(&mut frozen_db, &frozen, &take_over, async |tx| {
            bump(tx, table).await?;
            let pid: i32 = tx.query_one("SELECT pg_backend_pid()", &[]).await?.get(0);
            // The client stops reading: the request goes out (a simple query,
            // nothing to wait for before it runs), 64 MB of answer do not
            // come back.
            proxy.freeze(Direction::Downstream, true);
            let _ = sent_tx.send(pid);
            tx.simple_query("SELECT repeat('x', 1048576) FROM generate_series(1, 64)")
                .await?;
            Ok::<_, Error>(())
        });
    let next_holder = async {
        let pid = sent_rx.await?;
        // The frozen backend is in its statement, blocked writing to the
        // client: not idle, so the idle bound cannot end it.
        let blocked = async {
            while !writing_to_client(&next_db, pid).await? {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Ok::<_, Error>(())
        };
        tokio::time::timeout(HUNG, blocked).await??;
        let opts = AcquireOptions::new().wait(HUNG);
        let lease = locker.acquire_with(&keys, TTL, &opts).await?;
        let done = leasehold_pg::guarded_with_options(&mut next_db, &lease, &take_over, {
            async |tx| bump(tx, table).await
        })
        .await?;
        proxy.freeze(Direction::Downstream, false);
        lease.release().await?;
        Ok::<_, Box<dyn std::error::Error>>(done)
    };
    let ran = tokio::time::timeout(HUNG, async { tokio::join!(frozen_holder, next_holder) }).await;
    drop(frozen);
    runtime.shutdown_background();
    let (frozen_outcome, next_outcome) = ran?;

    assert_eq!(next_outcome?, Guarded::Committed(1));
    assert!(frozen_outcome.is_err(), "{frozen_outcome:?}");
    assert_eq!(value(&next_db, table).await?, 1);
    Ok(())
}

/// A take-over ends only an older holder's session: a transaction of the
/// same lease keeping the row, or one of a newer lease (while the old one
/// still believes itself valid: its lock expired under it), is waited
/// for as without the option; the guard that ran out of its wait looked,
/// left it alone and waits again (seen: waiting for a lock in a
/// statement begun past the wait), and goes on once the row is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_over_leaves_its_own_and_a_newer_holders_transaction_alone() -> TestResult {
    let table = "guarded_take_over_spares";
    let (mut keeper_db, server) = db(table).await?;
    let mut waiter_db = leasehold_pg::connect(&server.url()).await?;
    let watcher = leasehold_pg::connect(&server.url()).await?;
    let waiter: i32 = waiter_db
        .query_one("SELECT pg_backend_pid()", &[])
        .await?
        .get(0);
    let lock = MemoryLocker::new();
    let keys = FencedKeys::for_resource("guarded:take-over-spares")?;
    let take_over = GuardOptions::new().take_over_after(WAIT);
    let lease = lock.acquire(&keys, TTL).await?;

    // Two transactions of one lease: the second waits for the first.
    let keeper = keeper_db.transaction().await?;
    let found = leasehold_pg::guard_with_options(&keeper, &lease, &take_over).await?;
    assert!(found.is_accepted());
    bump(&keeper, table).await?;
    let waiting = leasehold_pg::guarded_with_options(&mut waiter_db, &lease, &take_over, {
        async |tx| bump(tx, table).await
    });
    let kept = async {
        waits_again(&watcher, waiter).await?;
        keeper.commit().await
    };
    let (done, kept) = tokio::time::timeout(HUNG, async { tokio::join!(waiting, kept) }).await?;
    kept?;
    assert_eq!(done?, Guarded::Committed(2));

    // A newer holder keeps the row; the old lease still believes itself
    // valid. Its guard leaves the newer one alone, and is then refused.
    lock.expire(keys.lock());
    let newer = lock.acquire(&keys, TTL).await?;
    assert!(lease.lost().is_none() && !lease.remaining().is_zero());
    let keeper = keeper_db.transaction().await?;
    let found = leasehold_pg::guard_with_options(&keeper, &newer, &take_over).await?;
    assert!(found.is_accepted());
    bump(&keeper, table).await?;
    let waiting = leasehold_pg::guarded_with_options(&mut waiter_db, &lease, &take_over, {
        async |tx| bump(tx, table).await
    });
    let kept = async {
        waits_again(&watcher, waiter).await?;
        keeper.commit().await
    };
    let (done, kept) = tokio::time::timeout(HUNG, async { tokio::join!(waiting, kept) }).await?;
    kept?;
    assert!(matches!(done?, Guarded::Refused { .. }));
    assert_eq!(value(&watcher, table).await?, 3);
    Ok(())
}

/// Without the permission to end the frozen holder's session (another
/// role, without `pg_signal_backend`), the take-over fails (a WARN) and
/// the guard waits for the row as without the option, its transaction
/// intact: once the frozen holder thaws and commits, the next one
/// commits after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_over_without_the_permission_waits_as_before() -> TestResult {
    let redis = RedisServer::start()?;
    let table = "guarded_take_over_denied";
    let (watcher, server) = db(table).await?;
    watcher
        .batch_execute(&format!(
            "CREATE ROLE denied LOGIN PASSWORD 'denied';
             GRANT SELECT, INSERT, UPDATE ON leasehold_fences, {table} TO denied;"
        ))
        .await?;
    let denied = format!(
        "postgres://denied:denied@{}:{}/postgres",
        server.host(),
        server.port()
    );
    let mut next_db = leasehold_pg::connect(&denied).await?;
    let next_pid: i32 = next_db
        .query_one("SELECT pg_backend_pid()", &[])
        .await?
        .get(0);
    let proxy = FaultProxy::start(server.addr())?;
    let through_proxy = server
        .url()
        .replace(&server.port().to_string(), &proxy.port().to_string());
    let mut frozen_db = leasehold_pg::connect(&through_proxy).await?;
    let keys = FencedKeys::for_resource("guarded:take-over-denied")?;
    let (frozen, runtime) = frozen_lease(redis.url(), keys.clone(), SHORT)?;
    let locker = Locker::connect(&leasehold::redis::Client::open(redis.url())?).await?;
    let take_over = GuardOptions::new().take_over_after(WAIT);
    let (sent_tx, sent_rx) = tokio::sync::oneshot::channel();

    let frozen_holder =
        leasehold_pg::guarded_with_options(&mut frozen_db, &frozen, &take_over, async |tx| {
            let n = bump(tx, table).await?;
            proxy.freeze(Direction::Downstream, true);
            let _ = sent_tx.send(());
            tx.simple_query("SELECT repeat('x', 1048576) FROM generate_series(1, 64)")
                .await?;
            Ok::<_, Error>(n)
        });
    let next_holder = async {
        sent_rx.await?;
        let opts = AcquireOptions::new().wait(HUNG);
        let lease = locker.acquire_with(&keys, TTL, &opts).await?;
        let waiting =
            leasehold_pg::guarded_with_options(&mut next_db, &lease, &take_over, async |tx| {
                bump(tx, table).await
            });
        let thawed = async {
            waits_again(&watcher, next_pid).await?;
            proxy.freeze(Direction::Downstream, false);
            Ok::<_, Error>(())
        };
        let (done, thawed) = tokio::join!(waiting, thawed);
        thawed?;
        lease.release().await?;
        Ok::<_, Box<dyn std::error::Error>>(done?)
    };
    let ran = tokio::time::timeout(HUNG, async { tokio::join!(frozen_holder, next_holder) }).await;
    drop(frozen);
    runtime.shutdown_background();
    let (frozen_outcome, next_outcome) = ran?;

    assert_eq!(frozen_outcome?, Guarded::Committed(1));
    assert_eq!(next_outcome?, Guarded::Committed(2));
    Ok(())
}

/// The take-over's wait in the tests that watch a guard wait again.
const WAIT: Duration = Duration::from_millis(300);

/// Until backend `pid` waits for a lock in a statement begun at least
/// [`WAIT`] into its transaction: a guard that ran out of its wait and
/// waits again.
async fn waits_again(db: &Client, pid: i32) -> Result<(), leasehold_pg::tokio_postgres::Error> {
    loop {
        let again = db
            .query_opt(
                "SELECT 1 FROM pg_stat_activity
                  WHERE pid = $1 AND wait_event_type = 'Lock'
                    AND query_start - xact_start >= make_interval(secs => $2)",
                &[&pid, &WAIT.as_secs_f64()],
            )
            .await?;
        if again.is_some() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether backend `pid` is running a statement, blocked writing its
/// answer to the client.
async fn writing_to_client(db: &Client, pid: i32) -> Result<bool, Error> {
    let row = db
        .query_opt(
            "SELECT 1 FROM pg_stat_activity
              WHERE pid = $1 AND state = 'active' AND wait_event = 'ClientWrite'",
            &[&pid],
        )
        .await?;
    Ok(row.is_some())
}

/// The idle bound the guard sets (`idle_in_transaction_session_timeout`,
/// in milliseconds), or the session's outside a transaction.
async fn idle_timeout_ms(
    db: &impl leasehold_pg::tokio_postgres::GenericClient,
) -> Result<i64, Error> {
    let row = db
        .query_one(
            "SELECT (extract(epoch FROM current_setting('idle_in_transaction_session_timeout')::interval) * 1000)::bigint",
            &[],
        )
        .await?;
    Ok(row.get(0))
}

/// The guard bounds the transaction's idle periods by the lease's
/// TTL (at least 1 s), for that transaction alone (`SET LOCAL`: the
/// session's setting is back after it, through PgBouncer too), and keeps
/// a smaller bound the caller set; `guard_token`, which has no lease,
/// leaves the setting alone.
#[tokio::test]
async fn the_guard_bounds_idle_periods_by_the_lease_for_its_transaction_only() -> TestResult {
    let redis = RedisServer::start()?;
    let locker = Locker::connect(&leasehold::redis::Client::open(redis.url())?).await?;
    let (mut db, _server) = db("guarded_idle").await?;
    let lease = locker
        .acquire(&FencedKeys::for_resource("guarded:idle")?, TTL)
        .await?;
    let ttl_ms = i64::try_from(TTL.as_millis())?;
    // The session's setting: none, an hour, 200 ms (stricter than the
    // lease: kept).
    for (session, inside) in [("0", None), ("1h", None), ("200ms", Some(200))] {
        db.batch_execute(&format!(
            "SET idle_in_transaction_session_timeout = '{session}'"
        ))
        .await?;
        let before = idle_timeout_ms(&db).await?;
        let set = leasehold_pg::guarded(&mut db, &lease, async |tx| idle_timeout_ms(tx).await)
            .await?
            .committed()
            .ok_or("not committed")?;
        match inside {
            Some(kept) => assert_eq!(set, kept, "session {session}"),
            None => assert!(0 < set && set <= ttl_ms, "session {session}: {set} ms"),
        }
        assert_eq!(idle_timeout_ms(&db).await?, before, "session {session}");
    }
    // A caller's smaller SET LOCAL before the guard is kept too.
    let tx = db.transaction().await?;
    tx.batch_execute("SET LOCAL idle_in_transaction_session_timeout = '150ms'")
        .await?;
    assert!(leasehold_pg::guard(&tx, &lease).await?.is_accepted());
    assert_eq!(idle_timeout_ms(&tx).await?, 150);
    tx.rollback().await?;
    // guard_token has no validity to bound anything by.
    db.batch_execute("SET idle_in_transaction_session_timeout = 0")
        .await?;
    let tx = db.transaction().await?;
    let found = leasehold_pg::guard_token(
        &tx,
        "guarded:idle:token",
        FencingToken::new(1),
        &lease.holder(),
    )
    .await?;
    assert!(found.is_accepted());
    assert_eq!(idle_timeout_ms(&tx).await?, 0);
    tx.rollback().await?;
    lease.release().await?;
    Ok(())
}

/// A leader's term whose guarded write is refused (a newer leader has
/// written) ends by itself: the guard marks its lease superseded, with no
/// `mark_superseded` call, through `guarded` and through the guard alone;
/// the term's `lost` resolves, the work under it stops at its next
/// `.await`, and resigning it is quiet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_term_ends_without_the_user_marking_it() -> TestResult {
    let table = "guarded_term";
    let (mut db, _server) = db(table).await?;

    // guarded: refused, the work never runs, the term is over.
    let (stale, newer) = superseded_term("guarded-term").await?;
    assert!(stale.is_leader(), "the old leader does not know yet");
    let done = leasehold_pg::guarded(&mut db, newer.lease(), async |tx| bump(tx, table).await);
    assert_eq!(done.await?, Guarded::Committed(1));
    let ran = AtomicBool::new(false);
    let refused = leasehold_pg::guarded(&mut db, stale.lease(), async |tx| {
        ran.store(true, Ordering::SeqCst);
        bump(tx, table).await
    })
    .await?;
    assert!(matches!(refused, Guarded::Refused { .. }), "{refused:?}");
    assert!(!ran.load(Ordering::SeqCst));
    assert_eq!(stale.lease().lost(), Some(LostCause::Superseded));
    assert!(!stale.is_leader());
    assert_eq!(
        tokio::time::timeout(HUNG, stale.lost()).await?,
        LostCause::Superseded
    );
    stale.resign().await?;
    newer.resign().await?;

    // The guard alone, in the term's work: the work stops at its next
    // `.await` after the refusal.
    let (stale, newer) = superseded_term("guarded-term-2").await?;
    let done = leasehold_pg::guarded(&mut db, newer.lease(), async |tx| bump(tx, table).await);
    assert_eq!(done.await?, Guarded::Committed(2));
    let work = stale.run(async {
        let tx = db.transaction().await?;
        let found = leasehold_pg::guard(&tx, stale.lease()).await?;
        assert!(!found.is_accepted(), "{found:?}");
        drop(tx); // rolled back
        std::future::pending::<()>().await;
        Ok::<_, Error>(())
    });
    let stopped = tokio::time::timeout(HUNG, work).await?;
    assert!(
        matches!(
            stopped,
            Err(leasehold::Error::LeaseLost {
                cause: LostCause::Superseded,
                ..
            })
        ),
        "{stopped:?}"
    );
    assert_eq!(value(&db, table).await?, 2);
    stale.resign().await?;
    newer.resign().await?;
    Ok(())
}

/// `guarded_with_hook`: the hook runs after the work and before the
/// `COMMIT`, inside the commit's shield. While it waits, another session
/// does not see the work's write and cannot take the guard's row, and a
/// lease lost meanwhile does not stop it; once it returns, the
/// transaction commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hook_runs_between_the_work_and_the_commit_inside_its_shield() -> TestResult {
    let table = "guarded_hook";
    let (mut db, server) = db(table).await?;
    let watcher = leasehold_pg::connect(&server.url()).await?;
    let lock = MemoryLocker::new();
    let keys = FencedKeys::for_resource("guarded:hook")?;
    let lease = lock.acquire(&keys, TTL).await?;
    // A first transaction creates the guard's row (an uncommitted insert
    // would be invisible to the watcher's `FOR UPDATE NOWAIT`).
    assert_eq!(
        leasehold_pg::guarded(&mut db, &lease, async |tx| bump(tx, table).await).await?,
        Guarded::Committed(1)
    );

    let worked = AtomicBool::new(false);
    let (reached, hook_reached) = oneshot::channel();
    let (let_go, hook_let_go) = oneshot::channel::<()>();
    let options = GuardOptions::new();
    let guarded = leasehold_pg::guarded_with_hook(
        &mut db,
        &lease,
        &options,
        async |tx| {
            let n = bump(tx, table).await?;
            worked.store(true, Ordering::SeqCst);
            Ok::<_, Error>(n)
        },
        async || {
            // The watchdog finds the lease lost while the hook runs: as
            // the hook waits, the work is raced against that loss.
            lease.mark_superseded();
            let _ = reached.send(worked.load(Ordering::SeqCst));
            let _ = hook_let_go.await;
        },
    );
    let observe = async {
        let after_the_work = hook_reached.await?;
        let seen = value(&watcher, table).await?;
        let row = watcher
            .query(
                "SELECT 1 FROM leasehold_fences WHERE resource = $1 FOR UPDATE NOWAIT",
                &[&keys.fence()],
            )
            .await;
        let _ = let_go.send(());
        Ok::<_, Box<dyn std::error::Error>>((after_the_work, seen, row))
    };
    let (done, observed) =
        tokio::time::timeout(HUNG, async { tokio::join!(guarded, observe) }).await?;
    let (after_the_work, seen, row) = observed?;
    assert!(after_the_work, "the hook ran before the work ended");
    assert_eq!(seen, 1, "the work's write was visible while the hook ran");
    match row {
        Err(err) if err.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {}
        other => return Err(format!("the guard's row was not locked: {other:?}").into()),
    }
    assert_eq!(done?, Guarded::Committed(2), "the hook was not shielded");
    assert_eq!(value(&watcher, table).await?, 2);
    Ok(())
}

/// `guarded_with_hook`: the hook does not run when there is nothing to
/// commit (the work's error, a refused guard), and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hook_does_not_run_when_nothing_is_committed() -> TestResult {
    let table = "guarded_hook_skipped";
    let (mut db, _server) = db(table).await?;
    let lock = MemoryLocker::new();
    let keys = FencedKeys::for_resource("guarded:hook-skipped")?;
    let old = lock.acquire(&keys, TTL).await?;
    let hooked = AtomicBool::new(false);
    let hook = async || hooked.store(true, Ordering::SeqCst);

    // The work's error: rolled back, the hook not run.
    let failed: Result<Guarded<i64>, Error> = leasehold_pg::guarded_with_hook(
        &mut db,
        &old,
        &GuardOptions::new(),
        async |tx| {
            bump(tx, table).await?;
            Err(Error::NotFenced)
        },
        hook,
    )
    .await;
    assert!(matches!(failed, Err(Error::NotFenced)), "{failed:?}");
    assert!(
        !hooked.load(Ordering::SeqCst),
        "the hook ran after an error"
    );
    assert_eq!(value(&db, table).await?, 0);

    // A refusal: a newer holder has written.
    lock.expire(keys.lock());
    let newer = lock.acquire(&keys, TTL).await?;
    assert_eq!(
        leasehold_pg::guarded(&mut db, &newer, async |tx| bump(tx, table).await).await?,
        Guarded::Committed(1)
    );
    let refused = leasehold_pg::guarded_with_hook(
        &mut db,
        &old,
        &GuardOptions::new(),
        async |tx| bump(tx, table).await,
        hook,
    )
    .await?;
    assert!(matches!(refused, Guarded::Refused { .. }), "{refused:?}");
    assert!(
        !hooked.load(Ordering::SeqCst),
        "the hook ran after a refusal"
    );
    assert_eq!(value(&db, table).await?, 1);

    // The control: after a work that returned `Ok`, it runs.
    let done = leasehold_pg::guarded_with_hook(
        &mut db,
        &newer,
        &GuardOptions::new(),
        async |tx| bump(tx, table).await,
        hook,
    )
    .await?;
    assert_eq!(done, Guarded::Committed(2));
    assert!(hooked.load(Ordering::SeqCst), "the hook did not run");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fencing_token_binds_and_reads_as_a_bigint() -> TestResult {
    let (db, _server) = db("guarded_tokens").await?;
    let token = FencingToken::new(1 << 50);
    db.execute(
        "UPDATE guarded_tokens SET fence = $1 WHERE id = 1",
        &[&token],
    )
    .await?;
    let read: FencingToken = db
        .query_one("SELECT fence FROM guarded_tokens WHERE id = 1", &[])
        .await?
        .get(0);
    assert_eq!(read, token);
    // Beyond bigint: refused at bind time, nothing written.
    let too_big = db
        .execute(
            "UPDATE guarded_tokens SET fence = $1 WHERE id = 1",
            &[&FencingToken::new(u64::MAX)],
        )
        .await;
    assert!(too_big.is_err());
    let still: FencingToken = db
        .query_one("SELECT fence FROM guarded_tokens WHERE id = 1", &[])
        .await?
        .get(0);
    assert_eq!(still, token);
    // Not a token: 0 does not read as one.
    db.execute("UPDATE guarded_tokens SET fence = 0 WHERE id = 1", &[])
        .await?;
    let zero = db
        .query_one("SELECT fence FROM guarded_tokens WHERE id = 1", &[])
        .await?
        .try_get::<_, FencingToken>(0);
    assert!(zero.is_err());
    Ok(())
}

/// Through PgBouncer in transaction mode with a single server connection
/// (every client's transactions run on it, one after the other), the
/// guard's idle bound is its transaction's alone (`SET LOCAL`): the next
/// client's transaction, on the same server connection, sees the
/// server's default. A session-wide `SET` would follow that connection
/// to whoever runs on it next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_pgbouncer_the_guards_bound_stays_in_its_transaction() -> TestResult {
    let redis = RedisServer::start()?;
    let locker = Locker::connect(&leasehold::redis::Client::open(redis.url())?).await?;
    let (_db, server) = db("guarded_pgbouncer_local").await?;
    let bouncer = leasehold_testkit::PgBouncer::start_with_pool(&server, 1)?;
    let mut first = leasehold_pg::connect(&bouncer.url()).await?;
    let mut next = leasehold_pg::connect(&bouncer.url()).await?;
    let lease = locker
        .acquire(&FencedKeys::for_resource("guarded:pgbouncer")?, TTL)
        .await?;
    const SESSION: &str = "SELECT pg_backend_pid(),
        (extract(epoch FROM current_setting('idle_in_transaction_session_timeout')::interval) * 1000)::bigint";
    let inside = leasehold_pg::guarded(&mut first, &lease, async |tx| {
        let row = tx.query_one(SESSION, &[]).await?;
        Ok::<(i32, i64), Error>((row.get(0), row.get(1)))
    })
    .await?;
    let Guarded::Committed((pid, bound)) = inside else {
        return Err(format!("not committed: {inside:?}").into());
    };
    // Set inside: from the lease's remaining validity, up to its TTL.
    assert!(
        bound > 0 && bound <= i64::try_from(TTL.as_millis())?,
        "{bound}"
    );
    let tx = next.transaction().await?;
    let row = tx.query_one(SESSION, &[]).await?;
    tx.commit().await?;
    let (next_pid, next_bound): (i32, i64) = (row.get(0), row.get(1));
    // The same server connection (a pool of one), without the bound.
    assert_eq!(next_pid, pid);
    assert_eq!(next_bound, 0);
    lease.release().await?;
    Ok(())
}
