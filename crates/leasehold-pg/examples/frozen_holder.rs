//! How long a holder frozen inside its guarded transaction stalls the
//! next holder (issue 37, point 2; target: the next holder's first commit
//! within TTL + 1 s of the freeze, in every run, on both drivers).
//!
//! Each run, on a throwaway PostgreSQL and Redis: holder A takes a lease
//! (TTL `--ttl`, 2 s by default) on a runtime nothing drives afterwards, so
//! its watchdog never refreshes it, as under `SIGSTOP`; A runs `guarded`,
//! writes after the guard, and then freezes between two statements (the
//! transaction open, the guard's row locked, nothing sent). Holder B takes
//! the lock once A's lease has run out and commits with `guarded`. Printed:
//! the time from A's freeze to B's commit, per run and per driver.
//!
//! ```text
//! cargo run -p leasehold-pg --example frozen_holder -- [runs] [ttl_ms]
//! ```
//!
//! A measurement, not a test: it asserts nothing about time.

use std::time::{Duration, Instant};

use leasehold::{AcquireOptions, FencedKeys, Lease, Locker};
use leasehold_pg::{Error, Guarded};
use leasehold_testkit::{PostgresServer, RedisServer};
use sqlx::{Connection, PgConnection};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// How long B may wait for the lock: a hang detector.
const WAIT: Duration = Duration::from_secs(60);

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let runs: u32 = args.next().map_or(Ok(10), |a| a.parse())?;
    let ttl = Duration::from_millis(args.next().map_or(Ok(2000), |a| a.parse())?);
    let pg = PostgresServer::start()?;
    let redis = RedisServer::start()?;
    let mut setup = leasehold_pg::connect(&pg.url()).await?;
    leasehold_pg::setup(&mut setup).await?;
    setup
        .batch_execute("CREATE TABLE frozen (id int PRIMARY KEY, n bigint NOT NULL)")
        .await?;
    let locker = Locker::connect(&leasehold::redis::Client::open(redis.url())?).await?;
    for driver in ["tokio-postgres", "sqlx"] {
        let mut stalls = Vec::new();
        for run in 0..runs {
            let keys = FencedKeys::for_resource(&format!("frozen:{driver}:{run}"))?;
            let id = i32::try_from(run)? + if driver == "sqlx" { 10_000 } else { 0 };
            setup
                .execute("INSERT INTO frozen VALUES ($1, 0)", &[&id])
                .await?;
            let (frozen, runtime) = frozen_lease(redis.url(), keys.clone(), ttl)?;
            let stall = match driver {
                "sqlx" => sqlx_run(&pg, &locker, &keys, &frozen, ttl, id).await?,
                _ => tokio_postgres_run(&pg, &locker, &keys, &frozen, ttl, id).await?,
            };
            drop(frozen);
            runtime.shutdown_background();
            println!(
                "{driver} run {run}: next commit {} ms after the freeze (ttl {} ms)",
                stall.as_millis(),
                ttl.as_millis()
            );
            stalls.push(stall);
        }
        stalls.sort();
        let ms = |d: &Duration| d.as_millis();
        println!(
            "{driver}: {} runs, freeze to next commit min {} ms, median {} ms, max {} ms; ttl + 1 s = {} ms",
            stalls.len(),
            stalls.first().map_or(0, ms),
            stalls.get(stalls.len() / 2).map_or(0, ms),
            stalls.last().map_or(0, ms),
            (ttl + Duration::from_secs(1)).as_millis()
        );
    }
    Ok(())
}

/// One run on tokio-postgres: A's freeze to B's commit.
async fn tokio_postgres_run(
    pg: &PostgresServer,
    locker: &Locker,
    keys: &FencedKeys,
    frozen: &Lease,
    ttl: Duration,
    id: i32,
) -> Result<Duration> {
    let mut a = leasehold_pg::connect(&pg.url()).await?;
    let mut b = leasehold_pg::connect(&pg.url()).await?;
    let (froze_tx, froze_rx) = tokio::sync::oneshot::channel();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let bump = "UPDATE frozen SET n = n + 1 WHERE id = $1";
    let holder_a = leasehold_pg::guarded(&mut a, frozen, async |tx| {
        tx.execute(bump, &[&id]).await?;
        let _ = froze_tx.send(Instant::now());
        let _ = done_rx.await; // frozen: nothing sent
        Ok::<_, Error>(())
    });
    let holder_b = async {
        let froze = froze_rx.await?;
        let opts = AcquireOptions::new().wait(WAIT);
        let lease = locker.acquire_with(keys, ttl, &opts).await?;
        let done = leasehold_pg::guarded(&mut b, &lease, async |tx| {
            tx.execute(bump, &[&id]).await?;
            Ok::<_, Error>(())
        })
        .await?;
        let stall = froze.elapsed();
        let _ = done_tx.send(());
        let _ = lease.release().await;
        if done != Guarded::Committed(()) {
            return Err(format!("the next holder did not commit: {done:?}").into());
        }
        Ok::<_, Box<dyn std::error::Error>>(stall)
    };
    let (_, stall) = tokio::join!(holder_a, holder_b);
    stall
}

/// One run on sqlx: A's freeze to B's commit.
async fn sqlx_run(
    pg: &PostgresServer,
    locker: &Locker,
    keys: &FencedKeys,
    frozen: &Lease,
    ttl: Duration,
    id: i32,
) -> Result<Duration> {
    let mut a = PgConnection::connect(&pg.url()).await?;
    let mut b = PgConnection::connect(&pg.url()).await?;
    let (froze_tx, froze_rx) = tokio::sync::oneshot::channel();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let bump = "UPDATE frozen SET n = n + 1 WHERE id = $1";
    let holder_a = leasehold_pg::sqlx::guarded(&mut a, frozen, async |tx: &mut PgConnection| {
        sqlx::query(bump).bind(id).execute(&mut *tx).await?;
        let _ = froze_tx.send(Instant::now());
        let _ = done_rx.await; // frozen: nothing sent
        Ok::<_, Error>(())
    });
    let holder_b = async {
        let froze = froze_rx.await?;
        let opts = AcquireOptions::new().wait(WAIT);
        let lease = locker.acquire_with(keys, ttl, &opts).await?;
        let done = leasehold_pg::sqlx::guarded(&mut b, &lease, async |tx: &mut PgConnection| {
            sqlx::query(bump).bind(id).execute(&mut *tx).await?;
            Ok::<_, Error>(())
        })
        .await?;
        let stall = froze.elapsed();
        let _ = done_tx.send(());
        let _ = lease.release().await;
        if done != Guarded::Committed(()) {
            return Err(format!("the next holder did not commit: {done:?}").into());
        }
        Ok::<_, Box<dyn std::error::Error>>(stall)
    };
    let (_, stall) = tokio::join!(holder_a, holder_b);
    stall
}

/// A lease taken on a runtime of its own that nothing drives afterwards:
/// its watchdog never runs again, and the lock runs out after `ttl` (as
/// the tests' `frozen_lease`). Shut the runtime down at the end.
fn frozen_lease(
    redis_url: String,
    keys: FencedKeys,
    ttl: Duration,
) -> Result<(Lease, tokio::runtime::Runtime)> {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let lease = runtime.block_on(async {
            let client = leasehold::redis::Client::open(redis_url).map_err(|e| e.to_string())?;
            let locker = Locker::connect(&client).await.map_err(|e| e.to_string())?;
            locker.acquire(&keys, ttl).await.map_err(|e| e.to_string())
        })?;
        Ok::<_, String>((lease, runtime))
    })
    .join()
    .map_err(|_| "the frozen holder's thread panicked")?
    .map_err(Into::into)
}
