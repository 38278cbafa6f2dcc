//! The fence guard, `setup` and `guarded` on sqlx (feature `sqlx`), against
//! a real PostgreSQL and Redis: the same cases as on tokio-postgres
//! (tests/guard.rs, tests/guarded.rs), the same answers (a holder frozen
//! in its transaction included), the hook before the commit; and
//! `FencingToken` as an `INT8`.

use leasehold::Lessor;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use leasehold::{
    AcquireOptions, FencedKeys, FencingToken, HolderId, Locker, LostCause, MemoryLocker,
};
use leasehold_pg::{Error, FENCES, Guard, GuardOptions, Guarded, Setup};
use leasehold_testkit::{Direction, FaultProxy, PostgresServer, RedisServer};
use sqlx::{Connection, Executor, PgConnection};
use tokio::sync::oneshot;

mod common;
use common::{chain, frozen_lease, server, superseded_term};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const TTL: Duration = Duration::from_secs(30);
/// A hang detector, not a timing assertion.
const HUNG: Duration = Duration::from_secs(30);

/// A database of the test's own (so that `setup` finds it empty), and a
/// sqlx connection to it.
async fn fresh(
    pg: &PostgresServer,
    name: &str,
) -> Result<(PgConnection, String), Box<dyn std::error::Error>> {
    let mut admin = PgConnection::connect(&pg.url()).await?;
    sqlx::raw_sql(&format!("CREATE DATABASE {name}"))
        .execute(&mut admin)
        .await?;
    let url = pg.url().replace("/postgres", &format!("/{name}"));
    Ok((PgConnection::connect(&url).await?, url))
}

/// A database with the fence table and a one-row table `counter`.
async fn db(pg: &PostgresServer, name: &str) -> Result<PgConnection, Box<dyn std::error::Error>> {
    let (mut db, _) = fresh(pg, name).await?;
    assert_eq!(leasehold_pg::sqlx::setup(&mut db).await?, Setup::Created);
    sqlx::raw_sql(
        "CREATE TABLE counter (id int PRIMARY KEY, n bigint NOT NULL, fence bigint, small int);
         INSERT INTO counter VALUES (1, 0, NULL, NULL);",
    )
    .execute(&mut db)
    .await?;
    Ok(db)
}

async fn value(db: &mut PgConnection) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT n FROM counter WHERE id = 1")
        .fetch_one(db)
        .await
}

/// `UPDATE counter SET n = n + 1`, returning the new value.
async fn bump(tx: &mut PgConnection) -> Result<i64, Error> {
    Ok(
        sqlx::query_scalar("UPDATE counter SET n = n + 1 WHERE id = 1 RETURNING n")
            .fetch_one(tx)
            .await?,
    )
}

async fn fence_of(db: &mut PgConnection, resource: &str) -> Result<Option<i64>, sqlx::Error> {
    sqlx::query_scalar("SELECT fence FROM leasehold_fences WHERE resource = $1")
        .bind(resource)
        .fetch_optional(db)
        .await
}

/// Two made-up holders: names, not capabilities (see `HolderId`).
fn holders() -> Result<(HolderId, HolderId), Box<dyn std::error::Error>> {
    let a = HolderId::parse("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa").ok_or("holder a")?;
    let b = HolderId::parse("bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb").ok_or("holder b")?;
    Ok((a, b))
}

/// One guard of `resource` with token `n` from `holder` in its own
/// transaction, committed when accepted and `commit`.
async fn guard_with(
    db: &mut PgConnection,
    resource: &str,
    n: u64,
    holder: &HolderId,
    commit: bool,
) -> Result<Guard, Box<dyn std::error::Error>> {
    let mut tx = db.begin().await?;
    let guard =
        leasehold_pg::sqlx::guard_token(&mut tx, resource, FencingToken::new(n), holder).await?;
    if commit && guard.is_accepted() {
        tx.commit().await?;
    } else {
        tx.rollback().await?;
    }
    Ok(guard)
}

#[tokio::test]
async fn a_newer_token_is_accepted_an_older_one_refused_and_an_equal_one_only_from_its_writer()
-> TestResult {
    let pg = server()?;
    let mut db = db(&pg, "sqlx_order").await?;
    let resource = "t:sqlx:order";
    let (a, b) = holders()?;
    assert_eq!(
        guard_with(&mut db, resource, 5, &a, true).await?,
        Guard::Accepted
    );
    match guard_with(&mut db, resource, 4, &b, true).await? {
        Guard::Refused {
            token,
            current,
            writer,
            healed,
            ..
        } => {
            assert_eq!(
                (token, current),
                (FencingToken::new(4), FencingToken::new(5))
            );
            assert_eq!(writer.as_deref(), Some(a.as_str()));
            assert!(!healed, "guard_token does not touch Redis");
        }
        accepted => return Err(format!("a stale token was {accepted:?}").into()),
    }
    // The same token: accepted from its writer (one lease, several
    // transactions), refused from another holder.
    assert_eq!(
        guard_with(&mut db, resource, 5, &a, true).await?,
        Guard::Accepted
    );
    match guard_with(&mut db, resource, 5, &b, true).await? {
        Guard::Refused {
            token,
            current,
            writer,
            ..
        } => {
            assert_eq!(
                (token, current),
                (FencingToken::new(5), FencingToken::new(5))
            );
            assert_eq!(writer.as_deref(), Some(a.as_str()));
        }
        accepted => return Err(format!("a second holder of token 5 was {accepted:?}").into()),
    }
    // Accepted, then rolled back: the fence is not raised.
    assert_eq!(
        guard_with(&mut db, resource, 9, &b, false).await?,
        Guard::Accepted
    );
    assert_eq!(fence_of(&mut db, resource).await?, Some(5));
    assert_eq!(
        guard_with(&mut db, resource, 6, &b, true).await?,
        Guard::Accepted
    );
    assert_eq!(fence_of(&mut db, resource).await?, Some(6));
    // a's token 5 is now older than b's 6.
    assert!(
        !guard_with(&mut db, resource, 5, &a, true)
            .await?
            .is_accepted()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_lease_heals_the_counter_and_the_next_lease_writes() -> TestResult {
    let pg = server()?;
    let mut db = db(&pg, "sqlx_heal").await?;
    let redis = RedisServer::start()?;
    let locker = Locker::connect(&leasehold::redis::Client::open(redis.url())?).await?;
    let keys = FencedKeys::for_resource("sqlx:heal")?;
    let lease = locker.acquire(&keys, TTL).await?;
    let token = lease.fence().ok_or("fenced")?;
    // A fence far above the Redis counter (a counter lost while it ran
    // ahead of the server's clock, say), written by someone else.
    let (a, _) = holders()?;
    let ahead = token.get() + 1_000_000;
    assert_eq!(
        guard_with(&mut db, keys.fence(), ahead, &a, true).await?,
        Guard::Accepted
    );
    let mut tx = db.begin().await?;
    let refused = leasehold_pg::sqlx::guard(&mut tx, &lease).await?;
    tx.rollback().await?;
    assert!(
        matches!(&refused, Guard::Refused { resource, token: t, current, healed: true, .. }
            if resource == keys.fence() && *t == token && current.get() == ahead),
        "{refused:?}"
    );
    lease.release().await?;
    // Healed: the next lease's token is above the stored fence, and wins.
    let next = locker.acquire(&keys, TTL).await?;
    assert!(next.fence().ok_or("fenced")?.get() > ahead);
    let mut tx = db.begin().await?;
    assert_eq!(
        leasehold_pg::sqlx::guard(&mut tx, &next).await?,
        Guard::Accepted
    );
    tx.commit().await?;
    next.release().await?;

    // A plain lease has no fence to guard with.
    let plain = locker.acquire("lock:sqlx:plain", TTL).await?;
    let mut tx = db.begin().await?;
    let err = leasehold_pg::sqlx::guard(&mut tx, &plain).await.err();
    assert!(matches!(err, Some(Error::NotFenced)), "{err:?}");
    tx.rollback().await?;
    plain.release().await?;
    Ok(())
}

#[tokio::test]
async fn setup_creates_and_migrates_the_fence_table_and_errors_are_classified_as_on_tokio_postgres()
-> TestResult {
    let pg = server()?;
    let (a, b) = holders()?;

    // Where setup never ran: the table is missing.
    let (mut bare, _) = fresh(&pg, "sqlx_bare").await?;
    let err = leasehold_pg::sqlx::guard_token(&mut bare, "r", FencingToken::new(1), &a)
        .await
        .err();
    assert!(
        matches!(&err, Some(Error::TableMissing { table, source })
            if *table == FENCES && source.as_sqlx().is_some() && source.code() == Some("42P01")),
        "{err:?}"
    );
    assert_eq!(leasehold_pg::sqlx::setup(&mut bare).await?, Setup::Created);
    assert_eq!(
        leasehold_pg::sqlx::setup(&mut bare).await?,
        Setup::Unchanged
    );

    // The table as leasehold-pg created it before it recorded holders.
    let (mut db, url) = fresh(&pg, "sqlx_migrate").await?;
    sqlx::raw_sql(
        "CREATE TABLE leasehold_fences (
             resource text PRIMARY KEY CHECK (resource <> ''),
             fence    bigint NOT NULL CHECK (fence > 0));
         INSERT INTO leasehold_fences VALUES ('t:old', 40)",
    )
    .execute(&mut db)
    .await?;
    let mut tx = db.begin().await?;
    let err = leasehold_pg::sqlx::guard_token(&mut tx, "t:old", FencingToken::new(41), &a)
        .await
        .err();
    assert!(
        matches!(err, Some(Error::TableOutdated { table, .. }) if table == FENCES),
        "{err:?}"
    );
    tx.rollback().await?;
    // Several services start at once: one migrates, the rest find it done.
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            let mut db = PgConnection::connect(&url)
                .await
                .map_err(|e| e.to_string())?;
            leasehold_pg::sqlx::setup(&mut db)
                .await
                .map_err(|e| e.to_string())
        }));
    }
    let mut done = Vec::new();
    for task in tasks {
        done.push(tokio::time::timeout(HUNG, task).await???);
    }
    let migrated: Vec<_> = done
        .iter()
        .filter(|d| matches!(d, Setup::Migrated(_)))
        .collect();
    assert_eq!(migrated.len(), 1, "{done:?}");
    assert!(
        matches!(migrated[0], Setup::Migrated(changes)
            if changes.len() == 2 && changes[0].contains("holder") && changes[1].contains("leasehold_guard")),
        "{done:?}"
    );
    assert_eq!(done.iter().filter(|d| **d == Setup::Unchanged).count(), 2);
    // Inside the caller's transaction: a savepoint, nothing to do.
    let mut tx = db.begin().await?;
    assert_eq!(leasehold_pg::sqlx::setup(&mut tx).await?, Setup::Unchanged);
    tx.commit().await?;
    // The old row is kept; its fence has no holder, so the same token is
    // refused from anyone, and a newer one is accepted.
    assert_eq!(fence_of(&mut db, "t:old").await?, Some(40));
    for (n, holder, accepted) in [(40, &a, false), (40, &b, false), (41, &b, true)] {
        let guard = guard_with(&mut db, "t:old", n, holder, true).await?;
        assert_eq!(guard.is_accepted(), accepted, "token {n}: {guard:?}");
    }

    // Bad input: refused before any statement.
    let mut tx = db.begin().await?;
    for (resource, token, what) in [
        ("", 1, "empty resource"),
        ("r", 0, "token 0"),
        ("r", u64::MAX, "token beyond i64"),
    ] {
        let err = leasehold_pg::sqlx::guard_token(&mut tx, resource, FencingToken::new(token), &a)
            .await
            .err();
        assert!(
            matches!(
                err,
                Some(
                    Error::InvalidResource { .. }
                        | Error::InvalidToken { .. }
                        | Error::TokenOutOfRange { .. }
                )
            ),
            "{what}: {err:?}"
        );
    }
    // In a transaction an earlier error aborted: typed, nothing written.
    let _ = sqlx::raw_sql("SELECT no_such_column FROM leasehold_fences")
        .execute(&mut *tx)
        .await;
    let err = leasehold_pg::sqlx::guard_token(&mut tx, "t:aborted", FencingToken::new(1), &a)
        .await
        .err();
    assert!(matches!(err, Some(Error::Aborted(_))), "{err:?}");
    tx.rollback().await?;
    assert_eq!(fence_of(&mut db, "t:aborted").await?, None);

    // A user without rights on the fence table.
    sqlx::raw_sql("CREATE ROLE sqlx_nobody LOGIN PASSWORD 'nobody'")
        .execute(&mut db)
        .await?;
    let nobody_url = format!(
        "postgres://sqlx_nobody:nobody@{}:{}/sqlx_migrate",
        pg.host(),
        pg.port()
    );
    let mut nobody = PgConnection::connect(&nobody_url).await?;
    let err = leasehold_pg::sqlx::guard_token(&mut nobody, "r", FencingToken::new(1), &a)
        .await
        .err();
    assert!(matches!(err, Some(Error::PermissionDenied(_))), "{err:?}");

    // A serialization failure under REPEATABLE READ: retryable.
    let mut other = PgConnection::connect(&url).await?;
    let mut rr = db.begin().await?;
    sqlx::raw_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; SELECT 1")
        .execute(&mut *rr)
        .await?;
    assert_eq!(
        guard_with(&mut other, "t:rr", 10, &a, true).await?,
        Guard::Accepted
    );
    let err = leasehold_pg::sqlx::guard_token(&mut rr, "t:rr", FencingToken::new(11), &b)
        .await
        .err();
    assert!(
        matches!(&err, Some(err @ Error::Postgres(_)) if err.is_retryable()),
        "{err:?}"
    );
    rr.rollback().await?;

    // The connection killed under us (an administrator, a failover).
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut db)
        .await?;
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .execute(&mut other)
        .await?;
    let err = leasehold_pg::sqlx::guard_token(&mut db, "t:gone", FencingToken::new(1), &a)
        .await
        .err();
    assert!(
        matches!(&err, Some(err @ Error::SessionEnded(source))
            if err.is_retryable() && source.code() == Some("57P01")),
        "{err:?}"
    );
    Ok(())
}

/// An error the server answered with, and no variant names, says its
/// SQLSTATE and message, as on tokio-postgres; they are in the whole
/// chain once, its detail kept.
#[tokio::test]
async fn a_server_error_says_its_sqlstate_and_message_once() -> TestResult {
    let pg = server()?;
    let (mut db, _) = fresh(&pg, "sqlx_server_error").await?;
    sqlx::raw_sql(
        "CREATE TABLE server_error_once (id int PRIMARY KEY);
         INSERT INTO server_error_once VALUES (1);",
    )
    .execute(&mut db)
    .await?;
    let err = sqlx::query("INSERT INTO server_error_once VALUES (1)")
        .execute(&mut db)
        .await
        .map_err(Error::from)
        .err()
        .ok_or("a duplicate key was inserted")?;
    let message = r#"duplicate key value violates unique constraint "server_error_once_pkey""#;
    assert!(
        matches!(&err, Error::Postgres(source)
            if source.as_sqlx().is_some() && source.code() == Some("23505")
                && source.message() == Some(message)),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        format!("postgresql error 23505: {message}")
    );
    assert!(!err.is_retryable());
    let chain = chain(&err);
    assert_eq!(chain.matches(message).count(), 1, "{chain}");
    assert_eq!(chain.matches("23505").count(), 1, "{chain}");
    assert!(chain.contains("Key (id)=(1) already exists."), "{chain}");
    Ok(())
}

/// The server ends the session of a guarded transaction before its
/// commit (its idle-in-transaction timeout, set for this transaction
/// alone): `SessionEnded` with its SQLSTATE, retryable, not
/// `CommitUnknown`; nothing written.
#[tokio::test]
async fn a_session_the_server_ended_before_the_commit_did_not_commit() -> TestResult {
    let pg = server()?;
    let mut db = db(&pg, "sqlx_ended").await?;
    let mut watcher = PgConnection::connect(&url_of(&pg, "sqlx_ended")).await?;
    let redis = RedisServer::start()?;
    let locker = Locker::connect(&leasehold::redis::Client::open(redis.url())?).await?;
    let lease = locker
        .acquire(&FencedKeys::for_resource("sqlx:ended")?, TTL)
        .await?;

    let ended = tokio::time::timeout(
        HUNG,
        leasehold_pg::sqlx::guarded(&mut db, &lease, async |tx: &mut PgConnection| {
            bump(tx).await?;
            sqlx::raw_sql(
                "SET LOCAL idle_in_transaction_session_timeout = '100ms';
                 SELECT pg_advisory_xact_lock(3702);",
            )
            .execute(&mut *tx)
            .await?;
            // The transaction now sits idle past its timeout, which is the
            // fault under test: the server ends the session, and its end
            // frees the advisory lock the watcher waits for (the signal,
            // no sleep). sqlx reads the server's last word with the next
            // statement, guarded's check before its COMMIT.
            sqlx::raw_sql("SELECT pg_advisory_lock(3702); SELECT pg_advisory_unlock(3702);")
                .execute(&mut watcher)
                .await?;
            Ok::<_, Error>(())
        }),
    )
    .await?;

    let err = ended.err().ok_or("an ended session committed")?;
    assert!(
        matches!(&err, Error::SessionEnded(source) if source.code() == Some("25P03")),
        "{err:?}"
    );
    assert!(err.is_retryable());
    assert_eq!(
        err.to_string(),
        "postgresql ended the session (25P03 idle_in_transaction_session_timeout): \
         the transaction did not commit"
    );
    let chain = chain(&err);
    let message = "terminating connection due to idle-in-transaction timeout";
    assert_eq!(chain.matches(message).count(), 1, "{chain}");
    assert_eq!(value(&mut watcher).await?, 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guarded_says_what_the_database_holds() -> TestResult {
    let pg = server()?;
    let mut db = db(&pg, "sqlx_guarded").await?;
    let redis = RedisServer::start()?;
    let locker = Locker::connect(&leasehold::redis::Client::open(redis.url())?).await?;
    let keys = FencedKeys::for_resource("sqlx:guarded")?;

    // Committed: the output, and the row.
    let lease = locker.acquire(&keys, TTL).await?;
    let done = leasehold_pg::sqlx::guarded(&mut db, &lease, bump).await?;
    assert_eq!(done, Guarded::Committed(1));
    assert_eq!(value(&mut db).await?, 1);

    // The work's error after it wrote: rolled back.
    let failed: Result<Guarded<i64>, Error> =
        leasehold_pg::sqlx::guarded(&mut db, &lease, async |tx: &mut PgConnection| {
            bump(tx).await?;
            Err(Error::NotFenced)
        })
        .await;
    assert!(matches!(failed, Err(Error::NotFenced)), "{failed:?}");
    assert_eq!(value(&mut db).await?, 1);

    // A statement error the work swallowed: PostgreSQL would roll back at
    // COMMIT and report success; guarded says so instead.
    let swallowed = leasehold_pg::sqlx::guarded(&mut db, &lease, async |tx: &mut PgConnection| {
        bump(tx).await?;
        let _ = sqlx::query("SELECT no_such_column FROM counter")
            .execute(&mut *tx)
            .await;
        Ok::<_, Error>(7)
    })
    .await;
    assert!(
        matches!(&swallowed, Err(Error::Aborted(source)) if source.code() == Some("25P02")),
        "{swallowed:?}"
    );
    assert_eq!(value(&mut db).await?, 1);
    // The connection is usable afterwards (the aborted transaction ended),
    // and the next transaction is a real one, not a savepoint.
    assert!(!db.is_in_transaction());
    assert_eq!(
        leasehold_pg::sqlx::guarded(&mut db, &lease, bump).await?,
        Guarded::Committed(2)
    );
    assert_eq!(
        value(&mut PgConnection::connect(&url_of(&pg, "sqlx_guarded")).await?).await?,
        2
    );

    // Inside the caller's transaction the COMMIT would only release a
    // savepoint: refused, nothing run.
    let ran = AtomicBool::new(false);
    let mut outer = db.begin().await?;
    let nested = leasehold_pg::sqlx::guarded(&mut outer, &lease, async |tx: &mut PgConnection| {
        ran.store(true, Ordering::SeqCst);
        bump(tx).await
    })
    .await;
    assert!(matches!(nested, Err(Error::InTransaction)), "{nested:?}");
    assert!(!ran.load(Ordering::SeqCst));
    outer.rollback().await?;

    // The lease lost mid-work: stopped before its commit, rolled back.
    let lost = leasehold_pg::sqlx::guarded(&mut db, &lease, async |tx: &mut PgConnection| {
        bump(tx).await?;
        lease.mark_superseded();
        // The next `.await` is where the watchdog stops the work.
        tokio::task::yield_now().await;
        Ok::<_, Error>(0)
    })
    .await?;
    assert_eq!(lost, Guarded::Lost(LostCause::Superseded));
    assert_eq!(value(&mut db).await?, 2);
    let _ = lease.release().await;

    // A holder whose lock was lost under it, while a newer holder took the
    // lock and wrote: the old token is refused, and the work never runs.
    let old = locker.acquire(&keys, TTL).await?;
    let mut conn = locker.connection().clone();
    leasehold::redis::cmd("DEL")
        .arg(keys.lock())
        .query_async::<()>(&mut conn)
        .await?;
    let newer = locker.acquire(&keys, TTL).await?;
    assert_eq!(
        leasehold_pg::sqlx::guarded(&mut db, &newer, bump).await?,
        Guarded::Committed(3)
    );
    let stale = leasehold_pg::sqlx::guarded(&mut db, &old, async |tx: &mut PgConnection| {
        ran.store(true, Ordering::SeqCst);
        bump(tx).await
    })
    .await?;
    let first = old.fence().ok_or("fenced")?;
    assert!(
        matches!(&stale, Guarded::Refused { token, current, healed: true, .. }
            if *token == first && *current == newer.fence().ok_or("fenced")?),
        "{stale:?}"
    );
    assert!(!ran.load(Ordering::SeqCst), "the work ran after a refusal");
    assert_eq!(value(&mut db).await?, 3);
    drop(old);
    newer.release().await?;

    // A plain lease has no fence to guard with: a typed error, nothing run.
    let plain = locker.acquire("lock:sqlx:guarded:plain", TTL).await?;
    let refused = leasehold_pg::sqlx::guarded(&mut db, &plain, bump).await;
    assert!(matches!(refused, Err(Error::NotFenced)), "{refused:?}");
    assert_eq!(value(&mut db).await?, 3);
    plain.release().await?;
    Ok(())
}

/// A holder that freezes inside its guarded transaction stalls the next
/// one only until its lease would have run out: the server ends its
/// session (the guard's idle bound), the next holder commits, and the
/// frozen one's commit says it did not commit (as on tokio-postgres).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_frozen_in_its_transaction_stalls_the_next_only_for_its_lease() -> TestResult {
    frozen_between_statements("sqlx_frozen", false).await
}

/// The same through PgBouncer in transaction mode (pool of 2): the
/// guard's bound is transaction-local and its statements unnamed, so the
/// frozen holder's server connection is ended and the next holder
/// commits on the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_pgbouncer_a_frozen_holder_stalls_the_next_only_for_its_lease() -> TestResult {
    frozen_between_statements("sqlx_frozen_pgbouncer", true).await
}

/// A holder frozen between statements, and the next holder, on
/// connections straight to the server or through PgBouncer.
async fn frozen_between_statements(name: &str, through_pgbouncer: bool) -> TestResult {
    let pg = server()?;
    let mut direct = db(&pg, name).await?;
    let bouncer = match through_pgbouncer {
        true => Some(leasehold_testkit::PgBouncer::start(&pg)?),
        false => None,
    };
    let url = bouncer
        .as_ref()
        .map_or_else(|| url_of(&pg, name), |b| b.url_for(name));
    let mut next_db = PgConnection::connect(&url).await?;
    let mut frozen_db = PgConnection::connect(&url).await?;
    let redis = RedisServer::start()?;
    let keys = FencedKeys::for_resource("sqlx:frozen")?;
    let (frozen, runtime) = frozen_lease(redis.url(), keys.clone(), Duration::from_secs(1))?;
    let locker = Locker::connect(&leasehold::redis::Client::open(redis.url())?).await?;
    let (guarded_tx, guarded_rx) = tokio::sync::oneshot::channel();
    let (committed_tx, committed_rx) = tokio::sync::oneshot::channel();

    let take_over = GuardOptions::new().take_over_after(Duration::from_millis(100));
    let frozen_holder = leasehold_pg::sqlx::guarded_with_options(
        &mut frozen_db,
        &frozen,
        &take_over,
        async |tx: &mut PgConnection| {
            bump(tx).await?;
            let _ = guarded_tx.send(());
            // Frozen: the transaction and its row lock held, nothing sent,
            // until the next holder has committed. sqlx reads the server's
            // last word (25P03) with guarded's next statement.
            let _ = committed_rx.await;
            Ok::<_, Error>(())
        },
    );
    let next_holder = async {
        guarded_rx.await?;
        let opts = AcquireOptions::new().wait(HUNG);
        let lease = locker.acquire_with(&keys, TTL, &opts).await?;
        let done = leasehold_pg::sqlx::guarded(&mut next_db, &lease, bump).await?;
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
    assert_eq!(value(&mut direct).await?, 1);
    drop(frozen);
    runtime.shutdown_background();
    Ok(())
}

/// A holder frozen *during* a statement (the backend blocked writing a
/// large answer to a client that stopped reading) holds the guard's row
/// past any idle timeout; a next holder whose guard takes over ends that
/// older holder's session once its lease has run out, and commits, as on
/// tokio-postgres. Here the resource's row was committed before: the
/// take-over finds the frozen holder as the row's locker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_frozen_mid_statement_is_taken_over_by_the_next() -> TestResult {
    let pg = server()?;
    let mut next_db = db(&pg, "sqlx_mid_statement").await?;
    let proxy = FaultProxy::start(pg.addr())?;
    let through_proxy = url_of(&pg, "sqlx_mid_statement")
        .replace(&pg.port().to_string(), &proxy.port().to_string());
    let mut frozen_db = PgConnection::connect(&through_proxy).await?;
    let redis = RedisServer::start()?;
    let keys = FencedKeys::for_resource("sqlx:mid-statement")?;
    let locker = Locker::connect(&leasehold::redis::Client::open(redis.url())?).await?;
    let first = locker.acquire(&keys, TTL).await?;
    let done = leasehold_pg::sqlx::guarded(&mut next_db, &first, bump).await?;
    assert_eq!(done, Guarded::Committed(1));
    first.release().await?;
    let (frozen, runtime) = frozen_lease(redis.url(), keys.clone(), Duration::from_secs(1))?;
    let (sent_tx, sent_rx) = tokio::sync::oneshot::channel();

    let take_over = GuardOptions::new().take_over_after(Duration::from_millis(100));
    let frozen_holder = leasehold_pg::sqlx::guarded_with_options(
        &mut frozen_db,
        &frozen,
        &take_over,
        async |tx: &mut PgConnection| {
            bump(tx).await?;
            let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
                .fetch_one(&mut *tx)
                .await?;
            // The client stops reading: the request goes out (a simple
            // query), 64 MB of answer do not come back.
            proxy.freeze(Direction::Downstream, true);
            let _ = sent_tx.send(pid);
            tx.execute("SELECT repeat('x', 1048576) FROM generate_series(1, 64)")
                .await?;
            Ok::<_, Error>(())
        },
    );
    let next_holder = async {
        let pid = sent_rx.await?;
        // In its statement, blocked writing to the client: not idle.
        let blocked = async {
            loop {
                let writing: bool = sqlx::query_scalar(
                    "SELECT EXISTS (SELECT FROM pg_stat_activity
                      WHERE pid = $1 AND state = 'active' AND wait_event = 'ClientWrite')",
                )
                .bind(pid)
                .fetch_one(&mut next_db)
                .await?;
                if writing {
                    return Ok::<_, sqlx::Error>(());
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(HUNG, blocked).await??;
        let opts = AcquireOptions::new().wait(HUNG);
        let lease = locker.acquire_with(&keys, TTL, &opts).await?;
        let done = leasehold_pg::sqlx::guarded_with_options(&mut next_db, &lease, &take_over, bump)
            .await?;
        proxy.freeze(Direction::Downstream, false);
        lease.release().await?;
        Ok::<_, Box<dyn std::error::Error>>(done)
    };
    let ran = tokio::time::timeout(HUNG, async { tokio::join!(frozen_holder, next_holder) }).await;
    drop(frozen);
    runtime.shutdown_background();
    let (frozen_outcome, next_outcome) = ran?;

    assert_eq!(next_outcome?, Guarded::Committed(2));
    assert!(frozen_outcome.is_err(), "{frozen_outcome:?}");
    assert_eq!(value(&mut next_db).await?, 2);
    Ok(())
}

/// `idle_in_transaction_session_timeout` in milliseconds, as it stands.
async fn idle_timeout_ms(db: &mut PgConnection) -> Result<i64, Error> {
    Ok(sqlx::query_scalar(
        "SELECT (extract(epoch FROM current_setting('idle_in_transaction_session_timeout')::interval) * 1000)::bigint",
    )
    .fetch_one(db)
    .await?)
}

/// The guard bounds the transaction's idle periods by the lease, for that
/// transaction alone, and keeps a smaller bound the caller set.
#[tokio::test]
async fn the_guard_bounds_idle_periods_by_the_lease_for_its_transaction_only() -> TestResult {
    let pg = server()?;
    let mut db = db(&pg, "sqlx_idle").await?;
    let redis = RedisServer::start()?;
    let locker = Locker::connect(&leasehold::redis::Client::open(redis.url())?).await?;
    let lease = locker
        .acquire(&FencedKeys::for_resource("sqlx:idle")?, TTL)
        .await?;
    let ttl_ms = i64::try_from(TTL.as_millis())?;
    for (session, inside) in [("0", None), ("1h", None), ("200ms", Some(200))] {
        sqlx::raw_sql(&format!(
            "SET idle_in_transaction_session_timeout = '{session}'"
        ))
        .execute(&mut db)
        .await?;
        let before = idle_timeout_ms(&mut db).await?;
        let set = leasehold_pg::sqlx::guarded(&mut db, &lease, idle_timeout_ms)
            .await?
            .committed()
            .ok_or("not committed")?;
        match inside {
            Some(kept) => assert_eq!(set, kept, "session {session}"),
            None => assert!(0 < set && set <= ttl_ms, "session {session}: {set} ms"),
        }
        assert_eq!(idle_timeout_ms(&mut db).await?, before, "session {session}");
    }
    // guard_token has no validity to bound anything by.
    sqlx::raw_sql("SET idle_in_transaction_session_timeout = 0")
        .execute(&mut db)
        .await?;
    let mut tx = db.begin().await?;
    let found = leasehold_pg::sqlx::guard_token(
        &mut tx,
        "sqlx:idle:token",
        FencingToken::new(1),
        &lease.holder(),
    )
    .await?;
    assert!(found.is_accepted());
    assert_eq!(idle_timeout_ms(&mut tx).await?, 0);
    tx.rollback().await?;
    lease.release().await?;
    Ok(())
}

/// A leader's term whose guarded write is refused ends by itself, as on
/// tokio-postgres: the guard marks its lease superseded, through
/// `guarded` and through the guard alone, with no `mark_superseded` call;
/// the work under the term stops at its next `.await`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_term_ends_without_the_user_marking_it() -> TestResult {
    let pg = server()?;
    let mut db = db(&pg, "sqlx_term").await?;

    let (stale, newer) = superseded_term("sqlx-term").await?;
    assert!(stale.is_leader(), "the old leader does not know yet");
    let done = leasehold_pg::sqlx::guarded(&mut db, newer.lease(), bump).await?;
    assert_eq!(done, Guarded::Committed(1));
    let ran = AtomicBool::new(false);
    let refused =
        leasehold_pg::sqlx::guarded(&mut db, stale.lease(), async |tx: &mut PgConnection| {
            ran.store(true, Ordering::SeqCst);
            bump(tx).await
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

    let (stale, newer) = superseded_term("sqlx-term-2").await?;
    let done = leasehold_pg::sqlx::guarded(&mut db, newer.lease(), bump).await?;
    assert_eq!(done, Guarded::Committed(2));
    let work = stale.run(async {
        let mut tx = db.begin().await?;
        let found = leasehold_pg::sqlx::guard(&mut tx, stale.lease()).await?;
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
    assert_eq!(value(&mut db).await?, 2);
    stale.resign().await?;
    newer.resign().await?;
    Ok(())
}

fn url_of(pg: &PostgresServer, name: &str) -> String {
    pg.url().replace("/postgres", &format!("/{name}"))
}

/// `guarded_with_hook` on sqlx: the hook runs after the work and before
/// the commit, inside the commit's shield. While it waits, another
/// session does not see the work's write and cannot take the guard's
/// row, and a lease lost meanwhile does not stop it; once it returns,
/// the transaction commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hook_runs_between_the_work_and_the_commit_inside_its_shield() -> TestResult {
    let pg = server()?;
    let name = "sqlx_hook";
    let mut db = db(&pg, name).await?;
    let url = pg.url().replace("/postgres", &format!("/{name}"));
    let mut watcher = PgConnection::connect(&url).await?;
    let lock = MemoryLocker::new();
    let keys = FencedKeys::for_resource("sqlx:hook")?;
    let lease = lock.acquire(&keys, TTL).await?;
    // A first transaction creates the guard's row (an uncommitted insert
    // would be invisible to the watcher's `FOR UPDATE NOWAIT`).
    assert_eq!(
        leasehold_pg::sqlx::guarded(&mut db, &lease, async |tx: &mut PgConnection| bump(tx)
            .await)
        .await?,
        Guarded::Committed(1)
    );

    let worked = AtomicBool::new(false);
    let (reached, hook_reached) = oneshot::channel();
    let (let_go, hook_let_go) = oneshot::channel::<()>();
    let options = GuardOptions::new();
    let guarded = leasehold_pg::sqlx::guarded_with_hook(
        &mut db,
        &lease,
        &options,
        async |tx: &mut PgConnection| {
            let n = bump(tx).await?;
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
        let seen = value(&mut watcher).await?;
        let row =
            sqlx::query("SELECT 1 FROM leasehold_fences WHERE resource = $1 FOR UPDATE NOWAIT")
                .bind(keys.fence())
                .fetch_all(&mut watcher)
                .await;
        let _ = let_go.send(());
        Ok::<_, Box<dyn std::error::Error>>((after_the_work, seen, row.map(|rows| rows.len())))
    };
    let (done, observed) =
        tokio::time::timeout(HUNG, async { tokio::join!(guarded, observe) }).await?;
    let (after_the_work, seen, row) = observed?;
    assert!(after_the_work, "the hook ran before the work ended");
    assert_eq!(seen, 1, "the work's write was visible while the hook ran");
    match row {
        Err(sqlx::Error::Database(err)) if err.code().as_deref() == Some("55P03") => {}
        other => return Err(format!("the guard's row was not locked: {other:?}").into()),
    }
    assert_eq!(done?, Guarded::Committed(2), "the hook was not shielded");
    assert_eq!(value(&mut watcher).await?, 2);
    Ok(())
}

/// `guarded_with_hook` on sqlx: the hook does not run when there is
/// nothing to commit (the work's error, a refused guard), and nothing is
/// written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hook_does_not_run_when_nothing_is_committed() -> TestResult {
    let pg = server()?;
    let mut db = db(&pg, "sqlx_hook_skipped").await?;
    let lock = MemoryLocker::new();
    let keys = FencedKeys::for_resource("sqlx:hook-skipped")?;
    let old = lock.acquire(&keys, TTL).await?;
    let hooked = AtomicBool::new(false);
    let hook = async || hooked.store(true, Ordering::SeqCst);

    // The work's error: rolled back, the hook not run.
    let failed: Result<Guarded<i64>, Error> = leasehold_pg::sqlx::guarded_with_hook(
        &mut db,
        &old,
        &GuardOptions::new(),
        async |tx: &mut PgConnection| {
            bump(tx).await?;
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
    assert_eq!(value(&mut db).await?, 0);

    // A refusal: a newer holder has written.
    lock.expire(keys.lock());
    let newer = lock.acquire(&keys, TTL).await?;
    assert_eq!(
        leasehold_pg::sqlx::guarded(&mut db, &newer, async |tx: &mut PgConnection| bump(tx)
            .await)
        .await?,
        Guarded::Committed(1)
    );
    let refused = leasehold_pg::sqlx::guarded_with_hook(
        &mut db,
        &old,
        &GuardOptions::new(),
        async |tx: &mut PgConnection| bump(tx).await,
        hook,
    )
    .await?;
    assert!(matches!(refused, Guarded::Refused { .. }), "{refused:?}");
    assert!(
        !hooked.load(Ordering::SeqCst),
        "the hook ran after a refusal"
    );
    assert_eq!(value(&mut db).await?, 1);

    // The control: after a work that returned `Ok`, it runs.
    let done = leasehold_pg::sqlx::guarded_with_hook(
        &mut db,
        &newer,
        &GuardOptions::new(),
        async |tx: &mut PgConnection| bump(tx).await,
        hook,
    )
    .await?;
    assert_eq!(done, Guarded::Committed(2));
    assert!(hooked.load(Ordering::SeqCst), "the hook did not run");
    Ok(())
}

#[tokio::test]
async fn a_fencing_token_binds_and_reads_as_an_int8() -> TestResult {
    let pg = server()?;
    let mut db = db(&pg, "sqlx_tokens").await?;
    let token = FencingToken::new(1 << 50);
    sqlx::query("UPDATE counter SET fence = $1 WHERE id = 1")
        .bind(token)
        .execute(&mut db)
        .await?;
    let read: FencingToken = sqlx::query_scalar("SELECT fence FROM counter WHERE id = 1")
        .fetch_one(&mut db)
        .await?;
    assert_eq!(read, token);
    // The largest bigint round-trips.
    let max = FencingToken::new(i64::MAX as u64);
    let back: FencingToken = sqlx::query_scalar("SELECT $1::bigint")
        .bind(max)
        .fetch_one(&mut db)
        .await?;
    assert_eq!(back, max);
    // Beyond bigint: refused at bind time (nothing sent), nothing written.
    let too_big = sqlx::query("UPDATE counter SET fence = $1 WHERE id = 1")
        .bind(FencingToken::new(u64::MAX))
        .execute(&mut db)
        .await;
    assert!(
        matches!(too_big, Err(sqlx::Error::Encode(_))),
        "{too_big:?}"
    );
    let still: FencingToken = sqlx::query_scalar("SELECT fence FROM counter WHERE id = 1")
        .fetch_one(&mut db)
        .await?;
    assert_eq!(still, token);
    // Not a token: 0 and negative numbers do not decode as one.
    for value in [0_i64, -5] {
        let read = sqlx::query_scalar::<_, FencingToken>("SELECT $1::bigint")
            .bind(value)
            .fetch_one(&mut db)
            .await;
        assert!(
            matches!(read, Err(sqlx::Error::ColumnDecode { .. })),
            "{value}: {read:?}"
        );
    }
    // INT8 only: an int column is not read as a token.
    sqlx::query("UPDATE counter SET small = 7 WHERE id = 1")
        .execute(&mut db)
        .await?;
    let small = sqlx::query_scalar::<_, FencingToken>("SELECT small FROM counter WHERE id = 1")
        .fetch_one(&mut db)
        .await;
    assert!(small.is_err(), "{small:?}");
    Ok(())
}

/// Through PgBouncer in transaction mode (pool of 2), two clients whose
/// guarded transactions are open at once, round after round, each run on
/// whichever server connection is free: a statement the guard had
/// prepared by name on one would be missing on the other ("prepared
/// statement ... does not exist"). The guard's statements are unnamed,
/// so every transaction commits, on both server connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_pgbouncer_guarded_transactions_move_between_server_connections() -> TestResult {
    let pg = server()?;
    let name = "sqlx_pgbouncer_moves";
    let _direct = db(&pg, name).await?;
    let bouncer = leasehold_testkit::PgBouncer::start(&pg)?;
    let redis = RedisServer::start()?;
    let locker = Locker::connect(&leasehold::redis::Client::open(redis.url())?).await?;
    let mut clients = [
        PgConnection::connect(&bouncer.url_for(name)).await?,
        PgConnection::connect(&bouncer.url_for(name)).await?,
    ];
    // The second client prepares a statement of its own first (named,
    // sqlx's default), so the two clients' names no longer match
    // statement for statement: a named guard statement of one client
    // would then meet the other's statement under its name.
    let mut own = clients[1].begin().await?;
    let one: i32 = sqlx::query_scalar("SELECT $1::int")
        .bind(1)
        .fetch_one(&mut *own)
        .await?;
    own.commit().await?;
    assert_eq!(one, 1);
    let leases = [
        locker
            .acquire(&FencedKeys::for_resource("sqlx:moves:a")?, TTL)
            .await?,
        locker
            .acquire(&FencedKeys::for_resource("sqlx:moves:b")?, TTL)
            .await?,
    ];
    let mut seen: [Vec<i32>; 2] = [Vec::new(), Vec::new()];
    for round in 0..8 {
        // Both transactions open at once (two server connections), the
        // first to begin alternating.
        let both = tokio::sync::Barrier::new(2);
        let (began_tx, began_rx) = oneshot::channel::<()>();
        let [a, b] = &mut clients;
        let (first, second) = if round % 2 == 0 { (a, b) } else { (b, a) };
        let (first_lease, second_lease) = if round % 2 == 0 {
            (&leases[0], &leases[1])
        } else {
            (&leases[1], &leases[0])
        };
        let work = async |tx: &mut PgConnection| {
            let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
                .persistent(false)
                .fetch_one(&mut *tx)
                .await
                .map_err(Error::from)?;
            both.wait().await;
            Ok::<i32, Error>(pid)
        };
        let one = async {
            let began = leasehold_pg::sqlx::guarded(first, first_lease, async |tx| {
                let _ = began_tx.send(());
                work(tx).await
            });
            began.await
        };
        let two = async {
            let _ = began_rx.await;
            leasehold_pg::sqlx::guarded(second, second_lease, work).await
        };
        let (one, two) = tokio::time::timeout(HUNG, async { tokio::join!(one, two) }).await?;
        let (Guarded::Committed(p1), Guarded::Committed(p2)) = (one?, two?) else {
            return Err("a guarded transaction did not commit".into());
        };
        let (i1, i2) = if round % 2 == 0 { (0, 1) } else { (1, 0) };
        seen[i1].push(p1);
        seen[i2].push(p2);
    }
    for (client, pids) in seen.iter().enumerate() {
        let mut distinct = pids.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(
            distinct.len(),
            2,
            "client {client} ran on one server connection only: {pids:?}"
        );
    }
    for lease in leases {
        lease.release().await?;
    }
    Ok(())
}
