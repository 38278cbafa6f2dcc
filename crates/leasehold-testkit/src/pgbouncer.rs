//! PgBouncer in transaction pooling mode in front of a throwaway
//! PostgreSQL: what many deployments put between a service and its
//! database, where a session setting, a prepared statement or an advisory
//! lock does not follow a client from one transaction to the next.

use std::fs;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::Error;
use crate::postgres::{PostgresServer, give_to, run_as};
use crate::process::{self, ChildProcess, HOST, POLL_INTERVAL};

/// How long PgBouncer may take to listen.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// How many log lines error messages include.
const ERROR_LOG_LINES: usize = 30;

/// PgBouncer (Debian's `pgbouncer`, from `PATH` or `/usr/sbin`) on a free
/// loopback port, pooling in **transaction** mode into one
/// [`PostgresServer`]'s databases (any name) as its superuser: each
/// transaction of a client runs on whichever server connection is free,
/// and between transactions the client holds none.
///
/// Clients connect with the server's user and password
/// ([`url`](Self::url)); PgBouncer logs in to the server with the same.
/// When this process runs as root, PgBouncer (which refuses root) runs as
/// the `postgres` system user, as the server does.
///
/// Dropping it kills PgBouncer and removes its directory; if the current
/// thread is panicking, its log is printed to stderr first.
#[derive(Debug)]
pub struct PgBouncer {
    /// Behind a lock so a shared PgBouncer can be killed and started
    /// again ([`kill`](Self::kill), [`start_again`](Self::start_again)).
    process: std::sync::Mutex<ChildProcess>,
    /// What starting it again needs: the binary, its configuration file,
    /// the user it runs as.
    binary: PathBuf,
    config: PathBuf,
    run_as: Option<(nix::unistd::Uid, nix::unistd::Gid)>,
    port: u16,
    user: String,
    password: String,
    log_path: PathBuf,
    /// Declared last so it is removed after the process is gone.
    _dir: TempDir,
}

impl PgBouncer {
    /// PgBouncer in front of `server` with a pool of 2 server connections.
    ///
    /// # Errors
    /// [`Error::BinaryNotFound`] if PgBouncer is not installed
    /// (`scripts/install-deps.sh`), or any error writing its files,
    /// spawning it or waiting for it to listen.
    pub fn start(server: &PostgresServer) -> Result<PgBouncer, Error> {
        Self::start_with_pool(server, 2)
    }

    /// PgBouncer in front of `server` with at most `pool_size` server
    /// connections (at least 1): with 1, every client's transactions run
    /// on the same server connection, one at a time, so whatever a
    /// transaction leaves on its session is seen by the next client's.
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub fn start_with_pool(server: &PostgresServer, pool_size: u32) -> Result<PgBouncer, Error> {
        let binary = process::find_binary("pgbouncer", "pgbouncer", &[PathBuf::from("/usr/sbin")])?;
        let run_as = run_as()?;
        let dir = tempfile::Builder::new()
            .prefix("leasehold-pgbouncer-")
            .tempdir()
            .map_err(process::io_err(Path::new("tempdir")))?;
        give_to(dir.path(), run_as)?;
        let port = process::free_port()?;
        let log_path = dir.path().join("pgbouncer.log");
        let users = dir.path().join("users.txt");
        let (user, password) = (server.user().to_owned(), server.password().to_owned());
        fs::write(&users, format!("\"{user}\" \"{password}\"\n"))
            .map_err(process::io_err(&users))?;
        give_to(&users, run_as)?;
        let config = dir.path().join("pgbouncer.ini");
        fs::write(
            &config,
            format!(
                "[databases]\n\
                 * = host={HOST} port={server_port}\n\
                 [pgbouncer]\n\
                 listen_addr = {HOST}\n\
                 listen_port = {port}\n\
                 unix_socket_dir =\n\
                 auth_type = plain\n\
                 auth_file = {users}\n\
                 pool_mode = transaction\n\
                 default_pool_size = {pool}\n\
                 max_client_conn = 100\n\
                 ignore_startup_parameters = extra_float_digits,options\n\
                 logfile = {log}\n\
                 log_connections = 0\n\
                 log_disconnections = 0\n",
                server_port = server.port(),
                users = users.display(),
                pool = pool_size.max(1),
                log = log_path.display(),
            ),
        )
        .map_err(process::io_err(&config))?;
        give_to(&config, run_as)?;
        let process = spawn(&binary, &config, run_as)?;
        let bouncer = PgBouncer {
            process: std::sync::Mutex::new(process),
            binary,
            config,
            run_as,
            port,
            user,
            password,
            log_path,
            _dir: dir,
        };
        bouncer.wait_ready()?;
        Ok(bouncer)
    }

    /// Kills PgBouncer (`SIGKILL`): every client connection through it is
    /// cut, and none is accepted until [`start_again`](Self::start_again).
    /// A killed PgBouncer is left killed.
    ///
    /// # Errors
    /// A signal or wait error.
    pub fn kill(&self) -> Result<(), Error> {
        let mut process = self.process();
        if !process.is_alive() {
            return Ok(());
        }
        process.kill()
    }

    /// Starts a [killed](Self::kill) PgBouncer again, on the same port
    /// with the same configuration, and waits until it listens. A running
    /// one is left as it is.
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub fn start_again(&self) -> Result<(), Error> {
        if self.process().is_alive() {
            return Ok(());
        }
        *self.process() = spawn(&self.binary, &self.config, self.run_as)?;
        self.wait_ready()
    }

    /// Whether its process runs.
    pub fn is_running(&self) -> bool {
        self.process().is_alive()
    }

    fn process(&self) -> std::sync::MutexGuard<'_, ChildProcess> {
        self.process
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn wait_ready(&self) -> Result<(), Error> {
        let started = Instant::now();
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        loop {
            let exited = self.process().try_wait()?;
            if let Some(status) = exited {
                return Err(Error::ExitedEarly {
                    server: self.name(),
                    status,
                    log_tail: self.log_tail(),
                });
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
                return Ok(());
            }
            if started.elapsed() > READY_TIMEOUT {
                let _ = self.process().kill();
                return Err(Error::NotReady {
                    server: self.name(),
                    timeout: READY_TIMEOUT,
                    log_tail: self.log_tail(),
                });
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    /// A connection URL for the pooled `postgres` database:
    /// `postgres://leasehold:PASSWORD@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        self.url_for("postgres")
    }

    /// A connection URL for the pooled database `database` (it must exist
    /// on the server).
    pub fn url_for(&self, database: &str) -> String {
        format!(
            "postgres://{}:{}@{HOST}:{}/{database}",
            self.user, self.password, self.port
        )
    }

    /// The port PgBouncer listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// PgBouncer's log so far.
    pub fn log(&self) -> String {
        process::read_log(&self.log_path)
    }

    fn log_tail(&self) -> String {
        process::tail(&self.log(), ERROR_LOG_LINES).to_owned()
    }

    fn name(&self) -> String {
        format!("pgbouncer {HOST}:{}", self.port)
    }
}

/// Spawns PgBouncer on `config`, as `run_as` when running as root.
fn spawn(
    binary: &Path,
    config: &Path,
    run_as: Option<(nix::unistd::Uid, nix::unistd::Gid)>,
) -> Result<ChildProcess, Error> {
    let dir = config.parent().unwrap_or(Path::new("/"));
    let mut command = Command::new(binary);
    command
        .arg(config)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some((uid, gid)) = run_as {
        command.uid(uid.as_raw()).gid(gid.as_raw());
    }
    let child = command.spawn().map_err(|source| Error::Spawn {
        program: binary.to_owned(),
        source,
    })?;
    Ok(ChildProcess::new(child))
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        if thread::panicking() {
            process::dump_log(&self.name(), &self.log());
        }
        let _ = self.process().kill();
    }
}
