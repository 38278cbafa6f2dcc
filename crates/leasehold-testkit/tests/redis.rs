//! Tests against a real `redis-server`.

use std::error::Error;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use leasehold_testkit::{Error as TestkitError, RedisOptions, RedisServer};

type TestResult = Result<(), Box<dyn Error>>;

/// Sends a raw `PING` and reads whatever comes back within `timeout`.
fn raw_ping(addr: SocketAddr, timeout: Duration) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.write_all(b"*1\r\n$4\r\nPING\r\n")?;
    let mut buf = [0u8; 128];
    let n = stream.read(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

#[test]
fn start_answers_ping_and_reports_consistent_address() -> TestResult {
    let server = RedisServer::start()?;
    assert_eq!(server.redis_cli(&["PING"])?, "PONG");
    assert_eq!(server.host(), "127.0.0.1");
    assert_eq!(
        server.url(),
        format!("redis://127.0.0.1:{}/", server.port())
    );
    assert_eq!(server.addr().port(), server.port());
    assert_eq!(
        raw_ping(server.addr(), Duration::from_secs(5))?,
        "+PONG\r\n"
    );
    assert_eq!(server.redis_cli(&["SET", "k", "v"])?, "OK");
    assert_eq!(server.redis_cli(&["GET", "k"])?, "v");
    assert_eq!(server.redis_cli(&["INCR", "n"])?, "1");
    let info = server.redis_cli(&["INFO", "server"])?;
    assert!(
        info.contains(&format!("process_id:{}", server.pid())),
        "{info}"
    );
    assert!(server.log().contains("Ready to accept connections"));
    Ok(())
}

#[test]
fn error_replies_are_errors() -> TestResult {
    let server = RedisServer::start()?;
    match server.redis_cli(&["NO-SUCH-COMMAND"]) {
        Err(TestkitError::RedisReply { message }) => {
            assert!(message.starts_with("ERR"), "{message}")
        }
        other => panic!("expected an error reply, got {other:?}"),
    }
    Ok(())
}

#[test]
fn start_many_gives_independent_servers() -> TestResult {
    let servers = RedisServer::start_many(3)?;
    assert_eq!(servers.len(), 3);
    let mut ports: Vec<u16> = servers.iter().map(RedisServer::port).collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), 3);
    servers[0].redis_cli(&["SET", "only-here", "1"])?;
    assert_eq!(servers[0].redis_cli(&["GET", "only-here"])?, "1");
    assert_eq!(servers[1].redis_cli(&["GET", "only-here"])?, "(nil)");
    assert_eq!(servers[2].redis_cli(&["PING"])?, "PONG");
    Ok(())
}

#[test]
fn drop_kills_the_process_and_removes_the_dir() -> TestResult {
    let server = RedisServer::start()?;
    let pid = server.pid();
    let addr = server.addr();
    let dir = server.dir().to_owned();
    assert!(Path::new(&format!("/proc/{pid}")).exists());
    drop(server);
    assert!(!Path::new(&format!("/proc/{pid}")).exists());
    let err = TcpStream::connect(addr).expect_err("nothing should listen any more");
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused);
    assert!(!dir.exists());
    Ok(())
}

#[test]
fn pause_stops_replies_until_resume() -> TestResult {
    let server = RedisServer::start()?;
    assert!(!server.is_paused());
    server.pause()?;
    assert!(server.is_paused());
    let err = raw_ping(server.addr(), Duration::from_millis(200))
        .expect_err("a paused server must not reply");
    assert!(
        matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
        "{err:?}"
    );
    server.resume()?;
    assert!(!server.is_paused());
    assert_eq!(server.redis_cli(&["PING"])?, "PONG");
    Ok(())
}

#[test]
fn kill_is_idempotent_and_restart_keeps_port_but_not_data() -> TestResult {
    let mut server = RedisServer::start()?;
    let port = server.port();
    let old_pid = server.pid();
    server.redis_cli(&["SET", "k", "v"])?;
    assert_eq!(server.redis_cli(&["GET", "k"])?, "v");

    server.kill()?;
    server.kill()?;
    assert!(!server.is_running());
    assert!(matches!(
        server.redis_cli(&["PING"]),
        Err(TestkitError::NotRunning { .. })
    ));
    assert!(matches!(
        server.pause(),
        Err(TestkitError::NotRunning { .. })
    ));

    server.restart()?;
    assert!(server.is_running());
    assert_eq!(server.port(), port);
    assert_ne!(server.pid(), old_pid);
    assert_eq!(server.redis_cli(&["GET", "k"])?, "(nil)");
    assert_eq!(server.redis_cli(&["DBSIZE"])?, "0");
    Ok(())
}

#[test]
fn restart_of_a_paused_server_works() -> TestResult {
    let mut server = RedisServer::start()?;
    server.pause()?;
    server.restart()?;
    assert!(!server.is_paused());
    assert_eq!(server.redis_cli(&["PING"])?, "PONG");
    Ok(())
}

#[test]
fn password_requires_auth() -> TestResult {
    let server = RedisServer::start_with(RedisOptions::default().password("hunter2"))?;
    let reply = raw_ping(server.addr(), Duration::from_secs(5))?;
    assert!(reply.starts_with("-NOAUTH"), "{reply}");
    assert_eq!(server.password(), Some("hunter2"));
    assert_eq!(
        server.url(),
        format!("redis://:hunter2@127.0.0.1:{}/", server.port())
    );
    // redis_cli authenticates by itself.
    assert_eq!(server.redis_cli(&["PING"])?, "PONG");
    Ok(())
}

#[test]
fn replica_follows_primary() -> TestResult {
    // Without the delay the primary waits 5 s before the first full sync.
    let primary = RedisServer::start_with(
        RedisOptions::default()
            .password("pw")
            .args(["--repl-diskless-sync-delay", "0"]),
    )?;
    let replica = RedisServer::start_with(
        RedisOptions::default()
            .password("pw")
            .replica_of(primary.host(), primary.port()),
    )?;
    primary.redis_cli(&["SET", "k", "v"])?;
    // WAIT blocks until the write reached one replica (or 5 s passed).
    assert_eq!(primary.redis_cli(&["WAIT", "1", "5000"])?, "1");
    assert_eq!(replica.redis_cli(&["GET", "k"])?, "v");
    let role = replica.redis_cli(&["ROLE"])?;
    assert!(role.starts_with("slave"), "{role}");
    Ok(())
}

#[test]
fn extra_args_are_passed_through() -> TestResult {
    let server =
        RedisServer::start_with(RedisOptions::default().args(["--maxmemory", "12345678"]))?;
    assert_eq!(
        server.redis_cli(&["CONFIG", "GET", "maxmemory"])?,
        "maxmemory\n12345678"
    );
    Ok(())
}

#[test]
fn bad_args_fail_with_log_tail() -> TestResult {
    let err = RedisServer::start_with(RedisOptions::default().arg("--no-such-option"))
        .expect_err("redis-server should reject the option");
    match err {
        TestkitError::ExitedEarly { log_tail, .. } => {
            assert!(log_tail.contains("no-such-option"), "{log_tail}");
        }
        other => panic!("unexpected error: {other:?}"),
    }
    Ok(())
}

#[test]
fn ready_timeout_gives_not_ready() -> TestResult {
    let err = RedisServer::start_with(RedisOptions::default().ready_timeout(Duration::ZERO))
        .expect_err("no server is ready within zero time");
    assert!(
        matches!(err, TestkitError::NotReady { .. }),
        "unexpected error: {err:?}"
    );
    Ok(())
}
