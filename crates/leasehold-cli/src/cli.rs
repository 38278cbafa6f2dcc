//! Flags, parsed into validated settings before any work starts.
//!
//! Each subcommand lists only the flags it uses. Its flags come in groups,
//! flattened into the subcommand (and shown under their own heading in its
//! `--help`):
//!
//! - the workload (`SpendArgs`, `LockArgs`, ...): what the experiment does;
//! - connection flags: [`RedisFlags`] for the Redis the experiment runs
//!   against (the place for TLS flags too), [`DatabaseFlags`] for
//!   PostgreSQL;
//! - [`RunFlags`]: how often to run and how to report (`--runs`, and
//!   [`OutputFlags`]' `--json`, which `demo` and `bench` take alone).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::env::{Database, Env};
use crate::progress::note;
use crate::report::Report;
use crate::{bench, demo, experiments, metrics};

/// The exit codes, as every `--help` shows them.
macro_rules! exit_codes {
    () => {
        "Exit codes:
  0    every run OK (and, for demo, every step as the tutorial shows)
  1    a run BROKEN, or a demo step not as the tutorial shows
  2    usage: bad flags or flags that do not go together
  3    a server error: Redis or PostgreSQL unreachable, refused, or failing mid-run
  130  interrupted (Ctrl-C/SIGINT or SIGTERM): the throwaway servers it started
       are stopped first (a paused one too)"
    };
}
pub(crate) use exit_codes;

/// What the experiments on the wallet tables do to PostgreSQL.
macro_rules! wallet_tables {
    () => {
        "  PostgreSQL (--database-url, or a throwaway server started for it):
    creates the tables wallets, wallet_ledger and leasehold_fences if
    missing; resets wallet 42 (starting balance, fence 0) and deletes its
    wallet_ledger rows."
    };
}

/// Reproduces the experiments of the Redis distributed-locks tutorial against
/// real servers, and checks the final balance against what was accepted.
///
/// Without --redis-url (or REDIS_URL) a throwaway redis-server is started on
/// a free loopback port and stopped on exit; likewise PostgreSQL without
/// --database-url (or DATABASE_URL), for the experiments that need it. Each
/// subcommand's --help says which keys and tables it changes.
#[derive(Debug, Parser)]
#[command(
    name = "leasehold",
    version,
    about,
    long_about,
    after_help = exit_codes!()
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Exit code 1: a run BROKEN, or a demo step not as the tutorial shows.
pub(crate) const BROKEN: u8 = 1;
/// Exit code 2: bad flags or flags that do not go together.
pub(crate) const USAGE: u8 = 2;
/// Exit code 3: a server error.
pub(crate) const SERVER_ERROR: u8 = 3;
/// Exit code 130 (128 + SIGINT): interrupted by SIGINT or SIGTERM.
pub(crate) const INTERRUPTED: u8 = 130;

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

/// Connection flags for the Redis an experiment runs against. (TLS flags
/// for that connection belong here too.)
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Redis connection")]
pub(crate) struct RedisFlags {
    /// Redis to run against, e.g. redis://user:password@127.0.0.1:6379/
    /// [default: a throwaway local redis-server]
    #[arg(long, env = "REDIS_URL", hide_env_values = true)]
    pub(crate) redis_url: Option<String>,
    /// CA certificates (PEM) to verify a rediss:// server against
    /// [default: the system's trusted roots]
    #[arg(long, value_name = "FILE", env = "LEASEHOLD_TLS_CA")]
    pub(crate) tls_ca: Option<PathBuf>,
    /// Client certificate (PEM) for a rediss:// server that asks for one;
    /// needs --tls-key
    #[arg(
        long,
        value_name = "FILE",
        env = "LEASEHOLD_TLS_CERT",
        requires = "tls_key"
    )]
    pub(crate) tls_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM); needs --tls-cert
    #[arg(
        long,
        value_name = "FILE",
        env = "LEASEHOLD_TLS_KEY",
        requires = "tls_cert"
    )]
    pub(crate) tls_key: Option<PathBuf>,
}

impl RedisFlags {
    /// The redis-rs client for `url`, over TLS with the flags' files for a
    /// `rediss://` URL. TLS files given with a `redis://` URL are a usage
    /// error rather than silently unused.
    pub(crate) fn client(&self, url: &str) -> anyhow::Result<redis::Client> {
        let tls_files = self.tls_ca.is_some() || self.tls_cert.is_some();
        if tls_files && !url.starts_with("rediss://") {
            return Err(Usage(
                "--tls-ca, --tls-cert and --tls-key need a rediss:// URL".to_owned(),
            )
            .into());
        }
        let mut files = leasehold::tls::TlsFiles::new();
        if let Some(ca) = &self.tls_ca {
            files = files.ca(ca);
        }
        if let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) {
            files = files.cert(cert).key(key);
        }
        Ok(leasehold::tls::client(url, &files)?)
    }
}

/// Connection flags for PostgreSQL.
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "PostgreSQL connection")]
pub(crate) struct DatabaseFlags {
    /// PostgreSQL to run against, e.g.
    /// postgres://user:password@127.0.0.1:5432/db [default: a throwaway
    /// local postgres]
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub(crate) database_url: Option<String>,
}

/// How output is printed.
#[derive(Debug, Clone, Copy, Default, Args)]
pub(crate) struct OutputFlags {
    /// Print JSON (one object per line) instead of text; no progress bar.
    #[arg(long)]
    pub(crate) json: bool,
    /// Serve the library's metrics as Prometheus text on ADDR (host:port,
    /// e.g. 127.0.0.1:9898, any path) while the run lasts. bench records
    /// metrics only when this is given (a recorder costs time).
    #[arg(long, value_name = "ADDR", env = "LEASEHOLD_METRICS_ADDR")]
    pub(crate) metrics_addr: Option<SocketAddr>,
}

/// How an experiment is run and reported.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Run")]
pub(crate) struct RunFlags {
    /// How many times to run the experiment.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) runs: u32,
    #[command(flatten)]
    pub(crate) output: OutputFlags,
}

/// The servers of an experiment that runs on one Redis and PostgreSQL.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct RedisAndDatabase {
    #[command(flatten)]
    pub(crate) redis: RedisFlags,
    #[command(flatten)]
    pub(crate) database: DatabaseFlags,
}

/// The servers of an experiment that starts its own redis-servers (it
/// pauses or kills them) and uses PostgreSQL.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct OwnRedis {
    #[command(flatten)]
    pub(crate) database: DatabaseFlags,
    /// Accepted so that scripts passing it to every subcommand keep
    /// working, and ignored with a note; not listed in --help.
    #[arg(long, env = "REDIS_URL", hide = true, hide_env = true)]
    pub(crate) redis_url: Option<String>,
}

impl OwnRedis {
    fn warn_ignored_redis_url(&self) {
        if self.redis_url.is_some() {
            note!(
                "leasehold: --redis-url is ignored here: this experiment pauses or kills servers, so it starts its own"
            );
        }
    }
}

/// One experiment's flags: its workload `W`, its servers `S`, how it runs.
#[derive(Debug, Clone, Args)]
pub(crate) struct Experiment<W: Args, S: Args> {
    #[command(flatten)]
    pub(crate) workload: W,
    #[command(flatten)]
    pub(crate) servers: S,
    #[command(flatten)]
    pub(crate) run: RunFlags,
}

/// Flags of `demo`.
#[derive(Debug, Clone, Default, Args)]
pub(crate) struct DemoArgs {
    #[command(flatten)]
    pub(crate) output: OutputFlags,
    #[command(flatten)]
    pub(crate) servers: RedisAndDatabase,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Step 1: concurrent spenders with no lock lose updates (shows BROKEN).
    #[command(after_help = concat!(
        "What it changes (on --redis-url, or a throwaway redis-server):
  Redis: overwrites wallet:42:balance.

",
        exit_codes!()
    ))]
    Race(Experiment<SpendArgs, RedisFlags>),
    /// Step 2: the same spenders under the lease lock (shows OK, no key left).
    #[command(after_help = concat!(
        "What it changes (on --redis-url, or a throwaway redis-server):
  Redis: overwrites wallet:42:balance; deletes lock:wallet:42 first (a lock
    someone holds there is lost), then takes and releases it.

",
        exit_codes!()
    ))]
    Lock(Experiment<LockArgs, RedisFlags>),
    /// Step 3: work longer than the lease's TTL (shows BROKEN), and the same
    /// with --watchdog (refresh every ttl/3, cancel lost work: shows OK).
    #[command(after_help = concat!(
        "What it changes (on --redis-url, or a throwaway redis-server):
  Redis: overwrites wallet:42:balance; deletes lock:wallet:42 first (a lock
    someone holds there is lost), then takes and releases it.

",
        exit_codes!()
    ))]
    Ttl(Experiment<TtlArgs, RedisFlags>),
    /// Step 4: 50 callers with exponential backoff (thundering herd), full
    /// jitter, or hand-off mode; prints how many gave up.
    #[command(after_help = concat!(
        "What it changes (on --redis-url, or a throwaway redis-server):
  Redis: overwrites wallet:42:balance; deletes lock:wallet:42,
    lock:wallet:42:waitq and lock:wallet:42:waiters first, then takes and
    releases lock:wallet:42 (with --handoff, waiters may queue in the other
    two, and releases publish on leasehold:handoff:* channels). Reads INFO cpu if the user
    may (redis_cpu_ms is null otherwise).

",
        exit_codes!()
    ))]
    Backoff(Experiment<BackoffArgs, RedisFlags>),
    /// Step 5: a holder paused past its lease writes late; PostgreSQL refuses
    /// its fencing token (shows OK; --unfenced shows the lost update, BROKEN).
    #[command(after_help = concat!(
        "What it changes:
  Redis (--redis-url, or a throwaway redis-server): sets the fencing
    counter fence:{wallet:42} to 32; deletes lock:{wallet:42} first (a lock
    someone holds there is lost), then takes and releases it twice.
",
        wallet_tables!(),
        "\n\n",
        exit_codes!()
    ))]
    Fencing(Experiment<FencingArgs, RedisAndDatabase>),
    /// Step 6: spenders on the fenced lock with conditional writes in
    /// PostgreSQL, checked against the balance and the ledger.
    #[command(after_help = concat!(
        "What it changes:
  Redis (--redis-url, or a throwaway redis-server), every mode: deletes
    lock:{wallet:42} and its fencing counter fence:{wallet:42} first (the
    next token is 1; a lock someone holds there is lost); fenced, guard and
    cas then take and release the lock, raising the counter.
",
        wallet_tables!(),
        "
    --mode guard also deletes the leasehold_fences row fence:{wallet:42}.

",
        exit_codes!()
    ))]
    Verify(Experiment<VerifyArgs, RedisAndDatabase>),
    /// Safety: a failover hands the same lock to two holders (async
    /// replication); PostgreSQL's check keeps the balance right (OK).
    /// --unfenced shows the lost update (BROKEN); --wait-replicas 1 refuses
    /// the unreplicated lock (OK).
    ///
    /// Always starts its own throwaway primary and replica, because it kills
    /// the primary; it takes no --redis-url.
    #[command(after_help = concat!(
        "What it changes:
  Redis: none of yours: its own throwaway primary and replica (killed at
    the end) hold lock:{wallet:42} and fence:{wallet:42}.
",
        wallet_tables!(),
        "\n\n",
        exit_codes!()
    ))]
    Failover(Experiment<FailoverArgs, OwnRedis>),
    /// Redlock under load: spenders on a quorum of 3 or 5 throwaway,
    /// independent redis-servers, one paused or killed mid-run, fenced
    /// check-and-set writes in PostgreSQL.
    ///
    /// Always starts its own throwaway servers, because it pauses or kills
    /// one; it takes no --redis-url.
    #[command(after_help = concat!(
        "What it changes:
  Redis: none of yours: its own 3 or 5 throwaway redis-servers (stopped at
    the end) hold lock:{wallet:42} and fence:{wallet:42}.
",
        wallet_tables!(),
        "\n\n",
        exit_codes!()
    ))]
    Redlock(Experiment<RedlockArgs, OwnRedis>),
    /// Performance benchmarks (build with --release); see BENCHMARKS.md.
    #[command(subcommand)]
    Bench(bench::Bench),
    /// Runs every experiment in tutorial order and checks each shows what the
    /// tutorial shows; exits non-zero if one does not.
    #[command(after_help = concat!(
        "What it changes: what race, lock, ttl, backoff, fencing, verify,
failover and redlock change (see their --help):
  Redis (--redis-url, or a throwaway redis-server): overwrites
    wallet:42:balance; deletes, then takes and releases lock:wallet:42 (and
    its :waitq and :waiters keys) and lock:{wallet:42}; resets the fencing
    counter fence:{wallet:42}. failover and redlock start their own
    redis-servers.
",
        wallet_tables!(),
        "
    Also deletes the leasehold_fences row fence:{wallet:42}.

",
        exit_codes!()
    ))]
    Demo(DemoArgs),
    /// The fault matrix: every lock mode under every fault, worker
    /// processes debiting wallets, each run's history checked (lost or
    /// duplicated debits, double holders, stale writes refused, recovery).
    ///
    /// Starts its own throwaway redis-servers (behind a fault proxy) and
    /// PostgreSQL: it pauses, kills and fails them over. Exits 0 when every
    /// safe mode held and every negative control was caught.
    #[command(after_help = concat!(
        "What it changes:
  Servers: none of yours: its own throwaway redis-servers and postgres
    (stopped at the end). With --report DIR, writes one .jsonl history and
    one .html timeline per run into DIR.
  Exit code 1: a safe mode showed a violation, or a negative control
    showed none (the checker would not be trusted).

",
        exit_codes!()
    ))]
    Chaos(crate::chaos::ChaosArgs),
}

impl Cli {
    /// Whether the output is JSON (and so drawn without progress bars).
    pub(crate) fn json(&self) -> bool {
        self.output().json
    }

    /// How the subcommand prints and exposes its metrics.
    pub(crate) fn output(&self) -> OutputFlags {
        match &self.command {
            Command::Race(e) => e.run.output,
            Command::Lock(e) => e.run.output,
            Command::Ttl(e) => e.run.output,
            Command::Backoff(e) => e.run.output,
            Command::Fencing(e) => e.run.output,
            Command::Verify(e) => e.run.output,
            Command::Failover(e) => e.run.output,
            Command::Redlock(e) => e.run.output,
            Command::Bench(bench) => bench.output(),
            Command::Demo(args) => args.output,
            Command::Chaos(args) => args.output(),
        }
    }
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
    let output = cli.output();
    // A benchmark measures the library without a recorder unless asked.
    // chaos takes its leases in worker processes, whose metrics it does not
    // gather.
    let unmeasured = matches!(cli.command, Command::Bench(_) | Command::Chaos(_));
    let summary = if output.metrics_addr.is_some() || !unmeasured {
        Some(metrics::install(output.metrics_addr)?)
    } else {
        None
    };
    let started = Instant::now();
    let code = run_command(cli).await?;
    if let Some(summary) = summary
        && started.elapsed() >= LONG_RUN
    {
        summary.print();
    }
    Ok(code)
}

/// How long a run lasts before it ends with a metrics summary (on stderr).
const LONG_RUN: Duration = Duration::from_secs(2);

async fn run_command(cli: Cli) -> anyhow::Result<ExitCode> {
    use experiments::{backoff, failover, fencing, lock, race, redlock, ttl, verify};
    match cli.command {
        Command::Race(e) => {
            let env = Env::connect(&e.servers).await?;
            repeat(&e.run, || race::run(&env, &e.workload)).await
        }
        Command::Lock(e) => {
            let env = Env::connect(&e.servers).await?;
            repeat(&e.run, || lock::run(&env, &e.workload)).await
        }
        Command::Ttl(e) => {
            let env = Env::connect(&e.servers).await?;
            repeat(&e.run, || ttl::run(&env, &e.workload)).await
        }
        Command::Backoff(e) => {
            let env = Env::connect(&e.servers).await?;
            repeat(&e.run, || backoff::run(&env, &e.workload)).await
        }
        Command::Fencing(e) => {
            let env = Env::connect(&e.servers.redis).await?;
            let db = Database::new(&e.servers.database);
            repeat(&e.run, || fencing::run(&env, &db, &e.workload)).await
        }
        Command::Verify(e) => {
            e.workload.mode()?;
            let env = Env::connect(&e.servers.redis).await?;
            let db = Database::new(&e.servers.database);
            repeat(&e.run, || verify::run(&env, &db, &e.workload)).await
        }
        Command::Failover(e) => {
            e.servers.warn_ignored_redis_url();
            let db = Database::new(&e.servers.database);
            repeat(&e.run, || failover::run(&db, &e.workload)).await
        }
        Command::Redlock(e) => {
            e.servers.warn_ignored_redis_url();
            let db = Database::new(&e.servers.database);
            repeat(&e.run, || redlock::run(&db, &e.workload)).await
        }
        Command::Bench(which) => bench::run(which).await,
        Command::Demo(args) => {
            let env = Env::connect(&args.servers.redis).await?;
            let db = Database::new(&args.servers.database);
            demo::run(&env, &db, args.output.json).await
        }
        Command::Chaos(args) => crate::chaos::run(&args).await,
    }
}

/// Runs one experiment `--runs` times, printing each run as it ends.
async fn repeat<F, Fut>(flags: &RunFlags, mut once: F) -> anyhow::Result<ExitCode>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Report>>,
{
    let (runs, json) = (flags.runs, flags.output.json);
    let (mut ok, mut errors) = (0, 0);
    for run in 1..=runs {
        let report = once().await?.with_run(run);
        ok += u32::from(report.ok);
        errors += report.errors;
        report.print(json);
    }
    if runs > 1 && !json {
        println!("runs={} OK={} BROKEN={}", runs, ok, runs - ok);
    }
    if errors > 0 {
        note!(
            "leasehold: {errors} callers failed with an error; the check above is not trustworthy"
        );
        return Ok(ExitCode::from(SERVER_ERROR));
    }
    if ok < runs {
        return Ok(ExitCode::from(BROKEN));
    }
    Ok(ExitCode::SUCCESS)
}
