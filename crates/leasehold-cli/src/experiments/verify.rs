//! Step 6: the whole path under load, with the lease deliberately broken,
//! checked against the balance and the ledger.

use leasehold::Lessor;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context;
use leasehold::{AcquireOptions, Error, FencedKeys};
use leasehold_pg::Outcome;
use redis::AsyncCommands;
use tokio::time::Instant;

use crate::cli::{VerifyArgs, WriteMode};
use crate::env::{Database, Env};
use crate::holds::HoldTimes;
use crate::ledger::{self, RESOURCE, WALLET_ID, WriteCheck};
use crate::report::Report;
use crate::wallet::hammer;

pub(crate) async fn run(
    env: &Env,
    database: &Database,
    args: &VerifyArgs,
) -> anyhow::Result<Report> {
    let mode = args.mode()?;
    let spend = &args.spend;
    let pool = database.postgres().await?.clone();
    {
        let db = pool.get().await.context("connecting to postgresql")?;
        leasehold_pg::reset_wallet(&**db, WALLET_ID, spend.initial).await?;
    }
    let keys = FencedKeys::for_resource(RESOURCE)?;
    if mode == WriteMode::Guard {
        let db = pool.get().await.context("connecting to postgresql")?;
        db.execute(
            "DELETE FROM leasehold_fences WHERE resource = $1",
            &[&keys.fence()],
        )
        .await
        .map_err(leasehold_pg::Error::from)
        .context("resetting the wallet's fence guard")?;
    }
    let mut conn = env.redis.clone();
    let () = conn
        .del(&[keys.lock(), keys.fence()])
        .await
        .context("clearing the lock and fence keys")?;

    let rejected = Arc::new(AtomicU64::new(0));
    let (amount, work, ttl) = (spend.amount, spend.work, args.ttl);
    let opts = AcquireOptions::new().wait(args.wait);
    let (locker, refused) = (env.locker.clone(), rejected.clone());
    let start = Instant::now();
    let holds = HoldTimes::default();
    let recorder = holds.clone();
    let tally = hammer(spend.callers, move |_| {
        let (locker, opts, keys, pool) = (locker.clone(), opts.clone(), keys.clone(), pool.clone());
        let (refused, holds) = (refused.clone(), recorder.clone());
        async move {
            let lease = if mode.uses_redis_lock() {
                Some(locker.acquire_with(&keys, ttl, &opts).await?)
            } else {
                None
            };
            let fence = lease.as_ref().and_then(leasehold::Lease::fence);
            let mut db = pool.get().await.context("connecting to postgresql")?;
            let client: &mut leasehold_pg::tokio_postgres::Client = &mut db;
            let outcome = match (mode, fence) {
                (WriteMode::ForUpdate, _) => {
                    let tx = client
                        .transaction()
                        .await
                        .map_err(leasehold_pg::Error::from)?;
                    let locked = leasehold_pg::lock_for_update(&tx, WALLET_ID).await?;
                    if locked.snapshot().balance() >= amount {
                        tokio::time::sleep(work).await;
                    }
                    let outcome = locked.debit(amount).await?;
                    tx.commit().await.map_err(leasehold_pg::Error::from)?;
                    outcome
                }
                (WriteMode::Single, _) => {
                    leasehold_pg::debit_conditional(&*client, WALLET_ID, amount).await?
                }
                (WriteMode::None, _) => {
                    let read = leasehold_pg::read_wallet(&*client, WALLET_ID).await?;
                    if read.balance() < amount {
                        return Ok(false);
                    }
                    tokio::time::sleep(work).await;
                    let balance = ledger::debit_unchecked(&*client, &read, amount, None).await?;
                    Outcome::Applied { balance }
                }
                (WriteMode::Guard, Some(_)) => {
                    let lease = lease.as_ref().context("guard mode takes a lease")?;
                    guarded_debit(client, lease, amount, work).await?
                }
                (WriteMode::Fenced | WriteMode::Cas, Some(token)) => {
                    let check = if mode == WriteMode::Cas {
                        WriteCheck::CheckAndSet
                    } else {
                        WriteCheck::Fenced
                    };
                    let written =
                        ledger::read_and_debit(&*client, amount, work, token, check).await?;
                    let Some(outcome) = written else {
                        release(lease, &holds).await;
                        return Ok(false);
                    };
                    outcome
                }
                (WriteMode::Fenced | WriteMode::Guard | WriteMode::Cas, None) => {
                    anyhow::bail!("a fenced lease came back without a fence")
                }
            };
            release(lease, &holds).await;
            if ledger::refused(&outcome) {
                refused.fetch_add(1, Ordering::Relaxed);
            }
            Ok(outcome.is_applied())
        }
    })
    .await;
    let elapsed = start.elapsed();
    holds.check(ttl);

    let db = database
        .postgres()
        .await?
        .get()
        .await
        .context("connecting to postgresql")?;
    let audit = leasehold_pg::audit(&**db, WALLET_ID).await?;
    let rejected = rejected.load(Ordering::Relaxed);
    Ok(ledger::check(
        "verify",
        spend.initial,
        spend.amount,
        tally.accepted,
        &audit,
        elapsed,
    )
    .errors(&tally)
    .after(format!("writes rejected by the database={rejected}"))
    .extra("rejected", rejected)
    .extra("mode", mode.name())
    .extra("redis_lock", mode.uses_redis_lock())
    .extra(
        "ttl_ms",
        u64::try_from(args.ttl.as_millis()).unwrap_or(u64::MAX),
    ))
}

/// Gives the lease back; a lease that already expired (the point of a 1 ms
/// TTL) is expected, anything else is logged.
async fn release(lease: Option<leasehold::Lease>, holds: &HoldTimes) {
    if let Some(lease) = lease {
        holds.record(&lease);
        match lease.release().await {
            Ok(()) | Err(Error::NotHeld { .. }) => {}
            Err(err) => tracing::warn!(error = %err, "release failed"),
        }
    }
}

/// A plain read-modify-write of the wallet inside the fence guard: the
/// guard first, then the read, the work and the write, in one transaction.
async fn guarded_debit(
    client: &mut leasehold_pg::tokio_postgres::Client,
    lease: &leasehold::Lease,
    amount: i64,
    work: std::time::Duration,
) -> anyhow::Result<Outcome> {
    let tx = client
        .transaction()
        .await
        .map_err(leasehold_pg::Error::from)?;
    if let leasehold_pg::Guard::Refused { current, .. } = leasehold_pg::guard(&tx, lease).await? {
        tx.rollback().await.map_err(leasehold_pg::Error::from)?;
        return Ok(Outcome::StaleToken {
            fence: i64::try_from(current.get()).unwrap_or(i64::MAX),
        });
    }
    let read = leasehold_pg::read_wallet(&tx, WALLET_ID).await?;
    if read.balance() < amount {
        tx.rollback().await.map_err(leasehold_pg::Error::from)?;
        return Ok(Outcome::InsufficientFunds {
            balance: read.balance(),
        });
    }
    tokio::time::sleep(work).await;
    let balance = ledger::debit_unchecked(&tx, &read, amount, None).await?;
    tx.commit().await.map_err(leasehold_pg::Error::from)?;
    Ok(Outcome::Applied { balance })
}
