//! `bench contention`: n callers on one key, each way of waiting side by
//! side, three workloads per round:
//!
//! - **burst**: every caller takes the lock once and holds it for `--work`;
//! - **tutorial**: the wallet of Step 4 (`--initial` 100: 10 pay, the rest
//!   are refused), elapsed time only;
//! - **timed**: every caller loops (take, hold `--work`, release) for
//!   `--duration`; fairness is max/min acquisitions per caller.
//!
//! The same on a Redis Cluster ([`site`](super::site)): tuned polling and
//! hand-off (over sharded pub/sub), in the same rounds.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use leasehold::{
    AcquireOptions, CancellationToken, Error, GiveUpReason, HandoffStyle, RedisConnection,
    RetryStrategy,
};
use serde_json::{Map, Value, json};
use tokio::sync::Barrier;
use tokio::time::Instant;

use super::site::{self, Site};
use super::{Measurements, median, round3};
use crate::cli::ContentionArgs;
use crate::env::Env;
use crate::waiting::{Handoff, Meter, Mode, Waiter, clear_on, exponential, utilisation};
use crate::wallet::{Wallet, hammer};

const TTL: Duration = Duration::from_secs(2);
const MS: Duration = Duration::from_millis(1);

/// Polling tuned for speed: waits of at most 10 ms, full jitter.
fn tuned() -> RetryStrategy {
    RetryStrategy::exponential(MS, 10 * MS).with_full_jitter()
}

/// The ways of waiting on one server, in the order they are reported.
pub(crate) fn modes() -> [Mode; 7] {
    [
        Mode::Poll("exponential", exponential(16 * MS, 128 * MS, false)),
        Mode::Poll("jittered", exponential(16 * MS, 128 * MS, true)),
        Mode::Poll("tuned", tuned()),
        Mode::Handoff("hand-off", Handoff::DEFAULT),
        Mode::Handoff(
            "hand-off-2p",
            Handoff {
                lockers: 2,
                ..Handoff::DEFAULT
            },
        ),
        Mode::Handoff(
            "hand-off-fifo",
            Handoff {
                relay_limit: 0,
                ..Handoff::DEFAULT
            },
        ),
        Mode::Handoff(
            "hand-off-wake",
            Handoff {
                style: HandoffStyle::Wake,
                relay_limit: 0,
                ..Handoff::DEFAULT
            },
        ),
    ]
}

/// The ways of waiting on the cluster: polling tuned for speed against
/// hand-off as built by default, over two lockers (hand-overs between
/// them through the key's node and its shard channel) and strict FIFO
/// (every hand-over through them).
pub(crate) fn cluster_modes() -> [Mode; 4] {
    [
        Mode::Poll("cluster-tuned", tuned()),
        Mode::Handoff("cluster-hand-off", Handoff::DEFAULT),
        Mode::Handoff(
            "cluster-hand-off-2p",
            Handoff {
                lockers: 2,
                ..Handoff::DEFAULT
            },
        ),
        Mode::Handoff(
            "cluster-hand-off-fifo",
            Handoff {
                relay_limit: 0,
                ..Handoff::DEFAULT
            },
        ),
    ]
}

/// One workload's figures in one round.
#[derive(Debug, Default, Clone)]
pub(crate) struct Figures {
    pub(crate) elapsed: Duration,
    held: Duration,
    acquisitions: u64,
    /// Lock requests sent, if the way counts them (the Redis ways do).
    requests: Option<u64>,
    /// The server's CPU time, if the user may read `INFO cpu`.
    cpu: Option<Duration>,
    gap_p50: Option<Duration>,
    gap_p99: Option<Duration>,
    gave_up: u64,
    fairness: Option<f64>,
}

impl Figures {
    fn per_acquisition(&self, x: f64) -> f64 {
        if self.acquisitions == 0 {
            return f64::NAN;
        }
        x / self.acquisitions as f64
    }

    /// The figures of a run that `meter` timed, by a way with no
    /// [`Waiter`] (`bench pg`'s advisory lock) that sent `requests` lock
    /// requests.
    pub(crate) fn metered(
        meter: &Meter,
        elapsed: Duration,
        requests: u64,
        gave_up: u64,
    ) -> Figures {
        Figures {
            elapsed,
            held: meter.held(),
            acquisitions: meter.acquisitions(),
            requests: Some(requests),
            cpu: None,
            gap_p50: meter.gap(0.5),
            gap_p99: meter.gap(0.99),
            gave_up,
            fairness: None,
        }
    }

    /// These figures with the timed run's `fairness`.
    pub(crate) fn with_fairness(mut self, fairness: f64) -> Figures {
        self.fairness = Some(fairness);
        self
    }

    pub(crate) fn metrics(&self) -> Vec<(&'static str, f64)> {
        let us = |d: Option<Duration>| d.map_or(f64::NAN, |d| d.as_secs_f64() * 1e6);
        vec![
            ("elapsed_ms", self.elapsed.as_secs_f64() * 1e3),
            ("held_ms", self.held.as_secs_f64() * 1e3),
            ("utilisation", utilisation(self.held, self.elapsed)),
            ("acquisitions", self.acquisitions as f64),
            (
                "round_trips_per_acq",
                self.requests
                    .map_or(f64::NAN, |requests| self.per_acquisition(requests as f64)),
            ),
            (
                "redis_cpu_us_per_acq",
                self.cpu.map_or(f64::NAN, |cpu| {
                    self.per_acquisition(cpu.as_secs_f64() * 1e6)
                }),
            ),
            ("gap_p50_us", us(self.gap_p50)),
            ("gap_p99_us", us(self.gap_p99)),
            ("gave_up", self.gave_up as f64),
            ("fairness", self.fairness.unwrap_or(f64::NAN)),
        ]
    }
}

/// The callers of a workload and what each does with the lock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Crowd {
    /// Concurrent callers on the one key.
    pub(crate) callers: u32,
    /// Time each holds the lock (the tutorial's: between the wallet's read
    /// and its write).
    pub(crate) work: Duration,
    /// The wallet's starting balance in the tutorial workload.
    pub(crate) initial: i64,
    /// How long each waits before giving up.
    pub(crate) wait: Duration,
}

impl Crowd {
    /// How long a caller of a way-by-way bench's tutorial case waits
    /// before giving up: long enough that none does on any way (a give-up
    /// would be counted).
    pub(crate) const CASE_WAIT: Duration = Duration::from_secs(10);

    /// The tutorial case of the way-by-way benches (`bench consensus`,
    /// `bench pg`): `callers` on the wallet's key, each holding the lock
    /// for `work`; the wallet starts at 100 (10 callers pay, the rest are
    /// refused), and each waits [`CASE_WAIT`](Self::CASE_WAIT).
    pub(crate) fn tutorial_case(callers: u32, work: Duration) -> Crowd {
        Crowd {
            callers,
            work,
            initial: 100,
            wait: Self::CASE_WAIT,
        }
    }
}

impl From<&ContentionArgs> for Crowd {
    fn from(args: &ContentionArgs) -> Crowd {
        Crowd {
            callers: args.callers,
            work: args.work,
            initial: args.initial,
            wait: args.wait,
        }
    }
}

const WORKLOADS: [&str; 3] = ["burst", "tutorial", "timed"];

/// One mode's figures: `[workload]` = one `Figures` per round.
type Rounds = [Vec<Figures>; 3];

pub(crate) async fn run(env: &Env, args: &ContentionArgs, json: bool) -> anyhow::Result<()> {
    let node = Site::node(env);
    let cluster = site::cluster(args).await?;
    let modes = modes();
    let cluster_modes = if cluster.is_some() {
        &cluster_modes()[..]
    } else {
        &[]
    };
    let mut results: Vec<Rounds> = vec![Rounds::default(); modes.len() + cluster_modes.len()];
    let len =
        u64::from(args.rounds) * ((modes.len() + cluster_modes.len()) * WORKLOADS.len()) as u64;
    let progress = Measurements::new("bench contention", len, json);
    for round in 1..=args.rounds {
        for (mode, rounds) in modes.iter().zip(&mut results) {
            measure(&node, *mode, args, &progress, round, rounds).await?;
        }
        if let Some(cluster) = &cluster {
            for (mode, rounds) in cluster_modes.iter().zip(&mut results[modes.len()..]) {
                measure(&cluster.site, *mode, args, &progress, round, rounds).await?;
            }
        }
    }

    let mut out = Vec::new();
    for (w, workload) in WORKLOADS.iter().enumerate() {
        for (mode, rounds) in modes.iter().chain(cluster_modes).zip(&results) {
            let rounds = &rounds[w];
            let mut row = Map::new();
            row.insert("workload".into(), json!(workload));
            row.insert("mode".into(), json!(mode.name()));
            let names: Vec<&str> = rounds[0].metrics().iter().map(|(k, _)| *k).collect();
            for (i, name) in names.iter().enumerate() {
                let values: Vec<f64> = rounds.iter().map(|f| f.metrics()[i].1).collect();
                let med = median(&values);
                row.insert(
                    (*name).into(),
                    if med.is_finite() {
                        json!(round3(med))
                    } else if med.is_infinite() {
                        // A caller never got the lock.
                        json!("inf")
                    } else {
                        Value::Null
                    },
                );
            }
            out.push(Value::Object(row));
        }
    }
    if json {
        println!(
            "{}",
            json!({
                "bench": "contention",
                "callers": args.callers,
                "work_ms": args.work.as_secs_f64() * 1e3,
                "rounds": args.rounds,
                "duration_ms": args.duration.as_secs_f64() * 1e3,
                "medians": out,
            })
        );
    } else {
        print_table(args, &out);
    }
    Ok(())
}

/// One round of the three workloads in `mode` on `site`.
async fn measure<C: RedisConnection>(
    site: &Site<C>,
    mode: Mode,
    args: &ContentionArgs,
    progress: &Measurements,
    round: u32,
    rounds: &mut Rounds,
) -> anyhow::Result<()> {
    let name = mode.name();
    let start = |w: &str| progress.start(format!("round {round}/{}: {name}, {w}", args.rounds));
    let failed = |w: &str| format!("round {round}, {w} workload, {name} mode");
    let crowd = Crowd::from(args);
    start("burst");
    rounds[0].push(
        burst(site, &connect(site, mode).await?, &crowd)
            .await
            .with_context(|| failed("burst"))?,
    );
    start("tutorial");
    rounds[1].push(
        tutorial(site, &connect(site, mode).await?, &crowd)
            .await
            .with_context(|| failed("tutorial"))?,
    );
    start("timed");
    rounds[2].push(
        timed(site, mode, args)
            .await
            .with_context(|| failed("timed"))?,
    );
    Ok(())
}

fn print_table(args: &ContentionArgs, rows: &[Value]) {
    println!(
        "bench contention: {} callers, work {:?}, {} rounds (medians), timed run {:?}",
        args.callers, args.work, args.rounds, args.duration
    );
    let cols = [
        ("workload", "workload"),
        ("mode", "mode"),
        ("elapsed_ms", "elapsed ms"),
        ("held_ms", "held ms"),
        ("utilisation", "util"),
        ("round_trips_per_acq", "rt/acq"),
        ("redis_cpu_us_per_acq", "cpu us/acq"),
        ("gap_p50_us", "gap p50 us"),
        ("gap_p99_us", "gap p99 us"),
        ("gave_up", "gave up"),
        ("fairness", "max/min"),
    ];
    super::print_table(&cols, rows);
}

/// Every caller takes the lock once through a fresh `waiter` and holds it
/// for the crowd's work.
async fn burst<C: RedisConnection>(
    site: &Site<C>,
    waiter: &Waiter,
    crowd: &Crowd,
) -> anyhow::Result<Figures> {
    clear_on(&site.conn, site.key).await?;
    let (figures, _accepted) = once_each(site, waiter, crowd, None).await?;
    Ok(figures)
}

/// The tutorial's Step 4 with a fresh `waiter` (so its stats count this
/// run only) for the lock on `site.key`, the wallet in `site`'s Redis:
/// elapsed only matters. `bench etcd` runs it with the lock on etcd.
pub(crate) async fn tutorial<C: RedisConnection>(
    site: &Site<C>,
    waiter: &Waiter,
    crowd: &Crowd,
) -> anyhow::Result<Figures> {
    clear_on(&site.conn, site.key).await?;
    let wallet = Wallet::new(site.conn.clone());
    wallet.reset(crowd.initial).await?;
    let (figures, accepted) = once_each(site, waiter, crowd, Some(wallet.clone())).await?;
    let balance = wallet.balance().await?;
    let spent = i64::try_from(accepted).unwrap_or(i64::MAX) * 10;
    anyhow::ensure!(
        balance == crowd.initial - spent && balance >= 0,
        "balance {balance} after {accepted} payments from {}",
        crowd.initial
    );
    Ok(figures)
}

/// Every caller takes the lock once. While holding it, it spends 10 from
/// `wallet` (the tutorial's work), or with no wallet just works for the
/// crowd's work. Returns the figures and how many calls succeeded.
async fn once_each<C: RedisConnection>(
    site: &Site<C>,
    waiter: &Waiter,
    crowd: &Crowd,
    wallet: Option<Wallet<C>>,
) -> anyhow::Result<(Figures, u64)> {
    let meter = Meter::new()?;
    let gave_up = Arc::new(AtomicU64::new(0));
    let cpu_before = site.cpu().await?;
    let start = Instant::now();
    let (w, m, g, work, wait, key) = (
        waiter.clone(),
        meter.clone(),
        gave_up.clone(),
        crowd.work,
        crowd.wait,
        site.key,
    );
    let tally = hammer(crowd.callers, move |caller| {
        let (waiter, meter, gave_up, wallet) = (w.clone(), m.clone(), g.clone(), wallet.clone());
        async move {
            match waiter
                .acquire(caller as usize, key, TTL, AcquireOptions::new().wait(wait))
                .await
            {
                Ok(lease) => {
                    let since = meter.acquired();
                    let done = match &wallet {
                        Some(wallet) => wallet.spend(10, work).await,
                        None => {
                            tokio::time::sleep(work).await;
                            Ok(true)
                        }
                    };
                    meter.releasing(since);
                    lease.release().await?;
                    done
                }
                Err(Error::NotAcquired { .. }) => {
                    gave_up.fetch_add(1, Ordering::Relaxed);
                    Ok(false)
                }
                Err(err) => Err(err.into()),
            }
        }
    })
    .await;
    let elapsed = start.elapsed();
    let cpu = site.cpu_since(cpu_before).await?;
    fail_on_errors(&tally)?;
    let figures = figures(
        waiter,
        &meter,
        elapsed,
        cpu,
        gave_up.load(Ordering::Relaxed),
        None,
    );
    Ok((figures, tally.accepted))
}

/// Every caller loops for `--duration`; the end cancels whoever waits.
async fn timed<C: RedisConnection>(
    site: &Site<C>,
    mode: Mode,
    args: &ContentionArgs,
) -> anyhow::Result<Figures> {
    let waiter = connect(site, mode).await?;
    timed_with(site, &waiter, &Crowd::from(args), args.duration).await
}

/// The timed workload through `waiter`: every caller of the crowd takes
/// the lock on `site.key` again and again (holding it for the crowd's
/// work) for `duration`; the end cancels whoever waits. Its fairness is
/// the most leases one caller got over the fewest.
pub(crate) async fn timed_with<C: RedisConnection>(
    site: &Site<C>,
    waiter: &Waiter,
    crowd: &Crowd,
    duration: Duration,
) -> anyhow::Result<Figures> {
    clear_on(&site.conn, site.key).await?;
    let meter = Meter::new()?;
    let gave_up = Arc::new(AtomicU64::new(0));
    let stop = CancellationToken::new();
    let n = usize::try_from(crowd.callers)?;
    let barrier = Arc::new(Barrier::new(n + 1));
    let mut tasks = tokio::task::JoinSet::new();
    for caller in 0..n {
        let (waiter, meter, gave_up, stop, barrier) = (
            waiter.clone(),
            meter.clone(),
            gave_up.clone(),
            stop.clone(),
            barrier.clone(),
        );
        let (work, wait, key) = (crowd.work, crowd.wait, site.key);
        tasks.spawn(async move {
            barrier.wait().await;
            let mut mine: u64 = 0;
            while !stop.is_cancelled() {
                let opts = AcquireOptions::new().wait(wait).cancel(stop.clone());
                match waiter.acquire(caller, key, TTL, opts).await {
                    Ok(lease) => {
                        let since = meter.acquired();
                        tokio::time::sleep(work).await;
                        meter.releasing(since);
                        lease.release().await?;
                        mine += 1;
                    }
                    Err(Error::NotAcquired {
                        reason: GiveUpReason::Cancelled,
                        ..
                    }) => break,
                    Err(Error::NotAcquired { .. }) => {
                        gave_up.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(err) => return Err(err),
                }
            }
            Ok::<u64, Error>(mine)
        });
    }
    let cpu_before = site.cpu().await?;
    barrier.wait().await;
    let start = Instant::now();
    tokio::time::sleep(duration).await;
    stop.cancel();
    let mut counts = Vec::with_capacity(n);
    while let Some(joined) = tasks.join_next().await {
        counts.push(joined??);
    }
    let elapsed = start.elapsed();
    let cpu = site.cpu_since(cpu_before).await?;
    Ok(figures(
        waiter,
        &meter,
        elapsed,
        cpu,
        gave_up.load(Ordering::Relaxed),
        Some(fairness(&counts)),
    ))
}

/// The most leases one caller got over the fewest (infinite when one
/// got none).
pub(crate) fn fairness(counts: &[u64]) -> f64 {
    let (max, min) = (
        counts.iter().copied().max().unwrap_or(0),
        counts.iter().copied().min().unwrap_or(0),
    );
    if min == 0 {
        f64::INFINITY
    } else {
        max as f64 / min as f64
    }
}

/// A fresh way of waiting on `site`, so its stats count this run only.
async fn connect<C: RedisConnection>(site: &Site<C>, mode: Mode) -> anyhow::Result<Waiter> {
    Waiter::connect_to(
        site.conn.clone(),
        &site.subscriber,
        site.command_timeout,
        mode,
    )
    .await
}

fn figures(
    waiter: &Waiter,
    meter: &Meter,
    elapsed: Duration,
    cpu: Option<Duration>,
    gave_up: u64,
    fairness: Option<f64>,
) -> Figures {
    let stats = waiter.stats();
    Figures {
        elapsed,
        held: meter.held(),
        acquisitions: stats.map_or_else(|| meter.acquisitions(), |stats| stats.acquisitions),
        requests: stats.map(|stats| stats.requests()),
        cpu,
        gap_p50: meter.gap(0.5),
        gap_p99: meter.gap(0.99),
        gave_up,
        fairness,
    }
}

pub(crate) fn fail_on_errors(tally: &crate::wallet::Tally) -> anyhow::Result<()> {
    if tally.errors > 0 {
        anyhow::bail!(
            "{} callers failed: {}",
            tally.errors,
            tally.first_errors.join("; ")
        );
    }
    Ok(())
}
