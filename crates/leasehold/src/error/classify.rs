//! What a Redis client error means: the [`Error`] variant that names its
//! outcome (a wrong type, a refused password or command, a full server, a
//! sentinel fault, a TLS failure, a lost connection, ...), however Redis
//! or the client words it.

use super::Error;

impl Error {
    /// Maps a client error to the variant that names its outcome.
    pub(crate) fn from_redis(op: &'static str, key: &str, err: redis::RedisError) -> Error {
        use redis::ErrorKind;
        if let Some(name) = crate::sentinel_fault::unknown_master_name(&err) {
            return Error::UnknownMaster {
                name: name.to_owned(),
            };
        }
        if let Some(fault) = crate::sentinel_fault::SentinelFault::of(&err) {
            use crate::sentinel_fault::Fault;
            let master = fault.master.clone();
            return match fault.kind {
                Fault::NoSentinel => Error::SentinelUnreachable { op, master },
                Fault::NoPrimary => Error::NoPrimary { op, master },
            };
        }
        match err.code() {
            Some("WRONGTYPE") => {
                return Error::WrongType {
                    key: key.to_owned(),
                    source: err.into(),
                };
            }
            Some("NOAUTH" | "WRONGPASS") => return Error::Auth(err.into()),
            Some("OOM") => {
                if let Some(source) = std::error::Error::source(&err)
                    .and_then(|source| source.downcast_ref::<redis::ServerError>())
                {
                    return Error::OutOfMemory {
                        op,
                        source: source.clone(),
                    };
                }
            }
            Some("NOPERM") => {
                return Error::NoPermission {
                    op,
                    command: refused_command(err.detail().unwrap_or_default()),
                    source: err.into(),
                };
            }
            _ => {}
        }
        if is_refused_in_script(&err) {
            return Error::NoPermission {
                op,
                command: refused_command(err.detail().unwrap_or_default()),
                source: err.into(),
            };
        }
        if err.kind() == ErrorKind::AuthenticationFailed {
            return Error::Auth(err.into());
        }
        #[cfg(feature = "tls")]
        if let Some(failure) = crate::tls_failure::classify(&err) {
            use crate::tls_failure::TlsFailure;
            return match failure {
                TlsFailure::Certificate(problem) => Error::TlsCertificate {
                    op,
                    problem,
                    source: err.into(),
                },
                TlsFailure::NotTls => Error::NotTls {
                    op,
                    source: Some(err.into()),
                },
                TlsFailure::ClientCertRejected => Error::ClientCertRejected {
                    op,
                    source: err.into(),
                },
            };
        }
        if err.is_io_error() || err.is_connection_refusal() || err.is_connection_dropped() {
            return Error::Unreachable {
                op,
                source: err.into(),
            };
        }
        Error::Redis {
            op,
            source: err.into(),
        }
    }
}

/// Whether `err` is an ACL refusal that does not say `NOPERM` up front:
/// how Redis reports a command refused inside a script (7.0: "ERR The user
/// executing the script can't run this command or subcommand", 7.2 and
/// Valkey: "ERR ACL failure in script: ..."). Our scripts turn these into
/// `NOPERM` replies themselves (`scripts/prelude.lua`); this catches any
/// that get through.
fn is_refused_in_script(err: &redis::RedisError) -> bool {
    err.detail().is_some_and(|detail| {
        detail.contains("NOPERM")
            || detail.contains("ACL failure in script")
            || detail.contains("user executing the script can't")
    })
}

/// What a `NOPERM` reply names: `... run the 'set' command` gives `SET`;
/// `... one of the keys used as arguments of 'get'` (a refusal in one of
/// our scripts) gives `GET on one of its keys`, and without the command's
/// name `a command on one of its keys` (or channels).
fn refused_command(detail: &str) -> String {
    let quoted = |before: &str| {
        let rest = &detail[detail.find(before)? + before.len()..];
        Some(rest[..rest.find('\'')?].to_ascii_uppercase())
    };
    if let Some(command) = quoted("run the '") {
        return command;
    }
    let what = if detail.contains("channel") {
        "channels"
    } else if detail.contains("key") {
        "keys"
    } else {
        return "a command".to_owned();
    };
    match quoted("arguments of '") {
        Some(command) => format!("{command} on one of its {what}"),
        None => format!("a command on one of its {what}"),
    }
}

impl Error {
    /// A URL the client refused: [`Error::TlsNotEnabled`] when it asks for
    /// TLS and the client was built without it (redis-rs says so in its
    /// message only), [`Error::InvalidUrl`] otherwise.
    pub(crate) fn from_url(err: redis::RedisError) -> Error {
        if err.kind() == redis::ErrorKind::InvalidClientConfig
            && err.to_string().starts_with(TLS_NOT_BUILT)
        {
            return Error::TlsNotEnabled;
        }
        Error::InvalidUrl(err.into())
    }
}

/// How redis-rs built without TLS refuses a `rediss://` URL (its
/// `InvalidClientConfig` error's description; there is no kind of its own).
const TLS_NOT_BUILT: &str = "can't connect with TLS, the feature is not enabled";

#[cfg(test)]
mod tests {
    use super::*;

    /// The error redis-rs makes of the error reply `text`.
    fn server_error(text: &str) -> redis::RedisError {
        let reply = redis::parse_redis_value(format!("-{text}\r\n").as_bytes())
            .and_then(redis::Value::extract_error);
        match reply {
            Err(err) => err,
            Ok(value) => panic!("{text} parsed as {value:?}"),
        }
    }

    /// Every link of an error's chain, `Display`ed.
    fn chain(err: &Error) -> Vec<String> {
        let mut links = vec![err.to_string()];
        let mut source = std::error::Error::source(err);
        while let Some(inner) = source {
            links.push(inner.to_string());
            source = inner.source();
        }
        links
    }

    /// A script missing from the cache (a failover emptied it) ran
    /// nothing: a fault an acquire rides out.
    #[test]
    fn a_missing_script_is_retryable() {
        let err = Error::from_redis(
            "acquire",
            "lock:k",
            server_error("NOSCRIPT No matching script. Please use EVAL."),
        );
        assert!(err.is_retryable(), "{err:?}");
        assert!(crate::call::fault_may_pass(&err));
    }

    /// A server's reply or an I/O error appears once in an error's chain
    /// of sources (redis-rs gives it as its message and again as its
    /// source).
    #[test]
    fn an_error_chain_says_each_thing_once() {
        let replies = [
            "WRONGTYPE Operation against a key holding the wrong kind of value",
            "NOPERM this user has no permissions to run the 'set' command",
            "LOADING Redis is loading the dataset in memory",
            "READONLY You can't write against a read only replica.",
            "OOM command not allowed when used memory > 'maxmemory'.",
            "WRONGPASS invalid username-password pair or user is disabled.",
        ];
        let io =
            redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        let errors = replies
            .iter()
            .map(|text| Error::from_redis("acquire", "lock:k", server_error(text)))
            .chain([Error::from_redis("acquire", "lock:k", io)]);
        for err in errors {
            let links = chain(&err);
            assert!(links.len() >= 2, "{links:?}");
            for (i, link) in links.iter().enumerate().skip(1) {
                let said = &link[link.find(' ').map_or(0, |at| at + 1)..];
                for earlier in &links[1..i] {
                    assert!(!earlier.contains(said), "said twice: {links:?}");
                }
            }
        }
    }

    /// What a cluster client returns when a slot moves under a request:
    /// Redis ran nothing, and the slot settles, so every caller retries it
    /// within its deadline. `MOVED` reaches us when the nodes disagree on
    /// the owner for a moment (the source already points at the target,
    /// the target still imports and points back) and the client stops
    /// following the redirects.
    #[test]
    fn a_moving_slot_is_a_fault_that_may_pass() {
        for reply in [
            "MOVED 5904 127.0.0.1:30002",
            "ASK 5904 127.0.0.1:30002",
            "TRYAGAIN Multiple keys request during rehashing of slot",
            "CLUSTERDOWN The cluster is down",
        ] {
            let err = Error::from_redis("acquire", "k", server_error(reply));
            assert!(matches!(err, Error::Redis { .. }), "{reply}: {err:?}");
            assert!(err.is_retryable(), "{reply}");
            assert!(crate::call::fault_may_pass(&err), "{reply}");
        }
    }

    #[test]
    fn a_refused_command_is_named_however_redis_words_it() {
        let cases = [
            // Sent directly (Redis 7.0, 7.2).
            (
                "NOPERM this user has no permissions to run the 'set' command",
                "SET",
            ),
            (
                "NOPERM User locker has no permissions to run the 'script|load' command",
                "SCRIPT|LOAD",
            ),
            (
                "NOPERM this user has no permissions to access one of the keys used as arguments",
                "a command on one of its keys",
            ),
            (
                "NOPERM No permissions to access a key",
                "a command on one of its keys",
            ),
            // From our scripts (scripts/prelude.lua).
            (
                "NOPERM this user has no permissions to run the 'incr' command script: 1de7, on @user_script:40.",
                "INCR",
            ),
            (
                "NOPERM this user has no permissions to access one of the channels used as arguments of 'publish'",
                "PUBLISH on one of its channels",
            ),
            // Inside a script, not reworded (Redis 7.0, then 7.2).
            (
                "ERR The user executing the script can't run this command or subcommand script: 6163, on @user_script:1.",
                "a command",
            ),
            (
                "ERR ACL failure in script: User locker has no permissions to run the 'get' command script: 8a2f, on @user_script:4.",
                "GET",
            ),
        ];
        for (reply, named) in cases {
            let err = Error::from_redis("acquire", "k", server_error(reply));
            match &err {
                Error::NoPermission { op, command, .. } => {
                    assert_eq!((*op, command.as_str()), ("acquire", named), "{reply}");
                }
                other => panic!("{reply}: {other:?}"),
            }
            assert!(!err.is_retryable(), "{reply}");
        }
    }

    /// What redis-rs built without TLS says of a `rediss://` URL (it is
    /// built with TLS here, so the error is made as it makes it) is
    /// `TlsNotEnabled`, naming the feature; any other refused URL stays
    /// `InvalidUrl`; neither quotes the URL.
    #[test]
    fn a_url_asking_for_tls_the_build_lacks_names_the_feature() {
        let err = Error::from_url(redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            TLS_NOT_BUILT,
        )));
        assert!(matches!(err, Error::TlsNotEnabled), "{err:?}");
        assert!(err.to_string().contains("tls feature"), "{err}");
        let err = Error::from_url(redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "Invalid database number",
        )));
        assert!(matches!(err, Error::InvalidUrl(_)), "{err:?}");
        let parsed = redis::IntoConnectionInfo::into_connection_info("redis://:secret@h:6379/x");
        let err = Error::from_url(parsed.expect_err("bad database"));
        assert!(matches!(err, Error::InvalidUrl(_)), "{err:?}");
        assert!(!format!("{err:?} {err}").contains("secret"));
    }
}
