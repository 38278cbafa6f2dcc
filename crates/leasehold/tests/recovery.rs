//! Measures how soon locking works again after Redis restarts under a
//! long-lived locker, and how soon a queued hand-off waiter is served.
//! Timing is printed, not asserted (it is a measurement; see
//! BENCHMARKS.md):
//!
//! ```sh
//! cargo test --release -p leasehold --test deployments -- recovery:: --ignored --nocapture
//! ```
#![cfg(feature = "handoff")]

use leasehold::Lessor;
use std::time::Duration;

use leasehold::{AcquireOptions, HandoffLocker, Locker, RetryStrategy};
use leasehold_testkit::RedisServer;
use tokio::time::Instant;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const HUNG: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run with --ignored --nocapture"]
async fn measure_recovery_after_a_redis_restart() -> TestResult {
    let mut server = RedisServer::start()?;
    let client = redis::Client::open(server.url())?;
    let locker = Locker::connect(&client).await?;
    let once = AcquireOptions::new()
        .retry(RetryStrategy::none())
        .wait(Duration::from_secs(1));
    for round in 0..5 {
        locker
            .acquire("m:k", Duration::from_secs(1))
            .await?
            .release()
            .await?;
        server.restart()?;
        let back = Instant::now();
        let mut failures = 0;
        tokio::time::timeout(HUNG, async {
            loop {
                match locker
                    .acquire_with("m:k", Duration::from_secs(1), &once)
                    .await
                {
                    Ok(lease) => return lease.release().await,
                    Err(_) => failures += 1,
                }
            }
        })
        .await??;
        println!(
            "polling, round {round}: works again {:?} after the server is back ({failures} failed request)",
            back.elapsed()
        );
    }
    for round in 0..5 {
        let a = HandoffLocker::builder()
            .relay_limit(0)
            .connect(&client)
            .await?;
        let b = HandoffLocker::builder()
            .relay_limit(0)
            .connect(&client)
            .await?;
        let ttl = Duration::from_secs(10);
        let held = a.acquire("m:h", ttl).await?;
        let waiter = tokio::spawn(async move {
            let opts = AcquireOptions::new().wait(HUNG);
            b.acquire_with("m:h", ttl, &opts).await
        });
        while server.redis_cli(&["ZCARD", "m:h:waitq"])? != "1" {
            tokio::task::yield_now().await;
        }
        server.restart()?;
        let back = Instant::now();
        let lease = tokio::time::timeout(HUNG, waiter).await???;
        println!(
            "hand-off, round {round}: queued waiter served {:?} after the server is back (ttl {ttl:?})",
            back.elapsed()
        );
        lease.release().await?;
        drop(held);
    }
    Ok(())
}
