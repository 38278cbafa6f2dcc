//! The fault proxy in front of a real `redis-server` and PostgreSQL.

use std::error::Error;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

mod common;
use common::ssl_request;
use leasehold_testkit::{Direction, FaultProxy, Faults, PostgresServer, RedisServer};

type TestResult = Result<(), Box<dyn Error>>;

/// Long enough for any answer on a loaded machine.
const ANSWER: Duration = Duration::from_secs(10);

/// How long a client waits before it calls a silence a timeout.
const SHORT: Duration = Duration::from_millis(200);

/// Sends a RESP `PING` and reads the 7-byte `+PONG\r\n` within `timeout`.
fn ping(stream: &mut TcpStream, timeout: Duration) -> io::Result<String> {
    stream.write_all(b"*1\r\n$4\r\nPING\r\n")?;
    read_reply(stream, timeout)
}

fn read_reply(stream: &mut TcpStream, timeout: Duration) -> io::Result<String> {
    stream.set_read_timeout(Some(timeout))?;
    let mut reply = [0u8; 7];
    stream.read_exact(&mut reply)?;
    Ok(String::from_utf8_lossy(&reply).into_owned())
}

fn is_timeout(err: &io::Error) -> bool {
    matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

/// Asserts the client sees its connection closed: end of file or an error,
/// not a silence.
fn assert_closed(stream: &mut TcpStream) {
    // Writing may already fail (reset); reading then tells the same.
    let _ = stream.write_all(b"*1\r\n$4\r\nPING\r\n");
    let _ = stream.set_read_timeout(Some(ANSWER));
    let mut buf = [0u8; 16];
    match stream.read(&mut buf) {
        Ok(n) => assert_eq!(n, 0, "got {:?}", String::from_utf8_lossy(&buf[..n])),
        Err(err) => assert!(!is_timeout(&err), "{err:?}"),
    }
}

fn connect(addr: SocketAddr) -> io::Result<TcpStream> {
    TcpStream::connect_timeout(&addr, ANSWER)
}

#[test]
fn cut_closes_open_connections_and_accepts_new_ones() -> TestResult {
    let server = RedisServer::start()?;
    let proxy = FaultProxy::start(server.addr())?;
    let mut first = connect(proxy.addr())?;
    let mut second = connect(proxy.addr())?;
    assert_eq!(ping(&mut first, ANSWER)?, "+PONG\r\n");
    assert_eq!(ping(&mut second, ANSWER)?, "+PONG\r\n");
    assert_eq!(proxy.connections(), 2);

    proxy.cut();
    assert_eq!(proxy.connections(), 0);
    assert_closed(&mut first);
    assert_closed(&mut second);
    assert_eq!(proxy.faults(), Faults::default());

    let mut third = connect(proxy.addr())?;
    assert_eq!(ping(&mut third, ANSWER)?, "+PONG\r\n");
    Ok(())
}

#[test]
fn blackhole_holds_bytes_back_until_healed_while_a_direct_connection_works() -> TestResult {
    let server = RedisServer::start()?;
    let proxy = FaultProxy::start(server.addr())?;
    let mut open = connect(proxy.addr())?;
    assert_eq!(ping(&mut open, ANSWER)?, "+PONG\r\n");

    proxy.blackhole(true);
    let err = ping(&mut open, SHORT).expect_err("a blackholed connection must not answer");
    assert!(is_timeout(&err), "{err:?}");
    // New connections are accepted but partitioned too.
    let mut new = connect(proxy.addr())?;
    let err = ping(&mut new, SHORT).expect_err("a blackholed connection must not answer");
    assert!(is_timeout(&err), "{err:?}");
    // The server itself is fine.
    let mut direct = connect(server.addr())?;
    assert_eq!(ping(&mut direct, ANSWER)?, "+PONG\r\n");
    assert_eq!(proxy.connections(), 2);

    proxy.heal();
    // The held PINGs reach the server once healed, in order: each
    // connection gets the reply to its held PING, then to its next one,
    // and nothing after: the stream stays in step.
    for stream in [&mut open, &mut new] {
        assert_eq!(read_reply(stream, ANSWER)?, "+PONG\r\n");
        assert_eq!(ping(stream, ANSWER)?, "+PONG\r\n");
        let err = read_reply(stream, SHORT).expect_err("no reply may be left over");
        assert!(is_timeout(&err), "{err:?}");
    }
    Ok(())
}

/// With 2 s of latency in `direction`, a 200 ms client timeout fires, and
/// the reply still comes (late, not lost).
fn check_latency(direction: Direction) -> TestResult {
    let server = RedisServer::start()?;
    let proxy = FaultProxy::start(server.addr())?;
    let mut stream = connect(proxy.addr())?;
    assert_eq!(ping(&mut stream, ANSWER)?, "+PONG\r\n");

    proxy.set_latency(direction, Duration::from_secs(2));
    let err = ping(&mut stream, SHORT).expect_err("the reply must come too late");
    assert!(is_timeout(&err), "{err:?}");
    assert_eq!(read_reply(&mut stream, ANSWER)?, "+PONG\r\n");

    proxy.set_latency(direction, Duration::ZERO);
    assert_eq!(proxy.faults(), Faults::default());
    assert_eq!(ping(&mut stream, ANSWER)?, "+PONG\r\n");
    Ok(())
}

#[test]
fn upstream_latency_makes_a_short_client_timeout_fire() -> TestResult {
    check_latency(Direction::Upstream)
}

#[test]
fn downstream_latency_makes_a_short_client_timeout_fire() -> TestResult {
    check_latency(Direction::Downstream)
}

#[test]
fn latency_both_ways_sets_both_directions() -> TestResult {
    let server = RedisServer::start()?;
    let proxy = FaultProxy::start(server.addr())?;
    proxy.set_latency(Direction::Both, Duration::from_secs(3));
    let faults = proxy.faults();
    assert_eq!(faults.latency_upstream, Duration::from_secs(3));
    assert_eq!(faults.latency_downstream, Duration::from_secs(3));
    let mut stream = connect(proxy.addr())?;
    let err = ping(&mut stream, SHORT).expect_err("the reply must come too late");
    assert!(is_timeout(&err), "{err:?}");
    Ok(())
}

#[test]
fn refuse_closes_new_connections_only() -> TestResult {
    let server = RedisServer::start()?;
    let proxy = FaultProxy::start(server.addr())?;
    let mut open = connect(proxy.addr())?;
    assert_eq!(ping(&mut open, ANSWER)?, "+PONG\r\n");

    proxy.refuse(true);
    let mut refused = connect(proxy.addr())?;
    assert_closed(&mut refused);
    assert_eq!(ping(&mut open, ANSWER)?, "+PONG\r\n");

    proxy.refuse(false);
    let mut accepted = connect(proxy.addr())?;
    assert_eq!(ping(&mut accepted, ANSWER)?, "+PONG\r\n");
    Ok(())
}

#[test]
fn a_killed_upstream_closes_the_connection() -> TestResult {
    let mut server = RedisServer::start()?;
    let proxy = FaultProxy::start(server.addr())?;
    let mut open = connect(proxy.addr())?;
    assert_eq!(ping(&mut open, ANSWER)?, "+PONG\r\n");
    server.kill()?;
    assert_closed(&mut open);
    let mut new = connect(proxy.addr())?;
    assert_closed(&mut new);
    Ok(())
}

#[test]
fn drop_closes_connections_and_the_port() -> TestResult {
    let server = RedisServer::start()?;
    let proxy = FaultProxy::start(server.addr())?;
    let addr = proxy.addr();
    let mut open = connect(addr)?;
    assert_eq!(ping(&mut open, ANSWER)?, "+PONG\r\n");
    proxy.blackhole(true);
    drop(proxy);
    assert_closed(&mut open);
    let err = connect(addr).expect_err("nothing should listen any more");
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused);
    Ok(())
}

#[test]
fn postgres_behind_the_proxy_is_partitioned_by_the_blackhole() -> TestResult {
    let server = PostgresServer::start()?;
    let proxy = FaultProxy::start(server.addr())?;
    assert_eq!(ssl_request(&mut connect(proxy.addr())?, ANSWER)?, b'N');

    proxy.blackhole(true);
    let err = ssl_request(&mut connect(proxy.addr())?, SHORT)
        .expect_err("a blackholed connection must not answer");
    assert!(is_timeout(&err), "{err:?}");
    assert_eq!(ssl_request(&mut connect(server.addr())?, ANSWER)?, b'N');

    proxy.heal();
    assert_eq!(ssl_request(&mut connect(proxy.addr())?, ANSWER)?, b'N');
    Ok(())
}

#[test]
fn a_proxy_may_listen_on_another_loopback_address_on_the_servers_port() -> TestResult {
    let server = RedisServer::start()?;
    let listen = SocketAddr::from(([127, 0, 9, 8], server.addr().port()));
    let proxy = FaultProxy::start_at(listen, server.addr())?;
    assert_eq!(proxy.addr(), listen);
    let mut through = connect(proxy.addr())?;
    assert_eq!(ping(&mut through, ANSWER)?, "+PONG\r\n");
    assert_eq!(proxy.connections(), 1);
    Ok(())
}
