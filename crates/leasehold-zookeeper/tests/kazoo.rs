//! Interoperation with kazoo, Python's ZooKeeper client: a kazoo `Lock`
//! (Debian's python3-kazoo 2.8.0, driven by `kazoo_lock.py` beside this
//! file) and a leasehold lock on the same path exclude each other,
//! whichever holds first, once kazoo is told leasehold's node names
//! (`extra_lock_patterns=["-lock-"]`, Curator's layout). Without the
//! pattern kazoo counts only its own `__lock__` nodes, so it takes the
//! lock beside a leasehold holder: tested too, as the reason the crate
//! docs give for the pattern. leasehold needs nothing: it orders kazoo's
//! nodes by their sequence like its own.
//!
//! Debian's python3-kazoo serves Debian's `/usr/bin/python3` (a `python3`
//! earlier on `PATH`, such as pyenv's, does not see it), so that is the
//! interpreter, unless `LEASEHOLD_KAZOO_PYTHON` names another with kazoo
//! 2.7.1 or later. `scripts/install-deps.sh` installs it; a machine
//! without it fails these tests, saying so, rather than skipping them.

use std::time::Duration;

use leasehold::{AcquireOptions, Error, Lessor, RetryStrategy};
use tokio::process::Command;
use zookeeper_client::Client;

use common::{PATIENCE, TestResult, until_contenders};
use peer::{Peer, setup};

mod common;
#[path = "common/peer.rs"]
mod peer;

/// What kazoo must be told to count leasehold's (and Curator's)
/// `_c_<uuid>-lock-<sequence>` nodes as contenders: kazoo 2.8.0 matches
/// each child against `(?:<its patterns>)(-?\d{10})$`.
const CURATOR_PATTERN: &str = "-lock-";

/// The interpreter that runs `kazoo_lock.py`.
fn python() -> String {
    std::env::var("LEASEHOLD_KAZOO_PYTHON").unwrap_or_else(|_| "/usr/bin/python3".to_owned())
}

/// Starts `kazoo_lock.py` on `path` (its lock constructed with `patterns`
/// as `extra_lock_patterns`) and waits until it is connected.
async fn kazoo(
    hosts: &str,
    path: &str,
    patterns: &[&str],
) -> Result<Peer, Box<dyn std::error::Error>> {
    let program = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/kazoo_lock.py");
    let python = python();
    let mut command = Command::new(&python);
    command.arg(&program).arg(hosts).arg(path).args(patterns);
    let mut kazoo = Peer::spawn("kazoo_lock.py", command).map_err(|err| {
        format!(
            "cannot run {python} ({err}): the kazoo interop test needs Debian's python3 \
             with python3-kazoo (scripts/install-deps.sh installs it), or \
             LEASEHOLD_KAZOO_PYTHON naming a python with kazoo"
        )
    })?;
    let started = kazoo.next().await.map_err(|err| {
        format!(
            "{err}\n(the kazoo interop test needs {python} with kazoo: Debian's \
             python3-kazoo, which scripts/install-deps.sh installs, or \
             LEASEHOLD_KAZOO_PYTHON naming a python with kazoo)"
        )
    })?;
    if !started.starts_with("STARTED kazoo ") {
        return Err(format!("kazoo_lock.py said {started:?}, not STARTED").into());
    }
    Ok(kazoo)
}

/// Stops the program and waits for it to end.
async fn quit(mut kazoo: Peer) -> TestResult {
    kazoo.say("quit").await?;
    kazoo.exited().await
}

/// The only contender in `dir`.
async fn only_child(raw: &Client, dir: &str) -> Result<String, Box<dyn std::error::Error>> {
    let children = raw.list_children(dir).await?;
    match children.as_slice() {
        [one] => Ok(one.clone()),
        other => Err(format!("{dir} holds {other:?}, not one node").into()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kazoo_with_the_curator_pattern_and_leasehold_exclude_each_other() -> TestResult {
    let (ensemble, raw, locker) = setup().await?;
    let key = "shared";
    let path = locker.lock_path(key);
    let ttl = Duration::from_secs(10);
    let once = AcquireOptions::new().retry(RetryStrategy::none());
    let patient = AcquireOptions::new().wait(PATIENCE);
    let mut kazoo = kazoo(&ensemble.connect_string(), &path, &[CURATOR_PATTERN]).await?;

    // kazoo holds first: leasehold finds the lock busy, queues behind
    // kazoo's `__lock__` node, and wins when kazoo releases.
    kazoo.say("try").await?;
    kazoo.expect("ACQUIRED").await?;
    let busy = locker.acquire_with(key, ttl, &once).await;
    assert!(matches!(busy, Err(Error::NotAcquired { .. })), "{busy:?}");
    let waiting = {
        let (locker, patient) = (locker.clone(), patient.clone());
        tokio::spawn(async move { locker.acquire_with(key, ttl, &patient).await })
    };
    until_contenders(&raw, &path, 2).await?;
    kazoo.say("status").await?;
    kazoo.expect("HOLDING").await?;
    kazoo.say("release").await?;
    kazoo.expect("RELEASED").await?;
    let lease = waiting.await??;

    // leasehold holds first: kazoo counts leasehold's node as a contender
    // ahead of its own, so a non-blocking acquire is refused, one with a
    // timeout times out (kazoo 2.8.0 raises LockTimeout, it does not
    // return False), neither leaving a node, and a blocking one waits
    // behind exactly that node until leasehold releases.
    let ours = only_child(&raw, &path).await?;
    kazoo.say("try").await?;
    kazoo.expect("BUSY").await?;
    kazoo.say("wait 0.2").await?;
    kazoo.expect("TIMEOUT").await?;
    assert_eq!(only_child(&raw, &path).await?, ours);
    kazoo.say("acquire").await?;
    kazoo.expect(&format!("WAITING {ours}")).await?;
    kazoo.say("status").await?;
    kazoo.expect("NOT_HOLDING").await?;
    lease.release().await?;
    kazoo.expect("ACQUIRED").await?;
    let busy = locker.acquire_with(key, ttl, &once).await;
    assert!(matches!(busy, Err(Error::NotAcquired { .. })), "{busy:?}");
    kazoo.say("release").await?;
    kazoo.expect("RELEASED").await?;
    locker
        .acquire_with(key, ttl, &once)
        .await?
        .release()
        .await?;
    quit(kazoo).await?;
    Ok(())
}

/// Why the docs tell kazoo users to pass the pattern: without it kazoo
/// counts only `__lock__` nodes, so it does not see a leasehold holder
/// and takes the lock beside it. leasehold still sees kazoo's node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kazoo_without_the_pattern_takes_the_lock_beside_leasehold() -> TestResult {
    let (ensemble, raw, locker) = setup().await?;
    let key = "shared";
    let path = locker.lock_path(key);
    let ttl = Duration::from_secs(10);
    let once = AcquireOptions::new().retry(RetryStrategy::none());
    let mut kazoo = kazoo(&ensemble.connect_string(), &path, &[]).await?;

    let lease = locker.acquire_with(key, ttl, &once).await?;
    kazoo.say("try").await?;
    kazoo.expect("ACQUIRED").await?;
    // Both hold: leasehold's node is still there and first in line.
    lease.refresh(ttl).await?;
    kazoo.say("status").await?;
    kazoo.expect("HOLDING").await?;
    until_contenders(&raw, &path, 2).await?;
    kazoo.say("release").await?;
    kazoo.expect("RELEASED").await?;
    lease.release().await?;

    // The other way round the pattern does not matter: leasehold orders
    // kazoo's node by its sequence and waits for it.
    kazoo.say("try").await?;
    kazoo.expect("ACQUIRED").await?;
    let busy = locker.acquire_with(key, ttl, &once).await;
    assert!(matches!(busy, Err(Error::NotAcquired { .. })), "{busy:?}");
    kazoo.say("release").await?;
    kazoo.expect("RELEASED").await?;
    locker
        .acquire_with(key, ttl, &once)
        .await?
        .release()
        .await?;
    quit(kazoo).await?;
    Ok(())
}
