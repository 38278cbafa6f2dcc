//! `bench pg`'s baseline: PostgreSQL's own advisory lock, taken exactly as
//! sqlx's [`PgAdvisoryLock`] takes it (it is sqlx's, not a copy):
//! `SELECT pg_advisory_lock($1)` on a connection held by the caller, which
//! waits in the server's lock manager until the lock is granted (no
//! polling, no notification: the server wakes the next waiter itself),
//! and `SELECT pg_advisory_unlock($1)` on the same connection; the key is
//! sqlx's 64-bit hash of the lock key's name. A caller gives up after
//! the tutorial's wait (`lock_timeout`), as the other ways' callers do. No lease: the lock lives as
//! long as the session, so it has no TTL, no token and no watchdog, and
//! every caller holds a connection of its own for as long as it holds or
//! waits for the lock (a pool's connection, in an application).
//!
//! It is no [`Lessor`](leasehold::Lessor), so its loops are written here,
//! the same as the other ways' (the uncontended tasks of
//! [`lessor_tasks`](crate::bench::uncontended::lessor_tasks) and the tutorial
//! of [`contention::tutorial`]): the
//! same keys, the same wallet in Redis, the same meter. Its connections
//! are opened before the clock starts, as a warm pool's would be.

use std::str::FromStr as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use hdrhistogram::Histogram;
use leasehold::RedisConnection;
use sqlx::Connection as _;
use sqlx::postgres::{PgAdvisoryLock, PgConnectOptions, PgConnection};
use tokio::sync::{Barrier, Mutex};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::bench::contention::{self, Crowd, Figures};
use crate::bench::site::Site;
use crate::bench::uncontended::{Keys, Pairs};
use crate::waiting::{Meter, clear_on};
use crate::wallet::{Wallet, hammer};

/// `lock_not_available`: `lock_timeout` ran out while waiting.
const LOCK_NOT_AVAILABLE: &str = "55P03";

/// The advisory lock on one database.
pub(crate) struct Advisory {
    url: String,
    /// How long a caller waits for the lock before giving up.
    wait: Duration,
}

impl Advisory {
    /// The advisory lock on the database at `url`, whose callers wait at
    /// most `wait`.
    pub(crate) fn new(url: &str, wait: Duration) -> Advisory {
        Advisory {
            url: url.to_owned(),
            wait,
        }
    }

    /// A caller's own connection; a wait for the lock longer than the
    /// lock's `wait` ends with `lock_not_available` (`lock_timeout` bounds
    /// advisory lock waits too).
    /// Set at the connection's start (no statement of its own, so the
    /// statements counted per lease are the lock's alone).
    async fn connection(&self) -> anyhow::Result<PgConnection> {
        let options = PgConnectOptions::from_str(&self.url)?
            .options([("lock_timeout", self.wait.as_millis().to_string())]);
        PgConnection::connect_with(&options)
            .await
            .context("connecting to the throwaway postgres")
    }

    /// `n` callers' connections.
    async fn connections(&self, n: u32) -> anyhow::Result<Vec<PgConnection>> {
        let mut conns = Vec::with_capacity(usize::try_from(n)?);
        for _ in 0..n {
            conns.push(self.connection().await?);
        }
        Ok(conns)
    }

    /// As [`lessor_tasks`](crate::bench::uncontended::lessor_tasks) with
    /// latencies: `tasks` tasks, each on a
    /// connection of its own, taking and releasing the key of `keys` for
    /// its number for `duration`.
    pub(crate) async fn tasks(
        &self,
        keys: &Keys,
        tasks: u32,
        duration: Duration,
    ) -> anyhow::Result<Pairs> {
        let conns = self.connections(tasks).await?;
        let start = Instant::now();
        let mut set = tokio::task::JoinSet::new();
        for (task, mut conn) in (0..).zip(conns) {
            let lock = PgAdvisoryLock::new(keys.key(task));
            set.spawn(async move {
                let mut times = Histogram::<u64>::new(3)?;
                let mut pairs: u64 = 0;
                while start.elapsed() < duration {
                    let began = Instant::now();
                    lock.acquire(&mut conn).await?.release_now().await?;
                    let us = u64::try_from(began.elapsed().as_micros()).unwrap_or(u64::MAX);
                    times.record(us.max(1))?;
                    pairs += 1;
                }
                Ok::<_, anyhow::Error>((pairs, times, conn))
            });
        }
        let mut total: u64 = 0;
        let mut all = Histogram::<u64>::new(3)?;
        let mut conns = Vec::new();
        while let Some(joined) = set.join_next().await {
            let (pairs, times, conn) = joined??;
            total += pairs;
            all.add(times)?;
            conns.push(conn);
        }
        let elapsed = start.elapsed();
        close(conns).await;
        Ok(Pairs {
            count: total,
            per_s: total as f64 / elapsed.as_secs_f64(),
            latency: Some(all),
        })
    }

    /// As [`contention::tutorial`]: the crowd's callers, each on a
    /// connection of its own, take the lock on `site.key` once and spend
    /// 10 from the wallet in `site`'s Redis while holding it.
    pub(crate) async fn tutorial<C: RedisConnection>(
        &self,
        site: &Site<C>,
        crowd: &Crowd,
    ) -> anyhow::Result<Figures> {
        clear_on(&site.conn, site.key).await?;
        let wallet = Wallet::new(site.conn.clone());
        wallet.reset(crowd.initial).await?;
        let conns: Arc<Vec<Mutex<PgConnection>>> = Arc::new(
            self.connections(crowd.callers)
                .await?
                .into_iter()
                .map(Mutex::new)
                .collect(),
        );
        let lock = Arc::new(PgAdvisoryLock::new(site.key));
        let meter = Meter::new()?;
        let (requests, gave_up) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let start = Instant::now();
        let (c, l, m, r, g, w, work) = (
            conns.clone(),
            lock,
            meter.clone(),
            requests.clone(),
            gave_up.clone(),
            wallet.clone(),
            crowd.work,
        );
        let tally = hammer(crowd.callers, move |caller| {
            let (conns, lock, meter, requests, gave_up, wallet) = (
                c.clone(),
                l.clone(),
                m.clone(),
                r.clone(),
                g.clone(),
                w.clone(),
            );
            async move {
                let mut conn = conns[caller as usize].lock().await;
                requests.fetch_add(1, Ordering::Relaxed);
                let guard = match lock.acquire(&mut *conn).await {
                    Ok(guard) => guard,
                    Err(sqlx::Error::Database(err))
                        if err.code().as_deref() == Some(LOCK_NOT_AVAILABLE) =>
                    {
                        gave_up.fetch_add(1, Ordering::Relaxed);
                        return Ok(false);
                    }
                    Err(err) => return Err(err.into()),
                };
                let since = meter.acquired();
                let done = wallet.spend(10, work).await;
                meter.releasing(since);
                requests.fetch_add(1, Ordering::Relaxed);
                guard.release_now().await?;
                done
            }
        })
        .await;
        let elapsed = start.elapsed();
        contention::fail_on_errors(&tally)?;
        let balance = wallet.balance().await?;
        let spent = i64::try_from(tally.accepted).unwrap_or(i64::MAX) * 10;
        anyhow::ensure!(
            balance == crowd.initial - spent && balance >= 0,
            "balance {balance} after {} payments from {}",
            tally.accepted,
            crowd.initial
        );
        let conns = Arc::try_unwrap(conns)
            .ok()
            .context("a caller's connection outlived the run")?;
        close(conns.into_iter().map(Mutex::into_inner).collect()).await;
        Ok(Figures::metered(
            &meter,
            elapsed,
            requests.load(Ordering::Relaxed),
            gave_up.load(Ordering::Relaxed),
        ))
    }
}

impl Advisory {
    /// As [`contention::timed_with`]: the crowd's callers, each on a
    /// connection of its own, take the lock on `site.key` again and again
    /// (holding it for the crowd's work) for `duration`; the end stops
    /// whoever waits. With the timed run's fairness (the most leases one
    /// caller got over the fewest).
    pub(crate) async fn timed<C: RedisConnection>(
        &self,
        site: &Site<C>,
        crowd: &Crowd,
        duration: Duration,
    ) -> anyhow::Result<Figures> {
        let conns = self.connections(crowd.callers).await?;
        let lock = Arc::new(PgAdvisoryLock::new(site.key));
        let meter = Meter::new()?;
        let (requests, gave_up) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let stop = CancellationToken::new();
        let barrier = Arc::new(Barrier::new(conns.len() + 1));
        let mut tasks = tokio::task::JoinSet::new();
        for mut conn in conns {
            let (lock, meter, requests, gave_up, stop, barrier) = (
                lock.clone(),
                meter.clone(),
                requests.clone(),
                gave_up.clone(),
                stop.clone(),
                barrier.clone(),
            );
            let work = crowd.work;
            tasks.spawn(async move {
                barrier.wait().await;
                let mut mine: u64 = 0;
                while !stop.is_cancelled() {
                    requests.fetch_add(1, Ordering::Relaxed);
                    let guard = tokio::select! {
                        // Stopped while it waited: its connection is left
                        // mid-request, so it is dropped (the server ends
                        // the session and its lock).
                        () = stop.cancelled() => return Ok((mine, None)),
                        taken = lock.acquire(&mut conn) => taken,
                    };
                    let guard = match guard {
                        Ok(guard) => guard,
                        Err(sqlx::Error::Database(err))
                            if err.code().as_deref() == Some(LOCK_NOT_AVAILABLE) =>
                        {
                            gave_up.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        Err(err) => return Err(anyhow::Error::from(err)),
                    };
                    let since = meter.acquired();
                    tokio::time::sleep(work).await;
                    meter.releasing(since);
                    requests.fetch_add(1, Ordering::Relaxed);
                    guard.release_now().await?;
                    mine += 1;
                }
                Ok((mine, Some(conn)))
            });
        }
        barrier.wait().await;
        let start = Instant::now();
        tokio::time::sleep(duration).await;
        stop.cancel();
        let (mut counts, mut conns) = (Vec::new(), Vec::new());
        while let Some(joined) = tasks.join_next().await {
            let (mine, conn) = joined??;
            counts.push(mine);
            conns.extend(conn);
        }
        let elapsed = start.elapsed();
        close(conns).await;
        Ok(Figures::metered(
            &meter,
            elapsed,
            requests.load(Ordering::Relaxed),
            gave_up.load(Ordering::Relaxed),
        )
        .with_fairness(contention::fairness(&counts)))
    }
}

/// Closes `conns` (best effort: the server ends a session whose client
/// went away in any case), so their backends are gone before the next
/// reading of the database's counters.
async fn close(conns: Vec<PgConnection>) {
    for conn in conns {
        let _ = conn.close().await;
    }
}
