//! A few requests to an etcd member's HTTP/JSON gateway (grpc-gateway, in
//! every etcd since 3.3 under `/v3/`), enough for a test's own reads and
//! writes and for the cluster's status.
//!
//! A plain HTTP/1.0 request over a std `TcpStream`, so the reply is never
//! chunked and ends when the member closes the connection: no HTTP or gRPC
//! client crate, no JSON crate. The gateway renders 64-bit integers as
//! JSON strings and bytes as base64, which is all the reading done here.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::Error;

/// Sends `POST path` with a JSON `body` to the member at `addr` and
/// returns the reply's body; the whole exchange is bounded by `timeout`.
pub(super) fn post(
    addr: SocketAddr,
    path: &str,
    body: &str,
    timeout: Duration,
) -> Result<String, Error> {
    request(addr, "POST", path, body, timeout)
}

/// Sends `GET path` to the member at `addr`, as [`post`].
pub(super) fn get(addr: SocketAddr, path: &str, timeout: Duration) -> Result<String, Error> {
    request(addr, "GET", path, "", timeout)
}

fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    timeout: Duration,
) -> Result<String, Error> {
    let url = format!("http://{addr}{path}");
    let failed = |source| Error::EtcdRequest {
        url: url.clone(),
        source,
    };
    let deadline = Instant::now() + timeout;
    let mut stream = TcpStream::connect_timeout(&addr, timeout).map_err(failed)?;
    let head = format!(
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    );
    remaining(deadline)
        .and_then(|left| stream.set_write_timeout(Some(left)))
        .and_then(|()| stream.write_all(head.as_bytes()))
        .and_then(|()| stream.write_all(body.as_bytes()))
        .map_err(failed)?;
    let mut reply = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let read = remaining(deadline)
            .and_then(|left| stream.set_read_timeout(Some(left)))
            .and_then(|()| stream.read(&mut chunk))
            .map_err(|err| match err.kind() {
                // What a socket's read timeout reports.
                io::ErrorKind::WouldBlock => timed_out(),
                _ => err,
            })
            .map_err(failed)?;
        if read == 0 {
            break;
        }
        reply.extend_from_slice(&chunk[..read]);
    }
    let reply = String::from_utf8_lossy(&reply);
    let (head, body) = reply
        .split_once("\r\n\r\n")
        .ok_or_else(|| failed(malformed("no end of the header")))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| failed(malformed("no status line")))?;
    if status == 200 {
        Ok(body.to_owned())
    } else {
        Err(Error::EtcdReply {
            url,
            status,
            body: body.trim().to_owned(),
        })
    }
}

/// What is left of the exchange's time; a timeout error once it is over.
fn remaining(deadline: Instant) -> io::Result<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|left| !left.is_zero())
        .ok_or_else(timed_out)
}

fn timed_out() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "no reply in time")
}

fn malformed(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("not an HTTP reply: {what}"),
    )
}

/// The string value of the first `"name":"..."` in `json` (the gateway's
/// compact output; 64-bit integers are strings there). Values with escapes
/// are not needed: IDs, numbers and base64 have none.
pub(super) fn string_field<'a>(json: &'a str, name: &str) -> Option<&'a str> {
    let start = json.find(&format!("\"{name}\":\""))? + name.len() + 4;
    let len = json[start..].find('"')?;
    Some(&json[start..start + len])
}

/// The first `"name":"<integer>"` of `json`, parsed; `None` when absent
/// (the gateway leaves zero values out).
pub(super) fn integer_field<T: std::str::FromStr>(json: &str, name: &str) -> Option<T> {
    string_field(json, name)?.parse().ok()
}

/// A reply's body or error rendered as an `io::Error` for
/// [`Error::EtcdRequest`], when it is well-formed HTTP but not what was
/// asked for.
pub(super) fn unexpected(addr: SocketAddr, path: &str, body: &str) -> Error {
    Error::EtcdRequest {
        url: format!("http://{addr}{path}"),
        source: io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unexpected reply: {}", body.trim()),
        ),
    }
}

const BASE64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding, as the gateway wants `bytes` fields.
pub(super) fn base64_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for group in bytes.chunks(3) {
        let n = group
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= group.len() {
                out.push(char::from(BASE64[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Decodes standard base64 (padding optional); `None` if it is not.
pub(super) fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let digits = text.trim_end_matches('=').as_bytes();
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for group in digits.chunks(4) {
        if group.len() == 1 {
            return None;
        }
        let mut n = 0u32;
        for (i, &digit) in group.iter().enumerate() {
            let value = BASE64.iter().position(|&c| c == digit)?;
            n |= u32::try_from(value).ok()? << (18 - 6 * i);
        }
        for i in 0..group.len() - 1 {
            out.push(n.to_be_bytes()[1 + i]);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips() {
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64_encode(plain.as_bytes()), encoded);
            assert_eq!(base64_decode(encoded).as_deref(), Some(plain.as_bytes()));
        }
        assert_eq!(base64_decode("Z"), None);
        assert_eq!(base64_decode("Z!=="), None);
    }

    #[test]
    fn fields_are_read_from_compact_json() {
        let json = r#"{"header":{"member_id":"78","revision":"2"},"leader":"11","raftTerm":"2"}"#;
        assert_eq!(string_field(json, "member_id"), Some("78"));
        assert_eq!(integer_field::<u64>(json, "leader"), Some(11));
        assert_eq!(integer_field::<u64>(json, "raftIndex"), None);
    }
}
