//! Starting a server: the binary ([`SERVER_ENV`] or `redis-server`), a
//! free port (another one when it was taken), the process with its log,
//! and the wait until it answers.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use super::options::TLS_FILES;
use super::{RedisOptions, RedisServer};
use crate::Error;
use crate::clock::FakeClock;
use crate::process::{self, ChildProcess, POLL_INTERVAL, PORT_ATTEMPTS};
use crate::resp::{self, Reply};

/// The binary this module starts, found on `PATH`.
pub(super) const REDIS_SERVER: &str = "redis-server";

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

/// The longest a single readiness probe may wait for a `PING` reply.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// How many log lines error messages include.
pub(super) const ERROR_LOG_LINES: usize = 30;

/// Why an attempt to start the server failed.
pub(super) enum StartFailure {
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
    pub(super) fn respawn(&mut self) -> Result<(), Error> {
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
    pub(super) fn wait_ready(&mut self) -> Result<(), StartFailure> {
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
