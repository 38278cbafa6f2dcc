//! The recommended path: a fenced lease, the work under its watchdog,
//! the fence guard first in the work's own transaction.

use std::time::Duration;

use leasehold::{AcquireOptions, FencedKeys, Lessor, Locker};
use leasehold_pg::tokio_postgres::Client;

/// What one debit came to: the database decided it.
#[derive(Debug, PartialEq)]
pub enum Debit {
    /// Committed: this is the new balance.
    Done(i64),
    /// Not enough money; nothing written.
    Declined,
    /// Nothing written, retry: the fence guard refused (a holder with a
    /// newer fencing token, or another holder of ours, has written: our
    /// lease failed us), or the lease was lost before the commit.
    Refused,
}

/// Debits `amount` from account `name`, once, even when the lock fails,
/// with any way of taking the lease (here a `Locker`; an `EtcdLocker` too).
pub async fn debit(
    locker: &impl Lessor,
    db: &mut Client,
    name: &str,
    amount: i64,
) -> Result<Debit, Box<dyn std::error::Error>> {
    // `lock:{account:NAME}` and its fence counter `fence:{account:NAME}`.
    let keys = FencedKeys::for_resource(&format!("account:{name}"))?;
    let opts = AcquireOptions::new().wait(Duration::from_secs(5));
    let done = locker
        .with_lock(&keys, Duration::from_secs(2), &opts, async |lease| {
            // BEGIN, the fence guard first, the work, COMMIT (never cut by
            // the watchdog, so we always learn whether it landed).
            leasehold_pg::guarded(db, lease, async |tx| {
                let row = tx
                    .query_one("SELECT balance FROM accounts WHERE name = $1", &[&name])
                    .await?;
                let balance: i64 = row.get(0);
                if balance < amount {
                    return Ok(Debit::Declined);
                }
                let left = balance - amount;
                tx.execute(
                    "UPDATE accounts SET balance = $2 WHERE name = $1",
                    &[&name, &left],
                )
                .await?;
                Ok::<_, leasehold_pg::Error>(Debit::Done(left))
            })
            .await
        })
        .await?;
    if let Err(err) = &done.release {
        // The work ran to its end, but the lease was no longer (provably)
        // ours when we gave it back. The database's answer still stands.
        eprintln!("release: {err}");
    }
    Ok(done.output?.committed().unwrap_or(Debit::Refused))
}

/// One debit against your Redis and PostgreSQL: the table, then the debit.
pub async fn run(redis_url: &str, database_url: &str) -> Result<Debit, Box<dyn std::error::Error>> {
    let locker = Locker::connect(&leasehold::client(redis_url)?).await?;
    let mut db = leasehold_pg::connect(database_url).await?;
    leasehold_pg::setup(&mut db).await?; // the fence table and its function, nothing else
    db.batch_execute(
        "CREATE TABLE IF NOT EXISTS accounts (name text PRIMARY KEY, balance bigint NOT NULL);
         INSERT INTO accounts VALUES ('alice', 100) ON CONFLICT DO NOTHING",
    )
    .await?;
    debit(&locker, &mut db, "alice", 30).await
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let redis_url = std::env::var("REDIS_URL").unwrap_or("redis://127.0.0.1/".into());
    let database_url = std::env::var("DATABASE_URL").unwrap_or("postgres://127.0.0.1/".into());
    println!("{:?}", run(&redis_url, &database_url).await?);
    Ok(())
}
