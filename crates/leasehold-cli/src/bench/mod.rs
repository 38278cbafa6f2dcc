//! `leasehold bench`: performance figures for `BENCHMARKS.md`. Build with
//! `--release`; the machine is shared and noisy, so every bench runs its
//! modes side by side for several rounds and reports medians.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};

use crate::cli::{DatabaseFlags, OutputFlags, RedisFlags, exit_codes, parse_duration};
use crate::env::{Database, Env};
use crate::progress::Progress;

pub(crate) mod contention;
pub(crate) mod guard;
pub(crate) mod uncontended;

/// Which bench to run.
#[derive(Debug, Subcommand)]
pub(crate) enum Bench {
    /// Many callers on one key, for each way of waiting: polling with
    /// exponential backoff, with full jitter, with jitter tuned for speed,
    /// and hand-off (relayed in process, over two lockers, strict FIFO,
    /// wake).
    #[command(after_help = concat!(
        "What it changes (on --redis-url, or a throwaway redis-server):
  Redis: overwrites wallet:42:balance; deletes, then takes and releases
    lock:bench:contention (hand-off modes queue in its :waitq and :waiters
    keys and publish on leasehold:handoff:* channels). Reads INFO cpu if
    the user may (the cpu figures are null otherwise).

",
        exit_codes!()
    ))]
    Contention(ContentionArgs),
    /// Acquire+release pairs per second with no contention, against a raw
    /// `SET NX PX` + `EVALSHA` loop on the same connection.
    #[command(after_help = concat!(
        "What it changes (on --redis-url, or a throwaway redis-server):
  Redis: takes and releases lock:bench:u:lib, lock:bench:u:raw,
    lock:bench:u:many:* and lock:bench:u:rawmany:* (none is left behind
    unless a run fails); loads a release script (SCRIPT LOAD).

",
        exit_codes!()
    ))]
    Uncontended(UncontendedArgs),
    /// What the PostgreSQL fence guard costs a debit: unguarded, guarded
    /// and `SELECT ... FOR UPDATE`, sequential and concurrent. No Redis.
    #[command(after_help = concat!(
        "What it changes (on --database-url, or a throwaway postgres):
  PostgreSQL: creates the tables wallets, wallet_ledger, leasehold_fences
    and bench_accounts if missing; creates or resets bench_accounts rows
    with ids from 1000000 up (balance 1000000000, then debited), and
    creates or updates leasehold_fences rows named bench:<id>.

",
        exit_codes!()
    ))]
    Guard(GuardArgs),
}

impl Bench {
    /// How the bench prints.
    pub(crate) fn output(&self) -> OutputFlags {
        match self {
            Bench::Contention(args) => args.output,
            Bench::Uncontended(args) => args.output,
            Bench::Guard(args) => args.output,
        }
    }
}

/// Runs the bench; its figures are printed, not judged, so it exits 0
/// unless a server fails.
pub(crate) async fn run(bench: Bench) -> anyhow::Result<ExitCode> {
    match bench {
        Bench::Contention(args) => {
            let env = Env::connect(&args.redis).await?;
            contention::run(&env, &args, args.output.json).await?;
        }
        Bench::Uncontended(args) => {
            let env = Env::connect(&args.redis).await?;
            uncontended::run(&env, &args, args.output.json).await?;
        }
        Bench::Guard(args) => {
            let db = Database::new(&args.database);
            guard::run(&db, &args, args.output.json).await?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The bar of a bench of `len` measurements, or, when no bar can be drawn
/// (stderr is not a terminal) and the output is text, one line per
/// measurement on stderr.
pub(crate) struct Measurements {
    bar: Progress,
    lines: bool,
}

impl Measurements {
    pub(crate) fn new(what: &'static str, len: u64, json: bool) -> Measurements {
        Measurements {
            bar: Progress::new(what, len),
            lines: !json && !crate::progress::enabled(),
        }
    }

    /// A measurement begins.
    pub(crate) fn start(&self, what: String) {
        if self.lines {
            eprintln!("{what}");
        }
        self.bar.start(what);
    }
}

/// Flags of `bench guard`.
#[derive(Debug, Clone, Args)]
pub(crate) struct GuardArgs {
    /// Length of each measurement.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub(crate) duration: Duration,
    /// Rounds; every figure is the median over rounds.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub(crate) rounds: u32,
    /// Concurrent tasks (connections) of the concurrent run, each on its
    /// own account.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=60))]
    pub(crate) tasks: u32,
    #[command(flatten)]
    pub(crate) output: OutputFlags,
    #[command(flatten)]
    pub(crate) database: DatabaseFlags,
}

/// Flags of `bench contention`.
#[derive(Debug, Clone, Args)]
pub(crate) struct ContentionArgs {
    /// Concurrent callers on the one key.
    #[arg(short = 'n', long = "callers", default_value_t = 50, value_parser = clap::value_parser!(u32).range(2..=100_000))]
    pub(crate) callers: u32,
    /// Time each caller holds the lock.
    #[arg(long, default_value = "2ms", value_parser = parse_duration)]
    pub(crate) work: Duration,
    /// Starting balance of the tutorial workload (10 per payment).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i64).range(0..))]
    pub(crate) initial: i64,
    /// Length of the timed (fairness) run.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub(crate) duration: Duration,
    /// Rounds; every figure is the median over rounds.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub(crate) rounds: u32,
    /// How long a caller waits for the lock before giving up.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub(crate) wait: Duration,
    #[command(flatten)]
    pub(crate) output: OutputFlags,
    #[command(flatten)]
    pub(crate) redis: RedisFlags,
}

/// Flags of `bench uncontended`.
#[derive(Debug, Clone, Args)]
pub(crate) struct UncontendedArgs {
    /// Length of each measurement.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub(crate) duration: Duration,
    /// Rounds; every figure is the median over rounds.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub(crate) rounds: u32,
    /// Concurrent tasks of the many-keys run.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub(crate) tasks: u32,
    #[command(flatten)]
    pub(crate) output: OutputFlags,
    #[command(flatten)]
    pub(crate) redis: RedisFlags,
}

/// The median of `values` (the mean of the middle two for an even count).
pub(crate) fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

/// Rounds to 3 significant decimals for printing and JSON.
pub(crate) fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
        assert_eq!(median(&[f64::NAN, 1.0]), 1.0);
        assert_eq!(median(&[f64::INFINITY, 1.0, 5.0]), 5.0);
    }
}
