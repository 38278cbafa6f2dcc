//! A client no one here wrote (Curator's Java, kazoo's Python), run as a
//! child process that speaks one line at a time: commands on its stdin,
//! what it did on its stdout. Shared by the interop tests.

use std::process::Stdio;
use std::time::Duration;

use leasehold_testkit::ZooKeeperEnsemble;
use leasehold_zookeeper::ZkLocker;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};
use tokio::task::JoinHandle;
use zookeeper_client::Client;

use crate::common::{PATIENCE, TestResult};

/// A one-server ensemble, a raw client on it and a `ZkLocker` (a 20 s
/// session, so the tests' 10 s leases are allowed).
pub(crate) async fn setup()
-> Result<(ZooKeeperEnsemble, Client, ZkLocker), Box<dyn std::error::Error>> {
    let ensemble = ZooKeeperEnsemble::start_with(1, Duration::from_secs(1))?;
    let hosts = ensemble.connect_string();
    let raw = Client::connect(&hosts).await?;
    let locker = ZkLocker::builder()
        .session_timeout(Duration::from_secs(20))
        .connect(&hosts)
        .await?;
    Ok((ensemble, raw, locker))
}

/// One such process.
pub(crate) struct Peer {
    /// Its name in errors.
    name: &'static str,
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
    /// Everything it writes to stderr, once it has exited.
    stderr: Option<JoinHandle<String>>,
}

impl Peer {
    /// Starts `command` with its stdio piped (killed on drop).
    pub(crate) fn spawn(name: &'static str, mut command: Command) -> std::io::Result<Peer> {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = child.stdout.take().ok_or(std::io::ErrorKind::BrokenPipe)?;
        let mut stderr = child.stderr.take().ok_or(std::io::ErrorKind::BrokenPipe)?;
        let stderr = tokio::spawn(async move {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text).await;
            text
        });
        Ok(Peer {
            name,
            child,
            lines: BufReader::new(stdout).lines(),
            stderr: Some(stderr),
        })
    }

    /// The next line it says (a hang guard at most); its stderr in the
    /// error if it ended instead.
    pub(crate) async fn next(&mut self) -> Result<String, Box<dyn std::error::Error>> {
        let name = self.name;
        let line = tokio::time::timeout(PATIENCE, self.lines.next_line())
            .await
            .map_err(|_| format!("{name} said nothing"))??;
        if let Some(line) = line {
            return Ok(line);
        }
        let stderr = match self.stderr.take() {
            Some(task) => tokio::time::timeout(PATIENCE, task)
                .await
                .map_err(|_| format!("{name}'s stderr never closed"))??,
            None => String::new(),
        };
        Err(format!("{name} ended; its stderr:\n{stderr}").into())
    }

    /// Waits for the next line, which must be `want`.
    pub(crate) async fn expect(&mut self, want: &str) -> TestResult {
        let line = self.next().await?;
        if line != want {
            return Err(format!("{} said {line:?}, not {want}", self.name).into());
        }
        Ok(())
    }

    pub(crate) async fn say(&mut self, command: &str) -> TestResult {
        let stdin = self.child.stdin.as_mut().ok_or("no stdin")?;
        stdin.write_all(format!("{command}\n").as_bytes()).await?;
        stdin.flush().await?;
        Ok(())
    }

    /// Waits for it to end, which must be a success.
    pub(crate) async fn exited(mut self) -> TestResult {
        let status = tokio::time::timeout(PATIENCE, self.child.wait()).await??;
        if !status.success() {
            return Err(format!("{} exited with {status}", self.name).into());
        }
        Ok(())
    }
}
