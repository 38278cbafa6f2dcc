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
use serde_json::{Map, Value, json};

use super::contention::{self, Crowd};
use super::site::Site;
use super::uncontended::{Keys, lessor_tasks};
use super::{Measurements, median, print_table, round3};
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

/// One case of one way in one round: `(figure, value)`.
type Figures = Vec<(&'static str, f64)>;

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
                        let latency = pairs.latency.context("no latencies")?;
                        let us = |q| latency.value_at_quantile(q) as f64;
                        vec![
                            ("per_s", pairs.per_s),
                            ("p50_us", us(0.5)),
                            ("p99_us", us(0.99)),
                        ]
                    }
                    _ => {
                        let figures = contention::tutorial(&site, &waiter, &crowd).await?;
                        let metrics = figures.metrics();
                        let metric = |name| {
                            metrics
                                .iter()
                                .find(|(k, _)| *k == name)
                                .map_or(f64::NAN, |(_, v)| *v)
                        };
                        vec![
                            (
                                "per_s",
                                metric("acquisitions") / figures.elapsed.as_secs_f64(),
                            ),
                            ("p50_us", metric("gap_p50_us")),
                            ("p99_us", metric("gap_p99_us")),
                            ("elapsed_ms", metric("elapsed_ms")),
                            ("utilisation", metric("utilisation")),
                            ("round_trips_per_acq", metric("round_trips_per_acq")),
                            ("gave_up", metric("gave_up")),
                        ]
                    }
                };
                results[c][w].push(figures);
            }
        }
    }

    let mut rows = Vec::new();
    for (c, case) in CASES.iter().enumerate() {
        let base = &results[c][0];
        for (way, rounds) in ways.iter().zip(&results[c]) {
            rows.push(row(case, way.name(), rounds, base));
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

/// The row of `case` for `way`: each figure's median and spread over
/// `rounds`, and the medians of the rounds' ratios against `base`'s.
fn row(case: &str, way: &str, rounds: &[Figures], base: &[Figures]) -> Value {
    let mut row = Map::new();
    row.insert("case".into(), json!(case));
    row.insert("way".into(), json!(way));
    let value = |round: &Figures, name: &str| {
        round
            .iter()
            .find(|(k, _)| *k == name)
            .map_or(f64::NAN, |(_, v)| *v)
    };
    let number = |x: f64| {
        if x.is_finite() {
            json!(round3(x))
        } else {
            Value::Null
        }
    };
    for (name, _) in &rounds[0] {
        let values: Vec<f64> = rounds.iter().map(|r| value(r, name)).collect();
        let finite = values.iter().copied().filter(|x| x.is_finite());
        let (min, max) = finite.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
            (lo.min(x), hi.max(x))
        });
        row.insert(
            (*name).into(),
            json!({
                "median": number(median(&values)),
                "min": number(min),
                "max": number(max),
            }),
        );
        if RATIOS.contains(name) {
            let ratios: Vec<f64> = rounds
                .iter()
                .zip(base)
                .map(|(r, b)| value(r, name) / value(b, name))
                .collect();
            row.insert(format!("{name}_ratio"), number(median(&ratios)));
        }
    }
    Value::Object(row)
}

fn print_text(args: &EtcdBenchArgs, base: &str, rows: &[Value]) {
    println!(
        "bench etcd: {} rounds; uncontended runs of {:?} (one task, then {} tasks); tutorial case: {} callers, work {:?}",
        args.rounds, args.duration, args.tasks, args.callers, args.work
    );
    println!(
        "medians (min..max over rounds); sequential and tasks: acquire+release pairs and their latency; tutorial: leases per second and the gap from a release to the next holder; ratios against {base}"
    );
    let spread = |figure: &Value| match (
        figure["median"].as_f64(),
        figure["min"].as_f64(),
        figure["max"].as_f64(),
    ) {
        (Some(median), Some(min), Some(max)) => json!(format!(
            "{} ({}..{})",
            short(median),
            short(min),
            short(max)
        )),
        _ => Value::Null,
    };
    let cells: Vec<Value> = rows
        .iter()
        .map(|row| {
            let mut cells = Map::new();
            for (key, value) in row.as_object().into_iter().flatten() {
                let cell = if value.is_object() {
                    spread(value)
                } else {
                    value.clone()
                };
                cells.insert(key.clone(), cell);
            }
            Value::Object(cells)
        })
        .collect();
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

/// `x` to about three significant digits (whole numbers from 100 up).
fn short(x: f64) -> String {
    let decimals = match x.abs() {
        a if a >= 100.0 => 0,
        a if a >= 10.0 => 1,
        a if a >= 1.0 => 2,
        _ => 3,
    };
    format!("{x:.decimals$}")
}
