//! Interoperation with Apache Curator, the JVM's lock recipes: a Curator
//! `InterProcessMutex` (Debian's Curator 5.4.0, driven by the small Java
//! program beside this file, compiled with `javac` here) and a leasehold
//! lock on the same path exclude each other, whichever holds first, and
//! each waits its turn behind the other in the one queue.

use std::process::Stdio;
use std::time::Duration;

use leasehold::{AcquireOptions, Error, Lessor, RetryStrategy};
use leasehold_testkit::ZooKeeperEnsemble;
use leasehold_zookeeper::ZkLocker;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};
use zookeeper_client::Client;

use common::{PATIENCE, TestResult, until_contenders};

mod common;

/// Debian's Curator and what it needs, in `/usr/share/java`.
const JARS: &[&str] = &[
    "curator-recipes",
    "curator-framework",
    "curator-client",
    "zookeeper",
    "zookeeper-jute",
    "guava",
    "slf4j-api",
    "slf4j-nop",
];

fn classpath(classes: &std::path::Path) -> String {
    let mut parts: Vec<String> = JARS
        .iter()
        .map(|jar| format!("/usr/share/java/{jar}.jar"))
        .collect();
    parts.push(classes.display().to_string());
    parts.join(":")
}

/// `CuratorMutex.java`, compiled into the test's own temporary directory.
fn compile() -> Result<std::path::PathBuf, Box<dyn std::error::Error>> {
    let classes = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("curator-classes");
    std::fs::create_dir_all(&classes)?;
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/CuratorMutex.java");
    let out = std::process::Command::new("javac")
        .arg("-cp")
        .arg(classpath(&classes))
        .arg("-d")
        .arg(&classes)
        .arg(&source)
        .output()?;
    if !out.status.success() {
        return Err(format!("javac: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    Ok(classes)
}

/// One `CuratorMutex` process: acquiring from the start.
struct Curator {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Curator {
    fn start(
        classes: &std::path::Path,
        hosts: &str,
        path: &str,
    ) -> Result<Curator, Box<dyn std::error::Error>> {
        let mut child = Command::new("java")
            .arg("-Xmx64m")
            .arg("-XX:TieredStopAtLevel=1")
            .arg("-cp")
            .arg(classpath(classes))
            .arg("CuratorMutex")
            .arg(hosts)
            .arg(path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        Ok(Curator {
            child,
            lines: BufReader::new(stdout).lines(),
        })
    }

    /// Waits (a hang guard at most) for the next line, which must be `want`.
    async fn expect(&mut self, want: &str) -> TestResult {
        let line = tokio::time::timeout(PATIENCE, self.lines.next_line())
            .await
            .map_err(|_| format!("curator never said {want}"))??;
        match line {
            Some(line) if line == want => Ok(()),
            other => Err(format!("curator said {other:?}, not {want}").into()),
        }
    }

    async fn say(&mut self, command: &str) -> TestResult {
        let stdin = self.child.stdin.as_mut().ok_or("no stdin")?;
        stdin.write_all(format!("{command}\n").as_bytes()).await?;
        stdin.flush().await?;
        Ok(())
    }

    /// Releases Curator's lock and waits for the process to end.
    async fn release(mut self) -> TestResult {
        self.say("release").await?;
        self.expect("RELEASED").await?;
        let status = tokio::time::timeout(PATIENCE, self.child.wait()).await??;
        if !status.success() {
            return Err(format!("curator exited with {status}").into());
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_and_leasehold_exclude_each_other() -> TestResult {
    let classes = compile()?;
    let ensemble = ZooKeeperEnsemble::start_with(1, Duration::from_secs(1))?;
    let hosts = ensemble.connect_string();
    let raw = Client::connect(&hosts).await?;
    let locker = ZkLocker::builder()
        .session_timeout(Duration::from_secs(20))
        .connect(&hosts)
        .await?;
    let key = "shared";
    let path = locker.lock_path(key);
    let ttl = Duration::from_secs(10);
    let once = AcquireOptions::new().retry(RetryStrategy::none());
    let patient = AcquireOptions::new().wait(PATIENCE);

    // Curator holds first: leasehold finds the lock busy, queues behind
    // it, and wins when Curator releases.
    let mut curator = Curator::start(&classes, &hosts, &path)?;
    curator.expect("STARTED").await?;
    curator.expect("ACQUIRED").await?;
    let busy = locker.acquire_with(key, ttl, &once).await;
    assert!(matches!(busy, Err(Error::NotAcquired { .. })), "{busy:?}");
    let waiting = {
        let (locker, patient) = (locker.clone(), patient.clone());
        tokio::spawn(async move { locker.acquire_with(key, ttl, &patient).await })
    };
    until_contenders(&raw, &path, 2).await?;
    curator.say("status").await?;
    curator.expect("HOLDING").await?;
    curator.release().await?;
    let lease = waiting.await??;

    // leasehold holds first: Curator queues behind it and waits until
    // leasehold releases.
    let mut curator = Curator::start(&classes, &hosts, &path)?;
    curator.expect("STARTED").await?;
    until_contenders(&raw, &path, 2).await?;
    curator.say("status").await?;
    curator.expect("WAITING").await?;
    lease.release().await?;
    curator.expect("ACQUIRED").await?;
    let busy = locker.acquire_with(key, ttl, &once).await;
    assert!(matches!(busy, Err(Error::NotAcquired { .. })), "{busy:?}");
    curator.release().await?;
    locker
        .acquire_with(key, ttl, &once)
        .await?
        .release()
        .await?;
    Ok(())
}
