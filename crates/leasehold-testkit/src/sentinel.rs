//! A throwaway Redis Sentinel setup: a primary, a replica and three
//! sentinels (quorum 2) on free loopback ports, with the faults a Sentinel
//! deployment meets: a coordinated failover and a killed primary.

use std::fs;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::Error;
use crate::process::{self, ChildProcess, HOST, POLL_INTERVAL};
use crate::redis::{RedisOptions, RedisServer};
use crate::resp::{self, Reply};

/// How long a sentinel waits without an answer before it deems a node
/// down (`down-after-milliseconds`): short, so a killed primary is failed
/// over within a couple of seconds.
pub const SENTINEL_DOWN_AFTER: Duration = Duration::from_millis(1000);

/// `failover-timeout`: how long a failover may take before another is
/// tried (Sentinel also waits twice this before it fails over the same
/// master again).
pub const SENTINEL_FAILOVER_TIMEOUT: Duration = Duration::from_millis(3000);

/// How long [`RedisSentinel::start`] waits for the sentinels to find the
/// replica and each other.
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(20);

/// How long one command to a sentinel or server may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

/// A primary, its replica and three sentinels monitoring them under one
/// master name, with quorum 2, [`SENTINEL_DOWN_AFTER`] and [`SENTINEL_FAILOVER_TIMEOUT`].
///
/// Sentinels run as `redis-server <conf> --sentinel` (Redis 7.0 has no
/// separate `redis-sentinel` binary on every system). Dropping it kills
/// every process and removes their directories.
///
/// ```no_run
/// use leasehold_testkit::RedisSentinel;
///
/// let mut setup = RedisSentinel::start("mymaster")?;
/// let before = setup.primary_port()?;
/// setup.failover()?; // SENTINEL FAILOVER, then waits for every sentinel
/// assert_ne!(setup.primary_port()?, before);
/// # Ok::<(), leasehold_testkit::Error>(())
/// ```
#[derive(Debug)]
pub struct RedisSentinel {
    master: String,
    /// The two data nodes: index 0 started as the primary.
    servers: Vec<RedisServer>,
    sentinels: Vec<SentinelProcess>,
}

#[derive(Debug)]
struct SentinelProcess {
    process: ChildProcess,
    port: u16,
    log_path: PathBuf,
    /// Declared last so it is removed after the process is gone.
    _dir: TempDir,
}

impl Drop for SentinelProcess {
    fn drop(&mut self) {
        if thread::panicking() {
            process::dump_log(
                &format!("redis-sentinel {HOST}:{}", self.port),
                &process::read_log(&self.log_path),
            );
        }
        let _ = self.process.kill();
    }
}

impl RedisSentinel {
    /// Starts the primary, the replica (and waits until it is in sync),
    /// then three sentinels monitoring `master`, and waits until each
    /// sentinel knows the replica and the two other sentinels, so a
    /// failover can start at once.
    ///
    /// # Errors
    ///
    /// As for [`RedisServer::start`]; [`Error::NotReady`] when the
    /// replica or the sentinels do not get there within 20 s.
    pub fn start(master: &str) -> Result<RedisSentinel, Error> {
        let primary = RedisServer::start()?;
        let replica = RedisServer::start_with(
            RedisOptions::default().replica_of(primary.host(), primary.port()),
        )?;
        let deadline = Instant::now() + DISCOVERY_TIMEOUT;
        wait_until(deadline, "replica link", || {
            Ok(info_field(&replica, "replication", "master_link_status")?.as_deref() == Some("up"))
        })?;
        let sentinels = (0..3)
            .map(|_| SentinelProcess::spawn(master, primary.port()))
            .collect::<Result<Vec<_>, _>>()?;
        let setup = RedisSentinel {
            master: master.to_owned(),
            servers: vec![primary, replica],
            sentinels,
        };
        wait_until(deadline, "sentinel discovery", || {
            for sentinel in &setup.sentinels {
                let Ok(Reply::Array(fields)) = sentinel.command(&["SENTINEL", "MASTER", master])
                else {
                    return Ok(false);
                };
                let field = |name: &str| {
                    fields
                        .chunks(2)
                        .find(|pair| pair[0].to_string() == name)
                        .map(|pair| pair[1].to_string())
                };
                if field("num-slaves").as_deref() != Some("1")
                    || field("num-other-sentinels").as_deref() != Some("2")
                {
                    return Ok(false);
                }
            }
            Ok(true)
        })?;
        Ok(setup)
    }

    /// The master name the sentinels monitor.
    pub fn master(&self) -> &str {
        &self.master
    }

    /// The sentinels' addresses, `redis://127.0.0.1:PORT/` each.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|sentinel| format!("redis://{HOST}:{}/", sentinel.port))
            .collect()
    }

    /// The whole setup as one URL:
    /// `redis+sentinel://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3/MASTER`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|sentinel| format!("{HOST}:{}", sentinel.port))
            .collect();
        format!("redis+sentinel://{}/{}", hosts.join(","), self.master)
    }

    /// The data nodes: the first one started as the primary, the second as
    /// its replica (their roles change with failovers).
    pub fn servers(&self) -> &[RedisServer] {
        &self.servers
    }

    /// The primary's port as the first sentinel that answers reports it.
    ///
    /// # Errors
    ///
    /// [`Error::NotReady`] when no sentinel answers with an address.
    pub fn primary_port(&self) -> Result<u16, Error> {
        self.sentinels
            .iter()
            .find_map(|sentinel| sentinel.primary_port(&self.master))
            .ok_or_else(|| self.not_ready("a primary address", COMMAND_TIMEOUT))
    }

    /// The data node that is the primary now (per the sentinels).
    ///
    /// # Errors
    ///
    /// As for [`primary_port`](Self::primary_port).
    pub fn primary(&self) -> Result<&RedisServer, Error> {
        let port = self.primary_port()?;
        self.servers
            .iter()
            .find(|server| server.port() == port)
            .ok_or_else(|| self.not_ready("a known primary", COMMAND_TIMEOUT))
    }

    /// Asks a sentinel for a coordinated failover (`SENTINEL FAILOVER`),
    /// then waits until [`wait_for_new_primary`](Self::wait_for_new_primary)
    /// says it is done. Returns the new primary's port.
    ///
    /// # Errors
    ///
    /// [`Error::RedisReply`] when the sentinel refuses (`NOGOODSLAVE`, a
    /// failover already running), otherwise as for
    /// [`wait_for_new_primary`](Self::wait_for_new_primary).
    pub fn failover(&self) -> Result<u16, Error> {
        let old = self.primary_port()?;
        self.sentinels[0].command(&["SENTINEL", "FAILOVER", &self.master])?;
        self.wait_for_new_primary(old, Duration::from_secs(30))
    }

    /// Kills the current primary (`SIGKILL`); the sentinels then fail
    /// over after [`SENTINEL_DOWN_AFTER`]. Returns its port. Pair it with
    /// [`wait_for_new_primary`](Self::wait_for_new_primary).
    ///
    /// # Errors
    ///
    /// As for [`primary_port`](Self::primary_port), or a signal error.
    pub fn kill_primary(&mut self) -> Result<u16, Error> {
        let port = self.primary_port()?;
        for server in &mut self.servers {
            if server.port() == port {
                server.kill()?;
            }
        }
        Ok(port)
    }

    /// Waits until every sentinel names a primary other than `old`, the
    /// same one, and that node answers `ROLE` as a master. Returns its
    /// port.
    ///
    /// # Errors
    ///
    /// [`Error::NotReady`] when that does not happen within `timeout`.
    pub fn wait_for_new_primary(&self, old: u16, timeout: Duration) -> Result<u16, Error> {
        let deadline = Instant::now() + timeout;
        let mut agreed = None;
        wait_until(deadline, "a new primary", || {
            let ports: Vec<Option<u16>> = self
                .sentinels
                .iter()
                .map(|sentinel| sentinel.primary_port(&self.master))
                .collect();
            let Some(Some(port)) = ports.first().copied() else {
                return Ok(false);
            };
            if port == old || ports.iter().any(|other| *other != Some(port)) {
                return Ok(false);
            }
            let is_master = self.servers.iter().any(|server| {
                server.port() == port
                    && server.is_running()
                    && server
                        .command(&["ROLE"])
                        .is_ok_and(|role| role.to_string().starts_with("master"))
            });
            if is_master {
                agreed = Some(port);
            }
            Ok(is_master)
        })
        .map_err(|_| self.not_ready("a new primary all sentinels agree on", timeout))?;
        agreed.ok_or_else(|| self.not_ready("a new primary", timeout))
    }

    fn not_ready(&self, what: &str, timeout: Duration) -> Error {
        let log_tail = self
            .sentinels
            .first()
            .map(|sentinel| process::tail(&process::read_log(&sentinel.log_path), 30).to_owned())
            .unwrap_or_default();
        Error::NotReady {
            server: format!("sentinels of {} ({what})", self.master),
            timeout,
            log_tail,
        }
    }
}

impl SentinelProcess {
    /// Writes a configuration monitoring `master` at the primary's port and
    /// starts `redis-server <conf> --sentinel`, waiting until it answers.
    fn spawn(master: &str, primary_port: u16) -> Result<SentinelProcess, Error> {
        let binary = process::find_binary("redis-server", "redis-server", &[])?;
        let dir = tempfile::Builder::new()
            .prefix("leasehold-sentinel-")
            .tempdir()
            .map_err(process::io_err(&std::env::temp_dir()))?;
        let port = process::free_port()?;
        let log_path = dir.path().join("sentinel.log");
        let conf_path = dir.path().join("sentinel.conf");
        let conf = format!(
            "port {port}\nbind {HOST}\ndaemonize no\nprotected-mode no\ndir {dir}\nlogfile {log}\n\
             sentinel monitor {master} {HOST} {primary_port} 2\n\
             sentinel down-after-milliseconds {master} {down}\n\
             sentinel failover-timeout {master} {failover}\n\
             sentinel parallel-syncs {master} 1\n",
            dir = dir.path().display(),
            log = log_path.display(),
            down = SENTINEL_DOWN_AFTER.as_millis(),
            failover = SENTINEL_FAILOVER_TIMEOUT.as_millis(),
        );
        fs::write(&conf_path, conf).map_err(process::io_err(&conf_path))?;
        let child = Command::new(&binary)
            .arg(&conf_path)
            .arg("--sentinel")
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|source| Error::Spawn {
                program: binary.clone(),
                source,
            })?;
        let mut sentinel = SentinelProcess {
            process: ChildProcess::new(child),
            port,
            log_path,
            _dir: dir,
        };
        let deadline = Instant::now() + DISCOVERY_TIMEOUT;
        loop {
            if let Some(status) = sentinel.process.try_wait()? {
                return Err(Error::ExitedEarly {
                    server: format!("redis-sentinel {HOST}:{port}"),
                    status,
                    log_tail: process::tail(&process::read_log(&sentinel.log_path), 30).to_owned(),
                });
            }
            if sentinel.command(&["PING"]).is_ok() {
                return Ok(sentinel);
            }
            if Instant::now() >= deadline {
                sentinel.process.kill()?;
                return Err(Error::NotReady {
                    server: format!("redis-sentinel {HOST}:{port}"),
                    timeout: DISCOVERY_TIMEOUT,
                    log_tail: process::tail(&process::read_log(&sentinel.log_path), 30).to_owned(),
                });
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    fn command(&self, args: &[&str]) -> Result<Reply, Error> {
        let addr = format!("{HOST}:{}", self.port);
        let client =
            redis::Client::open(format!("redis://{addr}/")).map_err(|source| Error::Resp {
                addr: addr.clone(),
                source: std::io::Error::other(source),
            })?;
        resp::run_command(&client, &addr, args, COMMAND_TIMEOUT)
    }

    /// The primary's port this sentinel reports, if it answers.
    fn primary_port(&self, master: &str) -> Option<u16> {
        match self.command(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", master]) {
            Ok(Reply::Array(parts)) => parts.get(1)?.to_string().parse().ok(),
            _ => None,
        }
    }
}

/// The value of `field` in `INFO section` of `server`.
fn info_field(server: &RedisServer, section: &str, field: &str) -> Result<Option<String>, Error> {
    let info = server.redis_cli(&["INFO", section])?;
    Ok(info
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{field}:")))
        .map(|value| value.trim().to_owned()))
}

/// Polls `done` until it says yes or `deadline` passes.
fn wait_until(
    deadline: Instant,
    what: &str,
    mut done: impl FnMut() -> Result<bool, Error>,
) -> Result<(), Error> {
    loop {
        if done().unwrap_or(false) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(Error::NotReady {
                server: what.to_owned(),
                timeout: DISCOVERY_TIMEOUT,
                log_tail: String::new(),
            });
        }
        thread::sleep(Duration::from_millis(50));
    }
}
