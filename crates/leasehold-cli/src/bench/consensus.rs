//! `bench consensus`: what a lease costs on etcd and ZooKeeper against
//! Redis, on one machine (`bench etcd` is the same bench with the Redis
//! and etcd ways by default).
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
//! - **etcd-1**: the same on a cluster of 1 member (no peer round trip);
//! - **zookeeper**: a `ZkLocker` on a throwaway ensemble of 3 servers
//!   (every create and delete a proposal the leader commits on two);
//! - **zookeeper-1**: the same on a standalone server.
//!
//! Everything is on loopback; the TTLs are the same for every way (10 s
//! uncontended, 2 s in the tutorial case: whole seconds, as etcd grants
//! them; ZooKeeper's session is 10 s, which its tick of 2 s allows), and
//! so is each request's bound (the CLI's command timeout). Around each
//! measurement of an etcd or ZooKeeper way, the members' own counters
//! give the fsyncs of their logs per lease and the mean fsync's time
//! ([`service`]). The figures are medians over rounds with their spread
//! (min..max), and the ratios the medians of the rounds' ratios against
//! the first way.

mod service;

use std::time::Duration;

use leasehold::RetryStrategy;
use serde_json::{Value, json};

use self::service::{Service, ZOOKEEPER_SETTINGS};
use super::Measurements;
use super::contention::{self, Crowd};
use super::rounds::{self, Figures};
use super::site::Site;
use super::uncontended::{Keys, lessor_tasks};
use crate::cli::{ConsensusBenchArgs, ConsensusBenchWay};
use crate::env::Env;
use crate::waiting::{Handoff, Mode, Waiter};

/// The TTL of the uncontended cases' leases (the one `bench uncontended`
/// uses), and so the session a ZooKeeper way asks for: the longest TTL
/// it is asked to honour.
const TTL: Duration = Duration::from_secs(10);

/// The lock keys of the uncontended cases (task `i` takes `…:i`).
const UNCONTENDED: Keys = Keys::new("lock:bench:etcd", TTL);

/// The cases, in the order they are measured and reported.
const CASES: [&str; 3] = ["sequential", "tasks", "tutorial"];

/// The figures that get ratios against the first way: pairs (or, in the
/// tutorial, leases) per second and the latency quantiles.
const RATIOS: [&str; 3] = ["per_s", "p50_us", "p99_us"];

/// Which command runs the bench: its name, and its ways by default.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Bench {
    /// `bench etcd`: the Redis and etcd ways.
    Etcd,
    /// `bench consensus`: every way.
    Consensus,
}

impl Bench {
    fn name(self) -> &'static str {
        match self {
            Bench::Etcd => "etcd",
            Bench::Consensus => "consensus",
        }
    }

    fn ways(self) -> &'static [ConsensusBenchWay] {
        match self {
            Bench::Etcd => &ConsensusBenchWay::ETCD,
            Bench::Consensus => &ConsensusBenchWay::ALL,
        }
    }
}

/// A way of taking the lease, with the service it runs on (none for the
/// Redis ways).
struct Way {
    which: ConsensusBenchWay,
    service: Option<Service>,
}

impl Way {
    fn name(&self) -> &'static str {
        match self.which {
            ConsensusBenchWay::Redis => "redis",
            ConsensusBenchWay::RedisHandOff => "redis-hand-off",
            ConsensusBenchWay::Etcd => "etcd",
            ConsensusBenchWay::Etcd1 => "etcd-1",
            ConsensusBenchWay::Zookeeper => "zookeeper",
            ConsensusBenchWay::Zookeeper1 => "zookeeper-1",
        }
    }

    /// Starts the throwaway service `which` needs, if any.
    async fn start(which: ConsensusBenchWay) -> anyhow::Result<Way> {
        let service = match which {
            ConsensusBenchWay::Redis | ConsensusBenchWay::RedisHandOff => None,
            ConsensusBenchWay::Etcd => Some(Service::etcd(3).await?),
            ConsensusBenchWay::Etcd1 => Some(Service::etcd(1).await?),
            ConsensusBenchWay::Zookeeper => Some(Service::zookeeper(3).await?),
            ConsensusBenchWay::Zookeeper1 => Some(Service::zookeeper(1).await?),
        };
        Ok(Way { which, service })
    }

    /// A fresh way of waiting (so a Redis way's stats count one run only).
    async fn waiter(&self, env: &Env) -> anyhow::Result<Waiter> {
        let mode = match (self.which, &self.service) {
            (_, Some(service)) => {
                return service.waiter(env.locker.command_timeout(), TTL).await;
            }
            (ConsensusBenchWay::RedisHandOff, None) => {
                Mode::Handoff("redis-hand-off", Handoff::DEFAULT)
            }
            (_, None) => Mode::Poll("redis", RetryStrategy::default()),
        };
        Waiter::connect(env, mode).await
    }
}

/// Runs the bench as `bench` (its name in the output, its ways unless
/// --ways names others).
pub(crate) async fn run(env: &Env, args: &ConsensusBenchArgs, bench: Bench) -> anyhow::Result<()> {
    let json = args.output.json;
    let asked = if args.ways.is_empty() {
        bench.ways()
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
    let crowd = Crowd::tutorial_case(args.callers, args.work);
    // results[case][way]: one entry per round.
    let mut results: Vec<Vec<Vec<Figures>>> = vec![vec![Vec::new(); ways.len()]; CASES.len()];
    let len = u64::from(args.rounds) * (CASES.len() * ways.len()) as u64;
    let progress = Measurements::new(
        match bench {
            Bench::Etcd => "bench etcd",
            Bench::Consensus => "bench consensus",
        },
        len,
        json,
    );
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
                // Read once the locker is connected (a ZooKeeper session
                // is a write too) and before it is dropped.
                let flushes = || {
                    way.service
                        .as_ref()
                        .map(|service| tokio::task::block_in_place(|| service.flushes()))
                        .transpose()
                };
                let before = flushes()?;
                let mut figures = match c {
                    0 | 1 => {
                        let tasks = if c == 0 { 1 } else { args.tasks };
                        let pairs =
                            lessor_tasks(waiter.lessor(), &UNCONTENDED, tasks, args.duration, true)
                                .await?;
                        rounds::pairs(&pairs)?
                    }
                    _ => rounds::tutorial(&contention::tutorial(&site, &waiter, &crowd).await?),
                };
                if let (Some(before), Some(after)) = (before, flushes()?) {
                    figures.extend(after.per_lease(&before, rounds::value(&figures, "leases")));
                }
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
    let version = |etcd: bool| {
        ways.iter().find_map(|w| {
            let service = w.service.as_ref()?;
            (service.is_etcd() == etcd).then(|| service.version().to_owned())
        })
    };
    if json {
        println!(
            "{}",
            json!({
                "bench": bench.name(),
                "rounds": args.rounds,
                "duration_ms": args.duration.as_secs_f64() * 1e3,
                "tasks": args.tasks,
                "callers": args.callers,
                "work_ms": args.work.as_secs_f64() * 1e3,
                "etcd_version": version(true),
                "zookeeper_version": version(false),
                "zookeeper_settings": ZOOKEEPER_SETTINGS,
                "base": ways[0].name(),
                "rows": rows,
            })
        );
    } else {
        print_text(args, bench, ways[0].name(), &rows);
    }
    Ok(())
}

fn print_text(args: &ConsensusBenchArgs, bench: Bench, base: &str, rows: &[Value]) {
    println!(
        "bench {}: {} rounds; uncontended runs of {:?} (one task, then {} tasks); tutorial case: {} callers, work {:?}",
        bench.name(),
        args.rounds,
        args.duration,
        args.tasks,
        args.callers,
        args.work
    );
    println!(
        "medians (min..max over rounds); sequential and tasks: acquire+release pairs and their latency; tutorial: leases per second and the gap from a release to the next holder; ratios against {base}; etcd and zookeeper ways: their members' log fsyncs per lease (all members) and the mean fsync's ms"
    );
    rounds::print(
        rows,
        &[
            ("elapsed_ms", "elapsed ms"),
            ("utilisation", "util"),
            ("round_trips_per_acq", "rt/acq"),
            ("gave_up", "gave up"),
            ("fsyncs_per_lease", "fsyncs/lease"),
            ("fsync_ms", "fsync ms"),
        ],
    );
}
