//! How long a holder frozen inside its guarded transaction stalls the
//! next holder (issue 37, point 2; target: the next holder's first commit
//! within TTL + 1 s of the freeze, in every run, on both drivers).
//!
//! Each run, on a throwaway PostgreSQL and Redis: holder A takes a lease
//! (TTL `ttl_ms`, 2 s by default) on a runtime nothing drives afterwards,
//! so its watchdog never refreshes it, as under `SIGSTOP`; A runs
//! `guarded`, writes after the guard, and then freezes:
//!
//! - **between** two statements: the transaction open, the guard's row
//!   locked, nothing sent (the guard's idle bound ends it);
//! - **mid**-statement: A's connection goes through a `FaultProxy`, which
//!   stops reading the server's answer to a 64 MB query, so the backend
//!   blocks writing it (no timeout ends that; A and B both guard with
//!   `take_over_after(take_over_ms)`, 500 ms by default).
//!
//! Holder B takes the lock once A's lease has run out and commits with
//! `guarded`. Printed: the time from A's freeze to B's commit, per run,
//! per freeze and per driver.
//!
//! ```text
//! cargo run -p leasehold-pg --example frozen_holder -- [runs] [ttl_ms] [take_over_ms]
//! ```
//!
//! A measurement, not a test: it asserts nothing about time.

use std::time::{Duration, Instant};

use leasehold::{AcquireOptions, FencedKeys, Lease, Lessor, Locker};
use leasehold_pg::{Error, GuardOptions, Guarded};
use leasehold_testkit::{Direction, FaultProxy, PostgresServer, RedisServer};
use sqlx::{Connection, Executor, PgConnection};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// How long B may wait for the lock: a hang detector.
const WAIT: Duration = Duration::from_secs(60);

/// A's last statement when it freezes mid-statement: 64 MB of answer,
/// sent as a simple query (nothing to wait for before it runs).
const BIG: &str = "SELECT repeat('x', 1048576) FROM generate_series(1, 64)";

const BUMP: &str = "UPDATE frozen SET n = n + 1 WHERE id = $1";

/// One run's setting.
struct Run<'a> {
    pg: &'a PostgresServer,
    locker: &'a Locker,
    keys: FencedKeys,
    ttl: Duration,
    id: i32,
    /// `None`: frozen between statements, default options; `Some`: frozen
    /// mid-statement, both holders with these options.
    mid: Option<GuardOptions>,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let runs: u32 = args.next().map_or(Ok(10), |a| a.parse())?;
    let ttl = Duration::from_millis(args.next().map_or(Ok(2000), |a| a.parse())?);
    let take_over = Duration::from_millis(args.next().map_or(Ok(500), |a| a.parse())?);
    let pg = PostgresServer::start()?;
    let redis = RedisServer::start()?;
    let mut setup = leasehold_pg::connect(&pg.url()).await?;
    leasehold_pg::setup(&mut setup).await?;
    setup
        .batch_execute("CREATE TABLE frozen (id int PRIMARY KEY, n bigint NOT NULL)")
        .await?;
    let locker = Locker::connect(&leasehold::redis::Client::open(redis.url())?).await?;
    let mut id = 0;
    for freeze in ["between", "mid"] {
        for driver in ["tokio-postgres", "sqlx"] {
            let mut stalls = Vec::new();
            for n in 0..runs {
                id += 1;
                let keys = FencedKeys::for_resource(&format!("frozen:{id}"))?;
                setup
                    .execute("INSERT INTO frozen VALUES ($1, 0)", &[&id])
                    .await?;
                let mid = (freeze == "mid").then(|| GuardOptions::new().take_over_after(take_over));
                let run = Run {
                    pg: &pg,
                    locker: &locker,
                    keys: keys.clone(),
                    ttl,
                    id,
                    mid,
                };
                let (frozen, runtime) = frozen_lease(redis.url(), keys, ttl)?;
                let stall = match driver {
                    "sqlx" => sqlx_run(&run, &frozen).await,
                    _ => tokio_postgres_run(&run, &frozen).await,
                };
                drop(frozen);
                runtime.shutdown_background();
                let stall = stall?;
                println!(
                    "{freeze} {driver} run {n}: next commit {} ms after the freeze",
                    stall.as_millis()
                );
                stalls.push(stall);
            }
            stalls.sort();
            let ms = |d: &Duration| d.as_millis();
            println!(
                "{freeze} {driver}: {} runs, ttl {} ms{}, freeze to next commit min {} ms, median {} ms, max {} ms; ttl + 1 s = {} ms",
                stalls.len(),
                ttl.as_millis(),
                if freeze == "mid" {
                    format!(", take-over after {} ms", take_over.as_millis())
                } else {
                    String::new()
                },
                stalls.first().map_or(0, ms),
                stalls.get(stalls.len() / 2).map_or(0, ms),
                stalls.last().map_or(0, ms),
                (ttl + Duration::from_secs(1)).as_millis()
            );
        }
    }
    Ok(())
}

/// A's connection URL: through a proxy that freezes its answers when
/// frozen mid-statement.
fn url_for_a(run: &Run<'_>) -> Result<(String, Option<FaultProxy>)> {
    if run.mid.is_none() {
        return Ok((run.pg.url(), None));
    }
    let proxy = FaultProxy::start(run.pg.addr())?;
    let url = run
        .pg
        .url()
        .replace(&run.pg.port().to_string(), &proxy.port().to_string());
    Ok((url, Some(proxy)))
}

/// One run on tokio-postgres: A's freeze to B's commit.
async fn tokio_postgres_run(run: &Run<'_>, frozen: &Lease) -> Result<Duration> {
    let (url, proxy) = url_for_a(run)?;
    let mut a = leasehold_pg::connect(&url).await?;
    let mut b = leasehold_pg::connect(&run.pg.url()).await?;
    let (froze_tx, froze_rx) = tokio::sync::oneshot::channel();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let options = run.mid.clone().unwrap_or_default();
    let id = run.id;
    let holder_a = leasehold_pg::guarded_with_options(&mut a, frozen, &options, async |tx| {
        tx.execute(BUMP, &[&id]).await?;
        match &proxy {
            Some(proxy) => {
                proxy.freeze(Direction::Downstream, true);
                let _ = froze_tx.send(Instant::now());
                tx.simple_query(BIG).await?;
            }
            None => {
                let _ = froze_tx.send(Instant::now());
                let _ = done_rx.await; // frozen: nothing sent
            }
        }
        Ok::<_, Error>(())
    });
    let holder_b = async {
        let froze = froze_rx.await?;
        let opts = AcquireOptions::new().wait(WAIT);
        let lease = run.locker.acquire_with(&run.keys, run.ttl, &opts).await?;
        let done = leasehold_pg::guarded_with_options(&mut b, &lease, &options, async |tx| {
            tx.execute(BUMP, &[&id]).await?;
            Ok::<_, Error>(())
        })
        .await?;
        let stall = froze.elapsed();
        let _ = done_tx.send(());
        if let Some(proxy) = &proxy {
            proxy.freeze(Direction::Downstream, false);
        }
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
async fn sqlx_run(run: &Run<'_>, frozen: &Lease) -> Result<Duration> {
    let (url, proxy) = url_for_a(run)?;
    let mut a = PgConnection::connect(&url).await?;
    let mut b = PgConnection::connect(&run.pg.url()).await?;
    let (froze_tx, froze_rx) = tokio::sync::oneshot::channel();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let options = run.mid.clone().unwrap_or_default();
    let id = run.id;
    let holder_a = leasehold_pg::sqlx::guarded_with_options(
        &mut a,
        frozen,
        &options,
        async |tx: &mut PgConnection| {
            sqlx::query(BUMP).bind(id).execute(&mut *tx).await?;
            match &proxy {
                Some(proxy) => {
                    proxy.freeze(Direction::Downstream, true);
                    let _ = froze_tx.send(Instant::now());
                    tx.execute(BIG).await?;
                }
                None => {
                    let _ = froze_tx.send(Instant::now());
                    let _ = done_rx.await; // frozen: nothing sent
                }
            }
            Ok::<_, Error>(())
        },
    );
    let holder_b = async {
        let froze = froze_rx.await?;
        let opts = AcquireOptions::new().wait(WAIT);
        let lease = run.locker.acquire_with(&run.keys, run.ttl, &opts).await?;
        let done = leasehold_pg::sqlx::guarded_with_options(
            &mut b,
            &lease,
            &options,
            async |tx: &mut PgConnection| {
                sqlx::query(BUMP).bind(id).execute(&mut *tx).await?;
                Ok::<_, Error>(())
            },
        )
        .await?;
        let stall = froze.elapsed();
        let _ = done_tx.send(());
        if let Some(proxy) = &proxy {
            proxy.freeze(Direction::Downstream, false);
        }
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
