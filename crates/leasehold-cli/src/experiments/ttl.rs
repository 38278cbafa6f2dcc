//! Step 3: work that outlives the TTL, without and with the watchdog.
//!
//! Each caller takes the lease on `lock:wallet:42`, spends with `--work`
//! between its read and its write, and releases. When the work outlasts the
//! TTL, the lease expires mid-spend and the next caller reads a balance the
//! first has not written yet (BROKEN); every release then finds its lease
//! gone and is refused (`NotHeld`). With `--watchdog` the spend runs inside
//! `Lease::run`: the lease is refreshed every ttl/3, and if it is lost
//! anyway the spend is cancelled before its write (the write itself is
//! shielded: once sent, it lands and is counted).

use leasehold::Lessor;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context;
use leasehold::{AcquireOptions, Error};
use redis::AsyncCommands;
use tokio::time::Instant;

use crate::cli::TtlArgs;
use crate::env::Env;
use crate::experiments::lock::LOCK_KEY;
use crate::holds::HoldTimes;
use crate::report::Report;
use crate::wallet::{Wallet, hammer};

pub(crate) async fn run(env: &Env, args: &TtlArgs) -> anyhow::Result<Report> {
    let wallet = Wallet::new(env.redis.clone());
    wallet.reset(args.initial).await?;
    let mut conn = env.redis.clone();
    let () = conn.del(LOCK_KEY).await.context("clearing the lock key")?;

    let stale = Arc::new(AtomicU64::new(0));
    let lost = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let (amount, work, ttl, watchdog) = (args.amount, args.work, args.ttl, args.watchdog);
    let opts = AcquireOptions::new().wait(args.wait);
    let (locker, spender) = (env.locker.clone(), wallet.clone());
    let (stale_count, lost_count) = (stale.clone(), lost.clone());
    let holds = HoldTimes::default();
    let recorder = holds.clone();
    let tally = hammer(args.callers, move |_| {
        let (locker, wallet, opts) = (locker.clone(), spender.clone(), opts.clone());
        let (stale, lost) = (stale_count.clone(), lost_count.clone());
        let holds = recorder.clone();
        async move {
            let lease = locker.acquire_with(LOCK_KEY, ttl, &opts).await?;
            let spent = if watchdog {
                match lease
                    .run(wallet.spend_under(Some(&lease), amount, work))
                    .await
                {
                    Ok(spent) => spent,
                    Err(Error::LeaseLost { .. }) => {
                        lost.fetch_add(1, Ordering::Relaxed);
                        Ok(false)
                    }
                    Err(err) => Err(err.into()),
                }
            } else {
                wallet.spend(amount, work).await
            };
            holds.record(&lease);
            match lease.release().await {
                Ok(()) => {}
                Err(Error::NotHeld { .. }) => {
                    stale.fetch_add(1, Ordering::Relaxed);
                }
                Err(err) => tracing::warn!(error = %err, "release failed"),
            }
            spent
        }
    })
    .await;
    let elapsed = start.elapsed();
    holds.check(ttl);
    let balance = wallet.balance().await?;
    Ok(Report::check(
        "ttl",
        args.initial,
        args.amount,
        tally.accepted,
        balance,
        elapsed,
    )
    .errors(&tally)
    .extra_as(
        "stale_releases",
        "refused stale releases",
        stale.load(Ordering::Relaxed),
    )
    .extra("lost", lost.load(Ordering::Relaxed)))
}
