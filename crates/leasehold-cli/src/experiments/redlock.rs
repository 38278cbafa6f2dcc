//! Step 6's load test over Redlock: spenders take a quorum lease on 3 or 5
//! independent throwaway redis-servers, one of which is paused or killed
//! mid-run, and debit PostgreSQL with fenced check-and-set writes.

use leasehold::Lessor;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use hdrhistogram::Histogram;
use leasehold::{AcquireOptions, Error, FencedKeys, Quorum};
use leasehold_testkit::RedisServer;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::cli::{Fault, RedlockArgs};
use crate::env::Database;
use crate::ledger::{self, RESOURCE, WALLET_ID, WriteCheck};
use crate::progress::{Progress, Ticker, note};
use crate::report::Report;
use crate::wallet::hammer;

/// The node the fault hits (0-based): not the first, so that a bug that
/// only ever talks to node 0 would not hide it.
const FAULTY_NODE: usize = 1;

/// What the callers counted, shared between their tasks.
#[derive(Default)]
struct Counters {
    acquired: AtomicU64,
    rejected: AtomicU64,
    quorum_not_reached: AtomicU64,
    not_acquired: AtomicU64,
    /// Releases that could not confirm a majority (a node down, or a vote
    /// that timed out): the TTL ends those leases.
    release_failed: AtomicU64,
}

pub(crate) async fn run(db: &Database, args: &RedlockArgs) -> anyhow::Result<Report> {
    let spend = &args.spend;
    let pool = db.postgres().await?.clone();
    {
        let db = crate::env::pg_connection(&pool).await?;
        leasehold_pg::reset_wallet(&**db, WALLET_ID, spend.initial).await?;
    }
    let nodes = args.nodes;
    let mut servers = tokio::task::spawn_blocking(move || RedisServer::start_many(nodes))
        .await
        .context("starting the throwaway redis-servers")?
        .context("starting the throwaway redis-servers")?;
    let listed =
        |f: fn(&RedisServer) -> String| servers.iter().map(f).collect::<Vec<_>>().join(", ");
    note!(
        "leasehold: started {nodes} throwaway redis-servers for the quorum at {} (pids {})",
        listed(|s| format!(":{}", s.port())),
        listed(|s| s.pid().to_string()),
    );
    let clients = servers
        .iter()
        .map(|server| redis::Client::open(server.url()))
        .collect::<Result<Vec<_>, _>>()?;
    let quorum = Quorum::connect(clients).await?;
    let keys = FencedKeys::for_resource(RESOURCE)?;

    let counters = Arc::new(Counters::default());
    let fault_now = Arc::new(Notify::new());
    let finished = CancellationToken::new();
    let progress = Progress::new("redlock", u64::from(spend.callers));
    progress.ticker().message("spenders done");
    let victim = servers.remove(FAULTY_NODE);
    // Aborted if the run is dropped (interrupted), dropping the victim with
    // it: a paused node must not outlive the CLI.
    let fault = AbortOnDropHandle::new(tokio::spawn(inject(
        victim,
        args.fault,
        fault_now.clone(),
        finished.clone(),
        counters.clone(),
        progress.ticker(),
    )));

    let latency = Arc::new(Mutex::new(Histogram::<u64>::new_with_bounds(
        1,
        3_600_000_000,
        3,
    )?));
    let (amount, work, ttl, fault_after) = (spend.amount, spend.work, args.ttl, args.fault_after);
    let opts = AcquireOptions::new().wait(args.wait);
    let (shared, recorded, ticker) = (counters.clone(), latency.clone(), progress.ticker());
    let start = Instant::now();
    let tally = hammer(spend.callers, move |_| {
        let (quorum, keys, opts, pool) = (quorum.clone(), keys.clone(), opts.clone(), pool.clone());
        let (counters, latency, fault_now) = (shared.clone(), recorded.clone(), fault_now.clone());
        let ticker = ticker.clone();
        async move {
            // Counted however the spender ends.
            let _done = Done(ticker);
            let asked = Instant::now();
            let lease = match quorum.acquire_with(&keys, ttl, &opts).await {
                Ok(lease) => lease,
                Err(Error::QuorumNotReached { .. }) => {
                    counters.quorum_not_reached.fetch_add(1, Ordering::Relaxed);
                    return Ok(false);
                }
                Err(Error::NotAcquired { .. }) => {
                    counters.not_acquired.fetch_add(1, Ordering::Relaxed);
                    return Ok(false);
                }
                Err(err) => return Err(err).context("acquiring the quorum lease"),
            };
            let micros = u64::try_from(asked.elapsed().as_micros()).unwrap_or(u64::MAX);
            if let Ok(mut histogram) = latency.lock() {
                histogram.saturating_record(micros.max(1));
            }
            if counters.acquired.fetch_add(1, Ordering::Relaxed) + 1 == fault_after {
                fault_now.notify_one();
            }
            let db = crate::env::pg_connection(&pool).await?;
            let fence = lease.fence().context("a fenced quorum lease has a fence")?;
            let written =
                ledger::read_and_debit(&**db, amount, work, fence, WriteCheck::CheckAndSet).await;
            if lease.release().await.is_err() {
                counters.release_failed.fetch_add(1, Ordering::Relaxed);
            }
            let Some(outcome) = written? else {
                return Ok(false);
            };
            if ledger::refused(&outcome) {
                counters.rejected.fetch_add(1, Ordering::Relaxed);
            }
            Ok(outcome.is_applied())
        }
    })
    .await;
    let elapsed = start.elapsed();
    finished.cancel();
    let (_victim, injected_after) = fault.await.context("the fault task failed")??;
    drop(servers);
    drop(progress);

    let db = pool_audit(db).await?;
    let audit = leasehold_pg::audit(&**db, WALLET_ID).await?;
    let histogram = latency
        .lock()
        .map_err(|_| anyhow::anyhow!("latency histogram poisoned"))?
        .clone();
    let count = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
    let rejected = count(&counters.rejected);
    let (p50, p99, max) = (
        histogram.value_at_quantile(0.5),
        histogram.value_at_quantile(0.99),
        histogram.max(),
    );
    let fault_line = match (args.fault, injected_after) {
        (Fault::None, _) => "fault=none".to_owned(),
        (fault, Some(_)) => format!(
            "fault={} node {FAULTY_NODE} after {fault_after} acquisitions",
            fault.name()
        ),
        (fault, None) => format!(
            "fault={} NOT injected: only {} acquisitions, fewer than {fault_after}",
            fault.name(),
            count(&counters.acquired)
        ),
    };
    let injected = args.fault == Fault::None || injected_after.is_some();
    Ok(ledger::check(
        "redlock",
        spend.initial,
        spend.amount,
        tally.accepted,
        &audit,
        elapsed,
    )
    .errors(&tally)
    .tutorial_also(injected)
    .after(format!("writes rejected by the database={rejected}"))
    .after(format!(
        "acquire p50={} p99={} max={} (n={})",
        millis(p50),
        millis(p99),
        millis(max),
        histogram.len()
    ))
    .after(format!(
        "QuorumNotReached={} NotAcquired={} failed releases={}",
        count(&counters.quorum_not_reached),
        count(&counters.not_acquired),
        count(&counters.release_failed)
    ))
    .after(fault_line)
    .extra("nodes", u64::try_from(args.nodes).unwrap_or(u64::MAX))
    .extra("fault", args.fault.name())
    .extra("fault_injected", injected_after.is_some())
    .extra("fault_after", injected_after.map(|_| fault_after))
    .extra("acquisitions_at_fault", injected_after)
    .extra("rejected", rejected)
    .extra("quorum_not_reached", count(&counters.quorum_not_reached))
    .extra("not_acquired", count(&counters.not_acquired))
    .extra("release_failed", count(&counters.release_failed))
    .extra("acquire_p50_us", p50)
    .extra("acquire_p99_us", p99)
    .extra("acquire_max_us", max)
    .extra(
        "ttl_ms",
        u64::try_from(args.ttl.as_millis()).unwrap_or(u64::MAX),
    ))
}

/// Waits for the signal, then pauses or kills `victim`; gives up without a
/// fault once the run is `finished`. Returns the server (stopped on drop)
/// and how many acquisitions had happened when the fault landed (the
/// signal comes with the `fault_after`-th; a later holder may slip in
/// before the signal is handled).
async fn inject(
    mut victim: RedisServer,
    fault: Fault,
    now: Arc<Notify>,
    finished: CancellationToken,
    counters: Arc<Counters>,
    progress: Ticker,
) -> anyhow::Result<(RedisServer, Option<u64>)> {
    if fault == Fault::None {
        return Ok((victim, None));
    }
    tokio::select! {
        () = now.notified() => {}
        () = finished.cancelled() => return Ok((victim, None)),
    }
    let after = counters.acquired.load(Ordering::Relaxed);
    let victim = tokio::task::spawn_blocking(move || {
        match fault {
            Fault::Pause => victim.pause(),
            Fault::Kill | Fault::None => victim.kill(),
        }
        .map(|()| victim)
    })
    .await
    .context("injecting the fault")??;
    let what = match fault {
        Fault::Pause => "paused",
        Fault::Kill | Fault::None => "killed",
    };
    note!(
        "leasehold: {what} node {FAULTY_NODE} (redis-server pid {}) after {after} acquisitions",
        victim.pid()
    );
    progress.message(format!("spenders done; node {FAULTY_NODE} {what}"));
    Ok((victim, Some(after)))
}

/// Counts a spender as done when dropped, however it ended.
struct Done(Ticker);

impl Drop for Done {
    fn drop(&mut self) {
        self.0.done();
    }
}

async fn pool_audit(db: &Database) -> anyhow::Result<deadpool_postgres::Object> {
    crate::env::pg_connection(db.postgres().await?).await
}

/// Microseconds as milliseconds with one decimal: `1.3ms`.
fn millis(micros: u64) -> String {
    format!("{}.{}ms", micros / 1000, (micros % 1000) / 100)
}
