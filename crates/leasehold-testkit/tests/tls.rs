//! TLS servers with certificates made at test time.

use std::error::Error;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use leasehold_testkit::{ClientAuth, Error as TestkitError, RedisOptions, RedisServer, TestCerts};

type TestResult = Result<(), Box<dyn Error>>;

/// What a plain `PING` on `server`'s port gets back (empty if the server
/// closed the connection).
fn plain_ping(server: &RedisServer) -> std::io::Result<Vec<u8>> {
    let mut stream = TcpStream::connect(server.addr())?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(b"*1\r\n$4\r\nPING\r\n")?;
    let mut reply = Vec::new();
    // A TLS server answers garbage with an alert (or nothing) and closes.
    let _ = stream.read_to_end(&mut reply);
    Ok(reply)
}

#[test]
fn tls_redis_serves_commands_over_tls_only() -> TestResult {
    let certs = TestCerts::generate()?;
    let server = RedisServer::start_with(RedisOptions::default().tls(certs.server()))?;
    assert!(server.is_tls());
    assert_eq!(
        server.url(),
        format!("rediss://127.0.0.1:{}/", server.port())
    );
    assert_eq!(server.redis_cli(&["SET", "k", "v"])?, "OK");
    assert_eq!(server.redis_cli(&["GET", "k"])?, "v");
    assert_eq!(
        server.redis_cli(&["CONFIG", "GET", "tls-auth-clients"])?,
        "tls-auth-clients\nno"
    );
    // The port speaks TLS only: a plain PING never gets a PONG.
    let reply = plain_ping(&server)?;
    assert!(!reply.starts_with(b"+PONG"), "{reply:?}");
    Ok(())
}

#[test]
fn tls_redis_with_password_and_required_client_certs() -> TestResult {
    let certs = TestCerts::generate()?;
    let server = RedisServer::start_with(
        RedisOptions::default()
            .password("s3cret")
            .tls(certs.server().client_auth(ClientAuth::Required)),
    )?;
    assert_eq!(
        server.url(),
        format!("rediss://:s3cret@127.0.0.1:{}/", server.port())
    );
    assert_eq!(
        server.redis_cli(&["CONFIG", "GET", "tls-auth-clients"])?,
        "tls-auth-clients\nyes"
    );
    assert_eq!(server.redis_cli(&["PING"])?, "PONG");
    Ok(())
}

#[test]
fn tls_redis_restarts_with_its_certificates() -> TestResult {
    let certs = TestCerts::generate()?;
    let mut server = RedisServer::start_with(RedisOptions::default().tls(certs.server()))?;
    drop(certs);
    server.restart()?;
    assert_eq!(server.redis_cli(&["PING"])?, "PONG");
    Ok(())
}

#[test]
fn untrusted_server_is_commanded_with_its_own_ca() -> TestResult {
    let certs = TestCerts::generate()?;
    let server = RedisServer::start_with(RedisOptions::default().tls(certs.untrusted_server()))?;
    assert_eq!(server.redis_cli(&["PING"])?, "PONG");
    Ok(())
}

#[test]
fn expired_server_starts_but_refuses_verifying_clients() -> TestResult {
    let certs = TestCerts::generate()?;
    let server = RedisServer::start_with(RedisOptions::default().tls(certs.expired_server()))?;
    assert!(server.log().contains("Ready to accept connections"));
    match server.redis_cli(&["PING"]) {
        Err(TestkitError::Resp { source, .. }) => {
            let text = source.to_string();
            assert!(text.contains("certificate expired"), "{text}");
        }
        other => panic!("expected a certificate error, got {other:?}"),
    }
    Ok(())
}
