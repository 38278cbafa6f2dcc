//! Fault injectors for lock workers and for the keys they hold.
//!
//! A lease is only as safe as its holder's sense of time: a worker frozen
//! past its TTL (a long GC pause, a stopped VM, `SIGSTOP`) wakes up still
//! believing it holds the lock while another worker has taken it. The
//! process functions here freeze and thaw any process by pid, so a chaos
//! run can do that to worker processes it spawned.
//!
//! The key helpers on [`RedisServer`] take a lock away behind its holder's
//! back, as a failover to a replica that never saw the key, an eviction, or
//! an operator would:
//!
//! | helper | command | what it models |
//! | --- | --- | --- |
//! | [`RedisServer::delete_key`] | `DEL key` | the key is lost (eviction, failover, operator) |
//! | [`RedisServer::expire_key_soon`] | `PEXPIRE key 1` | the key expires early (a clock jump on the server) |
//! | [`RedisServer::flush_scripts`] | `SCRIPT FLUSH SYNC` | the script cache is lost (a restart or failover); the next `EVALSHA` gets `NOSCRIPT` |
//!
//! Restarts with and without the data are [`RedisServer::restart`] and
//! [`RedisServer::restart_empty`], failover is [`RedisServer::promote`],
//! and network faults are [`FaultProxy`](crate::FaultProxy)'s.

use nix::sys::signal::Signal;

use crate::process;
use crate::{Error, RedisServer};

/// Freezes process `pid` with `SIGSTOP` and returns once the kernel reports
/// it stopped (state `T` in `/proc/<pid>/stat`), so it runs no further
/// instruction until [`resume_process`]. Only that process is stopped, not
/// its children. Timers keep running: a lease it holds keeps expiring.
///
/// Stopping a process this one did not start (and cannot continue) is
/// allowed; pausing the calling process itself is refused, since nothing
/// could resume it.
///
/// # Errors
///
/// [`Error::Signal`] with `ESRCH` if there is no process `pid` (`0`
/// included), with `EINVAL` if `pid` is this process, or as the kernel
/// refused; [`Error::SignalTimeout`] if it does not stop within 2 s.
pub fn pause_process(pid: u32) -> Result<(), Error> {
    check_target(pid, Signal::SIGSTOP)?;
    process::stop(pid)
}

/// Stops the calling process with `SIGSTOP` (every thread of it) and
/// returns once another process continues it with `SIGCONT` (e.g.
/// [`resume_process`]): for a worker that pauses itself at a chosen point,
/// such as between a read and its write.
///
/// # Errors
///
/// [`Error::Signal`] if the signal cannot be raised.
pub fn stop_this_process() -> Result<(), Error> {
    nix::sys::signal::raise(Signal::SIGSTOP).map_err(|source| Error::Signal {
        signal: Signal::SIGSTOP,
        pid: std::process::id(),
        source,
    })
}

/// Continues process `pid` with `SIGCONT` and returns once it is no longer
/// stopped. Continuing a process that is not stopped changes nothing.
///
/// # Errors
///
/// As for [`pause_process`], with `SIGCONT`.
pub fn resume_process(pid: u32) -> Result<(), Error> {
    check_target(pid, Signal::SIGCONT)?;
    process::cont(pid)
}

/// Whether process `pid` is stopped by a signal (state `T` in
/// `/proc/<pid>/stat`), whoever stopped it. `false` if there is no such
/// process.
pub fn is_process_paused(pid: u32) -> bool {
    process::proc_stat(pid).is_some_and(|stat| stat.state == 'T')
}

/// Rejects pids that signalling would misinterpret: `0` (the whole process
/// group), missing processes and this process.
fn check_target(pid: u32, signal: Signal) -> Result<(), Error> {
    let refuse = |source| Error::Signal {
        signal,
        pid,
        source,
    };
    if pid == std::process::id() {
        return Err(refuse(nix::Error::EINVAL));
    }
    // /proc/0 does not exist, and neither do pids past i32::MAX.
    if process::proc_stat(pid).is_none() {
        return Err(refuse(nix::Error::ESRCH));
    }
    Ok(())
}

/// Taking a lock's key away behind its holder's back.
impl RedisServer {
    /// Deletes `key` (`DEL`): the lock is lost, as by an eviction or a
    /// failover to a replica that never saw it. Returns whether it existed.
    ///
    /// # Errors
    ///
    /// As for [`command`](Self::command).
    pub fn delete_key(&self, key: &str) -> Result<bool, Error> {
        Ok(self.redis_cli(&["DEL", key])? == "1")
    }

    /// Makes `key` expire after 1 ms (`PEXPIRE key 1`), long before its
    /// holder expects, as a clock jumping forward on the server would.
    /// Returns whether it existed.
    ///
    /// # Errors
    ///
    /// As for [`command`](Self::command).
    pub fn expire_key_soon(&self, key: &str) -> Result<bool, Error> {
        Ok(self.redis_cli(&["PEXPIRE", key, "1"])? == "1")
    }

    /// Empties the Lua script cache (`SCRIPT FLUSH SYNC`), as a restart or
    /// a failover does: the next `EVALSHA` of every script gets `NOSCRIPT`.
    ///
    /// # Errors
    ///
    /// As for [`command`](Self::command).
    pub fn flush_scripts(&self) -> Result<(), Error> {
        self.command(&["SCRIPT", "FLUSH", "SYNC"]).map(drop)
    }
}

/// The processes below `pid` (its children, theirs, ...), read from
/// `/proc/PID/task/TID/children`; empty where `/proc` cannot be read.
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut found: Vec<u32> = Vec::new();
    let mut next = vec![pid];
    while let Some(parent) = next.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{parent}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let children =
                std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for child in children.split_whitespace().filter_map(|c| c.parse().ok()) {
                if !found.contains(&child) {
                    found.push(child);
                    next.push(child);
                }
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_targets_are_refused() {
        for (pid, errno) in [
            (0, nix::Error::ESRCH),
            (u32::MAX, nix::Error::ESRCH),
            (std::process::id(), nix::Error::EINVAL),
        ] {
            match pause_process(pid) {
                Err(Error::Signal { source, .. }) => assert_eq!(source, errno, "pid {pid}"),
                other => panic!("pid {pid}: expected a signal error, got {other:?}"),
            }
            assert!(matches!(
                resume_process(pid),
                Err(Error::Signal { source, .. }) if source == errno
            ));
        }
        assert!(!is_process_paused(0));
        assert!(!is_process_paused(std::process::id()));
    }
}
