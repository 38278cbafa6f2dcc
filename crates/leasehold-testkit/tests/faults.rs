//! Fault injectors against real processes and servers.

use std::error::Error;
use std::io::{self, BufRead, BufReader, ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use leasehold_testkit::{
    Error as TestkitError, PostgresServer, RedisOptions, RedisServer, is_process_paused,
    pause_process, resume_process,
};

type TestResult = Result<(), Box<dyn Error>>;

/// Long enough for any answer on a loaded machine.
const ANSWER: Duration = Duration::from_secs(10);

/// How long a client waits before it calls a silence a timeout.
const SHORT: Duration = Duration::from_millis(200);

/// Kills and reaps the child when dropped, also when a test fails.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_paused_process_makes_no_progress_until_resumed() -> TestResult {
    // `cat` echoes each line it is sent: an observable unit of progress.
    let mut child = Reaped(
        Command::new("cat")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?,
    );
    let pid = child.0.id();
    let mut stdin = child.0.stdin.take().ok_or("no stdin")?;
    let stdout = child.0.stdout.take().ok_or("no stdout")?;
    let (lines, echoed) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if lines.send(line).is_err() {
                return;
            }
        }
    });
    writeln!(stdin, "one")?;
    assert_eq!(echoed.recv_timeout(ANSWER)??, "one");
    assert!(!is_process_paused(pid));

    pause_process(pid)?;
    assert!(is_process_paused(pid));
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let state = state
        .rsplit(')')
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .next();
    assert_eq!(state, Some("T"));
    writeln!(stdin, "two")?;
    assert!(matches!(
        echoed.recv_timeout(SHORT),
        Err(RecvTimeoutError::Timeout)
    ));
    assert!(is_process_paused(pid));
    // Pausing twice is harmless.
    pause_process(pid)?;

    resume_process(pid)?;
    assert!(!is_process_paused(pid));
    assert_eq!(echoed.recv_timeout(ANSWER)??, "two");
    resume_process(pid)?;

    drop(stdin);
    assert!(child.0.wait()?.success());
    // Gone (and reaped): there is nothing to pause any more.
    assert!(matches!(
        pause_process(pid),
        Err(TestkitError::Signal {
            source: nix::Error::ESRCH,
            ..
        })
    ));
    Ok(())
}

#[test]
fn restart_empty_loses_every_key() -> TestResult {
    // Even with the append-only file, whose data `restart` would keep.
    let mut server = RedisServer::start_with(RedisOptions::default().appendonly())?;
    let port = server.port();
    server.redis_cli(&["SET", "lock", "token"])?;
    server.restart_empty()?;
    assert_eq!(server.port(), port);
    assert_eq!(server.redis_cli(&["DBSIZE"])?, "0");
    // Still persisting after the restart.
    assert_eq!(
        server.redis_cli(&["CONFIG", "GET", "appendonly"])?,
        "appendonly\nyes"
    );
    Ok(())
}

#[test]
fn restart_with_appendonly_keeps_every_acknowledged_key() -> TestResult {
    let mut server = RedisServer::start_with(RedisOptions::default().appendonly())?;
    assert_eq!(
        server.redis_cli(&["CONFIG", "GET", "appendfsync"])?,
        "appendfsync\nalways"
    );
    let old_pid = server.pid();
    server.redis_cli(&["SET", "lock", "token", "PX", "600000"])?;
    server.redis_cli(&["INCR", "fence"])?;
    // A crash: SIGKILL, no shutdown save.
    server.restart()?;
    assert_ne!(server.pid(), old_pid);
    assert_eq!(server.redis_cli(&["GET", "lock"])?, "token");
    assert_eq!(server.redis_cli(&["GET", "fence"])?, "1");
    let ttl: i64 = server.redis_cli(&["PTTL", "lock"])?.parse()?;
    assert!(ttl > 0, "{ttl}");
    Ok(())
}

#[test]
fn a_promoted_replica_accepts_writes() -> TestResult {
    // Without the delay the primary waits 5 s before the first full sync.
    let mut primary = RedisServer::start_with(
        RedisOptions::default()
            .password("pw")
            .args(["--repl-diskless-sync-delay", "0"]),
    )?;
    let mut replica = RedisServer::start_with(
        RedisOptions::default()
            .password("pw")
            .replica_of(primary.host(), primary.port()),
    )?;
    primary.redis_cli(&["SET", "lock", "token"])?;
    assert_eq!(primary.redis_cli(&["WAIT", "1", "5000"])?, "1");
    match replica.redis_cli(&["SET", "other", "x"]) {
        Err(TestkitError::RedisReply { message }) => {
            assert!(message.starts_with("READONLY"), "{message}")
        }
        other => panic!("a replica must refuse writes, got {other:?}"),
    }

    primary.kill()?;
    replica.promote()?;
    assert_eq!(replica.redis_cli(&["SET", "other", "x"])?, "OK");
    assert_eq!(replica.redis_cli(&["GET", "lock"])?, "token");
    assert!(replica.redis_cli(&["ROLE"])?.starts_with("master"));

    // It stays a primary across a restart, even with the old one back.
    primary.restart()?;
    replica.restart()?;
    assert!(replica.redis_cli(&["ROLE"])?.starts_with("master"));
    assert_eq!(replica.redis_cli(&["SET", "after", "restart"])?, "OK");
    Ok(())
}

#[test]
fn key_faults_take_the_lock_away() -> TestResult {
    let server = RedisServer::start()?;
    server.redis_cli(&["SET", "lock", "token", "PX", "600000"])?;
    assert!(server.delete_key("lock")?);
    assert!(!server.delete_key("lock")?);
    assert_eq!(server.redis_cli(&["EXISTS", "lock"])?, "0");

    server.redis_cli(&["SET", "lock", "token", "PX", "600000"])?;
    assert!(server.expire_key_soon("lock")?);
    let pttl: i64 = server.redis_cli(&["PTTL", "lock"])?.parse()?;
    assert!(pttl <= 1, "{pttl}");
    let deadline = Instant::now() + ANSWER;
    while server.redis_cli(&["GET", "lock"])? != "(nil)" {
        assert!(Instant::now() < deadline, "the key did not expire");
        thread::yield_now();
    }
    assert!(!server.expire_key_soon("lock")?);

    let sha = server.redis_cli(&["SCRIPT", "LOAD", "return 1"])?;
    assert_eq!(server.redis_cli(&["EVALSHA", &sha, "0"])?, "1");
    server.flush_scripts()?;
    match server.redis_cli(&["EVALSHA", &sha, "0"]) {
        Err(TestkitError::RedisReply { message }) => {
            assert!(message.starts_with("NOSCRIPT"), "{message}")
        }
        other => panic!("expected NOSCRIPT, got {other:?}"),
    }
    Ok(())
}

/// A minimal PostgreSQL frontend over the server's Unix socket, where
/// `trust` authentication needs no password exchange.
struct PgSession(UnixStream);

impl PgSession {
    fn connect(server: &PostgresServer) -> io::Result<Self> {
        let path = server.dir().join(format!(".s.PGSQL.{}", server.port()));
        let mut stream = UnixStream::connect(path)?;
        stream.set_read_timeout(Some(ANSWER))?;
        let mut body = 196_608u32.to_be_bytes().to_vec(); // protocol 3.0
        for field in ["user", server.user(), "database", "postgres", ""] {
            body.extend_from_slice(field.as_bytes());
            body.push(0);
        }
        stream.write_all(&message_len(&body).to_be_bytes())?;
        stream.write_all(&body)?;
        let mut session = PgSession(stream);
        session.read_until_ready()?;
        Ok(session)
    }

    /// Sends a simple query without waiting for its result.
    fn send_query(&mut self, sql: &str) -> io::Result<()> {
        let mut body = sql.as_bytes().to_vec();
        body.push(0);
        self.0.write_all(b"Q")?;
        self.0.write_all(&message_len(&body).to_be_bytes())?;
        self.0.write_all(&body)
    }

    /// Reads messages up to `ReadyForQuery`, returning the first column
    /// of the last data row, if any.
    fn read_until_ready(&mut self) -> io::Result<Option<String>> {
        let mut value = None;
        loop {
            let mut header = [0u8; 5];
            self.0.read_exact(&mut header)?;
            let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]);
            let mut body = vec![0u8; to_usize(len).saturating_sub(4)];
            self.0.read_exact(&mut body)?;
            match header[0] {
                b'Z' => return Ok(value),
                b'E' => {
                    return Err(io::Error::other(
                        String::from_utf8_lossy(&body).into_owned(),
                    ));
                }
                // DataRow: column count (2 bytes), then length and bytes.
                b'D' if body.len() >= 6 => {
                    let len = u32::from_be_bytes([body[2], body[3], body[4], body[5]]);
                    let end = (6 + to_usize(len)).min(body.len());
                    value = Some(String::from_utf8_lossy(&body[6..end]).into_owned());
                }
                _ => {}
            }
        }
    }
}

fn to_usize(len: u32) -> usize {
    usize::try_from(len).unwrap_or(usize::MAX)
}

/// A message's length field: the body plus the field itself.
fn message_len(body: &[u8]) -> u32 {
    u32::try_from(body.len() + 4).unwrap_or(u32::MAX)
}

#[test]
fn a_paused_postgres_stalls_an_open_session_until_resumed() -> TestResult {
    let server = PostgresServer::start()?;
    let mut session = PgSession::connect(&server)?;
    session.send_query("SELECT 1")?;
    assert_eq!(session.read_until_ready()?.as_deref(), Some("1"));

    server.pause()?;
    assert!(is_process_paused(server.pid()));
    session.send_query("SELECT 2")?;
    session.0.set_read_timeout(Some(SHORT))?;
    let mut byte = [0u8; 1];
    let err = session
        .0
        .read(&mut byte)
        .expect_err("a paused server must not answer");
    assert!(
        matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
        "{err:?}"
    );

    server.resume()?;
    assert!(!is_process_paused(server.pid()));
    session.0.set_read_timeout(Some(ANSWER))?;
    assert_eq!(session.read_until_ready()?.as_deref(), Some("2"));
    Ok(())
}
