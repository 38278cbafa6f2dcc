//! The servers a run uses, and the nemesis that injects faults into them.
//!
//! A [`Lab`] starts throwaway servers through `leasehold-testkit`: a Redis
//! primary behind a TCP fault proxy (the callers connect through the
//! proxy, so the network can lag, be cut or be swallowed), optionally a
//! replica (for failover), extra independent Redis nodes (for Redlock), and
//! a PostgreSQL; or a Redis Cluster of three masters with a replica each
//! (for slot migration and cluster failover); or a Redis Sentinel setup of
//! a primary, a replica and three sentinels (for the Sentinel faults). It
//! can also stand in front
//! of your own Redis or Redis Cluster ([`LabOptions::redis_url`],
//! [`LabOptions::cluster_urls`]) for the faults that need no control of
//! the Redis processes. The nemesis runs on its own thread, so the
//! blocking server control never stalls the callers.
//!
//! # Your own infrastructure
//!
//! - **TLS**: [`LabOptions::redis_url`] takes `rediss://`, with the CA and
//!   the client certificate of [`LabOptions::tls`] (the library's
//!   [`TlsFiles`]); the lab's own connection uses them as the callers do
//!   ([`Lab::client`]). The proxy passes TLS through untouched, so the
//!   certificate must name the host the callers dial:
//!   [`LabOptions::proxy_host`], or [`LabOptions::proxy`]`(false)` (the
//!   network faults are then refused, never skipped in silence).
//! - **ACL**: against your Redis, the lab sends only the harness's
//!   documented commands ([`HARNESS_ACL_RULES`](crate::HARNESS_ACL_RULES)
//!   on top of [`ACL_RULES`], per fault [`Fault::needs_commands`]) and
//!   checks them before a run ([`Lab::check_fault`]).
//! - **The proxy's port**: [`LabOptions::proxy_port`].
//! - **Throwaway servers configured like yours**, for the faults that
//!   need the process: [`LabOptions::redis_options`] (TLS with client
//!   certificates, a password, persistence), [`LabOptions::acl_user`]
//!   for the lock user's ACL, [`PostgresServer::start_tls`] for a TLS
//!   PostgreSQL.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rand::RngExt;

use leasehold::tls::TlsFiles;
use leasehold_testkit::{
    Direction, Failover, FaultProxy, PostgresServer, RedisCluster, RedisOptions, RedisSentinel,
    RedisServer,
};

use crate::callers::{Stall, lock_key};
use crate::fault::{CLOCK_JUMP, CLOCK_RATE, Fault, Window};
use crate::history::Kind;
use crate::recorder::Recorder;

/// Why a lab could not start or a fault could not be injected.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LabError {
    /// A throwaway server failed (its log is in the source).
    #[error("{what} failed")]
    Server {
        /// What was being done.
        what: String,
        /// The testkit's error.
        #[source]
        source: leasehold_testkit::Error,
    },
    /// Options that do not go together, or a fault the lab cannot inject
    /// the way it was asked.
    #[error("{0}")]
    Options(&'static str),
    /// The Redis URL given to [`LabOptions::redis_url`] cannot be used
    /// (the URL itself is not shown: it may hold a password).
    #[error("the redis url cannot be used: {0}")]
    RedisUrl(&'static str),
    /// A command to the Redis server given by URL failed.
    #[error("{what} failed on the redis at the given url")]
    External {
        /// What was being done.
        what: String,
        /// redis-rs's error.
        #[source]
        source: redis::RedisError,
    },
    /// The fault needs a server this lab does not have.
    #[error("fault {fault} needs {needs}, which this lab does not have")]
    Unsupported {
        /// The fault.
        fault: Fault,
        /// What it needs.
        needs: &'static str,
    },
    /// The user of the Redis given by URL may not run a command the fault
    /// needs ([`Fault::needs_commands`]; `NOPERM`), found before the run
    /// injects anything. Grant it (`+` the command, see
    /// [`HARNESS_ACL_RULES`](crate::HARNESS_ACL_RULES)) or pick another
    /// fault.
    #[error(
        "fault {fault} needs the redis command `{command}`, which the given url's user may not run (add +{command} to its acl)"
    )]
    Permission {
        /// The fault.
        fault: Fault,
        /// The command, as its ACL name (`script|flush`).
        command: &'static str,
    },
    /// The port given to [`LabOptions::proxy_port`] cannot be bound on
    /// `127.0.0.1` (it is taken, or needs privileges).
    #[error("the fault proxy cannot listen on 127.0.0.1:{port}")]
    ProxyPort {
        /// The port asked for.
        port: u16,
        /// Why binding it failed.
        #[source]
        source: std::io::Error,
    },
    /// The TLS files of [`LabOptions::tls`] (or the URL they go with)
    /// cannot be used: the library's error says which file and why (never
    /// the URL itself).
    #[error("the redis url's tls settings cannot be used")]
    Tls(#[source] leasehold::Error),
}

fn server(what: impl Into<String>) -> impl FnOnce(leasehold_testkit::Error) -> LabError {
    let what = what.into();
    move |source| LabError::Server { what, source }
}

/// Which servers a [`Lab`] starts.
#[derive(Clone, Default)]
#[must_use]
pub struct LabOptions {
    replica: bool,
    aof: bool,
    acl_user: bool,
    nodes: usize,
    postgres: Option<Arc<PostgresServer>>,
    redis_url: Option<String>,
    cluster: bool,
    cluster_urls: Vec<String>,
    sentinel: bool,
    tls: Option<TlsFiles>,
    no_proxy: bool,
    proxy_port: Option<u16>,
    proxy_host: Option<String>,
    redis_options: Option<RedisOptions>,
    fake_clock: bool,
}

/// What the clock faults need, for [`LabError::Unsupported`].
const NEEDS_FAKE_CLOCK: &str = "a throwaway redis server whose clock libfaketime can drive (a libc-malloc build such as scripts/valkey.sh's Valkey, selected with LEASEHOLD_REDIS_SERVER; Debian's jemalloc-linked redis-server hangs under libfaketime)";

impl LabOptions {
    /// A replica of the primary, for [`Fault::Failover`]. Defaults to none.
    pub fn replica(mut self, on: bool) -> Self {
        self.replica = on;
        self
    }

    /// The primary persists every write to its append-only file, for
    /// [`Fault::RedisRestartAof`]. Defaults to off.
    pub fn aof(mut self, on: bool) -> Self {
        self.aof = on;
        self
    }

    /// The callers connect as an ACL user with the README's minimal rules
    /// ([`ACL_USER`], every mode's commands), made on every throwaway
    /// server with a random password, for [`Fault::AclReset`]. Defaults to
    /// off (the default user).
    pub fn acl_user(mut self, on: bool) -> Self {
        self.acl_user = on;
        self
    }

    /// `n - 1` more independent Redis servers beside the primary, for a
    /// Redlock quorum of `n` (0 or 1: none). Defaults to 0.
    pub fn nodes(mut self, n: usize) -> Self {
        self.nodes = n;
        self
    }

    /// A throwaway PostgreSQL the lab may pause ([`Fault::PostgresPause`])
    /// or restart ([`Fault::PostgresRestart`]);
    /// shared, since starting one takes seconds. For one with TLS (as
    /// your database has), start it with
    /// [`PostgresServer::start_tls`]; the lab only signals its process and
    /// never connects to it (your write closure does, with
    /// [`Lab::postgres_url`] and your TLS settings). Defaults to none.
    pub fn postgres(mut self, server: Arc<PostgresServer>) -> Self {
        self.postgres = Some(server);
        self
    }

    /// Your own Redis (a `redis://` or `rediss://` URL, with its user,
    /// password and database if any; the TLS files with
    /// [`tls`](Self::tls)) instead of a throwaway one: the fault proxy goes
    /// in front of it (unless [`proxy`](Self::proxy)`(false)`). Only the
    /// faults that need no control of the Redis process can run then
    /// ([`Fault::needs_redis_process`] is false), and no replica, AOF,
    /// extra nodes or [`redis_options`](Self::redis_options) can be asked
    /// for. Defaults to none.
    ///
    /// The lab connects as the URL's user, with the same TLS material as
    /// the callers, and sends nothing outside the harness's documented ACL
    /// (the crate's `access` rules: the handshake and `TIME` when it
    /// starts, then only the fault's commands, [`Fault::needs_commands`],
    /// see [`HARNESS_ACL_RULES`](crate::HARNESS_ACL_RULES)); a user who
    /// may not run a fault's command is [`LabError::Permission`] before
    /// the run. It never connects to your PostgreSQL: your write closure
    /// does, with your own TLS settings.
    ///
    /// The lab changes that server: it deletes or expires the lock keys
    /// its callers use ([`Fault::KeyLoss`], [`Fault::EarlyExpiry`]), runs
    /// `SCRIPT FLUSH` ([`Fault::ScriptFlush`]), which drops every
    /// client's cached scripts, kills the other clients' connections
    /// ([`Fault::ConnKill`]) and pauses every client
    /// ([`Fault::RedisStall`]). Point it at a test server.
    pub fn redis_url(mut self, url: impl Into<String>) -> Self {
        self.redis_url = Some(url.into());
        self
    }

    /// A Redis Cluster of three masters with a replica each instead of a
    /// single primary, for [`Fault::SlotMigration`] and
    /// [`Fault::ClusterFailover`]. The callers connect to it directly (a
    /// cluster client follows the nodes' own addresses, so there is no
    /// fault proxy): the network faults and the single-server faults do not
    /// run on it. Defaults to off.
    pub fn cluster(mut self, on: bool) -> Self {
        self.cluster = on;
        self
    }

    /// Your own Redis Cluster (plain `redis://` seed URLs) instead of a
    /// throwaway one: the callers connect to it directly, and only the
    /// faults that need neither the Redis processes nor a proxy can run
    /// ([`Fault::KeyLoss`], [`Fault::EarlyExpiry`], [`Fault::ScriptFlush`]
    /// on every master, and the holder and PostgreSQL pauses). It changes
    /// that cluster as [`redis_url`](Self::redis_url) says. Defaults to
    /// none.
    pub fn cluster_urls(mut self, urls: Vec<String>) -> Self {
        self.cluster_urls = urls;
        self
    }

    /// A Redis Sentinel setup (a primary, a replica and three sentinels,
    /// quorum 2, see [`RedisSentinel`]) instead of a single primary, for
    /// [`Fault::SentinelFailover`] and [`Fault::SentinelKill`]. The callers
    /// connect with its `redis+sentinel://` URL ([`Lab::redis_url`]) and
    /// follow the primary the sentinels name; there is no fault proxy, so
    /// the network faults do not run on it. Defaults to off.
    pub fn sentinel(mut self, on: bool) -> Self {
        self.sentinel = on;
        self
    }

    /// The TLS files (CA, client certificate and key; the library's own
    /// [`TlsFiles`], read as [`leasehold::tls::client`] reads them) for a
    /// `rediss://` [`redis_url`](Self::redis_url), or for a throwaway
    /// server started with TLS ([`redis_options`](Self::redis_options)
    /// with [`RedisOptions::tls`]). The lab's own connection (for the key,
    /// script, connection and stall faults) uses them as the callers do,
    /// as the same user; build the callers' client with
    /// [`Lab::client`]. Not for a cluster or a Sentinel setup
    /// ([`LabError::Options`]). Defaults to none.
    ///
    /// The fault proxy is plain TCP: TLS passes through it end to end, and
    /// the callers' URL names the proxy (`127.0.0.1`, or
    /// [`proxy_host`](Self::proxy_host)), so the server's certificate must
    /// name that host. A certificate made for the real host name only
    /// will be refused: give [`proxy_host`](Self::proxy_host) a name of
    /// the certificate that resolves to `127.0.0.1` here (e.g. through
    /// `/etc/hosts`), or go without the proxy
    /// ([`proxy`](Self::proxy)`(false)`).
    pub fn tls(mut self, files: TlsFiles) -> Self {
        self.tls = Some(files);
        self
    }

    /// Whether the callers reach the single Redis through the lab's fault
    /// proxy. Off, they connect to it directly ([`Lab::redis_url`] is then
    /// your URL as given, or the throwaway server's own), so that a TLS
    /// certificate for your server's host name verifies; the faults that
    /// need the proxy ([`Fault::needs_proxy`]: the network faults and a
    /// failover) then fail with [`LabError::Unsupported`] before the run,
    /// never run without it. Defaults to on.
    pub fn proxy(mut self, on: bool) -> Self {
        self.no_proxy = !on;
        self
    }

    /// The port the fault proxy listens on (on `127.0.0.1`), e.g. one your
    /// firewall or your callers' configuration expects. A port that cannot
    /// be bound is [`LabError::ProxyPort`]. Not without the proxy (a
    /// cluster, a Sentinel setup, [`proxy`](Self::proxy)`(false)`:
    /// [`LabError::Options`]). Defaults to a free port.
    pub fn proxy_port(mut self, port: u16) -> Self {
        self.proxy_port = Some(port);
        self
    }

    /// The host name the callers' URL gives for the fault proxy, instead
    /// of `127.0.0.1`: a name that resolves to this machine's loopback and
    /// that the server's TLS certificate names (`localhost`, or your
    /// server's name mapped to `127.0.0.1` in `/etc/hosts`). The proxy
    /// still listens on `127.0.0.1` only. Not without the proxy
    /// ([`LabError::Options`]). Defaults to `127.0.0.1`.
    pub fn proxy_host(mut self, host: impl Into<String>) -> Self {
        self.proxy_host = Some(host.into());
        self
    }

    /// Starts the throwaway single Redis, and its replica and extra
    /// Redlock nodes, with your configuration: TLS with client
    /// certificates required ([`RedisOptions::tls`]; give the callers'
    /// files with [`tls`](Self::tls)), a password
    /// ([`RedisOptions::password`], which the callers' URL and the lab's
    /// own connection then carry), persistence
    /// ([`RedisOptions::appendonly`], which counts as [`aof`](Self::aof)),
    /// any `redis-server` arguments ([`RedisOptions::args`]). The lab adds
    /// its own on top (`--repl-diskless-sync-delay 0`, an ACL user with
    /// [`acl_user`](Self::acl_user)). What cannot apply is
    /// [`LabError::Options`], never ignored: options for a cluster, a
    /// Sentinel setup or a Redis given by URL; `replica_of`; TLS without
    /// [`tls`](Self::tls) files for the callers, or files without TLS. A
    /// replica of a TLS primary replicates over TLS, presenting the
    /// testkit's client certificate. Defaults to the testkit's defaults.
    pub fn redis_options(mut self, options: RedisOptions) -> Self {
        self.redis_options = Some(options);
        self
    }

    /// The throwaway primary runs on a clock the lab can move
    /// ([`RedisOptions::fake_clock`]: libfaketime), for
    /// [`Fault::ClockJump`] and [`Fault::ClockFast`]. When the server
    /// binary cannot be driven (Debian's `redis-server`, linked with
    /// jemalloc, hangs under libfaketime; select a libc-malloc build such
    /// as `scripts/valkey.sh`'s Valkey with `LEASEHOLD_REDIS_SERVER`), or
    /// libfaketime is not installed, the primary starts on the machine's
    /// clock and those faults are [`LabError::Unsupported`] before the
    /// run ([`Lab::check_fault`]), never injected into a clock that does
    /// not move; [`Lab::logs`] says why. Throwaway single servers only
    /// ([`LabError::Options`] with a Redis given by URL, a cluster or a
    /// Sentinel setup). Defaults to off.
    pub fn fake_clock(mut self, on: bool) -> Self {
        self.fake_clock = on;
        self
    }

    /// The options a fault needs on top of these.
    pub fn for_fault(self, fault: Fault) -> Self {
        match fault {
            Fault::ClockJump | Fault::ClockFast => self.fake_clock(true),
            Fault::SentinelFailover | Fault::SentinelKill => self.sentinel(true),
            Fault::Failover => self.replica(true),
            Fault::SlotMigration | Fault::ClusterFailover => self.cluster(true),
            Fault::RedisRestartAof | Fault::Mixed => self.aof(true),
            Fault::AclReset => self.acl_user(true),
            _ => self,
        }
    }
}

/// The Redis the callers use, behind the fault proxy.
enum Primary {
    /// A throwaway redis-server the lab started and controls.
    Own(RedisServer),
    /// The user's server, reached by URL: commands only, on one
    /// connection kept between them (opened again after an error).
    External {
        client: redis::Client,
        conn: Mutex<Option<redis::Connection>>,
    },
    /// The user's Redis Cluster, reached by its seed URLs: commands only.
    ExternalCluster {
        client: redis::cluster::ClusterClient,
        /// The seed URLs, as given (for the workers).
        urls: Vec<String>,
    },
    /// A throwaway Redis Cluster; `owner` is the index of the master
    /// pair serving the lock keys' slot while a slot migration moves it.
    Cluster {
        cluster: RedisCluster,
        owner: Option<usize>,
    },
    /// A throwaway Redis Sentinel setup; `old` is the primary's port
    /// while a Sentinel fault's failover runs.
    Sentinel {
        setup: RedisSentinel,
        old: Option<u16>,
    },
}

struct Servers {
    primary: Primary,
    replica: Option<RedisServer>,
    /// Servers killed by a failover, kept for their logs until the lab goes.
    retired: Vec<RedisServer>,
    /// The empty server the primary replicates during a demotion.
    demoter: Option<RedisServer>,
    /// The lab's own connection through a `maxclients` window: the only
    /// one Redis lets in, kept to lift the limit at the window's end.
    limiter: Option<redis::Connection>,
    nodes: Vec<RedisServer>,
    postgres: Option<Arc<PostgresServer>>,
    workers: Vec<u32>,
    pauser: Option<Pauser>,
}

/// Tells worker `n` to stop itself at its next pause point (`true`), or
/// not to any more (`false`). See [`Lab::set_pauser`].
pub type Pauser = Arc<dyn Fn(u32, bool) + Send + Sync>;

impl Servers {
    /// `primary` and the options' PostgreSQL; no replica, nodes or
    /// workers yet.
    fn new(primary: Primary, options: &LabOptions) -> Servers {
        Servers {
            primary,
            replica: None,
            retired: Vec::new(),
            demoter: None,
            limiter: None,
            nodes: Vec::new(),
            postgres: options.postgres.clone(),
            workers: Vec::new(),
            pauser: None,
        }
    }
}

/// Throwaway servers and the fault proxy in front of the primary. Cheap to
/// clone (clones share the servers); everything stops when the last clone
/// is dropped.
#[derive(Clone)]
pub struct Lab {
    servers: Arc<Mutex<Servers>>,
    /// In front of the primary; none on a cluster.
    proxy: Option<Arc<FaultProxy>>,
    aof: bool,
    /// The callers' URL to an external primary (its credentials, the
    /// proxy's address); `None` for a throwaway one.
    caller_url: Option<String>,
    /// The password of [`ACL_USER`], whom the callers connect as (see
    /// [`LabOptions::acl_user`]).
    acl_password: Option<String>,
    /// The callers' `user:password@` (or `:password@`, or nothing) on the
    /// throwaway extra nodes.
    node_auth: String,
    /// The TLS files of the callers (and of the lab's own connection to a
    /// Redis given by URL).
    tls: Option<TlsFiles>,
    /// Why the primary runs on the machine's clock though a fake one was
    /// asked for.
    clock_note: Option<String>,
}

/// The ACL user the callers connect as with [`LabOptions::acl_user`].
pub const ACL_USER: &str = "locker";

/// The README's minimal rules for a lock user, every mode's commands (its
/// "Redis ACL" section), after `ACL SETUSER locker on >PASSWORD`
/// (`tests/acl_rules.rs` checks that the two stay the same).
pub const ACL_RULES: [&str; 27] = [
    "resetkeys",
    "~lock:*",
    "~fence:*",
    "resetchannels",
    "&leasehold:handoff:*",
    "-@all",
    "+set",
    "+get",
    "+del",
    "+pexpire",
    "+pttl",
    "+type",
    "+time",
    "+zadd",
    "+zrange",
    "+zrem",
    "+zpopmin",
    "+hget",
    "+hset",
    "+hdel",
    "+spublish",
    "+pubsub|shardnumsub",
    "+ssubscribe",
    "+evalsha",
    "+eval",
    "+script|load",
    "+wait",
];

/// Makes (or resets) [`ACL_USER`] on `server` with the minimal rules.
fn set_acl_user(server: &RedisServer, password: &str) -> Result<(), LabError> {
    let secret = format!(">{password}");
    let mut args = vec!["ACL", "SETUSER", ACL_USER, "reset", "on", secret.as_str()];
    args.extend(ACL_RULES);
    server
        .command(&args)
        .map(drop)
        .map_err(server_err("making the lock's acl user"))
}

/// A URL: `redis[s]://AUTH HOST:PORT/DB`, `auth` empty or ending in `@`.
fn url(tls: bool, auth: &str, host: &str, port: u16, db: i64) -> String {
    let scheme = if tls { "rediss" } else { "redis" };
    format!("{scheme}://{auth}{host}:{port}/{db}")
}

/// `user:password@` (percent-encoded), `:password@`, or nothing.
fn auth(user: Option<&str>, password: Option<&str>) -> String {
    let mut out = String::new();
    if let Some(user) = user {
        out.push_str(&encode(user));
    }
    if let Some(password) = password {
        out.push(':');
        out.push_str(&encode(password));
    }
    if !out.is_empty() {
        out.push('@');
    }
    out
}

/// Starts the fault proxy in front of `upstream`, on the options' port.
fn start_proxy(
    upstream: std::net::SocketAddr,
    options: &LabOptions,
) -> Result<FaultProxy, LabError> {
    let port = options.proxy_port.unwrap_or(0);
    FaultProxy::start_on(upstream, port).map_err(|err| match err {
        leasehold_testkit::Error::FreePort(source) if port != 0 => {
            LabError::ProxyPort { port, source }
        }
        other => LabError::Server {
            what: "starting the fault proxy".to_owned(),
            source: other,
        },
    })
}

impl LabOptions {
    /// The options that go with a single Redis only (throwaway or by URL),
    /// refused on a cluster or a Sentinel setup.
    fn check_single(&self, lab: &'static str) -> Result<(), LabError> {
        if self.tls.is_some()
            || self.fake_clock
            || self.no_proxy
            || self.proxy_port.is_some()
            || self.proxy_host.is_some()
            || self.redis_options.is_some()
        {
            return Err(LabError::Options(lab));
        }
        Ok(())
    }

    /// The proxy options make sense: none of them without the proxy.
    fn check_proxy(&self) -> Result<(), LabError> {
        if self.no_proxy && (self.proxy_port.is_some() || self.proxy_host.is_some()) {
            return Err(LabError::Options(
                "a proxy port or host name with LabOptions::proxy(false)",
            ));
        }
        Ok(())
    }

    /// The primary's options without the fake clock, for a server binary
    /// libfaketime cannot drive.
    fn primary_options_on_real_clock(&self) -> Result<RedisOptions, LabError> {
        LabOptions {
            fake_clock: false,
            ..self.clone()
        }
        .primary_options()
    }

    /// The throwaway single primary's options: the user's, checked, with
    /// the lab's on top.
    fn primary_options(&self) -> Result<RedisOptions, LabError> {
        let base = self.redis_options.clone().unwrap_or_default();
        if base.get_replica_of().is_some() {
            return Err(LabError::Options(
                "redis_options with replica_of: the lab starts its own primary (ask for a replica with LabOptions::replica)",
            ));
        }
        if base.get_tls().is_some() {
            if self.tls.is_none() {
                return Err(LabError::Options(
                    "a tls throwaway server needs LabOptions::tls: the ca (and the client certificate) the callers use",
                ));
            }
        } else if self.tls.is_some() {
            return Err(LabError::Options(
                "tls files for a plain throwaway server: give it RedisOptions::tls, or leave the files out",
            ));
        }
        let mut options = base.args(["--repl-diskless-sync-delay", "0"]);
        if self.aof {
            options = options.appendonly();
        }
        if self.fake_clock {
            options = options.fake_clock();
        }
        Ok(options)
    }
}

impl Lab {
    /// Starts the servers `options` asks for. Blocking (it waits for each
    /// server to answer): call it from `spawn_blocking` in async code.
    ///
    /// # Errors
    /// [`LabError::Server`] when a server does not start.
    pub fn start(options: &LabOptions) -> Result<Lab, LabError> {
        if let Some(url) = &options.redis_url {
            return Self::start_external(options, url);
        }
        if !options.cluster_urls.is_empty() {
            return Self::start_external_cluster(options);
        }
        if options.cluster && options.sentinel {
            return Err(LabError::Options(
                "a lab is a redis cluster or a sentinel setup, not both",
            ));
        }
        if options.cluster {
            options.check_single(
                "tls, proxy, redis options and a fake clock do not apply to a cluster lab (no proxy, the testkit's cluster)",
            )?;
            return Self::start_cluster(options);
        }
        if options.sentinel {
            options.check_single(
                "tls, proxy, redis options and a fake clock do not apply to a sentinel lab (no proxy, the testkit's sentinel setup)",
            )?;
            return Self::start_sentinel(options);
        }
        options.check_proxy()?;
        let redis = options.primary_options()?;
        let aof = redis.get_appendonly();
        let user_options = options.redis_options.clone().unwrap_or_default();
        let (primary, clock_note) = match RedisServer::start_with(redis.clone()) {
            Err(
                err @ (leasehold_testkit::Error::ClockNotDriven { .. }
                | leasehold_testkit::Error::LibraryNotFound { .. }),
            ) if redis.get_fake_clock() => {
                // The clock faults will say so before their run; the
                // others need no fake clock.
                let plain = RedisServer::start_with(options.primary_options_on_real_clock()?)
                    .map_err(server("starting redis"))?;
                (plain, Some(err.to_string()))
            }
            started => (started.map_err(server("starting redis"))?, None),
        };
        let replica = if options.replica {
            let replica = RedisServer::start_with(
                user_options
                    .clone()
                    .replica_of(primary.host(), primary.port()),
            )
            .map_err(server("starting the replica"))?;
            Some(replica)
        } else {
            None
        };
        let nodes = if options.nodes > 1 {
            RedisServer::start_many_with(options.nodes - 1, &user_options)
                .map_err(server("starting redlock nodes"))?
        } else {
            Vec::new()
        };
        let proxy = if options.no_proxy {
            None
        } else {
            Some(start_proxy(primary.addr(), options)?)
        };
        let acl_password = if options.acl_user {
            let password: String = {
                let mut rng = rand::rng();
                (0..24)
                    .map(|_| {
                        char::from(b"abcdefghijklmnopqrstuvwxyz0123456789"[rng.random_range(0..36)])
                    })
                    .collect()
            };
            for server in std::iter::once(&primary).chain(&nodes) {
                set_acl_user(server, &password)?;
            }
            Some(password)
        } else {
            None
        };
        let node_auth = match &acl_password {
            Some(password) => auth(Some(ACL_USER), Some(password)),
            None => auth(None, user_options.get_password()),
        };
        let (host, port) = match &proxy {
            Some(proxy) => (
                options.proxy_host.as_deref().unwrap_or(primary.host()),
                proxy.port(),
            ),
            None => (primary.host(), primary.port()),
        };
        let caller_url = url(primary.is_tls(), &node_auth, host, port, 0);
        let servers = Servers {
            replica,
            nodes,
            ..Servers::new(Primary::Own(primary), options)
        };
        let mut lab = Lab::assemble(servers, proxy, aof, Some(caller_url));
        lab.acl_password = acl_password;
        lab.node_auth = node_auth;
        lab.tls = options.tls.clone();
        lab.clock_note = clock_note;
        Ok(lab)
    }

    /// A lab on a throwaway cluster.
    fn start_cluster(options: &LabOptions) -> Result<Lab, LabError> {
        if options.replica || options.aof || options.nodes > 1 || options.acl_user {
            return Err(LabError::Options(
                "a cluster lab has no single-server replica, AOF, extra nodes or acl user",
            ));
        }
        let cluster =
            RedisCluster::start_with_replicas(3).map_err(server("starting a redis cluster"))?;
        let primary = Primary::Cluster {
            cluster,
            owner: None,
        };
        Ok(Lab::assemble(
            Servers::new(primary, options),
            None,
            false,
            None,
        ))
    }

    /// A lab on a throwaway Sentinel setup: the callers use its
    /// `redis+sentinel://` URL.
    fn start_sentinel(options: &LabOptions) -> Result<Lab, LabError> {
        if options.replica || options.aof || options.nodes > 1 || options.acl_user {
            return Err(LabError::Options(
                "a sentinel lab has no extra replica, AOF, extra nodes or acl user",
            ));
        }
        let setup = RedisSentinel::start("leasehold").map_err(server("starting redis sentinel"))?;
        let url = setup.url();
        let primary = Primary::Sentinel { setup, old: None };
        Ok(Lab::assemble(
            Servers::new(primary, options),
            None,
            false,
            Some(url),
        ))
    }

    /// A lab in front of the user's Redis Cluster.
    fn start_external_cluster(options: &LabOptions) -> Result<Lab, LabError> {
        if options.replica
            || options.aof
            || options.nodes > 1
            || options.cluster
            || options.sentinel
            || options.acl_user
        {
            return Err(LabError::Options(
                "a replica, an append-only file, extra nodes, an acl user or a throwaway cluster need throwaway servers",
            ));
        }
        options.check_single(
            "tls, proxy, redis options and a fake clock do not apply to a redis cluster given by url (the lab has no tls cluster client, and no proxy there)",
        )?;
        let client = redis::cluster::ClusterClient::builder(options.cluster_urls.clone())
            .connection_timeout(EXTERNAL_TIMEOUT)
            .response_timeout(EXTERNAL_TIMEOUT)
            .build()
            .map_err(|_| LabError::RedisUrl("a cluster seed url does not parse"))?;
        let mut conn = client.get_connection().map_err(external("connecting"))?;
        // Not PING: the lock user's ACL grants TIME.
        redis::cmd("TIME")
            .query::<redis::Value>(&mut conn)
            .map_err(external("TIME"))?;
        let primary = Primary::ExternalCluster {
            client,
            urls: options.cluster_urls.clone(),
        };
        Ok(Lab::assemble(
            Servers::new(primary, options),
            None,
            false,
            None,
        ))
    }

    /// Whether the callers use a Redis Cluster ([`node_urls`](Self::node_urls)
    /// are then its seed nodes).
    pub fn is_cluster(&self) -> bool {
        matches!(
            self.servers().primary,
            Primary::Cluster { .. } | Primary::ExternalCluster { .. }
        )
    }

    /// A lab in front of the user's Redis at `url`.
    fn start_external(options: &LabOptions, url_given: &str) -> Result<Lab, LabError> {
        if options.replica
            || options.aof
            || options.nodes > 1
            || options.acl_user
            || options.sentinel
            || options.redis_options.is_some()
            || options.fake_clock
        {
            return Err(LabError::Options(
                "a replica, an append-only file, extra nodes, an acl user, redis options, a fake clock or a sentinel setup need throwaway servers",
            ));
        }
        options.check_proxy()?;
        let files = options.tls.clone().unwrap_or_default();
        let client = leasehold::tls::client(url_given, &files).map_err(LabError::Tls)?;
        let info = client.get_connection_info().clone();
        let (tls, host, port) = match info.addr() {
            redis::ConnectionAddr::Tcp(host, port) => (false, host.clone(), *port),
            redis::ConnectionAddr::TcpTls {
                host,
                port,
                insecure,
                ..
            } => {
                if *insecure {
                    return Err(LabError::RedisUrl(
                        "#insecure turns certificate verification off, which leasehold never does",
                    ));
                }
                (true, host.clone(), *port)
            }
            _ => {
                return Err(LabError::RedisUrl(
                    "only redis:// or rediss:// over TCP can be used (not a unix socket)",
                ));
            }
        };
        // The lab's own connection: the callers' URL, TLS and user, without
        // redis-rs's CLIENT SETINFO (outside the lock user's ACL).
        let settings = info.redis_settings().clone();
        let db = settings.db();
        let caller_auth = auth(settings.username(), settings.password());
        let admin = redis::Client::open(info.set_redis_settings(settings.set_skip_set_lib_name()))
            .map_err(|_| LabError::RedisUrl("it does not parse"))?;
        // Reachable, and the credentials work, before any run starts: the
        // handshake, then TIME (the lock user's ACL grants it; PING it
        // does not).
        let mut conn = admin
            .get_connection_with_timeout(EXTERNAL_TIMEOUT)
            .map_err(external("connecting"))?;
        conn.set_read_timeout(Some(EXTERNAL_TIMEOUT))
            .map_err(external("connecting"))?;
        query(&mut conn, &["TIME"], "TIME")?;
        let (proxy, caller_url) = if options.no_proxy {
            (None, url_given.to_owned())
        } else {
            let upstream = std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), port))
                .ok()
                .and_then(|mut addrs| addrs.next())
                .ok_or(LabError::RedisUrl("its host does not resolve"))?;
            let proxy = start_proxy(upstream, options)?;
            let host = options.proxy_host.as_deref().unwrap_or("127.0.0.1");
            let caller_url = url(tls, &caller_auth, host, proxy.port(), db);
            (Some(proxy), caller_url)
        };
        let servers = Servers::new(
            Primary::External {
                client: admin,
                conn: Mutex::new(Some(conn)),
            },
            options,
        );
        let mut lab = Lab::assemble(servers, proxy, false, Some(caller_url));
        lab.tls = options.tls.clone();
        Ok(lab)
    }

    fn assemble(
        servers: Servers,
        proxy: Option<FaultProxy>,
        aof: bool,
        caller_url: Option<String>,
    ) -> Lab {
        Lab {
            servers: Arc::new(Mutex::new(servers)),
            proxy: proxy.map(Arc::new),
            aof,
            caller_url,
            acl_password: None,
            node_auth: String::new(),
            tls: None,
            clock_note: None,
        }
    }

    fn servers(&self) -> std::sync::MutexGuard<'_, Servers> {
        self.servers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The URL callers use: the primary, through the fault proxy (or
    /// directly, with [`LabOptions::proxy`]`(false)`), with the user and
    /// password they connect as; `rediss://` over TLS. Build their client
    /// with [`client`](Self::client), which adds the TLS files.
    /// On a cluster, the first seed node's URL; on a Sentinel setup, its
    /// `redis+sentinel://` URL.
    pub fn redis_url(&self) -> String {
        match &self.caller_url {
            Some(url) => url.clone(),
            None => self.node_urls().into_iter().next().unwrap_or_default(),
        }
    }

    /// A client for [`redis_url`](Self::redis_url) with the TLS files of
    /// [`LabOptions::tls`] ([`leasehold::tls::client`]): give it to
    /// [`Locker::connect`](leasehold::Locker::connect) or a locker
    /// builder.
    ///
    /// # Errors
    /// [`LabError::Tls`] when the files cannot be read or do not go with
    /// the URL.
    pub fn client(&self) -> Result<redis::Client, LabError> {
        let files = self.tls.clone().unwrap_or_default();
        leasehold::tls::client(&self.redis_url(), &files).map_err(LabError::Tls)
    }

    /// The TLS files the callers use ([`LabOptions::tls`]), if any.
    pub fn tls_files(&self) -> Option<&TlsFiles> {
        self.tls.as_ref()
    }

    /// The URLs of a Redlock quorum: [`redis_url`](Self::redis_url) first
    /// (the node faults hit), then the extra nodes. On a cluster, its
    /// masters' URLs, the seed list of a cluster client.
    pub fn node_urls(&self) -> Vec<String> {
        match &self.servers().primary {
            Primary::Cluster { cluster, .. } => return cluster.urls(),
            Primary::ExternalCluster { urls, .. } => return urls.clone(),
            _ => {}
        }
        let mut urls = vec![self.redis_url()];
        urls.extend(
            self.servers()
                .nodes
                .iter()
                .map(|node| url(node.is_tls(), &self.node_auth, node.host(), node.port(), 0)),
        );
        urls
    }

    /// The throwaway PostgreSQL's URL (it holds a generated password: do
    /// not log it).
    pub fn postgres_url(&self) -> Option<String> {
        self.servers().postgres.as_ref().map(|pg| pg.url())
    }

    /// The worker processes a [`Fault::HolderPause`] may stop (in process,
    /// with none, it stalls a caller instead).
    pub fn set_workers(&self, pids: Vec<u32>) {
        self.servers().workers = pids;
    }

    /// How [`Fault::HolderPause`] reaches into worker processes: instead of
    /// stopping every worker but one at a random moment (which often finds
    /// no holder between its read and its write), the window's worker is
    /// told to stop itself (SIGSTOP) at its next pause point, and every
    /// worker is continued (SIGCONT) when the window ends. Needs
    /// [`set_workers`](Self::set_workers) too.
    pub fn set_pauser(&self, pauser: Pauser) {
        self.servers().pauser = Some(pauser);
    }

    /// The server logs, for a failure message.
    pub fn logs(&self) -> String {
        let servers = self.servers();
        let mut out = match &servers.primary {
            Primary::Own(primary) => format!("--- redis (primary) ---\n{}", primary.log()),
            Primary::External { .. } | Primary::ExternalCluster { .. } => {
                "--- redis: yours, no log here ---".to_owned()
            }
            Primary::Cluster { cluster, .. } => {
                let mut out = String::new();
                for (i, node) in cluster.nodes().iter().chain(cluster.replicas()).enumerate() {
                    out.push_str(&format!("--- redis cluster node {i} ---\n{}\n", node.log()));
                }
                out
            }
            Primary::Sentinel { setup, .. } => {
                let mut out = String::new();
                for (i, node) in setup.servers().iter().enumerate() {
                    out.push_str(&format!(
                        "--- redis sentinel data node {i} ---\n{}\n",
                        node.log()
                    ));
                }
                out
            }
        };
        for (i, old) in servers.retired.iter().enumerate() {
            out.push_str(&format!("\n--- redis (retired {i}) ---\n{}", old.log()));
        }
        if let Some(note) = &self.clock_note {
            out.push_str(&format!("\n--- redis on the machine's clock ---\n{note}"));
        }
        if let Some(pg) = &servers.postgres {
            out.push_str(&format!("\n--- postgresql ---\n{}", pg.log()));
        }
        out
    }

    /// Checks, before a run, that this lab can inject `fault` as asked:
    /// the servers it needs ([`LabError::Unsupported`]: the fault proxy,
    /// control of the Redis process), and on a Redis given by URL that its
    /// user may run the fault's commands ([`Fault::needs_commands`],
    /// each probed in a harmless form, see
    /// [`HARNESS_ACL_RULES`](crate::HARNESS_ACL_RULES)):
    /// [`LabError::Permission`] names the first one refused. `keys` are the
    /// run's lock keys (the key commands are probed next to the first).
    /// Blocking (a round trip per command, at most 2 s each).
    /// [`Harness::run`](crate::Harness::run) and [`run_nemesis`] call it
    /// before anything runs.
    ///
    /// # Errors
    /// As above, and [`LabError::External`] when the Redis cannot be
    /// reached.
    pub fn check_fault(&self, fault: Fault, keys: &[String]) -> Result<(), LabError> {
        if fault.needs_proxy() && self.proxy.is_none() {
            return Err(LabError::Unsupported {
                fault,
                needs: "the fault proxy (a cluster or sentinel lab has none, nor one with LabOptions::proxy(false))",
            });
        }
        let servers = self.servers();
        if fault.needs_fake_clock()
            && !matches!(&servers.primary, Primary::Own(primary) if primary.clock_rate().is_some())
        {
            return Err(LabError::Unsupported {
                fault,
                needs: NEEDS_FAKE_CLOCK,
            });
        }
        let external = matches!(
            servers.primary,
            Primary::External { .. } | Primary::ExternalCluster { .. }
        );
        if external && fault.needs_redis_process() {
            return Err(LabError::Unsupported {
                fault,
                needs: "a single redis-server the lab started (it controls the process)",
            });
        }
        if !external {
            // The lab's connections to its own servers are the default user.
            return Ok(());
        }
        let key = keys
            .first()
            .map_or_else(|| lock_key("leasehold-acl-probe"), String::clone);
        for &command in fault.needs_commands() {
            let Some(args) = crate::access::probe(command, &key) else {
                continue;
            };
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            match servers
                .primary
                .command(&args, &format!("checking the acl for {command}"))
            {
                Ok(()) => {}
                Err(LabError::External { source, .. }) if source.code() == Some("NOPERM") => {
                    return Err(LabError::Permission { fault, command });
                }
                // Any other refusal is the probe's argument: allowed.
                Err(LabError::External { source, .. }) if source.code().is_some() => {}
                Err(err) => return Err(err),
            }
        }
        Ok(())
    }

    /// Starts `window`'s fault (a repeated fault also fires once).
    fn begin(&self, window: &Window, keys: &[String], stall: &Stall) -> Result<String, LabError> {
        let fault = window.fault;
        let mut servers = self.servers();
        let target = match fault {
            Fault::None | Fault::Mixed => "nothing".to_owned(),
            Fault::HolderPause => {
                if servers.workers.is_empty() {
                    stall.arm(window.length);
                    "a holder (stalled in process)".to_owned()
                } else if let Some(pauser) = &servers.pauser {
                    let worker = window.worker % u32::try_from(servers.workers.len()).unwrap_or(1);
                    pauser(worker, true);
                    format!("w{worker} (stops itself between a read and its write)")
                } else {
                    // Every worker but one: whoever holds a lease is then
                    // most likely paused, and the survivor takes over.
                    let survivor = window.worker as usize % servers.workers.len();
                    for (index, pid) in servers.workers.iter().enumerate() {
                        if index != survivor || servers.workers.len() == 1 {
                            leasehold_testkit::pause_process(*pid)
                                .map_err(server("pausing a worker"))?;
                        }
                    }
                    format!("every worker but w{survivor}")
                }
            }
            Fault::RedisPause => {
                own(&mut servers.primary, fault)?
                    .pause()
                    .map_err(server("pausing redis"))?;
                "redis".to_owned()
            }
            Fault::RedisRestart | Fault::RedisRestartAof => {
                if fault == Fault::RedisRestartAof && !self.aof {
                    return Err(LabError::Unsupported {
                        fault,
                        needs: "redis with an append-only file",
                    });
                }
                own(&mut servers.primary, fault)?
                    .kill()
                    .map_err(server("killing redis"))?;
                "redis".to_owned()
            }
            Fault::Failover => {
                self.proxy(fault)?;
                let Servers {
                    primary, replica, ..
                } = &mut *servers;
                let primary = own(primary, fault)?;
                let replica = replica.as_ref().ok_or(LabError::Unsupported {
                    fault,
                    needs: "a replica",
                })?;
                // A partition between primary and replica: nothing written
                // from now on reaches the replica.
                replica.pause().map_err(server("pausing the replica"))?;
                primary
                    .command(&["CLIENT", "KILL", "TYPE", "replica"])
                    .map_err(server("cutting the replication link"))?;
                "replica (partitioned)".to_owned()
            }
            Fault::NetLatency => {
                self.proxy(fault)?
                    .set_latency(Direction::Both, window.length / 6);
                "network".to_owned()
            }
            Fault::NetCut => {
                self.proxy(fault)?.cut();
                "network".to_owned()
            }
            Fault::NetBlackhole => {
                self.proxy(fault)?.blackhole(true);
                "network".to_owned()
            }
            Fault::SlotMigration => {
                let Primary::Cluster { cluster, owner } = &mut servers.primary else {
                    return Err(no_cluster(fault));
                };
                let slot = lock_slot(cluster, keys)?;
                let from = match *owner {
                    Some(from) => from,
                    None => owner_of(cluster, slot)?,
                };
                let to = (from + 1) % cluster.nodes().len();
                cluster
                    .begin_slot_migration(slot, from, to)
                    .map_err(server("starting a slot migration"))?;
                *owner = Some(from);
                format!("slot {slot}, node {from} to {to}")
            }
            Fault::ClusterFailover => {
                let Primary::Cluster { cluster, .. } = &servers.primary else {
                    return Err(no_cluster(fault));
                };
                let slot = lock_slot(cluster, keys)?;
                let index = owner_of(cluster, slot)?;
                cluster
                    .failover(index, Failover::Coordinated)
                    .map_err(server("a cluster failover"))?;
                format!("master {index} (slot {slot})")
            }
            Fault::PostgresPause => {
                let pg = servers.postgres.as_ref().ok_or(LabError::Unsupported {
                    fault,
                    needs: "a throwaway postgresql",
                })?;
                pg.pause().map_err(server("pausing postgresql"))?;
                "postgresql".to_owned()
            }
            Fault::PostgresRestart => {
                let pg = servers.postgres.as_ref().ok_or(LabError::Unsupported {
                    fault,
                    needs: "a throwaway postgresql",
                })?;
                pg.stop().map_err(server("stopping postgresql"))?;
                "postgresql".to_owned()
            }
            Fault::KeyLoss | Fault::EarlyExpiry | Fault::ScriptFlush => {
                drop(servers);
                self.repeat(fault, keys)?;
                "lock keys".to_owned()
            }
            Fault::ConnKill => {
                drop(servers);
                self.repeat(fault, keys)?;
                "redis connections".to_owned()
            }
            Fault::Eviction => {
                let primary = own(&mut servers.primary, fault)?;
                let info = primary
                    .command(&["INFO", "memory"])
                    .map_err(server("reading redis's memory use"))?
                    .to_string();
                let used: u64 = info
                    .lines()
                    .find_map(|line| line.strip_prefix("used_memory:"))
                    .and_then(|value| value.trim().parse().ok())
                    .ok_or(LabError::Options("redis did not report its memory use"))?;
                let limit = (used + EVICTION_HEADROOM).to_string();
                primary
                    .command(&["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"])
                    .map_err(server("setting an eviction policy"))?;
                primary
                    .command(&["CONFIG", "SET", "maxmemory", &limit])
                    .map_err(server("limiting redis's memory"))?;
                drop(servers);
                self.repeat(fault, keys)?;
                format!("redis memory ({limit} bytes, allkeys-lru)")
            }
            Fault::Oom => {
                let primary = own(&mut servers.primary, fault)?;
                for args in [
                    &["CONFIG", "SET", "maxmemory-policy", "noeviction"][..],
                    &["CONFIG", "SET", "maxmemory", "1"],
                ] {
                    primary
                        .command(args)
                        .map_err(server("filling redis's memory"))?;
                }
                "redis memory (1 byte, noeviction)".to_owned()
            }
            Fault::Flushall => {
                own(&mut servers.primary, fault)?
                    .command(&["FLUSHALL"])
                    .map_err(server("flushing redis"))?;
                "redis dataset".to_owned()
            }
            Fault::ClockJump => {
                drop(servers);
                self.repeat(fault, keys)?;
                format!("redis clock (+{} s a step)", CLOCK_JUMP.as_secs())
            }
            Fault::ClockFast => {
                own(&mut servers.primary, fault)?
                    .set_clock_rate(CLOCK_RATE)
                    .map_err(server("speeding redis's clock up"))?;
                format!("redis clock (x{CLOCK_RATE})")
            }
            Fault::Maxclients => {
                let url = own(&mut servers.primary, fault)?.url();
                // The lab's own connection stays (Redis closes none over
                // the limit) and lifts it at the end; every caller's is
                // cut and cannot come back meanwhile.
                let mut conn = redis::Client::open(url)
                    .and_then(|client| client.get_connection_with_timeout(LIMITER_TIMEOUT))
                    .map_err(limiter_err)?;
                for args in [
                    &["CONFIG", "SET", "maxclients", "1"][..],
                    &["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"],
                    &["CLIENT", "KILL", "TYPE", "pubsub"],
                ] {
                    redis::cmd(args[0])
                        .arg(&args[1..])
                        .exec(&mut conn)
                        .map_err(limiter_err)?;
                }
                servers.limiter = Some(conn);
                "redis connections (maxclients 1)".to_owned()
            }
            Fault::Demotion => {
                if !self.node_auth.is_empty() || self.tls.is_some() {
                    return Err(LabError::Unsupported {
                        fault,
                        needs: "a throwaway redis without a password or tls (the demoted server replicates an empty one)",
                    });
                }
                let empty = RedisServer::start().map_err(server("starting an empty redis"))?;
                let port = empty.port().to_string();
                own(&mut servers.primary, fault)?
                    .command(&["REPLICAOF", empty.host(), &port])
                    .map_err(server("demoting redis"))?;
                servers.demoter = Some(empty);
                format!("redis (the replica of an empty redis :{port})")
            }
            Fault::AclReset => {
                let primary = own(&mut servers.primary, fault)?;
                if self.acl_password.is_none() {
                    return Err(LabError::Unsupported {
                        fault,
                        needs: "callers connected as an acl user (LabOptions::acl_user)",
                    });
                }
                // Deleting the user also closes every connection of it.
                primary
                    .command(&["ACL", "DELUSER", ACL_USER])
                    .map_err(server("deleting the lock's acl user"))?;
                format!("acl user {ACL_USER}")
            }
            Fault::SentinelFailover => {
                let Primary::Sentinel { setup, old } = &mut servers.primary else {
                    return Err(no_sentinel(fault));
                };
                let port = setup
                    .primary_port()
                    .map_err(server("finding the sentinels' primary"))?;
                // Asked without waiting: the window's end waits for the new
                // primary, so the window spans the failover.
                let sentinel = setup
                    .sentinel_urls()
                    .into_iter()
                    .next()
                    .ok_or(no_sentinel(fault))?;
                let client = redis::Client::open(sentinel)
                    .map_err(external("opening a sentinel connection"))?;
                let mut conn = client
                    .get_connection_with_timeout(EXTERNAL_TIMEOUT)
                    .map_err(external("connecting to a sentinel"))?;
                conn.set_read_timeout(Some(EXTERNAL_TIMEOUT))
                    .map_err(external("connecting to a sentinel"))?;
                let master = setup.master().to_owned();
                query(
                    &mut conn,
                    &["SENTINEL", "FAILOVER", &master],
                    "SENTINEL FAILOVER",
                )?;
                *old = Some(port);
                format!("primary :{port} (SENTINEL FAILOVER)")
            }
            Fault::SentinelKill => {
                let Primary::Sentinel { setup, old } = &mut servers.primary else {
                    return Err(no_sentinel(fault));
                };
                let port = setup
                    .kill_primary()
                    .map_err(server("killing the sentinels' primary"))?;
                *old = Some(port);
                format!("primary :{port} (killed)")
            }
            Fault::RedisStall | Fault::ClientPauseWrite => {
                // Redis ends the pause by itself at the window's end (no
                // command, `CLIENT UNPAUSE` included, gets through it).
                let ms = window.length.as_millis().max(1).to_string();
                let what = if fault == Fault::RedisStall {
                    "ALL"
                } else {
                    "WRITE"
                };
                servers
                    .primary
                    .command(&["CLIENT", "PAUSE", &ms, what], "stalling redis")?;
                "redis".to_owned()
            }
            Fault::PubsubKill => {
                drop(servers);
                self.repeat(fault, keys)?;
                "redis pub/sub connections".to_owned()
            }
        };
        Ok(target)
    }

    /// Fires a repeated fault once more.
    fn repeat(&self, fault: Fault, keys: &[String]) -> Result<(), LabError> {
        let servers = self.servers();
        let redis = &servers.primary;
        let what = format!("injecting {fault}");
        match fault {
            Fault::KeyLoss => {
                let mut args = vec!["DEL"];
                args.extend(keys.iter().map(String::as_str));
                redis.command(&args, &what)
            }
            Fault::EarlyExpiry => keys
                .iter()
                .try_for_each(|key| redis.command(&["PEXPIRE", key, "1"], &what)),
            Fault::ScriptFlush => redis.command(&["SCRIPT", "FLUSH"], &what),
            Fault::Eviction => redis.command(&["EVAL", FILL, "0", "500"], &what),
            // Every client but this one (`SKIPME yes` is the default) and
            // the replicas.
            Fault::ConnKill => redis.command(&["CLIENT", "KILL", "TYPE", "normal"], &what),
            Fault::PubsubKill => redis.command(&["CLIENT", "KILL", "TYPE", "pubsub"], &what),
            Fault::ClockJump => match redis {
                Primary::Own(primary) => primary.jump_clock(CLOCK_JUMP).map_err(server_err(&what)),
                _ => Err(LabError::Unsupported {
                    fault,
                    needs: NEEDS_FAKE_CLOCK,
                }),
            },
            Fault::NetCut => {
                self.proxy(fault)?.cut();
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// The fault proxy, which a cluster or sentinel lab, or one with
    /// [`LabOptions::proxy`]`(false)`, does not have.
    fn proxy(&self, fault: Fault) -> Result<&FaultProxy, LabError> {
        self.proxy.as_deref().ok_or(LabError::Unsupported {
            fault,
            needs: "a fault proxy (a cluster or sentinel lab has none, nor one with LabOptions::proxy(false))",
        })
    }

    /// Ends `window`'s fault: resumes, heals, restarts, promotes.
    fn end(&self, window: &Window, keys: &[String], stall: &Stall) -> Result<(), LabError> {
        let fault = window.fault;
        let mut servers = self.servers();
        match fault {
            Fault::HolderPause => {
                stall.disarm();
                if let Some(pauser) = &servers.pauser
                    && !servers.workers.is_empty()
                {
                    let worker = window.worker % u32::try_from(servers.workers.len()).unwrap_or(1);
                    pauser(worker, false);
                }
                for pid in &servers.workers {
                    leasehold_testkit::resume_process(*pid).map_err(server("resuming a worker"))?;
                }
            }
            Fault::RedisPause => own(&mut servers.primary, fault)?
                .resume()
                .map_err(server("resuming redis"))?,
            Fault::RedisRestart | Fault::RedisRestartAof => {
                let primary = own(&mut servers.primary, fault)?;
                if fault == Fault::RedisRestart {
                    primary
                        .restart_empty()
                        .map_err(server("restarting redis empty"))?;
                } else {
                    primary
                        .restart()
                        .map_err(server("restarting redis from its append-only file"))?;
                }
                // An ACL user lives in memory only: the lab's comes back
                // with the server (a restarted production server would
                // load it from its ACL file).
                if let Some(password) = &self.acl_password {
                    set_acl_user(primary, password)?;
                }
            }
            Fault::Failover => {
                let Servers {
                    primary,
                    replica,
                    retired,
                    ..
                } = &mut *servers;
                let primary = own(primary, fault)?;
                let Some(promoted) = replica.take() else {
                    return Err(LabError::Unsupported {
                        fault,
                        needs: "a replica",
                    });
                };
                primary.kill().map_err(server("killing the old primary"))?;
                promoted.resume().map_err(server("resuming the replica"))?;
                promoted
                    .command(&["REPLICAOF", "NO", "ONE"])
                    .map_err(server("promoting the replica"))?;
                let proxy = self.proxy(fault)?;
                proxy.set_upstream(promoted.addr());
                proxy.cut();
                retired.push(std::mem::replace(primary, promoted));
            }
            Fault::NetLatency | Fault::NetCut | Fault::NetBlackhole => self.proxy(fault)?.heal(),
            Fault::SentinelFailover | Fault::SentinelKill => {
                let Primary::Sentinel { setup, old } = &mut servers.primary else {
                    return Err(no_sentinel(fault));
                };
                let port = old.take().ok_or(no_sentinel(fault))?;
                setup
                    .wait_for_new_primary(port, SENTINEL_FAILOVER_WAIT)
                    .map_err(server("waiting for the sentinels' new primary"))?;
            }
            Fault::SlotMigration => {
                let Primary::Cluster { cluster, owner } = &mut servers.primary else {
                    return Err(no_cluster(fault));
                };
                let slot = lock_slot(cluster, keys)?;
                let from = owner.ok_or(no_cluster(fault))?;
                let to = (from + 1) % cluster.nodes().len();
                cluster
                    .finish_slot_migration(slot, from, to)
                    .map_err(server("finishing a slot migration"))?;
                *owner = Some(to);
            }
            Fault::PostgresPause => {
                if let Some(pg) = &servers.postgres {
                    pg.resume().map_err(server("resuming postgresql"))?;
                }
            }
            Fault::PostgresRestart => {
                if let Some(pg) = &servers.postgres {
                    pg.start_again()
                        .map_err(server("starting postgresql again"))?;
                }
            }
            Fault::Eviction => {
                let primary = own(&mut servers.primary, fault)?;
                for args in [
                    &["CONFIG", "SET", "maxmemory", "0"][..],
                    &["CONFIG", "SET", "maxmemory-policy", "noeviction"],
                    &["EVAL", EMPTY, "0"],
                ] {
                    primary
                        .command(args)
                        .map_err(server("ending the eviction"))?;
                }
            }
            Fault::Oom => {
                own(&mut servers.primary, fault)?
                    .command(&["CONFIG", "SET", "maxmemory", "0"])
                    .map_err(server("ending the memory limit"))?;
            }
            Fault::ClockFast => {
                own(&mut servers.primary, fault)?
                    .set_clock_rate(1.0)
                    .map_err(server("slowing redis's clock down"))?;
            }
            Fault::Maxclients => {
                let lifted = match servers.limiter.take() {
                    Some(mut conn) => redis::cmd("CONFIG")
                        .arg(&["SET", "maxclients", "10000"])
                        .exec(&mut conn)
                        .map_err(limiter_err),
                    None => Ok(()),
                };
                if lifted.is_err() {
                    // The held connection broke: a new one may get in now
                    // that the callers' attempts were refused.
                    own(&mut servers.primary, fault)?
                        .command(&["CONFIG", "SET", "maxclients", "10000"])
                        .map_err(server("ending the connection limit"))?;
                }
            }
            Fault::Demotion => {
                own(&mut servers.primary, fault)?
                    .command(&["REPLICAOF", "NO", "ONE"])
                    .map_err(server("promoting redis back"))?;
                if let Some(empty) = servers.demoter.take() {
                    servers.retired.push(empty);
                }
            }
            Fault::AclReset => {
                if let Some(password) = &self.acl_password {
                    set_acl_user(own(&mut servers.primary, fault)?, password)?;
                }
            }
            Fault::None
            | Fault::Mixed
            | Fault::ClusterFailover
            | Fault::KeyLoss
            | Fault::EarlyExpiry
            | Fault::ScriptFlush
            | Fault::ConnKill
            | Fault::PubsubKill
            | Fault::Flushall
            // The step stays (see Fault::ClockJump).
            | Fault::ClockJump
            | Fault::ClientPauseWrite
            | Fault::RedisStall => {}
        }
        Ok(())
    }

    /// Leaves every server running and reachable: resumes what is paused,
    /// heals the proxy. Called when a run ends, whatever happened.
    pub fn heal(&self) {
        if let Some(proxy) = &self.proxy {
            proxy.heal();
        }
        let servers = self.servers();
        for pid in &servers.workers {
            let _ = leasehold_testkit::resume_process(*pid);
        }
        if let Primary::Own(primary) = &servers.primary {
            if primary.is_paused() {
                let _ = primary.resume();
            }
            if primary.clock_rate().is_some_and(|rate| rate != 1.0) {
                let _ = primary.set_clock_rate(1.0);
            }
        }
        if let Some(replica) = &servers.replica
            && replica.is_paused()
        {
            let _ = replica.resume();
        }
        if let Some(pg) = &servers.postgres {
            if pg.is_paused() {
                let _ = pg.resume();
            }
            // A no-op when it runs.
            let _ = pg.start_again();
        }
    }
}

/// How long a command to an external Redis may take.
const EXTERNAL_TIMEOUT: Duration = Duration::from_secs(2);

fn external(what: impl Into<String>) -> impl FnOnce(redis::RedisError) -> LabError {
    let what = what.into();
    move |source| LabError::External { what, source }
}

/// The throwaway primary `fault` needs to control.
fn own(primary: &mut Primary, fault: Fault) -> Result<&mut RedisServer, LabError> {
    match primary {
        Primary::Own(server) => Ok(server),
        Primary::External { .. }
        | Primary::ExternalCluster { .. }
        | Primary::Cluster { .. }
        | Primary::Sentinel { .. } => Err(LabError::Unsupported {
            fault,
            needs: "a single redis-server the lab started (it controls the process)",
        }),
    }
}

/// How long the lab waits to connect for a `maxclients` window.
const LIMITER_TIMEOUT: Duration = Duration::from_secs(5);

/// A failure of the lab's own connection for a `maxclients` window.
fn limiter_err(err: redis::RedisError) -> LabError {
    LabError::Options(if err.is_io_error() {
        "could not hold a connection to redis for the maxclients window"
    } else {
        "redis refused the maxclients window's commands"
    })
}

/// How long a Sentinel fault's window waits, at most, for every sentinel
/// to name the new primary.
const SENTINEL_FAILOVER_WAIT: Duration = Duration::from_secs(30);

fn no_sentinel(fault: Fault) -> LabError {
    LabError::Unsupported {
        fault,
        needs: "a redis sentinel setup",
    }
}

fn no_cluster(fault: Fault) -> LabError {
    LabError::Unsupported {
        fault,
        needs: "a redis cluster",
    }
}

/// The slot of the lock keys (they share one: each names its resource in
/// a hash tag, and the nemesis moves the first one's).
fn lock_slot(cluster: &RedisCluster, keys: &[String]) -> Result<u16, LabError> {
    let key = keys
        .first()
        .ok_or(LabError::Options("no lock key to move"))?;
    cluster
        .slot_of(key)
        .map_err(server("finding the lock key's slot"))
}

/// The index of the master serving `slot` now (after failovers too).
fn owner_of(cluster: &RedisCluster, slot: u16) -> Result<usize, LabError> {
    cluster
        .owner_of(slot)
        .map_err(server("finding the master of the lock key's slot"))
}

impl Primary {
    /// Runs one command, its reply dropped.
    fn command(&self, args: &[&str], what: &str) -> Result<(), LabError> {
        match self {
            Primary::Own(server) => server.command(args).map(drop).map_err(server_err(what)),
            Primary::Cluster { .. } => Err(LabError::Options(
                "key and script faults are not sent to a throwaway cluster lab",
            )),
            // The primary the sentinels name now.
            Primary::Sentinel { setup, .. } => setup
                .primary()
                .and_then(|primary| primary.command(args))
                .map(drop)
                .map_err(server_err(what)),
            Primary::ExternalCluster { client, .. } => {
                let mut conn = client.get_connection().map_err(external(what))?;
                match args {
                    // The cluster client sends each key to its master.
                    ["DEL", keys @ ..] => keys
                        .iter()
                        .try_for_each(|key| query(&mut conn, &["DEL", key], what)),
                    ["SCRIPT", "FLUSH"] => {
                        // Every master caches scripts: flush each one.
                        let pipe = redis::cmd("SCRIPT").arg("FLUSH").to_owned();
                        conn.route_command(
                            &pipe,
                            redis::cluster_routing::RoutingInfo::MultiNode((
                                redis::cluster_routing::MultipleNodeRoutingInfo::AllMasters,
                                Some(redis::cluster_routing::ResponsePolicy::AllSucceeded),
                            )),
                        )
                        .map(drop)
                        .map_err(external(what))
                    }
                    _ => query(&mut conn, args, what),
                }
            }
            Primary::External { client, conn } => {
                let mut cached = conn.lock().unwrap_or_else(PoisonError::into_inner);
                let mut open = match cached.take() {
                    Some(open) => open,
                    None => {
                        let open = client
                            .get_connection_with_timeout(EXTERNAL_TIMEOUT)
                            .map_err(external(what))?;
                        open.set_read_timeout(Some(EXTERNAL_TIMEOUT))
                            .map_err(external(what))?;
                        open
                    }
                };
                let result = query(&mut open, args, what);
                // A refusal leaves the connection usable; anything else
                // (a timeout, a reset) may not.
                if matches!(&result, Err(LabError::External { source, .. }) if source.code().is_none())
                {
                    drop(open);
                } else {
                    *cached = Some(open);
                }
                result
            }
        }
    }
}

/// Sends `args` (a command and its arguments), its reply dropped.
fn query(conn: &mut impl redis::ConnectionLike, args: &[&str], what: &str) -> Result<(), LabError> {
    let Some((name, rest)) = args.split_first() else {
        return Err(LabError::Options("an empty redis command"));
    };
    redis::cmd(name)
        .arg(rest)
        .query::<redis::Value>(conn)
        .map(drop)
        .map_err(external(what))
}

fn server_err(what: &str) -> impl FnOnce(leasehold_testkit::Error) -> LabError {
    server(what.to_owned())
}

/// `text` percent-encoded for a URL's user or password.
fn encode(text: &str) -> String {
    let mut out = String::new();
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// [`Fault::Eviction`]'s memory limit above what Redis uses when it
/// starts: 1 MiB.
const EVICTION_HEADROOM: u64 = 1 << 20;

/// [`Fault::Eviction`]'s filler: `ARGV[1]` new 1 KiB keys `filler:R:I`, R
/// a round counter.
const FILL: &str = "local round = redis.call('INCR', 'filler:round') \
    local value = string.rep('x', 1024) \
    for i = 1, tonumber(ARGV[1]) do \
        redis.call('SET', 'filler:' .. round .. ':' .. i, value) \
    end \
    return round";

/// Deletes the filler's keys.
const EMPTY: &str = "local keys = redis.call('KEYS', 'filler:*') \
    for i = 1, #keys, 1000 do \
        redis.call('DEL', unpack(keys, i, math.min(i + 999, #keys))) \
    end \
    return #keys";

/// How often a repeated fault fires within its window.
fn period(fault: Fault) -> Duration {
    match fault {
        Fault::KeyLoss | Fault::EarlyExpiry => Duration::from_millis(5),
        Fault::NetCut | Fault::ConnKill => Duration::from_millis(100),
        Fault::PubsubKill => Duration::from_millis(300),
        Fault::ClockJump => Duration::from_millis(25),
        _ => Duration::from_millis(50),
    }
}

/// Runs `windows` against `lab` from `t0` (the run's start), recording each
/// fault's start and end, until the schedule ends or `stop` is set. Every
/// fault is ended (and the lab healed) before it returns, even on error.
/// Blocking: run it on its own thread.
///
/// # Errors
/// The first [`LabError`]: the run's results would not mean what they say.
pub fn run_nemesis(
    lab: &Lab,
    windows: &[Window],
    keys: &[String],
    recorder: &Recorder,
    stall: &Stall,
    t0: Instant,
    stop: &AtomicBool,
) -> Result<(), LabError> {
    let mut faults: Vec<Fault> = windows.iter().map(|window| window.fault).collect();
    faults.dedup();
    if let Err(err) = faults
        .into_iter()
        .try_for_each(|fault| lab.check_fault(fault, keys))
    {
        lab.heal();
        return Err(err);
    }
    let result = windows.iter().try_for_each(|window| {
        if !sleep_until(t0 + window.start, stop) {
            return Ok(());
        }
        let fault = window.fault.name().to_owned();
        let began = lab.begin(window, keys, stall);
        let target = match &began {
            Ok(target) => target.clone(),
            Err(_) => "error".to_owned(),
        };
        recorder.record(
            "nemesis",
            Kind::FaultStart {
                fault: fault.clone(),
                target: target.clone(),
            },
        );
        let mut result = began.map(drop);
        let until = t0 + window.end();
        if window.fault.is_repeated() || window.fault == Fault::NetCut {
            while result.is_ok()
                && sleep_until((Instant::now() + period(window.fault)).min(until), stop)
                && Instant::now() < until
            {
                result = lab.repeat(window.fault, keys);
            }
        }
        sleep_until(until, stop);
        let ended = lab.end(window, keys, stall);
        recorder.record("nemesis", Kind::FaultEnd { fault, target });
        result.and(ended)
    });
    lab.heal();
    result
}

/// Sleeps until `at` in small steps; false if `stop` was set first.
fn sleep_until(at: Instant, stop: &AtomicBool) -> bool {
    loop {
        if stop.load(Ordering::SeqCst) {
            return false;
        }
        let now = Instant::now();
        if now >= at {
            return true;
        }
        std::thread::sleep((at - now).min(Duration::from_millis(5)));
    }
}
