//! The fence guard against a real PostgreSQL and Redis, on the caller's own
//! table (`accounts`, no fence column).

use leasehold::Lessor;
use std::sync::Arc;
use std::time::Duration;

use leasehold::redis::AsyncCommands;
use leasehold::{AcquireOptions, FencedKeys, FencingToken, HolderId, Lease, Locker};
use leasehold_pg::tokio_postgres::Client;
use leasehold_pg::{Error, FENCES, Guard, Setup};
use leasehold_testkit::{PostgresServer, RedisOptions, RedisServer};

mod common;
use common::server;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const SECOND: Duration = Duration::from_secs(1);
/// A hang detector, not a timing assertion.
const HUNG: Duration = Duration::from_secs(30);

/// A database with the fence table and the caller's own table.
async fn db(server: &PostgresServer) -> Result<Client, Box<dyn std::error::Error>> {
    let mut client = leasehold_pg::connect(&server.url()).await?;
    leasehold_pg::setup(&mut client).await?;
    // Serialized: concurrent `CREATE TABLE IF NOT EXISTS` can still clash.
    client
        .batch_execute(
            "BEGIN;
             SELECT pg_advisory_xact_lock(4242);
             CREATE TABLE IF NOT EXISTS accounts (name text PRIMARY KEY, balance bigint NOT NULL);
             CREATE TABLE IF NOT EXISTS payments (id bigserial PRIMARY KEY, account text, amount bigint);
             COMMIT;",
        )
        .await?;
    Ok(client)
}

async fn open_account(db: &Client, name: &str, balance: i64) -> TestResult {
    db.execute(
        "INSERT INTO accounts (name, balance) VALUES ($1, $2)
         ON CONFLICT (name) DO UPDATE SET balance = EXCLUDED.balance",
        &[&name, &balance],
    )
    .await?;
    db.execute("DELETE FROM payments WHERE account = $1", &[&name])
        .await?;
    Ok(())
}

async fn balance(db: &Client, name: &str) -> Result<i64, Box<dyn std::error::Error>> {
    Ok(db
        .query_one("SELECT balance FROM accounts WHERE name = $1", &[&name])
        .await?
        .get(0))
}

async fn fence_of(db: &Client, resource: &str) -> Result<Option<i64>, Box<dyn std::error::Error>> {
    Ok(db
        .query_opt(
            "SELECT fence FROM leasehold_fences WHERE resource = $1",
            &[&resource],
        )
        .await?
        .map(|row| row.get(0)))
}

/// A plain read-modify-write debit inside the guard: `Ok(true)` paid,
/// `Ok(false)` refused or insufficient (rolled back).
async fn guarded_debit(
    db: &mut Client,
    lease: &Lease,
    account: &str,
    amount: i64,
) -> Result<Option<Guard>, Box<dyn std::error::Error + Send + Sync>> {
    let tx = db.transaction().await?;
    let guard = leasehold_pg::guard(&tx, lease).await?;
    if !guard.is_accepted() {
        tx.rollback().await?;
        return Ok(Some(guard));
    }
    let balance: i64 = tx
        .query_one("SELECT balance FROM accounts WHERE name = $1", &[&account])
        .await?
        .get(0);
    if balance < amount {
        tx.rollback().await?;
        return Ok(None);
    }
    tx.execute(
        "UPDATE accounts SET balance = $2 WHERE name = $1",
        &[&account, &(balance - amount)],
    )
    .await?;
    tx.execute(
        "INSERT INTO payments (account, amount) VALUES ($1, $2)",
        &[&account, &amount],
    )
    .await?;
    tx.commit().await?;
    Ok(Some(guard))
}

/// Two made-up holders: names, not capabilities (see `HolderId`).
fn holders() -> Result<(HolderId, HolderId), Box<dyn std::error::Error>> {
    let a = HolderId::parse("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa").ok_or("holder a")?;
    let b = HolderId::parse("bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb").ok_or("holder b")?;
    Ok((a, b))
}

#[tokio::test]
async fn a_stale_token_is_refused_a_newer_one_accepted_and_rollback_raises_nothing() -> TestResult {
    let pg = server()?;
    let mut db = db(&pg).await?;
    let resource = "t:guard:order";
    let (a, b) = holders()?;
    let guard_with = async |db: &mut Client, n: u64, holder: &HolderId, commit: bool| {
        let tx = db.transaction().await?;
        let guard = leasehold_pg::guard_token(&tx, resource, FencingToken::new(n), holder).await?;
        if commit && guard.is_accepted() {
            tx.commit().await?;
        } else {
            tx.rollback().await?;
        }
        Ok::<_, Box<dyn std::error::Error>>(guard)
    };
    assert_eq!(guard_with(&mut db, 5, &a, true).await?, Guard::Accepted);
    match guard_with(&mut db, 4, &b, true).await? {
        Guard::Refused { current, .. } => assert_eq!(current, FencingToken::new(5)),
        accepted => return Err(format!("a stale token was {accepted:?}").into()),
    }
    assert_eq!(
        guard_with(&mut db, 5, &a, true).await?,
        Guard::Accepted,
        "same lease again"
    );
    // Accepted, then rolled back: the fence is not raised.
    assert_eq!(guard_with(&mut db, 9, &b, false).await?, Guard::Accepted);
    assert_eq!(fence_of(&db, resource).await?, Some(5));
    assert_eq!(guard_with(&mut db, 6, &b, true).await?, Guard::Accepted);
    assert_eq!(fence_of(&db, resource).await?, Some(6));
    Ok(())
}

#[tokio::test]
async fn the_same_token_is_accepted_only_from_the_holder_that_wrote_it() -> TestResult {
    let pg = server()?;
    let mut db = db(&pg).await?;
    let resource = "t:guard:same";
    let (a, b) = holders()?;
    let guard_with = async |db: &mut Client, holder: &HolderId| {
        let tx = db.transaction().await?;
        let guard = leasehold_pg::guard_token(&tx, resource, FencingToken::new(7), holder).await?;
        if guard.is_accepted() {
            tx.commit().await?;
        } else {
            tx.rollback().await?;
        }
        Ok::<_, Box<dyn std::error::Error>>(guard)
    };
    // Redis issued token 7 twice (to a and to b): the first to write keeps it.
    assert_eq!(guard_with(&mut db, &a).await?, Guard::Accepted);
    match guard_with(&mut db, &b).await? {
        Guard::Refused {
            token,
            current,
            writer,
            ..
        } => {
            assert_eq!(
                (token, current),
                (FencingToken::new(7), FencingToken::new(7))
            );
            assert_eq!(writer.as_deref(), Some(a.as_str()));
        }
        accepted => return Err(format!("a second holder of token 7 was {accepted:?}").into()),
    }
    // a writes again under its lease; b stays refused.
    assert_eq!(guard_with(&mut db, &a).await?, Guard::Accepted);
    assert!(!guard_with(&mut db, &b).await?.is_accepted());
    Ok(())
}

#[tokio::test]
async fn setup_migrates_an_earlier_fence_table_in_place_and_says_so() -> TestResult {
    let pg = server()?;
    let admin = leasehold_pg::connect(&pg.url()).await?;
    admin.batch_execute("CREATE DATABASE migrate").await?;
    let url = pg.url().replace("/postgres", "/migrate");
    let mut db = leasehold_pg::connect(&url).await?;
    // The table as leasehold-pg created it before it recorded holders.
    db.batch_execute(
        "CREATE TABLE leasehold_fences (
             resource text PRIMARY KEY CHECK (resource <> ''),
             fence    bigint NOT NULL CHECK (fence > 0));
         INSERT INTO leasehold_fences VALUES ('t:old', 40)",
    )
    .await?;
    let (a, b) = holders()?;
    let tx = db.transaction().await?;
    let err = leasehold_pg::guard_token(&tx, "t:old", FencingToken::new(41), &a)
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
            let mut db = leasehold_pg::connect(&url).await?;
            leasehold_pg::setup(&mut db).await
        }));
    }
    let mut done = Vec::new();
    for task in tasks {
        done.push(
            tokio::time::timeout(HUNG, task)
                .await??
                .map_err(|e| e.to_string())?,
        );
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
    assert_eq!(leasehold_pg::setup(&mut db).await?, Setup::Unchanged);
    // The old row is kept; its fence has no holder, so the same token is
    // refused from anyone, and a newer one is accepted.
    assert_eq!(fence_of(&db, "t:old").await?, Some(40));
    for (n, holder, accepted) in [(40, &a, false), (40, &b, false), (41, &b, true)] {
        let tx = db.transaction().await?;
        let guard = leasehold_pg::guard_token(&tx, "t:old", FencingToken::new(n), holder).await?;
        assert_eq!(guard.is_accepted(), accepted, "token {n}: {guard:?}");
        tx.commit().await?;
    }
    // A fresh database gets the whole table at once.
    db.batch_execute("CREATE DATABASE fresh").await?;
    let mut fresh = leasehold_pg::connect(&pg.url().replace("/postgres", "/fresh")).await?;
    assert_eq!(leasehold_pg::setup(&mut fresh).await?, Setup::Created);
    assert_eq!(leasehold_pg::setup(&mut fresh).await?, Setup::Unchanged);
    Ok(())
}

#[tokio::test]
async fn bad_input_is_refused_before_any_statement_and_missing_tables_and_rights_are_typed()
-> TestResult {
    let pg = server()?;
    let mut db = db(&pg).await?;
    let (a, _) = holders()?;
    let tx = db.transaction().await?;
    let cases = [
        ("", 1, "empty resource"),
        ("r", 0, "token 0"),
        ("r", u64::MAX, "token beyond i64"),
    ];
    for (resource, token, what) in cases {
        let err = leasehold_pg::guard_token(&tx, resource, FencingToken::new(token), &a)
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
    tx.rollback().await?;

    // A database where setup never ran.
    db.batch_execute("CREATE DATABASE bare").await?;
    let bare = leasehold_pg::connect(&pg.url().replace("/postgres", "/bare")).await?;
    let err = leasehold_pg::guard_token(&bare, "r", FencingToken::new(1), &a)
        .await
        .err();
    assert!(
        matches!(err, Some(Error::TableMissing { table, .. }) if table == FENCES),
        "{err:?}"
    );

    // A user without rights on the fence table.
    db.batch_execute("CREATE ROLE nobody LOGIN PASSWORD 'nobody'")
        .await?;
    let url = format!(
        "postgres://nobody:nobody@{}:{}/postgres",
        pg.host(),
        pg.port()
    );
    let nobody = leasehold_pg::connect(&url).await?;
    let err = leasehold_pg::guard_token(&nobody, "r", FencingToken::new(1), &a)
        .await
        .err();
    assert!(matches!(err, Some(Error::PermissionDenied(_))), "{err:?}");
    Ok(())
}

/// Takes the fenced lease, retrying once over a connection that a restart
/// broke.
async fn take(locker: &Locker, keys: &FencedKeys) -> Result<Lease, leasehold::Error> {
    let opts = AcquireOptions::new().wait(HUNG);
    match locker.acquire_with(keys, 10 * SECOND, &opts).await {
        Err(err) if err.is_retryable() => locker.acquire_with(keys, 10 * SECOND, &opts).await,
        other => other,
    }
}

/// Sequential guarded debits of 1; `lose` makes Redis lose the counter
/// after the 15th. Returns how many were refused.
async fn debits_across_a_lost_counter(
    account: &str,
    lose: impl AsyncFnOnce(&mut RedisServer) -> TestResult,
) -> Result<u32, Box<dyn std::error::Error>> {
    let pg = server()?;
    let mut db = db(&pg).await?;
    let mut redis = RedisServer::start()?;
    let client = leasehold::redis::Client::open(redis.url())?;
    let locker = Locker::connect(&client).await?;
    let keys = FencedKeys::for_resource(&format!("account:{account}"))?;
    open_account(&db, account, 1_000).await?;
    let mut refused = 0;
    let mut paid = 0;
    let mut lose = Some(lose);
    for i in 0..40 {
        if i == 15 {
            if let Some(lose) = lose.take() {
                lose(&mut redis).await?;
                assert_eq!(redis.redis_cli(&["EXISTS", keys.fence()])?, "0", "not lost");
            }
            // Let the locker see its connection broken by a restart.
            let _ = locker.acquire("probe", SECOND).await;
        }
        let lease = take(&locker, &keys).await?;
        let debit = guarded_debit(&mut db, &lease, account, 1).await;
        match debit.map_err(|e| e.to_string())? {
            Some(Guard::Accepted) => paid += 1,
            Some(Guard::Refused { healed, .. }) => {
                assert!(healed, "refused without raising the counter");
                refused += 1;
            }
            None => return Err("insufficient funds".into()),
        }
        let _ = lease.release().await;
    }
    assert_eq!(paid + refused, 40);
    assert_eq!(balance(&db, account).await?, 1_000 - i64::from(paid));
    Ok(refused)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_empty_costs_no_refused_write() -> TestResult {
    let refused = debits_across_a_lost_counter("restart", async |redis: &mut RedisServer| {
        redis.restart()?;
        Ok(())
    })
    .await?;
    // None: the restarted counter's first token comes from the server's
    // clock, above every token issued before (it was 1 refusal, healed,
    // when a lost counter restarted at 1).
    assert_eq!(refused, 0, "refused writes");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_fence_key_costs_no_refused_write() -> TestResult {
    let refused = debits_across_a_lost_counter("deleted", async |redis: &mut RedisServer| {
        redis.redis_cli(&["DEL", "fence:{account:deleted}"])?;
        Ok(())
    })
    .await?;
    assert_eq!(
        refused, 0,
        "the deleted counter restarts at the server's clock: no refusal"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_spenders_with_a_1ms_ttl_lose_no_debit_inside_the_guard() -> TestResult {
    let pg = server()?;
    let setup = db(&pg).await?;
    let redis = RedisServer::start()?;
    let client = leasehold::redis::Client::open(redis.url())?;
    let locker = Locker::connect(&client).await?;
    // Connected once, before the runs: 50 backends starting up would
    // otherwise compete with every run (and take most of its time).
    let mut clients = Vec::new();
    for _ in 0..50 {
        clients.push(leasehold_pg::connect(&pg.url()).await?);
    }
    for run in 0..5 {
        let account = format!("spend:{run}");
        open_account(&setup, &account, 100).await?;
        let keys = FencedKeys::for_resource(&account)?;
        let start = Arc::new(tokio::sync::Barrier::new(50));
        let mut tasks = Vec::new();
        for mut db in clients.drain(..) {
            let (locker, keys, account, start) =
                (locker.clone(), keys.clone(), account.clone(), start.clone());
            tasks.push(tokio::spawn(async move {
                start.wait().await;
                let opts = AcquireOptions::new().wait(HUNG);
                let lease = locker
                    .acquire_with(&keys, Duration::from_millis(1), &opts)
                    .await?;
                // Refused and insufficient both roll back.
                guarded_debit(&mut db, &lease, &account, 10).await?;
                let _ = lease.release().await;
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(db)
            }));
        }
        for task in tasks {
            let db = tokio::time::timeout(HUNG, task)
                .await?
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?;
            clients.push(db);
        }
        let payments: i64 = setup
            .query_one(
                "SELECT count(*) FROM payments WHERE account = $1",
                &[&account],
            )
            .await?
            .get(0);
        let left = balance(&setup, &account).await?;
        assert_eq!(left, 100 - 10 * payments, "run {run}: a debit was lost");
        assert!(left >= 0, "run {run}");
        // How many of the 50 get through (10 on a quiet machine) depends on
        // how many were refused as stale, which grows with load.
        assert!(
            (1..=10).contains(&payments),
            "run {run}: {payments} payments"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_in_opposite_directions_are_guarded_without_deadlock() -> TestResult {
    let pg = server()?;
    let setup = db(&pg).await?;
    open_account(&setup, "x", 1_000).await?;
    open_account(&setup, "y", 1_000).await?;
    let redis = RedisServer::start()?;
    let client = leasehold::redis::Client::open(redis.url())?;
    let locker = Locker::connect(&client).await?;
    let mut tasks = Vec::new();
    for (from, to) in [("x", "y"), ("y", "x")] {
        let (locker, url) = (locker.clone(), pg.url());
        tasks.push(tokio::spawn(async move {
            let mut db = leasehold_pg::connect(&url).await?;
            let keys = [
                FencedKeys::for_resource(&format!("account:{from}"))?,
                FencedKeys::for_resource(&format!("account:{to}"))?,
            ];
            let opts = AcquireOptions::new().wait(HUNG);
            for _ in 0..20 {
                let lease = locker.acquire_all(&keys, 10 * SECOND, &opts).await?;
                let tx = db.transaction().await?;
                if leasehold_pg::guard(&tx, &lease).await?.is_accepted() {
                    tx.execute(
                        "UPDATE accounts SET balance = balance - 1 WHERE name = $1",
                        &[&from],
                    )
                    .await?;
                    tx.execute(
                        "UPDATE accounts SET balance = balance + 1 WHERE name = $1",
                        &[&to],
                    )
                    .await?;
                    tx.commit().await?;
                }
                lease.release().await?;
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    for task in tasks {
        tokio::time::timeout(HUNG, task)
            .await?
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
    }
    let total = balance(&setup, "x").await? + balance(&setup, "y").await?;
    assert_eq!(total, 2_000);
    Ok(())
}

#[tokio::test]
async fn a_lease_without_a_fence_cannot_be_guarded() -> TestResult {
    let pg = server()?;
    let mut db = db(&pg).await?;
    let redis = RedisServer::start()?;
    let client = leasehold::redis::Client::open(redis.url())?;
    let locker = Locker::connect(&client).await?;
    let lease = locker.acquire("plain:lock", SECOND).await?;
    let tx = db.transaction().await?;
    let err = leasehold_pg::guard(&tx, &lease).await.err();
    assert!(matches!(err, Some(Error::NotFenced)), "{err:?}");
    tx.rollback().await?;
    let mut conn = leasehold_testkit::connection(&client, SECOND).await?;
    let _: () = conn.del("plain:lock").await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_to_a_replica_that_missed_increments_costs_no_refused_write() -> TestResult {
    let pg = server()?;
    let mut db = db(&pg).await?;
    open_account(&db, "failover", 1_000).await?;
    let keys = FencedKeys::for_resource("account:failover")?;
    let primary =
        RedisServer::start_with(RedisOptions::default().args(["--repl-diskless-sync-delay", "0"]))?;
    let replica = RedisServer::start_with(
        RedisOptions::default().replica_of(primary.host(), primary.port()),
    )?;
    let on_primary = Locker::connect(&leasehold::redis::Client::open(primary.url())?).await?;
    let mut debit = async |locker: &Locker, n: u32| {
        let mut refused = 0;
        for _ in 0..n {
            let lease = take(locker, &keys).await?;
            match guarded_debit(&mut db, &lease, "failover", 1).await {
                Ok(Some(Guard::Accepted)) => {}
                Ok(Some(Guard::Refused { healed, .. })) => {
                    assert!(healed, "refused without raising the counter");
                    refused += 1;
                }
                other => return Err(format!("{other:?}").into()),
            }
            let _ = lease.release().await;
        }
        Ok::<u32, Box<dyn std::error::Error>>(refused)
    };
    assert_eq!(debit(&on_primary, 10).await?, 0);
    // The replica catches up, then its link breaks: it misses what follows.
    let mut conn =
        leasehold_testkit::connection(&leasehold::redis::Client::open(primary.url())?, SECOND)
            .await?;
    let acked: u64 = leasehold::redis::cmd("WAIT")
        .arg(1)
        .arg(8000)
        .query_async(&mut conn)
        .await?;
    assert_eq!(acked, 1, "the replica never synced:\n{}", replica.log());
    replica.redis_cli(&["REPLICAOF", "NO", "ONE"])?;
    assert_eq!(debit(&on_primary, 10).await?, 0);
    // Failover: the promoted replica's counter is 10 increments behind.
    let on_replica = Locker::connect(&leasehold::redis::Client::open(replica.url())?).await?;
    let refused = debit(&on_replica, 20).await?;
    // None: the stale counter's next token comes from the server's clock,
    // above the 10 it missed (it was 1 refusal, healed, before).
    assert_eq!(refused, 0, "refused writes after the failover");
    assert_eq!(
        balance(&db, "failover").await?,
        1_000 - 40 + i64::from(refused)
    );
    Ok(())
}

/// Where the resource's row version lies and which transaction wrote it:
/// a new version moves one or the other.
async fn row_version(
    db: &Client,
    resource: &str,
) -> Result<(String, String), Box<dyn std::error::Error>> {
    let row = db
        .query_one(
            "SELECT ctid::text, xmin::text FROM leasehold_fences WHERE resource = $1",
            &[&resource],
        )
        .await?;
    Ok((row.get(0), row.get(1)))
}

/// Guards `resource` with `n` from `holder` in a transaction of its own,
/// committed.
async fn guard_once(
    db: &mut Client,
    resource: &str,
    n: u64,
    holder: &HolderId,
) -> Result<Guard, Error> {
    let tx = db.transaction().await?;
    let guard = leasehold_pg::guard_token(&tx, resource, FencingToken::new(n), holder).await?;
    tx.commit().await?;
    Ok(guard)
}

/// A second connection, and its server process's id.
async fn other_session(pg: &PostgresServer) -> Result<(Client, i32), Box<dyn std::error::Error>> {
    let other = leasehold_pg::connect(&pg.url()).await?;
    let pid = other
        .query_one("SELECT pg_backend_pid()", &[])
        .await?
        .get(0);
    Ok((other, pid))
}

/// Waits until the server process `pid` is blocked on a lock (bounded by
/// [`HUNG`]: a hang detector).
async fn until_waiting(db: &Client, pid: i32) -> TestResult {
    let deadline = tokio::time::Instant::now() + HUNG;
    loop {
        let waiting: bool = db
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_stat_activity
                  WHERE pid = $1 AND wait_event_type = 'Lock')",
                &[&pid],
            )
            .await?
            .get(0);
        if waiting {
            return Ok(());
        }
        assert!(tokio::time::Instant::now() < deadline, "{pid} never waited");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_token_its_holder_already_wrote_locks_the_row_without_rewriting_it() -> TestResult {
    let pg = server()?;
    let mut db = db(&pg).await?;
    let resource = "t:guard:term";
    let (a, b) = holders()?;
    assert!(guard_once(&mut db, resource, 7, &a).await?.is_accepted());
    let written = row_version(&db, resource).await?;
    // A term: the same token from the same holder, transaction after
    // transaction, each asking the database: no new row version.
    for _ in 0..3 {
        assert!(guard_once(&mut db, resource, 7, &a).await?.is_accepted());
    }
    assert_eq!(row_version(&db, resource).await?, written);
    // The row is locked all the same: a second transaction of the term
    // waits for the first.
    let tx = db.transaction().await?;
    let first = leasehold_pg::guard_token(&tx, resource, FencingToken::new(7), &a).await?;
    assert!(first.is_accepted());
    let (mut other, pid) = other_session(&pg).await?;
    let holder = a;
    let second = tokio::spawn(async move { guard_once(&mut other, resource, 7, &holder).await });
    let watcher = leasehold_pg::connect(&pg.url()).await?;
    until_waiting(&watcher, pid).await?;
    assert!(!second.is_finished());
    tx.commit().await?;
    let second = tokio::time::timeout(HUNG, second)
        .await??
        .map_err(|e| e.to_string())?;
    assert!(second.is_accepted(), "{second:?}");
    assert_eq!(row_version(&db, resource).await?, written);
    // The same token from another holder: refused, nothing written.
    let refused = guard_once(&mut db, resource, 7, &b).await?;
    assert!(
        matches!(&refused, Guard::Refused { current, writer: Some(w), .. }
            if current.get() == 7 && w.as_str() == a.as_str()),
        "{refused:?}"
    );
    assert_eq!(row_version(&db, resource).await?, written);
    // A newer token writes a new version.
    assert!(guard_once(&mut db, resource, 8, &b).await?.is_accepted());
    assert_ne!(row_version(&db, resource).await?, written);
    assert_eq!(fence_of(&db, resource).await?, Some(8));
    Ok(())
}

#[tokio::test]
async fn a_guard_that_waited_judges_the_row_its_rival_committed_not_its_snapshot() -> TestResult {
    let pg = server()?;
    let mut db = db(&pg).await?;
    let watcher = leasehold_pg::connect(&pg.url()).await?;
    let (a, b) = holders()?;
    let c = HolderId::parse("cccccccccccccccccccccccccccccccc").ok_or("holder c")?;
    // (waiting holder, its token, what the rival wrote first, whether the
    // waiting one is accepted)
    let cases = [
        // b wrote 5; c raises to 6 while b's equal token waits: b must be
        // refused, although the row b's statement started from was its own.
        ("t:guard:wait:equal", &b, 5, Some((5, &b)), (6, &c), false),
        // The first write of a resource, two holders of one token: the
        // second is refused (the equal-token hole), its own holder is not.
        ("t:guard:wait:insert", &b, 9, None, (9, &a), false),
        ("t:guard:wait:insert-same", &a, 9, None, (9, &a), true),
        // A newer token waits for an older one, and raises the row.
        ("t:guard:wait:newer", &b, 12, Some((10, &a)), (11, &c), true),
    ];
    for (resource, waiter, token, before, (rival_token, rival), accepted) in cases {
        if let Some((n, holder)) = before {
            assert!(
                guard_once(&mut db, resource, n, holder)
                    .await?
                    .is_accepted()
            );
        }
        let tx = db.transaction().await?;
        let first =
            leasehold_pg::guard_token(&tx, resource, FencingToken::new(rival_token), rival).await?;
        assert!(first.is_accepted(), "{resource}: {first:?}");
        let (mut other, pid) = other_session(&pg).await?;
        let holder = *waiter;
        let waiting =
            tokio::spawn(async move { guard_once(&mut other, resource, token, &holder).await });
        until_waiting(&watcher, pid).await?;
        tx.commit().await?;
        let found = tokio::time::timeout(HUNG, waiting)
            .await??
            .map_err(|e| e.to_string())?;
        assert_eq!(found.is_accepted(), accepted, "{resource}: {found:?}");
        if let Guard::Refused {
            current, writer, ..
        } = &found
        {
            assert_eq!(current.get(), rival_token, "{resource}");
            assert_eq!(writer.as_deref(), Some(rival.as_str()), "{resource}");
        }
        let expected = if accepted { token } else { rival_token };
        assert_eq!(
            fence_of(&db, resource).await?,
            Some(i64::try_from(expected)?),
            "{resource}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn a_guard_pipelined_with_the_first_read_makes_no_round_trip_of_its_own() -> TestResult {
    let pg = server()?;
    drop(db(&pg).await?);
    let proxy = leasehold_testkit::FaultProxy::start(pg.addr())?;
    let url = pg
        .url()
        .replace(&format!(":{}/", pg.port()), &format!(":{}/", proxy.port()));
    let mut db = leasehold_pg::connect(&url).await?;
    open_account(&db, "rt", 100).await?;
    let (a, _) = holders()?;
    let read = db
        .prepare("SELECT balance FROM accounts WHERE name = $1")
        .await?;
    let update = db
        .prepare("UPDATE accounts SET balance = $2 WHERE name = $1")
        .await?;
    let mut trips = Vec::new();
    // Unguarded; guarded with a first token (a new row, then a raised
    // row); guarded with the token the row holds (a term).
    for token in [None, Some(3), Some(4), Some(4)] {
        let before = proxy.round_trips();
        let tx = db.transaction().await?;
        let balance: i64 = match token {
            None => tx.query_one(&read, &[&"rt"]).await?.get(0),
            Some(n) => {
                let (guard, row) = tokio::try_join!(
                    leasehold_pg::guard_token(&tx, "rt", FencingToken::new(n), &a),
                    async { Ok::<_, Error>(tx.query_one(&read, &[&"rt"]).await?) },
                )?;
                assert!(guard.is_accepted(), "{guard:?}");
                row.get(0)
            }
        };
        tx.execute(&update, &[&"rt", &(balance - 1)]).await?;
        tx.commit().await?;
        trips.push(proxy.round_trips() - before);
    }
    // BEGIN, the read (with the guard), the update, COMMIT.
    assert_eq!(trips, [4, 4, 4, 4]);
    assert_eq!(balance(&db, "rt").await?, 96);
    Ok(())
}
