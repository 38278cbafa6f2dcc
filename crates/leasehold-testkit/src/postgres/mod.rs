//! Throwaway PostgreSQL servers.

use std::fs::{self, File};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::unistd::{Gid, Uid, User};
use tempfile::TempDir;

use crate::Error;
use crate::certs::{ClientAuth, ServerTls};
use crate::clock::FakeClock;
use crate::process::{self, ChildProcess, HOST, POLL_INTERVAL, PORT_ATTEMPTS};

pub(crate) mod standby;

/// The database superuser created by `initdb`.
const USER: &str = "leasehold";

/// The system user PostgreSQL runs as when this process is root.
const SYSTEM_USER: &str = "postgres";

/// The Debian/Ubuntu package providing the binaries.
const APT_PACKAGE: &str = "postgresql";

/// Where Debian/Ubuntu install the server binaries, one directory per major
/// version.
const DEBIAN_LIB_DIR: &str = "/usr/lib/postgresql";

/// The start of the log line announcing readiness (messages are forced to
/// the C locale): `... ready to accept connections`, or on a standby
/// `... ready to accept read-only connections`.
const READY_MESSAGE: &str = "database system is ready to accept";

/// How long the server may take to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a graceful (immediate) shutdown may take before `SIGKILL`.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// How many log lines error messages include.
const ERROR_LOG_LINES: usize = 30;

/// The length of the generated password.
const PASSWORD_LEN: usize = 24;

/// A PostgreSQL server on a free loopback port with a fresh cluster in a
/// temporary directory, tuned for speed over durability (`fsync=off`).
///
/// The superuser is `leasehold` with a random password; TCP connections use
/// `scram-sha-256` password authentication. When this process runs as root,
/// `initdb` and `postgres` run as the `postgres` system user.
///
/// Dropping it shuts the server down (`SIGQUIT`, then `SIGKILL` after 5 s)
/// and removes the directory. If the current thread is panicking (a failing
/// test), the server's log is printed to stderr first.
#[derive(Debug)]
pub struct PostgresServer {
    /// Behind a lock so a shared server can be stopped and started again
    /// ([`stop`](Self::stop), [`start_again`](Self::start_again)).
    process: Mutex<ChildProcess>,
    /// What starting it again needs: the `postgres` binary, the user it
    /// runs as, its settings.
    binary: PathBuf,
    run_as: Option<(Uid, Gid)>,
    settings: Vec<String>,
    port: u16,
    password: String,
    log_path: PathBuf,
    paused: AtomicBool,
    tls: bool,
    /// Its libfaketime clock, when started with one
    /// ([`start_with_fake_clock`](Self::start_with_fake_clock)).
    clock: Option<FakeClock>,
    /// Declared last so it is removed after the process is gone.
    dir: TempDir,
}

/// The binaries a server needs, from one installation.
struct Binaries {
    initdb: PathBuf,
    postgres: PathBuf,
}

impl PostgresServer {
    /// Creates a cluster with `initdb`, starts `postgres` on a free port and
    /// waits until it accepts connections.
    ///
    /// If the chosen port turns out to be taken, another one is tried, up to
    /// five times in all.
    ///
    /// # Errors
    ///
    /// [`Error::BinaryNotFound`] if PostgreSQL is not installed,
    /// [`Error::UserNotFound`] when running as root without a `postgres`
    /// user, [`Error::Initdb`], or any error from spawning the server or
    /// waiting for it to become ready.
    pub fn start() -> Result<PostgresServer, Error> {
        Self::start_inner(None, false, &[])
    }

    /// Like [`start`](Self::start), with `settings` (`name=value`) passed
    /// as `-c` after the test kit's own, so a later one wins: a bench
    /// that measures commits undoes the test kit's `fsync=off` with
    /// `fsync=on`, and loads `pg_stat_statements` with
    /// `shared_preload_libraries=pg_stat_statements`. They are kept for
    /// [`start_again`](Self::start_again).
    ///
    /// # Errors
    ///
    /// As for [`start`](Self::start); a setting the server refuses ends
    /// its start ([`Error::ExitedEarly`], the server's message in its log).
    pub fn start_with_settings(settings: &[&str]) -> Result<PostgresServer, Error> {
        Self::start_inner(None, false, settings)
    }

    /// Like [`start`](Self::start), with the server's wall clock driven by
    /// libfaketime (preloaded, its setting in a file of the server's
    /// directory, as a Redis server's fake clock is), so a test can step it forward with
    /// [`jump_clock`](Self::jump_clock): `clock_timestamp()`, `now()` and
    /// every time the server reads. Its monotonic clock (timeouts, waits)
    /// is left alone. Whether the server follows is for the test to check
    /// (its `clock_timestamp()` before and after a jump): the test kit
    /// speaks no SQL.
    ///
    /// # Errors
    ///
    /// As for [`start`](Self::start); [`Error::LibraryNotFound`] without
    /// libfaketime (`scripts/install-deps.sh` installs it).
    pub fn start_with_fake_clock() -> Result<PostgresServer, Error> {
        Self::start_inner(None, true, &[])
    }

    /// Steps the server's wall clock `by` forward, from where the fake
    /// clock stands: a lease whose expiry falls in the step has ended on
    /// the server's clock. The step is not undone.
    ///
    /// # Errors
    ///
    /// [`Error::FakeClock`] if the server was not started with
    /// [`start_with_fake_clock`](Self::start_with_fake_clock);
    /// [`Error::Io`] if the clock's file cannot be written.
    pub fn jump_clock(&self, by: Duration) -> Result<(), Error> {
        let clock = self.clock.as_ref().ok_or_else(|| Error::FakeClock {
            server: self.name(),
            reason: "it runs on the machine's clock (start it with PostgresServer::start_with_fake_clock)",
        })?;
        let by_ms = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        clock.set_offset(clock.setting().offset_ms.saturating_add(by_ms))
    }

    /// Like [`start`](Self::start), with TLS on (`ssl=on`): the server
    /// presents `tls`'s certificate to clients that ask for TLS and still
    /// accepts plain connections, unless `tls` requires client
    /// certificates. By its [`ClientAuth`]:
    ///
    /// - [`ClientAuth::No`]: no client certificate is asked for;
    /// - [`ClientAuth::Optional`]: a client certificate is asked for
    ///   (`ssl_ca_file`) and, if presented, must be valid;
    /// - [`ClientAuth::Required`]: `pg_hba.conf` admits TCP clients only
    ///   over TLS with a valid client certificate, plus the password
    ///   (`hostssl ... scram-sha-256 clientcert=verify-ca`).
    ///
    /// The certificate and key are written to the server's directory
    /// (the key readable by the server's user only).
    ///
    /// ```no_run
    /// use leasehold_testkit::{PostgresServer, TestCerts};
    ///
    /// let certs = TestCerts::generate()?;
    /// let pg = PostgresServer::start_tls(&certs.server())?;
    /// let url = format!(
    ///     "{}?sslmode=verify-full&sslrootcert={}",
    ///     pg.url(),
    ///     certs.ca().display()
    /// );
    /// # let _ = url;
    /// # Ok::<(), leasehold_testkit::Error>(())
    /// ```
    ///
    /// # Errors
    /// As for [`start`](Self::start), and [`Error::Io`] when a file cannot
    /// be written.
    pub fn start_tls(tls: &ServerTls) -> Result<PostgresServer, Error> {
        Self::start_inner(Some(tls), false, &[])
    }

    fn start_inner(
        tls: Option<&ServerTls>,
        fake_clock: bool,
        extra: &[&str],
    ) -> Result<PostgresServer, Error> {
        let binaries = find_binaries()?;
        let run_as = run_as()?;
        let dir = server_dir(run_as)?;
        let password = random_password()?;
        initdb(&binaries.initdb, dir.path(), &password, run_as)?;
        let mut settings = match tls {
            Some(tls) => tls_settings(dir.path(), tls, run_as)?,
            None => Vec::new(),
        };
        settings.extend(extra.iter().map(|setting| (*setting).to_owned()));
        let clock = if fake_clock {
            Some(FakeClock::new(dir.path())?)
        } else {
            None
        };

        let log_path = dir.path().join("postgres.log");
        let port = process::free_port()?;
        let process = spawn_postgres(
            &binaries.postgres,
            dir.path(),
            &log_path,
            port,
            run_as,
            &settings,
            clock.as_ref(),
        )?;
        let mut server = PostgresServer {
            process: Mutex::new(process),
            binary: binaries.postgres.clone(),
            run_as,
            settings,
            port,
            password,
            log_path,
            paused: AtomicBool::new(false),
            tls: tls.is_some(),
            clock,
            dir,
        };
        server.ready_on_a_free_port()?;
        Ok(server)
    }

    /// Waits until the just-spawned server is ready; if its port turned
    /// out to be taken, spawns it again (its binary, directory, settings
    /// and clock) on another free port, up to [`PORT_ATTEMPTS`] in all.
    fn ready_on_a_free_port(&mut self) -> Result<(), Error> {
        for attempt in 1..=PORT_ATTEMPTS {
            match self.wait_ready() {
                Ok(()) => return Ok(()),
                Err(Retry::Fatal(err)) => return Err(err),
                Err(Retry::PortTaken) if attempt < PORT_ATTEMPTS => {
                    // The previous process has exited and been reaped.
                    self.port = process::free_port()?;
                    *self.process() = spawn_postgres(
                        &self.binary,
                        self.dir.path(),
                        &self.log_path,
                        self.port,
                        self.run_as,
                        &self.settings,
                        self.clock.as_ref(),
                    )?;
                }
                Err(Retry::PortTaken) => {}
            }
        }
        Err(Error::PortsExhausted {
            program: "postgres".to_owned(),
            attempts: PORT_ATTEMPTS,
        })
    }

    /// The server's TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Whether the server was started with [`start_tls`](Self::start_tls).
    pub fn is_tls(&self) -> bool {
        self.tls
    }

    /// The address the server listens on: always `"127.0.0.1"`.
    pub fn host(&self) -> &str {
        HOST
    }

    /// The server's socket address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// A connection URL for the `postgres` database:
    /// `postgres://leasehold:PASSWORD@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        format!(
            "postgres://{USER}:{}@{HOST}:{}/postgres",
            self.password, self.port
        )
    }

    /// The superuser's password (24 random alphanumeric characters).
    pub fn password(&self) -> &str {
        &self.password
    }

    /// The superuser's name: always `"leasehold"`.
    pub fn user(&self) -> &str {
        USER
    }

    /// The process id of the postmaster.
    pub fn pid(&self) -> u32 {
        self.process().pid()
    }

    /// Freezes the postmaster and all its children (backends, checkpointer,
    /// ...) with `SIGSTOP`. New connections are accepted by the kernel but
    /// never answered, and open sessions hang, until
    /// [`resume`](Self::resume).
    ///
    /// The postmaster is stopped first, so it cannot fork new children while
    /// they are being stopped.
    ///
    /// # Errors
    ///
    /// [`Error::NotRunning`] if the server has died, or a signal error.
    pub fn pause(&self) -> Result<(), Error> {
        self.ensure_running()?;
        process::stop(self.pid())?;
        self.paused.store(true, Ordering::SeqCst);
        for child in process::children_of(self.pid()) {
            process::stop(child)?;
        }
        Ok(())
    }

    /// Continues a [paused](Self::pause) server with `SIGCONT`: first its
    /// children, then the postmaster.
    ///
    /// # Errors
    ///
    /// [`Error::NotRunning`] if the server has died, or a signal error.
    pub fn resume(&self) -> Result<(), Error> {
        self.ensure_running()?;
        for child in process::children_of(self.pid()) {
            process::cont(child)?;
        }
        process::cont(self.pid())?;
        self.paused.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Whether the server is paused by [`pause`](Self::pause).
    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    /// The contents of the server's log (empty if it cannot be read).
    pub fn log(&self) -> String {
        process::read_log(&self.log_path)
    }

    /// The temporary directory holding the cluster (`data/`), the Unix socket
    /// and the log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `postgres 127.0.0.1:PORT`, for messages.
    fn name(&self) -> String {
        format!("postgres {HOST}:{}", self.port)
    }

    fn ensure_running(&self) -> Result<(), Error> {
        if self.process().is_alive() {
            Ok(())
        } else {
            Err(Error::NotRunning {
                server: self.name(),
            })
        }
    }

    /// Polls until the port accepts connections and the log announces
    /// readiness; kills the server on failure.
    fn wait_ready(&self) -> Result<(), Retry> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let exited = self.process().try_wait()?;
            if let Some(status) = exited {
                let log = self.log();
                if log.contains("Address already in use") {
                    return Err(Retry::PortTaken);
                }
                return Err(Retry::Fatal(Error::ExitedEarly {
                    server: self.name(),
                    status,
                    log_tail: process::tail(&log, ERROR_LOG_LINES).to_owned(),
                }));
            }
            if TcpStream::connect_timeout(&self.addr(), Duration::from_millis(100)).is_ok()
                && self.log().contains(READY_MESSAGE)
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                self.process().kill()?;
                return Err(Retry::Fatal(Error::NotReady {
                    server: self.name(),
                    timeout: READY_TIMEOUT,
                    log_tail: process::tail(&self.log(), ERROR_LOG_LINES).to_owned(),
                }));
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    /// Immediate shutdown: continue if paused, `SIGQUIT`, wait, then stop
    /// and `SIGKILL` the postmaster and its children.
    fn shutdown(&self) -> Result<(), Error> {
        if !self.process().is_alive() {
            return Ok(());
        }
        if self.is_paused() {
            self.resume()?;
        }
        self.process().signal(Signal::SIGQUIT)?;
        let exited = self.process().wait_timeout(SHUTDOWN_TIMEOUT)?;
        if exited.is_some() {
            return Ok(());
        }
        // Stop the postmaster so it can neither fork nor reap while its
        // children are killed, then kill it.
        let pid = self.pid();
        process::stop(pid)?;
        for child in process::children_of(pid) {
            process::send_signal(child, Signal::SIGKILL)?;
        }
        self.process().kill()
    }

    fn process(&self) -> std::sync::MutexGuard<'_, ChildProcess> {
        self.process
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Stops the server with a fast shutdown (`SIGINT`): every session is
    /// cut and its open transaction rolled back, and what was committed is
    /// written out (the server runs with `synchronous_commit=off`, so an
    /// immediate shutdown would lose the last acknowledged commits); an
    /// immediate one if that takes too long. [`start_again`](Self::start_again)
    /// starts it on the same port. A stopped server is left stopped.
    ///
    /// # Errors
    ///
    /// A signal or wait error.
    pub fn stop(&self) -> Result<(), Error> {
        if !self.process().is_alive() {
            return Ok(());
        }
        if self.is_paused() {
            self.resume()?;
        }
        self.process().signal(Signal::SIGINT)?;
        let exited = self.process().wait_timeout(SHUTDOWN_TIMEOUT)?;
        if exited.is_some() {
            return Ok(());
        }
        self.shutdown()
    }

    /// Crashes the server: an immediate shutdown (`SIGQUIT` to the
    /// postmaster, as `pg_ctl stop -m immediate`; `SIGKILL` after 5 s):
    /// every process exits at once, nothing is written out, and
    /// [`start_again`](Self::start_again) goes through crash recovery. A
    /// commit survives only if its WAL was written before: with this
    /// server's `synchronous_commit=off`, the last commits acknowledged to
    /// a session that did not ask for `synchronous_commit=on` may be lost
    /// (with `fsync=off`, what was written survives a process crash, not a
    /// machine's). A stopped server is left stopped.
    ///
    /// # Errors
    ///
    /// A signal or wait error.
    pub fn crash(&self) -> Result<(), Error> {
        self.shutdown()
    }

    /// Starts a [stopped](Self::stop) server again, on the same port with
    /// the same data and settings, and waits until it accepts connections
    /// (after crash recovery). A running server is left as it is.
    ///
    /// # Errors
    ///
    /// [`Error::PortsExhausted`] if its port was taken meanwhile,
    /// [`Error::ExitedEarly`], [`Error::NotReady`], or a spawn error.
    pub fn start_again(&self) -> Result<(), Error> {
        if self.process().is_alive() {
            return Ok(());
        }
        let process = spawn_postgres(
            &self.binary,
            self.dir.path(),
            &self.log_path,
            self.port,
            self.run_as,
            &self.settings,
            self.clock.as_ref(),
        )?;
        *self.process() = process;
        match self.wait_ready() {
            Ok(()) => Ok(()),
            Err(Retry::Fatal(err)) => Err(err),
            Err(Retry::PortTaken) => Err(Error::PortsExhausted {
                program: "postgres".to_owned(),
                attempts: 1,
            }),
        }
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        if thread::panicking() {
            process::dump_log(&self.name(), &self.log());
        }
        if self.shutdown().is_err() {
            // Nothing sensible can be done about a failure here.
            let _ = self.process().kill();
        }
    }
}

/// Why an attempt to start the server failed.
enum Retry {
    /// The port was taken by someone else; worth retrying on another port.
    PortTaken,
    /// Anything else.
    Fatal(Error),
}

impl From<Error> for Retry {
    fn from(err: Error) -> Self {
        Retry::Fatal(err)
    }
}

/// A temporary directory for one server, owned by the user it runs as and
/// closed to others.
fn server_dir(run_as: Option<(Uid, Gid)>) -> Result<TempDir, Error> {
    let dir = tempfile::Builder::new()
        .prefix("leasehold-pg-")
        .tempdir()
        .map_err(process::io_err(&std::env::temp_dir()))?;
    give_to(dir.path(), run_as)?;
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700))
        .map_err(process::io_err(dir.path()))?;
    Ok(dir)
}

/// Finds `postgres` on `PATH` or in the newest `/usr/lib/postgresql/*/bin`,
/// and `initdb` next to it.
fn find_binaries() -> Result<Binaries, Error> {
    let fallback_dirs = debian_bin_dirs(Path::new(DEBIAN_LIB_DIR));
    let postgres = process::find_binary("postgres", APT_PACKAGE, &fallback_dirs)?;
    let sibling = postgres.with_file_name("initdb");
    let initdb = if process::is_executable(&sibling) {
        sibling
    } else {
        process::find_binary("initdb", APT_PACKAGE, &fallback_dirs)?
    };
    Ok(Binaries { initdb, postgres })
}

/// `<lib_dir>/<version>/bin` for every installed version, newest first.
fn debian_bin_dirs(lib_dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(lib_dir) else {
        return Vec::new();
    };
    let mut versions: Vec<(Vec<u32>, PathBuf)> = entries
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let name = entry.file_name();
            let version = name
                .to_str()?
                .split('.')
                .map(|part| part.parse().ok())
                .collect::<Option<Vec<u32>>>()?;
            Some((version, entry.path().join("bin")))
        })
        .collect();
    versions.sort_by(|a, b| b.0.cmp(&a.0));
    versions.into_iter().map(|(_, dir)| dir).collect()
}

/// The user to run PostgreSQL as: the `postgres` system user if this process
/// is root (PostgreSQL refuses to run as root), otherwise `None` (the
/// current user).
pub(crate) fn run_as() -> Result<Option<(Uid, Gid)>, Error> {
    if !Uid::effective().is_root() {
        return Ok(None);
    }
    let user = User::from_name(SYSTEM_USER)
        .map_err(|source| Error::UserLookup {
            name: SYSTEM_USER.to_owned(),
            source,
        })?
        .ok_or_else(|| Error::UserNotFound {
            name: SYSTEM_USER.to_owned(),
        })?;
    Ok(Some((user.uid, user.gid)))
}

/// Makes `path` owned by the user PostgreSQL runs as, if that is not us.
pub(crate) fn give_to(path: &Path, run_as: Option<(Uid, Gid)>) -> Result<(), Error> {
    match run_as {
        Some((uid, gid)) => std::os::unix::fs::chown(path, Some(uid.as_raw()), Some(gid.as_raw()))
            .map_err(process::io_err(path)),
        None => Ok(()),
    }
}

/// Applies the identity and environment PostgreSQL binaries run with.
fn configure(command: &mut Command, dir: &Path, run_as: Option<(Uid, Gid)>) {
    command
        .current_dir(dir)
        // Untranslated messages (the readiness check reads the log) and a
        // locale that always exists.
        .env("LC_ALL", "C")
        .env_remove("LANG")
        .stdin(Stdio::null());
    if let Some((uid, gid)) = run_as {
        command.uid(uid.as_raw()).gid(gid.as_raw());
    }
}

/// Runs `initdb` into `<dir>/data`.
fn initdb(
    binary: &Path,
    dir: &Path,
    password: &str,
    run_as: Option<(Uid, Gid)>,
) -> Result<(), Error> {
    let pwfile = dir.join("pw");
    fs::write(&pwfile, password).map_err(process::io_err(&pwfile))?;
    fs::set_permissions(&pwfile, fs::Permissions::from_mode(0o600))
        .map_err(process::io_err(&pwfile))?;
    give_to(&pwfile, run_as)?;

    let mut command = Command::new(binary);
    command
        .arg("-D")
        .arg(dir.join("data"))
        .args(["-U", USER])
        .arg(format!("--pwfile={}", pwfile.display()))
        .args([
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            "-E",
            "UTF8",
            "--no-sync",
        ]);
    configure(&mut command, dir, run_as);
    let output = command.output().map_err(|source| Error::Spawn {
        program: binary.to_owned(),
        source,
    });
    // The password is no longer needed on disk, whatever happened.
    let _ = fs::remove_file(&pwfile);
    let output = output?;
    if output.status.success() {
        return Ok(());
    }
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stderr));
    Err(Error::Initdb {
        status: output.status,
        output: process::tail(&text, ERROR_LOG_LINES).to_owned(),
    })
}

/// Writes `tls`'s files into `dir` (owned by the server's user, the key
/// readable by it alone), rewrites `pg_hba.conf` when client certificates
/// are required, and returns the `-c` settings that turn TLS on.
fn tls_settings(
    dir: &Path,
    tls: &ServerTls,
    run_as: Option<(Uid, Gid)>,
) -> Result<Vec<String>, Error> {
    let mut settings = vec!["ssl=on".to_owned()];
    let mut files = vec![
        ("server.crt", &tls.cert, "ssl_cert_file"),
        ("server.key", &tls.key, "ssl_key_file"),
    ];
    if tls.client_auth != ClientAuth::No {
        files.push(("client-ca.crt", &tls.client_ca, "ssl_ca_file"));
    }
    for (name, pem, setting) in files {
        let path = dir.join(name);
        fs::write(&path, pem).map_err(process::io_err(&path))?;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600))
            .map_err(process::io_err(&path))?;
        give_to(&path, run_as)?;
        settings.push(format!("{setting}={}", path.display()));
    }
    if tls.client_auth == ClientAuth::Required {
        let hba = dir.join("data").join("pg_hba.conf");
        let rules = "# leasehold-testkit: TLS with a client certificate, plus the password\n\
                     local all all trust\n\
                     hostssl all all 127.0.0.1/32 scram-sha-256 clientcert=verify-ca\n";
        // Overwriting keeps the file's owner (the server's user).
        fs::write(&hba, rules).map_err(process::io_err(&hba))?;
    }
    Ok(settings)
}

/// Spawns `postgres` in the foreground, logging to `log_path` (truncated),
/// with extra `-c` `settings`, on `clock` if given.
fn spawn_postgres(
    binary: &Path,
    dir: &Path,
    log_path: &Path,
    port: u16,
    run_as: Option<(Uid, Gid)>,
    settings: &[String],
    clock: Option<&FakeClock>,
) -> Result<ChildProcess, Error> {
    let log = File::create(log_path).map_err(process::io_err(log_path))?;
    let log_copy = log.try_clone().map_err(process::io_err(log_path))?;
    let mut command = Command::new(binary);
    command
        .arg("-D")
        .arg(dir.join("data"))
        .arg("-p")
        .arg(port.to_string())
        .arg("-k")
        .arg(dir)
        .args([
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "fsync=off",
            "-c",
            "synchronous_commit=off",
            "-c",
            "full_page_writes=off",
            "-c",
            "max_connections=200",
            "-c",
            "shared_buffers=32MB",
        ]);
    for setting in settings {
        command.arg("-c").arg(setting);
    }
    configure(&mut command, dir, run_as);
    if let Some(clock) = clock {
        let (set, remove) = clock.env();
        for name in remove {
            command.env_remove(name);
        }
        command.envs(set);
    }
    let child = command
        .stdout(log_copy)
        .stderr(log)
        .spawn()
        .map_err(|source| Error::Spawn {
            program: binary.to_owned(),
            source,
        })?;
    Ok(ChildProcess::new(child))
}

/// 24 random ASCII letters and digits.
fn random_password() -> Result<String, Error> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    // Reject bytes past the largest multiple of the alphabet size, so every
    // character is equally likely.
    let limit = u8::try_from(256 / ALPHABET.len() * ALPHABET.len()).unwrap_or(u8::MAX);
    let mut password = String::with_capacity(PASSWORD_LEN);
    let mut buf = [0u8; 64];
    while password.len() < PASSWORD_LEN {
        getrandom::fill(&mut buf).map_err(Error::Random)?;
        password.extend(
            buf.iter()
                .filter(|&&byte| byte < limit)
                .map(|&byte| char::from(ALPHABET[usize::from(byte) % ALPHABET.len()]))
                .take(PASSWORD_LEN - password.len()),
        );
    }
    Ok(password)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn password_is_24_alphanumeric_chars() -> Result<(), Error> {
        let a = random_password()?;
        let b = random_password()?;
        assert_eq!(a.len(), PASSWORD_LEN);
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric()));
        assert_ne!(a, b);
        Ok(())
    }

    #[test]
    fn debian_dirs_newest_first() -> Result<(), Box<dyn std::error::Error>> {
        let lib = tempfile::tempdir()?;
        for version in ["9.6", "15", "13", "not-a-version"] {
            fs::create_dir(lib.path().join(version))?;
        }
        let dirs = debian_bin_dirs(lib.path());
        let expected: Vec<PathBuf> = ["15", "13", "9.6"]
            .iter()
            .map(|v| lib.path().join(v).join("bin"))
            .collect();
        assert_eq!(dirs, expected);
        assert!(debian_bin_dirs(&lib.path().join("missing")).is_empty());
        Ok(())
    }
}
