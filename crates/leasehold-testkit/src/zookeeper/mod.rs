//! Throwaway ZooKeeper ensembles: [`ZooKeeperEnsemble`] starts real
//! ZooKeeper servers (JVMs) on free loopback ports and injects the faults
//! a lock on ZooKeeper must ride out: a member (or the leader) stopped,
//! restarted, paused or cut off.
//!
//! # Why a real ensemble, and why these settings
//!
//! What a ZooKeeper lock promises rests on Zab: a write commits on a
//! majority, a leader that hears from no majority steps down, and an
//! ephemeral node lives as long as its session, which the leader expires
//! when the client stops pinging. None of that shows on one server, so
//! the ensemble has three (one is allowed, for tests that need no faults).
//! Each member keeps its data in a temporary directory that outlives a
//! [stop](ZooKeeperMember::stop), so a [restart](ZooKeeperMember::restart)
//! comes back with its data, as a crashed machine would.
//!
//! Time in ZooKeeper is counted in ticks. The server grants a session
//! timeout between 2 and 20 ticks whatever the client asks
//! ([`min_session_timeout`](ZooKeeperEnsemble::min_session_timeout),
//! [`max_session_timeout`](ZooKeeperEnsemble::max_session_timeout)), so
//! the tick decides which TTLs a test can use: [`ZOOKEEPER_TICK_TIME`]
//! (200 ms, sessions of 0.4 to 4 s; ZooKeeper's default is 2 s) unless
//! [`ZooKeeperEnsemble::start_with`] chooses another. How long a follower
//! may lag (`syncLimit`, [`ZOOKEEPER_SYNC_LIMIT`]: 2 s) and take to join
//! (`initLimit`, 10 s) are fixed in time and converted to ticks, so a
//! paused leader is dropped about 2 s after it froze whatever the tick.
//! Transaction logs are not synced (`forceSync=no`, unless
//! [`ZooKeeperEnsemble::start_with_settings`] says `forceSync=yes`) and
//! preallocated 1 MB at a time (not 64 MB).
//!
//! # Cut-off
//!
//! [`ZooKeeperEnsemble::cut_off`] cuts a member off from its peers and
//! from clients that come through the kit's proxies
//! ([`proxied_connect_string`](ZooKeeperEnsemble::proxied_connect_string)),
//! and [`heal`](ZooKeeperEnsemble::heal) lets it back, without
//! privileges: every path between two members goes through a
//! [`FaultProxy`](crate::FaultProxy) of that pair. That takes a trick,
//! because a ZooKeeper server with a higher id hangs up on a lower one
//! that dials its election port and calls it back at the address the
//! lower one announced in its first message: the configuration names the
//! servers (`zk-1`, `zk-2`, ...) and each JVM resolves the names in a
//! hosts file of its own, its own name to where it listens and the
//! others' to one loopback address per pair of members where the pair's
//! proxies listen (the module `network` has the details).
//!
//! # The JVMs
//!
//! Each member is `java` running
//! `org.apache.zookeeper.server.quorum.QuorumPeerMain` on Debian's
//! `/usr/share/java/zookeeper.jar` (the `zookeeper` package, 3.8.0 on
//! bookworm, which `scripts/install-deps.sh` installs; the jar's manifest
//! names its dependencies) with log4j 1.2 for its log, or on the classpath
//! [`ZOOKEEPER_CLASSPATH_ENV`] names. `java` is `$JAVA_HOME/bin/java` if
//! there is one, else the one on `PATH`. The heap is capped at 96 MB, the
//! collector is the serial one and only the C1 compiler runs, so that
//! three members fit on a small shared machine (about 60 MB of resident
//! memory each once started); the admin server (Jetty) is off, and the
//! four-letter words `srvr`, `ruok`, `mntr` and `stat` are allowed.

mod disk;
mod member;
mod network;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use member::{PROBE_TIMEOUT, START_TIMEOUT, Shared};
pub use member::{ZooKeeperMember, ZooKeeperMode};
use network::Network;

use crate::Error;
use crate::process::{self, POLL_INTERVAL, PORT_ATTEMPTS};

/// The environment variable naming a Java classpath to start ZooKeeper
/// from instead of Debian's jars, e.g. `/opt/zookeeper/lib/*` for an
/// Apache release.
pub const ZOOKEEPER_CLASSPATH_ENV: &str = "LEASEHOLD_ZOOKEEPER_CLASSPATH";

/// The tick of an ensemble started with [`ZooKeeperEnsemble::start`]:
/// sessions last 0.4 to 4 s.
pub const ZOOKEEPER_TICK_TIME: Duration = Duration::from_millis(200);

/// How long a follower may go without hearing from its leader (and the
/// leader from a quorum) before it gives up on it: `syncLimit`, in ticks
/// that cover this time (at least 2).
pub const ZOOKEEPER_SYNC_LIMIT: Duration = Duration::from_secs(2);

/// How long a follower may take to connect to a new leader and catch up:
/// `initLimit`, in ticks that cover this time (at least 5).
const INIT_LIMIT: Duration = Duration::from_secs(10);

/// Where Debian installs Java libraries.
const DEBIAN_JARS: &str = "/usr/share/java";

/// The `java` to start: `$JAVA_HOME/bin/java` if it is there, else `java`
/// from `PATH`.
fn java_binary() -> Result<PathBuf, Error> {
    if let Some(home) = std::env::var_os("JAVA_HOME").filter(|home| !home.is_empty()) {
        let java = Path::new(&home).join("bin/java");
        if process::is_executable(&java) {
            return Ok(java);
        }
    }
    process::find_binary("java", "default-jre-headless", &[])
}

/// The classpath: [`ZOOKEEPER_CLASSPATH_ENV`]'s if set, else Debian's.
fn classpath() -> Result<String, Error> {
    match std::env::var(ZOOKEEPER_CLASSPATH_ENV) {
        Ok(classpath) if !classpath.is_empty() => Ok(classpath),
        _ => member::debian_classpath(Path::new(DEBIAN_JARS)),
    }
}

/// An ensemble of ZooKeeper servers on free loopback ports, each a JVM
/// with a temporary data directory that outlives a
/// [stop](ZooKeeperMember::stop).
///
/// Time is counted in ticks ([`tick_time`](Self::tick_time),
/// [`ZOOKEEPER_TICK_TIME`] unless [`start_with`](Self::start_with) chose
/// another), and the servers grant sessions of 2 to 20 ticks
/// ([`min_session_timeout`](Self::min_session_timeout),
/// [`max_session_timeout`](Self::max_session_timeout)) whatever a client
/// asks for.
///
/// ```no_run
/// use leasehold_testkit::ZooKeeperEnsemble;
/// use std::time::Duration;
///
/// let ensemble = ZooKeeperEnsemble::start(3)?;
/// let hosts = ensemble.connect_string(); // for the ZooKeeper client under test
/// let leader = ensemble.wait_for_leader(Duration::from_secs(10))?;
/// ensemble.member(leader).stop()?;
/// let next = ensemble.wait_for_leader(Duration::from_secs(10))?;
/// assert_ne!(next, leader);
/// ensemble.member(leader).start()?; // back as a follower, with its data
/// # Ok::<(), leasehold_testkit::Error>(())
/// ```
///
/// Dropping it kills every member and removes their directories; if the
/// thread is panicking, every member's log is printed to stderr first.
#[derive(Debug)]
pub struct ZooKeeperEnsemble {
    members: Vec<ZooKeeperMember>,
    network: Network,
    tick_time: Duration,
}

impl ZooKeeperEnsemble {
    /// Starts an ensemble of `members` servers (3 for fault tests; 1 is a
    /// standalone server) with a tick of [`ZOOKEEPER_TICK_TIME`], and
    /// waits until every member serves and one leads.
    ///
    /// A port taken by another process in the meantime makes it start
    /// again on new ports, up to five times in all.
    ///
    /// # Errors
    ///
    /// As for [`start_with`](Self::start_with).
    pub fn start(members: usize) -> Result<Self, Error> {
        Self::start_with(members, ZOOKEEPER_TICK_TIME)
    }

    /// [`start`](Self::start) with a tick of `tick_time` (`tickTime`):
    /// the servers grant sessions of 2 to 20 ticks, so a test that needs
    /// 30 s sessions chooses a tick of 1.5 s or more.
    ///
    /// # Errors
    ///
    /// [`Error::ZooKeeperEnsembleSize`] for 0 members,
    /// [`Error::ZooKeeperTickTime`] for a tick that is not a whole number
    /// of milliseconds (at least 1), [`Error::BinaryNotFound`] if there is
    /// no `java`, [`Error::LibraryNotFound`] if Debian's jars are missing,
    /// [`Error::ExitedEarly`] or [`Error::NotReady`] (with the member's log
    /// tail) if a member does not serve within 30 s,
    /// [`Error::ZooKeeperNoLeader`], [`Error::PortsExhausted`].
    pub fn start_with(members: usize, tick_time: Duration) -> Result<Self, Error> {
        Self::start_with_settings(members, tick_time, &[])
    }

    /// [`start_with`](Self::start_with), with `settings` (`name=value`)
    /// written into every member's `zoo.cfg` after the test kit's own, so a
    /// later one wins: a bench that measures commits undoes the test kit's
    /// `forceSync=no` with `forceSync=yes` (ZooKeeper's default: every
    /// transaction log write is fsynced before it is acknowledged). They
    /// stay in the file, so a restarted member keeps them.
    ///
    /// # Errors
    ///
    /// As for [`start_with`](Self::start_with); a setting the servers
    /// refuse ends their start ([`Error::ExitedEarly`] or
    /// [`Error::NotReady`], the server's message in its log).
    pub fn start_with_settings(
        members: usize,
        tick_time: Duration,
        settings: &[&str],
    ) -> Result<Self, Error> {
        if members == 0 {
            return Err(Error::ZooKeeperEnsembleSize { members });
        }
        if tick_time < Duration::from_millis(1)
            || !tick_time.subsec_nanos().is_multiple_of(1_000_000)
        {
            return Err(Error::ZooKeeperTickTime { tick_time });
        }
        let shared = Shared {
            java: java_binary()?,
            classpath: classpath()?,
            tick_time,
            settings: settings.iter().map(|&setting| setting.to_owned()).collect(),
        };
        for _ in 0..PORT_ATTEMPTS {
            let ensemble = Self::spawn(members, &shared)?;
            match ensemble.wait_healthy(START_TIMEOUT) {
                Ok(()) => {}
                Err(_) if ensemble.members.iter().any(ZooKeeperMember::lost_port) => continue,
                Err(err) => return Err(err),
            }
            ensemble.wait_for_leader(START_TIMEOUT)?;
            return Ok(ensemble);
        }
        Err(Error::PortsExhausted {
            program: "zookeeper".to_owned(),
            attempts: PORT_ATTEMPTS,
        })
    }

    /// Prepares the members, writes their configurations and spawns them.
    fn spawn(members: usize, shared: &Shared) -> Result<Self, Error> {
        let mut taken = HashSet::new();
        let mut free_port = || loop {
            let port = process::free_port()?;
            if taken.insert(port) {
                return Ok::<u16, Error>(port);
            }
        };
        let mut prepared = (0..members)
            .map(|index| {
                let ports = (free_port()?, free_port()?, free_port()?);
                ZooKeeperMember::prepare(index, ports)
            })
            .collect::<Result<Vec<_>, _>>()?;
        // An ensemble of one lists no servers, which makes it standalone.
        let servers = match members {
            1 => String::new(),
            _ => prepared.iter().map(ZooKeeperMember::server_line).collect(),
        };
        let network = Network::start(&prepared)?;
        for member in &mut prepared {
            let hosts = network.hosts_file(member.index(), members)?;
            member.configure(shared, &servers, &hosts)?;
        }
        let ensemble = Self {
            members: prepared,
            network,
            tick_time: shared.tick_time,
        };
        for member in &ensemble.members {
            member.spawn()?;
        }
        Ok(ensemble)
    }

    /// The tick (`tickTime`) every member counts time in.
    pub fn tick_time(&self) -> Duration {
        self.tick_time
    }

    /// The shortest session timeout the servers grant: 2 ticks. A client
    /// asking for less gets this.
    pub fn min_session_timeout(&self) -> Duration {
        self.tick_time * 2
    }

    /// The longest session timeout the servers grant: 20 ticks. A client
    /// asking for more gets this.
    pub fn max_session_timeout(&self) -> Duration {
        self.tick_time * 20
    }

    /// How many members the ensemble has.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Always `false`: an ensemble has at least one member.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Member `index` (from 0; its server id is `index + 1`).
    ///
    /// # Panics
    ///
    /// If there is no member `index`.
    pub fn member(&self, index: usize) -> &ZooKeeperMember {
        &self.members[index]
    }

    /// Every member, in index order.
    pub fn members(&self) -> &[ZooKeeperMember] {
        &self.members
    }

    /// The connect string to give a ZooKeeper client,
    /// `127.0.0.1:P1,127.0.0.1:P2,...`: every member's
    /// [client address](ZooKeeperMember::client_addr), in index order.
    pub fn connect_string(&self) -> String {
        self.members
            .iter()
            .map(|member| member.client_addr().to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The connect string through the kit's proxies,
    /// `127.0.0.1:P1,127.0.0.1:P2,...`: each member's
    /// [proxied client address](Self::proxied_client_addr), in index
    /// order. A client given it loses a member [cut off](Self::cut_off)
    /// as a client on the other side of a partition would.
    pub fn proxied_connect_string(&self) -> String {
        (0..self.members.len())
            .map(|index| self.proxied_client_addr(index).to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The address of the proxy in front of member `index`'s client
    /// port: it forwards to [`client_addr`](ZooKeeperMember::client_addr)
    /// unless the member is [cut off](Self::cut_off).
    ///
    /// # Panics
    ///
    /// If there is no member `index`.
    pub fn proxied_client_addr(&self, index: usize) -> SocketAddr {
        self.network.client_proxy(index).addr()
    }

    /// Cuts member `index` off from every other member (both ways, on the
    /// quorum and election ports) and from clients that come through
    /// [`proxied_connect_string`](Self::proxied_connect_string): every
    /// open connection is closed and every new one closed as soon as it
    /// is accepted, until [`heal`](Self::heal). The member itself runs
    /// on; its four-letter words still answer (they go to its own port).
    ///
    /// A leader cut off loses its followers and stops serving after
    /// `syncLimit` ([`ZOOKEEPER_SYNC_LIMIT`]) at most, when it no longer
    /// hears from a quorum; the others elect a new leader if they are a
    /// majority. A follower cut off loses its leader and stops serving
    /// at once. Two members cut off cannot reach each other either, so
    /// cutting off two of three leaves no quorum anywhere. The module
    /// `network`'s docs say how every path between members goes through
    /// a proxy without privileges (names each JVM resolves in a hosts
    /// file of its own, one loopback address per pair of members).
    ///
    /// # Panics
    ///
    /// If there is no member `index`.
    pub fn cut_off(&self, index: usize) {
        assert!(index < self.members.len(), "no zookeeper member {index}");
        self.network.set_cut_off(index, true);
    }

    /// Heals member `index` after [`cut_off`](Self::cut_off): its paths
    /// open again, except those to members still cut off. It serves again
    /// once it has rejoined a leader (an election, or catching up).
    ///
    /// # Panics
    ///
    /// If there is no member `index`.
    pub fn heal(&self, index: usize) {
        assert!(index < self.members.len(), "no zookeeper member {index}");
        self.network.set_cut_off(index, false);
    }

    /// Whether member `index` is [cut off](Self::cut_off).
    ///
    /// # Panics
    ///
    /// If there is no member `index`.
    pub fn is_cut_off(&self, index: usize) -> bool {
        assert!(index < self.members.len(), "no zookeeper member {index}");
        self.network.is_cut_off(index)
    }

    /// The index of the member that leads now, as the running, unpaused
    /// members report it (each asked `srvr`, 500 ms at most): of those
    /// that say they lead (or serve standalone), the one with the highest
    /// epoch. `None` if none does (an election is on, or no majority is
    /// up).
    ///
    /// A leader that lost its quorum still says it leads until it steps down
    /// (`syncLimit`, [`ZOOKEEPER_SYNC_LIMIT`]); a newer leader's epoch is
    /// higher, so it is the one named once elected.
    pub fn leader(&self) -> Option<usize> {
        self.members
            .iter()
            .filter(|member| member.is_running() && !member.is_paused())
            .filter_map(|member| Some((member.srvr_within(PROBE_TIMEOUT)?, member.index())))
            .filter(|(srvr, _)| srvr.mode.is_leading())
            .max_by_key(|(srvr, index)| (srvr.epoch(), std::cmp::Reverse(*index)))
            .map(|(_, index)| index)
    }

    /// Polls [`leader`](Self::leader) until there is one.
    ///
    /// # Errors
    ///
    /// [`Error::ZooKeeperNoLeader`] after `timeout`.
    pub fn wait_for_leader(&self, timeout: Duration) -> Result<usize, Error> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(leader) = self.leader() {
                return Ok(leader);
            }
            if Instant::now() >= deadline {
                return Err(Error::ZooKeeperNoLeader { timeout });
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    /// Waits until every running, unpaused member serves (it answers
    /// `srvr` with a role: it has joined a leader, or leads).
    ///
    /// # Errors
    ///
    /// [`Error::NotReady`] (with the member's log tail) after `timeout`,
    /// [`Error::ExitedEarly`] if a member's JVM exits meanwhile.
    pub fn wait_healthy(&self, timeout: Duration) -> Result<(), Error> {
        let deadline = Instant::now() + timeout;
        for member in self
            .members
            .iter()
            .filter(|member| member.is_running() && !member.is_paused())
        {
            let left = deadline.saturating_duration_since(Instant::now());
            member.wait_until(left, "serving", ZooKeeperMember::is_serving)?;
        }
        Ok(())
    }

    /// Restarts the whole ensemble: kills every member, starts them all
    /// again on their data and ports, and waits until every one serves and
    /// one leads (30 s at most).
    ///
    /// # Errors
    ///
    /// As for [`start`](Self::start).
    pub fn restart(&self) -> Result<(), Error> {
        self.start_again(false)
    }

    /// Rebuilds the ensemble empty, as an operator who lost every
    /// server's disk (or restores none) would: kills every member,
    /// [wipes](ZooKeeperMember::wipe) its data (its id stays), starts them
    /// all again on their ports, and waits until every one serves and one
    /// leads (30 s at most). The new ensemble's zxids start again from
    /// epoch 1, below the old ones: what `ZkLockerBuilder::generation` is
    /// for. Clients that saw the old ensemble are refused by the new one
    /// ("has seen zxid ... our last zxid is ...") until they open a
    /// session afresh.
    ///
    /// # Errors
    ///
    /// As for [`start`](Self::start), and [`Error::Io`] if a data
    /// directory cannot be emptied.
    pub fn rebuild(&self) -> Result<(), Error> {
        self.start_again(true)
    }

    /// Kills every member, wipes their data if `wipe`, and starts them
    /// all again.
    fn start_again(&self, wipe: bool) -> Result<(), Error> {
        for member in &self.members {
            member.stop()?;
        }
        for member in self.members.iter().filter(|_| wipe) {
            member.wipe()?;
        }
        for member in &self.members {
            member.spawn()?;
        }
        self.wait_healthy(START_TIMEOUT)?;
        self.wait_for_leader(START_TIMEOUT).map(drop)
    }
}

impl Drop for ZooKeeperEnsemble {
    fn drop(&mut self) {
        for member in &self.members {
            // Nothing sensible can be done about a failure here.
            let _ = member.stop();
        }
    }
}
