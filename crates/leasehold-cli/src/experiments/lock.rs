//! Step 2: the same spenders, each inside a lease on `lock:wallet:42`.

use anyhow::Context;
use leasehold::Lessor;
use leasehold::{AcquireOptions, Error};
use redis::AsyncCommands;
use tokio::time::Instant;

use crate::cli::LockArgs;
use crate::env::Env;
use crate::holds::HoldTimes;
use crate::report::Report;
use crate::wallet::{Wallet, hammer};

/// The tutorial's lock key for Steps 2 to 4.
pub(crate) const LOCK_KEY: &str = "lock:wallet:42";

pub(crate) async fn run(env: &Env, args: &LockArgs) -> anyhow::Result<Report> {
    let wallet = Wallet::new(env.redis.clone());
    wallet.reset(args.spend.initial).await?;
    let mut conn = env.redis.clone();
    let () = conn.del(LOCK_KEY).await.context("clearing the lock key")?;

    let start = Instant::now();
    let (amount, work, ttl) = (args.spend.amount, args.spend.work, args.ttl);
    let opts = AcquireOptions::new().wait(args.wait);
    let (locker, spender) = (env.locker.clone(), wallet.clone());
    let holds = HoldTimes::default();
    let recorder = holds.clone();
    let tally = hammer(args.spend.callers, move |_| {
        let (locker, wallet, opts) = (locker.clone(), spender.clone(), opts.clone());
        let holds = recorder.clone();
        async move {
            let lease = locker.acquire_with(LOCK_KEY, ttl, &opts).await?;
            let spent = wallet.spend(amount, work).await;
            holds.record(&lease);
            match lease.release().await {
                Ok(()) | Err(Error::NotHeld { .. }) => {}
                Err(err) => tracing::warn!(error = %err, "release failed"),
            }
            spent
        }
    })
    .await;
    let elapsed = start.elapsed();
    holds.check(ttl);
    let balance = wallet.balance().await?;
    // GET, not EXISTS: a lock user's minimal ACL has GET.
    let left: Option<String> = conn.get(LOCK_KEY).await.context("checking the lock key")?;
    let left = left.is_some();
    Ok(Report::check(
        "lock",
        args.spend.initial,
        args.spend.amount,
        tally.accepted,
        balance,
        elapsed,
    )
    .errors(&tally)
    .extra("lock_key_left", left)
    .require(!left))
}
