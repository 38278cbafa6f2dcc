//! Redis Sentinel: [`Sentinel`], a primary found through sentinels and
//! followed across failovers.
//!
//! # How a locker follows the primary
//!
//! A locker (or hand-off locker) connected through a [`Sentinel`] never
//! keeps an address. Every time its [`Connection`](crate::Connection)
//! (re)connects, and every time a hand-off locker's pub/sub connection
//! resubscribes, it asks the sentinels for the primary of the master name
//! (redis-rs's `SentinelClient`, which asks the sentinels in turn and
//! checks with `ROLE` that the node they name is a primary), connects, and
//! checks `ROLE` again on the connection it will use, so a node demoted in
//! between is never used as a primary.
//!
//! A failover reaches the locker in one of four ways, all of which end in
//! a new resolution:
//!
//! - Sentinel closes the clients of the old primary when it demotes it
//!   (and of the replica it promotes): the next request finds its
//!   connection dropped.
//! - The old primary is killed or unreachable: the connection drops or
//!   times out.
//! - A request reaches a node that is no longer primary: it answers
//!   `READONLY` (the write was refused, nothing changed). The connection
//!   treats that reply as a sign to reconnect and resolve again.
//! - The sentinels name another primary while the old one still answers
//!   as one. Sentinel promotes the replica first and demotes the old
//!   primary only later (seconds later on Redis 7.0, even for a
//!   `SENTINEL FAILOVER`, which does not pause the old primary's
//!   writes). So while requests flow, the connection asks the sentinels
//!   in the background, at most every 500 ms, whether the primary moved,
//!   and reconnects when it did. A request never waits for that check.
//!
//! Each of these is a fault that may pass ([`Error::is_retryable`]): an
//! acquire retries it until its deadline like a busy lock, and release and
//! refresh retry it while the lease is valid. While the failover runs,
//! the sentinels may name no primary that answers as one
//! ([`Error::NoPrimary`], retryable too). So a caller whose wait outlasts
//! the failover gets its lease from the new primary and no error
//! (`tests/sentinel.rs` checks this through a `SENTINEL FAILOVER`, a
//! killed primary and a paused one, which only the background check of
//! the sentinels gets the locker away from).
//!
//! # What a failover does to safety
//!
//! Redis replicates asynchronously, and for a moment a failover has two
//! primaries. A lock the old primary acknowledged may not have reached
//! the replica that Sentinel promotes, and between the promotion and the
//! old primary's demotion (or our noticing the switch: up to 500 ms plus
//! the sentinels' own lag) the old primary keeps granting locks and fence
//! tokens that the new one never sees. The new primary then grants the
//! same lock to a second holder while the first still believes it holds
//! it, and issues fencing tokens the old one already issued. This happens
//! with a coordinated `SENTINEL FAILOVER` too, not only with a killed
//! primary: in each of three runs of `tests/sentinel.rs` on Redis 7.0,
//! one fence was not above its predecessor among the back-to-back
//! acquires (26 to 203 of them) through one `SENTINEL FAILOVER` (in the
//! run that timed them, the longest acquire took 0.34 s).
//!
//! [`AcquireOptions::wait_replicas`](crate::AcquireOptions::wait_replicas)
//! narrows the window: a lease is used only once a replica has it, and
//! the old primary, whose replica was promoted, has none left, so it
//! grants nothing usable after the promotion (in the same test, no fence
//! went back with `wait_replicas(1)`). It does not close the window (a
//! replica that acknowledged can still be the one that is not promoted,
//! or lose the write on restart), and it makes acquires fail with
//! [`Error::NotReplicated`] until the new primary has a replica again.
//! So under Sentinel a lease is still an efficiency lock: what keeps the
//! data right is the database check (the `leasehold-pg` fence guard),
//! which refuses the stale holder's write and heals the fence counter.
//!
//! # Errors
//!
//! - [`Error::UnknownMaster`]: every sentinel that answered knows no master
//!   by that name (a typo, or a sentinel set monitoring something else).
//!   Not retryable; the connection asks again after a backoff (50 to
//!   500 ms), as it does for refused credentials.
//! - [`Error::SentinelUnreachable`]: no sentinel answered. Retryable.
//! - [`Error::NoPrimary`]: the sentinels know the name but named no node
//!   that answers as primary (a failover in progress). Retryable.
//!
//! No error, log line or `Debug` output shows a sentinel URL or a password.

use std::fmt;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{
    AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, ErrorKind, IntoConnectionInfo,
    RedisConnectionInfo, RedisError, RedisResult, Role,
};

use crate::error::{Error, Result};
use crate::sentinel_fault::{Fault, SentinelFault};

/// The port of a sentinel whose address in a `redis+sentinel://` URL names
/// none.
pub const DEFAULT_SENTINEL_PORT: u16 = 26379;

/// The longest one resolution may take (asking the sentinels, checking the
/// primary), whatever the connection's own timeout: redis-rs bounds each of
/// its connections to a sentinel (1 s to connect, 0.5 s per reply), this
/// bounds the whole.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// The primary of one master name, found through Redis Sentinel, for
/// [`Locker::connect`](crate::Locker::connect),
/// [`HandoffLocker::connect`](crate::HandoffLocker::connect) and their
/// builders' `connect` (anything that takes an [`Endpoint`](crate::Endpoint)). See the
/// [module docs](self) for how the primary is followed across failovers,
/// and what a failover does to safety.
///
/// Cheap to clone: clones share the sentinel connections.
///
/// ```no_run
/// # async fn demo() -> leasehold::Result<()> {
/// use leasehold::{Locker, Sentinel};
///
/// let sentinel = Sentinel::from_url("redis+sentinel://10.0.0.1:26379,10.0.0.2:26379,10.0.0.3:26379/mymaster")?;
/// let locker = Locker::connect(&sentinel).await?;
/// # let _ = locker;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Sentinel {
    inner: Arc<Inner>,
}

struct Inner {
    /// redis-rs's client: asks the sentinels and checks the primary.
    client: tokio::sync::Mutex<SentinelClient>,
    /// The sentinels' addresses, for telling "unknown name" from "no
    /// sentinel answers" when a resolution fails.
    sentinels: Vec<ConnectionInfo>,
    master: String,
    db: i64,
}

impl fmt::Debug for Sentinel {
    /// Shows the master name and how many sentinels, never their URLs or
    /// a password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sentinel")
            .field("master", &self.inner.master)
            .field("sentinels", &self.inner.sentinels.len())
            .field("db", &self.inner.db)
            .finish_non_exhaustive()
    }
}

impl Sentinel {
    /// The primary of `master`, found through `sentinels` (each a
    /// `redis://[:password@]host:port` URL or anything else redis-rs takes
    /// as connection info; its credentials are the sentinel's own). `node`
    /// holds what the data nodes need: username, password, database
    /// (`RedisConnectionInfo::default()` for none). Connections to the data
    /// nodes are plain TCP. No I/O.
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] when a sentinel address does not parse, the
    /// list is empty, or the master name is empty;
    /// [`Error::TlsNotEnabled`] for a `rediss://` sentinel address when
    /// redis-rs was built without TLS.
    pub fn new<T: IntoConnectionInfo>(
        sentinels: Vec<T>,
        master: &str,
        node: RedisConnectionInfo,
    ) -> Result<Sentinel> {
        if master.is_empty() {
            return Err(invalid("the master name is empty"));
        }
        let sentinels = sentinels
            .into_iter()
            .map(IntoConnectionInfo::into_connection_info)
            .collect::<RedisResult<Vec<_>>>()
            .map_err(Error::from_url)?;
        if sentinels.is_empty() {
            return Err(invalid("no sentinel address"));
        }
        let db = node.db();
        // redis-rs takes a `String` without its `tls-rustls` feature and
        // `impl AsRef<str>` with it.
        #[allow(clippy::unnecessary_to_owned)]
        let client = SentinelClient::build(
            sentinels.clone(),
            master.to_owned(),
            Some(SentinelNodeConnectionInfo::default().set_redis_connection_info(node)),
            SentinelServerType::Master,
        )
        .map_err(Error::from_url)?;
        Ok(Sentinel {
            inner: Arc::new(Inner {
                client: tokio::sync::Mutex::new(client),
                sentinels,
                master: master.to_owned(),
                db,
            }),
        })
    }

    /// Parses `redis+sentinel://[user[:password]@]host[:port][,host[:port]...]/master[/db]`:
    /// the sentinels (port [`DEFAULT_SENTINEL_PORT`] when left out), the
    /// master name, and the database (0 when left out). The user and
    /// password, percent-encoded, are the data nodes' (the primary's), not
    /// the sentinels': sentinels that need a password of their own go
    /// through [`Sentinel::new`]. No I/O.
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] for anything else (another scheme, no master
    /// name, a bad port or database, a query string). The error never
    /// quotes the URL.
    pub fn from_url(url: &str) -> Result<Sentinel> {
        let parsed = SentinelUrl::parse(url)?;
        let mut node = RedisConnectionInfo::default().set_db(parsed.db);
        if let Some(user) = parsed.user {
            node = node.set_username(user);
        }
        if let Some(password) = parsed.password {
            node = node.set_password(password);
        }
        let sentinels = parsed
            .hosts
            .into_iter()
            .map(|(host, port)| ConnectionAddr::Tcp(host, port))
            .collect();
        Sentinel::new(sentinels, &parsed.master, node)
    }

    /// Whether `url` is a `redis+sentinel://` URL (for a program that takes
    /// either kind).
    pub fn is_sentinel_url(url: &str) -> bool {
        url.get(..SCHEME.len())
            .is_some_and(|scheme| scheme.eq_ignore_ascii_case(SCHEME))
    }

    /// The master name the sentinels are asked about.
    pub fn master(&self) -> &str {
        &self.inner.master
    }

    /// The database selected on the primary.
    pub(crate) fn db(&self) -> i64 {
        self.inner.db
    }

    /// Resolves the primary and opens a connection to it with `config`,
    /// checking with `ROLE` on that connection that it is a primary.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is kept but redis-rs's verified sentinel
    /// connections.
    pub(crate) async fn primary(
        &self,
        config: &AsyncConnectionConfig,
    ) -> RedisResult<(MultiplexedConnection, Option<(String, u16)>)> {
        bounded(async {
            let client = self.resolve(config).await?;
            let addr = match client.get_connection_info().addr() {
                ConnectionAddr::Tcp(host, port) => Some((host.clone(), *port)),
                ConnectionAddr::TcpTls { host, port, .. } => Some((host.clone(), *port)),
                _ => None,
            };
            let mut conn = client
                .get_multiplexed_async_connection_with_config(config)
                .await?;
            let role: Role = redis::cmd("ROLE").query_async(&mut conn).await?;
            if !matches!(role, Role::Primary { .. }) {
                return Err(self.fault(Fault::NoPrimary));
            }
            Ok((conn, addr))
        })
        .await
    }

    /// Whether the first sentinel that answers
    /// `SENTINEL GET-MASTER-ADDR-BY-NAME` names a primary other than
    /// `addr`. `false` when none answers.
    pub(crate) async fn moved(&self, addr: &(String, u16), config: &AsyncConnectionConfig) -> bool {
        let ask = async {
            for info in &self.inner.sentinels {
                let Ok(client) = redis::Client::open(info.clone()) else {
                    continue;
                };
                let Ok(mut conn) = client
                    .get_multiplexed_async_connection_with_config(config)
                    .await
                else {
                    continue;
                };
                let named: RedisResult<Option<(String, u16)>> = redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(&self.inner.master)
                    .query_async(&mut conn)
                    .await;
                if let Ok(Some(named)) = named {
                    return named != *addr;
                }
            }
            false
        };
        tokio::time::timeout(RESOLVE_TIMEOUT, ask)
            .await
            .unwrap_or(false)
    }

    /// A client for the primary the sentinels name now (checked with
    /// `ROLE` by redis-rs), for a pub/sub connection.
    #[cfg(feature = "handoff")]
    pub(crate) async fn client(
        &self,
        config: &AsyncConnectionConfig,
    ) -> RedisResult<redis::Client> {
        bounded(self.resolve(config)).await
    }

    async fn resolve(&self, config: &AsyncConnectionConfig) -> RedisResult<redis::Client> {
        let found = self.inner.client.lock().await.async_get_client().await;
        match found {
            Ok(client) => Ok(client),
            Err(err) => Err(self.explain(err, config).await),
        }
    }

    /// Why a resolution failed: asks each sentinel about the master name
    /// (`SENTINEL MASTER`) to tell an unknown name and unreachable
    /// sentinels from a failover in progress.
    async fn explain(&self, err: RedisError, config: &AsyncConnectionConfig) -> RedisError {
        let (mut answered, mut known) = (0, 0);
        for info in &self.inner.sentinels {
            match ask_master(info, &self.inner.master, config).await {
                Asked::Known => {
                    answered += 1;
                    known += 1;
                }
                Asked::Unknown => answered += 1,
                Asked::Unreachable => {}
            }
        }
        if answered == 0 {
            self.fault(Fault::NoSentinel)
        } else if known == 0 {
            crate::sentinel_fault::unknown_master(&self.inner.master)
        } else if err.kind() == ErrorKind::MasterNameNotFoundBySentinel {
            self.fault(Fault::NoPrimary)
        } else {
            err
        }
    }

    fn fault(&self, kind: Fault) -> RedisError {
        SentinelFault::error(kind, &self.inner.master)
    }
}

/// Bounds one resolution by [`RESOLVE_TIMEOUT`].
async fn bounded<T>(resolve: impl Future<Output = RedisResult<T>>) -> RedisResult<T> {
    match tokio::time::timeout(RESOLVE_TIMEOUT, resolve).await {
        Ok(done) => done,
        Err(_elapsed) => Err(RedisError::from(io::Error::new(
            io::ErrorKind::TimedOut,
            "resolving the primary through sentinel timed out",
        ))),
    }
}

/// What one sentinel said about the master name.
enum Asked {
    Known,
    Unknown,
    Unreachable,
}

async fn ask_master(info: &ConnectionInfo, master: &str, config: &AsyncConnectionConfig) -> Asked {
    let Ok(client) = redis::Client::open(info.clone()) else {
        return Asked::Unreachable;
    };
    let Ok(mut conn) = client
        .get_multiplexed_async_connection_with_config(config)
        .await
    else {
        return Asked::Unreachable;
    };
    let reply: RedisResult<redis::Value> = redis::cmd("SENTINEL")
        .arg("MASTER")
        .arg(master)
        .query_async(&mut conn)
        .await;
    match reply {
        Ok(_) => Asked::Known,
        Err(err) if err.detail().is_some_and(|d| d.contains("No such master")) => Asked::Unknown,
        // Not a sentinel (a data node answers "unknown command"), or gone.
        Err(_) => Asked::Unreachable,
    }
}

const SCHEME: &str = "redis+sentinel://";

/// A `redis+sentinel://` URL, taken apart.
#[derive(Debug, PartialEq)]
struct SentinelUrl {
    hosts: Vec<(String, u16)>,
    master: String,
    db: i64,
    user: Option<String>,
    password: Option<String>,
}

fn invalid(why: &'static str) -> Error {
    Error::InvalidUrl(RedisError::from((ErrorKind::InvalidClientConfig, why)).into())
}

impl SentinelUrl {
    fn parse(url: &str) -> Result<SentinelUrl> {
        if !Sentinel::is_sentinel_url(url) {
            return Err(invalid("a sentinel url starts with redis+sentinel://"));
        }
        let rest = &url[SCHEME.len()..];
        if rest.contains(['?', '#']) {
            return Err(invalid(
                "a redis+sentinel:// url takes no query string or fragment",
            ));
        }
        let (authority, path) = rest
            .split_once('/')
            .ok_or_else(|| invalid("a redis+sentinel:// url names the master: .../MASTER"))?;
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => (Some(userinfo), hosts),
            None => (None, authority),
        };
        let (user, password) = match userinfo {
            None => (None, None),
            Some(userinfo) => {
                let (user, password) = match userinfo.split_once(':') {
                    Some((user, password)) => (user, Some(password)),
                    None => (userinfo, None),
                };
                let user = (!user.is_empty())
                    .then(|| percent_decode(user))
                    .transpose()?;
                let password = password.map(percent_decode).transpose()?;
                (user, password)
            }
        };
        let hosts = hosts
            .split(',')
            .map(parse_host)
            .collect::<Result<Vec<_>>>()?;
        let (master, db) = match path.split_once('/') {
            Some((master, "")) => (master, 0),
            Some((master, db)) => (
                master,
                db.parse()
                    .map_err(|_| invalid("the database after the master name is not a number"))?,
            ),
            None => (path, 0),
        };
        if master.is_empty() {
            return Err(invalid(
                "a redis+sentinel:// url names the master: .../MASTER",
            ));
        }
        Ok(SentinelUrl {
            hosts,
            master: percent_decode(master)?,
            db,
            user,
            password,
        })
    }
}

fn parse_host(host: &str) -> Result<(String, u16)> {
    if host.is_empty() {
        return Err(invalid("an empty sentinel address"));
    }
    // An IPv6 address is bracketed: [::1]:26379.
    let (name, port) = if let Some(bracketed) = host.strip_prefix('[') {
        let (name, after) = bracketed
            .split_once(']')
            .ok_or_else(|| invalid("an unclosed [ in a sentinel address"))?;
        (name, after.strip_prefix(':'))
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (host, None),
        }
    };
    if name.is_empty() {
        return Err(invalid("a sentinel address without a host"));
    }
    let port = match port {
        None => DEFAULT_SENTINEL_PORT,
        Some(port) => port
            .parse()
            .map_err(|_| invalid("a sentinel port is not a number from 1 to 65535"))?,
    };
    if port == 0 {
        return Err(invalid("a sentinel port is not a number from 1 to 65535"));
    }
    Ok((name.to_owned(), port))
}

fn percent_decode(text: &str) -> Result<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|hex| std::str::from_utf8(hex).ok())
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
                .ok_or_else(|| invalid("a bad percent-escape in a redis+sentinel:// url"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| invalid("a percent-escape that is not utf-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_sentinel_url_form() {
        let url = SentinelUrl::parse("redis+sentinel://u:p%40ss@a:1,b,[::1]:3/my%20master/2")
            .expect("parses");
        assert_eq!(
            url,
            SentinelUrl {
                hosts: vec![
                    ("a".into(), 1),
                    ("b".into(), DEFAULT_SENTINEL_PORT),
                    ("::1".into(), 3)
                ],
                master: "my master".into(),
                db: 2,
                user: Some("u".into()),
                password: Some("p@ss".into()),
            }
        );
        let plain = SentinelUrl::parse("REDIS+SENTINEL://h:9/m").expect("parses");
        assert_eq!(
            (plain.master.as_str(), plain.db, plain.user),
            ("m", 0, None)
        );
        let password_only = SentinelUrl::parse("redis+sentinel://:pw@h/m/").expect("parses");
        assert_eq!(
            (password_only.user, password_only.password.as_deref()),
            (None, Some("pw"))
        );
    }

    #[test]
    fn refuses_bad_sentinel_urls_without_quoting_them() {
        for url in [
            "redis://h:1/m",
            "redis+sentinel://h:1",
            "redis+sentinel://h:1/",
            "redis+sentinel://h:x/m",
            "redis+sentinel://h:0/m",
            "redis+sentinel://h:1,/m",
            "redis+sentinel://h:1/m/x",
            "redis+sentinel://h:1/m?db=1",
            "redis+sentinel://:secret%zz@h:1/m",
        ] {
            let err = Sentinel::from_url(url).expect_err(url);
            assert!(matches!(err, Error::InvalidUrl(_)), "{url}: {err:?}");
            let text = format!("{err} {:?}", std::error::Error::source(&err));
            assert!(!text.contains("secret") && !text.contains("h:1"), "{text}");
        }
    }

    #[test]
    fn debug_never_shows_a_password() {
        let sentinel = Sentinel::from_url("redis+sentinel://:hunter2@127.0.0.1:1/m").expect("url");
        let shown = format!("{sentinel:?}");
        assert!(
            !shown.contains("hunter2") && shown.contains("\"m\""),
            "{shown}"
        );
    }

    #[test]
    fn faults_are_typed() {
        let sentinel = Sentinel::from_url("redis+sentinel://127.0.0.1:1/m").expect("url");
        let none = Error::from_redis("acquire", "k", sentinel.fault(Fault::NoSentinel));
        assert!(matches!(
            none,
            Error::SentinelUnreachable { op: "acquire", .. }
        ));
        assert!(none.is_retryable());
        let err = Error::from_redis("acquire", "k", sentinel.fault(Fault::NoPrimary));
        assert!(matches!(err, Error::NoPrimary { .. }) && err.is_retryable());
        let unknown = crate::sentinel_fault::unknown_master("m");
        let err = Error::from_redis("connect", "", unknown);
        assert!(matches!(&err, Error::UnknownMaster { name } if name == "m"));
        assert!(!err.is_retryable());
    }
}
