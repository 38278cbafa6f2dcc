//! How a run ends: the exit codes (every `--help` lists them, from `cli`'s
//! `exit_codes!`), and the usage error that ends a run with code 2.

/// Exit code 1: a run BROKEN, or a demo step not as the tutorial shows.
pub(crate) const BROKEN: u8 = 1;
/// Exit code 2: bad flags or flags that do not go together.
pub(crate) const USAGE: u8 = 2;
/// Exit code 3: a server error.
pub(crate) const SERVER_ERROR: u8 = 3;
/// Exit code 130 (128 + SIGINT): interrupted by SIGINT or SIGTERM.
pub(crate) const INTERRUPTED: u8 = 130;

/// A usage error found after parsing (flags that do not go together):
/// exit code 2, like clap's own.
#[derive(Debug)]
pub(crate) struct Usage(pub(crate) String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}
