//! Flags, parsed into validated settings before any work starts.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::env::Env;
use crate::report::Report;
use crate::{bench, demo, experiments};

/// Reproduces the experiments of the Redis distributed-locks tutorial against
/// real servers, and checks the final balance against what was accepted.
///
/// Without --redis-url (or REDIS_URL) a throwaway redis-server is started on
/// a free loopback port and stopped on exit.
#[derive(Debug, Parser)]
#[command(name = "leasehold", version, about, long_about)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) global: Global,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Flags every experiment takes.
#[derive(Debug, Args)]
pub(crate) struct Global {
    /// Redis to run against, e.g. redis://127.0.0.1:6379/ [default: a
    /// throwaway local redis-server]
    #[arg(long, env = "REDIS_URL", hide_env_values = true, global = true)]
    pub(crate) redis_url: Option<String>,

    /// How many times to run the experiment.
    #[arg(long, default_value_t = 1, global = true, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) runs: u32,

    /// Print one JSON object per run instead of the check line.
    #[arg(long, global = true)]
    pub(crate) json: bool,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Step 1: concurrent spenders with no lock lose updates (shows BROKEN).
    Race(SpendArgs),
    /// Step 2: the same spenders under the lease lock (shows OK, no key left).
    Lock(LockArgs),
    /// Step 4: 50 callers with exponential backoff (thundering herd), full
    /// jitter, or hand-off mode; prints how many gave up.
    Backoff(BackoffArgs),
    /// Performance benchmarks (build with --release); see BENCHMARKS.md.
    #[command(subcommand)]
    Bench(bench::Bench),
    /// Runs every experiment in tutorial order and checks each shows what the
    /// tutorial shows; exits non-zero if one does not.
    Demo,
}

/// The wallet workload shared by the experiments.
#[derive(Debug, Clone, Args)]
pub(crate) struct SpendArgs {
    /// Concurrent spenders, all released at the same moment.
    #[arg(short = 'n', long = "callers", default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(crate) callers: u32,
    /// Amount each spender tries to spend.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(i64).range(1..))]
    pub(crate) amount: i64,
    /// Starting balance.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i64).range(0..))]
    pub(crate) initial: i64,
    /// Time spent between reading the balance and writing it back.
    #[arg(long, default_value = "2ms", value_parser = parse_duration)]
    pub(crate) work: Duration,
}

/// Flags of the locked experiment.
#[derive(Debug, Clone, Args)]
pub(crate) struct LockArgs {
    #[command(flatten)]
    pub(crate) spend: SpendArgs,
    /// Lease TTL (at least 1ms).
    #[arg(long, default_value = "2s", value_parser = parse_ttl)]
    pub(crate) ttl: Duration,
    /// How long each spender waits for the lock before giving up.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub(crate) wait: Duration,
}

/// Flags of the backoff experiment.
#[derive(Debug, Clone, Args)]
pub(crate) struct BackoffArgs {
    #[command(flatten)]
    pub(crate) lock: LockArgs,
    /// Randomise each wait: full jitter, a random wait in [1ms, d + 1ms).
    #[arg(long, conflicts_with = "handoff")]
    pub(crate) jitter: bool,
    /// Shortest backoff.
    #[arg(long, default_value = "16ms", value_parser = parse_duration)]
    pub(crate) min: Duration,
    /// Longest backoff.
    #[arg(long, default_value = "128ms", value_parser = parse_duration)]
    pub(crate) max: Duration,
    /// Wait in a FIFO queue and be handed the lock on release (no polling).
    #[arg(long)]
    pub(crate) handoff: bool,
}

impl Default for BackoffArgs {
    fn default() -> Self {
        BackoffArgs {
            lock: LockArgs::default(),
            jitter: false,
            min: Duration::from_millis(16),
            max: Duration::from_millis(128),
            handoff: false,
        }
    }
}

/// Parses `2ms`, `1.5s`, `100ms`, `2m`.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|err| format!("{err} (examples: 2ms, 1.5s, 100ms)"))
}

/// A duration that is also a valid lease TTL.
pub(crate) fn parse_ttl(text: &str) -> Result<Duration, String> {
    let ttl = parse_duration(text)?;
    if ttl < Duration::from_millis(1) || ttl > leasehold::MAX_TTL {
        return Err(format!(
            "invalid lock ttl {text}: must be at least 1ms and at most {}",
            humantime::format_duration(leasehold::MAX_TTL)
        ));
    }
    Ok(ttl)
}

impl Default for SpendArgs {
    fn default() -> Self {
        SpendArgs {
            callers: 50,
            amount: 10,
            initial: 100,
            work: Duration::from_millis(2),
        }
    }
}

impl Default for LockArgs {
    fn default() -> Self {
        LockArgs {
            spend: SpendArgs::default(),
            ttl: Duration::from_secs(2),
            wait: Duration::from_secs(5),
        }
    }
}

/// Runs the command; the exit code says whether it showed what it should.
pub(crate) async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let env = Env::connect(&cli.global).await?;
    match &cli.command {
        Command::Demo => demo::run(&env).await,
        Command::Bench(bench::Bench::Contention(args)) => {
            bench::contention::run(&env, args, cli.global.json).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(bench::Bench::Uncontended(args)) => {
            bench::uncontended::run(&env, args, cli.global.json).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Race(args) => repeat(&cli.global, || experiments::race::run(&env, args)).await,
        Command::Lock(args) => repeat(&cli.global, || experiments::lock::run(&env, args)).await,
        Command::Backoff(args) => {
            repeat(&cli.global, || experiments::backoff::run(&env, args)).await
        }
    }
}

/// Runs one experiment `--runs` times, printing each run as it ends.
async fn repeat<F, Fut>(global: &Global, mut once: F) -> anyhow::Result<ExitCode>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Report>>,
{
    let (mut ok, mut errors) = (0, 0);
    for run in 1..=global.runs {
        let report = once().await?.with_run(run);
        ok += u32::from(report.ok);
        errors += report.errors;
        report.print(global.json);
    }
    if global.runs > 1 && !global.json {
        println!("runs={} OK={} BROKEN={}", global.runs, ok, global.runs - ok);
    }
    if errors > 0 {
        eprintln!(
            "leasehold: {errors} callers failed with an error; the check above is not trustworthy"
        );
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}
