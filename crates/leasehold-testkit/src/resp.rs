//! Sending one command to a test server with redis-rs's blocking client
//! (plain or TLS), and rendering the reply as [`Reply`].

use std::fmt;
use std::io;
use std::time::Duration;

use crate::Error;

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
    /// An error reply, e.g. `NOAUTH Authentication required.` (inside an
    /// array; an error reply to the command itself is
    /// [`Error::RedisReply`]).
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

impl From<redis::Value> for Reply {
    /// RESP2 values map one to one; RESP3-only ones to the closest RESP2
    /// shape (a map or set to a flat array, a double to a simple string, a
    /// boolean to 0 or 1, a verbatim string to a bulk string); anything
    /// else (a big number) to a simple string of its debug form.
    fn from(value: redis::Value) -> Self {
        use redis::Value;
        match value {
            Value::Nil => Reply::Nil,
            Value::Int(n) => Reply::Integer(n),
            Value::BulkString(bytes) => Reply::Bulk(bytes),
            Value::Array(items) | Value::Set(items) | Value::Push { data: items, .. } => {
                Reply::Array(items.into_iter().map(Reply::from).collect())
            }
            Value::SimpleString(text) => Reply::Simple(text),
            Value::Okay => Reply::Simple("OK".to_owned()),
            Value::Map(pairs) => Reply::Array(
                pairs
                    .into_iter()
                    .flat_map(|(key, value)| [Reply::from(key), Reply::from(value)])
                    .collect(),
            ),
            Value::Attribute { data, .. } => Reply::from(*data),
            Value::Double(number) => Reply::Simple(number.to_string()),
            Value::Boolean(flag) => Reply::Integer(i64::from(flag)),
            Value::VerbatimString { text, .. } => Reply::Bulk(text.into_bytes()),
            Value::ServerError(err) => Reply::Error(match err.details() {
                Some(details) => format!("{} {details}", err.code()),
                None => err.code().to_owned(),
            }),
            other => Reply::Simple(format!("{other:?}")),
        }
    }
}

/// Connects with `client` (within `timeout`; every read and write is bounded
/// by it too), sends `args` and returns the reply. An error reply becomes
/// [`Error::RedisReply`]; anything else that fails (connect, TLS, I/O,
/// authentication), [`Error::Resp`] naming `addr`.
pub(crate) fn run_command(
    client: &redis::Client,
    addr: &str,
    args: &[&str],
    timeout: Duration,
) -> Result<Reply, Error> {
    let failed = |source: redis::RedisError| Error::Resp {
        addr: addr.to_owned(),
        source: io::Error::other(source),
    };
    let mut conn = client
        .get_connection_with_timeout(timeout)
        .map_err(failed)?;
    conn.set_read_timeout(Some(timeout)).map_err(failed)?;
    conn.set_write_timeout(Some(timeout)).map_err(failed)?;
    let Some((name, rest)) = args.split_first() else {
        return Err(Error::RedisReply {
            message: "ERR empty command".to_owned(),
        });
    };
    let mut command = redis::cmd(name);
    command.arg(rest);
    match command.query::<redis::Value>(&mut conn) {
        Ok(value) => Ok(Reply::from(value)),
        Err(err) => match err.code() {
            Some(code) => Err(Error::RedisReply {
                message: match err.detail() {
                    Some(detail) => format!("{code} {detail}"),
                    None => code.to_owned(),
                },
            }),
            None => Err(failed(err)),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::Value;

    #[test]
    fn converts_values() {
        assert_eq!(Reply::from(Value::Okay), Reply::Simple("OK".into()));
        assert_eq!(
            Reply::from(Value::SimpleString("PONG".into())),
            Reply::Simple("PONG".into())
        );
        assert_eq!(Reply::from(Value::Int(-42)), Reply::Integer(-42));
        assert_eq!(Reply::from(Value::Nil), Reply::Nil);
        assert_eq!(
            Reply::from(Value::Array(vec![
                Value::BulkString(b"a".to_vec()),
                Value::Int(1),
                Value::Array(vec![]),
            ])),
            Reply::Array(vec![
                Reply::Bulk(b"a".to_vec()),
                Reply::Integer(1),
                Reply::Array(vec![])
            ])
        );
        assert_eq!(
            Reply::from(Value::Map(vec![(
                Value::SimpleString("k".into()),
                Value::Boolean(true)
            )])),
            Reply::Array(vec![Reply::Simple("k".into()), Reply::Integer(1)])
        );
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
