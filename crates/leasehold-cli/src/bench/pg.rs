//! `bench pg`: what a lease costs on PostgreSQL, against PostgreSQL's own
//! advisory lock and against Redis, on one machine.
//!
//! Each way takes plain (unfenced) keys in the same cases as `bench etcd`:
//! the uncontended loop (each task on a key of its own, every
//! acquire+release pair timed) and the tutorial workload (n callers on one
//! key, the wallet in Redis whichever way holds the lock), then the timed
//! run of `bench contention` (the same callers each taking the lock again
//! and again for `--timed`, holding it for the work), whose fairness is
//! the most leases one caller got over the fewest. The ways, in
//! every round, case by case, in an order that rotates each round:
//!
//! - **advisory** (the baseline, first unless `--ways` says otherwise):
//!   `pg_advisory_lock` and `pg_advisory_unlock` through sqlx's
//!   `PgAdvisoryLock`, a connection per caller ([`advisory`]);
//! - **pg**: a `PgLocker` as built by default (`PgLocker::connect`: one
//!   shared connection for the steps, one that `LISTEN`s for releases);
//! - **redis**: a `Locker` on the one redis-server (polling as built by
//!   default: 5 to 15 ms between attempts);
//! - **redis-hand-off**: a `HandoffLocker` as built by default.
//!
//! Both PostgreSQL ways run on one throwaway server started with
//! PostgreSQL's own durability settings (`fsync`, `full_page_writes` and
//! `synchronous_commit` on, where the test kit turns them off) and
//! `pg_stat_statements` loaded: a lease table's cost is its commits and
//! their WAL. Around each PostgreSQL way's one-task case and tutorial
//! case, the database's counters ([`cost`]) give what one lease costs it:
//! statements, WAL bytes and dead tuples (under contention, a waiter's
//! tries count too). After the rounds, `--hot-leases` leases one after
//! another on one key through a `PgLocker` show what a hot resource leaves
//! in the lease table (its size, dead tuples, autovacuum runs).
//!
//! Everything is on loopback; the TTLs are the same for every way that has
//! one (10 s uncontended, 2 s in the tutorial case), and so is each
//! request's bound (the CLI's command timeout). Each lessor is warmed up
//! (one lease on a key of its own) before its clock starts, as the
//! advisory way's connections are opened before it. The figures are
//! medians over rounds with their spread (min..max), and the ratios the
//! medians of the rounds' ratios against the first way. The targets (the
//! issue's): the tutorial case's elapsed time on `pg` within 1.5 times the
//! advisory lock's.

mod advisory;
mod cost;

use std::time::Duration;

use anyhow::Context as _;
use leasehold::{Lessor as _, RetryStrategy};
use leasehold_pg::PgLocker;
use leasehold_testkit::PostgresServer;
use serde_json::{Value, json};
use tokio::time::Instant;

use self::advisory::Advisory;
use self::cost::{Counters, Table};
use super::contention::{self, Crowd};
use super::rounds::{self, Figures};
use super::site::Site;
use super::uncontended::{Keys, lessor_tasks};
use super::{Measurements, round3};
use crate::cli::{PgBenchArgs, PgBenchWay};
use crate::env::Env;
use crate::progress::note;
use crate::waiting::{Handoff, Mode, Waiter};

/// The TTL of every lease but the tutorial's (the one `bench
/// uncontended` uses).
const UNCONTENDED_TTL: Duration = Duration::from_secs(10);

/// The lock keys of the uncontended cases (task `i` takes `…:i`).
const UNCONTENDED: Keys = Keys::new("lock:bench:pg", UNCONTENDED_TTL);

/// The key each lessor's warm-up lease takes.
const WARM_UP: &str = "lock:bench:pg:warm-up";

/// The key of the hot-resource run.
const HOT: &str = "lock:bench:pg:hot";

/// The cases, in the order they are measured and reported.
const CASES: [&str; 4] = ["sequential", "tasks", "tutorial", "timed"];

/// The figures that get ratios against the first way: pairs (or, in the
/// tutorial, leases) per second, the latency quantiles, and the
/// tutorial's elapsed time (the target's).
const RATIOS: [&str; 4] = ["per_s", "p50_us", "p99_us", "elapsed_ms"];

/// The target: the tutorial case on `pg` within this many times
/// the advisory lock's elapsed time.
const TARGET: f64 = 1.5;

/// The throwaway server's settings over the test kit's: PostgreSQL's own
/// durability, and the statement counter.
const SETTINGS: [&str; 4] = [
    "fsync=on",
    "full_page_writes=on",
    "synchronous_commit=on",
    "shared_preload_libraries=pg_stat_statements",
];

impl PgBenchWay {
    fn name(self) -> &'static str {
        match self {
            PgBenchWay::Advisory => "advisory",
            PgBenchWay::Pg => "pg",
            PgBenchWay::Redis => "redis",
            PgBenchWay::RedisHandOff => "redis-hand-off",
        }
    }

    /// Whether its leases are PostgreSQL's (so their cost is read).
    fn on_postgres(self) -> bool {
        matches!(self, PgBenchWay::Advisory | PgBenchWay::Pg)
    }
}

/// What a way takes its leases through in one measurement.
enum Taker {
    /// Its connections are opened by each run, before its clock starts.
    Advisory(Advisory),
    /// Warmed up by one lease on [`WARM_UP`].
    Lessor(Waiter),
}

impl Taker {
    /// The leases taken to warm it up.
    fn warm_ups(&self) -> u64 {
        match self {
            Taker::Advisory(_) => 0,
            Taker::Lessor(_) => 1,
        }
    }
}

/// A way's taker, fresh for each measurement (so a Redis way's stats
/// count one run only, and a `PgLocker`'s connections are its own).
async fn taker(way: PgBenchWay, env: &Env, url: &str) -> anyhow::Result<Taker> {
    let waiter = match way {
        PgBenchWay::Advisory => return Ok(Taker::Advisory(Advisory::new(url, Crowd::CASE_WAIT))),
        PgBenchWay::Pg => Waiter::of(pg_locker(env, url).await?),
        PgBenchWay::Redis => {
            Waiter::connect(env, Mode::Poll("redis", RetryStrategy::default())).await?
        }
        PgBenchWay::RedisHandOff => {
            Waiter::connect(env, Mode::Handoff("redis-hand-off", Handoff::DEFAULT)).await?
        }
    };
    let lease = waiter
        .lessor()
        .acquire(WARM_UP, UNCONTENDED_TTL)
        .await
        .with_context(|| format!("warming up the {} way", way.name()))?;
    lease.release().await?;
    Ok(Taker::Lessor(waiter))
}

/// A `PgLocker` as built by default but for its requests' bound (the
/// CLI's command timeout, as every way's): its connection for the steps
/// is opened now, the one that listens for releases by its first lease.
async fn pg_locker(env: &Env, url: &str) -> anyhow::Result<PgLocker> {
    PgLocker::builder()
        .command_timeout(env.locker.command_timeout())
        .connect(url)
        .await
        .context("connecting a PgLocker to the throwaway postgres")
}

pub(crate) async fn run(env: &Env, args: &PgBenchArgs, json: bool) -> anyhow::Result<()> {
    let mut ways: Vec<PgBenchWay> = Vec::with_capacity(PgBenchWay::ALL.len());
    let asked = if args.ways.is_empty() {
        &PgBenchWay::ALL[..]
    } else {
        &args.ways[..]
    };
    for way in asked {
        if !ways.contains(way) {
            ways.push(*way);
        }
    }
    let server = tokio::task::spawn_blocking(|| PostgresServer::start_with_settings(&SETTINGS))
        .await
        .context("starting a throwaway postgres")?
        .context("starting a throwaway postgres")?;
    let url = server.url();
    let mut counters = Counters::connect(&url).await?;
    let version = counters.version().await?;
    note!(
        "leasehold: started a throwaway postgres {version} at {} ({})",
        server.addr(),
        SETTINGS.join(", ")
    );
    PgLocker::connect(&url)
        .await
        .context("connecting a PgLocker to the throwaway postgres")?
        .setup()
        .await
        .context("creating the lease table")?;

    let site = Site::node(env);
    let crowd = Crowd::tutorial_case(args.callers, args.work);
    let hot = args.hot_leases > 0 && ways.contains(&PgBenchWay::Pg);
    // results[case][way]: one entry per round.
    let mut results: Vec<Vec<Vec<Figures>>> = vec![vec![Vec::new(); ways.len()]; CASES.len()];
    let len = u64::from(args.rounds) * (CASES.len() * ways.len()) as u64 + u64::from(hot);
    let progress = Measurements::new("bench pg", len, json);
    for round in 1..=args.rounds {
        for (c, case) in CASES.iter().enumerate() {
            for turn in 0..ways.len() {
                let w = (turn + round as usize) % ways.len();
                let way = ways[w];
                progress.start(format!(
                    "round {round}/{}: {case}, {}",
                    args.rounds,
                    way.name()
                ));
                // Read before the taker connects and warms up: its
                // warm-up lease is counted with the run's.
                let before = if matches!(c, 0 | 2) && way.on_postgres() {
                    Some(counters.read().await?)
                } else {
                    None
                };
                let taker = taker(way, env, &url).await?;
                let warm_ups = taker.warm_ups();
                let mut figures = match (c, &taker) {
                    (0 | 1, _) => {
                        let tasks = if c == 0 { 1 } else { args.tasks };
                        let pairs = match &taker {
                            Taker::Advisory(advisory) => {
                                advisory.tasks(&UNCONTENDED, tasks, args.duration).await?
                            }
                            Taker::Lessor(waiter) => {
                                lessor_tasks(
                                    waiter.lessor(),
                                    &UNCONTENDED,
                                    tasks,
                                    args.duration,
                                    true,
                                )
                                .await?
                            }
                        };
                        rounds::pairs(&pairs)?
                    }
                    (2, Taker::Advisory(advisory)) => {
                        rounds::tutorial(&advisory.tutorial(&site, &crowd).await?)
                    }
                    (2, Taker::Lessor(waiter)) => {
                        rounds::tutorial(&contention::tutorial(&site, waiter, &crowd).await?)
                    }
                    (_, Taker::Advisory(advisory)) => {
                        rounds::tutorial(&advisory.timed(&site, &crowd, args.timed).await?)
                    }
                    (_, Taker::Lessor(waiter)) => rounds::tutorial(
                        &contention::timed_with(&site, waiter, &crowd, args.timed).await?,
                    ),
                };
                // Its connections close, so the reading sees their counts.
                drop(taker);
                if let Some(before) = before {
                    let after = counters.read().await?;
                    let leases = rounds::value(&figures, "leases") as u64 + warm_ups;
                    figures.extend(before.per_lease(&after, leases));
                }
                results[c][w].push(figures);
            }
        }
    }
    let hot = if hot {
        progress.start(format!("{} leases on {HOT}, pg", args.hot_leases));
        Some(hot_run(env, &url, &mut counters, args.hot_leases).await?)
    } else {
        None
    };

    let mut rows = Vec::new();
    for (c, case) in CASES.iter().enumerate() {
        let base = &results[c][0];
        for (way, rounds) in ways.iter().zip(&results[c]) {
            rows.push(rounds::row(case, way.name(), rounds, base, &RATIOS));
        }
    }
    let target = target(&ways, &rows);
    if json {
        println!(
            "{}",
            json!({
                "bench": "pg",
                "rounds": args.rounds,
                "duration_ms": args.duration.as_secs_f64() * 1e3,
                "tasks": args.tasks,
                "callers": args.callers,
                "work_ms": args.work.as_secs_f64() * 1e3,
                "postgres_version": version,
                "postgres_settings": SETTINGS,
                "base": ways[0].name(),
                "rows": rows,
                "target": target,
                "hot": hot,
            })
        );
    } else {
        print_text(args, ways[0].name(), &rows, &target, hot.as_ref());
    }
    drop(counters);
    drop(server);
    Ok(())
}

/// The target's figure: the median over rounds of the tutorial case's
/// elapsed time on `pg` against the advisory lock's, when both ran and
/// advisory is the base; null otherwise.
fn target(ways: &[PgBenchWay], rows: &[Value]) -> Value {
    if ways.first() != Some(&PgBenchWay::Advisory) {
        return Value::Null;
    }
    let ratio = rows
        .iter()
        .find(|row| row["case"] == "tutorial" && row["way"] == "pg")
        .and_then(|row| row["elapsed_ms_ratio"].as_f64());
    match ratio {
        Some(ratio) => json!({
            "figure": "tutorial elapsed, pg / advisory",
            "ratio": ratio,
            "at_most": TARGET,
            "met": ratio <= TARGET,
        }),
        None => Value::Null,
    }
}

/// `leases` leases one after another on one key through a fresh
/// `PgLocker`, and the lease table before and after.
async fn hot_run(
    env: &Env,
    url: &str,
    counters: &mut Counters,
    leases: u64,
) -> anyhow::Result<Value> {
    let before = counters.table().await?;
    // Not warmed up: its first lease opens its listening connection, once
    // in all.
    let locker = pg_locker(env, url).await?;
    let start = Instant::now();
    for _ in 0..leases {
        locker
            .acquire(HOT, UNCONTENDED_TTL)
            .await?
            .release()
            .await?;
    }
    let elapsed = start.elapsed();
    drop(locker);
    let after = counters.table().await?;
    let table = |t: &Table| {
        json!({
            "size_bytes": t.size_bytes,
            "live_tuples": t.live_tuples,
            "dead_tuples": t.dead_tuples,
            "autovacuums": t.autovacuums,
        })
    };
    Ok(json!({
        "leases": leases,
        "elapsed_s": round3(elapsed.as_secs_f64()),
        "per_s": round3(leases as f64 / elapsed.as_secs_f64()),
        "wal_bytes_per_lease": round3((after.wal_bytes - before.wal_bytes) as f64 / leases as f64),
        "autovacuums_during": after.autovacuums - before.autovacuums,
        "before": table(&before),
        "after": table(&after),
    }))
}

fn print_text(args: &PgBenchArgs, base: &str, rows: &[Value], target: &Value, hot: Option<&Value>) {
    println!(
        "bench pg: {} rounds; uncontended runs of {:?} (one task, then {} tasks); tutorial case: {} callers, work {:?}; postgres with {}",
        args.rounds,
        args.duration,
        args.tasks,
        args.callers,
        args.work,
        SETTINGS.join(", ")
    );
    println!(
        "medians (min..max over rounds); sequential and tasks: acquire+release pairs and their latency; tutorial: leases per second and the gap from a release to the next holder; timed: the same with every caller taking the lock again and again, and its fairness (the most leases one caller got over the fewest); ratios against {base}; per lease (PostgreSQL ways, one task and tutorial): statements, WAL bytes and dead tuples of the lease table"
    );
    rounds::print(
        rows,
        &[
            ("elapsed_ms", "elapsed ms"),
            ("elapsed_ms_ratio", "elapsed ratio"),
            ("utilisation", "util"),
            ("round_trips_per_acq", "rt/acq"),
            ("gave_up", "gave up"),
            ("fairness", "fairness"),
            ("statements_per_lease", "stmts/lease"),
            ("wal_bytes_per_lease", "WAL B/lease"),
            ("dead_tuples_per_lease", "dead/lease"),
        ],
    );
    if let Some(ratio) = target["ratio"].as_f64() {
        println!(
            "target: tutorial elapsed, pg / advisory = {} (at most {TARGET}): {}",
            rounds::short(ratio),
            if target["met"] == true {
                "met"
            } else {
                "missed"
            }
        );
    }
    if let Some(hot) = hot {
        let (before, after) = (&hot["before"], &hot["after"]);
        println!(
            "{} leases on one key (pg): {}/s, {} WAL bytes per lease; leasehold_leases: {} -> {} bytes, {} live and {} dead tuples after, {} autovacuum runs during",
            hot["leases"],
            hot["per_s"],
            hot["wal_bytes_per_lease"],
            before["size_bytes"],
            after["size_bytes"],
            after["live_tuples"],
            after["dead_tuples"],
            hot["autovacuums_during"]
        );
    }
}
