//! Step 4: how callers wait. Fifty callers on `lock:wallet:42` with
//! exponential backoff retry in lockstep (a thundering herd); full jitter
//! spreads them out; hand-off mode queues them and wakes one per release.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use leasehold::{AcquireOptions, Error};
use tokio::time::Instant;

use crate::cli::BackoffArgs;
use crate::env::Env;
use crate::experiments::lock::LOCK_KEY;
use crate::report::{Report, round_ms};
use crate::server;
use crate::waiting::{Handoff, Meter, Mode, Waiter, clear, exponential, utilisation};
use crate::wallet::{Wallet, hammer};

pub(crate) async fn run(env: &Env, args: &BackoffArgs) -> anyhow::Result<Report> {
    let wallet = Wallet::new(env.redis.clone());
    wallet.reset(args.lock.spend.initial).await?;
    clear(env, LOCK_KEY).await?;
    let mode = if args.handoff {
        Mode::Handoff("hand-off", Handoff::DEFAULT)
    } else {
        Mode::Poll("backoff", exponential(args.min, args.max, args.jitter))
    };
    let waiter = Waiter::connect(env, mode).await?;
    let meter = Meter::new()?;
    let gave_up = Arc::new(AtomicU64::new(0));
    let cpu_before = server::cpu(&env.redis).await?;

    let start = Instant::now();
    let (amount, work, ttl, wait) = (
        args.lock.spend.amount,
        args.lock.spend.work,
        args.lock.ttl,
        args.lock.wait,
    );
    let (spender, w, m, g) = (
        wallet.clone(),
        waiter.clone(),
        meter.clone(),
        gave_up.clone(),
    );
    let tally = hammer(args.lock.spend.callers, move |caller| {
        let (wallet, waiter, meter, gave_up) = (spender.clone(), w.clone(), m.clone(), g.clone());
        async move {
            let lease = match waiter
                .acquire(
                    caller as usize,
                    LOCK_KEY,
                    ttl,
                    AcquireOptions::new().wait(wait),
                )
                .await
            {
                Ok(lease) => lease,
                Err(Error::NotAcquired { .. }) => {
                    gave_up.fetch_add(1, Ordering::Relaxed);
                    return Ok(false);
                }
                Err(err) => return Err(err.into()),
            };
            let since = meter.acquired();
            let spent = wallet.spend(amount, work).await;
            meter.releasing(since);
            match lease.release().await {
                Ok(()) | Err(Error::NotHeld { .. }) => {}
                Err(err) => tracing::warn!(error = %err, "release failed"),
            }
            spent
        }
    })
    .await;
    let elapsed = start.elapsed();
    let cpu = server::cpu_since(&env.redis, cpu_before).await?;
    let balance = wallet.balance().await?;
    // A Redis way of waiting: its locker counts.
    let stats = waiter.stats().unwrap_or_default();
    let gave_up = gave_up.load(Ordering::Relaxed);
    Ok(Report::check(
        "backoff",
        args.lock.spend.initial,
        args.lock.spend.amount,
        tally.accepted,
        balance,
        elapsed,
    )
    .errors(&tally)
    .headline(format!("gave up={gave_up}"))
    .extra(
        "mode",
        if args.handoff {
            "hand-off"
        } else if args.jitter {
            "full jitter"
        } else {
            "exponential"
        },
    )
    .extra("gave_up", gave_up)
    .extra("acquisitions", stats.acquisitions)
    .extra("round_trips", stats.requests())
    .extra("redis_cpu_ms", cpu.map(server::ms))
    .extra(
        "utilisation",
        (utilisation(meter.held(), elapsed) * 1000.0).round() / 1000.0,
    )
    .extra(
        "held_ms",
        u64::try_from(round_ms(meter.held()).as_millis()).unwrap_or(u64::MAX),
    ))
}
