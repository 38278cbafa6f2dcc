//! A tiny blocking RESP2 client, just enough to send commands to a test
//! server and render the replies.

use std::fmt;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::Error;

/// Bulk strings and arrays larger than this are rejected rather than
/// allocated.
const MAX_LEN: usize = 512 * 1024 * 1024;

/// Arrays nested deeper than this are rejected.
const MAX_DEPTH: usize = 32;

/// A redis reply.
///
/// Its [`Display`](fmt::Display) rendering resembles `redis-cli`'s
/// non-interactive output: strings and integers as they are, a nil reply as
/// `(nil)`, array elements one per line.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reply {
    /// A simple string, e.g. `OK` or `PONG`.
    Simple(String),
    /// An error reply, e.g. `NOAUTH Authentication required.`.
    Error(String),
    /// An integer.
    Integer(i64),
    /// A bulk string.
    Bulk(Vec<u8>),
    /// A nil bulk string or nil array.
    Nil,
    /// An array.
    Array(Vec<Reply>),
}

impl fmt::Display for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reply::Simple(text) => f.write_str(text),
            Reply::Error(text) => write!(f, "(error) {text}"),
            Reply::Integer(n) => write!(f, "{n}"),
            Reply::Bulk(bytes) => f.write_str(&String::from_utf8_lossy(bytes)),
            Reply::Nil => f.write_str("(nil)"),
            Reply::Array(items) if items.is_empty() => f.write_str("(empty array)"),
            Reply::Array(items) => {
                for (index, item) in items.iter().enumerate() {
                    if index > 0 {
                        f.write_str("\n")?;
                    }
                    write!(f, "{item}")?;
                }
                Ok(())
            }
        }
    }
}

/// A blocking connection speaking RESP2.
#[derive(Debug)]
pub(crate) struct Connection {
    reader: BufReader<TcpStream>,
}

impl Connection {
    /// Connects to `addr`; every read and write times out after `timeout`.
    pub(crate) fn connect(addr: SocketAddr, timeout: Duration) -> io::Result<Self> {
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        stream.set_nodelay(true)?;
        Ok(Self {
            reader: BufReader::new(stream),
        })
    }

    /// Sends one command and reads its reply (error replies are returned as
    /// [`Reply::Error`], not as `Err`).
    pub(crate) fn command<A: AsRef<[u8]>>(&mut self, args: &[A]) -> io::Result<Reply> {
        self.reader.get_mut().write_all(&encode(args))?;
        read_reply(&mut self.reader)
    }
}

/// Encodes a command as a RESP array of bulk strings.
pub(crate) fn encode<A: AsRef<[u8]>>(args: &[A]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        let arg = arg.as_ref();
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Reads one reply.
pub(crate) fn read_reply(reader: &mut impl BufRead) -> io::Result<Reply> {
    read_reply_at(reader, 0)
}

fn read_reply_at(reader: &mut impl BufRead, depth: usize) -> io::Result<Reply> {
    let line = read_line(reader)?;
    let (kind, rest) = line.split_at_checked(1).unwrap_or(("", ""));
    match kind {
        "+" => Ok(Reply::Simple(rest.to_owned())),
        "-" => Ok(Reply::Error(rest.to_owned())),
        ":" => Ok(Reply::Integer(parse_int(rest)?)),
        "_" => Ok(Reply::Nil),
        "$" => match length(rest)? {
            None => Ok(Reply::Nil),
            Some(len) => {
                let mut bytes = vec![0; len + 2];
                reader.read_exact(&mut bytes)?;
                if !bytes.ends_with(b"\r\n") {
                    return Err(protocol("bulk string not terminated by CRLF"));
                }
                bytes.truncate(len);
                Ok(Reply::Bulk(bytes))
            }
        },
        "*" => match length(rest)? {
            None => Ok(Reply::Nil),
            Some(_) if depth >= MAX_DEPTH => Err(protocol("arrays nested too deeply")),
            Some(len) => (0..len)
                .map(|_| read_reply_at(reader, depth + 1))
                .collect::<io::Result<_>>()
                .map(Reply::Array),
        },
        _ => Err(protocol("unknown reply type")),
    }
}

fn read_line(reader: &mut impl BufRead) -> io::Result<String> {
    let mut line = Vec::new();
    let read = reader.read_until(b'\n', &mut line)?;
    if read == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed before a reply",
        ));
    }
    if !line.ends_with(b"\r\n") {
        return Err(protocol("reply line not terminated by CRLF"));
    }
    line.truncate(line.len() - 2);
    String::from_utf8(line).map_err(|_| protocol("reply line is not UTF-8"))
}

fn parse_int(text: &str) -> io::Result<i64> {
    text.parse().map_err(|_| protocol("invalid integer"))
}

/// Parses a bulk or array length; `-1` means nil.
fn length(text: &str) -> io::Result<Option<usize>> {
    match parse_int(text)? {
        -1 => Ok(None),
        n => usize::try_from(n)
            .ok()
            .filter(|&len| len <= MAX_LEN)
            .map(Some)
            .ok_or_else(|| protocol("invalid length")),
    }
}

fn protocol(message: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

/// Connects to `addr`, authenticates if `password` is set, sends `args` and
/// returns the reply; error replies become [`Error::RedisReply`].
pub(crate) fn run_command<A: AsRef<[u8]>>(
    addr: SocketAddr,
    password: Option<&str>,
    args: &[A],
    timeout: Duration,
) -> Result<Reply, Error> {
    let io_err = |source| Error::Resp {
        addr: addr.to_string(),
        source,
    };
    let mut conn = Connection::connect(addr, timeout).map_err(io_err)?;
    if let Some(password) = password {
        check(conn.command(&["AUTH", password]).map_err(io_err)?)?;
    }
    check(conn.command(args).map_err(io_err)?)
}

fn check(reply: Reply) -> Result<Reply, Error> {
    match reply {
        Reply::Error(message) => Err(Error::RedisReply { message }),
        other => Ok(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8]) -> io::Result<Reply> {
        read_reply(&mut &bytes[..])
    }

    #[test]
    fn encodes_bulk_array() {
        assert_eq!(encode(&["PING"]), b"*1\r\n$4\r\nPING\r\n");
        assert_eq!(
            encode(&["SET", "k", ""]),
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n"
        );
    }

    #[test]
    fn parses_replies() -> io::Result<()> {
        assert_eq!(parse(b"+PONG\r\n")?, Reply::Simple("PONG".into()));
        assert_eq!(parse(b"-ERR bad\r\n")?, Reply::Error("ERR bad".into()));
        assert_eq!(parse(b":-42\r\n")?, Reply::Integer(-42));
        assert_eq!(parse(b"$-1\r\n")?, Reply::Nil);
        assert_eq!(
            parse(b"$5\r\nhe\r\no\r\n")?,
            Reply::Bulk(b"he\r\no".to_vec())
        );
        assert_eq!(
            parse(b"*3\r\n$1\r\na\r\n:1\r\n*0\r\n")?,
            Reply::Array(vec![
                Reply::Bulk(b"a".to_vec()),
                Reply::Integer(1),
                Reply::Array(vec![])
            ])
        );
        Ok(())
    }

    #[test]
    fn rejects_malformed_replies() {
        assert!(parse(b"").is_err());
        assert!(parse(b"+PONG\n").is_err());
        assert!(parse(b"?x\r\n").is_err());
        assert!(parse(b"$3\r\nabcd\r\n").is_err());
        assert!(parse(b"$-2\r\n").is_err());
        assert!(parse(b":x\r\n").is_err());
    }

    #[test]
    fn renders_like_redis_cli() {
        let reply = Reply::Array(vec![
            Reply::Bulk(b"a".to_vec()),
            Reply::Integer(7),
            Reply::Nil,
        ]);
        assert_eq!(reply.to_string(), "a\n7\n(nil)");
        assert_eq!(Reply::Array(vec![]).to_string(), "(empty array)");
        assert_eq!(Reply::Simple("OK".into()).to_string(), "OK");
    }
}
