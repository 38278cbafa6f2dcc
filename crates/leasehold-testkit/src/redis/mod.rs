//! Throwaway `redis-server` processes.
//!
//! A [`RedisServer`] is started (`start`: its binary, a free port, the wait
//! until it answers) with [`RedisOptions`] (`options`), answers commands
//! (`commands`), takes faults (`faults`: pause, kill, restart, promote)
//! and, started with a fake clock, has its time stepped or sped up
//! (`fake_clock`). This file holds the server and what it tells about
//! itself.

mod commands;
mod fake_clock;
mod faults;
mod options;
mod start;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::thread;

use tempfile::TempDir;

use crate::Error;
use crate::clock::FakeClock;
use crate::process::{self, ChildProcess, HOST};

pub use commands::AclRefusal;
pub use options::RedisOptions;
use start::REDIS_SERVER;
pub use start::SERVER_ENV;

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

impl RedisServer {
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

    /// `redis-server 127.0.0.1:PORT`, for messages.
    fn name(&self) -> String {
        format!("{REDIS_SERVER} {HOST}:{}", self.port)
    }

    pub(super) fn ensure_running(&self) -> Result<(), Error> {
        if self.process.is_alive() {
            Ok(())
        } else {
            Err(Error::NotRunning {
                server: self.name(),
            })
        }
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
    fn percent_encodes_password() {
        assert_eq!(percent_encode("aZ9-._~"), "aZ9-._~");
        assert_eq!(percent_encode("a b@c/"), "a%20b%40c%2F");
    }
}
