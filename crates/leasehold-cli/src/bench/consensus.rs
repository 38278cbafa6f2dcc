//! `bench etcd`: what a lease costs on etcd against Redis, on one machine.
//!
//! Each way takes plain (unfenced) keys through the same code: the
//! uncontended loop of [`uncontended`](super::uncontended) (each task on a
//! key of its own, every acquire+release pair timed) and the tutorial
//! workload of [`contention`](super::contention) (n callers on one key,
//! the wallet in Redis whichever way holds the lock). The ways, in every
//! round, case by case, in an order that rotates each round:
//!
//! - **redis**: a `Locker` on the one redis-server (polling as built by
//!   default: 5 to 15 ms between attempts);
//! - **redis-hand-off**: a `HandoffLocker` as built by default (waiters
//!   queue in Redis and are handed the lock);
//! - **etcd**: an `EtcdLocker` on a throwaway cluster of 3 members (what
//!   production runs: every write is a consensus commit on two of them);
//! - **etcd-1**: the same on a cluster of 1 member (no peer round trip).
//!
//! Everything is on loopback; the TTLs are the same for every way (10 s
//! uncontended, 2 s in the tutorial case: whole seconds, as etcd grants
//! them), and so is each request's bound (the CLI's command timeout). The
//! figures are medians over rounds with their spread (min..max), and the
//! ratios the medians of the rounds' ratios against the first way.

use std::time::Duration;

use anyhow::Context as _;
use leasehold::RetryStrategy;
use leasehold_etcd::EtcdLocker;
use leasehold_testkit::EtcdCluster;
use serde_json::{Value, json};

use super::contention::{self, Crowd};
use super::rounds::{self, Figures};
use super::site::Site;
use super::uncontended::{Keys, lessor_tasks};
use super::{Measurements, print_table};
use crate::cli::{EtcdBenchArgs, EtcdBenchWay};
use crate::env::Env;
use crate::progress::note;
use crate::waiting::{Handoff, Mode, Waiter};

/// The lock keys of the uncontended cases (task `i` takes `…:i`), and
/// their TTL (the one `bench uncontended` uses).
const UNCONTENDED: Keys = Keys::new("lock:bench:etcd", Duration::from_secs(10));

/// The tutorial's starting balance: 10 callers pay, the rest are refused.
const INITIAL: i64 = 100;

/// How long a caller of the tutorial case waits before giving up: long
/// enough that none does on either store (a give-up would be counted).
const WAIT: Duration = Duration::from_secs(10);

/// The cases, in the order they are measured and reported.
const CASES: [&str; 3] = ["sequential", "tasks", "tutorial"];

/// The figures that get ratios against the first way: pairs (or, in the
/// tutorial, leases) per second and the latency quantiles.
const RATIOS: [&str; 3] = ["per_s", "p50_us", "p99_us"];

/// A way of taking the lease, with the etcd cluster it runs on.
struct Way {
    which: EtcdBenchWay,
    etcd: Option<EtcdCluster>,
}

impl Way {
    fn name(&self) -> &'static str {
        match self.which {
            EtcdBenchWay::Redis => "redis",
            EtcdBenchWay::RedisHandOff => "redis-hand-off",
            EtcdBenchWay::Etcd => "etcd",
            EtcdBenchWay::Etcd1 => "etcd-1",
        }
    }

    /// Starts the throwaway etcd cluster `which` needs, if any.
    async fn start(which: EtcdBenchWay) -> anyhow::Result<Way> {
        let members = match which {
            EtcdBenchWay::Redis | EtcdBenchWay::RedisHandOff => {
                return Ok(Way { which, etcd: None });
            }
            EtcdBenchWay::Etcd => 3,
            EtcdBenchWay::Etcd1 => 1,
        };
        let cluster = tokio::task::spawn_blocking(move || EtcdCluster::start(members))
            .await
            .context("starting a throwaway etcd cluster")?
            .context("starting a throwaway etcd cluster")?;
        note!(
            "leasehold: started a throwaway etcd {} cluster of {members} at {}",
            cluster.version(),
            cluster.endpoints().join(",")
        );
        Ok(Way {
            which,
            etcd: Some(cluster),
        })
    }

    /// A fresh way of waiting (so a Redis way's stats count one run only).
    async fn waiter(&self, env: &Env) -> anyhow::Result<Waiter> {
        let mode = match self.which {
            EtcdBenchWay::Redis => Mode::Poll("redis", RetryStrategy::default()),
            EtcdBenchWay::RedisHandOff => Mode::Handoff("redis-hand-off", Handoff::DEFAULT),
            EtcdBenchWay::Etcd | EtcdBenchWay::Etcd1 => {
                let cluster = self.etcd.as_ref().context("no etcd cluster")?;
                let locker = EtcdLocker::builder(cluster.endpoints())
                    .command_timeout(env.locker.command_timeout())
                    .connect()
                    .await
                    .context("connecting to the etcd cluster")?;
                return Ok(Waiter::of(locker));
            }
        };
        Waiter::connect(env, mode).await
    }
}

pub(crate) async fn run(env: &Env, args: &EtcdBenchArgs, json: bool) -> anyhow::Result<()> {
    let asked = if args.ways.is_empty() {
        &EtcdBenchWay::ALL[..]
    } else {
        &args.ways[..]
    };
    let mut ways: Vec<Way> = Vec::with_capacity(asked.len());
    for which in asked {
        if !ways.iter().any(|way| way.which == *which) {
            ways.push(Way::start(*which).await?);
        }
    }
    let site = Site::node(env);
    let crowd = Crowd {
        callers: args.callers,
        work: args.work,
        initial: INITIAL,
        wait: WAIT,
    };
    // results[case][way]: one entry per round.
    let mut results: Vec<Vec<Vec<Figures>>> = vec![vec![Vec::new(); ways.len()]; CASES.len()];
    let len = u64::from(args.rounds) * (CASES.len() * ways.len()) as u64;
    let progress = Measurements::new("bench etcd", len, json);
    for round in 1..=args.rounds {
        for (c, case) in CASES.iter().enumerate() {
            for turn in 0..ways.len() {
                let w = (turn + round as usize) % ways.len();
                let way = &ways[w];
                progress.start(format!(
                    "round {round}/{}: {case}, {}",
                    args.rounds,
                    way.name()
                ));
                let waiter = way.waiter(env).await?;
                let figures = match c {
                    0 | 1 => {
                        let tasks = if c == 0 { 1 } else { args.tasks };
                        let pairs =
                            lessor_tasks(waiter.lessor(), &UNCONTENDED, tasks, args.duration, true)
                                .await?;
                        rounds::pairs(&pairs)?
                    }
                    _ => rounds::tutorial(&contention::tutorial(&site, &waiter, &crowd).await?),
                };
                results[c][w].push(figures);
            }
        }
    }

    let mut rows = Vec::new();
    for (c, case) in CASES.iter().enumerate() {
        let base = &results[c][0];
        for (way, rounds) in ways.iter().zip(&results[c]) {
            rows.push(rounds::row(case, way.name(), rounds, base, &RATIOS));
        }
    }
    if json {
        println!(
            "{}",
            json!({
                "bench": "etcd",
                "rounds": args.rounds,
                "duration_ms": args.duration.as_secs_f64() * 1e3,
                "tasks": args.tasks,
                "callers": args.callers,
                "work_ms": args.work.as_secs_f64() * 1e3,
                "etcd_version": ways.iter().find_map(|w| Some(w.etcd.as_ref()?.version())),
                "base": ways[0].name(),
                "rows": rows,
            })
        );
    } else {
        print_text(args, ways[0].name(), &rows);
    }
    Ok(())
}

fn print_text(args: &EtcdBenchArgs, base: &str, rows: &[Value]) {
    println!(
        "bench etcd: {} rounds; uncontended runs of {:?} (one task, then {} tasks); tutorial case: {} callers, work {:?}",
        args.rounds, args.duration, args.tasks, args.callers, args.work
    );
    println!(
        "medians (min..max over rounds); sequential and tasks: acquire+release pairs and their latency; tutorial: leases per second and the gap from a release to the next holder; ratios against {base}"
    );
    let cells = rounds::cells(rows);
    print_table(
        &[
            ("case", "case"),
            ("way", "way"),
            ("per_s", "per s"),
            ("p50_us", "p50 us"),
            ("p99_us", "p99 us"),
            ("per_s_ratio", "per s ratio"),
            ("p50_us_ratio", "p50 ratio"),
            ("p99_us_ratio", "p99 ratio"),
            ("elapsed_ms", "elapsed ms"),
            ("utilisation", "util"),
            ("round_trips_per_acq", "rt/acq"),
            ("gave_up", "gave up"),
        ],
        &cells,
    );
}
