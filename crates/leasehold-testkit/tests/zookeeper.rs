//! Tests against a real ZooKeeper ensemble (three JVMs): elections after a
//! stopped, paused or cut-off leader, a paused follower, a majority cut
//! off, members coming back.

use std::error::Error;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use leasehold_testkit::{
    Error as TestkitError, ZOOKEEPER_TICK_TIME, ZooKeeperEnsemble, ZooKeeperMode, is_process_paused,
};

type TestResult = Result<(), Box<dyn Error>>;

/// How long a condition may take to come true: an election takes a second
/// or two, a paused leader is dropped after `syncLimit` (2 s),
/// a JVM starts in a few seconds; the rest is slack for a loaded machine.
const WAIT: Duration = Duration::from_secs(30);

/// One ensemble at a time: three JVMs are enough load for a shared
/// machine.
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
        thread::sleep(Duration::from_millis(50));
    }
}

/// Every member's mode, in index order.
fn modes(ensemble: &ZooKeeperEnsemble) -> Vec<Option<ZooKeeperMode>> {
    ensemble
        .members()
        .iter()
        .map(|member| member.mode())
        .collect()
}

/// Waits until member `leader` leads and every other running, unpaused
/// member that is not cut off follows.
fn settled(ensemble: &ZooKeeperEnsemble, leader: usize) -> Result<(), Box<dyn Error>> {
    eventually(
        &format!("member {leader} leading, the others following"),
        || {
            ensemble
                .members()
                .iter()
                .filter(|member| member.is_running() && !member.is_paused())
                .filter(|member| !ensemble.is_cut_off(member.index()))
                .all(|member| {
                    let want = if member.index() == leader {
                        ZooKeeperMode::Leader
                    } else {
                        ZooKeeperMode::Follower
                    };
                    member.mode() == Some(want)
                })
                .then_some(())
        },
    )
}

#[test]
fn bad_sizes_and_ticks_are_refused() {
    assert!(matches!(
        ZooKeeperEnsemble::start(0),
        Err(TestkitError::ZooKeeperEnsembleSize { members: 0 })
    ));
    for tick in [Duration::ZERO, Duration::from_micros(1500)] {
        assert!(matches!(
            ZooKeeperEnsemble::start_with(1, tick),
            Err(TestkitError::ZooKeeperTickTime { tick_time }) if tick_time == tick
        ));
    }
}

/// A setting given to `start_with_settings` overrides the test kit's own:
/// the server carries out a four-letter word the kit does not allow once
/// a later line allows it, and keeps the kit's others.
#[test]
fn settings_come_after_the_kits_own_and_win() -> TestResult {
    let _one = one_at_a_time();
    let ensemble = ZooKeeperEnsemble::start_with_settings(
        1,
        ZOOKEEPER_TICK_TIME,
        &[
            "4lw.commands.whitelist=srvr,ruok,mntr,envi",
            "forceSync=yes",
        ],
    )?;
    let member = ensemble.member(0);
    let envi = member.four_letter_word("envi")?;
    assert!(envi.contains("java.version="), "{envi}");
    // `stat` was the kit's, and the later list leaves it out.
    let stat = member.four_letter_word("stat")?;
    assert!(stat.contains("not in the whitelist"), "{stat}");
    let config = std::fs::read_to_string(member.dir().join("zoo.cfg"))?;
    let kit = config.find("forceSync=no").ok_or("no forceSync=no")?;
    let ours = config.find("forceSync=yes").ok_or("no forceSync=yes")?;
    assert!(kit < ours, "{config}");
    Ok(())
}

#[test]
fn one_server_is_standalone_with_the_chosen_tick() -> TestResult {
    let _one = one_at_a_time();
    let tick = Duration::from_millis(300);
    let ensemble = ZooKeeperEnsemble::start_with(1, tick)?;
    assert_eq!(ensemble.tick_time(), tick);
    assert_eq!(ensemble.min_session_timeout(), Duration::from_millis(600));
    assert_eq!(ensemble.max_session_timeout(), Duration::from_secs(6));
    let member = ensemble.member(0);
    assert_eq!(member.mode(), Some(ZooKeeperMode::Standalone));
    assert_eq!(ensemble.leader(), Some(0));
    assert!(member.is_ok());
    assert_eq!(
        ensemble.connect_string(),
        format!("127.0.0.1:{}", member.client_addr().port())
    );
    let srvr = member.four_letter_word("srvr")?;
    assert!(srvr.contains("Zookeeper version: 3."), "{srvr}");
    // Only the allowed words are carried out.
    let refused = member.four_letter_word("envi")?;
    assert!(refused.contains("not in the whitelist"), "{refused}");
    let config = std::fs::read_to_string(member.dir().join("zoo.cfg"))?;
    assert!(config.contains("tickTime=300\n"), "{config}");
    assert!(!config.contains("server.1="), "{config}");
    Ok(())
}

#[test]
fn a_stopped_leader_is_replaced_and_comes_back_as_a_follower() -> TestResult {
    let _one = one_at_a_time();
    let ensemble = ZooKeeperEnsemble::start(3)?;
    assert_eq!(ensemble.len(), 3);
    assert_eq!(ensemble.tick_time(), ZOOKEEPER_TICK_TIME);
    let hosts = ensemble.connect_string();
    assert_eq!(hosts.split(',').count(), 3, "{hosts}");
    for (member, host) in ensemble.members().iter().zip(hosts.split(',')) {
        assert_eq!(host, member.client_addr().to_string());
        assert_eq!(member.myid(), member.index() + 1);
    }
    let leader = ensemble.wait_for_leader(WAIT)?;
    settled(&ensemble, leader)?;

    ensemble.member(leader).stop()?;
    assert!(!ensemble.member(leader).is_running());
    assert_eq!(ensemble.member(leader).mode(), None);
    let next = eventually("a new leader", || {
        ensemble.leader().filter(|&next| next != leader)
    })?;
    settled(&ensemble, next)?;

    ensemble.member(leader).start()?;
    assert!(ensemble.member(leader).is_running());
    settled(&ensemble, next)?;
    assert_eq!(ensemble.leader(), Some(next));

    // A restart of a follower brings it back too.
    let follower = (next + 1) % ensemble.len();
    let old_pid = ensemble.member(follower).pid();
    ensemble.member(follower).restart()?;
    assert_ne!(ensemble.member(follower).pid(), old_pid);
    settled(&ensemble, next)?;
    Ok(())
}

#[test]
fn a_paused_follower_leaves_a_leader_and_a_paused_leader_is_replaced() -> TestResult {
    let _one = one_at_a_time();
    let ensemble = ZooKeeperEnsemble::start(3)?;
    let leader = ensemble.wait_for_leader(WAIT)?;
    settled(&ensemble, leader)?;

    let follower = (leader + 1) % ensemble.len();
    let paused = ensemble.member(follower);
    paused.pause()?;
    assert!(paused.is_paused());
    assert!(is_process_paused(paused.pid()));
    assert_eq!(paused.mode(), None, "a paused JVM answers nothing");
    // Two of three still make a quorum: the leader keeps leading.
    settled(&ensemble, leader)?;
    assert_eq!(ensemble.leader(), Some(leader));
    paused.resume()?;
    assert!(!paused.is_paused());
    assert!(!is_process_paused(paused.pid()));
    settled(&ensemble, leader)?;

    // A frozen leader sends no pings: its followers drop it after
    // syncLimit and elect one of themselves.
    ensemble.member(leader).pause()?;
    let next = eventually("a new leader", || {
        ensemble.leader().filter(|&next| next != leader)
    })?;
    settled(&ensemble, next)?;
    assert_eq!(
        ensemble.member(leader).mode(),
        None,
        "{:?}",
        modes(&ensemble)
    );
    // Thawed, it finds its followers gone and follows the new leader.
    ensemble.member(leader).resume()?;
    settled(&ensemble, next)?;
    Ok(())
}

/// What a client that comes through the kit's proxy to member `index`
/// gets for `srvr`: empty once the proxy closes its connections.
fn srvr_through_proxy(ensemble: &ZooKeeperEnsemble, index: usize) -> String {
    let ask = || -> std::io::Result<String> {
        let mut stream = TcpStream::connect_timeout(
            &ensemble.proxied_client_addr(index),
            Duration::from_secs(5),
        )?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        stream.write_all(b"srvr")?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer)?;
        Ok(answer)
    };
    ask().unwrap_or_default()
}

#[test]
fn a_cut_off_leader_is_replaced_and_a_cut_off_majority_stops_everyone() -> TestResult {
    let _one = one_at_a_time();
    let ensemble = ZooKeeperEnsemble::start(3)?;
    let leader = ensemble.wait_for_leader(WAIT)?;
    settled(&ensemble, leader)?;
    for index in 0..ensemble.len() {
        assert!(!ensemble.is_cut_off(index));
        assert!(srvr_through_proxy(&ensemble, index).contains("Mode: "));
    }
    let proxied = ensemble.proxied_connect_string();
    assert_eq!(proxied.split(',').count(), 3, "{proxied}");
    assert_ne!(proxied, ensemble.connect_string());

    // The leader, cut off, hears from no quorum and steps down; the other
    // two elect one of themselves. The election port is proxied too,
    // call-backs included, or a leader with the highest id would be
    // voted for again and again without being reachable.
    ensemble.cut_off(leader);
    assert!(ensemble.is_cut_off(leader));
    let next = eventually("a new leader among the other two", || {
        ensemble.leader().filter(|&next| next != leader)
    })?;
    settled(&ensemble, next)?;
    eventually("the cut-off leader no longer serving", || {
        ensemble.member(leader).mode().is_none().then_some(())
    })?;
    assert!(
        ensemble.member(leader).is_ok(),
        "it runs on, out of reach of its peers"
    );
    assert_eq!(
        srvr_through_proxy(&ensemble, leader),
        "",
        "clients through the proxy are cut off too"
    );
    ensemble.heal(leader);
    assert!(!ensemble.is_cut_off(leader));
    settled(&ensemble, next)?;
    assert_eq!(
        ensemble.member(leader).mode(),
        Some(ZooKeeperMode::Follower),
        "{:?}",
        modes(&ensemble)
    );

    // Two of three cut off, from the third and from each other: no quorum
    // anywhere, so nobody serves; healed, they elect a leader again.
    let others: Vec<usize> = (0..ensemble.len()).filter(|&i| i != leader).collect();
    for &index in &others {
        ensemble.cut_off(index);
    }
    eventually("no member serving", || {
        modes(&ensemble).iter().all(Option::is_none).then_some(())
    })?;
    for &index in &others {
        ensemble.heal(index);
    }
    let last = ensemble.wait_for_leader(WAIT)?;
    settled(&ensemble, last)?;
    assert!(
        modes(&ensemble).iter().all(Option::is_some),
        "{:?}",
        modes(&ensemble)
    );
    Ok(())
}

/// The epoch (the high 32 bits of the zxid) member `index` reports.
fn epoch(ensemble: &ZooKeeperEnsemble, index: usize) -> Result<u64, Box<dyn Error>> {
    let srvr = ensemble.member(index).four_letter_word("srvr")?;
    let zxid = srvr
        .lines()
        .find_map(|line| line.strip_prefix("Zxid: 0x"))
        .ok_or_else(|| format!("no zxid in {srvr}"))?;
    Ok(u64::from_str_radix(zxid.trim(), 16)? >> 32)
}

#[test]
fn a_rebuilt_ensemble_starts_again_from_the_first_epoch() -> TestResult {
    let _one = one_at_a_time();
    let ensemble = ZooKeeperEnsemble::start(3)?;
    let leader = ensemble.wait_for_leader(WAIT)?;
    // An election raises the epoch; a restart keeps it, on the data.
    ensemble.member(leader).stop()?;
    let next = eventually("a new leader", || {
        ensemble.leader().filter(|&next| next != leader)
    })?;
    ensemble.member(leader).start()?;
    settled(&ensemble, next)?;
    let before = epoch(&ensemble, next)?;
    assert!(before >= 2, "epoch {before}");
    assert!(matches!(
        ensemble.member(next).wipe(),
        Err(TestkitError::Unsupported { .. })
    ));
    ensemble.restart()?;
    let kept = ensemble.wait_for_leader(WAIT)?;
    assert!(epoch(&ensemble, kept)? > before, "restarted on its data");

    ensemble.rebuild()?;
    let rebuilt = ensemble.wait_for_leader(WAIT)?;
    settled(&ensemble, rebuilt)?;
    assert_eq!(epoch(&ensemble, rebuilt)?, 1, "rebuilt empty");
    Ok(())
}
