//! [`Endpoint`]: where a locker finds its Redis, a server's client or a
//! primary found through Sentinel.

use std::fmt;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisResult};

#[cfg(feature = "sentinel")]
use crate::sentinel::Sentinel;

/// Where [`Locker::connect`](crate::Locker::connect),
/// [`HandoffLocker::connect`](crate::HandoffLocker::connect) and their
/// builders' `connect` open their connections: one server
/// (`&redis::Client`, its URL and TLS settings) or, with the `sentinel`
/// feature, the primary of a master name found through Redis Sentinel
/// (`&Sentinel`), resolved again on every reconnect.
///
/// You rarely name it: `connect` takes anything that converts into it, so
/// `Locker::connect(&client)` and `Locker::connect(&sentinel)` both work.
/// Its `Debug` output never shows a URL or a password.
#[derive(Clone)]
pub struct Endpoint {
    kind: Kind,
}

#[derive(Clone)]
enum Kind {
    Server(Box<redis::Client>),
    #[cfg(feature = "sentinel")]
    Sentinel(Sentinel),
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Server(client) => f
                .debug_struct("Endpoint::Server")
                .field("db", &client.get_connection_info().redis_settings().db())
                .finish_non_exhaustive(),
            #[cfg(feature = "sentinel")]
            Kind::Sentinel(sentinel) => {
                f.debug_tuple("Endpoint::Sentinel").field(sentinel).finish()
            }
        }
    }
}

impl From<&redis::Client> for Endpoint {
    fn from(client: &redis::Client) -> Self {
        Endpoint {
            kind: Kind::Server(Box::new(client.clone())),
        }
    }
}

impl From<redis::Client> for Endpoint {
    fn from(client: redis::Client) -> Self {
        Endpoint {
            kind: Kind::Server(Box::new(client)),
        }
    }
}

#[cfg(feature = "sentinel")]
impl From<&Sentinel> for Endpoint {
    fn from(sentinel: &Sentinel) -> Self {
        Endpoint {
            kind: Kind::Sentinel(sentinel.clone()),
        }
    }
}

#[cfg(feature = "sentinel")]
impl From<Sentinel> for Endpoint {
    fn from(sentinel: Sentinel) -> Self {
        Endpoint {
            kind: Kind::Sentinel(sentinel),
        }
    }
}

impl Endpoint {
    /// Opens a connection with `config`: to the server (without its
    /// response timeout), or to the primary the sentinels name now
    /// (checked with `ROLE`).
    /// Through Sentinel, also the primary's address.
    pub(crate) async fn open(
        &self,
        config: &AsyncConnectionConfig,
    ) -> RedisResult<(MultiplexedConnection, Option<(String, u16)>)> {
        match &self.kind {
            // No response timer of redis-rs's on the connection itself:
            // `Connection` sets one on the clone for each request of the
            // user's, and bounds its own by their deadlines.
            Kind::Server(client) => client
                .get_multiplexed_async_connection_with_config(
                    &config.clone().set_response_timeout(None),
                )
                .await
                .map(|conn| (conn, None)),
            #[cfg(feature = "sentinel")]
            // Boxed: redis-rs's resolution is a deep future, and callers'
            // futures nest it.
            Kind::Sentinel(sentinel) => Box::pin(sentinel.primary(config)).await,
        }
    }

    /// A client for the server, or for the primary the sentinels name now.
    #[cfg(feature = "handoff")]
    pub(crate) async fn client(
        &self,
        config: &AsyncConnectionConfig,
    ) -> RedisResult<redis::Client> {
        match &self.kind {
            Kind::Server(client) => {
                let _ = config;
                Ok(redis::Client::clone(client))
            }
            #[cfg(feature = "sentinel")]
            Kind::Sentinel(sentinel) => Box::pin(sentinel.client(config)).await,
        }
    }

    /// Whether the sentinels name a primary other than `addr` now. `false`
    /// when they cannot tell (none answers): the connection is kept.
    pub(crate) async fn moved(&self, addr: &(String, u16), config: &AsyncConnectionConfig) -> bool {
        match &self.kind {
            Kind::Server(_) => {
                let _ = (addr, config);
                false
            }
            #[cfg(feature = "sentinel")]
            Kind::Sentinel(sentinel) => Box::pin(sentinel.moved(addr, config)).await,
        }
    }

    /// The database selected on every connection.
    pub(crate) fn db(&self) -> i64 {
        match &self.kind {
            Kind::Server(client) => client.get_connection_info().redis_settings().db(),
            #[cfg(feature = "sentinel")]
            Kind::Sentinel(sentinel) => sentinel.db(),
        }
    }

    /// The server's client, for an endpoint that is one server.
    #[cfg(feature = "tls")]
    pub(crate) fn server(&self) -> Option<&redis::Client> {
        match &self.kind {
            Kind::Server(client) => Some(client),
            #[cfg(feature = "sentinel")]
            Kind::Sentinel(_) => None,
        }
    }

    /// Whether a `READONLY` reply means the primary moved, so the
    /// connection should resolve it again (Sentinel).
    pub(crate) fn follows_primary(&self) -> bool {
        !matches!(self.kind, Kind::Server(_))
    }
}
