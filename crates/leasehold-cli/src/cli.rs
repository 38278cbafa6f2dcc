//! Flags, parsed into validated settings before any work starts.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::env::{Database, Env};
use crate::report::Report;
use crate::{bench, demo, experiments};

/// Reproduces the experiments of the Redis distributed-locks tutorial against
/// real servers, and checks the final balance against what was accepted.
///
/// Without --redis-url (or REDIS_URL) a throwaway redis-server is started on
/// a free loopback port and stopped on exit.
#[derive(Debug, Parser)]
#[command(
    name = "leasehold",
    version,
    about,
    long_about,
    after_help = EXIT_CODES
)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) global: Global,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The exit codes, as `--help` shows them.
const EXIT_CODES: &str = "Exit codes:
  0  every run OK (and, for demo, every step as the tutorial shows)
  1  a run BROKEN, or a demo step not as the tutorial shows
  2  usage: bad flags or flags that do not go together
  3  a server error: Redis or PostgreSQL unreachable, refused, or failing mid-run";

/// Exit code 1: a run BROKEN, or a demo step not as the tutorial shows.
pub(crate) const BROKEN: u8 = 1;
/// Exit code 2: bad flags or flags that do not go together.
pub(crate) const USAGE: u8 = 2;
/// Exit code 3: a server error.
pub(crate) const SERVER_ERROR: u8 = 3;

/// A usage error found after parsing (flags that do not go together):
/// exit code 2, like clap's own.
#[derive(Debug)]
pub(crate) struct Usage(pub(crate) String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

/// Flags every experiment takes.
#[derive(Debug, Clone, Args)]
pub(crate) struct Global {
    /// Redis to run against, e.g. redis://127.0.0.1:6379/ [default: a
    /// throwaway local redis-server]
    #[arg(long, env = "REDIS_URL", hide_env_values = true, global = true)]
    pub(crate) redis_url: Option<String>,

    /// PostgreSQL for the experiments that need it (fencing, verify,
    /// failover, redlock), e.g.
    /// postgres://user:password@127.0.0.1:5432/db [default: a throwaway
    /// local postgres, started only when an experiment needs it]
    #[arg(long, env = "DATABASE_URL", hide_env_values = true, global = true)]
    pub(crate) database_url: Option<String>,

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
    /// Step 3: work longer than the lease's TTL (shows BROKEN), and the same
    /// with --watchdog (refresh every ttl/3, cancel lost work: shows OK).
    Ttl(TtlArgs),
    /// Step 4: 50 callers with exponential backoff (thundering herd), full
    /// jitter, or hand-off mode; prints how many gave up.
    Backoff(BackoffArgs),
    /// Step 5: a holder paused past its lease writes late; PostgreSQL refuses
    /// its fencing token (shows OK; --unfenced shows the lost update, BROKEN).
    Fencing(FencingArgs),
    /// Step 6: spenders on the fenced lock with conditional writes in
    /// PostgreSQL, checked against the balance and the ledger.
    Verify(VerifyArgs),
    /// Safety: a failover hands the same lock to two holders (async
    /// replication); PostgreSQL's check keeps the balance right (OK).
    /// --unfenced shows the lost update (BROKEN); --wait-replicas 1 refuses
    /// the unreplicated lock (OK).
    ///
    /// Always starts its own throwaway primary and replica, because it kills
    /// the primary; --redis-url is ignored.
    Failover(FailoverArgs),
    /// Redlock under load: spenders on a quorum of 3 or 5 throwaway,
    /// independent redis-servers, one paused or killed mid-run, fenced
    /// check-and-set writes in PostgreSQL.
    ///
    /// Always starts its own throwaway servers, because it pauses or kills
    /// one; --redis-url is ignored.
    Redlock(RedlockArgs),
    /// Performance benchmarks (build with --release); see BENCHMARKS.md.
    #[command(subcommand)]
    Bench(bench::Bench),
    /// Runs every experiment in tutorial order and checks each shows what the
    /// tutorial shows; exits non-zero if one does not.
    Demo,
    /// The fault matrix: every lock mode under every fault, worker
    /// processes debiting wallets, each run's history checked (lost or
    /// duplicated debits, double holders, stale writes refused, recovery).
    ///
    /// Starts its own throwaway redis-servers (behind a fault proxy) and
    /// PostgreSQL: it pauses, kills and fails them over. Exits 0 when every
    /// safe mode held and every negative control was caught.
    Chaos(crate::chaos::ChaosArgs),
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

/// Flags of the TTL experiment (the tutorial's Step 3).
#[derive(Debug, Clone, Args)]
pub(crate) struct TtlArgs {
    /// Concurrent callers, all released at the same moment.
    #[arg(short = 'n', long = "callers", default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(crate) callers: u32,
    /// Amount each caller tries to spend.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(i64).range(1..))]
    pub(crate) amount: i64,
    /// Starting balance.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i64).range(0..))]
    pub(crate) initial: i64,
    /// Time spent between reading the balance and writing it back.
    #[arg(long, default_value = "300ms", value_parser = parse_duration)]
    pub(crate) work: Duration,
    /// Lease TTL (at least 1ms).
    #[arg(long, default_value = "100ms", value_parser = parse_ttl)]
    pub(crate) ttl: Duration,
    /// How long each caller waits for the lock before giving up.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub(crate) wait: Duration,
    /// Keep each lease with a watchdog (refresh every ttl/3) and cancel the
    /// spend before its write if the lease is lost anyway.
    #[arg(long)]
    pub(crate) watchdog: bool,
}

impl Default for TtlArgs {
    fn default() -> Self {
        TtlArgs {
            callers: 5,
            amount: 10,
            initial: 100,
            work: Duration::from_millis(300),
            ttl: Duration::from_millis(100),
            wait: Duration::from_secs(10),
            watchdog: false,
        }
    }
}

/// Flags of the fencing experiment.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct FencingArgs {
    /// Write without the `fence < $token` check, to show the lost update.
    #[arg(long)]
    pub(crate) unfenced: bool,
}

/// Flags of the failover experiment.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct FailoverArgs {
    /// Have A's acquire wait for this many replicas (`WAIT`), and give the
    /// lock back if fewer acknowledged [default: 0, do not wait]
    #[arg(long, default_value_t = 0, hide_default_value = true)]
    pub(crate) wait_replicas: u32,
    /// Write without the database check (no fence, no check-and-set), to
    /// show the lost update.
    #[arg(long)]
    pub(crate) unfenced: bool,
}

/// The fault the redlock experiment injects mid-run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub(crate) enum Fault {
    /// Stop one node with SIGSTOP: it keeps its connections but answers
    /// nothing (a stopped VM, a long GC pause).
    #[default]
    Pause,
    /// Kill one node with SIGKILL: connections are refused.
    Kill,
    /// No fault: the baseline.
    None,
}

impl Fault {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Fault::Pause => "pause",
            Fault::Kill => "kill",
            Fault::None => "none",
        }
    }
}

/// Flags of the redlock experiment.
#[derive(Debug, Clone, Args)]
pub(crate) struct RedlockArgs {
    #[command(flatten)]
    pub(crate) spend: SpendArgs,
    /// Independent redis-servers in the quorum.
    #[arg(long, default_value_t = 3, value_parser = parse_nodes)]
    pub(crate) nodes: usize,
    /// What happens to node 1 once the first acquisitions are through.
    #[arg(long, value_enum, default_value_t = Fault::Pause)]
    pub(crate) fault: Fault,
    /// How many acquisitions to let through before the fault.
    #[arg(long, default_value_t = 10)]
    pub(crate) fault_after: u64,
    /// Lease TTL (at least 1ms).
    #[arg(long, default_value = "2s", value_parser = parse_ttl)]
    pub(crate) ttl: Duration,
    /// How long each spender waits for the lock before giving up.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub(crate) wait: Duration,
}

impl Default for RedlockArgs {
    fn default() -> Self {
        RedlockArgs {
            spend: SpendArgs::default(),
            nodes: 3,
            fault: Fault::Pause,
            fault_after: 10,
            ttl: Duration::from_secs(2),
            wait: Duration::from_secs(30),
        }
    }
}

/// How the verify experiment's spenders write the balance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub(crate) enum WriteMode {
    /// Fenced lock, then `UPDATE ... WHERE fence < $token`.
    #[default]
    Fenced,
    /// Fenced lock, then a plain read-modify-write inside the fence guard
    /// (`leasehold_pg::guard`, first in the transaction): no version check
    /// on the wallet row.
    Guard,
    /// Fenced lock, then `... AND fence = $read_fence` too (check-and-set).
    Cas,
    /// No Redis lock: `SELECT ... FOR UPDATE` in a transaction.
    ForUpdate,
    /// No Redis lock: one `UPDATE ... SET balance = balance - $1 WHERE
    /// balance >= $1`.
    Single,
    /// No lock and no check: the negative control (shows BROKEN).
    None,
}

impl WriteMode {
    pub(crate) fn name(self) -> &'static str {
        match self {
            WriteMode::Fenced => "fenced",
            WriteMode::Guard => "guard",
            WriteMode::Cas => "cas",
            WriteMode::ForUpdate => "for-update",
            WriteMode::Single => "single",
            WriteMode::None => "none",
        }
    }

    /// The database-only modes and the negative control take no Redis lock.
    pub(crate) fn uses_redis_lock(self) -> bool {
        matches!(self, WriteMode::Fenced | WriteMode::Guard | WriteMode::Cas)
    }
}

/// Flags of the verify experiment.
#[derive(Debug, Clone, Args)]
pub(crate) struct VerifyArgs {
    #[command(flatten)]
    pub(crate) spend: SpendArgs,
    /// Lease TTL (at least 1ms); 1ms breaks the lock on purpose.
    #[arg(long, default_value = "2s", value_parser = parse_ttl)]
    pub(crate) ttl: Duration,
    /// How long each spender waits for the lock before giving up.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub(crate) wait: Duration,
    /// Also require the fence read to be unchanged: the same as --mode cas.
    #[arg(long)]
    pub(crate) same_version: bool,
    /// How spenders write: fenced, guard and cas take the fenced Redis lock
    /// (guard also resets wallet 42's row in leasehold_fences); for-update
    /// and single rely on PostgreSQL alone (no Redis lock); none takes no
    /// lock and checks nothing.
    #[arg(long, value_enum, default_value_t = WriteMode::Fenced)]
    pub(crate) mode: WriteMode,
}

impl VerifyArgs {
    /// The mode, with --same-version folded in.
    pub(crate) fn mode(&self) -> anyhow::Result<WriteMode> {
        match (self.same_version, self.mode) {
            (false, mode) => Ok(mode),
            (true, WriteMode::Fenced | WriteMode::Cas) => Ok(WriteMode::Cas),
            (true, other) => Err(Usage(format!(
                "--same-version means --mode cas; it cannot be combined with --mode {}",
                other.name()
            ))
            .into()),
        }
    }
}

impl Default for VerifyArgs {
    fn default() -> Self {
        VerifyArgs {
            spend: SpendArgs::default(),
            ttl: Duration::from_secs(2),
            wait: Duration::from_secs(5),
            same_version: false,
            mode: WriteMode::Fenced,
        }
    }
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
    /// Wait in a FIFO queue and be handed the lock on release (no polling;
    /// the 50 callers share one hand-off locker, so leases pass in process).
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

/// A Redlock quorum size: 3 or 5 (an even number tolerates no more
/// failures than the odd number below it).
pub(crate) fn parse_nodes(text: &str) -> Result<usize, String> {
    match text {
        "3" => Ok(3),
        "5" => Ok(5),
        _ => Err(format!("{text} nodes: use 3 or 5")),
    }
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
    if let Command::Verify(args) = &cli.command {
        args.mode()?;
    }
    // These two pause or kill Redis servers, so they start their own and
    // need only the database: no Redis connection (or throwaway server) here.
    let standalone = Database::new(&cli.global);
    match &cli.command {
        Command::Chaos(args) => {
            return crate::chaos::run(args, cli.global.runs, cli.global.json).await;
        }
        Command::Failover(args) => {
            warn_ignored_redis_url(&cli.global);
            return repeat(&cli.global, || {
                experiments::failover::run(&standalone, args)
            })
            .await;
        }
        Command::Redlock(args) => {
            warn_ignored_redis_url(&cli.global);
            return repeat(&cli.global, || experiments::redlock::run(&standalone, args)).await;
        }
        _ => {}
    }
    let env = Env::connect(&cli.global).await?;
    match &cli.command {
        Command::Demo => demo::run(&env, cli.global.json).await,
        Command::Bench(bench::Bench::Contention(args)) => {
            bench::contention::run(&env, args, cli.global.json).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(bench::Bench::Guard(args)) => {
            bench::guard::run(&env, args, cli.global.json).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(bench::Bench::Uncontended(args)) => {
            bench::uncontended::run(&env, args, cli.global.json).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Race(args) => repeat(&cli.global, || experiments::race::run(&env, args)).await,
        Command::Lock(args) => repeat(&cli.global, || experiments::lock::run(&env, args)).await,
        Command::Ttl(args) => repeat(&cli.global, || experiments::ttl::run(&env, args)).await,
        Command::Fencing(args) => {
            repeat(&cli.global, || experiments::fencing::run(&env, args)).await
        }
        Command::Verify(args) => repeat(&cli.global, || experiments::verify::run(&env, args)).await,
        Command::Failover(args) => {
            repeat(&cli.global, || {
                experiments::failover::run(env.database(), args)
            })
            .await
        }
        Command::Redlock(args) => {
            repeat(&cli.global, || {
                experiments::redlock::run(env.database(), args)
            })
            .await
        }
        Command::Backoff(args) => {
            repeat(&cli.global, || experiments::backoff::run(&env, args)).await
        }
        Command::Chaos(args) => crate::chaos::run(args, cli.global.runs, cli.global.json).await,
    }
}

fn warn_ignored_redis_url(global: &Global) {
    if global.redis_url.is_some() {
        eprintln!(
            "leasehold: --redis-url is ignored here: this experiment pauses or kills servers, so it starts its own"
        );
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
        return Ok(ExitCode::from(SERVER_ERROR));
    }
    if ok < global.runs {
        return Ok(ExitCode::from(BROKEN));
    }
    Ok(ExitCode::SUCCESS)
}
