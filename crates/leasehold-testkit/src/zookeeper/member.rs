//! One member of a [`ZooKeeperEnsemble`](super::ZooKeeperEnsemble): its
//! JVM, its configuration, its faults and the four-letter words
//! a test asks it.

use std::fmt::Write as _;
use std::fs;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::Error;
use crate::process::{self, ChildProcess, POLL_INTERVAL};

/// How long a four-letter word may take by default.
pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// How long starting an ensemble or a member may take.
pub(super) const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How long one readiness or status probe may take.
pub(super) const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// How many log lines error messages include.
const ERROR_LOG_LINES: usize = 30;

/// The JVM's main class: a quorum peer, or a standalone server when the
/// configuration lists no `server.N` lines.
const MAIN_CLASS: &str = "org.apache.zookeeper.server.quorum.QuorumPeerMain";

/// Flags that keep each JVM small and light on a shared machine: a 96 MB
/// heap at most, the serial collector (no GC threads), the C1 compiler
/// only with one compiler thread, small thread stacks, no `hsperfdata`
/// file, and an exit (which the log shows) rather than a limp on
/// `OutOfMemoryError`.
const JVM_FLAGS: &[&str] = &[
    "-Xmx96m",
    "-Xms16m",
    "-Xss512k",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:CICompilerCount=1",
    "-XX:-UsePerfData",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.net.preferIPv4Stack=true",
    "-Djava.awt.headless=true",
    "-Dzookeeper.jmx.log4j.disable=true",
];

/// What the member logs, and where: everything at `INFO` and above to
/// stderr, which goes to the member's log file with the JVM's own output.
const LOG4J_PROPERTIES: &str = "\
log4j.rootLogger=INFO, CONSOLE
log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender
log4j.appender.CONSOLE.Target=System.err
log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout
log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} %-5p [%t:%C{1}@%L] - %m%n
";

/// The role a ZooKeeper server reports for itself (`Mode:` in its answer
/// to `srvr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ZooKeeperMode {
    /// It leads the ensemble.
    Leader,
    /// It follows the leader and votes.
    Follower,
    /// It follows the leader without a vote.
    Observer,
    /// A one-server ensemble (no `server.N` lines): it serves alone.
    Standalone,
    /// It serves reads only, cut off from a quorum (with
    /// `readonlymode.enabled`, which this kit does not set).
    ReadOnly,
}

impl ZooKeeperMode {
    fn parse(mode: &str) -> Option<Self> {
        match mode.trim() {
            "leader" => Some(Self::Leader),
            "follower" => Some(Self::Follower),
            "observer" => Some(Self::Observer),
            "standalone" => Some(Self::Standalone),
            "read-only" => Some(Self::ReadOnly),
            _ => None,
        }
    }

    /// Whether it leads: [`Leader`](Self::Leader), or
    /// [`Standalone`](Self::Standalone), a one-server ensemble's only
    /// server.
    pub fn is_leading(self) -> bool {
        matches!(self, Self::Leader | Self::Standalone)
    }
}

/// What `srvr` says: the role and the last zxid.
#[derive(Debug, Clone, Copy)]
pub(super) struct Srvr {
    pub(super) mode: ZooKeeperMode,
    pub(super) zxid: u64,
}

impl Srvr {
    /// Parses an answer to `srvr`; `None` if the server does not serve
    /// ("This ZooKeeper instance is not currently serving requests").
    fn parse(answer: &str) -> Option<Self> {
        let field = |name: &str| {
            answer
                .lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
        };
        let mode = ZooKeeperMode::parse(field("Mode")?)?;
        let zxid = field("Zxid")
            .and_then(|zxid| u64::from_str_radix(zxid.trim().trim_start_matches("0x"), 16).ok())
            .unwrap_or(0);
        Some(Self { mode, zxid })
    }

    /// The epoch of the zxid (its high 32 bits): each new leader starts a
    /// higher one.
    pub(super) fn epoch(self) -> u64 {
        self.zxid >> 32
    }
}

/// The settings every member of an ensemble shares.
#[derive(Debug, Clone)]
pub(super) struct Shared {
    pub(super) java: PathBuf,
    pub(super) classpath: String,
    pub(super) tick_time: Duration,
    /// `name=value` lines written after the kit's own (a later one wins).
    pub(super) settings: Vec<String>,
}

/// One member of a [`ZooKeeperEnsemble`](super::ZooKeeperEnsemble): a
/// `QuorumPeerMain` JVM with its own configuration and data directory, a
/// client port, a quorum port and an election port.
///
/// Every method takes `&self`, so a test can hold several members at once.
/// The test's own four-letter words ([`mode`](Self::mode),
/// [`four_letter_word`](Self::four_letter_word)) go straight to the
/// member's [client port](Self::client_addr), as an operator on the host
/// would.
///
/// Dropping it kills the JVM and removes the directory; if the thread is
/// panicking, the member's log is printed to stderr first.
#[derive(Debug)]
pub struct ZooKeeperMember {
    index: usize,
    java: PathBuf,
    args: Vec<String>,
    client_addr: SocketAddr,
    quorum_addr: SocketAddr,
    election_addr: SocketAddr,
    /// `None` until spawned.
    process: Mutex<Option<ChildProcess>>,
    /// The last process id.
    pid: AtomicU32,
    paused: AtomicBool,
    /// Whether [`fill_disk`](Self::fill_disk) limited the running JVM.
    pub(super) disk_full: AtomicBool,
    log_path: PathBuf,
    /// Where the current run's output starts in the (appended-to) log.
    log_offset: AtomicU64,
    /// Declared last so it is removed after the process is gone.
    dir: TempDir,
}

impl ZooKeeperMember {
    /// Makes member `index`'s directory; the configuration is written by
    /// [`configure`](Self::configure) once every member's ports are known.
    pub(super) fn prepare(
        index: usize,
        (client_port, quorum_port, election_port): (u16, u16, u16),
    ) -> Result<Self, Error> {
        let dir = tempfile::Builder::new()
            .prefix("leasehold-zookeeper-")
            .tempdir()
            .map_err(process::io_err(&std::env::temp_dir()))?;
        let addr = |port| SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let (client_addr, quorum_addr, election_addr) =
            (addr(client_port), addr(quorum_port), addr(election_port));
        Ok(Self {
            index,
            java: PathBuf::new(),
            args: Vec::new(),
            client_addr,
            quorum_addr,
            election_addr,
            process: Mutex::new(None),
            pid: AtomicU32::new(0),
            paused: AtomicBool::new(false),
            disk_full: AtomicBool::new(false),
            log_path: dir.path().join("zookeeper.log"),
            log_offset: AtomicU64::new(0),
            dir,
        })
    }

    /// This member's `server.N` line, by name (`zk-N`, which each member
    /// resolves in its own hosts file: see the `network` module). An
    /// ensemble of one has none.
    pub(super) fn server_line(&self) -> String {
        format!(
            "server.{}={}:{}:{}\n",
            self.myid(),
            super::network::host_name(self.index),
            self.quorum_addr.port(),
            self.election_addr.port()
        )
    }

    /// Writes the member's `zoo.cfg` (with `servers`, its `server.N`
    /// lines), `myid`, `hosts` (the names it resolves) and
    /// `log4j.properties`, and builds its command line.
    pub(super) fn configure(
        &mut self,
        shared: &Shared,
        servers: &str,
        hosts: &str,
    ) -> Result<(), Error> {
        let dir = self.dir.path().to_owned();
        let write = |name: &str, text: &str| {
            let path = dir.join(name);
            fs::write(&path, text).map_err(process::io_err(&path))?;
            Ok::<_, Error>(path)
        };
        let data = dir.join("data");
        fs::create_dir(&data).map_err(process::io_err(&data))?;
        write("data/myid", &format!("{}\n", self.myid()))?;
        let tick = shared.tick_time.as_millis();
        let mut config = format!(
            "tickTime={tick}\n\
             initLimit={init}\n\
             syncLimit={sync}\n\
             dataDir={data}\n\
             clientPort={port}\n\
             clientPortAddress=127.0.0.1\n\
             admin.enableServer=false\n\
             4lw.commands.whitelist=srvr,ruok,mntr,stat\n\
             forceSync=no\n\
             preAllocSize=1024\n\
             maxClientCnxns=0\n",
            init = limit_ticks(super::INIT_LIMIT, tick, 5),
            sync = limit_ticks(super::ZOOKEEPER_SYNC_LIMIT, tick, 2),
            data = data.display(),
            port = self.client_addr.port(),
        );
        for setting in &shared.settings {
            config.push_str(setting);
            config.push('\n');
        }
        config.push_str(servers);
        let config = write("zoo.cfg", &config)?;
        let log4j = write("log4j.properties", LOG4J_PROPERTIES)?;
        let hosts = write("hosts", hosts)?;
        self.java.clone_from(&shared.java);
        self.args = JVM_FLAGS.iter().map(|&flag| flag.to_owned()).collect();
        self.args.extend([
            format!("-Djdk.net.hosts.file={}", hosts.display()),
            format!("-Dlog4j.configuration=file:{}", log4j.display()),
            "-cp".to_owned(),
            shared.classpath.clone(),
            MAIN_CLASS.to_owned(),
            config.display().to_string(),
        ]);
        Ok(())
    }

    /// The member's index in its ensemble.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The member's server id (its `myid` file, `server.N`): its index
    /// plus one.
    pub fn myid(&self) -> usize {
        self.index + 1
    }

    /// The member's client address (`clientPort`), `127.0.0.1:PORT`.
    pub fn client_addr(&self) -> SocketAddr {
        self.client_addr
    }

    /// The member's quorum address (followers dial the leader's),
    /// `127.0.0.1:PORT`.
    pub(super) fn quorum_addr(&self) -> SocketAddr {
        self.quorum_addr
    }

    /// The member's leader-election address, `127.0.0.1:PORT`.
    pub(super) fn election_addr(&self) -> SocketAddr {
        self.election_addr
    }

    fn process(&self) -> MutexGuard<'_, Option<ChildProcess>> {
        self.process.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The JVM's process id (of the last one, once stopped).
    pub fn pid(&self) -> u32 {
        self.pid.load(Ordering::SeqCst)
    }

    /// Whether the JVM runs (it may be paused); `false` after
    /// [`stop`](Self::stop).
    pub fn is_running(&self) -> bool {
        self.process().as_ref().is_some_and(ChildProcess::is_alive)
    }

    /// The running process's id, or [`Error::NotRunning`].
    pub(super) fn running_pid(&self) -> Result<u32, Error> {
        match self.process().as_ref() {
            Some(process) if process.is_alive() => Ok(process.pid()),
            _ => Err(Error::NotRunning {
                server: self.label(),
            }),
        }
    }

    /// The member's log (ZooKeeper's and the JVM's output), all runs
    /// (empty if it cannot be read).
    pub fn log(&self) -> String {
        process::read_log(&self.log_path)
    }

    /// The temporary directory of the member's configuration (`zoo.cfg`),
    /// data (`data/`) and log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `zookeeper 1 (127.0.0.1:PORT)`, for messages.
    pub(super) fn label(&self) -> String {
        format!("zookeeper {} ({})", self.myid(), self.client_addr)
    }

    /// Spawns the JVM (unless it runs) without waiting.
    pub(super) fn spawn(&self) -> Result<(), Error> {
        let mut process = self.process();
        if process.as_ref().is_some_and(ChildProcess::is_alive) {
            return Ok(());
        }
        self.log_offset
            .store(process::file_len(&self.log_path), Ordering::SeqCst);
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .map_err(process::io_err(&self.log_path))?;
        let log_err = log.try_clone().map_err(process::io_err(&self.log_path))?;
        // The output goes through pipes, copied to the log by this
        // process: a JVM whose file sizes are limited (`fill_disk`) can
        // still log.
        let mut child = Command::new(&self.java)
            .args(&self.args)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| Error::Spawn {
                program: self.java.clone(),
                source,
            })?;
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        // Killed on drop if a copier cannot start (the JVM would block
        // once a pipe filled).
        let child = ChildProcess::new(child);
        let copied = |source| Error::Spawn {
            program: self.java.clone(),
            source,
        };
        if let Some(stdout) = stdout {
            copy_to(stdout, log).map_err(copied)?;
        }
        if let Some(stderr) = stderr {
            copy_to(stderr, log_err).map_err(copied)?;
        }
        self.pid.store(child.pid(), Ordering::SeqCst);
        *process = Some(child);
        self.paused.store(false, Ordering::SeqCst);
        self.disk_full.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// The log of the current run only.
    fn run_log(&self) -> String {
        process::read_log_from(&self.log_path, self.log_offset.load(Ordering::SeqCst))
    }

    /// Polls until `ready` holds, for up to `timeout`; fails at once if the
    /// JVM exits (see [`lost_port`](Self::lost_port)).
    pub(super) fn wait_until(
        &self,
        timeout: Duration,
        what: &str,
        ready: impl Fn(&Self) -> bool,
    ) -> Result<(), Error> {
        let deadline = Instant::now() + timeout;
        loop {
            let exited = match self.process().as_mut() {
                Some(process) => process.try_wait()?,
                None => None,
            };
            if let Some(status) = exited {
                return Err(Error::ExitedEarly {
                    server: self.label(),
                    status,
                    log_tail: process::tail(&self.run_log(), ERROR_LOG_LINES).to_owned(),
                });
            }
            if ready(self) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Error::NotReady {
                    server: format!("{} ({what})", self.label()),
                    timeout,
                    log_tail: process::tail(&self.run_log(), ERROR_LOG_LINES).to_owned(),
                });
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    /// Whether the current run failed to bind one of its ports.
    pub(super) fn lost_port(&self) -> bool {
        self.run_log().contains("Address already in use")
    }

    /// Kills the JVM with `SIGKILL` (a crash) and reaps it. Its data
    /// directory stays for [`start`](Self::start). Does nothing if it is
    /// not running.
    ///
    /// # Errors
    ///
    /// A signal or wait error.
    pub fn stop(&self) -> Result<(), Error> {
        if let Some(process) = self.process().as_mut() {
            process.kill()?;
        }
        self.paused.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Removes a stopped member's data, its transaction logs and
    /// snapshots (`data/version-2`), as a server rebuilt on an empty disk:
    /// started again, it knows no session, node or zxid, and its id
    /// (`myid`) stays. [`ZooKeeperEnsemble::rebuild`](super::ZooKeeperEnsemble::rebuild)
    /// does it to every member.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] if it runs, [`Error::Io`] if the directory
    /// cannot be removed.
    pub fn wipe(&self) -> Result<(), Error> {
        if self.is_running() {
            return Err(Error::Unsupported {
                what: "wiping the data of a zookeeper member that runs (stop it first)",
            });
        }
        let data = self.dir.path().join("data/version-2");
        match fs::remove_dir_all(&data) {
            Ok(()) => Ok(()),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(err) => Err(process::io_err(&data)(err)),
        }
    }

    /// Starts a stopped member again, with its data directory and its
    /// ports, and waits (up to 30 s) until it serves: a member of an
    /// ensemble serves only once it has joined a leader, so this needs a
    /// quorum (a member started while a majority is down does not serve).
    /// Does nothing but the wait if it is running.
    ///
    /// # Errors
    ///
    /// As for spawning; [`Error::ExitedEarly`] if it exits,
    /// [`Error::NotReady`] (with the log's tail) if it does not serve in
    /// time (it is left running).
    pub fn start(&self) -> Result<(), Error> {
        self.spawn()?;
        self.wait_until(START_TIMEOUT, "serving", Self::is_serving)
    }

    /// [`stop`](Self::stop), then [`start`](Self::start).
    ///
    /// # Errors
    ///
    /// As for those two.
    pub fn restart(&self) -> Result<(), Error> {
        self.stop()?;
        self.start()
    }

    /// Freezes the JVM with `SIGSTOP` and returns once the kernel reports
    /// it stopped: it sends no ping and answers nothing until
    /// [`resume`](Self::resume), while its connections stay open. A paused
    /// leader is dropped by its followers after `syncLimit` (about 2 s);
    /// the sessions it tracked expire on the next leader's clock.
    ///
    /// # Errors
    ///
    /// [`Error::NotRunning`] if it is stopped, or a signal error.
    pub fn pause(&self) -> Result<(), Error> {
        process::stop(self.running_pid()?)?;
        self.paused.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Continues a [paused](Self::pause) member with `SIGCONT`.
    ///
    /// # Errors
    ///
    /// As for [`pause`](Self::pause).
    pub fn resume(&self) -> Result<(), Error> {
        process::cont(self.running_pid()?)?;
        self.paused.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Whether the member is paused by [`pause`](Self::pause).
    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    /// Sends the four-letter word `word` (`srvr`, `ruok`, `mntr` or
    /// `stat`, the ones the members allow) to the member's own client
    /// port and returns the answer. A word outside that list is answered
    /// with a refusal, as text.
    ///
    /// # Errors
    ///
    /// [`Error::ZooKeeperRequest`] if the member does not answer within
    /// 5 s (it is stopped or paused).
    pub fn four_letter_word(&self, word: &str) -> Result<String, Error> {
        self.word_within(word, REQUEST_TIMEOUT)
    }

    fn word_within(&self, word: &str, timeout: Duration) -> Result<String, Error> {
        let failed = |source| Error::ZooKeeperRequest {
            addr: self.client_addr,
            word: word.to_owned(),
            source,
        };
        let deadline = Instant::now() + timeout;
        let mut stream = TcpStream::connect_timeout(&self.client_addr, timeout).map_err(failed)?;
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        stream.set_read_timeout(Some(left)).map_err(failed)?;
        stream.set_write_timeout(Some(left)).map_err(failed)?;
        stream.write_all(word.as_bytes()).map_err(failed)?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).map_err(failed)?;
        Ok(answer)
    }

    /// What `srvr` says within `timeout`; `None` if the member does not
    /// answer or does not serve.
    pub(super) fn srvr_within(&self, timeout: Duration) -> Option<Srvr> {
        Srvr::parse(&self.word_within("srvr", timeout).ok()?)
    }

    /// The role the member reports (`srvr`, 500 ms at most); `None` if it
    /// does not answer (it is stopped or paused) or does not serve (an
    /// election is on, or it has lost its quorum).
    pub fn mode(&self) -> Option<ZooKeeperMode> {
        self.srvr_within(PROBE_TIMEOUT).map(|srvr| srvr.mode)
    }

    /// Whether the member serves clients: it answers `srvr` with a role
    /// within 500 ms.
    pub fn is_serving(&self) -> bool {
        self.mode().is_some()
    }

    /// Whether the JVM answers `ruok` with `imok` within 500 ms: it runs,
    /// whether or not it serves.
    pub fn is_ok(&self) -> bool {
        self.word_within("ruok", PROBE_TIMEOUT)
            .is_ok_and(|answer| answer == "imok")
    }
}

/// Copies `from` to `to` on a thread of its own until `from` ends (the
/// JVM exits).
fn copy_to(mut from: impl Read + Send + 'static, mut to: fs::File) -> std::io::Result<()> {
    thread::Builder::new()
        .name("zookeeper-log".to_owned())
        .spawn(move || std::io::copy(&mut from, &mut to))
        .map(drop)
}

/// How many ticks of `tick_ms` cover `limit`, at least `floor`.
fn limit_ticks(limit: Duration, tick_ms: u128, floor: u128) -> u128 {
    limit.as_millis().div_ceil(tick_ms.max(1)).max(floor)
}

/// The classpath `java` is given: Debian's `zookeeper.jar` (whose
/// manifest names its dependencies) and log4j 1.2 behind slf4j, for the
/// log.
pub(super) fn debian_classpath(jars: &Path) -> Result<String, Error> {
    let mut classpath = String::new();
    for (jar, package) in [
        ("zookeeper.jar", "zookeeper"),
        ("slf4j-log4j12.jar", "libslf4j-java"),
        ("log4j-1.2.jar", "liblog4j1.2-java"),
    ] {
        let path = jars.join(jar);
        if !path.is_file() {
            return Err(Error::LibraryNotFound {
                name: path.display().to_string(),
                install_hint: format!(
                    "scripts/install-deps.sh (or: sudo apt-get install -y {package})"
                ),
            });
        }
        if !classpath.is_empty() {
            classpath.push(':');
        }
        let _ = write!(classpath, "{}", path.display());
    }
    Ok(classpath)
}

impl Drop for ZooKeeperMember {
    fn drop(&mut self) {
        if thread::panicking() {
            process::dump_log(&self.label(), &self.log());
        }
        let _ = self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn srvr_answers_are_parsed() {
        let answer = "Zookeeper version: 3.8.0-${mvngit.commit.id}, built on 2024-12-29 17:54 UTC\n\
                      Latency min/avg/max: 0/0.0/0\nReceived: 2\nSent: 1\nConnections: 1\n\
                      Outstanding: 0\nZxid: 0x200000003\nMode: leader\nNode count: 5\n";
        let srvr = Srvr::parse(answer).expect("a serving answer");
        assert_eq!(srvr.mode, ZooKeeperMode::Leader);
        assert_eq!(srvr.zxid, 0x2_0000_0003);
        assert_eq!(srvr.epoch(), 2);
        assert!(
            Srvr::parse("This ZooKeeper instance is not currently serving requests\n").is_none()
        );
        assert_eq!(
            Srvr::parse("Zxid: 0x0\nMode: standalone\n").map(|srvr| srvr.mode),
            Some(ZooKeeperMode::Standalone)
        );
        assert!(Srvr::parse("Mode: something-else\n").is_none());
    }

    #[test]
    fn limits_cover_their_time_in_ticks() {
        assert_eq!(limit_ticks(Duration::from_secs(2), 200, 2), 10);
        assert_eq!(limit_ticks(Duration::from_secs(2), 300, 2), 7);
        assert_eq!(limit_ticks(Duration::from_secs(2), 2000, 2), 2);
        assert_eq!(limit_ticks(Duration::from_secs(10), 2000, 5), 5);
    }
}
