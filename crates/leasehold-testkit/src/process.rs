//! Helpers shared by the redis and PostgreSQL launchers: binary lookup, free
//! ports, child-process ownership, signals and log files.

use std::fs;
use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;

use crate::Error;

/// The loopback address every server binds to.
pub(crate) const HOST: &str = "127.0.0.1";

/// How many ports a launcher tries before giving up on port races.
pub(crate) const PORT_ATTEMPTS: u32 = 5;

/// How often readiness and state changes are polled.
pub(crate) const POLL_INTERVAL: Duration = Duration::from_millis(10);

/// How long `SIGSTOP`/`SIGCONT` may take to take effect.
const SIGNAL_TIMEOUT: Duration = Duration::from_secs(2);

/// Returns a loopback TCP port that was free a moment ago.
///
/// The port is found by binding `127.0.0.1:0` and dropping the listener, so
/// another process may grab it before the caller binds it; the launchers in
/// this crate retry with a new port when that happens.
///
/// # Errors
///
/// [`Error::FreePort`] if the socket cannot be bound.
pub fn free_port() -> Result<u16, Error> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(Error::FreePort)?;
    let port = listener.local_addr().map_err(Error::FreePort)?.port();
    Ok(port)
}

/// Looks `name` up on `PATH`, then in `fallback_dirs` (in order).
pub(crate) fn find_binary(
    name: &str,
    apt_package: &str,
    fallback_dirs: &[PathBuf],
) -> Result<PathBuf, Error> {
    let path_dirs = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default();
    path_dirs
        .iter()
        .chain(fallback_dirs)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
        .ok_or_else(|| Error::BinaryNotFound {
            name: name.to_owned(),
            install_hint: format!(
                "scripts/install-deps.sh (or: sudo apt-get install -y {apt_package})"
            ),
        })
}

/// Whether `path` is a regular file (after following symlinks) with an
/// execute bit set.
pub(crate) fn is_executable(path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

/// A spawned child process that is killed (`SIGKILL`) and reaped on drop.
///
/// Once reaped, the pid is never signalled again, so a recycled pid cannot
/// be hit by mistake.
#[derive(Debug)]
pub(crate) struct ChildProcess {
    child: Option<Child>,
    pid: u32,
}

impl ChildProcess {
    /// Takes ownership of `child`.
    pub(crate) fn new(child: Child) -> Self {
        let pid = child.id();
        Self {
            child: Some(child),
            pid,
        }
    }

    /// The process id (of the last process, once it has been reaped).
    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the process has not been reaped yet.
    pub(crate) fn is_alive(&self) -> bool {
        self.child.is_some()
    }

    /// Returns the exit status if the process has exited (reaping it).
    pub(crate) fn try_wait(&mut self) -> Result<Option<ExitStatus>, Error> {
        let Some(child) = self.child.as_mut() else {
            return Ok(None);
        };
        let status = child.try_wait().map_err(|source| Error::Wait {
            pid: self.pid,
            source,
        })?;
        if status.is_some() {
            self.child = None;
        }
        Ok(status)
    }

    /// Waits up to `timeout` for the process to exit (reaping it).
    pub(crate) fn wait_timeout(&mut self, timeout: Duration) -> Result<Option<ExitStatus>, Error> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_wait()? {
                return Ok(Some(status));
            }
            if !self.is_alive() || Instant::now() >= deadline {
                return Ok(None);
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    /// Sends `signal` to the process if it has not been reaped yet.
    ///
    /// Returns `false` (and sends nothing) if it has been reaped.
    pub(crate) fn signal(&self, signal: Signal) -> Result<bool, Error> {
        if self.child.is_none() {
            return Ok(false);
        }
        send_signal(self.pid, signal)?;
        Ok(true)
    }

    /// Sends `SIGKILL` and reaps the process. Does nothing if it has already
    /// been reaped.
    pub(crate) fn kill(&mut self) -> Result<(), Error> {
        let Some(child) = self.child.as_mut() else {
            return Ok(());
        };
        let wait_err = |source| Error::Wait {
            pid: self.pid,
            source,
        };
        if child.try_wait().map_err(wait_err)?.is_none() {
            // SIGKILL works on stopped processes too.
            send_signal(self.pid, Signal::SIGKILL)?;
            child.wait().map_err(wait_err)?;
        }
        self.child = None;
        Ok(())
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        // Nothing sensible can be done about a failure here.
        let _ = self.kill();
    }
}

/// Sends `signal` to `pid`. A process that has already gone (`ESRCH`) counts
/// as success.
pub(crate) fn send_signal(pid: u32, signal: Signal) -> Result<(), Error> {
    let target = Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX));
    match signal::kill(target, signal) {
        Ok(()) | Err(nix::Error::ESRCH) => Ok(()),
        Err(source) => Err(Error::Signal {
            signal,
            pid,
            source,
        }),
    }
}

/// The fields of `/proc/<pid>/stat` this crate cares about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProcStat {
    /// The one-letter state, e.g. `R`, `S`, `T` (stopped), `Z` (zombie).
    pub(crate) state: char,
    /// The parent process id.
    pub(crate) ppid: u32,
}

/// Reads `/proc/<pid>/stat`; `None` if the process does not exist.
pub(crate) fn proc_stat(pid: u32) -> Option<ProcStat> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain spaces or ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some(ProcStat { state, ppid })
}

/// The pids of all processes whose parent is `parent`.
pub(crate) fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| proc_stat(pid).is_some_and(|stat| stat.ppid == parent))
        .collect()
}

/// Sends `SIGSTOP` to `pid` and waits until the kernel reports it stopped
/// (or gone), so the pause is in effect when this returns.
pub(crate) fn stop(pid: u32) -> Result<(), Error> {
    send_signal(pid, Signal::SIGSTOP)?;
    wait_for_state(pid, "stop", |state| matches!(state, 'T' | 't' | 'Z' | 'X'))
}

/// Sends `SIGCONT` to `pid` and waits until it is no longer stopped.
pub(crate) fn cont(pid: u32) -> Result<(), Error> {
    send_signal(pid, Signal::SIGCONT)?;
    wait_for_state(pid, "continue", |state| !matches!(state, 'T' | 't'))
}

fn wait_for_state(
    pid: u32,
    action: &'static str,
    done: impl Fn(char) -> bool,
) -> Result<(), Error> {
    let deadline = Instant::now() + SIGNAL_TIMEOUT;
    loop {
        match proc_stat(pid) {
            None => return Ok(()),
            Some(stat) if done(stat.state) => return Ok(()),
            Some(_) if Instant::now() >= deadline => {
                return Err(Error::SignalTimeout {
                    pid,
                    action,
                    timeout: SIGNAL_TIMEOUT,
                });
            }
            Some(_) => thread::sleep(Duration::from_millis(1)),
        }
    }
}

/// Reads a log file as (lossy) UTF-8; empty if it cannot be read.
pub(crate) fn read_log(path: &Path) -> String {
    fs::read(path)
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
        .unwrap_or_default()
}

/// Reads a log file from byte offset `from` on; empty if it cannot be read.
pub(crate) fn read_log_from(path: &Path, from: u64) -> String {
    let bytes = fs::read(path).unwrap_or_default();
    let start = usize::try_from(from).unwrap_or(usize::MAX).min(bytes.len());
    String::from_utf8_lossy(&bytes[start..]).into_owned()
}

/// The current length of a file, 0 if it does not exist.
pub(crate) fn file_len(path: &Path) -> u64 {
    fs::metadata(path).map(|meta| meta.len()).unwrap_or(0)
}

/// The last `lines` lines of `text`.
pub(crate) fn tail(text: &str, lines: usize) -> &str {
    let trimmed = text.trim_end_matches('\n');
    match trimmed.rmatch_indices('\n').nth(lines.saturating_sub(1)) {
        Some((index, _)) if lines > 0 => &trimmed[index + 1..],
        _ if lines == 0 => "",
        _ => trimmed,
    }
}

/// Prints a server's log to stderr; used from `Drop` while panicking so a
/// failing test shows what the server was doing.
pub(crate) fn dump_log(what: &str, log: &str) {
    eprintln!("--- {what} log ---");
    eprintln!("{}", tail(log, 200));
    eprintln!("--- end of {what} log ---");
}

/// Maps an I/O error on `path` to [`Error::Io`].
pub(crate) fn io_err(path: &Path) -> impl FnOnce(io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_owned(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_binary_is_reported_with_install_hint() {
        let err = find_binary("redis-server-does-not-exist", "redis-server", &[])
            .expect_err("binary should not exist");
        match &err {
            Error::BinaryNotFound { name, install_hint } => {
                assert_eq!(name, "redis-server-does-not-exist");
                assert!(install_hint.contains("apt-get install -y redis-server"));
            }
            other => panic!("unexpected error: {other:?}"),
        }
        assert_eq!(
            err.to_string(),
            "redis-server-does-not-exist not found on PATH; install it with: \
             scripts/install-deps.sh (or: sudo apt-get install -y redis-server)"
        );
    }

    #[test]
    fn fallback_dirs_are_searched() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let bin = dir.path().join("leasehold-fake-binary");
        fs::write(&bin, "#!/bin/sh\n")?;
        assert!(find_binary("leasehold-fake-binary", "x", &[dir.path().to_owned()]).is_err());
        fs::set_permissions(&bin, fs::Permissions::from_mode(0o755))?;
        let found = find_binary("leasehold-fake-binary", "x", &[dir.path().to_owned()])?;
        assert_eq!(found, bin);
        Ok(())
    }

    #[test]
    fn free_port_is_bindable() -> Result<(), Box<dyn std::error::Error>> {
        // Another process may take the port in between (that is why the
        // launchers retry), so one of a few attempts must succeed.
        let mut last_err = None;
        for _ in 0..5 {
            let port = free_port()?;
            assert_ne!(port, 0);
            match TcpListener::bind((Ipv4Addr::LOCALHOST, port)) {
                Ok(_listener) => return Ok(()),
                Err(err) => last_err = Some(err),
            }
        }
        Err(last_err.map_or_else(|| "no attempt made".into(), Into::into))
    }

    #[test]
    fn tail_keeps_last_lines() {
        assert_eq!(tail("a\nb\nc\n", 2), "b\nc");
        assert_eq!(tail("a\nb\nc", 5), "a\nb\nc");
        assert_eq!(tail("a\nb\nc", 1), "c");
        assert_eq!(tail("a\nb\nc", 0), "");
        assert_eq!(tail("", 3), "");
    }

    #[test]
    fn stop_cont_and_children() -> Result<(), Box<dyn std::error::Error>> {
        let child = std::process::Command::new("sleep").arg("30").spawn()?;
        let mut child = ChildProcess::new(child);
        let pid = child.pid();
        assert_eq!(proc_stat(pid).map(|s| s.ppid), Some(std::process::id()));
        assert!(children_of(std::process::id()).contains(&pid));

        stop(pid)?;
        assert_eq!(proc_stat(pid).map(|s| s.state), Some('T'));
        cont(pid)?;
        assert_ne!(proc_stat(pid).map(|s| s.state), Some('T'));

        stop(pid)?;
        child.kill()?;
        child.kill()?;
        assert!(!child.is_alive());
        assert_eq!(proc_stat(pid), None);
        assert!(!child.signal(Signal::SIGCONT)?);
        Ok(())
    }
}
