//! The faults a test injects into a server: pause, kill, restart (with
//! its data, or without), and promotion of a replica.

use std::fs;
use std::sync::atomic::Ordering;

use super::RedisServer;
use super::start::StartFailure;
use crate::Error;
use crate::process::{self};

impl RedisServer {
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
    ///
    /// [`RedisOptions::appendonly`]: super::RedisOptions::appendonly
    pub fn restart(&mut self) -> Result<(), Error> {
        self.kill()?;
        self.respawn()?;
        match self.wait_ready() {
            Ok(()) => Ok(()),
            Err(StartFailure::PortTaken(err) | StartFailure::Fatal(err)) => Err(err),
        }
    }
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
    ///
    /// [`RedisOptions::args`]: super::RedisOptions::args
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
