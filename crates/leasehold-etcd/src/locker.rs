//! [`EtcdLocker`] and its builder: the lock service, as the crate's
//! [`LockService`] implementation (see the [crate docs](crate) for the
//! recipe).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::client::{Credentials, EtcdClient, Range};
use leasehold::DEFAULT_COMMAND_TIMEOUT;
use leasehold::Service;
use leasehold::backend::{Claim, Held, LockService, Reply, Step};
use leasehold::{Error, Result};

use crate::backend::EtcdBackend;
use crate::take;

/// The prefix of every key an [`EtcdLocker`] writes, unless
/// [`EtcdLockerBuilder::prefix`] says otherwise: `leasehold/`.
pub const DEFAULT_ETCD_PREFIX: &str = "leasehold/";

/// Takes leases on an etcd cluster: see the [crate docs](crate)
/// for the recipe, and what it does and does not promise.
///
/// The same four calls as [`Locker`](leasehold::Locker) and the same
/// [`Lease`](leasehold::Lease), through the same [`Lessor`](leasehold::Lessor) trait: waiters are served in
/// FIFO order of their keys' revisions, woken by watch; the fencing token
/// of a fenced lease is its key's creation revision. Cheap to clone:
/// clones share the client.
///
/// ```no_run
/// # async fn demo() -> leasehold::Result<()> {
/// use std::time::Duration;
/// use leasehold::{FencedKeys, Lessor};
/// use leasehold_etcd::EtcdLocker;
///
/// let locker = EtcdLocker::builder(["http://127.0.0.1:2379"])
///     .command_timeout(Duration::from_millis(500))
///     .connect()
///     .await?;
/// let lease = locker
///     .acquire(FencedKeys::for_resource("wallet:42")?, Duration::from_secs(5))
///     .await?;
/// lease.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct EtcdLocker {
    backend: Arc<EtcdBackend>,
}

impl std::fmt::Debug for EtcdLocker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdLocker")
            .field("prefix", &self.backend.prefix)
            .finish_non_exhaustive()
    }
}

/// Builds an [`EtcdLocker`]: `EtcdLocker::builder(endpoints)`, its
/// setters, then [`connect`](Self::connect).
#[must_use]
#[derive(Debug)]
pub struct EtcdLockerBuilder {
    endpoints: Vec<String>,
    credentials: Option<Credentials>,
    #[cfg(feature = "tls")]
    tls: leasehold::tls::TlsFiles,
    command_timeout: Duration,
    prefix: String,
}

impl EtcdLockerBuilder {
    /// Bounds every etcd request that has no tighter deadline of its own (a
    /// release; each request of an acquire whose deadline is further away;
    /// a refresh's keep-alive and read together). A read moves to the next
    /// member after a third of it, and a refresh's keep-alive and read
    /// after half of the refresh's budget (`ttl / 3`) if that is shorter,
    /// so that one silent member never costs a refresh.
    ///
    /// Defaults to [`DEFAULT_COMMAND_TIMEOUT`] (1 s).
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// Authenticates with this etcd user and password on every member.
    ///
    /// Defaults to no authentication.
    pub fn credentials(mut self, credentials: Credentials) -> Self {
        self.credentials = Some(credentials);
        self
    }

    /// The files TLS to `https://` endpoints uses (feature `tls`): the CA
    /// to verify the members against (the system's roots without one) and
    /// a client certificate with its key, for a cluster started with
    /// `--client-cert-auth`. Read and checked by
    /// [`connect`](Self::connect), as [`tls::client`](leasehold::tls::client)
    /// does for Redis; the members' certificates are always verified
    /// (chain, validity, the endpoint's host).
    ///
    /// Defaults to no files: `https://` endpoints are verified against the
    /// system's roots, and no client certificate is sent.
    #[cfg(feature = "tls")]
    pub fn tls(mut self, files: leasehold::tls::TlsFiles) -> Self {
        self.tls = files;
        self
    }

    /// The prefix of every key the locker writes (a `/` is added if it
    /// does not end with one): lock `k`'s waiters are under
    /// `PREFIX/lock/k/`, where `/` and `%` in `k` are escaped.
    ///
    /// Defaults to [`DEFAULT_ETCD_PREFIX`] (`leasehold/`).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Checks the settings, builds the client and reads from the cluster
    /// once (bounded by the command timeout), so a cluster that cannot be
    /// reached, or refuses the credentials, is an error here rather than
    /// at the first acquire.
    ///
    /// # Errors
    /// Before any I/O: [`Error::InvalidOptions`] for a zero command
    /// timeout, an empty prefix, endpoints that mix `http://` and
    /// `https://`, TLS files with `http://` endpoints, or a client
    /// certificate without its key; [`Error::TlsFile`] for a TLS file that
    /// cannot be used (as [`tls::client`](leasehold::tls::client));
    /// [`Error::TlsNotEnabled`] for `https://` endpoints in a build without
    /// the `tls` feature. Then [`Error::Service`] (an [`EtcdError`](crate::EtcdError) inside:
    /// [`etcd_error`](crate::etcd_error)) for endpoints that are not
    /// URLs, an unreachable cluster, refused credentials, or a failed TLS
    /// handshake (its source is then
    /// [`EtcdError::Tls`](crate::client::EtcdError::Tls), naming the
    /// [`TlsFailure`](leasehold::tls::TlsFailure): a refused certificate, ours
    /// refused, or a plain port).
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn connect(self) -> Result<EtcdLocker> {
        if self.command_timeout.is_zero() {
            return Err(Error::InvalidOptions("command timeout must be positive"));
        }
        if self.prefix.is_empty() {
            return Err(Error::InvalidOptions(
                "the etcd key prefix must not be empty",
            ));
        }
        let mut prefix = self.prefix;
        if !prefix.ends_with('/') {
            prefix.push('/');
        }
        let etcd = |source| crate::error::failed("connect", source);
        let secure = self
            .endpoints
            .iter()
            .filter(|endpoint| endpoint.starts_with("https://"))
            .count();
        if secure > 0 && secure < self.endpoints.len() {
            return Err(Error::InvalidOptions(
                "etcd endpoints mix http:// and https://",
            ));
        }
        #[cfg(not(feature = "tls"))]
        if secure > 0 {
            return Err(Error::TlsNotEnabled);
        }
        #[cfg(feature = "tls")]
        let tls = match secure {
            0 if !self.tls.is_empty() => {
                return Err(Error::InvalidOptions(
                    "tls files given for etcd endpoints without tls: use https://",
                ));
            }
            0 => None,
            _ => Some(crate::client::TlsSettings::new(
                leasehold::tls::client_config(&self.tls)?,
            )),
        };
        let mut client = EtcdClient::builder(self.endpoints)
            .attempt_timeout((self.command_timeout / 3).max(Duration::from_millis(1)));
        #[cfg(feature = "tls")]
        if let Some(tls) = tls {
            client = client.tls(tls);
        }
        if let Some(credentials) = self.credentials {
            client = client.credentials(credentials);
        }
        let client = client.build().map_err(etcd)?;
        let deadline = Instant::now() + self.command_timeout;
        client
            .range(&Range::key(prefix.as_str()).limit(1), deadline)
            .await
            .map_err(|err| etcd(err.into_tls_failure()))?;
        Ok(EtcdLocker {
            backend: Arc::new(EtcdBackend::new(client, self.command_timeout, prefix)),
        })
    }
}

impl EtcdLocker {
    /// A builder for a locker on the etcd members at `endpoints`
    /// (`http://host:port`, one per member; the first is tried first).
    pub fn builder<I, S>(endpoints: I) -> EtcdLockerBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        EtcdLockerBuilder {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            credentials: None,
            #[cfg(feature = "tls")]
            tls: leasehold::tls::TlsFiles::new(),
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            prefix: DEFAULT_ETCD_PREFIX.to_owned(),
        }
    }

    /// `EtcdLocker::builder(endpoints).connect()`.
    ///
    /// # Errors
    /// As [`EtcdLockerBuilder::connect`].
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn connect<I, S>(endpoints: I) -> Result<EtcdLocker>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        EtcdLocker::builder(endpoints).connect().await
    }
}

/// etcd as a [`LockService`]: each step joins the lock's queue or reads
/// our place in it; a busy step's wake-up is a watch on the
/// key just ahead of ours, which keeps our etcd lease alive meanwhile.
impl LockService for EtcdLocker {
    type Entry = take::Entry;

    fn service(&self) -> Service {
        Service::ETCD
    }

    fn command_timeout(&self) -> Duration {
        self.backend.command_timeout
    }

    /// Joining the queue is two requests, one after the other (the grant,
    /// then the create): each gets the command timeout.
    fn step_timeout(&self) -> Duration {
        self.backend.command_timeout.saturating_mul(2)
    }

    fn mode(&self) -> &'static str {
        "etcd"
    }

    /// Its own row in a fence table: an etcd revision is not comparable
    /// with a Redis counter, and cannot be raised (see the module docs).
    fn fence_key_of(&self, fence_key: &str) -> String {
        format!("etcd:{fence_key}")
    }

    fn step<'a>(
        &'a self,
        claim: &'a Claim,
        entry: &'a mut take::Entry,
        deadline: Instant,
    ) -> Reply<'a, Step> {
        Box::pin(take::step(&self.backend, claim, entry, deadline))
    }

    /// Nothing to give back before the next step: a create whose answer
    /// was lost is sent again by it (created only if absent, under our
    /// etcd lease), which finds the key ours if the lost one landed.
    fn undo<'a>(
        &'a self,
        _claim: &'a Claim,
        _entry: &'a mut take::Entry,
        _deadline: Instant,
    ) -> Reply<'a, ()> {
        Box::pin(std::future::ready(Ok(())))
    }

    /// Revokes the acquire's etcd lease, if a step was granted one, by
    /// `deadline`: our key goes with it before the caller hears the error
    /// (what is not done by then, `abandon` finishes in the background).
    fn leave<'a>(
        &'a self,
        _claim: &'a Claim,
        entry: &'a mut take::Entry,
        deadline: Instant,
    ) -> Reply<'a, ()> {
        Box::pin(async move {
            if let Some(lease) = entry.lease()
                && self.backend.revoke(lease, deadline).await
            {
                entry.left();
            }
            Ok(())
        })
    }

    /// Revokes the acquire's etcd lease, if a step was granted one (and
    /// [`leave`](LockService::leave) did not): our key, if any, goes with
    /// it (in the background; its TTL is the fallback).
    fn abandon(&self, _claim: Claim, entry: take::Entry, _maybe_taken: bool) {
        if let Some(lease) = entry.lease() {
            self.backend.spawn_revoke(lease);
        }
    }

    /// Renews our etcd lease and reads our key, together (see the module
    /// docs).
    fn refresh<'a>(&'a self, held: &'a Held, ttl: Duration, deadline: Instant) -> Reply<'a, bool> {
        Box::pin(self.backend.refresh_part(held, ttl, deadline))
    }

    fn release<'a>(&'a self, held: &'a Held, deadline: Instant) -> Reply<'a, bool> {
        Box::pin(self.backend.release_part(held, deadline))
    }

    fn announce<'a>(
        &'a self,
        held: &'a Held,
        record_key: &'a str,
        body: &'a str,
        deadline: Instant,
    ) -> Reply<'a, bool> {
        Box::pin(self.backend.announce_part(held, record_key, body, deadline))
    }

    fn leader_record<'a>(
        &'a self,
        key: &'a str,
        record_key: &'a str,
    ) -> Reply<'a, Option<(String, i64)>> {
        Box::pin(self.backend.leader_record(key, record_key))
    }
}
