//! The write helpers against a real, throwaway PostgreSQL (one per test
//! binary while tests overlap) and, for the counter-reset case, Redis.

use leasehold::Lessor;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use leasehold::redis::AsyncCommands;
use leasehold::{FencedKeys, FencingToken, Locker};
use leasehold_pg::tokio_postgres::Client;
use leasehold_pg::{Error, Outcome};
use leasehold_testkit::{PostgresServer, RedisServer};

mod common;
use common::{chain, server};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A wallet id no other test in this binary uses.
fn wallet_id() -> i64 {
    static NEXT: AtomicI64 = AtomicI64::new(1000);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

async fn db(server: &PostgresServer) -> Result<Client, Error> {
    let mut client = leasehold_pg::connect(&server.url()).await?;
    leasehold_pg::setup_wallets(&mut client).await?;
    Ok(client)
}

fn token(n: u64) -> FencingToken {
    FencingToken::new(n)
}

#[tokio::test]
async fn stale_token_is_rejected() -> TestResult {
    let server = server()?;
    let db = db(&server).await?;
    let id = wallet_id();
    leasehold_pg::reset_wallet(&db, id, 100).await?;
    let a = leasehold_pg::read_wallet(&db, id).await?;
    let b = leasehold_pg::read_wallet(&db, id).await?;
    assert_eq!((a.balance(), a.fence()), (100, 0));

    let won = leasehold_pg::debit_fenced(&db, &b, 10, token(34)).await?;
    assert_eq!(won, Outcome::Applied { balance: 90 });
    let lost = leasehold_pg::debit_fenced(&db, &a, 10, token(33)).await?;
    assert_eq!(lost, Outcome::StaleToken { fence: 34 });
    // A repeated token is refused too: the check is strict.
    let again = leasehold_pg::debit_fenced(&db, &b, 10, token(34)).await?;
    assert_eq!(again, Outcome::StaleToken { fence: 34 });

    let audit = leasehold_pg::audit(&db, id).await?;
    assert_eq!((audit.balance, audit.fence), (90, 34));
    assert_eq!((audit.ledger_sum, audit.ledger_count), (10, 1));
    assert!(audit.balances(100));
    Ok(())
}

#[tokio::test]
async fn stale_read_is_rejected_by_check_and_set_only() -> TestResult {
    let server = server()?;
    let db = db(&server).await?;
    for (check_version, id) in [(true, wallet_id()), (false, wallet_id())] {
        leasehold_pg::reset_wallet(&db, id, 100).await?;
        // Overlapping leases: 33 and 34 both read 100.
        let read33 = leasehold_pg::read_wallet(&db, id).await?;
        let read34 = leasehold_pg::read_wallet(&db, id).await?;
        let db = &db;
        let debit = move |read: leasehold_pg::Snapshot, t| async move {
            if check_version {
                leasehold_pg::debit_check_and_set(db, &read, 10, token(t)).await
            } else {
                leasehold_pg::debit_fenced(db, &read, 10, token(t)).await
            }
        };
        assert_eq!(debit(read33, 33).await?, Outcome::Applied { balance: 90 });
        let second = debit(read34, 34).await?;
        let audit = leasehold_pg::audit(db, id).await?;
        if check_version {
            assert_eq!(second, Outcome::StaleRead { fence: 33 });
            assert_eq!((audit.balance, audit.ledger_count), (90, 1));
            assert!(audit.balances(100), "{audit:?}");
        } else {
            // Fencing alone: both legal, one debit lost, and the ledger shows it.
            assert_eq!(second, Outcome::Applied { balance: 90 });
            assert_eq!((audit.balance, audit.ledger_count), (90, 2));
            assert!(!audit.balances(100), "{audit:?}");
        }
    }
    Ok(())
}

#[tokio::test]
async fn insufficient_funds_and_bad_input() -> TestResult {
    let server = server()?;
    let db = db(&server).await?;
    let id = wallet_id();
    leasehold_pg::reset_wallet(&db, id, 5).await?;
    let read = leasehold_pg::read_wallet(&db, id).await?;
    assert_eq!(
        leasehold_pg::debit_check_and_set(&db, &read, 10, token(1)).await?,
        Outcome::InsufficientFunds { balance: 5 }
    );
    assert_eq!(
        leasehold_pg::debit_conditional(&db, id, 10).await?,
        Outcome::InsufficientFunds { balance: 5 }
    );
    assert!(matches!(
        leasehold_pg::debit_conditional(&db, id, 0).await,
        Err(Error::InvalidAmount { amount: 0 })
    ));
    assert!(matches!(
        leasehold_pg::debit_fenced(&db, &read, 1, token(u64::MAX)).await,
        Err(Error::TokenOutOfRange { .. })
    ));
    assert!(matches!(
        leasehold_pg::reset_wallet(&db, id, -1).await,
        Err(Error::InvalidBalance { balance: -1 })
    ));
    assert!(matches!(
        leasehold_pg::read_wallet(&db, wallet_id()).await,
        Err(Error::WalletNotFound { .. })
    ));
    let audit = leasehold_pg::audit(&db, id).await?;
    assert_eq!((audit.balance, audit.ledger_count), (5, 0));
    Ok(())
}

/// 20 spenders of 10 from 100, each on its own connection, all at once.
async fn crowd(server: &PostgresServer, id: i64, for_update: bool) -> TestResult {
    let mut tasks = tokio::task::JoinSet::new();
    let start = Arc::new(tokio::sync::Barrier::new(20));
    for _ in 0..20 {
        let mut client = leasehold_pg::connect(&server.url()).await?;
        let start = start.clone();
        tasks.spawn(async move {
            start.wait().await;
            if for_update {
                leasehold_pg::debit_for_update(&mut client, id, 10).await
            } else {
                leasehold_pg::debit_conditional(&client, id, 10).await
            }
        });
    }
    let mut applied = 0;
    while let Some(outcome) = tasks.join_next().await {
        if outcome??.is_applied() {
            applied += 1;
        }
    }
    assert_eq!(applied, 10, "for_update={for_update}");
    Ok(())
}

#[tokio::test]
async fn database_only_debits_are_correct_under_contention() -> TestResult {
    let server = server()?;
    let db = db(&server).await?;
    for for_update in [true, false] {
        let id = wallet_id();
        leasehold_pg::reset_wallet(&db, id, 100).await?;
        crowd(&server, id, for_update).await?;
        let audit = leasehold_pg::audit(&db, id).await?;
        assert_eq!((audit.balance, audit.ledger_count), (0, 10), "{audit:?}");
        assert!(audit.balances(100));
    }
    Ok(())
}

#[tokio::test]
async fn lock_for_update_works_inside_the_callers_transaction() -> TestResult {
    let server = server()?;
    let mut db = db(&server).await?;
    let id = wallet_id();
    leasehold_pg::reset_wallet(&db, id, 30).await?;
    let tx = db.transaction().await?;
    let locked = leasehold_pg::lock_for_update(&tx, id).await?;
    assert_eq!(locked.snapshot().balance(), 30);
    assert_eq!(locked.debit(10).await?, Outcome::Applied { balance: 20 });
    tx.rollback().await?;
    let audit = leasehold_pg::audit(&db, id).await?;
    assert_eq!((audit.balance, audit.ledger_count), (30, 0), "rolled back");
    Ok(())
}

/// The tables of the connected database's `public` schema, sorted.
async fn tables(db: &Client) -> Result<Vec<String>, Error> {
    let rows = db
        .query(
            "SELECT table_name::text FROM information_schema.tables
             WHERE table_schema = 'public' ORDER BY table_name",
            &[],
        )
        .await?;
    Ok(rows.iter().map(|row| row.get(0)).collect())
}

#[tokio::test]
async fn missing_table_is_a_clear_error() -> TestResult {
    let server = server()?;
    let admin = leasehold_pg::connect(&server.url()).await?;
    let name = format!("missing_{}", wallet_id());
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await?;
    let url = server.url().replace("/postgres", &format!("/{name}"));
    let mut bare = leasehold_pg::connect(&url).await?;

    let err = leasehold_pg::read_wallet(&bare, 42).await.err();
    assert!(
        matches!(
            err,
            Some(Error::TableMissing {
                table: "wallets",
                ..
            })
        ),
        "{err:?}"
    );
    let message = err.map(|e| e.to_string()).unwrap_or_default();
    assert!(message.contains("wallets"), "{message}");
    assert!(message.contains("leasehold_pg::setup_wallets"), "{message}");

    // The guard's setup creates its one table and nothing of the demo's.
    leasehold_pg::setup(&mut bare).await?;
    assert_eq!(tables(&bare).await?, ["leasehold_fences"]);
    let err = leasehold_pg::read_wallet(&bare, 42).await.err();
    assert!(matches!(err, Some(Error::TableMissing { .. })), "{err:?}");

    bare.batch_execute("DROP TABLE leasehold_fences").await?;
    let tx = bare.transaction().await?;
    let err = leasehold_pg::guard_token(
        &tx,
        "wallet:42",
        token(1),
        &leasehold::HolderId::parse("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa").ok_or("holder")?,
    )
    .await
    .err();
    assert!(
        matches!(
            err,
            Some(Error::TableMissing {
                table: "leasehold_fences",
                ..
            })
        ),
        "{err:?}"
    );
    let message = err.map(|e| e.to_string()).unwrap_or_default();
    assert!(message.ends_with("leasehold_pg::setup"), "{message}");
    tx.rollback().await?;

    leasehold_pg::setup_wallets(&mut bare).await?;
    assert_eq!(tables(&bare).await?, ["wallet_ledger", "wallets"]);
    bare.batch_execute("DROP TABLE wallet_ledger").await?;
    let err = leasehold_pg::reset_wallet(&bare, 42, 100).await.err();
    assert!(
        matches!(
            err,
            Some(Error::TableMissing {
                table: "wallet_ledger",
                ..
            })
        ),
        "{err:?}"
    );
    Ok(())
}

#[tokio::test]
async fn unreachable_and_bad_credentials_are_clear_errors() -> TestResult {
    let port = leasehold_testkit::free_port()?;
    let url = format!("postgres://leasehold:s3cret-pw@127.0.0.1:{port}/postgres");
    let err = leasehold_pg::connect(&url).await.err();
    assert!(matches!(err, Some(Error::Unreachable(_))), "{err:?}");
    assert!(!format!("{:?}", err).contains("s3cret-pw"));

    let server = server()?;
    let wrong = format!(
        "postgres://leasehold:wrong-pw-123@127.0.0.1:{}/postgres",
        server.port()
    );
    let err = leasehold_pg::connect(&wrong).await.err();
    assert!(matches!(err, Some(Error::Auth(_))), "{err:?}");
    let chain = err.map(|e| chain(&e)).unwrap_or_default();
    assert!(!chain.contains("wrong-pw-123"), "{chain}");

    let err = leasehold_pg::connect("postgres://u:pw@host:notaport/db")
        .await
        .err();
    assert!(matches!(err, Some(Error::InvalidUrl)), "{err:?}");
    Ok(())
}

/// An error the server answered with, and no variant names, says its
/// SQLSTATE and message; they are in the whole chain once, its detail
/// kept.
#[tokio::test]
async fn a_server_error_says_its_sqlstate_and_message_once() -> TestResult {
    let server = server()?;
    let db = leasehold_pg::connect(&server.url()).await?;
    db.batch_execute(
        "CREATE TABLE server_error_once (id int PRIMARY KEY);
         INSERT INTO server_error_once VALUES (1);",
    )
    .await?;
    let err = db
        .execute("INSERT INTO server_error_once VALUES (1)", &[])
        .await
        .map_err(Error::from)
        .err()
        .ok_or("a duplicate key was inserted")?;
    let message = r#"duplicate key value violates unique constraint "server_error_once_pkey""#;
    assert!(
        matches!(&err, Error::Postgres(source)
            if source.code() == Some("23505") && source.message() == Some(message)),
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

/// The fence counter lost mid-way (a failover that lost increments, here a
/// `DEL` of the fence key) reissues no token: the next one comes from the
/// server's clock, above the stored fence, and a paused holder's old token
/// stays refused.
#[tokio::test]
async fn counter_reset_never_lets_an_old_token_write() -> TestResult {
    let server = server()?;
    let db = db(&server).await?;
    let redis = RedisServer::start()?;
    let client = leasehold::redis::Client::open(redis.url())?;
    let mut conn = leasehold_testkit::connection(&client, Duration::from_secs(1)).await?;
    let locker = Locker::builder().build(conn.clone())?;
    let id = wallet_id();
    leasehold_pg::reset_wallet(&db, id, 1000).await?;
    let keys = FencedKeys::for_resource(&format!("wallet:{id}"))?;
    let ttl = Duration::from_secs(30);

    let mut paused = None;
    let mut issued = Vec::new();
    for n in 1..=5u64 {
        let lease = locker.acquire(&keys, ttl).await?;
        let fence = lease.fence().ok_or("fenced")?;
        issued.push(fence);
        let read = leasehold_pg::read_wallet(&db, id).await?;
        if n == 3 {
            // Holder 3 reads, then stalls; its lease is dropped (released).
            paused = Some((read, fence));
            lease.release().await?;
            continue;
        }
        let outcome = leasehold_pg::debit_check_and_set(&db, &read, 10, fence).await?;
        assert!(outcome.is_applied(), "{n}: {outcome:?}");
        lease.release().await?;
    }
    assert!(issued.windows(2).all(|w| w[0] < w[1]), "{issued:?}");
    let () = conn.del(keys.fence()).await?;

    let lease = locker.acquire(&keys, ttl).await?;
    let fence = lease.fence().ok_or("fenced")?;
    let read = leasehold_pg::read_wallet(&db, id).await?;
    let outcome = leasehold_pg::debit_check_and_set(&db, &read, 10, fence).await?;
    lease.release().await?;
    assert!(
        outcome.is_applied() && issued.iter().all(|old| *old < fence),
        "token {fence} after {issued:?}: {outcome:?}"
    );

    let (read, old) = paused.ok_or("holder 3 paused")?;
    let outcome = leasehold_pg::debit_check_and_set(&db, &read, 10, old).await?;
    assert_eq!(
        outcome,
        Outcome::StaleToken {
            fence: i64::try_from(fence)?
        }
    );

    let audit = leasehold_pg::audit(&db, id).await?;
    assert_eq!(
        (audit.balance, audit.ledger_count),
        (1000 - 50, 5),
        "{audit:?}"
    );
    assert!(audit.balances(1000));
    Ok(())
}
