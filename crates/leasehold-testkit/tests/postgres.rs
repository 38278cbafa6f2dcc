//! Tests against a real PostgreSQL server.

use std::error::Error;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use leasehold_testkit::PostgresServer;

type TestResult = Result<(), Box<dyn Error>>;

/// Sends an `SSLRequest` and returns the one-byte answer (`N` or `S`); a
/// backend must be forked to answer it.
fn ssl_request(addr: SocketAddr, timeout: Duration) -> std::io::Result<u8> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.write_all(&[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f])?;
    let mut answer = [0u8; 1];
    stream.read_exact(&mut answer)?;
    Ok(answer[0])
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
