//! Throwaway `redis-server` processes.

use std::fs;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use tempfile::TempDir;

use crate::Error;
use crate::certs::{ClientAuth, ServerTls};
use crate::clock::FakeClock;
use crate::process::{self, ChildProcess, HOST, POLL_INTERVAL, PORT_ATTEMPTS};
use crate::resp::{self, Reply};

/// The binary this module starts, found on `PATH`.
const REDIS_SERVER: &str = "redis-server";

/// The environment variable naming another server binary to start instead
/// of `redis-server`: a Redis-compatible server such as Valkey's
/// `valkey-server` (`scripts/install-deps.sh` fetches Valkey 8.1, and
/// `scripts/test.sh` runs the lease, fencing and hand-off suites on it).
pub const SERVER_ENV: &str = "LEASEHOLD_REDIS_SERVER";

/// The server binary to start: [`SERVER_ENV`]'s path if set, else
/// `redis-server` from `PATH`.
fn server_binary() -> Result<PathBuf, Error> {
    match std::env::var_os(SERVER_ENV) {
        Some(path) if !path.is_empty() => {
            let path = PathBuf::from(path);
            if process::is_executable(&path) {
                Ok(path)
            } else {
                Err(Error::BinaryNotFound {
                    name: path.display().to_string(),
                    install_hint: format!(
                        "scripts/install-deps.sh, or unset {SERVER_ENV} to use redis-server"
                    ),
                })
            }
        }
        _ => process::find_binary(REDIS_SERVER, REDIS_SERVER, &[]),
    }
}

/// How long [`RedisServer::redis_cli`] waits for a connection or a reply.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest a single readiness probe may wait for a `PING` reply.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// How many log lines error messages include.
const ERROR_LOG_LINES: usize = 30;

/// Options for [`RedisServer::start_with`], built with consuming setters.
///
/// ```no_run
/// use std::time::Duration;
/// use leasehold_testkit::{RedisOptions, RedisServer};
///
/// let server = RedisServer::start_with(
///     RedisOptions::default()
///         .password("s3cret")
///         .args(["--maxmemory", "64mb"])
///         .ready_timeout(Duration::from_secs(5)),
/// )?;
/// # Ok::<(), leasehold_testkit::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct RedisOptions {
    password: Option<String>,
    replica_of: Option<(String, u16)>,
    appendonly: bool,
    args: Vec<String>,
    ready_timeout: Duration,
    tls: Option<ServerTls>,
    fake_clock: bool,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            password: None,
            replica_of: None,
            appendonly: false,
            args: Vec::new(),
            ready_timeout: Duration::from_secs(10),
            tls: None,
            fake_clock: false,
        }
    }
}

/// Where a TLS server's PEM files live in its directory.
const TLS_FILES: [&str; 5] = [
    "tls-cert.pem",
    "tls-key.pem",
    "tls-ca.pem",
    "tls-client-cert.pem",
    "tls-client-key.pem",
];

impl RedisOptions {
    /// Requires clients to authenticate with `password` (`--requirepass`).
    ///
    /// Combined with [`replica_of`](Self::replica_of), the same password is
    /// used to authenticate to the primary (`--masterauth`).
    #[must_use]
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(password.into());
        self
    }

    /// Starts the server as a replica of `host:port` (`--replicaof`).
    #[must_use]
    pub fn replica_of(mut self, host: &str, port: u16) -> Self {
        self.replica_of = Some((host.to_owned(), port));
        self
    }

    /// Turns on the append-only file with an fsync after every write
    /// (`--appendonly yes --appendfsync always`), so every write the server
    /// acknowledged survives [`kill`](RedisServer::kill) and
    /// [`restart`](RedisServer::restart). Defaults to off (no persistence).
    #[must_use]
    pub fn appendonly(mut self) -> Self {
        self.appendonly = true;
        self
    }

    /// Appends one raw command-line argument, e.g. `"--cluster-enabled"`.
    #[must_use]
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Appends several raw command-line arguments, e.g.
    /// `["--cluster-enabled", "yes"]`.
    #[must_use]
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// How long to wait for the server to answer `PING` (default 10 s).
    #[must_use]
    pub fn ready_timeout(mut self, timeout: Duration) -> Self {
        self.ready_timeout = timeout;
        self
    }

    /// Serves TLS only: the server listens on its port with TLS
    /// (`--tls-port PORT --port 0`), presents `tls`'s certificate, and
    /// verifies client certificates against its CA as its
    /// [`ClientAuth`](crate::ClientAuth) says (`--tls-auth-clients`).
    /// [`RedisServer::url`] is then `rediss://...`, and
    /// [`RedisServer::command`] (and the readiness check) speak TLS,
    /// trusting the CA that signed the server's certificate and presenting
    /// the client certificate of the same [`TestCerts`](crate::TestCerts).
    ///
    /// With [`replica_of`](Self::replica_of) the replica connects to its
    /// primary over TLS too (`--tls-replication yes`), presenting the
    /// testkit's client certificate (`--tls-client-cert-file`), so the
    /// primary must speak TLS with the same [`TestCerts`](crate::TestCerts).
    /// Not for cluster nodes: the cluster bus stays plain.
    ///
    /// Defaults to none: a plain TCP server.
    #[must_use]
    pub fn tls(mut self, tls: ServerTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Runs the server on a wall clock the test can move: under
    /// libfaketime (preloaded, its setting in a file of the server's
    /// directory, re-read on every call), so that
    /// [`RedisServer::jump_clock`] steps it forward and
    /// [`RedisServer::set_clock_rate`] makes it run fast, which moves
    /// when Redis expires keys. The server's monotonic clock is left
    /// alone. A [restart](RedisServer::restart) keeps the offset and rate
    /// last set.
    ///
    /// The start checks that the server follows: its `TIME` must show a
    /// one-day offset set for a moment, then the real time again. Not
    /// every binary does: Debian's `redis-server` (linked with jemalloc)
    /// hangs at start under libfaketime; a libc-malloc build such as
    /// `scripts/valkey.sh`'s Valkey follows (select it with
    /// [`SERVER_ENV`]).
    ///
    /// Needs libfaketime (`scripts/install-deps.sh`, Debian's
    /// `libfaketime` package). Defaults to off: the machine's clock.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use leasehold_testkit::{RedisOptions, RedisServer};
    ///
    /// let server = RedisServer::start_with(RedisOptions::default().fake_clock())?;
    /// server.redis_cli(&["SET", "lease", "t", "PX", "5000"])?;
    /// server.jump_clock(Duration::from_secs(10))?;
    /// assert_eq!(server.redis_cli(&["GET", "lease"])?, "(nil)");
    /// # Ok::<(), leasehold_testkit::Error>(())
    /// ```
    #[must_use]
    pub fn fake_clock(mut self) -> Self {
        self.fake_clock = true;
        self
    }

    /// Whether [`fake_clock`](Self::fake_clock) is on.
    pub fn get_fake_clock(&self) -> bool {
        self.fake_clock
    }

    /// The password set with [`password`](Self::password), if any.
    pub fn get_password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// The TLS settings set with [`tls`](Self::tls), if any.
    pub fn get_tls(&self) -> Option<&ServerTls> {
        self.tls.as_ref()
    }

    /// The primary set with [`replica_of`](Self::replica_of), if any.
    pub fn get_replica_of(&self) -> Option<(&str, u16)> {
        self.replica_of
            .as_ref()
            .map(|(host, port)| (host.as_str(), *port))
    }

    /// Whether [`appendonly`](Self::appendonly) is on.
    pub fn get_appendonly(&self) -> bool {
        self.appendonly
    }

    /// The full `redis-server` command line (without the binary) for a server
    /// on `port` whose files live in `dir`.
    fn command_line(&self, port: u16, dir: &Path, log_path: &Path) -> Vec<String> {
        let (plain_port, tls_args) = match &self.tls {
            None => (port.to_string(), Vec::new()),
            Some(tls) => {
                let [cert, key, ca, client_cert, client_key] = TLS_FILES.map(|name| dir.join(name));
                let auth = match tls.client_auth {
                    ClientAuth::Optional => "optional",
                    ClientAuth::Required => "yes",
                    _ => "no",
                };
                let tls_args = [
                    "--tls-port",
                    &port.to_string(),
                    "--tls-cert-file",
                    &cert.to_string_lossy(),
                    "--tls-key-file",
                    &key.to_string_lossy(),
                    "--tls-ca-cert-file",
                    &ca.to_string_lossy(),
                    "--tls-auth-clients",
                    auth,
                    // What it presents when it connects out: to its primary.
                    "--tls-client-cert-file",
                    &client_cert.to_string_lossy(),
                    "--tls-client-key-file",
                    &client_key.to_string_lossy(),
                    "--tls-replication",
                    if self.replica_of.is_some() {
                        "yes"
                    } else {
                        "no"
                    },
                ]
                .map(str::to_owned)
                .to_vec();
                ("0".to_owned(), tls_args)
            }
        };
        let mut args: Vec<String> = [
            "--port",
            &plain_port,
            "--bind",
            HOST,
            "--save",
            "",
            "--appendonly",
            if self.appendonly { "yes" } else { "no" },
            "--dir",
            &dir.to_string_lossy(),
            "--logfile",
            &log_path.to_string_lossy(),
            "--daemonize",
            "no",
            "--protected-mode",
            "no",
        ]
        .into_iter()
        .map(str::to_owned)
        .collect();
        args.extend(tls_args);
        if self.appendonly {
            args.extend(["--appendfsync".to_owned(), "always".to_owned()]);
        }
        if let Some(password) = &self.password {
            args.extend(["--requirepass".to_owned(), password.clone()]);
        }
        if let Some((host, primary_port)) = &self.replica_of {
            args.extend([
                "--replicaof".to_owned(),
                host.clone(),
                primary_port.to_string(),
            ]);
            if let Some(password) = &self.password {
                args.extend(["--masterauth".to_owned(), password.clone()]);
            }
        }
        args.extend(self.args.iter().cloned());
        args
    }
}

/// One entry of a server's `ACL LOG` ([`RedisServer::acl_log`]): something
/// its ACL refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AclRefusal {
    /// Why: `command`, `key`, `channel` or `auth`.
    pub reason: String,
    /// What was refused: the command (e.g. `set`, `client|kill`), the key
    /// or channel; for `auth`, the user name tried.
    pub object: String,
    /// The user refused.
    pub username: String,
    /// How many times in a row (Redis merges repeats into one entry).
    pub count: i64,
}

impl AclRefusal {
    /// From `ACL LOG`'s name/value pairs.
    fn from_fields(fields: &[Reply]) -> AclRefusal {
        let field = |name: &str| {
            fields
                .chunks(2)
                .find(|pair| matches!(&pair[0], Reply::Bulk(key) if key == name.as_bytes()))
                .and_then(|pair| pair.get(1))
        };
        let text = |name: &str| field(name).map(Reply::to_string).unwrap_or_default();
        AclRefusal {
            reason: text("reason"),
            object: text("object"),
            username: text("username"),
            count: match field("count") {
                Some(Reply::Integer(count)) => *count,
                _ => 1,
            },
        }
    }
}

/// A `redis-server` on a free loopback port, with no persistence, whose data
/// and log live in a temporary directory.
///
/// Dropping it kills the process (`SIGKILL`) and removes the directory. If the
/// current thread is panicking (a failing test), the server's log is printed
/// to stderr first.
#[derive(Debug)]
pub struct RedisServer {
    process: ChildProcess,
    port: u16,
    options: RedisOptions,
    binary: PathBuf,
    log_path: PathBuf,
    /// Where this run's output starts in the (appended-to) log file.
    log_offset: u64,
    paused: AtomicBool,
    /// The libfaketime file of a [fake clock](RedisOptions::fake_clock).
    clock: Option<FakeClock>,
    /// Declared last so it is removed after the process is gone.
    dir: TempDir,
}

/// Why an attempt to start the server failed.
enum StartFailure {
    /// The port was taken by someone else; worth retrying on another port.
    PortTaken(Error),
    /// Anything else.
    Fatal(Error),
}

impl From<Error> for StartFailure {
    fn from(err: Error) -> Self {
        StartFailure::Fatal(err)
    }
}

impl RedisServer {
    /// Starts a server with default options and waits until it answers
    /// `PING`.
    ///
    /// # Errors
    ///
    /// [`Error::BinaryNotFound`] if `redis-server` is not installed, or any
    /// error from spawning the process or waiting for it to become ready.
    pub fn start() -> Result<RedisServer, Error> {
        Self::start_with(RedisOptions::default())
    }

    /// Starts a server with `options` and waits until it answers `PING`.
    ///
    /// If the chosen port turns out to be taken, another one is tried, up to
    /// five times in all.
    ///
    /// # Errors
    ///
    /// As for [`start`](Self::start); [`Error::PortsExhausted`] if every port
    /// tried was taken.
    pub fn start_with(options: RedisOptions) -> Result<RedisServer, Error> {
        Self::spawn(options)?.finish_start()
    }

    /// Starts `n` independent servers with default options.
    ///
    /// All processes are spawned before waiting for any of them, so this
    /// takes about as long as starting one.
    ///
    /// # Errors
    ///
    /// As for [`start`](Self::start); servers already started are killed.
    pub fn start_many(n: usize) -> Result<Vec<RedisServer>, Error> {
        Self::start_many_with(n, &RedisOptions::default())
    }

    /// Starts `n` independent servers, each with (a copy of) `options`,
    /// spawned before waiting for any, as [`start_many`](Self::start_many).
    ///
    /// # Errors
    ///
    /// As for [`start_with`](Self::start_with); servers already started
    /// are killed.
    pub fn start_many_with(n: usize, options: &RedisOptions) -> Result<Vec<RedisServer>, Error> {
        let spawned = (0..n)
            .map(|_| Self::spawn(options.clone()))
            .collect::<Result<Vec<_>, _>>()?;
        spawned.into_iter().map(Self::finish_start).collect()
    }

    /// The server's TCP port (its TLS port, for a
    /// [TLS server](RedisOptions::tls)).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Whether the server speaks TLS only ([`RedisOptions::tls`]).
    pub fn is_tls(&self) -> bool {
        self.options.tls.is_some()
    }

    /// The address the server listens on: always `"127.0.0.1"`.
    pub fn host(&self) -> &str {
        HOST
    }

    /// The server's socket address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// A connection URL: `redis://127.0.0.1:PORT/`, or
    /// `redis://:PASSWORD@127.0.0.1:PORT/` if a password is set (with the
    /// password percent-encoded). The scheme is `rediss` for a
    /// [TLS server](RedisOptions::tls).
    pub fn url(&self) -> String {
        let scheme = if self.is_tls() { "rediss" } else { "redis" };
        match &self.options.password {
            Some(password) => format!(
                "{scheme}://:{}@{HOST}:{}/",
                percent_encode(password),
                self.port
            ),
            None => format!("{scheme}://{HOST}:{}/", self.port),
        }
    }

    /// The password clients must authenticate with, if any.
    pub fn password(&self) -> Option<&str> {
        self.options.password.as_deref()
    }

    /// The options the server was started with.
    pub fn options(&self) -> &RedisOptions {
        &self.options
    }

    /// The process id of the server (of the last one, if it has been
    /// killed).
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Whether the server process is running (it may be paused); `false`
    /// after [`kill`](Self::kill).
    pub fn is_running(&self) -> bool {
        self.process.is_alive()
    }

    /// Freezes the server with `SIGSTOP`. Connections are still accepted by
    /// the kernel, but nothing is answered until [`resume`](Self::resume).
    ///
    /// Returns once the kernel reports the process stopped.
    ///
    /// # Errors
    ///
    /// [`Error::NotRunning`] after [`kill`](Self::kill), or a signal error.
    pub fn pause(&self) -> Result<(), Error> {
        self.ensure_running()?;
        process::stop(self.pid())?;
        self.paused.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Continues a [paused](Self::pause) server with `SIGCONT`.
    ///
    /// # Errors
    ///
    /// [`Error::NotRunning`] after [`kill`](Self::kill), or a signal error.
    pub fn resume(&self) -> Result<(), Error> {
        self.ensure_running()?;
        process::cont(self.pid())?;
        self.paused.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Whether the server is paused by [`pause`](Self::pause).
    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    /// Kills the server with `SIGKILL` and reaps it. Does nothing if it is
    /// already dead.
    ///
    /// # Errors
    ///
    /// A signal or wait error.
    pub fn kill(&mut self) -> Result<(), Error> {
        self.process.kill()?;
        self.paused.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Kills the server, then starts it again on the same port with the same
    /// options and the same directory, and waits until it is ready: a crash
    /// and recovery. The data survives as far as persistence kept it: all
    /// of it with [`RedisOptions::appendonly`], none with the default
    /// options. [`restart_empty`](Self::restart_empty) always starts empty.
    ///
    /// # Errors
    ///
    /// As for [`start`](Self::start); if the port was taken in the meantime,
    /// [`Error::ExitedEarly`] or [`Error::PortTaken`]. The server is left killed on error.
    pub fn restart(&mut self) -> Result<(), Error> {
        self.kill()?;
        self.respawn()?;
        match self.wait_ready() {
            Ok(()) => Ok(()),
            Err(StartFailure::PortTaken(err) | StartFailure::Fatal(err)) => Err(err),
        }
    }

    /// The contents of the server's log file (empty if it cannot be read).
    ///
    /// After [`restart`](Self::restart) this includes the earlier runs.
    pub fn log(&self) -> String {
        process::read_log(&self.log_path)
    }

    /// The temporary directory holding the server's files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Runs one command, authenticating first if a password is set, and
    /// returns the reply rendered as text (see [`Reply`]'s `Display`).
    ///
    /// Uses redis-rs's blocking client on a new connection (over TLS for a
    /// [TLS server](RedisOptions::tls)); `redis-cli` is not needed.
    ///
    /// ```no_run
    /// # let server = leasehold_testkit::RedisServer::start()?;
    /// assert_eq!(server.redis_cli(&["SET", "k", "v"])?, "OK");
    /// assert_eq!(server.redis_cli(&["GET", "k"])?, "v");
    /// # Ok::<(), leasehold_testkit::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::RedisReply`] if the server answers with an error,
    /// [`Error::Resp`] on I/O, TLS or authentication failure or a 5 s
    /// timeout (e.g. while paused).
    pub fn redis_cli(&self, args: &[&str]) -> Result<String, Error> {
        self.command(args).map(|reply| reply.to_string())
    }

    /// Like [`redis_cli`](Self::redis_cli), but returns the parsed reply.
    ///
    /// # Errors
    ///
    /// As for [`redis_cli`](Self::redis_cli).
    pub fn command(&self, args: &[&str]) -> Result<Reply, Error> {
        self.ensure_running()?;
        resp::run_command(
            &self.client()?,
            &self.addr().to_string(),
            args,
            COMMAND_TIMEOUT,
        )
    }

    /// Makes the ACL user `user` with `password` and exactly `rules` (an
    /// existing user of that name is reset first): `ACL SETUSER user reset
    /// on >password rules...`.
    ///
    /// ```no_run
    /// # let server = leasehold_testkit::RedisServer::start()?;
    /// server.set_acl_user("locker", "pw", &["~lock:*", "+set", "+evalsha"])?;
    /// # Ok::<(), leasehold_testkit::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As for [`command`](Self::command) (a rule Redis does not know is
    /// [`Error::RedisReply`]).
    pub fn set_acl_user(&self, user: &str, password: &str, rules: &[&str]) -> Result<(), Error> {
        let secret = format!(">{password}");
        let mut args = vec!["ACL", "SETUSER", user, "reset", "on", secret.as_str()];
        args.extend_from_slice(rules);
        self.command(&args).map(drop)
    }

    /// What the server's ACL refused so far, newest first (`ACL LOG`).
    ///
    /// # Errors
    ///
    /// As for [`command`](Self::command).
    pub fn acl_log(&self) -> Result<Vec<AclRefusal>, Error> {
        let Reply::Array(entries) = self.command(&["ACL", "LOG"])? else {
            return Ok(Vec::new());
        };
        Ok(entries
            .iter()
            .filter_map(|entry| match entry {
                Reply::Array(fields) => Some(AclRefusal::from_fields(fields)),
                _ => None,
            })
            .collect())
    }

    /// A redis-rs client for this server: its URL, and for a TLS server
    /// the certificates of its [`ServerTls`].
    fn client(&self) -> Result<redis::Client, Error> {
        let built = match &self.options.tls {
            None => redis::Client::open(self.url()),
            Some(tls) => redis::Client::build_with_tls(self.url(), tls.client_certificates()),
        };
        built.map_err(|source| Error::Resp {
            addr: self.addr().to_string(),
            source: std::io::Error::other(source),
        })
    }

    /// `redis-server 127.0.0.1:PORT`, for messages.
    fn name(&self) -> String {
        format!("{REDIS_SERVER} {HOST}:{}", self.port)
    }

    fn ensure_running(&self) -> Result<(), Error> {
        if self.process.is_alive() {
            Ok(())
        } else {
            Err(Error::NotRunning {
                server: self.name(),
            })
        }
    }

    /// Creates the directory, picks a port and spawns the process without
    /// waiting for it.
    fn spawn(options: RedisOptions) -> Result<Self, Error> {
        let binary = server_binary()?;
        let dir = tempfile::Builder::new()
            .prefix("leasehold-redis-")
            .tempdir()
            .map_err(process::io_err(&std::env::temp_dir()))?;
        let log_path = dir.path().join("redis.log");
        if let Some(tls) = &options.tls {
            crate::certs::install_provider();
            let (client_cert, client_key) = tls.client_pair();
            for (name, pem) in TLS_FILES.into_iter().zip([
                tls.cert.as_str(),
                tls.key.as_str(),
                tls.client_ca.as_str(),
                client_cert,
                client_key,
            ]) {
                let path = dir.path().join(name);
                fs::write(&path, pem).map_err(process::io_err(&path))?;
            }
        }
        let clock = if options.fake_clock {
            Some(FakeClock::new(dir.path())?)
        } else {
            None
        };
        let port = process::free_port()?;
        let process = spawn_process(&binary, &options, port, dir.path(), &log_path, &clock)?;
        Ok(Self {
            process,
            port,
            options,
            binary,
            log_path,
            log_offset: 0,
            paused: AtomicBool::new(false),
            clock,
            dir,
        })
    }

    /// Spawns the process again on the current port (after it was killed).
    fn respawn(&mut self) -> Result<(), Error> {
        self.log_offset = process::file_len(&self.log_path);
        self.process = spawn_process(
            &self.binary,
            &self.options,
            self.port,
            self.dir.path(),
            &self.log_path,
            &self.clock,
        )?;
        self.paused.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Waits until the spawned server is ready, moving to a new port when
    /// the current one turns out to be taken.
    fn finish_start(mut self) -> Result<Self, Error> {
        for attempt in 1..=PORT_ATTEMPTS {
            match self.wait_ready() {
                Ok(()) => {
                    if self.clock.is_some()
                        && let Err(err) = self.check_clock()
                    {
                        self.process.kill()?;
                        return Err(err);
                    }
                    return Ok(self);
                }
                Err(StartFailure::Fatal(err)) => return Err(err),
                Err(StartFailure::PortTaken(_)) if attempt < PORT_ATTEMPTS => {
                    self.port = process::free_port()?;
                    self.respawn()?;
                }
                Err(StartFailure::PortTaken(_)) => {}
            }
        }
        Err(Error::PortsExhausted {
            program: REDIS_SERVER.to_owned(),
            attempts: PORT_ATTEMPTS,
        })
    }

    /// Polls until the server answers `PING` (or `NOAUTH`); kills it on
    /// failure.
    fn wait_ready(&mut self) -> Result<(), StartFailure> {
        let timeout = self.options.ready_timeout;
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.process.try_wait()? {
                let log = process::read_log_from(&self.log_path, self.log_offset);
                let err = Error::ExitedEarly {
                    server: self.name(),
                    status,
                    log_tail: process::tail(&log, ERROR_LOG_LINES).to_owned(),
                };
                return Err(if log.contains("Address already in use") {
                    StartFailure::PortTaken(err)
                } else {
                    StartFailure::Fatal(err)
                });
            }
            if self.clock.is_some() && self.run_log().contains("libfaketime:") {
                // It does not recover: libfaketime says why, then it hangs.
                self.process.kill()?;
                return Err(StartFailure::Fatal(self.not_driven(format!(
                    "it hung at start under libfaketime (a jemalloc-linked redis-server does); log tail:\n{}",
                    process::tail(&self.run_log(), ERROR_LOG_LINES)
                ))));
            }
            let now = Instant::now();
            if now >= deadline {
                self.process.kill()?;
                if self.clock.is_some() {
                    return Err(StartFailure::Fatal(self.not_driven(format!(
                        "it did not answer within {timeout:?} under libfaketime; log tail:\n{}",
                        process::tail(&self.run_log(), ERROR_LOG_LINES)
                    ))));
                }
                return Err(StartFailure::Fatal(Error::NotReady {
                    server: self.name(),
                    timeout,
                    log_tail: process::tail(&self.run_log(), ERROR_LOG_LINES).to_owned(),
                }));
            }
            if self.answers_ping((deadline - now).min(PROBE_TIMEOUT)) {
                return match self.answering_pid() {
                    Some(pid) if pid != self.pid() => {
                        // Another server owns the port; ours will fail to bind.
                        self.process.kill()?;
                        Err(StartFailure::PortTaken(Error::PortTaken {
                            port: self.port,
                            owner_pid: pid,
                        }))
                    }
                    _ => Ok(()),
                };
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    /// The log of the current run only.
    fn run_log(&self) -> String {
        process::read_log_from(&self.log_path, self.log_offset)
    }

    /// The `process_id` reported by `INFO server` of whatever answers on our
    /// port, if it can be determined.
    fn answering_pid(&self) -> Option<u32> {
        let reply = self.command(&["INFO", "server"]).ok()?;
        let Reply::Bulk(info) = reply else {
            return None;
        };
        String::from_utf8_lossy(&info)
            .lines()
            .find_map(|line| line.strip_prefix("process_id:"))
            .and_then(|pid| pid.trim().parse().ok())
    }
}

/// The offset a [fake clock](RedisOptions::fake_clock)'s start check sets
/// for a moment: one day, in milliseconds.
const PROBE_OFFSET_MS: i64 = 86_400_000;

/// How far the server's `TIME` may land from what the start check set (a
/// round trip, and a loaded machine's stalls, are far below).
const PROBE_SLACK_MS: i64 = 60_000;

/// A [fake clock](RedisOptions::fake_clock): reading it, stepping it,
/// speeding it up.
impl RedisServer {
    /// The server's wall clock, as its `TIME` says.
    ///
    /// # Errors
    ///
    /// As for [`command`](Self::command); [`Error::Resp`] if the reply is
    /// not two integers.
    pub fn time(&self) -> Result<SystemTime, Error> {
        let reply = self.command(&["TIME"])?;
        parse_time(&reply).ok_or_else(|| Error::Resp {
            addr: self.addr().to_string(),
            source: std::io::Error::other(format!("TIME answered {reply}")),
        })
    }

    /// Steps the server's wall clock `by` forward, from where it is now
    /// (measured with `TIME`, to within half a round trip): every key whose
    /// deadline falls in the step expires. The clock goes on at its rate
    /// from there; the step is not undone.
    ///
    /// # Errors
    ///
    /// [`Error::FakeClock`] if the server was not started with
    /// [`RedisOptions::fake_clock`], or while its clock runs at another
    /// rate than 1 ([`set_clock_rate`](Self::set_clock_rate) it back
    /// first); as for [`time`](Self::time); [`Error::Io`] if the file
    /// cannot be written.
    pub fn jump_clock(&self, by: Duration) -> Result<(), Error> {
        let clock = self.fake_clock()?;
        if clock.setting().rate != 1.0 {
            return Err(Error::FakeClock {
                server: self.name(),
                reason: "a jump while it runs at another rate than 1 (libfaketime would ignore it)",
            });
        }
        let offset_ms = self.clock_offset_ms()?;
        let by_ms = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        clock.set_offset(offset_ms.saturating_add(by_ms))
    }

    /// Makes the server's wall clock run `rate` times as fast as this
    /// machine's (`3.0`: three seconds a second; `1.0`: at its rate again),
    /// from the time it shows now: no step. Time a fast clock gained stays
    /// when it slows down.
    ///
    /// # Errors
    ///
    /// [`Error::FakeClock`] if the server was not started with
    /// [`RedisOptions::fake_clock`] or `rate` is not a positive number;
    /// [`Error::Io`] if the file cannot be written.
    pub fn set_clock_rate(&self, rate: f64) -> Result<(), Error> {
        let clock = self.fake_clock()?;
        if !(rate.is_finite() && rate > 0.0) {
            return Err(Error::FakeClock {
                server: self.name(),
                reason: "its rate must be a positive number",
            });
        }
        if clock.setting().rate == rate {
            return Ok(());
        }
        clock.set_rate(rate)
    }

    /// The rate of the server's [fake clock](RedisOptions::fake_clock)
    /// (1.0 unless [`set_clock_rate`](Self::set_clock_rate) changed it);
    /// `None` on the machine's clock.
    pub fn clock_rate(&self) -> Option<f64> {
        self.clock.as_ref().map(|clock| clock.setting().rate)
    }

    fn fake_clock(&self) -> Result<&FakeClock, Error> {
        self.clock.as_ref().ok_or_else(|| Error::FakeClock {
            server: self.name(),
            reason: "it runs on the machine's clock (start it with RedisOptions::fake_clock)",
        })
    }

    /// How far the server's clock is ahead of this machine's, in
    /// milliseconds (negative: behind): its `TIME` against the middle of
    /// the round trip.
    fn clock_offset_ms(&self) -> Result<i64, Error> {
        let before = SystemTime::now();
        let server = self.time()?;
        let after = SystemTime::now();
        let middle = before + after.duration_since(before).unwrap_or_default() / 2;
        Ok(match server.duration_since(middle) {
            Ok(ahead) => i64::try_from(ahead.as_millis()).unwrap_or(i64::MAX),
            Err(behind) => -i64::try_from(behind.duration().as_millis()).unwrap_or(i64::MAX),
        })
    }

    /// The start check of a fake clock: its `TIME` follows a one-day
    /// offset, then comes back to the real time.
    fn check_clock(&self) -> Result<(), Error> {
        let clock = self.fake_clock()?;
        for mark in [PROBE_OFFSET_MS, 0] {
            clock.set_offset(mark)?;
            let seen = self.clock_offset_ms()?;
            if (seen - mark).abs() > PROBE_SLACK_MS {
                return Err(self.not_driven(format!(
                    "with an offset of {mark} ms set, its TIME was {seen} ms from this machine's"
                )));
            }
        }
        Ok(())
    }

    fn not_driven(&self, detail: String) -> Error {
        Error::ClockNotDriven {
            server: self.name(),
            binary: self.binary.clone(),
            detail,
        }
    }
}

/// `TIME`'s reply (seconds and microseconds) as a point in time.
fn parse_time(reply: &Reply) -> Option<SystemTime> {
    let Reply::Array(parts) = reply else {
        return None;
    };
    let [seconds, micros] = parts.as_slice() else {
        return None;
    };
    let number = |part: &Reply| match part {
        Reply::Bulk(bytes) => std::str::from_utf8(bytes).ok()?.parse::<u64>().ok(),
        Reply::Integer(n) => u64::try_from(*n).ok(),
        _ => None,
    };
    Some(
        SystemTime::UNIX_EPOCH
            + Duration::from_secs(number(seconds)?)
            + Duration::from_micros(number(micros)?),
    )
}

/// Files `redis-server` persists data in, under their default names.
const PERSISTENCE_FILES: [&str; 3] = ["dump.rdb", "appendonly.aof", "appendonlydir"];

/// Fault injection beyond pause and kill: crash recovery with the data lost,
/// and failover.
impl RedisServer {
    /// Kills the server, deletes its persisted data, then starts it again
    /// on the same port with the same options and waits until it is ready:
    /// a crash that loses every key, whatever the persistence options.
    ///
    /// The files deleted are `dump.rdb`, `appendonly.aof` and
    /// `appendonlydir/` in [`dir`](Self::dir) (the log and a cluster's
    /// `nodes.conf` are kept); persistence files renamed through
    /// [`RedisOptions::args`] are not.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] if a file cannot be deleted, otherwise as for
    /// [`restart`](Self::restart). The server is left killed on error.
    pub fn restart_empty(&mut self) -> Result<(), Error> {
        self.kill()?;
        for name in PERSISTENCE_FILES {
            let path = self.dir().join(name);
            let removed = if path.is_dir() {
                fs::remove_dir_all(&path)
            } else {
                fs::remove_file(&path)
            };
            match removed {
                Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
                    return Err(process::io_err(&path)(err));
                }
                _ => {}
            }
        }
        self.restart()
    }

    /// Promotes this replica to a primary (`REPLICAOF NO ONE`); when this
    /// returns it accepts writes. It keeps the data it had replicated, so
    /// writes the old primary acknowledged but had not passed on are lost,
    /// as in a real failover. Later [`restart`](Self::restart)s start it as
    /// a primary. On a primary this changes nothing.
    ///
    /// A failover is this plus the end of the old primary:
    ///
    /// ```no_run
    /// # use leasehold_testkit::{RedisOptions, RedisServer};
    /// let mut primary = RedisServer::start()?;
    /// let mut replica = RedisServer::start_with(
    ///     RedisOptions::default().replica_of(primary.host(), primary.port()),
    /// )?;
    /// primary.kill()?;
    /// replica.promote()?;
    /// # Ok::<(), leasehold_testkit::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As for [`command`](Self::command).
    pub fn promote(&mut self) -> Result<(), Error> {
        self.command(&["REPLICAOF", "NO", "ONE"])?;
        self.options.replica_of = None;
        Ok(())
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if thread::panicking() {
            process::dump_log(&self.name(), &self.log());
        }
        // Nothing sensible can be done about a failure here.
        let _ = self.process.kill();
    }
}

fn spawn_process(
    binary: &Path,
    options: &RedisOptions,
    port: u16,
    dir: &Path,
    log_path: &Path,
    clock: &Option<FakeClock>,
) -> Result<ChildProcess, Error> {
    // redis-server reports command-line and config errors on stderr, before
    // it opens its log file, so stdout and stderr go to that same file too
    // (in append mode, like redis-server's own writes).
    let log = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_path)
        .map_err(process::io_err(log_path))?;
    let log_copy = log.try_clone().map_err(process::io_err(log_path))?;
    let mut command = Command::new(binary);
    if let Some(clock) = clock {
        let (set, remove) = clock.env();
        command.envs(set);
        for name in remove {
            command.env_remove(name);
        }
    }
    let child = command
        .args(options.command_line(port, dir, log_path))
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(log_copy)
        .stderr(log)
        .spawn()
        .map_err(|source| Error::Spawn {
            program: binary.to_owned(),
            source,
        })?;
    Ok(ChildProcess::new(child))
}

impl RedisServer {
    /// Whether something on our port answers `PING` with `PONG` (or
    /// `NOAUTH`), or, for a TLS server, completes a handshake up to a
    /// certificate our client refuses (a server given
    /// [`TestCerts::expired_server`](crate::TestCerts::expired_server) is
    /// up, but no verifying client accepts it).
    fn answers_ping(&self, timeout: Duration) -> bool {
        let Ok(client) = self.client() else {
            return false;
        };
        match resp::run_command(&client, &self.addr().to_string(), &["PING"], timeout) {
            Ok(Reply::Simple(pong)) => pong == "PONG",
            Err(Error::RedisReply { message }) => message.starts_with("NOAUTH"),
            Err(Error::Resp { source, .. }) => {
                self.is_tls() && crate::certs::is_certificate_rejection(&source)
            }
            _ => false,
        }
    }
}

/// Percent-encodes everything but RFC 3986 unreserved characters.
fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|byte| {
            if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
                char::from(byte).to_string()
            } else {
                format!("%{byte:02X}")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_line_has_fixed_args_then_options() {
        let options = RedisOptions::default()
            .password("pw")
            .replica_of("127.0.0.1", 7000)
            .arg("--maxmemory")
            .args(["64mb"]);
        let args = options.command_line(6400, Path::new("/d"), Path::new("/d/redis.log"));
        let expected = [
            "--port",
            "6400",
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            "/d",
            "--logfile",
            "/d/redis.log",
            "--daemonize",
            "no",
            "--protected-mode",
            "no",
            "--requirepass",
            "pw",
            "--replicaof",
            "127.0.0.1",
            "7000",
            "--masterauth",
            "pw",
            "--maxmemory",
            "64mb",
        ];
        assert_eq!(args, expected);
    }

    #[test]
    fn percent_encodes_password() {
        assert_eq!(percent_encode("aZ9-._~"), "aZ9-._~");
        assert_eq!(percent_encode("a b@c/"), "a%20b%40c%2F");
    }
}
