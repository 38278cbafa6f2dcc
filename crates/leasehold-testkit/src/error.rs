//! The crate's error type.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::Signal;

/// Everything that can go wrong while starting, controlling or talking to a
/// throwaway server.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A required server binary is neither on `PATH` nor in any of the
    /// well-known fallback directories.
    #[error("{name} not found on PATH; install it with: {install_hint}")]
    BinaryNotFound {
        /// The binary that was looked for, e.g. `redis-server`.
        name: String,
        /// How to install it.
        install_hint: String,
    },

    /// A shared library the testkit preloads into a server (libfaketime,
    /// for [`RedisOptions::fake_clock`](crate::RedisOptions::fake_clock))
    /// is in none of the directories distributions install it in.
    #[error("{name} not found in the usual library directories; install it with: {install_hint}")]
    LibraryNotFound {
        /// The library looked for, e.g. `libfaketimeMT.so.1`.
        name: String,
        /// How to install it.
        install_hint: String,
    },

    /// Binding a loopback socket to find a free port failed.
    #[error("failed to find a free loopback port")]
    FreePort(#[source] io::Error),

    /// Creating, writing or changing the ownership of a file or directory
    /// failed.
    #[error("failed to prepare {}", path.display())]
    Io {
        /// The file or directory concerned.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// The server process could not be spawned.
    #[error("failed to spawn {}", program.display())]
    Spawn {
        /// The binary that was executed.
        program: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// Waiting for (reaping) a child process failed.
    #[error("failed to wait for process {pid}")]
    Wait {
        /// The child's process id.
        pid: u32,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// Sending a signal to a process failed.
    #[error("failed to send {signal} to process {pid}")]
    Signal {
        /// The signal that was sent.
        signal: Signal,
        /// The target process id.
        pid: u32,
        /// The underlying error.
        #[source]
        source: nix::Error,
    },

    /// The operation needs a running server, but it has been killed.
    #[error("{server} is not running")]
    NotRunning {
        /// Which server, e.g. `redis-server 127.0.0.1:6379`.
        server: String,
    },

    /// The server process exited before it became ready.
    #[error("{server} exited before becoming ready ({status}); log tail:\n{log_tail}")]
    ExitedEarly {
        /// Which server, e.g. `redis-server 127.0.0.1:6379`.
        server: String,
        /// How it exited.
        status: ExitStatus,
        /// The last lines of its log.
        log_tail: String,
    },

    /// The server did not become ready in time (it has been killed).
    #[error("{server} did not become ready within {timeout:?}; log tail:\n{log_tail}")]
    NotReady {
        /// Which server, e.g. `redis-server 127.0.0.1:6379`.
        server: String,
        /// How long it was given.
        timeout: Duration,
        /// The last lines of its log.
        log_tail: String,
    },

    /// Every attempt to start the server failed because its port was taken
    /// by another process in the meantime.
    #[error("{program} could not bind a free port in {attempts} attempts")]
    PortsExhausted {
        /// The server binary, e.g. `redis-server`.
        program: String,
        /// How many ports were tried.
        attempts: u32,
    },

    /// Something other than the server just started already answers on
    /// its port.
    #[error("port {port} is already served by process {owner_pid}")]
    PortTaken {
        /// The port.
        port: u16,
        /// The process id reported by whatever answers on it.
        owner_pid: u32,
    },

    /// A process did not stop or continue after `SIGSTOP`/`SIGCONT` in time.
    #[error("process {pid} did not {action} within {timeout:?}")]
    SignalTimeout {
        /// The target process id.
        pid: u32,
        /// `"stop"` or `"continue"`.
        action: &'static str,
        /// How long it was given.
        timeout: Duration,
    },

    /// Looking up a system user failed.
    #[error("failed to look up user {name:?}")]
    UserLookup {
        /// The user name.
        name: String,
        /// The underlying error.
        #[source]
        source: nix::Error,
    },

    /// PostgreSQL refuses to run as root and the unprivileged user to run it
    /// as does not exist.
    #[error("running as root but user {name:?} does not exist; PostgreSQL refuses to run as root")]
    UserNotFound {
        /// The user name.
        name: String,
    },

    /// `initdb` exited unsuccessfully.
    #[error("initdb failed ({status}):\n{output}")]
    Initdb {
        /// How it exited.
        status: ExitStatus,
        /// Its combined standard output and error.
        output: String,
    },

    /// A PostgreSQL tool (`pg_basebackup`, `pg_ctl`) exited
    /// unsuccessfully.
    #[error("{tool} failed ({status}):\n{output}")]
    PostgresTool {
        /// Which tool.
        tool: &'static str,
        /// How it exited.
        status: ExitStatus,
        /// Its combined standard output and error.
        output: String,
    },

    /// The operating system's random number generator failed.
    #[error("failed to generate a random password")]
    Random(#[source] getrandom::Error),

    /// Sending a command to a redis server failed: connecting, the TLS
    /// handshake, authentication, I/O or the protocol (the source is the
    /// redis client's error, wrapped in an `io::Error`).
    #[error("redis command to {addr} failed")]
    Resp {
        /// The server's address.
        addr: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// Generating or signing a test certificate failed.
    #[error("failed to generate a test certificate")]
    Certificate(#[source] rcgen::Error),

    /// A redis server answered a command with an error reply.
    #[error("redis replied with an error: {message}")]
    RedisReply {
        /// The error reply, e.g. `ERR unknown command 'FOO'`.
        message: String,
    },

    /// A server started with
    /// [`RedisOptions::fake_clock`](crate::RedisOptions::fake_clock) does
    /// not follow libfaketime's clock: it hung at start (Debian's
    /// jemalloc-linked `redis-server` does), or its `TIME` ignored the
    /// offset set (a static binary ignores `LD_PRELOAD`). It has been
    /// killed. A libc-malloc build follows (`scripts/valkey.sh`'s Valkey).
    #[error("{server} ({}) does not follow libfaketime's clock: {detail}", binary.display())]
    ClockNotDriven {
        /// Which server, e.g. `redis-server 127.0.0.1:6379`.
        server: String,
        /// The binary started.
        binary: PathBuf,
        /// What was seen, with the log's last lines if it hung.
        detail: String,
    },

    /// A request to move a server's clock that cannot be carried out: the
    /// server runs on the machine's clock (not started with
    /// [`RedisOptions::fake_clock`](crate::RedisOptions::fake_clock)), a
    /// jump was asked while the clock runs at another rate than 1
    /// (libfaketime ignores it), or the rate is not a positive number.
    #[error("cannot move the clock of {server}: {reason}")]
    FakeClock {
        /// Which server, e.g. `redis-server 127.0.0.1:6379`.
        server: String,
        /// Why not.
        reason: &'static str,
    },

    /// A request to an etcd member's HTTP/JSON gateway got no reply:
    /// connecting failed, the connection broke, the time ran out (a member
    /// that cannot reach a quorum does not answer a write or a
    /// linearizable read), or the reply was not what was asked for.
    #[error("request to etcd at {url} failed")]
    EtcdRequest {
        /// The request's URL.
        url: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// An etcd member answered a request with an error status.
    #[error("etcd at {url} replied with status {status}: {body}")]
    EtcdReply {
        /// The request's URL.
        url: String,
        /// The HTTP status, e.g. 503.
        status: u16,
        /// The reply's body (etcd's error, as JSON).
        body: String,
    },

    /// No etcd member named a leader in time.
    #[error("the etcd cluster had no leader within {timeout:?}")]
    NoLeader {
        /// How long it was given.
        timeout: Duration,
    },

    /// An etcd cluster of this many members cannot be started.
    #[error("an etcd cluster needs at least one member, not {members}")]
    EtcdClusterSize {
        /// The number asked for.
        members: usize,
    },

    /// A four-letter word sent to a ZooKeeper server's client port got no
    /// answer: connecting failed (the server is stopped), or the time ran
    /// out (it is paused).
    #[error("four-letter word {word} to zookeeper at {addr} failed")]
    ZooKeeperRequest {
        /// The server's client address.
        addr: SocketAddr,
        /// The word sent, e.g. `srvr`.
        word: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// No ZooKeeper server said it leads in time.
    #[error("the zookeeper ensemble had no leader within {timeout:?}")]
    ZooKeeperNoLeader {
        /// How long it was given.
        timeout: Duration,
    },

    /// A ZooKeeper ensemble of this many members cannot be started.
    #[error("a zookeeper ensemble needs at least one member, not {members}")]
    ZooKeeperEnsembleSize {
        /// The number asked for.
        members: usize,
    },

    /// A ZooKeeper tick time that is not a whole number of milliseconds,
    /// at least 1 ms (the server's `tickTime` is an integer number of
    /// milliseconds).
    #[error(
        "a zookeeper tick time must be a whole number of milliseconds, at least 1 ms, not {tick_time:?}"
    )]
    ZooKeeperTickTime {
        /// The tick time asked for.
        tick_time: Duration,
    },

    /// The server cannot be started with these settings.
    #[error("unsupported setting: {what}")]
    Unsupported {
        /// What cannot be done, and why.
        what: &'static str,
    },

    /// `prlimit` could not set a process's file size limit (a ZooKeeper
    /// member's [full disk](crate::ZooKeeperMember::fill_disk)).
    #[error("prlimit on process {pid} failed ({status}): {output}")]
    Prlimit {
        /// The process.
        pid: u32,
        /// How `prlimit` exited.
        status: ExitStatus,
        /// Its standard error.
        output: String,
    },

    /// A [`FaultProxy`](crate::FaultProxy) could not start its thread.
    #[error("failed to start a fault proxy thread")]
    ProxyThread(#[source] io::Error),
}
