//! A full disk on a member of a
//! [`ZooKeeperEnsemble`](super::ZooKeeperEnsemble), without privileges:
//! [`ZooKeeperMember::fill_disk`] and [`ZooKeeperMember::free_disk`].
//!
//! # How, and how it differs from a full disk
//!
//! A real full disk (`ENOSPC`) needs a filesystem of its own (a loop
//! mount or a tmpfs with a size, root only). Instead the member's JVM is
//! given a file size limit (`RLIMIT_FSIZE`, set from outside with
//! util-linux's `prlimit --pid`, which needs no privilege for one's own
//! processes): a write that would reach past the limit fails with `EFBIG`
//! ("File too large"); HotSpot ignores `SIGXFSZ`, which the kernel sends
//! with it, so the JVM lives on and ZooKeeper sees an `IOException`. The
//! limit is set to where the member's current transaction log ends (the
//! last byte written, before the zeros ZooKeeper preallocates), so its
//! next logged transaction fails.
//!
//! The differences: the limit is per process and per file offset, not
//! per directory, so every file the JVM writes past that offset fails
//! too (a snapshot once it grows past it, small files such as
//! `currentEpoch` not), while a full disk fails only the writes that need
//! new blocks, and would let writes into the log's preallocated zeros
//! through (a full disk bites a ZooKeeper server when its log grows past
//! its preallocation or rolls over, or it takes a snapshot: later than
//! here, and then the same way). The member's log is not on the limited
//! JVM's files: its output goes through pipes that the kit copies.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::Ordering;

use super::member::ZooKeeperMember;
use crate::Error;
use crate::process;

impl ZooKeeperMember {
    /// Fills the member's disk, as far as ZooKeeper can tell: its JVM's
    /// file size limit is set to where its transaction log ends, so its
    /// next logged transaction fails with "File too large" (`EFBIG`).
    /// The module docs say how this differs from `ENOSPC`. Lifted by
    /// [`free_disk`](Self::free_disk), or with the JVM (a
    /// [restart](Self::restart) starts one without the limit).
    ///
    /// What ZooKeeper 3.8 does then: the member's request pipeline stops
    /// on the error and it leaves the quorum; if it led, an election
    /// follows, which it may win again (it has the newest transactions)
    /// and fail again, so the whole ensemble may stop serving until the
    /// disk is freed.
    ///
    /// # Errors
    ///
    /// [`Error::NotRunning`] if the member is stopped,
    /// [`Error::BinaryNotFound`] without `prlimit`, [`Error::Io`] if its
    /// transaction log cannot be read, [`Error::Prlimit`] if `prlimit`
    /// fails.
    pub fn fill_disk(&self) -> Result<(), Error> {
        let pid = self.running_pid()?;
        let end = log_end(&self.dir().join("data/version-2"))?;
        prlimit(pid, &end.to_string())?;
        self.disk_full.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Lifts [`fill_disk`](Self::fill_disk)'s limit (back to unlimited).
    /// ZooKeeper does not always recover by itself from the failed write:
    /// a member that does not serve again in time can be
    /// [restarted](Self::restart).
    ///
    /// # Errors
    ///
    /// As for [`fill_disk`](Self::fill_disk).
    pub fn free_disk(&self) -> Result<(), Error> {
        prlimit(self.running_pid()?, "unlimited")?;
        self.disk_full.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Whether the disk is [filled](Self::fill_disk) (and the JVM that was
    /// limited still runs).
    pub fn is_disk_full(&self) -> bool {
        self.disk_full.load(Ordering::SeqCst) && self.is_running()
    }
}

/// Sets the soft file size limit of process `pid` to `soft` (bytes, or
/// `unlimited`): the hard limit stays, so that it can be lifted again.
fn prlimit(pid: u32, soft: &str) -> Result<(), Error> {
    let binary = process::find_binary("prlimit", "util-linux", &[])?;
    let output = Command::new(&binary)
        .args(["--pid", &pid.to_string(), &format!("--fsize={soft}:")])
        .output()
        .map_err(|source| Error::Spawn {
            program: binary,
            source,
        })?;
    if output.status.success() {
        return Ok(());
    }
    Err(Error::Prlimit {
        pid,
        status: output.status,
        output: String::from_utf8_lossy(&output.stderr).into_owned(),
    })
}

/// Where the newest transaction log in `dir` (`log.ZXID`) ends: one past
/// its last byte that is not a preallocated zero (0 if there is none).
fn log_end(dir: &Path) -> Result<u64, Error> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(err) => return Err(process::io_err(dir)(err)),
    };
    let newest = entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let zxid = u64::from_str_radix(name.strip_prefix("log.")?, 16).ok()?;
            Some((zxid, entry.path()))
        })
        .max_by_key(|(zxid, _)| *zxid);
    let Some((_, path)) = newest else {
        return Ok(0);
    };
    let bytes = fs::read(&path).map_err(process::io_err(&path))?;
    let end = bytes
        .iter()
        .rposition(|&byte| byte != 0)
        .map_or(0, |last| last + 1);
    Ok(u64::try_from(end).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::log_end;

    #[test]
    fn a_log_ends_before_its_preallocated_zeros() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        assert_eq!(log_end(&dir.path().join("missing"))?, 0);
        assert_eq!(log_end(dir.path())?, 0);
        std::fs::write(dir.path().join("log.100000001"), [1, 2, 0, 3, 0, 0])?;
        std::fs::write(dir.path().join("log.ff"), [9; 64])?;
        std::fs::write(dir.path().join("snapshot.200000000"), [9; 64])?;
        assert_eq!(log_end(dir.path())?, 4, "the newest log by zxid");
        Ok(())
    }
}
