//! Tests against a real 3-member etcd cluster: elections after a stopped,
//! paused or cut-off leader, a restarted member's data, and what a cut-off
//! member refuses.

use std::error::Error;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use leasehold_testkit::{Error as TestkitError, EtcdCluster};

type TestResult = Result<(), Box<dyn Error>>;

/// How long a condition may take to come true: elections take about an
/// election timeout, a rejoin a few heartbeats; the rest is slack for a
/// loaded machine.
const WAIT: Duration = Duration::from_secs(20);

/// One cluster at a time: three etcd members each, with 500 ms election
/// timeouts, are enough load for a shared machine.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Polls `check` until it returns `Some`, failing after [`WAIT`].
fn eventually<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> Result<T, Box<dyn Error>> {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(value) = check() {
            return Ok(value);
        }
        if Instant::now() >= deadline {
            return Err(format!("{what}: not within {WAIT:?}").into());
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// A member other than `not`.
fn other_than(cluster: &EtcdCluster, not: usize) -> usize {
    (not + 1) % cluster.len()
}

/// Waits for a leader other than `old` that every running, uncut member
/// follows.
fn new_leader(cluster: &EtcdCluster, old: usize) -> Result<usize, Box<dyn Error>> {
    eventually("a new leader", || {
        cluster.leader().filter(|&leader| leader != old)
    })
}

#[test]
fn a_cluster_starts_with_one_leader_and_replicates() -> TestResult {
    let _one = one_at_a_time();
    let cluster = EtcdCluster::start(3)?;
    assert_eq!(cluster.len(), 3);
    assert!(!cluster.version().is_empty());
    let endpoints = cluster.endpoints();
    assert_eq!(endpoints.len(), 3);
    for (member, endpoint) in cluster.members().iter().zip(&endpoints) {
        assert!(endpoint.starts_with("http://127.0.0.1:"), "{endpoint}");
        assert_eq!(&member.endpoint(), endpoint);
    }
    let leader = cluster.wait_for_leader(WAIT)?;
    let mut ids = Vec::new();
    for member in cluster.members() {
        let status = member.status()?;
        assert_eq!(status.id, member.id());
        assert!(member.is_healthy());
        ids.push(status.id);
    }
    // Every member follows the one leader.
    eventually("all members naming the leader", || {
        let leader_id = cluster.member(cluster.leader()?).id();
        cluster
            .members()
            .iter()
            .all(|member| member.status().is_ok_and(|s| s.leader == Some(leader_id)))
            .then_some(())
    })?;
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 3, "members have distinct IDs");

    let writer = cluster.member(other_than(&cluster, leader));
    let revision = writer.put("start/key", "v1")?;
    assert!(revision > 1);
    for member in cluster.members() {
        assert_eq!(member.get("start/key")?.as_deref(), Some("v1"));
    }
    assert_eq!(writer.get("start/missing")?, None);
    writer.put("start/empty", "")?;
    assert_eq!(writer.get("start/empty")?.as_deref(), Some(""));
    Ok(())
}

#[test]
fn a_one_member_cluster_leads_itself_and_zero_is_refused() -> TestResult {
    let _one = one_at_a_time();
    let cluster = EtcdCluster::start(1)?;
    assert_eq!(cluster.wait_for_leader(WAIT)?, 0);
    cluster.member(0).put("single/key", "v")?;
    assert_eq!(cluster.member(0).get("single/key")?.as_deref(), Some("v"));
    assert!(matches!(
        EtcdCluster::start(0),
        Err(TestkitError::EtcdClusterSize { members: 0 })
    ));
    Ok(())
}

#[test]
fn stopping_the_leader_elects_another_and_a_restart_rejoins() -> TestResult {
    let _one = one_at_a_time();
    let cluster = EtcdCluster::start(3)?;
    let old = cluster.wait_for_leader(WAIT)?;
    cluster.member(old).put("stop/key", "before")?;

    cluster.member(old).stop()?;
    assert!(!cluster.member(old).is_running());
    assert!(cluster.member(old).status().is_err());
    let leader = new_leader(&cluster, old)?;
    // Two of three still commit.
    cluster.member(leader).put("stop/key", "while-down")?;

    cluster.member(old).start()?;
    assert!(cluster.member(old).is_running());
    // It comes back with what it had, then catches up.
    eventually("the restarted member catching up", || {
        let value = cluster.member(old).get("stop/key").ok()??;
        (value == "while-down").then_some(())
    })?;
    assert!(cluster.member(old).is_healthy());
    Ok(())
}

#[test]
fn a_restarted_cluster_keeps_its_data() -> TestResult {
    let _one = one_at_a_time();
    let cluster = EtcdCluster::start(3)?;
    let leader = cluster.wait_for_leader(WAIT)?;
    let revision = cluster.member(leader).put("restart/key", "kept")?;
    let before: Vec<u32> = cluster.members().iter().map(|m| m.pid()).collect();

    cluster.restart()?;
    for (member, pid) in cluster.members().iter().zip(before) {
        assert_ne!(member.pid(), pid, "{} was restarted", member.name());
        assert_eq!(member.get("restart/key")?.as_deref(), Some("kept"));
        assert!(member.status()?.revision >= revision);
    }
    Ok(())
}

#[test]
fn a_paused_leader_is_replaced_and_resumes_as_a_follower() -> TestResult {
    let _one = one_at_a_time();
    let cluster = EtcdCluster::start(3)?;
    let old = cluster.wait_for_leader(WAIT)?;
    let paused = cluster.member(old);

    paused.pause()?;
    assert!(paused.is_paused());
    assert!(paused.status().is_err(), "a paused member answers nothing");
    let leader = new_leader(&cluster, old)?;
    cluster.member(leader).put("pause/key", "while-paused")?;

    paused.resume()?;
    assert!(!paused.is_paused());
    // Woken in an older term, it learns of the new one and follows.
    eventually("the resumed member following and catching up", || {
        let value = paused.get("pause/key").ok()??;
        let follows = paused.status().ok()?.leader?;
        let leader = cluster.leader()?;
        (value == "while-paused" && follows == cluster.member(leader).id()).then_some(())
    })?;
    Ok(())
}

#[test]
fn a_cut_off_leader_is_replaced_commits_nothing_and_rejoins() -> TestResult {
    let _one = one_at_a_time();
    let cluster = EtcdCluster::start(3)?;
    let old = cluster.wait_for_leader(WAIT)?;
    let cut = cluster.member(old);
    cut.put("cut/key", "before")?;

    cut.cut_off();
    assert!(cut.is_cut_off());
    let leader = new_leader(&cluster, old)?;
    // Check-quorum: the old leader hears from no majority and steps down,
    // which it would not if its own connections still went out.
    eventually("the cut-off leader stepping down", || {
        let status = cut.status().ok()?;
        (status.leader != Some(cut.id())).then_some(())
    })?;
    // etcd 3.4 answers neither before its own timeout (about 6 s here);
    // the test kit's 5 s run out first.
    assert!(
        cut.put("cut/key", "from-the-cut-member").is_err(),
        "a cut-off member must not commit a write"
    );
    assert!(
        cut.get("cut/key").is_err(),
        "a cut-off member must not serve a linearizable read"
    );
    // It still answers from its own store (it is cut, not dead).
    assert_eq!(cut.get_serializable("cut/key")?.as_deref(), Some("before"));
    cluster.member(leader).put("cut/key", "after")?;

    cut.heal();
    assert!(!cut.is_cut_off());
    eventually("the healed member rejoining", || {
        let value = cut.get("cut/key").ok()??;
        (value == "after").then_some(())
    })?;
    for member in cluster.members() {
        assert_eq!(member.get("cut/key")?.as_deref(), Some("after"));
    }
    Ok(())
}

#[test]
fn a_cut_off_follower_serves_stale_reads_only_and_clients_can_be_cut_too() -> TestResult {
    let _one = one_at_a_time();
    let cluster = EtcdCluster::start(3)?;
    let leader = cluster.wait_for_leader(WAIT)?;
    let follower = cluster.member(other_than(&cluster, leader));
    cluster.member(leader).put("follower/key", "old")?;
    eventually("the follower having the key", || {
        let value = follower.get_serializable("follower/key").ok()??;
        (value == "old").then_some(())
    })?;

    follower.cut_off_with_clients();
    // The majority goes on committing without it, under the same leader.
    cluster.member(leader).put("follower/key", "new")?;
    assert!(follower.get("follower/key").is_err());
    assert_eq!(
        follower.get_serializable("follower/key")?.as_deref(),
        Some("old")
    );
    // Its clients' endpoint closes connections; another member's answers.
    assert_eq!(http_get_version(&follower.endpoint())?, "");
    let other = cluster.member(3 - leader - follower.index());
    assert!(http_get_version(&other.endpoint())?.contains("etcdserver"));

    follower.heal();
    eventually("the healed follower catching up", || {
        let value = follower.get("follower/key").ok()??;
        (value == "new").then_some(())
    })?;
    assert!(http_get_version(&follower.endpoint())?.contains("etcdserver"));
    Ok(())
}

/// `GET /version` through `endpoint` (`http://host:port`); what came back,
/// empty if the connection was closed without a reply.
fn http_get_version(endpoint: &str) -> Result<String, Box<dyn Error>> {
    let addr = endpoint.trim_start_matches("http://");
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    // A refused connection may be closed before the request is written.
    let _ = stream.write_all(b"GET /version HTTP/1.0\r\n\r\n");
    let mut reply = Vec::new();
    match stream.read_to_end(&mut reply) {
        Ok(_) => {}
        Err(err) if err.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(err) => return Err(err.into()),
    }
    Ok(String::from_utf8_lossy(&reply).into_owned())
}
