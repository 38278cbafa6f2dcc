//! Helpers shared by the testkit's test files.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Sends a PostgreSQL `SSLRequest` on `stream` and returns the one-byte
/// answer (`N` or `S`); a backend must be forked to answer it.
pub(crate) fn ssl_request(stream: &mut TcpStream, timeout: Duration) -> io::Result<u8> {
    stream.set_read_timeout(Some(timeout))?;
    stream.write_all(&[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f])?;
    let mut answer = [0u8; 1];
    stream.read_exact(&mut answer)?;
    Ok(answer[0])
}
