//! PostgreSQL as the lock service: [`PgLocker`], a lease table in the
//! database you already run (a first slice of it: polling, see below).
//!
//! A [`PgLocker`] is a [`LockService`], so a [`Lessor`](leasehold::Lessor):
//! the same [`Lease`](leasehold::Lease), watchdog, fencing tokens,
//! `acquire_all`, `with_lock` and `Election` as every other way, through
//! leasehold's public seam (this crate is outside the core).
//!
//! # The tables
//!
//! [`PgLocker::setup`] creates three (idempotent):
//!
//! - `leasehold_leases (resource, holder, expires_at)`: one row per lock
//!   key while someone holds it or held it; `holder` is the lease's token.
//! - `leasehold_leader_records (record_key, holder, body)`: an
//!   election's leader record, written only while its writer holds the
//!   election's lock, and read only while that writer still does.
//! - `leasehold_lease_counters (fence_key, last)`: the last fencing token
//!   issued per fence key. Neither a release nor a lease row deleted by
//!   hand removes it, so a token is never issued twice while the database
//!   keeps its data (a counter deleted by hand restarts at its timeline's
//!   floor, below: the guard refuses the repeats, and the holder's
//!   `raise_fence` heals it).
//!
//! # Each step is one statement
//!
//! No session state and only unnamed statements (`query_typed`), so it
//! works through any pool. Expiry is decided on the **database's clock**
//! (`clock_timestamp()`, never `now()`, the transaction's start); the
//! holder's own validity runs from its request's send time on its
//! monotonic clock, as on Redis. A database clock stepped forward ends
//! leases early.
//!
//! - acquire: `INSERT ... ON CONFLICT (resource) DO UPDATE ... WHERE
//!   expires_at <= clock_timestamp() RETURNING`, and for a fenced key the
//!   counter's increment in the same statement, only when the lock was won;
//! - refresh and release: `UPDATE` / `DELETE ... WHERE resource = $1 AND
//!   holder = $2 AND expires_at > clock_timestamp()`;
//! - raise a fence: `greatest(last, $2)`.
//!
//! Every request is bounded by the deadline it is given; one whose answer
//! did not come is an unknown outcome (retried by the acquire only after
//! the token-checked undo).
//!
//! # Durable whatever the role's default
//!
//! A token is only as good as the commit that issued it: a take
//! acknowledged before its WAL was written is lost in a crash, and its
//! token issued again (`synchronous_commit = off`), or lost in a failover
//! (`local`, with synchronous standbys named). So every write that
//! confirms something to its caller (a take and its counter's increment,
//! a refresh, a release, a raised fence, a leader record) commits with
//! `synchronous_commit = on` (or `remote_apply` where that is in force
//! already: never weaker), pinned in its own statement:
//! `set_config('synchronous_commit', ..., true)` is a condition of the
//! statement's `WHERE`, so a row is written only where it was evaluated,
//! and the setting is the transaction's (as `SET LOCAL`), read by the
//! commit that ends the statement. No session state, so it holds through
//! PgBouncer in transaction mode, and `ALTER ROLE ... SET
//! synchronous_commit` (or the database's, or the server's default)
//! cannot void it; any role may set it (no privilege needed). The undo of
//! an abandoned take is not pinned: an undo lost in a crash leaves a
//! lease that its TTL ends.
//!
//! With synchronous standbys named (`synchronous_standby_names`), a take
//! is confirmed only once a synchronous standby has flushed it. While none
//! answers, the take's commit waits: the acquire ends with an error at its
//! deadline, never a lease (a refresh's, a release's and a raised fence's
//! wait too: a lease not refreshed runs out). The waiting transaction is committed locally
//! and not yet visible: it holds its row (another taker of the key waits
//! behind it) until the standby answers, the setting is cleared or the
//! wait is cancelled (`pg_cancel_backend`, `pg_terminate_backend`, or the
//! locker's own cancel at the request's deadline: see below; a client that
//! goes away is not noticed meanwhile). Then its lease becomes visible,
//! with its expiry counted from the take: its TTL ends it, and its token
//! is spent, never issued again.
//!
//! # One stuck statement
//!
//! A statement can wait far past its request's deadline: blocked on a row
//! (or table) lock held by another session's open transaction, or on a
//! synchronous standby that does not answer. The server runs one
//! statement at a time per connection, so every later request sent on
//! that connection would queue behind it, on every key. So a request that
//! does not end by its deadline (an [`Error::Timeout`](leasehold::Error::Timeout),
//! whose outcome is unknown), or whose future is dropped while its
//! statement is under way, **retires its connection** and **cancels its
//! statement**:
//!
//! - connected by [`PgLocker::connect`], the shared connection is marked:
//!   no new request is sent on it, the next one opens a fresh connection,
//!   and the old one closes once the requests already queued on it end
//!   (each by its own deadline);
//! - on a pool ([`PgLockerBuilder::pool`]), the connection is never given
//!   back: it is taken out of the pool for good (the pool may open
//!   another in its place) and closed;
//! - the statement is cancelled in the background, best effort, as
//!   `pg_cancel_backend` would: a cancel request on a connection of its
//!   own, bounded by the [command timeout](PgLockerBuilder::command_timeout).
//!   For the locker's own connection it speaks TLS as that connection
//!   does; on a pool it speaks none (as libpq's `PQcancel` did before
//!   PostgreSQL 17: the request carries the backend's key, never a
//!   password), so a server that takes TLS connections only refuses it,
//!   and the statement then ends on its own. A cancel that comes late
//!   (the statement ended meanwhile) may cancel the next statement queued
//!   on that retired connection, which then fails as retryable.
//!
//! A statement that is not cancelled still ends on its own: a take that
//! waited for its row may then win, after its acquire has given up; the
//! acquire's undo (token-checked) may run before it, so that lease then
//! stays until its TTL ends it, as any unknown outcome's.
//!
//! # Waiting
//!
//! A release is followed by `pg_notify('leasehold_leases', key)` in its
//! own statement (a full notification queue never fails the release);
//! each locker `LISTEN`s on a connection of its own (not one built on a
//! pool: see [On your pool](#on-your-pool)), and a waiter steps again when
//! a release is notified, or every
//! [`poll_every`](PgLockerBuilder::poll_every) (a holder that died and
//! whose lease ran out; notifications that cannot arrive). A release
//! wakes **one** waiter of the locker, the first of its key not woken yet:
//! within a locker, waiters are served first in, first out, and the
//! others (and the waiters of other keys) send nothing (no herd). Across
//! lockers each locker wakes its own first waiter, and whichever take
//! lands first wins. A wake is not lost to a waiter that won or left
//! meanwhile: it passes to the next. A locker wakes its own first waiter
//! at once when it releases (before its notification goes out), and a
//! waiter does not take while one ahead of it in its locker has been
//! woken and has not taken yet: a caller that releases and asks again at
//! once queues behind the others rather than barging in. Every locker that listens still hears
//! every release on the database and sorts it in memory.
//!
//! A take that finds the lock held **writes nothing**: it looks for a
//! live lease first, without a lock, and stops there (no row lock, no
//! transaction id, no commit to flush; a read). Whether a take wins is
//! still decided under the row's lock, by the `ON CONFLICT` clause.
//!
//! **Through PgBouncer in transaction mode**, turn listening off
//! ([`PgLockerBuilder::listen`]`(false)`): waiters then poll, and every
//! step works unchanged (one statement each, unnamed, no session state).
//! Left on, nothing fails and nothing hangs, but `LISTEN` wakes no one
//! there: it runs on whichever server connection is free and leaves that
//! pooled connection listening; a notification is delivered to whatever
//! client runs a transaction on it at the time, or dropped by PgBouncer
//! (with a warning in its log) while it is idle, never to the locker's
//! listening connection, which holds no server connection between its
//! transactions. The locker cannot tell PgBouncer from a server, so this
//! is the caller's setting.
//!
//! # On your pool
//!
//! With the crate feature `deadpool`, [`PgLockerBuilder::pool`] (or
//! [`PgLocker::from_pool`]) builds a locker on the caller's
//! `deadpool_postgres::Pool` (deadpool-postgres 0.14, re-exported as
//! `leasehold_pg::deadpool_postgres`): each request takes a pooled
//! connection for its one statement and gives it back, unless it did not
//! end (see above). Such a locker does **not** `LISTEN`: a pooled
//! connection's driver task drops notifications, and the pool does not
//! tell its connection settings, so waiters look again every
//! [`poll_every`](PgLockerBuilder::poll_every) (its releases still
//! notify other lockers that listen). For prompt wake-ups, keep a locker
//! from [`PgLocker::connect`] for waiting (it opens two connections).
//!
//! # Across a failover: the timeline in the token
//!
//! A token is never below the server's **timeline** times 2^40 (the
//! counter jumps to that floor when it is below it), and a promotion (a
//! failover to a standby, a point-in-time restore) always starts a new,
//! higher timeline. So a promoted standby issues every token above every
//! token of the timeline before, even one that lacks the last increments
//! of the counter (an asynchronous standby that lagged): no token is
//! issued twice across a failover. (A timeline would need 2^40 tokens of
//! one fence key to reach the next one's floor.) The first token on
//! timeline 1 is 2^40 (1099511627776): tokens are large numbers, compared,
//! never counted.
//!
//! What a failover can still lose depends on the standby:
//!
//! - **synchronous** (named in `synchronous_standby_names`): every lease,
//!   release and token a caller was told of is on the standby before the
//!   caller hears of it (every write is pinned to `synchronous_commit =
//!   on`), so after its promotion a held lock is still held (tested:
//!   `standby.rs`, `a_promoted_synchronous_standby_keeps_every_lease_and_token`);
//! - **asynchronous**: a lease the primary confirmed may be missing on the
//!   promoted standby, and another caller can take the lock while its
//!   holder still believes it holds it. The token of that new holder is
//!   above the lost one's (tested with the standby's stream held back:
//!   `a_promoted_asynchronous_standby_may_lose_a_lease_but_never_repeats_a_token`),
//!   so the guard refuses the older holder's writes once the newer one
//!   has written: the data stays right, the lock was only an efficiency
//!   lock for that moment.
//!
//! # Not yet
//!
//! No constructor
//! from a sqlx pool yet.

use std::sync::Arc;
use std::time::Duration;

use leasehold::backend::{Claim, Held, Reply, Step};
use leasehold::{FencingToken, LockService, Service};
use tokio::sync::Mutex;
use tokio::time::Instant;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{AsyncMessage, Client};

use crate::error::Result;
use crate::wakes::{Place, Wakes};

mod conn;
mod sql;

use conn::{Connections, POSTGRESQL, Source};
use sql::{
    ANNOUNCE, LEADER, LISTEN, NOTIFY, RAISE, REFRESH, RELEASE, SETUP, TAKE, TAKE_FENCED, UNDO,
};

/// How long one request may take when the caller's deadline is further
/// away: 1 s.
pub const DEFAULT_LOCK_COMMAND_TIMEOUT: Duration = Duration::from_secs(1);

/// Takes leases in a PostgreSQL table: see the [module docs](self).
/// Cheap to clone. Connected by [`PgLocker::connect`], clones share one
/// connection (pipelined), opened again when it is found closed or was
/// retired (a request on it did not end: see [One stuck
/// statement](self#one-stuck-statement)); built on a pool
/// ([`PgLockerBuilder::pool`]), each request takes a pooled connection.
#[derive(Clone)]
pub struct PgLocker {
    inner: Arc<Inner>,
}

struct Inner {
    conns: Connections,
    /// The connection that `LISTEN`s for releases, while it lives.
    listener: Mutex<Option<Arc<Client>>>,
    /// The waiters, by key: woken by a release of their key (everyone
    /// when the listener ends).
    wakes: Arc<Wakes>,
    poll_every: Duration,
    /// Whether waiters are woken by `LISTEN` (else they only poll).
    listen: bool,
}

impl std::fmt::Debug for PgLocker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgLocker")
            .field("source", &self.inner.conns.kind())
            .field("command_timeout", &self.inner.conns.command_timeout)
            .field("listen", &self.inner.listen)
            .finish_non_exhaustive()
    }
}

/// How often a waiter looks again when no release notification came (a
/// holder that died, or notifications that cannot arrive): 500 ms.
pub const DEFAULT_POLL_EVERY: Duration = Duration::from_millis(500);

/// Builds a [`PgLocker`] with non-default settings.
#[derive(Debug, Clone)]
#[must_use]
pub struct PgLockerBuilder {
    command_timeout: Duration,
    poll_every: Duration,
    /// `None`: the default of the constructor (listen on a connection of
    /// our own; a pool-built locker polls).
    listen: Option<bool>,
}

impl PgLockerBuilder {
    /// The bound on one request when the caller's deadline is further
    /// away. Defaults to [`DEFAULT_LOCK_COMMAND_TIMEOUT`] (1 s).
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// How often a waiter looks again when no release was notified (a
    /// holder that died and whose lease ran out; a connection through
    /// PgBouncer in transaction mode, where `LISTEN` cannot work).
    /// Defaults to [`DEFAULT_POLL_EVERY`] (500 ms).
    pub fn poll_every(mut self, every: Duration) -> Self {
        self.poll_every = every;
        self
    }

    /// Whether waiters are woken by `LISTEN` on a connection of the
    /// locker's own; with `false` they look again every
    /// [`poll_every`](Self::poll_every) only, and the locker opens one
    /// connection. Turn it off through PgBouncer in transaction mode (see
    /// [Waiting](crate::locker#waiting)): there `LISTEN` wakes no one, and
    /// leaves a pooled server connection listening. Releases are notified
    /// either way, so lockers that listen are woken by this one's.
    /// Defaults to true for [`connect`](Self::connect); a locker on a pool
    /// ([`pool`](Self::pool)) cannot listen.
    pub fn listen(mut self, listen: bool) -> Self {
        self.listen = Some(listen);
        self
    }

    fn check(&self) -> Result<()> {
        if self.command_timeout.is_zero() || self.poll_every.is_zero() {
            return Err(crate::Error::Lease(leasehold::Error::InvalidOptions(
                "command_timeout and poll_every must be positive",
            )));
        }
        Ok(())
    }

    /// A locker on the database at `url` (as [`connect`](crate::connect)
    /// reads it), connected now; run [`PgLocker::setup`] once.
    ///
    /// # Errors
    /// [`Error::Lease`](crate::Error::Lease) with
    /// [`InvalidOptions`](leasehold::Error::InvalidOptions) for a zero
    /// timeout or poll interval; else as [`connect`](crate::connect).
    pub async fn connect(self, url: &str) -> Result<PgLocker> {
        self.check()?;
        let (config, connector) = crate::config(url)?;
        let client = conn::open(&config, &connector)
            .await
            .map_err(crate::Error::from_pg)?;
        Ok(self.build(
            Source::Own {
                config,
                connector,
                client: Mutex::new(Some(client)),
            },
            self.listen.unwrap_or(true),
        ))
    }

    /// A locker on the caller's deadpool-postgres pool (crate feature
    /// `deadpool`): each request takes a connection from `pool` for one
    /// statement, bounded by the request's deadline (the wait for a free
    /// connection too), and gives it back. Nothing is connected now; run
    /// [`PgLocker::setup`] once.
    ///
    /// A connection whose statement did not end (its deadline passed, or
    /// the request was dropped) is not given back: it is taken out of the
    /// pool for good (`Object::take`, so the pool may open another) and
    /// closed, and the statement is cancelled (see [One stuck
    /// statement](crate::locker#one-stuck-statement)).
    ///
    /// **No `LISTEN`**: waiters look again every
    /// [`poll_every`](Self::poll_every) (a pooled connection's driver task
    /// drops notifications, and the pool does not tell its settings to
    /// open a connection of our own). Releases are still notified, so
    /// other lockers that listen are woken by this one's. Each statement
    /// is unnamed and keeps no session state, so any pool works, PgBouncer
    /// in transaction mode behind it too; the pool's recycling method is
    /// the caller's.
    ///
    /// # Errors
    /// [`Error::Lease`](crate::Error::Lease) with
    /// [`InvalidOptions`](leasehold::Error::InvalidOptions) for a zero
    /// timeout or poll interval, or for `listen(true)`.
    #[cfg(feature = "deadpool")]
    pub fn pool(self, pool: deadpool_postgres::Pool) -> Result<PgLocker> {
        self.check()?;
        if self.listen == Some(true) {
            return Err(crate::Error::Lease(leasehold::Error::InvalidOptions(
                "a locker on a pool cannot listen: its waiters poll (leave listen unset or false)",
            )));
        }
        Ok(self.build(Source::Pool(pool), false))
    }

    fn build(&self, source: Source, listen: bool) -> PgLocker {
        PgLocker {
            inner: Arc::new(Inner {
                conns: Connections {
                    source,
                    command_timeout: self.command_timeout,
                },
                listener: Mutex::new(None),
                wakes: Arc::new(Wakes::new()),
                poll_every: self.poll_every,
                listen,
            }),
        }
    }
}

impl PgLocker {
    /// A locker on the database at `url` with the default settings: as
    /// [`PgLockerBuilder::connect`].
    ///
    /// # Errors
    /// As [`connect`](crate::connect).
    pub async fn connect(url: &str) -> Result<PgLocker> {
        PgLocker::builder().connect(url).await
    }

    /// A locker on the caller's deadpool-postgres pool with the default
    /// settings (crate feature `deadpool`): as [`PgLockerBuilder::pool`]
    /// (its waiters poll).
    ///
    /// # Errors
    /// None with the default settings; the `Result` is
    /// [`PgLockerBuilder::pool`]'s.
    #[cfg(feature = "deadpool")]
    pub fn from_pool(pool: deadpool_postgres::Pool) -> Result<PgLocker> {
        PgLocker::builder().pool(pool)
    }

    /// A builder with the default settings.
    pub fn builder() -> PgLockerBuilder {
        PgLockerBuilder {
            command_timeout: DEFAULT_LOCK_COMMAND_TIMEOUT,
            poll_every: DEFAULT_POLL_EVERY,
            listen: None,
        }
    }

    /// Makes sure a connection of ours `LISTEN`s for releases, by
    /// `deadline`, unless turned off; best effort (without one, waiters
    /// poll).
    async fn listening(&self, deadline: Instant) {
        if !self.inner.listen {
            return;
        }
        let Some((config, connector)) = self.inner.conns.source.own() else {
            return;
        };
        let Ok(mut slot) = tokio::time::timeout_at(deadline, self.inner.listener.lock()).await
        else {
            return;
        };
        if slot.as_ref().is_some_and(|c| !c.is_closed()) {
            return;
        }
        *slot = None;
        let connect = config.connect(connector.clone());
        let Ok(Ok((client, mut connection))) = tokio::time::timeout_at(deadline, connect).await
        else {
            return;
        };
        let wakes = self.inner.wakes.clone();
        tokio::spawn(async move {
            while let Some(Ok(message)) =
                std::future::poll_fn(|cx| connection.poll_message(cx)).await
            {
                if let AsyncMessage::Notification(released) = message {
                    wakes.released(released.payload());
                }
            }
            // Ended: waiters look again (and the next step listens anew).
            wakes.everyone();
        });
        let listen = client.batch_execute(LISTEN);
        if let Ok(Ok(())) = tokio::time::timeout_at(deadline, listen).await {
            *slot = Some(Arc::new(client));
        }
    }

    /// Tells the waiters (every locker's listener) that `key` was given
    /// back. Its own statement, after the release committed: a full
    /// notification queue must never fail a release. Best effort.
    async fn notify(&self, key: &str, deadline: Instant) {
        let params: [(&(dyn ToSql + Sync), Type); 1] = [(&key, Type::TEXT)];
        if let Err(err) = self
            .inner
            .conns
            .query("notify", NOTIFY, &params, deadline)
            .await
        {
            tracing::debug!(key, error = %err, "could not notify a release; waiters will poll");
        }
    }

    /// Creates the lease and counter tables if they are missing.
    ///
    /// # Errors
    /// [`Error::Postgres`](crate::Error::Postgres) when the server refuses
    /// (no permission to create tables); as [`connect`](crate::connect)
    /// when no connection can be opened; on a pool,
    /// [`Error::Lease`](crate::Error::Lease) with an
    /// [`Error::Service`](leasehold::Error::Service) when it gives none
    /// (closed, or its own wait timed out).
    pub async fn setup(&self) -> Result<()> {
        // One transaction serialized by the setup's advisory lock: two
        // `CREATE TABLE IF NOT EXISTS` at once may both create, and one
        // fails on the catalog's unique index.
        let setup = format!("BEGIN; {}; {SETUP}; COMMIT", crate::statements::SETUP_LOCK);
        self.inner.conns.batch(&setup).await
    }
}

/// An acquire's place among the [`PgLocker`]'s waiters of its key, from
/// its first step to its end (its [`LockService::Entry`]): a release wakes
/// the first waiter of the key not woken yet ([Waiting](self#waiting)).
/// Opaque; the retry loop keeps it.
#[derive(Debug, Default)]
pub struct QueuePlace(Option<Place>);

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl LockService for PgLocker {
    /// The acquire's place in its key's queue of waiters (taken at its
    /// first step): a release wakes the first waiter of its key.
    type Entry = QueuePlace;

    fn service(&self) -> Service {
        POSTGRESQL
    }

    fn command_timeout(&self) -> Duration {
        self.inner.conns.command_timeout
    }

    fn step<'a>(
        &'a self,
        claim: &'a Claim,
        place: &'a mut QueuePlace,
        deadline: Instant,
    ) -> Reply<'a, Step> {
        Box::pin(async move {
            // In the queue, and listening, before the request: a release
            // after it is never missed.
            let place = place
                .0
                .get_or_insert_with(|| self.inner.wakes.enter(claim.key()));
            let woken = place.woken();
            let poll = tokio::time::sleep(self.inner.poll_every);
            let wait = async move {
                tokio::select! {
                    () = woken => {}
                    () = poll => {}
                }
            };
            if place.is_behind_a_woken_waiter() {
                // One of this locker's waiters ahead of it was told the
                // lock is free and is about to take it: first in, first
                // out (a caller that just released and asks again does
                // not barge in).
                return Ok(Step::busy_until(wait));
            }
            self.listening(deadline).await;
            let (key, holder, ttl) = (claim.key(), claim.token().as_str(), millis(claim.ttl()));
            let rows = match claim.fence_key() {
                None => {
                    let params: [(&(dyn ToSql + Sync), Type); 3] = [
                        (&key, Type::TEXT),
                        (&holder, Type::TEXT),
                        (&ttl, Type::INT8),
                    ];
                    self.inner
                        .conns
                        .query("acquire", TAKE, &params, deadline)
                        .await?
                }
                Some(fence_key) => {
                    let params: [(&(dyn ToSql + Sync), Type); 4] = [
                        (&key, Type::TEXT),
                        (&holder, Type::TEXT),
                        (&ttl, Type::INT8),
                        (&fence_key, Type::TEXT),
                    ];
                    self.inner
                        .conns
                        .query("acquire", TAKE_FENCED, &params, deadline)
                        .await?
                }
            };
            let Some(row) = rows.first() else {
                return Ok(Step::busy_until(wait));
            };
            if claim.fence_key().is_none() {
                return Ok(Step::won(None));
            }
            let last: i64 = row.get(0);
            let fence = u64::try_from(last)
                .ok()
                .filter(|&value| value > 0)
                .map(FencingToken::new)
                .ok_or(leasehold::Error::UnexpectedReply {
                    service: POSTGRESQL,
                    op: "acquire",
                })?;
            Ok(Step::won(Some(fence)))
        })
    }

    fn undo<'a>(
        &'a self,
        claim: &'a Claim,
        _: &'a mut QueuePlace,
        deadline: Instant,
    ) -> Reply<'a, ()> {
        Box::pin(async move {
            let (key, holder) = (claim.key(), claim.token().as_str());
            let params: [(&(dyn ToSql + Sync), Type); 2] =
                [(&key, Type::TEXT), (&holder, Type::TEXT)];
            self.inner
                .conns
                .execute("acquire", UNDO, &params, deadline)
                .await?;
            Ok(())
        })
    }

    fn refresh<'a>(&'a self, held: &'a Held, ttl: Duration, deadline: Instant) -> Reply<'a, bool> {
        Box::pin(async move {
            let (key, holder, ttl) = (held.key(), held.token().as_str(), millis(ttl));
            let params: [(&(dyn ToSql + Sync), Type); 3] = [
                (&key, Type::TEXT),
                (&holder, Type::TEXT),
                (&ttl, Type::INT8),
            ];
            Ok(self
                .inner
                .conns
                .execute("refresh", REFRESH, &params, deadline)
                .await?
                == 1)
        })
    }

    fn release<'a>(&'a self, held: &'a Held, deadline: Instant) -> Reply<'a, bool> {
        Box::pin(async move {
            let (key, holder) = (held.key(), held.token().as_str());
            let params: [(&(dyn ToSql + Sync), Type); 2] =
                [(&key, Type::TEXT), (&holder, Type::TEXT)];
            let released = self
                .inner
                .conns
                .execute("release", RELEASE, &params, deadline)
                .await?
                == 1;
            if released {
                // This locker's own waiters first, at once; then every
                // other locker's, through the database.
                self.inner.wakes.released(key);
                self.notify(key, deadline).await;
            }
            Ok(released)
        })
    }

    fn raise_fence<'a>(
        &'a self,
        fence_key: &'a str,
        at_least: FencingToken,
        deadline: Instant,
    ) -> Reply<'a, ()> {
        Box::pin(async move {
            let at_least = i64::try_from(at_least.get()).unwrap_or(i64::MAX);
            let params: [(&(dyn ToSql + Sync), Type); 2] =
                [(&fence_key, Type::TEXT), (&at_least, Type::INT8)];
            self.inner
                .conns
                .execute("raise fence", RAISE, &params, deadline)
                .await?;
            Ok(())
        })
    }

    fn announce<'a>(
        &'a self,
        held: &'a Held,
        record_key: &'a str,
        body: &'a str,
        deadline: Instant,
    ) -> Reply<'a, bool> {
        Box::pin(async move {
            let (key, holder) = (held.key(), held.token().as_str());
            let params: [(&(dyn ToSql + Sync), Type); 4] = [
                (&key, Type::TEXT),
                (&holder, Type::TEXT),
                (&record_key, Type::TEXT),
                (&body, Type::TEXT),
            ];
            Ok(self
                .inner
                .conns
                .execute("announce", ANNOUNCE, &params, deadline)
                .await?
                == 1)
        })
    }

    fn leader_record<'a>(
        &'a self,
        key: &'a str,
        record_key: &'a str,
    ) -> Reply<'a, Option<(String, i64)>> {
        let deadline = Instant::now() + self.inner.conns.command_timeout;
        Box::pin(async move {
            let params: [(&(dyn ToSql + Sync), Type); 2] =
                [(&key, Type::TEXT), (&record_key, Type::TEXT)];
            let rows = self
                .inner
                .conns
                .query("read leader", LEADER, &params, deadline)
                .await?;
            Ok(rows.first().map(|row| (row.get(0), row.get(1))))
        })
    }
}
