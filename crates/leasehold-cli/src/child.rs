//! This binary started again as a child process: `bench leader`'s
//! candidates and `chaos`'s workers. A child runs a subcommand, reads its
//! spec as the first JSON line of its stdin (later lines are the parent's
//! instructions), and reports on stdout; the parent keeps the last lines of
//! its stderr, to say why it failed.

use std::collections::VecDeque;
use std::process::Stdio;

use anyhow::Context;
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{ChildStdin, ChildStdout};
use tokio::task::JoinHandle;

/// How many of a child's last stderr lines are kept.
const STDERR_LINES: usize = 10;

/// A child process of this binary, its spec sent.
pub(crate) struct Child {
    /// The process, killed when dropped.
    pub(crate) process: tokio::process::Child,
    /// Its stdin, after the spec's line.
    pub(crate) stdin: ChildStdin,
    /// Its stdout, for the parent to read as it goes.
    pub(crate) stdout: ChildStdout,
    /// The last lines of its stderr, once it closes.
    pub(crate) stderr: JoinHandle<String>,
}

/// Starts this binary with `args` (a subcommand), and writes `spec` to its
/// stdin as one JSON line. `role` names the child in errors (`worker`,
/// `candidate`).
///
/// # Errors
/// When the binary cannot be found or started, or the spec not sent.
pub(crate) async fn spawn(
    args: &[&str],
    role: &str,
    spec: &impl Serialize,
) -> anyhow::Result<Child> {
    let exe = std::env::current_exe().context("finding the leasehold binary")?;
    let mut process = tokio::process::Command::new(exe)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting a {role} process"))?;
    let mut stdin = process
        .stdin
        .take()
        .with_context(|| format!("the {role}'s stdin"))?;
    let mut line = serde_json::to_vec(spec)?;
    line.push(b'\n');
    stdin
        .write_all(&line)
        .await
        .with_context(|| format!("sending the {role} its spec"))?;
    let stdout = process
        .stdout
        .take()
        .with_context(|| format!("the {role}'s stdout"))?;
    let stderr = process
        .stderr
        .take()
        .with_context(|| format!("the {role}'s stderr"))?;
    let stderr = tokio::spawn(async move {
        let mut tail = VecDeque::with_capacity(STDERR_LINES);
        let mut lines = BufReader::new(stderr).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if tail.len() == STDERR_LINES {
                tail.pop_front();
            }
            tail.push_back(line);
        }
        Vec::from(tail).join("\n")
    });
    Ok(Child {
        process,
        stdin,
        stdout,
        stderr,
    })
}
