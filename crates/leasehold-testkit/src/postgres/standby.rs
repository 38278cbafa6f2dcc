//! A streaming standby of a throwaway PostgreSQL server, asynchronous or
//! synchronous, and its promotion: what a failover does to the leases and
//! tokens a primary confirmed.
//!
//! The standby is a copy taken with `pg_basebackup` while the primary
//! runs, started in recovery (`standby.signal`) and streaming the
//! primary's WAL from then on. Synchronous, the primary names it in
//! `synchronous_standby_names`, so a commit that asks for
//! `synchronous_commit = on` is confirmed only once the standby has
//! flushed it; asynchronous, the primary confirms without it, and a
//! standby that lags (paused, say) lacks the last commits when promoted.

use std::fs::{self, OpenOptions};
use std::io::Write as _;
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;

use nix::sys::signal::Signal;

use super::{
    APT_PACKAGE, DEBIAN_LIB_DIR, PostgresServer, USER, configure, debian_bin_dirs, find_binaries,
    run_as, server_dir, spawn_postgres,
};
use crate::Error;
use crate::process;

/// The standby's name in the primary's `synchronous_standby_names`.
const APPLICATION_NAME: &str = "leasehold_standby";

/// How a standby's commits are confirmed to the primary's clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Replication {
    /// The primary confirms commits without waiting for the standby.
    Async,
    /// The primary names the standby synchronous: a commit that asks for
    /// `synchronous_commit = on` (as every `PgLocker` write does) is
    /// confirmed only once the standby has flushed it.
    Sync,
}

impl PostgresServer {
    /// Starts a streaming standby of this server (a `pg_basebackup` copy,
    /// on a free port of its own, the same user and password), and waits
    /// until it accepts read-only connections. With
    /// [`Replication::Sync`] this server then names it synchronous (in its
    /// `postgresql.auto.conf`, reloaded): whether it is streaming and
    /// synchronous yet is for the test to check
    /// (`pg_stat_replication.sync_state` on this server).
    ///
    /// Dropping the standby shuts it down; a primary dropped first leaves
    /// it waiting for WAL (or [promote](Self::promote) it).
    ///
    /// # Errors
    ///
    /// [`Error::PostgresTool`] if `pg_basebackup` fails, as for
    /// [`start`](Self::start) otherwise.
    pub fn start_standby(&self, replication: Replication) -> Result<PostgresServer, Error> {
        self.start_standby_through(replication, self.addr())
    }

    /// [`start_standby`](Self::start_standby), streaming from `upstream`
    /// (a [`FaultProxy`](crate::FaultProxy) in front of this server, say,
    /// so a test can hold the stream back or cut it) instead of this
    /// server's own address; the copy is taken from this server directly.
    ///
    /// # Errors
    ///
    /// As for [`start_standby`](Self::start_standby).
    pub fn start_standby_through(
        &self,
        replication: Replication,
        upstream: std::net::SocketAddr,
    ) -> Result<PostgresServer, Error> {
        let binaries = find_binaries()?;
        let run_as = run_as()?;
        let dir = server_dir(run_as)?;
        let conninfo = format!(
            "host={} port={} user={USER} password={} application_name={APPLICATION_NAME}",
            super::HOST,
            self.port,
            self.password
        );
        let data = dir.path().join("data");
        let mut basebackup = Command::new(tool(&binaries.postgres, "pg_basebackup")?);
        basebackup
            .arg("-D")
            .arg(&data)
            .arg("-d")
            .arg(&conninfo)
            .args(["-R", "-X", "stream", "--no-sync", "-c", "fast"]);
        run("pg_basebackup", basebackup, dir.path(), run_as)?;
        // The standby's own line, whatever `-R` wrote: where it streams
        // from, its name (so the primary can name it synchronous) and the
        // password it needs.
        let streaming = format!(
            "host={} port={} user={USER} password={} application_name={APPLICATION_NAME}",
            upstream.ip(),
            upstream.port(),
            self.password
        );
        append(
            &data.join("postgresql.auto.conf"),
            &format!("primary_conninfo = '{streaming}'\n"),
        )?;
        if replication == Replication::Sync {
            let auto_conf = self.dir.path().join("data").join("postgresql.auto.conf");
            append(
                &auto_conf,
                &format!("synchronous_standby_names = '{APPLICATION_NAME}'\n"),
            )?;
            self.process().signal(Signal::SIGHUP)?;
        }

        let log_path = dir.path().join("postgres.log");
        let port = process::free_port()?;
        let process = spawn_postgres(
            &binaries.postgres,
            dir.path(),
            &log_path,
            port,
            run_as,
            &self.settings,
            None,
        )?;
        let mut standby = PostgresServer {
            process: Mutex::new(process),
            binary: binaries.postgres.clone(),
            run_as,
            settings: self.settings.clone(),
            port,
            password: self.password.clone(),
            log_path,
            paused: AtomicBool::new(false),
            tls: self.tls,
            clock: None,
            dir,
        };
        standby.ready_on_a_free_port()?;
        Ok(standby)
    }

    /// Promotes this standby to a primary (`pg_ctl promote`, waiting until
    /// it accepts writes), on a new timeline.
    ///
    /// # Errors
    ///
    /// [`Error::PostgresTool`] if `pg_ctl` fails (this server is not a
    /// standby, or did not finish its promotion within a minute).
    pub fn promote(&self) -> Result<(), Error> {
        let mut pg_ctl = Command::new(tool(&self.binary, "pg_ctl")?);
        pg_ctl
            .arg("promote")
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-w", "-t", "60"]);
        run("pg_ctl promote", pg_ctl, self.dir.path(), self.run_as)
    }
}

/// The PostgreSQL tool `name` of the installation `postgres` belongs to:
/// its sibling (through a symlink too), else on `PATH` or in the newest
/// `/usr/lib/postgresql/*/bin`.
fn tool(postgres: &std::path::Path, name: &str) -> Result<std::path::PathBuf, Error> {
    let siblings = [
        Some(postgres.with_file_name(name)),
        fs::canonicalize(postgres)
            .ok()
            .map(|real| real.with_file_name(name)),
    ];
    if let Some(sibling) = siblings
        .into_iter()
        .flatten()
        .find(|path| process::is_executable(path))
    {
        return Ok(sibling);
    }
    let fallback_dirs = debian_bin_dirs(std::path::Path::new(DEBIAN_LIB_DIR));
    process::find_binary(name, APT_PACKAGE, &fallback_dirs)
}

/// Appends `line` to the configuration file `path` (a later line wins).
fn append(path: &std::path::Path, line: &str) -> Result<(), Error> {
    let mut file = OpenOptions::new()
        .append(true)
        .open(path)
        .map_err(process::io_err(path))?;
    file.write_all(line.as_bytes())
        .map_err(process::io_err(path))
}

/// Runs a PostgreSQL tool as the server's user, in `dir`.
fn run(
    tool: &'static str,
    mut command: Command,
    dir: &std::path::Path,
    run_as: Option<(nix::unistd::Uid, nix::unistd::Gid)>,
) -> Result<(), Error> {
    configure(&mut command, dir, run_as);
    let program = std::path::PathBuf::from(command.get_program());
    let output = command
        .output()
        .map_err(|source| Error::Spawn { program, source })?;
    if output.status.success() {
        return Ok(());
    }
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stderr));
    Err(Error::PostgresTool {
        tool,
        status: output.status,
        output: process::tail(&text, super::ERROR_LOG_LINES).to_owned(),
    })
}
