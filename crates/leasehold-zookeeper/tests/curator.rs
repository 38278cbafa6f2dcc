//! Interoperation with Apache Curator, the JVM's lock recipes: a Curator
//! `InterProcessMutex` (Debian's Curator 5.4.0, driven by the small Java
//! program beside this file, compiled with `javac` here) and a leasehold
//! lock on the same path exclude each other, whichever holds first, and
//! each waits its turn behind the other in the one queue.

use std::time::Duration;

use leasehold::{AcquireOptions, Error, Lessor, RetryStrategy};
use tokio::process::Command;

use common::{PATIENCE, TestResult, until_contenders};
use peer::{Peer, setup};

mod common;
#[path = "common/peer.rs"]
mod peer;

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
fn start_curator(classes: &std::path::Path, hosts: &str, path: &str) -> std::io::Result<Peer> {
    let mut command = Command::new("java");
    command
        .arg("-Xmx64m")
        .arg("-XX:TieredStopAtLevel=1")
        .arg("-cp")
        .arg(classpath(classes))
        .arg("CuratorMutex")
        .arg(hosts)
        .arg(path);
    Peer::spawn("curator", command)
}

/// Releases Curator's lock and waits for the process to end.
async fn release(mut curator: Peer) -> TestResult {
    curator.say("release").await?;
    curator.expect("RELEASED").await?;
    curator.exited().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_and_leasehold_exclude_each_other() -> TestResult {
    let classes = compile()?;
    let (ensemble, raw, locker) = setup().await?;
    let hosts = ensemble.connect_string();
    let key = "shared";
    let path = locker.lock_path(key);
    let ttl = Duration::from_secs(10);
    let once = AcquireOptions::new().retry(RetryStrategy::none());
    let patient = AcquireOptions::new().wait(PATIENCE);

    // Curator holds first: leasehold finds the lock busy, queues behind
    // it, and wins when Curator releases.
    let mut curator = start_curator(&classes, &hosts, &path)?;
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
    release(curator).await?;
    let lease = waiting.await??;

    // leasehold holds first: Curator queues behind it and waits until
    // leasehold releases.
    let mut curator = start_curator(&classes, &hosts, &path)?;
    curator.expect("STARTED").await?;
    until_contenders(&raw, &path, 2).await?;
    curator.say("status").await?;
    curator.expect("WAITING").await?;
    lease.release().await?;
    curator.expect("ACQUIRED").await?;
    let busy = locker.acquire_with(key, ttl, &once).await;
    assert!(matches!(busy, Err(Error::NotAcquired { .. })), "{busy:?}");
    release(curator).await?;
    locker
        .acquire_with(key, ttl, &once)
        .await?
        .release()
        .await?;
    Ok(())
}
