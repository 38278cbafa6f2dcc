//! Tests against a real PostgreSQL server.

use std::error::Error;
use std::io::ErrorKind;
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

mod common;
use leasehold_testkit::PostgresServer;

type TestResult = Result<(), Box<dyn Error>>;

/// [`common::ssl_request`] on a new connection to `addr`.
fn ssl_request(addr: SocketAddr, timeout: Duration) -> std::io::Result<u8> {
    common::ssl_request(&mut TcpStream::connect(addr)?, timeout)
}

#[test]
fn start_pause_resume_drop() -> TestResult {
    let server = PostgresServer::start()?;
    let pid = server.pid();
    let dir = server.dir().to_owned();
    TcpStream::connect(server.addr())?;
    assert!(server.log().contains("ready to accept connections"));
    assert_eq!(server.user(), "leasehold");
    assert_eq!(server.password().len(), 24);
    assert_eq!(
        server.url(),
        format!(
            "postgres://leasehold:{}@127.0.0.1:{}/postgres",
            server.password(),
            server.port()
        )
    );
    assert_eq!(ssl_request(server.addr(), Duration::from_secs(5))?, b'N');

    server.pause()?;
    assert!(server.is_paused());
    let err = ssl_request(server.addr(), Duration::from_millis(200))
        .expect_err("a paused server must not answer");
    assert!(
        matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
        "{err:?}"
    );
    server.resume()?;
    assert!(!server.is_paused());
    assert_eq!(ssl_request(server.addr(), Duration::from_secs(5))?, b'N');

    let addr = server.addr();
    drop(server);
    assert!(!Path::new(&format!("/proc/{pid}")).exists());
    let err = TcpStream::connect(addr).expect_err("nothing should listen any more");
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused);
    assert!(!dir.exists());
    Ok(())
}

#[test]
fn drop_while_paused_shuts_down() -> TestResult {
    let server = PostgresServer::start()?;
    let pid = server.pid();
    server.pause()?;
    drop(server);
    assert!(!Path::new(&format!("/proc/{pid}")).exists());
    Ok(())
}

/// A shared server stopped and started again: the same port, a
/// new postmaster, nothing listening in between; dropped, it is gone.
#[test]
fn stop_and_start_again_on_the_same_port() -> TestResult {
    let server = std::sync::Arc::new(PostgresServer::start()?);
    let (addr, first) = (server.addr(), server.pid());
    server.stop()?;
    assert!(!Path::new(&format!("/proc/{first}")).exists());
    let err = TcpStream::connect(addr).expect_err("nothing should listen while stopped");
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused);
    server.start_again()?;
    assert_eq!(server.addr(), addr);
    assert_ne!(server.pid(), first);
    assert_eq!(ssl_request(addr, Duration::from_secs(5))?, b'N');
    let again = server.pid();
    drop(server);
    assert!(!Path::new(&format!("/proc/{again}")).exists());
    Ok(())
}
