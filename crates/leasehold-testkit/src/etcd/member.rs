//! One member of an [`EtcdCluster`](super::EtcdCluster): its process, its
//! gates, its faults and a test's own requests to it.

use std::fs;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::gateway;
use super::partition::{Gate, Partition, Side};
use crate::Error;
use crate::certs::{ClientAuth, ServerTls};
use crate::process::{self, ChildProcess, POLL_INTERVAL};

/// How long a test's own request to a member may take. A write or a
/// linearizable read that etcd cannot commit (no quorum) fails within it.
pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// How long starting a cluster or a member may take.
pub(super) const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How long one readiness or status probe may take.
pub(super) const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// How many log lines error messages include.
pub(super) const ERROR_LOG_LINES: usize = 30;

/// One member of an [`EtcdCluster`](super::EtcdCluster): an `etcd` process
/// with its own data directory, a client port and a peer port, each behind
/// a gate of the cluster's (which is how [`cut_off`](Self::cut_off)
/// works).
///
/// Every method takes `&self`, so a test can hold several members at once.
/// The test's own requests ([`put`](Self::put), [`get`](Self::get),
/// [`status`](Self::status)) go straight to the member's client port, past
/// its gate, as an operator on the host would: they still reach a member
/// cut off from its clients.
///
/// Dropping it kills the process and removes the directory; if the thread
/// is panicking, the member's log is printed to stderr first.
#[derive(Debug)]
pub struct EtcdMember {
    index: usize,
    name: String,
    binary: PathBuf,
    args: Vec<String>,
    client_addr: SocketAddr,
    /// Where the test kit's own requests go: `client_addr` itself, or with
    /// TLS a second, plain listener of the member (so the kit needs no TLS
    /// client of its own).
    operator_addr: SocketAddr,
    /// Whether clients speak TLS to `client_addr` (and to the gate).
    tls: bool,
    client_gate: Gate,
    peer_gate: Gate,
    /// `None` until spawned.
    process: Mutex<Option<ChildProcess>>,
    /// The last process id.
    pid: AtomicU32,
    paused: AtomicBool,
    id: OnceLock<u64>,
    partition: Arc<Partition>,
    log_path: PathBuf,
    /// Where the current run's output starts in the (appended-to) log.
    log_offset: AtomicU64,
    /// Declared last so it is removed after the process is gone.
    dir: TempDir,
}

/// What a member says of itself and of the cluster
/// (`/v3/maintenance/status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct EtcdMemberStatus {
    /// The member's raft ID.
    pub id: u64,
    /// The ID of the leader it follows (itself if it leads); `None` while
    /// it knows of no leader (an election is on, or it is cut off).
    pub leader: Option<u64>,
    /// Its raft term.
    pub raft_term: u64,
    /// The index of the last raft entry it has.
    pub raft_index: u64,
    /// The revision of its key-value store.
    pub revision: i64,
}

impl EtcdMember {
    /// Makes member `index`'s directory and gates; the process is spawned
    /// by [`configure`](Self::configure) once every gate is known.
    pub(super) fn prepare(
        index: usize,
        binary: &Path,
        (client_port, peer_port, operator_port): (u16, u16, Option<u16>),
        partition: &Arc<Partition>,
    ) -> Result<Self, Error> {
        let dir = tempfile::Builder::new()
            .prefix("leasehold-etcd-")
            .tempdir()
            .map_err(process::io_err(&std::env::temp_dir()))?;
        let client_addr = SocketAddr::from((Ipv4Addr::LOCALHOST, client_port));
        let peer_addr = SocketAddr::from((Ipv4Addr::LOCALHOST, peer_port));
        let operator_addr = operator_port.map_or(client_addr, |port| {
            SocketAddr::from((Ipv4Addr::LOCALHOST, port))
        });
        let client_gate = Gate::start(partition, index, Side::Client, client_addr)?;
        let peer_gate = Gate::start(partition, index, Side::Peer, peer_addr)?;
        Ok(Self {
            index,
            name: format!("m{index}"),
            binary: binary.to_owned(),
            args: vec![format!("--listen-peer-urls=http://{peer_addr}")],
            client_addr,
            operator_addr,
            tls: operator_port.is_some(),
            client_gate,
            peer_gate,
            process: Mutex::new(None),
            pid: AtomicU32::new(0),
            paused: AtomicBool::new(false),
            id: OnceLock::new(),
            partition: Arc::clone(partition),
            log_path: dir.path().join("etcd.log"),
            log_offset: AtomicU64::new(0),
            dir,
        })
    }

    /// Completes the command line with the cluster's shared settings.
    pub(super) fn configure(&mut self, shared: &[String]) {
        let data = self.dir.path().join("data");
        let listen = if self.tls {
            format!("https://{},http://{}", self.client_addr, self.operator_addr)
        } else {
            format!("http://{}", self.client_addr)
        };
        self.args.extend([
            format!("--name={}", self.name),
            format!("--data-dir={}", data.display()),
            format!("--listen-client-urls={listen}"),
            format!("--advertise-client-urls={}", self.endpoint()),
            format!("--initial-advertise-peer-urls={}", self.peer_url()),
        ]);
        self.args.extend(shared.iter().cloned());
    }

    /// Writes `tls`'s server certificate, key and client CA into the
    /// member's directory and adds the flags that serve them on the client
    /// port (with [`ClientAuth::Required`], `--client-cert-auth`).
    ///
    /// With client authentication, etcd's own gateway (which serves the
    /// test kit's plain requests) dials the member's gRPC server as a
    /// client. On 3.5 it presents the server certificate unless given
    /// another, and the server certificate is not one a client may use,
    /// so a 3.5 member (`v3_5`) is given the test kit's client pair
    /// (`--client-cert-file`, which 3.4 does not have).
    ///
    /// # Errors
    /// [`Error::Io`] if a file cannot be written.
    pub(super) fn use_tls(&mut self, tls: &ServerTls, v3_5: bool) -> Result<(), Error> {
        let path = |name: &str, pem: &str| {
            let path = self.dir.path().join(name);
            fs::write(&path, pem).map_err(process::io_err(&path))?;
            Ok::<_, Error>(path.display().to_string())
        };
        let cert = path("server.pem", &tls.cert)?;
        let key = path("server-key.pem", &tls.key)?;
        let client_ca = path("client-ca.pem", &tls.client_ca)?;
        self.args
            .extend([format!("--cert-file={cert}"), format!("--key-file={key}")]);
        if tls.client_auth == ClientAuth::Required {
            self.args.extend([
                "--client-cert-auth".to_owned(),
                format!("--trusted-ca-file={client_ca}"),
            ]);
            if v3_5 {
                let (cert, key) = tls.client_pair();
                let cert = path("client.pem", cert)?;
                let key = path("client-key.pem", key)?;
                self.args.extend([
                    format!("--client-cert-file={cert}"),
                    format!("--client-key-file={key}"),
                ]);
            }
        }
        Ok(())
    }

    /// `name=http://127.0.0.1:GATE`, this member's entry in
    /// `--initial-cluster`.
    pub(super) fn initial_cluster_entry(&self) -> String {
        format!("{}={}", self.name, self.peer_url())
    }

    fn peer_url(&self) -> String {
        format!("http://{}", self.peer_gate.addr())
    }

    /// The member's index in its cluster.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The member's name (`--name`): `m0`, `m1`, ...
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The client URL to give etcd clients, `http://127.0.0.1:PORT`
    /// (`https://` in a cluster started with TLS): its gate, which
    /// [`cut_off_with_clients`](Self::cut_off_with_clients) closes. It is
    /// also the member's advertised client URL.
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.client_gate.addr())
    }

    /// The member's own client address, past its gate.
    pub fn client_addr(&self) -> SocketAddr {
        self.client_addr
    }

    /// The member's raft ID (stable across restarts), known once the
    /// cluster has started.
    pub fn id(&self) -> u64 {
        self.id.get().copied().unwrap_or(0)
    }

    pub(super) fn set_id(&self, id: u64) {
        let _ = self.id.set(id);
    }

    fn process(&self) -> MutexGuard<'_, Option<ChildProcess>> {
        self.process.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The process id (of the last process, once stopped).
    pub fn pid(&self) -> u32 {
        self.pid.load(Ordering::SeqCst)
    }

    /// Whether the process runs (it may be paused); `false` after
    /// [`stop`](Self::stop).
    pub fn is_running(&self) -> bool {
        self.process().as_ref().is_some_and(ChildProcess::is_alive)
    }

    /// The running process's id, or [`Error::NotRunning`].
    fn running_pid(&self) -> Result<u32, Error> {
        match self.process().as_ref() {
            Some(process) if process.is_alive() => Ok(process.pid()),
            _ => Err(Error::NotRunning {
                server: self.label(),
            }),
        }
    }

    /// The member's log, all runs (empty if it cannot be read).
    pub fn log(&self) -> String {
        process::read_log(&self.log_path)
    }

    /// The temporary directory of the member's data (`data/`) and log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `etcd m0 (127.0.0.1:PORT)`, for messages.
    pub(super) fn label(&self) -> String {
        format!("etcd {} ({})", self.name, self.client_addr)
    }

    /// Spawns the process (it must not be running) without waiting.
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
        let child = Command::new(&self.binary)
            .args(&self.args)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .map_err(|source| Error::Spawn {
                program: self.binary.clone(),
                source,
            })?;
        let child = ChildProcess::new(child);
        self.pid.store(child.pid(), Ordering::SeqCst);
        self.partition.set_pid(self.index, Some(child.pid()));
        *process = Some(child);
        self.paused.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// The log of the current run only.
    fn run_log(&self) -> String {
        process::read_log_from(&self.log_path, self.log_offset.load(Ordering::SeqCst))
    }

    /// Polls until `ready` holds, for up to `timeout`; fails at once if the
    /// process exits (see [`lost_port`](Self::lost_port)).
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
                self.partition.set_pid(self.index, None);
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
        self.run_log().contains("address already in use")
    }

    /// Kills the member with `SIGKILL` (a crash) and reaps it. Its data
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
        self.partition.set_pid(self.index, None);
        self.paused.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Starts a stopped member again, with its data directory and its
    /// ports, and waits (up to 30 s) until it answers on its client port.
    /// etcd serves clients only once it has rejoined the cluster (its
    /// membership published through raft), so this needs a quorum: a
    /// member started while cut off, or while a majority is down, does not
    /// answer; start the whole cluster with
    /// [`EtcdCluster::restart`](super::EtcdCluster::restart). Does
    /// nothing but the wait if it is running.
    ///
    /// # Errors
    ///
    /// As for spawning; [`Error::ExitedEarly`] if it exits,
    /// [`Error::NotReady`] if it does not answer in time (it is left
    /// running).
    pub fn start(&self) -> Result<(), Error> {
        self.spawn()?;
        self.wait_until(START_TIMEOUT, "answering", Self::answers)
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

    /// Freezes the member with `SIGSTOP` and returns once the kernel
    /// reports it stopped: it sends no heartbeat and answers nothing until
    /// [`resume`](Self::resume), while its connections stay open.
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

    /// Cuts the member off from its peers, both ways: the other members'
    /// connections to it and its connections to them are closed, and new
    /// ones refused, until [`heal`](Self::heal). Its clients still reach
    /// it. A cut-off leader steps down after an election timeout (etcd
    /// runs raft with check-quorum) and the others elect a new one; a
    /// cut-off member commits nothing and serves no linearizable read.
    pub fn cut_off(&self) {
        self.partition.cut(self.index, false);
    }

    /// As [`cut_off`](Self::cut_off), and from its clients too: the
    /// connections through its [`endpoint`](Self::endpoint) are closed and
    /// new ones refused (closed at once).
    pub fn cut_off_with_clients(&self) {
        self.partition.cut(self.index, true);
    }

    /// Ends a [cut](Self::cut_off): connections pass again (the members
    /// redial each other within about 100 ms).
    pub fn heal(&self) {
        self.partition.heal(self.index);
    }

    /// Whether the member is cut off from its peers.
    pub fn is_cut_off(&self) -> bool {
        self.partition.is_cut(self.index)
    }

    /// Whether the member answers `GET /version` within a moment.
    fn answers(&self) -> bool {
        gateway::get(self.operator_addr, "/version", PROBE_TIMEOUT).is_ok()
    }

    /// Whether the member reports itself healthy (`GET /health`): it knows
    /// a leader and a quorum read through raft succeeds.
    pub fn is_healthy(&self) -> bool {
        gateway::get(self.operator_addr, "/health", REQUEST_TIMEOUT)
            .is_ok_and(|body| body.contains(r#""health":"true""#))
    }

    /// The member's Prometheus metrics (`GET /metrics`, text), such as
    /// `etcd_disk_wal_fsync_duration_seconds_count` and `_sum`: how many
    /// times it has fsynced its write-ahead log, and for how long.
    ///
    /// # Errors
    ///
    /// [`Error::EtcdRequest`] if it does not answer within 5 s (it is
    /// stopped or paused), or [`Error::EtcdReply`].
    pub fn metrics(&self) -> Result<String, Error> {
        gateway::get(self.operator_addr, "/metrics", REQUEST_TIMEOUT)
    }

    /// Asks the member for its status (`POST /v3/maintenance/status`, a
    /// local answer that needs no quorum).
    ///
    /// # Errors
    ///
    /// [`Error::EtcdRequest`] if it does not answer within 5 s (it is
    /// stopped or paused), or [`Error::EtcdReply`].
    pub fn status(&self) -> Result<EtcdMemberStatus, Error> {
        self.status_within(REQUEST_TIMEOUT)
    }

    pub(super) fn status_within(&self, timeout: Duration) -> Result<EtcdMemberStatus, Error> {
        const PATH: &str = "/v3/maintenance/status";
        let body = gateway::post(self.operator_addr, PATH, "{}", timeout)?;
        let id = gateway::integer_field(&body, "member_id")
            .ok_or_else(|| gateway::unexpected(self.operator_addr, PATH, &body))?;
        Ok(EtcdMemberStatus {
            id,
            leader: gateway::integer_field(&body, "leader").filter(|&leader| leader != 0),
            raft_term: gateway::integer_field(&body, "raftTerm").unwrap_or(0),
            raft_index: gateway::integer_field(&body, "raftIndex").unwrap_or(0),
            revision: gateway::integer_field(&body, "revision").unwrap_or(0),
        })
    }

    /// Writes `key = value` through this member (`/v3/kv/put`) and returns
    /// the revision of the write.
    ///
    /// # Errors
    ///
    /// [`Error::EtcdRequest`] if no reply comes within 5 s (a member that
    /// cannot reach a quorum does not commit), or [`Error::EtcdReply`] if
    /// etcd refuses it.
    pub fn put(&self, key: &str, value: &str) -> Result<i64, Error> {
        const PATH: &str = "/v3/kv/put";
        let body = format!(
            r#"{{"key":"{}","value":"{}"}}"#,
            gateway::base64_encode(key.as_bytes()),
            gateway::base64_encode(value.as_bytes())
        );
        let reply = gateway::post(self.operator_addr, PATH, &body, REQUEST_TIMEOUT)?;
        gateway::integer_field(&reply, "revision")
            .ok_or_else(|| gateway::unexpected(self.operator_addr, PATH, &reply))
    }

    /// Raises (`true`) or clears (`false`) etcd's `NOSPACE` alarm in this
    /// member's name (`/v3/maintenance/alarm`), as etcd itself does when
    /// its backend outgrows `--quota-backend-bytes`: while it is raised
    /// every member refuses a write that stores anything (a put, a
    /// transaction with a put, a lease grant) with "database space
    /// exceeded", and still applies deletes and lease revokes. A full
    /// cluster without filling a disk.
    ///
    /// # Errors
    ///
    /// As for [`put`](Self::put).
    pub fn set_no_space_alarm(&self, on: bool) -> Result<(), Error> {
        const PATH: &str = "/v3/maintenance/alarm";
        let action = if on { "ACTIVATE" } else { "DEACTIVATE" };
        let body = format!(
            r#"{{"action":"{action}","memberID":"{}","alarm":"NOSPACE"}}"#,
            self.id()
        );
        let reply = gateway::post(self.operator_addr, PATH, &body, REQUEST_TIMEOUT)?;
        // The gateway answers a refusal with an "error" field (and a
        // "code"); an alarm set or cleared with the alarms left, if any.
        if reply.trim_start().starts_with('{') && !reply.contains(r#""error""#) {
            Ok(())
        } else {
            Err(gateway::unexpected(self.operator_addr, PATH, &reply))
        }
    }

    /// Adds the etcd user `name` with `password`, and a role of the same
    /// name granted `readwrite` (or, with `readwrite` false, only `read`)
    /// on the keys under `prefix` (`/v3/auth/user/add`, `role/add`,
    /// `role/grant`, `user/grant`): a user to test etcd's authentication
    /// and permissions with. Before [`enable_auth`](Self::enable_auth).
    ///
    /// # Errors
    ///
    /// As for [`put`](Self::put).
    pub fn add_user(
        &self,
        name: &str,
        password: &str,
        prefix: &str,
        readwrite: bool,
    ) -> Result<(), Error> {
        let mut end = prefix.as_bytes().to_vec();
        if let Some(last) = end.last_mut() {
            *last += 1;
        }
        let perm = if readwrite { "READWRITE" } else { "READ" };
        self.auth_request("/v3/auth/user/add", &user_body(name, password))?;
        self.auth_request("/v3/auth/role/add", &format!(r#"{{"name":"{name}"}}"#))?;
        self.auth_request(
            "/v3/auth/role/grant",
            &format!(
                r#"{{"name":"{name}","perm":{{"permType":"{perm}","key":"{}","range_end":"{}"}}}}"#,
                gateway::base64_encode(prefix.as_bytes()),
                gateway::base64_encode(&end)
            ),
        )?;
        self.auth_request(
            "/v3/auth/user/grant",
            &format!(r#"{{"user":"{name}","role":"{name}"}}"#),
        )
    }

    /// Adds the `root` user with `root_password` and the `root` role, and
    /// turns etcd's authentication on (`/v3/auth/enable`): from then on
    /// every request needs a user, and the test kit's own requests through
    /// the gateway ([`put`](Self::put), [`get`](Self::get),
    /// [`status`](Self::status)) are refused or see nothing.
    ///
    /// # Errors
    ///
    /// As for [`put`](Self::put).
    pub fn enable_auth(&self, root_password: &str) -> Result<(), Error> {
        self.auth_request("/v3/auth/user/add", &user_body("root", root_password))?;
        self.auth_request("/v3/auth/role/add", r#"{"name":"root"}"#)?;
        self.auth_request("/v3/auth/user/grant", r#"{"user":"root","role":"root"}"#)?;
        self.auth_request("/v3/auth/enable", "{}")
    }

    /// One request of etcd's auth API through the gateway; a reply that
    /// holds an error is [`Error::EtcdReply`] (the request, which may hold
    /// a password, is never part of it).
    fn auth_request(&self, path: &str, body: &str) -> Result<(), Error> {
        let reply = gateway::post(self.operator_addr, path, body, REQUEST_TIMEOUT)?;
        if reply.trim_start().starts_with('{') && !reply.contains(r#""error""#) {
            Ok(())
        } else {
            Err(gateway::unexpected(self.operator_addr, path, &reply))
        }
    }

    /// Reads `key` through this member with a linearizable read (the
    /// default, which needs the leader and a quorum); `None` if it is
    /// absent.
    ///
    /// # Errors
    ///
    /// As for [`put`](Self::put): a member cut off from a quorum fails.
    pub fn get(&self, key: &str) -> Result<Option<String>, Error> {
        self.range(key, false)
    }

    /// Reads `key` from this member's own store (a serializable read,
    /// possibly stale, which a cut-off member still serves).
    ///
    /// # Errors
    ///
    /// As for [`put`](Self::put).
    pub fn get_serializable(&self, key: &str) -> Result<Option<String>, Error> {
        self.range(key, true)
    }

    fn range(&self, key: &str, serializable: bool) -> Result<Option<String>, Error> {
        const PATH: &str = "/v3/kv/range";
        let body = format!(
            r#"{{"key":"{}","serializable":{serializable}}}"#,
            gateway::base64_encode(key.as_bytes())
        );
        let reply = gateway::post(self.operator_addr, PATH, &body, REQUEST_TIMEOUT)?;
        if !reply.contains(r#""kvs":"#) {
            return Ok(None);
        }
        // The gateway leaves an empty value out.
        let value = match gateway::string_field(&reply, "value") {
            None => Vec::new(),
            Some(encoded) => gateway::base64_decode(encoded)
                .ok_or_else(|| gateway::unexpected(self.operator_addr, PATH, &reply))?,
        };
        Ok(Some(String::from_utf8_lossy(&value).into_owned()))
    }
}

/// The JSON of a user and its password, the password escaped.
fn user_body(name: &str, password: &str) -> String {
    let escaped: String = password
        .chars()
        .flat_map(|c| match c {
            '"' | '\\' => vec!['\\', c],
            c => vec![c],
        })
        .collect();
    format!(r#"{{"name":"{name}","password":"{escaped}"}}"#)
}

impl Drop for EtcdMember {
    fn drop(&mut self) {
        if thread::panicking() {
            process::dump_log(&self.label(), &self.log());
        }
        let _ = self.stop();
    }
}
