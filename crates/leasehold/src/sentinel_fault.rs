//! How a failed resolution through Redis Sentinel travels as a redis-rs
//! error to [`Error::from_redis`](crate::Error), which types it. Kept apart
//! from `sentinel` so that the error type does not depend on it. Without
//! the `sentinel` feature nothing makes these errors; the error type still
//! knows them.
#![cfg_attr(not(feature = "sentinel"), allow(dead_code))]

use std::fmt;
use std::io;
use std::sync::Arc;

use redis::{ErrorKind, RedisError};

/// A resolution that failed for a reason that may pass, carried inside an
/// I/O error so that the connection retries it like an unreachable server
/// (and a request that met it is known never to have been sent).
#[derive(Debug)]
pub(crate) struct SentinelFault {
    pub(crate) kind: Fault,
    pub(crate) master: String,
}

/// Which fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// No sentinel answered.
    NoSentinel,
    /// The sentinels named no node that answers as primary.
    NoPrimary,
}

impl SentinelFault {
    /// The redis-rs error that carries `kind` for `master`.
    pub(crate) fn error(kind: Fault, master: &str) -> RedisError {
        RedisError::from(io::Error::new(
            io::ErrorKind::NotConnected,
            SentinelFault {
                kind,
                master: master.to_owned(),
            },
        ))
    }

    /// The fault `err` carries, if it is one.
    pub(crate) fn of(err: &RedisError) -> Option<&SentinelFault> {
        type Shared = Arc<dyn std::error::Error + Send + Sync>;
        let source = std::error::Error::source(err)?;
        let io = source.downcast_ref::<io::Error>().or_else(|| {
            source
                .downcast_ref::<Shared>()
                .and_then(|shared| shared.downcast_ref::<io::Error>())
        })?;
        io.get_ref()?.downcast_ref::<SentinelFault>()
    }
}

impl fmt::Display for SentinelFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            Fault::NoSentinel => write!(f, "no sentinel answered about {:?}", self.master),
            Fault::NoPrimary => write!(
                f,
                "the sentinels name no primary of {:?} that answers as one",
                self.master
            ),
        }
    }
}

impl std::error::Error for SentinelFault {}

/// The error for a master name no sentinel knows: not an I/O error, so the
/// connection tries again only after a backoff, as for refused
/// credentials.
pub(crate) fn unknown_master(master: &str) -> RedisError {
    RedisError::from((
        ErrorKind::MasterNameNotFoundBySentinel,
        "no sentinel knows the master name",
        master.to_owned(),
    ))
}

/// The master name of an [`unknown_master`] error.
pub(crate) fn unknown_master_name(err: &RedisError) -> Option<&str> {
    (err.kind() == ErrorKind::MasterNameNotFoundBySentinel)
        .then(|| err.detail().unwrap_or_default())
}
