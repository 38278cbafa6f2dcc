//! Flags, parsed into validated settings before any work starts.
//!
//! Each subcommand lists only the flags it uses. Its flags come in groups,
//! flattened into the subcommand (and shown under their own heading in its
//! `--help`):
//!
//! - the workload (`SpendArgs`, `LockArgs`, ...): what the experiment does;
//! - connection flags: [`RedisFlags`] for the Redis the experiment runs
//!   against (the place for TLS flags too), [`DatabaseFlags`] for
//!   PostgreSQL, both declared in `env` beside the connections they open;
//! - [`RunFlags`]: how often to run and how to report (`--runs`, and
//!   [`OutputFlags`]' `--json`, which `demo` and `bench` take alone).
//!
//! This module only describes and checks flags: the subcommands (`demo`,
//! `experiments`, `bench`, `chaos`) take the types declared here, and
//! `main` is the one place that runs them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::{Deserialize, Serialize};

use crate::env::{DatabaseFlags, RedisFlags};
use crate::exit::Usage;
use crate::progress::note;

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

/// The end of `bench consensus`'s and `bench etcd`'s `--help`.
macro_rules! consensus_after_help {
    () => {
        concat!(
            "What it changes (on --redis-url, or a throwaway redis-server):
  Redis: takes and releases lock:bench:etcd:* and lock:bench:contention
    (its hand-off keys :waitq and :waiters too), overwrites
    wallet:42:balance.
  etcd, ZooKeeper: none of yours: their own throwaway clusters (stopped at
    the end).

",
            exit_codes!()
        )
    };
}

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
    pub(crate) fn warn_ignored_redis_url(&self) {
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
    two, and releases spublish on leasehold:handoff:* shard channels). Reads INFO cpu if the user
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
    Bench(Bench),
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
    /// PostgreSQL: it pauses, kills and fails them over. Or, with
    /// --redis-url, runs the faults that need no control of the process
    /// against your own Redis (rediss:// with a CA and client certificates,
    /// an ACL user, a chosen proxy port or none). The etcd and ZooKeeper
    /// modes (named with --modes) start a throwaway 3-member etcd cluster
    /// or 3-server ZooKeeper ensemble and kill, pause and restart its
    /// members. Each cell says what was exercised (held with N double holders absorbed, never broke,
    /// inconclusive, broken). Exits 0 when no safe cell is broken or
    /// inconclusive and every negative control was caught.
    #[command(after_help = concat!(
        "What it changes:
  Servers: without --redis-url, none of yours: its own throwaway
    redis-servers and postgres (stopped at the end). With --redis-url, your
    Redis too: it deletes and expires lock:{wallet:N} keys, raises
    fence:{wallet:N}, and the chosen faults may run SCRIPT FLUSH, CLIENT
    KILL and CLIENT PAUSE (see --redis-url); postgres stays throwaway.
    With --etcd-endpoints, your etcd too: the etcd modes write and delete
    keys under leasehold/ (and leasehold-rpc/), and etcd-revoke revokes
    every lease that holds a key under leasehold.
    ZooKeeper: none of yours: the zookeeper modes start their own
    throwaway ensemble (stopped at the end); zookeeper-node-delete
    deletes lock nodes under /leasehold there.
    With --report DIR, writes one .jsonl history and one .html timeline
    per run into DIR.
  Exit code 1: a safe mode showed a violation, or a negative control
    showed none (the checker would not be trusted, and a safe cell with
    double holders under its fault is inconclusive), or a run returned an
    error to a caller under faults shorter than the wait (any mode: the
    errors column).

",
        exit_codes!()
    ))]
    Chaos(Box<ChaosArgs>),
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

/// Which bench to run.
#[derive(Debug, Subcommand)]
pub(crate) enum Bench {
    /// Many callers on one key, for each way of waiting: polling with
    /// exponential backoff, with full jitter, with jitter tuned for speed,
    /// and hand-off (relayed in process, over two lockers, strict FIFO,
    /// wake); then tuned polling and hand-off on a Redis Cluster.
    #[command(after_help = concat!(
        "What it changes (on --redis-url, or a throwaway redis-server):
  Redis: overwrites wallet:42:balance; deletes, then takes and releases
    lock:bench:contention (hand-off modes queue in its :waitq and :waiters
    keys and spublish on leasehold:handoff:* shard channels). Reads INFO cpu if
    the user may (the cpu figures are null otherwise).
  Redis Cluster (on --cluster-url, or a throwaway cluster of 3 masters when
    no --redis-url is given): the same with the key lock:{bench:contention}
    (its queue keys and shard channels in its slot); INFO cpu on every master.

",
        exit_codes!()
    ))]
    Contention(ContentionArgs),
    /// Acquire+release pairs per second with no contention, against the
    /// floor: a bare `SET NX PX` + `EVALSHA` loop on one multiplexed
    /// connection, sequentially and with --tasks tasks.
    #[command(after_help = concat!(
        "What it changes (on --redis-url, or a throwaway redis-server):
  Redis: takes and releases lock:bench:u:lib:* and lock:bench:u:floor:*
    (none is left behind unless a run fails); loads a release script
    (SCRIPT LOAD).

",
        exit_codes!()
    ))]
    Uncontended(UncontendedArgs),
    /// What a lease costs on etcd against Redis, on loopback: `bench
    /// consensus` with the Redis and etcd ways (ZooKeeper's when named
    /// with --ways).
    ///
    /// Starts a throwaway etcd cluster of 3 members (and one of 1 for the
    /// etcd-1 way); etcd comes from PATH.
    #[command(after_help = consensus_after_help!())]
    Etcd(ConsensusBenchArgs),
    /// What a lease costs on etcd and ZooKeeper against Redis, on
    /// loopback: acquire+release latency and pairs per second with no
    /// contention (one task, then --tasks tasks), and the tutorial's
    /// contention case (-n callers on one key, a wallet in Redis); each
    /// way side by side in every round. For the etcd and ZooKeeper ways,
    /// the fsyncs their members' logs paid per lease, and how long one
    /// took.
    ///
    /// Starts a throwaway etcd cluster of 3 members (and one of 1 for the
    /// etcd-1 way; etcd from PATH) and a ZooKeeper ensemble of 3 (and one
    /// of 1 for zookeeper-1; java and Debian's zookeeper jars) with
    /// ZooKeeper's own tick (2 s, so the 10 s sessions the bench's TTLs
    /// need) and its own durability (forceSync=yes).
    #[command(after_help = consensus_after_help!())]
    Consensus(ConsensusBenchArgs),
    /// What a lease costs on PostgreSQL (`PgLocker`) against PostgreSQL's
    /// own advisory lock (sqlx's `PgAdvisoryLock`, the baseline) and Redis
    /// (polling and hand-off), on loopback: acquire+release latency and
    /// pairs per second with no contention (one task, then --tasks tasks),
    /// and the tutorial's contention case (-n callers on one key, a wallet
    /// in Redis); each way side by side in every round. For the PostgreSQL
    /// ways, what one lease costs the database (statements, WAL bytes,
    /// dead tuples), measured around the one-task and tutorial cases; then
    /// --hot-leases leases on one key and what they leave in the lease
    /// table.
    ///
    /// Starts a throwaway postgres (from PATH or /usr/lib/postgresql) with
    /// fsync, full_page_writes and synchronous_commit on, and
    /// pg_stat_statements loaded.
    #[command(after_help = concat!(
        "What it changes (on --redis-url, or a throwaway redis-server):
  Redis: takes and releases lock:bench:pg:* and lock:bench:contention
    (its hand-off keys :waitq and :waiters too), overwrites
    wallet:42:balance.
  postgres: none of yours: its own throwaway server (stopped at the end)
    holds the lease table and the advisory locks.

",
        exit_codes!()
    ))]
    Pg(PgBenchArgs),
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
    /// How soon a new leader takes over an election: 3 candidate processes
    /// per way (polling, hand-off, quorum); the leader resigns, or is
    /// stopped (SIGSTOP) and replaced when its term's lease runs out; under
    /// a Redis restart and killed connections, no error may reach them.
    ///
    /// Always starts its own throwaway redis-servers; it takes no
    /// --redis-url.
    #[command(after_help = concat!(
        "What it changes:
  Redis: none of yours: its own throwaway redis-servers (3 for the quorum
    way, 1 for each other; stopped at the end) hold
    lock:{leader:bench-<way>}, its fence:{leader:bench-<way>} counter and
    leader record (the hand-off way also its :waitq and :waiters keys);
    the fault rounds restart them and kill their clients' connections.
  Processes: its own candidate processes (this binary), stopped with
    SIGSTOP and killed.

",
        exit_codes!()
    ))]
    Leader(LeaderArgs),
    /// A candidate process (started by `bench leader` itself; reads its
    /// spec on stdin).
    #[command(hide = true)]
    LeaderCandidate,
}

impl Bench {
    /// How the bench prints.
    pub(crate) fn output(&self) -> OutputFlags {
        match self {
            Bench::Contention(args) => args.output,
            Bench::Uncontended(args) => args.output,
            Bench::Etcd(args) | Bench::Consensus(args) => args.output,
            Bench::Pg(args) => args.output,
            Bench::Guard(args) => args.output,
            // The leases are taken in candidate processes, whose metrics
            // it does not gather.
            Bench::Leader(args) => OutputFlags {
                json: args.json,
                metrics_addr: None,
            },
            Bench::LeaderCandidate => OutputFlags::default(),
        }
    }
}

/// Flags of `bench leader`.
#[derive(Debug, Clone, Args)]
pub(crate) struct LeaderArgs {
    /// The term's TTL (at least 100ms): a stopped leader is replaced
    /// within it.
    #[arg(long, default_value = "1s", value_parser = parse_term_ttl)]
    pub(crate) ttl: Duration,
    /// Rounds; each measures a resign and a stopped leader of every way.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub(crate) rounds: u32,
    /// The ways of taking the term's lease, comma-separated [default: all]
    #[arg(long, value_enum, value_delimiter = ',')]
    pub(crate) ways: Vec<LeaderWay>,
    /// Skip the fault rounds (a Redis restart and killed connections each
    /// round, counting the errors that reach the candidates).
    #[arg(long)]
    pub(crate) no_faults: bool,
    /// Print JSON (one object per way, then the ratios) instead of text;
    /// no progress bar.
    #[arg(long)]
    pub(crate) json: bool,
}

/// A way of taking an election's lease, as `bench leader` measures it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum LeaderWay {
    /// A `Locker`: followers poll (5 to 15 ms apart).
    Poll,
    /// A `HandoffLocker`: followers queue in Redis; a resign hands over.
    Handoff,
    /// A `Quorum` of 3 independent servers: followers poll every node.
    Quorum,
}

impl LeaderWay {
    pub(crate) const ALL: [LeaderWay; 3] = [LeaderWay::Poll, LeaderWay::Handoff, LeaderWay::Quorum];

    pub(crate) fn name(self) -> &'static str {
        match self {
            LeaderWay::Poll => "poll",
            LeaderWay::Handoff => "handoff",
            LeaderWay::Quorum => "quorum",
        }
    }
}

/// A term's TTL: a lease TTL of at least 100 ms (a shorter one leaves the
/// watchdog, every ttl/3, too little room on a loaded machine).
fn parse_term_ttl(text: &str) -> Result<Duration, String> {
    let ttl = parse_ttl(text)?;
    if ttl < Duration::from_millis(100) {
        return Err(format!("term ttl {text}: must be at least 100ms"));
    }
    Ok(ttl)
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
    /// Round-trip time the proxied runs add (a TCP proxy delaying each
    /// direction by half); 0 skips them.
    #[arg(long, default_value = "1ms", value_parser = parse_duration)]
    pub(crate) latency: Duration,
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
    /// Run the cluster rows on this Redis Cluster: its seed nodes,
    /// comma-separated plain redis:// URLs, e.g.
    /// redis://10.0.0.1:7000,redis://10.0.0.2:7000 [default: a throwaway
    /// local cluster of 3 masters; none when --redis-url is given]
    #[arg(long, value_name = "URLS", value_delimiter = ',')]
    pub(crate) cluster_url: Vec<String>,
    /// Leave out the cluster rows (and start no cluster).
    #[arg(long, conflicts_with = "cluster_url")]
    pub(crate) no_cluster: bool,
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
    /// Concurrent tasks of the throughput-bound run, each on a key of its
    /// own.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub(crate) tasks: u32,
    #[command(flatten)]
    pub(crate) output: OutputFlags,
    #[command(flatten)]
    pub(crate) redis: RedisFlags,
}

/// Flags of `bench consensus` and `bench etcd`.
#[derive(Debug, Clone, Args)]
pub(crate) struct ConsensusBenchArgs {
    /// The ways of taking the lease, comma-separated, in the order they
    /// are reported; ratios are against the first [default: bench
    /// consensus, all; bench etcd, all but the ZooKeeper ways]
    #[arg(long, value_enum, value_delimiter = ',')]
    pub(crate) ways: Vec<ConsensusBenchWay>,
    /// Length of each uncontended measurement.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub(crate) duration: Duration,
    /// Rounds; every figure is the median over rounds, with their spread.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub(crate) rounds: u32,
    /// Concurrent tasks of the uncontended throughput run, each on a key
    /// of its own.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub(crate) tasks: u32,
    /// Concurrent callers on the one key in the contention case.
    #[arg(short = 'n', long = "callers", default_value_t = 50, value_parser = clap::value_parser!(u32).range(2..=100_000))]
    pub(crate) callers: u32,
    /// Time each caller holds the lock in the contention case.
    #[arg(long, default_value = "2ms", value_parser = parse_duration)]
    pub(crate) work: Duration,
    #[command(flatten)]
    pub(crate) output: OutputFlags,
    #[command(flatten)]
    pub(crate) redis: RedisFlags,
}

/// A way of taking a lease, as `bench consensus` measures it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum ConsensusBenchWay {
    /// A `Locker` on the one redis-server, polling as built by default.
    Redis,
    /// A `HandoffLocker` on it as built by default (a FIFO queue, as
    /// etcd's and ZooKeeper's).
    RedisHandOff,
    /// An `EtcdLocker` on a cluster of 3 members.
    Etcd,
    /// An `EtcdLocker` on a cluster of 1 member.
    #[value(name = "etcd-1")]
    Etcd1,
    /// A `ZkLocker` on an ensemble of 3 servers.
    Zookeeper,
    /// A `ZkLocker` on a standalone server.
    #[value(name = "zookeeper-1")]
    Zookeeper1,
}

impl ConsensusBenchWay {
    /// The ways `bench consensus` runs when --ways is not given.
    pub(crate) const ALL: [ConsensusBenchWay; 6] = [
        ConsensusBenchWay::Redis,
        ConsensusBenchWay::RedisHandOff,
        ConsensusBenchWay::Etcd,
        ConsensusBenchWay::Etcd1,
        ConsensusBenchWay::Zookeeper,
        ConsensusBenchWay::Zookeeper1,
    ];

    /// The ways `bench etcd` runs when --ways is not given.
    pub(crate) const ETCD: [ConsensusBenchWay; 4] = [
        ConsensusBenchWay::Redis,
        ConsensusBenchWay::RedisHandOff,
        ConsensusBenchWay::Etcd,
        ConsensusBenchWay::Etcd1,
    ];
}

/// Flags of `bench pg`.
#[derive(Debug, Clone, Args)]
pub(crate) struct PgBenchArgs {
    /// The ways of taking the lease, comma-separated, in the order they
    /// are reported; ratios are against the first [default: all, advisory
    /// first]
    #[arg(long, value_enum, value_delimiter = ',')]
    pub(crate) ways: Vec<PgBenchWay>,
    /// Length of each uncontended measurement.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub(crate) duration: Duration,
    /// Rounds; every figure is the median over rounds, with their spread.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub(crate) rounds: u32,
    /// Concurrent tasks of the uncontended throughput run, each on a key
    /// of its own (the advisory way: each on a connection of its own).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=150))]
    pub(crate) tasks: u32,
    /// Concurrent callers on the one key in the contention case (the
    /// advisory way: each on a connection of its own).
    #[arg(short = 'n', long = "callers", default_value_t = 50, value_parser = clap::value_parser!(u32).range(2..=150))]
    pub(crate) callers: u32,
    /// Time each caller holds the lock in the contention cases.
    #[arg(long, default_value = "2ms", value_parser = parse_duration)]
    pub(crate) work: Duration,
    /// Length of the timed contention case (every caller taking the lock
    /// again and again: its fairness figure).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub(crate) timed: Duration,
    /// Leases taken and released one after another on one key through a
    /// `PgLocker`, after the rounds, to report the lease table's size,
    /// dead tuples and autovacuum runs (a million for the figure in
    /// BENCHMARKS.md); 0 skips it, and so does leaving out the pg way.
    #[arg(long, default_value_t = 10_000)]
    pub(crate) hot_leases: u64,
    #[command(flatten)]
    pub(crate) output: OutputFlags,
    #[command(flatten)]
    pub(crate) redis: RedisFlags,
}

/// A way of taking a lease, as `bench pg` measures it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum PgBenchWay {
    /// PostgreSQL's advisory lock through sqlx's `PgAdvisoryLock`
    /// (`pg_advisory_lock`, `pg_advisory_unlock`), a connection per
    /// caller: the baseline.
    Advisory,
    /// A `PgLocker` (the lease table) as built by default.
    Pg,
    /// A `Locker` on the one redis-server, polling as built by default.
    Redis,
    /// A `HandoffLocker` on it as built by default.
    RedisHandOff,
}

impl PgBenchWay {
    pub(crate) const ALL: [PgBenchWay; 4] = [
        PgBenchWay::Advisory,
        PgBenchWay::Pg,
        PgBenchWay::Redis,
        PgBenchWay::RedisHandOff,
    ];
}

/// `leasehold chaos`'s flags.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct ChaosArgs {
    #[command(subcommand)]
    pub(crate) action: Option<ChaosAction>,
    #[command(flatten)]
    pub(crate) matrix: MatrixArgs,
}

/// What `chaos` does instead of running the matrix.
#[derive(Debug, Subcommand)]
pub(crate) enum ChaosAction {
    /// Re-checks a saved history (a `.jsonl` file of `--report DIR`) and
    /// prints what it shows; exits 1 where `chaos` would have for that run
    /// (a violation, a negative control that caught nothing, an error
    /// returned to a caller under faults shorter than the wait).
    Check {
        /// The history file.
        file: PathBuf,
        /// Print the check as one JSON object.
        #[arg(long)]
        json: bool,
        /// Place the fault windows marked in FILE in the history first
        /// (as `chaos --fault-marks` does), and judge the run under them.
        #[arg(long, value_name = "FILE")]
        fault_marks: Option<PathBuf>,
    },
    /// Appends a fault mark to FILE, stamped with the wall clock: `chaos
    /// mark start redis-stall --file marks.txt` before your own fault,
    /// `chaos mark end redis-stall --file marks.txt` after it; `chaos
    /// --fault-marks marks.txt` then judges its runs under those windows
    /// (docs/chaos.md, "Faults of your own").
    Mark {
        /// `start` or `end`.
        #[arg(value_enum)]
        edge: MarkEdge,
        /// The fault's name: one of --faults' names (redis-stall for a
        /// `CLIENT PAUSE ALL`, etcd-member-pause, net-cut, key-loss...) to
        /// be judged as that fault, any other word for a fault of unknown
        /// effect.
        name: String,
        /// The marks file (created if missing; the line is appended).
        #[arg(long, value_name = "FILE")]
        file: PathBuf,
    },
    /// A worker process (started by `chaos` itself; reads its spec on
    /// stdin).
    #[command(hide = true)]
    Worker,
}

/// A fault mark's edge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum MarkEdge {
    /// The fault starts.
    Start,
    /// The fault ends.
    End,
}

impl ChaosArgs {
    /// How the matrix (or `check`) prints.
    pub(crate) fn output(&self) -> OutputFlags {
        match &self.action {
            Some(ChaosAction::Check { json, .. }) => OutputFlags {
                json: *json,
                metrics_addr: None,
            },
            Some(ChaosAction::Worker | ChaosAction::Mark { .. }) => OutputFlags::default(),
            None => OutputFlags {
                json: self.matrix.json,
                metrics_addr: None,
            },
        }
    }
}

/// The matrix's flags.
#[derive(Debug, Args)]
pub(crate) struct MatrixArgs {
    /// Runs of each mode x fault (run i uses seed + i).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) runs: u32,
    /// Print one JSON object per mode x fault instead of the table; no
    /// progress bar.
    #[arg(long)]
    pub(crate) json: bool,
    /// How long each run lasts.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub(crate) duration: Duration,
    /// The first run's seed (run i uses seed + i): the fault schedule and
    /// the workload follow from it.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// The lock modes (rows), comma-separated [default: all but the etcd,
    /// ZooKeeper and pg modes, which run only when named]
    #[arg(long, value_enum, value_delimiter = ',')]
    pub(crate) modes: Vec<ChaosMode>,
    /// The faults (columns), comma-separated [default: all]: none,
    /// holder-pause, redis-pause, redis-restart, redis-restart-aof,
    /// failover, slot-migration, cluster-failover, net-latency, net-cut,
    /// net-blackhole, postgres-pause, key-loss, early-expiry,
    /// script-flush, conn-kill, redis-stall, acl-reset, eviction,
    /// client-pause-write, pubsub-kill, maxclients, demotion, oom, flushall,
    /// clock-jump, clock-fast, postgres-restart, sentinel-failover,
    /// sentinel-kill, etcd-leader-kill, etcd-member-pause,
    /// etcd-minority-cut, etcd-majority-cut, etcd-restart, etcd-revoke,
    /// etcd-no-space, zookeeper-leader-kill, zookeeper-member-pause,
    /// zookeeper-minority-cut, zookeeper-majority-cut, zookeeper-disk-full,
    /// zookeeper-restart, zookeeper-rebuild, zookeeper-node-delete,
    /// pg-backend-kill, pg-row-delete, pg-table-lock, pg-clock-step,
    /// pg-crash, pg-statement-timeout, pg-lock-timeout, pgbouncer-restart,
    /// mixed.
    /// Each runs on the topology it needs: a single redis-server behind a
    /// fault proxy (for acl-reset the workers connect as the README's
    /// minimal lock user); with a replica for failover; a cluster of 3
    /// masters with a replica each for slot-migration and cluster-failover
    /// (every mode but quorum; hand-off over sharded pub/sub, Redis 7+); a
    /// primary, a replica and 3
    /// sentinels for sentinel-failover and sentinel-kill, the workers
    /// connecting with its redis+sentinel:// URL (modes blind, fenced, cas,
    /// guard, leader, handoff); 3 independent servers for the quorum mode;
    /// for clock-jump and clock-fast a server whose clock libfaketime can
    /// drive (LEASEHOLD_REDIS_SERVER naming a libc-malloc build such as
    /// scripts/valkey.sh's Valkey; on Debian's redis-server their rows say
    /// unsupported); a throwaway 3-member etcd cluster for the etcd modes
    /// (etcd and etcd-lock-rpc, which run none, holder-pause, the
    /// postgres faults and the etcd-* faults; on --etcd-endpoints, of the
    /// etcd-* faults only etcd-revoke); a throwaway 3-server ZooKeeper
    /// ensemble for the ZooKeeper modes (zookeeper, zookeeper-blind and
    /// zookeeper-curator,
    /// which run none, holder-pause, the postgres faults and the
    /// zookeeper-* faults; run them with --ttl of 400ms or more, the
    /// ensemble's shortest session, or a holder pause outlasts no session);
    /// the lease table in the run's PostgreSQL for the pg modes (pg,
    /// pg-blind and pg-pgbouncer, the last through a throwaway PgBouncer
    /// in transaction mode; they run none, holder-pause, the postgres
    /// faults and the pg-* faults, pgbouncer-restart on pg-pgbouncer
    /// only; for pg-clock-step the run's PostgreSQL starts on libfaketime)
    #[arg(long, value_delimiter = ',', value_parser = parse_fault)]
    pub(crate) faults: Vec<leasehold_chaos::Fault>,
    /// Worker processes per run.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=32))]
    pub(crate) workers: u32,
    /// Callers (tasks) per worker.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub(crate) tasks: u32,
    /// Wallets the callers debit (rows 1..=N of `wallets`).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub(crate) wallets: u32,
    /// The lease TTL.
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    pub(crate) ttl: Duration,
    /// How long an acquire waits for the lock.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub(crate) wait: Duration,
    /// Work between each read and its write (widens the window a stale
    /// write comes from).
    #[arg(long, default_value = "5ms", value_parser = humantime::parse_duration)]
    pub(crate) work: Duration,
    /// Refresh leases with the watchdog and stop writes whose lease was
    /// lost (always on for the leader mode).
    #[arg(long)]
    pub(crate) watchdog: bool,
    /// Redis servers in the quorum mode's Redlock quorum.
    #[arg(long, default_value_t = 3, value_parser = parse_chaos_nodes)]
    pub(crate) nodes: usize,
    /// Run against your own Redis (a redis:// URL, or rediss:// with
    /// --tls-ca and, if it asks for a client certificate, --tls-cert and
    /// --tls-key; credentials included; no environment variable, on
    /// purpose) instead of a throwaway one, through the fault proxy. Only
    /// the faults that need no control of the Redis process run (not
    /// redis-pause, redis-restart, redis-restart-aof, failover, mixed), and
    /// not the quorum mode; the rest are skipped with a note. The workers
    /// and the fault injector connect as the URL's user, whose ACL must
    /// grant the harness's rules for the chosen faults (README, "Redis
    /// ACL"; checked before any run, exit 3 naming the command). It
    /// deletes and expires lock:{wallet:N} keys, raises fence:{wallet:N}
    /// counters, script-flush runs SCRIPT FLUSH, conn-kill kills every
    /// client's connection and redis-stall pauses every client: use a test
    /// server.
    #[arg(long, value_name = "URL")]
    pub(crate) redis_url: Option<String>,
    #[command(flatten)]
    pub(crate) tls: crate::env::TlsFlags,
    /// The fault proxy in front of --redis-url listens on 127.0.0.1:PORT
    /// (e.g. one your firewall expects) [default: a free port]
    #[arg(
        long,
        value_name = "PORT",
        requires = "redis_url",
        conflicts_with = "cluster"
    )]
    pub(crate) proxy_port: Option<u16>,
    /// The host name the workers dial for the fault proxy, instead of
    /// 127.0.0.1: over rediss:// the server's certificate must name it, so
    /// give a name of the certificate that resolves to 127.0.0.1 here
    /// (localhost, or your server's name in /etc/hosts)
    #[arg(
        long,
        value_name = "NAME",
        requires = "redis_url",
        conflicts_with = "cluster"
    )]
    pub(crate) proxy_host: Option<String>,
    /// The workers connect to --redis-url directly, with no fault proxy
    /// (when the server's certificate names no host that can point at the
    /// proxy); the faults that need the proxy (net-latency, net-cut,
    /// net-blackhole, failover, mixed) are skipped with a note
    #[arg(
        long,
        requires = "redis_url",
        conflicts_with_all = ["cluster", "proxy_port", "proxy_host"]
    )]
    pub(crate) no_proxy: bool,
    /// --redis-url is a Redis Cluster: its seed nodes, comma-separated.
    /// The workers connect to the cluster directly (no fault proxy), so
    /// the network faults are skipped too; mode quorum does not run on a
    /// cluster, and handoff needs Redis 7 or newer (sharded pub/sub).
    /// script-flush flushes every master. Plain redis:// only (no TLS
    /// files).
    #[arg(long, requires = "redis_url")]
    pub(crate) cluster: bool,
    #[command(flatten)]
    pub(crate) etcd: crate::env::EtcdFlags,
    /// Write each run's history (`.jsonl`) and timeline (`.html`) here.
    #[arg(long)]
    pub(crate) report: Option<PathBuf>,
    /// Faults you inject yourself (your own CLIENT PAUSE, kill -STOP, network
    /// cut): FILE gets a line `<unix-ms> start <name>` before each and
    /// `<unix-ms> end <name>` after it (`leasehold chaos mark`, or `echo
    /// "$(date +%s%3N) start redis-stall" >> FILE`), during the run. At
    /// each run's end the windows that fall in it are placed in its
    /// history as its own fault windows: the run is named after them
    /// (with --faults none), its control judged under them (a name of
    /// --faults' list is judged as that fault), and the errors returned to
    /// its callers judged against them. A window with no end is cut at the
    /// run's end (and said so); a line that is not a mark is an error
    /// naming it, after the run's history is saved. Created if missing
    #[arg(long, value_name = "FILE")]
    pub(crate) fault_marks: Option<PathBuf>,
}

/// The chaos quorum mode's size: 3 or 5.
fn parse_chaos_nodes(s: &str) -> Result<usize, String> {
    match s {
        "3" => Ok(3),
        "5" => Ok(5),
        _ => Err("a Redlock quorum here has 3 or 5 nodes".to_owned()),
    }
}

/// A fault of `leasehold_chaos`, by name.
fn parse_fault(s: &str) -> Result<leasehold_chaos::Fault, String> {
    s.parse()
        .map_err(|err: leasehold_chaos::UnknownFault| err.to_string())
}

/// A row of the matrix: a lock and a write path.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, ValueEnum, Serialize, Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum ChaosMode {
    /// Negative control: a plain lease and a blind read-modify-write
    /// (`UPDATE ... SET balance = <read - amount>`), no database check.
    Blind,
    /// A fenced lease and the tutorial's fenced write (`WHERE fence <
    /// token`): refuses older holders, not a newer holder's stale read.
    Fenced,
    /// A fenced lease and a check-and-set write (`WHERE fence < token AND
    /// fence = <read fence>`).
    Cas,
    /// A fenced lease and the fence guard (`leasehold_pg::guard`) first in a
    /// transaction, then a plain read-modify-write.
    Guard,
    /// Terms, a leader's shape: a fenced lease kept for up to 20 debits
    /// under its watchdog (always on here, as an election's), the fence
    /// guard first in each debit's transaction; a term ends when the lease
    /// is lost or the guard refuses it.
    Leader,
    /// A fenced hand-off lease and a check-and-set write.
    Handoff,
    /// A fenced Redlock lease on 3 independent servers (faults hit one) and
    /// a check-and-set write.
    Quorum,
    /// No Redis lock: `SELECT ... FOR UPDATE` and the debit in one
    /// transaction.
    Db,
    /// The etcd way of taking a lease (`EtcdLocker`, on a
    /// throwaway 3-member etcd cluster or on --etcd-endpoints, over TLS
    /// and as --etcd-user if given; the fence is the key's creation
    /// revision, its guard row `etcd:fence:{wallet:N}`) and the fence guard
    /// first in a transaction, as `guard`. Runs only when named.
    Etcd,
    /// Negative control on etcd: etcd's own Lock RPC (`v3lock`, a session
    /// lease kept alive every ttl/3) and a blind read-modify-write, no
    /// database check. Counts the grants etcd made to a session whose lease
    /// had already expired (Jepsen's etcd 3.4.3 finding, fixed in 3.5.0).
    /// Runs only when named; on --etcd-endpoints only over plain http://
    /// without --etcd-user (its Lock RPC client speaks neither TLS nor
    /// etcd's authentication).
    EtcdLockRpc,
    /// The ZooKeeper way of taking a lease (`ZkLocker`, Curator's lock
    /// layout, on a throwaway 3-server ZooKeeper ensemble; the session
    /// timeout asked is the TTL; the fence is the lock node's czxid, its
    /// guard row `zk:fence:{wallet:N}`) and the fence guard first in a
    /// transaction, as `guard`. Runs only when named.
    Zookeeper,
    /// Negative control on ZooKeeper: a `ZkLocker` lease without a fence
    /// (Curator's layout and queue, the lock held while the node lives, as
    /// Curator's InterProcessMutex holds it) and a blind read-modify-write,
    /// no database check. Runs only when named.
    ZookeeperBlind,
    /// Negative control on ZooKeeper, closer to Curator's recipe as it is:
    /// the zookeeper-client crate's own lock in Curator's
    /// InterProcessMutex layout (`LockPrefix::new_curator`, held until
    /// dropped or its session ends; the session timeout asked is the TTL)
    /// and a blind read-modify-write, no database check. Runs only when
    /// named.
    ZookeeperCurator,
    /// PostgreSQL as the lock service (`PgLocker`, its lease table in the
    /// run's PostgreSQL, waiters woken by LISTEN/NOTIFY; the fence from
    /// its durable counter) and the fence guard with `check_lease_row`
    /// first in a transaction (the lease row checked too: lease and data
    /// share the database), then a plain read-modify-write. Runs only
    /// when named.
    Pg,
    /// Negative control on PostgreSQL: a `PgLocker` lease without a fence
    /// and a blind read-modify-write, no database check. Runs only when
    /// named.
    PgBlind,
    /// The pg mode through a throwaway PgBouncer in transaction mode: the
    /// locker (`listen(false)`: its waiters poll) and the writes dial
    /// PgBouncer. Runs only when named.
    PgPgbouncer,
}

impl ChaosMode {
    /// The modes run when `--modes` is not given: the Redis ones (the etcd
    /// modes need an etcd binary, the ZooKeeper modes java and Debian's
    /// ZooKeeper jars: they run only when named).
    pub(crate) const ALL: [ChaosMode; 8] = [
        ChaosMode::Blind,
        ChaosMode::Fenced,
        ChaosMode::Cas,
        ChaosMode::Guard,
        ChaosMode::Leader,
        ChaosMode::Handoff,
        ChaosMode::Quorum,
        ChaosMode::Db,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            ChaosMode::Blind => "blind",
            ChaosMode::Fenced => "fenced",
            ChaosMode::Cas => "cas",
            ChaosMode::Guard => "guard",
            ChaosMode::Leader => "leader",
            ChaosMode::Handoff => "handoff",
            ChaosMode::Quorum => "quorum",
            ChaosMode::Db => "db",
            ChaosMode::Etcd => "etcd",
            ChaosMode::EtcdLockRpc => "etcd-lock-rpc",
            ChaosMode::Zookeeper => "zookeeper",
            ChaosMode::ZookeeperBlind => "zookeeper-blind",
            ChaosMode::ZookeeperCurator => "zookeeper-curator",
            ChaosMode::Pg => "pg",
            ChaosMode::PgBlind => "pg-blind",
            ChaosMode::PgPgbouncer => "pg-pgbouncer",
        }
    }

    /// Whether the mode takes its leases in PostgreSQL (`PgLocker`, no
    /// Redis).
    pub(crate) fn is_pg(self) -> bool {
        matches!(
            self,
            ChaosMode::Pg | ChaosMode::PgBlind | ChaosMode::PgPgbouncer
        )
    }

    /// Whether the mode runs on ZooKeeper (a throwaway ensemble, no
    /// Redis).
    pub(crate) fn is_zookeeper(self) -> bool {
        matches!(
            self,
            ChaosMode::Zookeeper | ChaosMode::ZookeeperBlind | ChaosMode::ZookeeperCurator
        )
    }

    /// Whether the mode runs on etcd (a throwaway etcd cluster, no Redis).
    pub(crate) fn is_etcd(self) -> bool {
        matches!(self, ChaosMode::Etcd | ChaosMode::EtcdLockRpc)
    }
}
