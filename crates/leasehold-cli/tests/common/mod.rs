//! Helpers shared by the binary's test files.

use std::process::{Command, Output};

/// Runs the `leasehold` binary with `args` to completion, without the
/// caller's `REDIS_URL` / `DATABASE_URL` (so it starts its own servers).
pub(crate) fn leasehold(args: &[&str]) -> Result<Output, std::io::Error> {
    Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(args)
        .env_remove("REDIS_URL")
        .env_remove("DATABASE_URL")
        .output()
}
