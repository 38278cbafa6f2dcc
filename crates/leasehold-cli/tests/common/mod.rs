//! Helpers shared by the binary's test files.

use std::process::{Command, Output};

/// Runs the `leasehold` binary with `args` to completion, without the
/// caller's `REDIS_URL` / `DATABASE_URL` (so it starts its own servers)
/// and `LEASEHOLD_TLS_*` files (which a plain `chaos` refuses to leave
/// unused).
pub(crate) fn leasehold(args: &[&str]) -> Result<Output, std::io::Error> {
    Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(args)
        .env_remove("REDIS_URL")
        .env_remove("DATABASE_URL")
        .env_remove("LEASEHOLD_TLS_CA")
        .env_remove("LEASEHOLD_TLS_CERT")
        .env_remove("LEASEHOLD_TLS_KEY")
        .output()
}

/// Runs `leasehold chaos --json args` and returns its rows and its stderr
/// (its notes); requires exit 0 (every safe row held, every control
/// caught).
#[allow(dead_code)] // not every test file runs the matrix
pub(crate) fn chaos_matrix(
    args: &[&str],
) -> Result<(Vec<serde_json::Value>, String), Box<dyn std::error::Error>> {
    let mut all = vec!["chaos", "--json"];
    all.extend_from_slice(args);
    let out = leasehold(&all)?;
    let stdout = String::from_utf8(out.stdout)?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let rows = stdout
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    Ok((rows, stderr))
}

/// The row of `mode` under `fault` in a matrix's JSON rows.
#[allow(dead_code)] // not every test file reads rows
pub(crate) fn row<'a>(
    rows: &'a [serde_json::Value],
    mode: &str,
    fault: &str,
) -> Result<&'a serde_json::Value, String> {
    rows.iter()
        .find(|r| r["mode"] == mode && r["fault"] == fault && r.get("status").is_some())
        .ok_or_else(|| format!("no {mode} x {fault} row in {rows:?}"))
}
