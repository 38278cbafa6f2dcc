//! Leases on etcd (feature `etcd`): [`EtcdLocker`], the way to take a
//! lease for a team that outgrows what Redis promises (a failover that
//! grants one lock twice, fence counters lost with the data): the same
//! [`Lease`], the same calls and the same guard, on a consensus store.
//! Verified by the fault matrix like the Redis ways (`leasehold chaos
//! --modes etcd`, and the side-by-side table in the repository's
//! `docs/history/chaos-results.md`): a lease on etcd, too, is lost by a
//! holder paused past its TTL, so the lock is an efficiency lock there as
//! well, and the fencing token checked by the database is what keeps the
//! data right.
//!
//! # The recipe, and why each step is safe
//!
//! Built on etcd's KV transactions and leases, not on its Lock RPC (which,
//! on the 3.4 releases, returns to a waiter whose session had expired:
//! Jepsen's etcd 3.4.3 analysis; fixed in 3.5.0):
//!
//! 1. **Join the queue.** Grant an etcd lease of the TTL (its ID chosen by
//!    the client, so a grant whose answer was lost is safe to send again),
//!    then create the waiter key `PREFIX/lock/<lock key>/<lease ID in
//!    hex>` under it, only if absent (`create_revision == 0`). The key's
//!    creation revision is its place in the queue: revisions only grow, so
//!    no later key can get ahead of ours. The same transaction reads the
//!    queue's two newest keys (after our put: ours, and the one just ahead
//!    of it), so an uncontended acquire knows it is first, and a contended
//!    one what to watch, without another request. A create whose outcome
//!    is unknown is sent again by the next step (created only if absent:
//!    the key it finds carries our lease, or it creates it).
//! 2. **Wait by watch, in FIFO order.** The owner is the key with the
//!    lowest creation revision under the lock's prefix. Behind another
//!    key, we watch the key just before ours for its delete (from the
//!    revision after the read that saw it: nothing is missed), and read
//!    again when it goes (a waiter ahead may have given up without being
//!    the owner). Each read asks for our key and the newest key created
//!    before it (`max_create_revision`, newest first, limit 1), so it
//!    answers with two keys at most however long the queue is. No
//!    polling; our etcd lease is kept alive every `ttl / 3` meanwhile. A
//!    fault that may pass (an election, a member gone: the watch resumes
//!    on another member from its next revision; a cluster out of space)
//!    is ridden out within the wait, and returned if the wait runs out
//!    during it. A waiter whose etcd lease ends (its keep-alives
//!    failed for a whole TTL, or an operator revoked it) has lost its
//!    place: it joins again, at the back, within the same wait.
//! 3. **Confirm by the key itself.** After a wait, a keep-alive of our
//!    etcd lease goes with the linearizable read of the queue: the lock
//!    is ours when both answer and the read finds our key (still there,
//!    at our revision, under our lease) with no key created before it,
//!    before the lease is handed over; it counts from the step's start,
//!    before the keep-alive was sent. First in line at once, the step's
//!    start counts too, before the grant (the key was created under it, so
//!    the etcd lease was alive then and lasts its TTL from the grant on).
//! 4. **Give up cleanly.** On the deadline, an error or cancellation (or
//!    the acquire's future dropped) our etcd lease is revoked, so our key
//!    goes with it and is not left to become owner after we gave up (if
//!    etcd cannot be reached, the etcd lease's TTL ends it). The revoke
//!    runs in the background, so giving up never makes the caller wait
//!    for it.
//!
//! Each of these is a step of the crate's one retry loop (the
//! [`LockService`] seam every service implements): the acquire's place in
//! the queue is the step's entry, kept from one step to the next; a busy
//! step's wake-up is the watch of step 2, which also keeps our etcd lease
//! alive; the step after it is the read of step 3.
//!
//! A **refresh** is a keep-alive of the etcd lease *and* a read of the key,
//! sent together (one round trip's wait):
//! a keep-alive's success alone proves nothing (etcd before 3.4.38, the
//! 3.4.23 Debian ships among them, may report a lease renewed after it was
//! revoked, and an operator may have deleted the key). A **release** deletes
//! the key only if it is still ours (one transaction comparing its
//! creation revision and lease), writing in the same transaction a
//! *released* key (`PREFIX/released/<lease ID in hex>`) under our etcd
//! lease, then revokes the etcd lease (which takes the released key too;
//! awaited within the release's deadline, finished in the background past
//! it): [`Error::NotHeld`] when the key was not ours any more. A delete
//! whose answer is lost (its member paused, or lost its leader
//! mid-request) gets half the release's time; then the same transaction
//! is sent again on another member (it acts only while the key is ours,
//! so resending is safe): applied then, or found applied by the lost try
//! (its released key is there), the release is a success it knows.
//! Found not applied with no released key left, the lost try may still
//! have deleted the key before our etcd lease ended (an operator revoked
//! it, or it ran out): an [`Error::Etcd`] error whose source
//! [`is_outcome_unknown`](crate::etcd::EtcdError::is_outcome_unknown)
//! while the lease is valid, [`Error::LeaseLost`] once it ran out (as on
//! Redis), never a success (or a `NotHeld`) the release cannot know. The etcd
//! lease is revoked in every case, so the lock is free at once. A cluster
//! out of space (etcd's `NOSPACE` alarm) refuses the released key's put,
//! and so the whole transaction: the release then sends the guarded
//! delete alone (etcd goes on deleting and revoking while full), so a
//! full cluster still gets its locks back. An acquire rides it out within
//! its wait, as it rides out a full Redis (etcd grants no lease until an
//! operator frees space), and returns the refusal if the wait runs out
//! during it
//! ([`EtcdError::is_no_space`](crate::etcd::EtcdError::is_no_space)).
//! Every request of an acquire is bounded by its deadline (and the command
//! timeout), every refresh and release by the lease's bounds, as on Redis.
//!
//! The TTL is granted in whole seconds, rounded up (and etcd may raise a
//! small one to its minimum): the holder counts the TTL it asked for, so
//! its idea of the lease is never longer than etcd's, but a holder that
//! dies blocks the lock for up to the granted TTL. A refresh cannot
//! lengthen an etcd lease past the TTL it was granted with (it is refused,
//! [`Error::InvalidOptions`]).
//!
//! # One slow member
//!
//! The locker talks to one member at a time (the first endpoint, to begin
//! with). A member that stops answering (paused, overloaded, cut off from
//! its clients) while the cluster keeps its leader costs a held lease
//! nothing:
//!
//! - **A refresh moves within its own budget.** Its keep-alive and its
//!   read are both safe to send again on another member (a keep-alive only
//!   renews our etcd lease to its granted TTL again, a read changes
//!   nothing), so each is split into attempts of at most half the
//!   refresh's budget (`ttl / 3`, the watchdog's period and its bound on a
//!   refresh) and at most a third of the command timeout: the first
//!   attempt waits on the silent member, the next goes to another member
//!   and is answered before the next refresh is due. A 2 s lease with the
//!   default 1 s command timeout waits 333 ms at most on a paused member.
//!   A waiter's keep-alives (every `ttl / 3`) are split the same way, so a
//!   waiter keeps its etcd lease, and its place in the queue. A waiter's
//!   watch on a member its keep-alive found silent is opened again on
//!   another member (from the revision after the last one it saw, so it
//!   misses nothing) at once, not when the connection's own ping gives up
//!   (up to 10 s later).
//! - **The next requests start where the answer came from.** A member that
//!   timed out (or lost its connection, or could not be reached) is
//!   demoted until it answers again: the client passes over it whenever it
//!   moves on, and tries it again only when every other member has failed
//!   too. A member paused again later costs nothing while the client talks
//!   to another.
//! - **What counts stays the same.** A refresh is confirmed only when etcd
//!   answered both the keep-alive (with a TTL) and the read (our key,
//!   ours); the new validity counts from before its first attempt, so never
//!   from later than the keep-alive that landed. A keep-alive left on the
//!   paused member may still renew our etcd lease when the member wakes:
//!   that only lengthens the lease on etcd's side (a holder that died
//!   meanwhile blocks the lock for up to one more TTL), never the holder's
//!   idea of it.
//!
//! Writes do not move mid-request: a waiter's create, a release's delete
//! and the leader record wait on their member until their deadline (cut
//! short, a write's outcome would be unknown), then are settled on another
//! member by reading the key, as above. Measured with an `Election` (TTL
//! 2 s, 3 members, the first endpoint's member paused 10 s, twice per run):
//! see `docs/operations.md`.
//!
//! # Fencing tokens
//!
//! The fencing token of a lease taken with [`FencedKeys`](crate::FencedKeys)
//! is its key's creation revision: strictly increasing across the whole
//! cluster, so across the holders of one lock (it is what etcd's docs call
//! the token). It is **not comparable with a Redis fence counter** for the
//! same resource (those are about 1.8 x 10^15, revisions are small), and it
//! cannot be raised ([`Lease::raise_fence`](crate::Lease::raise_fence)
//! fails). So an etcd lease names its resource in a fence table
//! differently: its [`fence_key_for`](crate::Lease::fence_key_for) is the
//! fence key with `etcd:` in front (`etcd:fence:{wallet:42}`), a row of its
//! own in the `leasehold-pg` fences table, never compared with the Redis
//! row. **Moving a resource from Redis to etcd**: stop every Redis holder
//! of it (and wait out their TTL) before the first etcd holder writes; the
//! two rows never guard each other, so the guard cannot be confused by the
//! switch, but it cannot order a Redis holder against an etcd one either.
//!
//! # etcd 3.4 and 3.5
//!
//! The recipe uses only calls that 3.4 and 3.5 answer alike (KV range, put,
//! delete and transactions; lease grant, keep-alive and revoke; watch), and
//! its tests run on both: on Debian bookworm's 3.4.23 and on a 3.5 release
//! (`scripts/test.sh` fetches Debian trixie's, 3.5.16). What 3.5 changed
//! does not change what this lock promises, because the recipe never
//! trusts what those fixes repair:
//!
//! - 3.5.0 fixed the Lock RPC handing the lock to a waiter whose session
//!   had expired; the recipe does not use the Lock RPC, and a waiter
//!   checks its own key before it is given the lease (step 3).
//! - Later releases of both lines fixed leases revoked by a deposed leader
//!   (3.4.31) and a keep-alive reported successful after its lease was
//!   revoked (3.4.38); 3.4.23 has neither fix. A refresh
//!   reads the key as well as renewing the lease, so on 3.4.23 either fault
//!   is a lost lease, found by the next refresh (within `ttl / 3`) and
//!   reported to the watchdog, as an expiry is. Until that refresh, the
//!   holder may still believe it holds the lock: as on Redis, the lock is
//!   an efficiency lock, and the fencing token checked by the database
//!   ([`leasehold_pg`'s guard](https://docs.rs/leasehold-pg)) is what keeps
//!   the data right.
//! - The test kit passes `--unsafe-no-fsync` to 3.5 members (3.4 has no
//!   such switch), which makes the tests faster, not different.
//!
//! # TLS and authentication
//!
//! `https://` endpoints (with the `tls` feature) are verified as Redis's
//! `rediss://` URLs are, with the same [`TlsFiles`](crate::tls::TlsFiles)
//! ([`EtcdLockerBuilder::tls`]); a refused certificate, our certificate
//! refused and a plain port are named at [`connect`](EtcdLockerBuilder::connect)
//! ([`EtcdError::tls_failure`](crate::etcd::EtcdError::tls_failure)).
//! etcd's users and passwords: [`EtcdLockerBuilder::credentials`]; the
//! password never appears in a log or an error.
//!
//! # Options that differ from Redis
//!
//! A waiter is woken by watch, not by polling: each wake-up counts as one
//! of the retry strategy's waits (so
//! [`RetryStrategy::none`](crate::RetryStrategy::none) is one look, no
//! wait, and a strategy's number of attempts bounds the steps), and the
//! strategy's waits pace the steps after a fault.
//! [`AcquireOptions::wait_replicas`](crate::AcquireOptions::wait_replicas)
//! is refused (etcd commits on a majority before it answers).

mod backend;
mod take;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Claim, Held, LockService, Reply, Step};
use crate::error::{Error, Result};
use crate::etcd::{Credentials, EtcdClient, Range};
use crate::locker::DEFAULT_COMMAND_TIMEOUT;
use crate::service::Service;

use self::backend::EtcdBackend;

/// The prefix of every key an [`EtcdLocker`] writes, unless
/// [`EtcdLockerBuilder::prefix`] says otherwise: `leasehold/`.
pub const DEFAULT_ETCD_PREFIX: &str = "leasehold/";

/// Takes leases on an etcd cluster (feature `etcd`): see the module docs
/// for the recipe, and what it does and does not promise.
///
/// The same four calls as [`Locker`](crate::Locker) and the same
/// [`Lease`](crate::Lease), through the same [`Lessor`](crate::Lessor) trait: waiters are served in
/// FIFO order of their keys' revisions, woken by watch; the fencing token
/// of a fenced lease is its key's creation revision. Cheap to clone:
/// clones share the client.
///
/// ```no_run
/// # async fn demo() -> leasehold::Result<()> {
/// use std::time::Duration;
/// use leasehold::{EtcdLocker, FencedKeys, Lessor};
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
    tls: crate::tls::TlsFiles,
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
    /// [`connect`](Self::connect), as [`tls::client`](crate::tls::client)
    /// does for Redis; the members' certificates are always verified
    /// (chain, validity, the endpoint's host).
    ///
    /// Defaults to no files: `https://` endpoints are verified against the
    /// system's roots, and no client certificate is sent.
    #[cfg(feature = "tls")]
    pub fn tls(mut self, files: crate::tls::TlsFiles) -> Self {
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
    /// cannot be used (as [`tls::client`](crate::tls::client));
    /// [`Error::TlsNotEnabled`] for `https://` endpoints in a build without
    /// the `tls` feature. Then [`Error::Etcd`] for endpoints that are not
    /// URLs, an unreachable cluster, refused credentials, or a failed TLS
    /// handshake (its source is then
    /// [`EtcdError::Tls`](crate::etcd::EtcdError::Tls), naming the
    /// [`TlsFailure`](crate::tls::TlsFailure): a refused certificate, ours
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
        let etcd = |source| Error::Etcd {
            op: "connect",
            source,
        };
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
            _ => Some(crate::etcd::TlsSettings::new(crate::tls::client_config(
                &self.tls,
            )?)),
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
            tls: crate::tls::TlsFiles::new(),
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
