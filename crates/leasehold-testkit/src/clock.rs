//! A server's wall clock driven by libfaketime: jumped forward, or run
//! faster than this machine's.
//!
//! Redis expires a key when its wall clock (`gettimeofday`) passes the
//! key's deadline, so a clock stepped forward (NTP, an operator, a
//! migrated VM) expires every lease at once, and a clock running fast
//! expires each lease sooner than its holder, counting on its own clock,
//! believes. To play either against a real server, the testkit starts it
//! with libfaketime preloaded (`LD_PRELOAD=libfaketimeMT.so.1`), its
//! setting read from a file in the server's directory
//! (`FAKETIME_TIMESTAMP_FILE`) on every call (`FAKETIME_NO_CACHE=1`, else
//! a rewrite takes up to 10 s to be seen), and rewrites that file:
//!
//! - `+S` (seconds, a fraction allowed): the clock `S` ahead of the real
//!   one. Such a line leaves the rate as it was: the testkit writes one
//!   to step a clock at rate 1 only;
//! - `+S xR`: running `R` times as fast (`x1`: at the real rate again).
//!   With `FAKETIME_XRESET=1` a change of rate starts from the time the
//!   clock shows then (without it, the new rate would count from the
//!   process's start: a jump), and the time a fast clock gained stays
//!   when it slows down again; libfaketime then ignores the line's
//!   offset, so the testkit changes the rate and the offset in separate
//!   writes.
//!
//! The monotonic clock is left alone (`FAKETIME_DONT_FAKE_MONOTONIC=1`),
//! as a stepped or drifting wall clock leaves it; Redis times its own
//! events with it, and its expiry with the wall clock.
//!
//! Not every server binary can be driven: Debian's `redis-server`, linked
//! with jemalloc, hangs at start under libfaketime (jemalloc reads the
//! clock while libfaketime initialises), and a static binary ignores
//! `LD_PRELOAD`. The testkit checks, when such a server starts, that its
//! `TIME` follows a one-day offset and comes back
//! ([`Error::ClockNotDriven`] if not). Valkey's libc-malloc build
//! (`scripts/valkey.sh`) follows.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use crate::Error;
use crate::process;

/// The thread-safe build of libfaketime (Redis has I/O and background
/// threads).
const LIBRARY: &str = "libfaketimeMT.so.1";

/// Where distributions install it (Debian's `libfaketime` package: the
/// first, or its multiarch sibling).
const LIBRARY_DIRS: [&str; 5] = [
    "/usr/lib/x86_64-linux-gnu/faketime",
    "/usr/lib/aarch64-linux-gnu/faketime",
    "/usr/lib64/faketime",
    "/usr/lib/faketime",
    "/usr/local/lib/faketime",
];

/// The file's name in the server's directory.
const FILE: &str = "faketime.rc";

/// The environment variables libfaketime reads that would override the
/// file, removed from the server's environment.
const OVERRIDES: [&str; 2] = ["FAKETIME", "FAKETIME_FOLLOW_FILE"];

/// The path of libfaketime's thread-safe library.
fn library() -> Result<PathBuf, Error> {
    LIBRARY_DIRS
        .iter()
        .map(|dir| Path::new(dir).join(LIBRARY))
        .find(|path| path.is_file())
        .ok_or_else(|| Error::LibraryNotFound {
            name: LIBRARY.to_owned(),
            install_hint: "scripts/install-deps.sh (or: sudo apt-get install -y libfaketime)"
                .to_owned(),
        })
}

/// A server's libfaketime file and what was last written to it.
#[derive(Debug)]
pub(crate) struct FakeClock {
    library: PathBuf,
    file: PathBuf,
    setting: Mutex<Setting>,
}

/// What the file says: an offset in milliseconds, and a rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Setting {
    pub(crate) offset_ms: i64,
    pub(crate) rate: f64,
}

impl Setting {
    /// The file's line that sets the offset (`+1.500`, `-0.250`), or
    /// the rate (`+1.500 x3`).
    fn line(self, rate: bool) -> String {
        let sign = if self.offset_ms < 0 { '-' } else { '+' };
        let ms = self.offset_ms.unsigned_abs();
        let offset = format!("{sign}{}.{:03}", ms / 1000, ms % 1000);
        if rate {
            format!("{offset} x{}\n", self.rate)
        } else {
            format!("{offset}\n")
        }
    }
}

impl FakeClock {
    /// Finds libfaketime and writes the file in `dir`: the real time, at
    /// its rate.
    pub(crate) fn new(dir: &Path) -> Result<FakeClock, Error> {
        let clock = FakeClock {
            library: library()?,
            file: dir.join(FILE),
            setting: Mutex::new(Setting {
                offset_ms: 0,
                rate: 1.0,
            }),
        };
        clock.set_offset(0)?;
        Ok(clock)
    }

    /// The server's environment: what to set, and what to remove.
    pub(crate) fn env(&self) -> ([(&'static str, OsString); 5], [&'static str; 2]) {
        let set = [
            ("LD_PRELOAD", self.library.clone().into_os_string()),
            (
                "FAKETIME_TIMESTAMP_FILE",
                self.file.clone().into_os_string(),
            ),
            ("FAKETIME_NO_CACHE", "1".into()),
            ("FAKETIME_XRESET", "1".into()),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1".into()),
        ];
        (set, OVERRIDES)
    }

    /// What the file says now.
    pub(crate) fn setting(&self) -> Setting {
        *self.setting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets the clock `offset_ms` ahead of the real one (behind if
    /// negative), at its rate: for a clock at rate 1 (the caller checks).
    pub(crate) fn set_offset(&self, offset_ms: i64) -> Result<(), Error> {
        self.write(|setting| Setting {
            offset_ms,
            ..setting
        })
    }

    /// Sets the clock's rate, from the time it shows: for a rate other
    /// than its own (the same line again would read as a new offset).
    pub(crate) fn set_rate(&self, rate: f64) -> Result<(), Error> {
        self.write(|setting| Setting { rate, ..setting })
    }

    /// Rewrites the file: a new file renamed over the old one, so that
    /// libfaketime, which reads it on every call, never reads half of it.
    fn write(&self, change: impl FnOnce(Setting) -> Setting) -> Result<(), Error> {
        let mut current = self.setting.lock().unwrap_or_else(PoisonError::into_inner);
        let next = change(*current);
        let line = next.line(next.rate != current.rate);
        let temporary = self.file.with_extension("next");
        fs::write(&temporary, line).map_err(process::io_err(&temporary))?;
        fs::rename(&temporary, &self.file).map_err(process::io_err(&self.file))?;
        *current = next;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_has_milliseconds_and_a_new_rate() {
        let line = |offset_ms, rate, new_rate| Setting { offset_ms, rate }.line(new_rate);
        assert_eq!(line(0, 1.0, false), "+0.000\n");
        assert_eq!(line(10_250, 1.0, false), "+10.250\n");
        assert_eq!(line(-1_005, 1.0, false), "-1.005\n");
        assert_eq!(line(86_400_000, 3.0, true), "+86400.000 x3\n");
        assert_eq!(line(5, 1.0, true), "+0.005 x1\n");
        assert_eq!(line(5, 0.5, true), "+0.005 x0.5\n");
    }
}
