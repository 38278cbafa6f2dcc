//! Talking to a server: one command at a time on a new connection (over
//! TLS for a TLS server), its ACL users and its `ACL LOG`.

use std::time::Duration;

use super::RedisServer;
use crate::Error;
use crate::resp::{self, Reply};

/// How long [`RedisServer::redis_cli`] waits for a connection or a reply.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

/// One entry of a server's `ACL LOG` ([`RedisServer::acl_log`]): something
/// its ACL refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AclRefusal {
    /// Why: `command`, `key`, `channel` or `auth`.
    pub reason: String,
    /// What was refused: the command (e.g. `set`, `client|kill`), the key
    /// or channel; for `auth`, the user name tried.
    pub object: String,
    /// The user refused.
    pub username: String,
    /// How many times in a row (Redis merges repeats into one entry).
    pub count: i64,
}

impl AclRefusal {
    /// From `ACL LOG`'s name/value pairs.
    fn from_fields(fields: &[Reply]) -> AclRefusal {
        let field = |name: &str| {
            fields
                .chunks(2)
                .find(|pair| matches!(&pair[0], Reply::Bulk(key) if key == name.as_bytes()))
                .and_then(|pair| pair.get(1))
        };
        let text = |name: &str| field(name).map(Reply::to_string).unwrap_or_default();
        AclRefusal {
            reason: text("reason"),
            object: text("object"),
            username: text("username"),
            count: match field("count") {
                Some(Reply::Integer(count)) => *count,
                _ => 1,
            },
        }
    }
}

impl RedisServer {
    /// Runs one command, authenticating first if a password is set, and
    /// returns the reply rendered as text (see [`Reply`]'s `Display`).
    ///
    /// Uses redis-rs's blocking client on a new connection (over TLS for a
    /// [TLS server](super::RedisOptions::tls)); `redis-cli` is not needed.
    ///
    /// ```no_run
    /// # let server = leasehold_testkit::RedisServer::start()?;
    /// assert_eq!(server.redis_cli(&["SET", "k", "v"])?, "OK");
    /// assert_eq!(server.redis_cli(&["GET", "k"])?, "v");
    /// # Ok::<(), leasehold_testkit::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::RedisReply`] if the server answers with an error,
    /// [`Error::Resp`] on I/O, TLS or authentication failure or a 5 s
    /// timeout (e.g. while paused).
    pub fn redis_cli(&self, args: &[&str]) -> Result<String, Error> {
        self.command(args).map(|reply| reply.to_string())
    }

    /// Like [`redis_cli`](Self::redis_cli), but returns the parsed reply.
    ///
    /// # Errors
    ///
    /// As for [`redis_cli`](Self::redis_cli).
    pub fn command(&self, args: &[&str]) -> Result<Reply, Error> {
        self.ensure_running()?;
        resp::run_command(
            &self.client()?,
            &self.addr().to_string(),
            args,
            COMMAND_TIMEOUT,
        )
    }

    /// Makes the ACL user `user` with `password` and exactly `rules` (an
    /// existing user of that name is reset first): `ACL SETUSER user reset
    /// on >password rules...`.
    ///
    /// ```no_run
    /// # let server = leasehold_testkit::RedisServer::start()?;
    /// server.set_acl_user("locker", "pw", &["~lock:*", "+set", "+evalsha"])?;
    /// # Ok::<(), leasehold_testkit::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As for [`command`](Self::command) (a rule Redis does not know is
    /// [`Error::RedisReply`]).
    pub fn set_acl_user(&self, user: &str, password: &str, rules: &[&str]) -> Result<(), Error> {
        let secret = format!(">{password}");
        let mut args = vec!["ACL", "SETUSER", user, "reset", "on", secret.as_str()];
        args.extend_from_slice(rules);
        self.command(&args).map(drop)
    }

    /// What the server's ACL refused so far, newest first (`ACL LOG`).
    ///
    /// # Errors
    ///
    /// As for [`command`](Self::command).
    pub fn acl_log(&self) -> Result<Vec<AclRefusal>, Error> {
        let Reply::Array(entries) = self.command(&["ACL", "LOG"])? else {
            return Ok(Vec::new());
        };
        Ok(entries
            .iter()
            .filter_map(|entry| match entry {
                Reply::Array(fields) => Some(AclRefusal::from_fields(fields)),
                _ => None,
            })
            .collect())
    }

    /// A redis-rs client for this server: its URL, and for a TLS server
    /// the certificates of its [`ServerTls`].
    pub(super) fn client(&self) -> Result<redis::Client, Error> {
        let built = match &self.options.tls {
            None => redis::Client::open(self.url()),
            Some(tls) => redis::Client::build_with_tls(self.url(), tls.client_certificates()),
        };
        built.map_err(|source| Error::Resp {
            addr: self.addr().to_string(),
            source: std::io::Error::other(source),
        })
    }
}
