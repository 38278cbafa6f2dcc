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
        let db = crate::env::pg_connection(&pool).await?;
        leasehold_pg::reset_wallet(&**db, WALLET_ID, spend.initial).await?;
    }
    let keys = FencedKeys::for_resource(RESOURCE)?;
    if mode == WriteMode::Guard {
        let db = crate::env::pg_connection(&pool).await?;
        db.execute(
            "DELETE FROM leasehold_fences WHERE resource = $1",
            &[&keys.fence()],
        )
        .await
        .map_err(leasehold_pg::Error::from)
        .context("resetting the wallet's fence guard")?;
    }
    // Every spender's connection open before the run starts (the sessions
    // the last run's guard ended are gone from the pool): the run counts
    // what its spenders meet, not the pool's cold start (no more than the
    // pool holds: one more would wait for ever). A connection that cannot
    // be opened here fails the run, with the server's words.
    let callers = usize::try_from(spend.callers).unwrap_or(usize::MAX);
    let warm = futures_util::future::try_join_all(
        (0..callers.min(pool.status().max_size)).map(|_| crate::env::pg_connection(&pool)),
    )
    .await
    .context("opening the spenders' connections")?;
    drop(warm);
    let mut conn = env.redis.clone();
    let () = conn
        .del(&[keys.lock(), keys.fence()])
        .await
        .context("clearing the lock and fence keys")?;

    let rejected = Arc::new(AtomicU64::new(0));
    let ended = Arc::new(AtomicU64::new(0));
    let (amount, work, ttl) = (spend.amount, spend.work, args.ttl);
    let opts = AcquireOptions::new().wait(args.wait);
    let (locker, refused, cut_off) = (env.locker.clone(), rejected.clone(), ended.clone());
    let start = Instant::now();
    let holds = HoldTimes::default();
    let recorder = holds.clone();
    let tally = hammer(spend.callers, move |_| {
        let (locker, opts, keys, pool) = (locker.clone(), opts.clone(), keys.clone(), pool.clone());
        let (refused, cut_off, holds) = (refused.clone(), cut_off.clone(), recorder.clone());
        async move {
            let lease = if mode.uses_redis_lock() {
                Some(locker.acquire_with(&keys, ttl, &opts).await?)
            } else {
                None
            };
            let fence = lease.as_ref().and_then(leasehold::Lease::fence);
            let mut db = crate::env::pg_connection(&pool).await?;
            let client: &mut leasehold_pg::tokio_postgres::Client = &mut db;
            let debit = match (mode, fence) {
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
                    Debit::Decided(outcome)
                }
                (WriteMode::Single, _) => Debit::Decided(
                    leasehold_pg::debit_conditional(&*client, WALLET_ID, amount).await?,
                ),
                (WriteMode::None, _) => {
                    let read = leasehold_pg::read_wallet(&*client, WALLET_ID).await?;
                    if read.balance() < amount {
                        return Ok(false);
                    }
                    tokio::time::sleep(work).await;
                    let balance = ledger::debit_unchecked(&*client, &read, amount, None).await?;
                    Debit::Decided(Outcome::Applied { balance })
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
                    Debit::Decided(outcome)
                }
                (WriteMode::Fenced | WriteMode::Guard | WriteMode::Cas, None) => {
                    anyhow::bail!("a fenced lease came back without a fence")
                }
            };
            release(lease, &holds).await;
            let outcome = match debit {
                Debit::Decided(outcome) => outcome,
                // Nothing committed: counted apart, not as an error.
                Debit::Ended => {
                    cut_off.fetch_add(1, Ordering::Relaxed);
                    return Ok(false);
                }
            };
            if ledger::refused(&outcome) {
                refused.fetch_add(1, Ordering::Relaxed);
            }
            Ok(outcome.is_applied())
        }
    })
    .await;
    let elapsed = start.elapsed();
    holds.check(ttl);

    let db = crate::env::pg_connection(database.postgres().await?).await?;
    let audit = leasehold_pg::audit(&**db, WALLET_ID).await?;
    let rejected = rejected.load(Ordering::Relaxed);
    let ended = ended.load(Ordering::Relaxed);
    let report = ledger::check(
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
    );
    Ok(if mode == WriteMode::Guard {
        report
            .after(format!(
                "sessions ended before their commit={ended} (nothing committed)"
            ))
            .extra("ended", ended)
    } else {
        report
    })
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

/// What one spender's write came to: the database's outcome, or a
/// session that ended before its `COMMIT` was sent.
enum Debit {
    /// The database decided: applied, refused, or not enough money.
    Decided(Outcome),
    /// The session ended before the transaction could commit (guard mode):
    /// the server ended it (`SessionEnded`), or the connection was found
    /// closed before the `COMMIT` went out. Nothing was written, and the
    /// spender knows it, so the balance and ledger checks stay exact: it
    /// is counted as `ended`, not as an error. At a 1 ms lease it is what
    /// the guard's idle bound is for: a spender stalled between two
    /// statements for over a second (its lease long expired) is cut off
    /// by the database, which frees the guard's row for the next one. A
    /// `COMMIT` sent and then met by a failure stays an error (its outcome
    /// is unknown), as does every other failure.
    Ended,
}

/// A plain read-modify-write of the wallet inside the fence guard: the
/// guard first, then the read, the work and the write, in one transaction.
async fn guarded_debit(
    client: &mut leasehold_pg::tokio_postgres::Client,
    lease: &leasehold::Lease,
    amount: i64,
    work: std::time::Duration,
) -> anyhow::Result<Debit> {
    let tx = client
        .transaction()
        .await
        .map_err(leasehold_pg::Error::from)?;
    let written = async {
        if let leasehold_pg::Guard::Refused { current, .. } =
            leasehold_pg::guard(&tx, lease).await?
        {
            return Ok(Err(Outcome::StaleToken {
                fence: i64::try_from(current.get()).unwrap_or(i64::MAX),
            }));
        }
        let read = leasehold_pg::read_wallet(&tx, WALLET_ID).await?;
        if read.balance() < amount {
            return Ok(Err(Outcome::InsufficientFunds {
                balance: read.balance(),
            }));
        }
        tokio::time::sleep(work).await;
        let balance = ledger::debit_unchecked(&tx, &read, amount, None).await?;
        anyhow::Ok(Ok(balance))
    }
    .await;
    let balance = match written {
        Ok(Ok(balance)) => balance,
        Ok(Err(outcome)) => {
            // Decided by the database; the rollback only tidies up, and a
            // session that ended meanwhile (the refusal healed the Redis
            // counter, a round trip while the transaction is open) rolled
            // back with it.
            if let Err(err) = tx.rollback().await.map_err(leasehold_pg::Error::from)
                && !matches!(err, leasehold_pg::Error::SessionEnded(_))
                && !client.is_closed()
            {
                return Err(err.into());
            }
            return Ok(Debit::Decided(outcome));
        }
        // No COMMIT was sent: an ended session wrote nothing.
        Err(err) if tx.client().is_closed() || session_ended(&err) => return Ok(Debit::Ended),
        Err(err) => return Err(err),
    };
    // Closed already: the COMMIT below cannot be sent.
    let closed = tx.client().is_closed();
    match tx.commit().await.map_err(leasehold_pg::Error::from) {
        Ok(()) => Ok(Debit::Decided(Outcome::Applied { balance })),
        Err(_) if closed => Ok(Debit::Ended),
        // The server's answer to the COMMIT was that it had ended the
        // session for idling (25P03, 57P05): the COMMIT never ran. A
        // termination (57P01, ...) can land after a commit: an error.
        Err(err @ leasehold_pg::Error::SessionEnded(_)) if ended_idle(&err) => Ok(Debit::Ended),
        Err(err) => Err(err.into()),
    }
}

/// Whether `err` (before any `COMMIT`) is the server ending the session.
fn session_ended(err: &anyhow::Error) -> bool {
    matches!(
        err.downcast_ref::<leasehold_pg::Error>(),
        Some(leasehold_pg::Error::SessionEnded(_))
    )
}

/// Whether a session the server ended was ended for idling, which never
/// interrupts a statement: `25P03` (idle in transaction) or `57P05`.
fn ended_idle(err: &leasehold_pg::Error) -> bool {
    matches!(err, leasehold_pg::Error::SessionEnded(source)
        if matches!(source.code(), Some("25P03" | "57P05")))
}
